//! Each scenario's timeline: the faults it injects into the world, at fixed shares of the run,
//! while the load runs. Every step is bounded in time; the run ends when the timeline does.

use std::time::Duration;

use anyhow::Context as _;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::faults::{Effect, Side};
use crate::keys::KeySpec;
use crate::region_upgrade;
use crate::scenario::{Plan, RegionScope, Scenario};
use crate::world::World;

/// The key whose owner the single-node faults hit.
pub const VICTIM_KEY: &str = "chaos:gcra:0";

/// The gateway `lease-gateway-kill` kills (it runs on a runtime of its own).
pub const LEASE_VICTIM_GATEWAY: usize = 0;

/// The node started with a skewed clock in `clock-skew`.
pub const SKEWED_NODE: usize = 1;
pub const SKEW_MS: i64 = 250;

/// `stall`: how long each SIGSTOP lasts and the gaps between them (ms, drawn from the seed).
/// The longest stall stays well inside the failure detector's 500 ms.
pub const STALL_MS: std::ops::RangeInclusive<u64> = 20..=200;
pub const STALL_GAP_MS: std::ops::RangeInclusive<u64> = 500..=1_500;

/// `region-restart`: the global key a side load checks every millisecond from one gateway of
/// each region, so the exchange link between its owners carries a message every sync interval.
pub const PUMP_KEY: &str = "chaos:restart:pump";
/// `region-restart`: the least exchange messages its link must have carried before the restart
/// (the restarted receiver starts counting its sender's sequence numbers again; past 4,096 a
/// receiver that forgot them refuses the sender).
pub const PUMP_LINK_MESSAGES: f64 = 5_000.0;

/// Runs the scenario's faults; returns when its last step is done.
pub async fn play(
    scenario: &Scenario,
    world: &mut World,
    duration: Duration,
    rules: Option<&crate::rules::RulesFile>,
    keys: &[KeySpec],
) -> anyhow::Result<()> {
    let at = |share: f64| duration.mul_f64(share);
    match scenario.plan {
        Plan::Steady => {}
        Plan::KeyFlood | Plan::HostileFlood => flood_window(scenario, world, at).await,
        Plan::Kill => kill_owner(world, at).await?,
        Plan::CrashRestart => crash_and_restart_owner(world, at).await?,
        Plan::Pause => pause_owner(world, at).await?,
        Plan::RollingRestart => rolling_restart(world, at).await?,
        Plan::Churn => churn(world, at).await?,
        Plan::RegionPartition => partition_region(scenario, world, at).await,
        Plan::WanDelay => delay_between_regions(world, at).await,
        Plan::ClientPartition => cut_gateway_from_owner(world, at).await?,
        Plan::RulesReload => edit_rules(world, rules, at).await?,
        Plan::LeaseGatewayKill => kill_lease_gateway(world, at).await,
        Plan::RollingUpgrade => rolling_upgrade(world, at).await?,
        Plan::ClockSkew => skewed_node_leaves(world, at).await,
        Plan::Stall => stall_busiest_owner(world, keys, at).await?,
        Plan::RegionRestart => restart_pump_receiver(world, at).await?,
        Plan::RegionUpgrade => region_upgrade(world, at).await?,
    }
    world.until(duration).await;
    Ok(())
}

/// `key-flood` and `hostile-flood`: the flood itself is the side load; the span marks it.
async fn flood_window(scenario: &Scenario, world: &mut World, at: impl Fn(f64) -> Duration) {
    world.until(at(0.2)).await;
    let span = world.begin_span(scenario.name);
    world.until(at(0.9)).await;
    world.end_span(span);
}

async fn kill_owner(world: &mut World, at: impl Fn(f64) -> Duration) -> anyhow::Result<()> {
    world.until(at(0.3)).await;
    let owner = world.owner_of(VICTIM_KEY)?;
    let span = world.begin_span(format!("kill -9 node {owner}"));
    world.kill(owner).await;
    // It stays down: the span runs to the end of the run.
    let _ = span;
    Ok(())
}

/// `crash-restart`: how long the killed owner stays down each time: inside the failure
/// detector's 1 s to dead (a supervisor restarting at once: the survivors see a new life of a
/// member still alive, and leave the joining life out of their tables for a gossip round or
/// so, which a client may or may not see), then past it (declared dead first, so the clients
/// surely see the node leave their tables and come back).
pub const CRASH_DOWN_FOR: [Duration; 2] =
    [Duration::from_millis(300), Duration::from_millis(1_500)];
/// `crash-restart`: the longest a new life may take from its start to ready (joined). A
/// survivor's connection to the dead process, kept, would swallow its answers to the join
/// until QUIC's 5 s idle timeout; the join itself takes a gossip round trip.
pub const CRASH_READY_WITHIN: Duration = Duration::from_secs(2);
/// `crash-restart`: after each restart, the window from this long after the node is ready to
/// [`RESTARTED_WINDOW_END`] in which the checks routed to it must be decided by a node. A
/// client's connection to the dead process, kept, would swallow them until the client's 3 s
/// idle timeout: the new life resets such connections at their next packet (it signs resets
/// with its previous life's keys), and a client that saw the node leave its table dials it
/// again when it comes back.
pub const RESTARTED_WINDOW_START: Duration = Duration::from_millis(200);
pub const RESTARTED_WINDOW_END: Duration = Duration::from_secs(3);
/// `crash-restart`: the most of those checks a failure mode may decide instead (machine noise:
/// a check that missed its 50 ms deadline). Most checks reach the node through its successor
/// even while a connection swallows calls (the client's breaker is open), so a count, not a
/// share: with the swallowing connection kept, two runs left 10 and 14 after the second
/// restart (a client that did not dial again), 24 and 18 after the first (a node whose resets
/// the client could not verify); without, none.
pub const RESTARTED_MAX_UNDECIDED: usize = 3;

/// `crash-restart`: `kill -9` of the victim key's owner and a start at its address, once per
/// [`CRASH_DOWN_FOR`]; each restart's node, time down, time to ready and when it was ready go
/// to the findings (`restarts`).
async fn crash_and_restart_owner(
    world: &mut World,
    at: impl Fn(f64) -> Duration,
) -> anyhow::Result<()> {
    let mut restarts = Vec::new();
    for (share, down) in [0.3, 0.6].into_iter().zip(CRASH_DOWN_FOR) {
        world.until(at(share)).await;
        let owner = world.owner_of(VICTIM_KEY)?;
        let span = world.begin_span(format!(
            "kill -9 node {owner}, restarted at its address after {} ms",
            down.as_millis()
        ));
        let killed_at_ns = world.now_ns();
        world.kill(owner).await;
        tokio::time::sleep(down).await;
        let started = std::time::Instant::now();
        world.start_node(owner).await?;
        let ready_ms = started.elapsed().as_millis() as u64;
        world.end_span(span);
        restarts.push(serde_json::json!({
            "node": owner,
            "down_ms": down.as_millis() as u64,
            "ready_ms": ready_ms,
            "killed_at_ns": killed_at_ns,
            "ready_at_ns": world.now_ns(),
        }));
        // After each: a later start that fails still leaves the earlier ones judged.
        world.findings.insert(
            "restarts".into(),
            serde_json::Value::Array(restarts.clone()),
        );
    }
    Ok(())
}

/// `crash-restart`'s own invariants: every new life was ready within [`CRASH_READY_WITHIN`],
/// and after each restart, the checks routed to the node in the window after it was ready
/// were decided by a node (all but [`RESTARTED_MAX_UNDECIDED`], and at least one
/// was routed there: else the premise was not reached).
pub fn judge_restarts(
    findings: &serde_json::Map<String, serde_json::Value>,
    records: &[crate::load::Record],
) -> Vec<String> {
    let Some(restarts) = findings.get("restarts").and_then(|r| r.as_array()) else {
        return vec!["no restart was made".to_owned()];
    };
    let mut violations = Vec::new();
    if restarts.len() < CRASH_DOWN_FOR.len() {
        violations.push(format!(
            "{} of {} restarts were made",
            restarts.len(),
            CRASH_DOWN_FOR.len()
        ));
    }
    let limit = CRASH_READY_WITHIN.as_millis() as u64;
    let value_of = |restart: &serde_json::Value, name: &str| {
        restart.get(name).and_then(|v| v.as_u64()).unwrap_or(0)
    };
    for (i, restart) in restarts.iter().enumerate() {
        let field = |name: &str| value_of(restart, name);
        let (node, down_ms, ready_ms) = (field("node"), field("down_ms"), field("ready_ms"));
        if ready_ms > limit {
            violations.push(format!(
                "node {node}, down {down_ms} ms, took {ready_ms} ms to be ready (joined), over {limit} ms"
            ));
        }
        // Up to the next kill, where a short run puts it inside the window.
        let ready_at = field("ready_at_ns");
        let next_kill =
            (restarts.get(i + 1)).map_or(u64::MAX, |next| value_of(next, "killed_at_ns"));
        let window = ready_at + RESTARTED_WINDOW_START.as_nanos() as u64
            ..next_kill.min(ready_at + RESTARTED_WINDOW_END.as_nanos() as u64);
        let routed: Vec<_> = records
            .iter()
            .filter(|r| u64::from(r.routed_to) == node && window.contains(&r.sent_ns))
            .collect();
        let undecided: Vec<&crate::load::Record> = (routed.iter().copied())
            .filter(|r| !r.via.by_a_node())
            .collect();
        if routed.is_empty() {
            violations.push(format!(
                "premise not reached: no check was routed to node {node} after its restart"
            ));
        } else if undecided.len() > RESTARTED_MAX_UNDECIDED {
            violations.push(format!(
                "node {node}, down {down_ms} ms: {} of {} checks routed to it {}-{} ms after it was ready were not decided by a node (at most {RESTARTED_MAX_UNDECIDED}): {}",
                undecided.len(),
                routed.len(),
                RESTARTED_WINDOW_START.as_millis(),
                RESTARTED_WINDOW_END.as_millis(),
                why_undecided(&undecided),
            ));
        }
    }
    violations
}

/// How many of `undecided` took each way and reason (`fallback: timeout x12, ...`), so a
/// failed window says what the client saw.
fn why_undecided(undecided: &[&crate::load::Record]) -> String {
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for record in undecided {
        let why = match record.reason {
            Some(reason) => format!("{:?}: {reason}", record.via),
            None => format!("{:?}", record.via),
        };
        *counts.entry(why).or_default() += 1;
    }
    let parts: Vec<String> = counts
        .iter()
        .map(|(why, n)| format!("{why} x{n}"))
        .collect();
    parts.join(", ")
}

async fn pause_owner(world: &mut World, at: impl Fn(f64) -> Duration) -> anyhow::Result<()> {
    world.until(at(0.3)).await;
    let owner = world.owner_of(VICTIM_KEY)?;
    let span = world.begin_span(format!("SIGSTOP node {owner} 3s"));
    world.pause(owner, true).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    world.pause(owner, false).await?;
    world.end_span(span);
    Ok(())
}

async fn rolling_restart(world: &mut World, at: impl Fn(f64) -> Duration) -> anyhow::Result<()> {
    world.until(at(0.15)).await;
    let span = world.begin_span("rolling restart");
    for node in 0..world.layout.initial_nodes() {
        world.stop(node).await;
        world.start_node(node).await?;
        // Let clients refetch the table before the next node goes.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    world.end_span(span);
    Ok(())
}

async fn churn(world: &mut World, at: impl Fn(f64) -> Duration) -> anyhow::Result<()> {
    let first = world.layout.initial_nodes();
    anyhow::ensure!(world.layout.spares >= 2, "churn needs two spare nodes");
    let span = world.begin_span("churn");
    world.until(at(0.2)).await;
    world.start_node(first).await?;
    world.until(at(0.4)).await;
    world.stop(1).await;
    world.until(at(0.6)).await;
    world.start_node(first + 1).await?;
    world.until(at(0.8)).await;
    world.stop(first).await;
    world.end_span(span);
    Ok(())
}

async fn partition_region(scenario: &Scenario, world: &mut World, at: impl Fn(f64) -> Duration) {
    world.until(at(0.3)).await;
    let (inside, outside) = region_sides(world, scenario.region_scope);
    let span = world.begin_span("region 0 partitioned");
    let mut ids = Vec::new();
    for (a, b) in cross_pairs(&inside, &outside) {
        ids.extend(world.faults.partition(a, b));
    }
    world.until(at(0.7)).await;
    world.faults.remove(&ids);
    world.end_span(span);
}

async fn delay_between_regions(world: &mut World, at: impl Fn(f64) -> Duration) {
    world.until(at(0.2)).await;
    let wan = Effect {
        drop: 0.01,
        delay: Duration::from_millis(50),
        jitter: Duration::from_millis(20),
        ..Effect::default()
    };
    let span = world.begin_span("50ms+-20ms 1% loss between regions");
    let mut ids = Vec::new();
    for region in 0..world.layout.regions {
        let (inside, outside) = one_region_sides(world, region);
        for (a, b) in cross_pairs(&inside, &outside) {
            ids.push(world.faults.add(a, b, wan));
        }
    }
    world.until(at(0.8)).await;
    world.faults.remove(&ids);
    world.end_span(span);
}

async fn cut_gateway_from_owner(
    world: &mut World,
    at: impl Fn(f64) -> Duration,
) -> anyhow::Result<()> {
    world.until(at(0.3)).await;
    let owner = world.owner_of(VICTIM_KEY)?;
    let span = world.begin_span(format!("gateway 0 cut from node {owner}"));
    let ids = world
        .faults
        .partition(Side::Gateways(vec![0]), Side::Nodes(vec![owner]));
    world.until(at(0.7)).await;
    world.faults.remove(&ids);
    world.end_span(span);
    Ok(())
}

async fn edit_rules(
    world: &mut World,
    rules: Option<&crate::rules::RulesFile>,
    at: impl Fn(f64) -> Duration,
) -> anyhow::Result<()> {
    let rules = rules.ok_or_else(|| anyhow::anyhow!("rules-reload needs its rules file"))?;
    for (step, share) in [(1, 0.35), (2, 0.65)] {
        world.until(at(share)).await;
        rules.write_step(step)?;
        world.note(format!("rules file edited: {}", rules.describe_step(step)));
    }
    Ok(())
}

async fn kill_lease_gateway(world: &mut World, at: impl Fn(f64) -> Duration) {
    world.until(at(0.4)).await;
    let span = world.begin_span(format!("kill gateway {LEASE_VICTIM_GATEWAY}"));
    world.kill_gateway(LEASE_VICTIM_GATEWAY).await;
    // It stays dead: the span runs to the end of the run.
    let _ = span;
}

async fn rolling_upgrade(world: &mut World, at: impl Fn(f64) -> Duration) -> anyhow::Result<()> {
    world.until(at(0.15)).await;
    let before = cluster_version(world).await?;
    world.note(format!("the old cluster speaks protocol version {before}"));
    let span = world.begin_span("rolling upgrade");
    for node in 0..world.layout.initial_nodes() {
        upgrade_node(world, node).await?;
    }
    // The old gateways against a cluster of the new build alone, for a while; by its end
    // gossip has told every node that all members speak the newest version.
    world.note("every node runs the new build");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = cluster_version(world).await?;
    world.note(format!(
        "the upgraded cluster speaks protocol version {after}"
    ));
    anyhow::ensure!(
        after == floodgate::protocol::NEWEST,
        "after every node was upgraded the cluster speaks protocol version {after}, not {}",
        floodgate::protocol::NEWEST
    );
    let places = world.upgrade.as_ref().map_or(0, |u| u.gateways.len());
    for place in 0..places {
        world.replace_gateway(place).await?;
    }
    world.end_span(span);
    Ok(())
}

/// Stops `node` (SIGTERM, a graceful leave) and starts it from the build the upgrade moves to,
/// with the same flags, address (hence node id) and data directory; its restart window runs
/// until clients had time to refetch the table.
async fn upgrade_node(world: &mut World, node: usize) -> anyhow::Result<()> {
    let new_node = world
        .upgrade_to
        .clone()
        .ok_or_else(|| anyhow::anyhow!("an upgrade scenario needs the build to upgrade to"))?;
    let from = world.now_ns();
    world.stop(node).await;
    world.note(format!(
        "node {node}: old build stopped, starting {}",
        new_node.display()
    ));
    world.setup.binary = new_node;
    world.start_node(node).await?;
    // Let clients refetch the table before the next node goes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    world.restart_window(format!("node {node} upgraded"), from);
    Ok(())
}

/// `region-upgrade`: region 1 moves to this build node by node, the two regions run on
/// different builds for a stretch, then region 0 moves. What each region's exchange carried in
/// the two stretches is kept for `region_upgrade::judge`.
async fn region_upgrade(world: &mut World, at: impl Fn(f64) -> Duration) -> anyhow::Result<()> {
    anyhow::ensure!(world.layout.regions == 2, "region-upgrade runs two regions");
    world.until(at(0.15)).await;
    let before = cluster_version(world).await?;
    world.note(format!("the old build speaks protocol version {before}"));
    world.findings.insert(
        region_upgrade::OLD_VERSION.into(),
        serde_json::json!(before),
    );
    let span = world.begin_span("region upgrade");
    for node in world.region_nodes(1) {
        upgrade_node(world, node).await?;
    }
    let mixed = world.begin_span("region 0 old, region 1 new");
    let start = region_upgrade::exchange_counts(world).await;
    world.until(stretch_end(world, at(0.5))).await;
    let end = region_upgrade::exchange_counts(world).await;
    world.end_span(mixed);
    let mut mixed_counts = region_upgrade::counts_between(&start, &end);
    mixed_counts["region 1"]["region_protocol_version"] =
        region_upgrade::region_version(world, 1).await.into();
    if let Some(&last) = world.region_nodes(1).last() {
        mixed_counts[region_upgrade::LAST_JOIN] =
            region_upgrade::handoffs_received(world, last).await;
    }
    world
        .findings
        .insert(region_upgrade::MIXED.into(), mixed_counts);
    for node in world.region_nodes(0) {
        upgrade_node(world, node).await?;
    }
    let start = region_upgrade::exchange_counts(world).await;
    world.until(stretch_end(world, at(0.85))).await;
    let end = region_upgrade::exchange_counts(world).await;
    world.findings.insert(
        region_upgrade::ALL_NEW.into(),
        region_upgrade::counts_between(&start, &end),
    );
    world.end_span(span);
    Ok(())
}

/// When a stretch measured by `region-upgrade` ends: at `planned`, or later if the restarts
/// before it ran long, so the exchange has a few sync intervals' worth of messages to count.
fn stretch_end(world: &World, planned: Duration) -> Duration {
    planned.max(world.origin.elapsed() + Duration::from_secs(2))
}

async fn skewed_node_leaves(world: &mut World, at: impl Fn(f64) -> Duration) {
    // The skew is a fault from the start: the skewed node's aligned windows are not the
    // others'.
    let skewed = world.begin_span(format!("node {SKEWED_NODE}'s clock {SKEW_MS} ms ahead"));
    world.until(at(0.5)).await;
    let span = world.begin_span(format!("skewed node {SKEWED_NODE} leaves"));
    world.stop(SKEWED_NODE).await;
    world.end_span(skewed);
    let _ = span;
}

async fn stall_busiest_owner(
    world: &mut World,
    keys: &[KeySpec],
    at: impl Fn(f64) -> Duration,
) -> anyhow::Result<()> {
    let victim = world.busiest_owner(keys)?;
    world.note(format!("node {victim} owns the busiest keys"));
    let mut rng = SmallRng::seed_from_u64(world.seed ^ 0x5747_4c4c);
    world.until(at(0.2)).await;
    loop {
        let gap = rng.random_range(STALL_GAP_MS);
        let stall = rng.random_range(STALL_MS);
        tokio::time::sleep(Duration::from_millis(gap)).await;
        if world.origin.elapsed() + Duration::from_millis(stall) >= at(0.9) {
            break;
        }
        let span = world.begin_span(format!("SIGSTOP node {victim} {stall}ms"));
        world.pause(victim, true).await?;
        tokio::time::sleep(Duration::from_millis(stall)).await;
        world.pause(victim, false).await?;
        world.end_span(span);
    }
    Ok(())
}

/// `region-restart`: rough links between the regions all along, then the pump key's receiver
/// in region 1 restarts once its link has carried the premise's messages.
async fn restart_pump_receiver(
    world: &mut World,
    at: impl Fn(f64) -> Duration,
) -> anyhow::Result<()> {
    anyhow::ensure!(world.layout.regions == 2, "region-restart runs two regions");
    // Duplicated and reordered datagrams between the regions all along (the exchange
    // applies each message once, in any order).
    let rough = Effect {
        duplicate: 0.02,
        reorder: 0.02,
        ..Effect::default()
    };
    let span = world.begin_span("2% duplicated, 2% reordered between regions");
    let (inside, outside) = one_region_sides(world, 0);
    for (a, b) in cross_pairs(&inside, &outside) {
        world.faults.add_both(a, b, rough);
    }
    let _ = span;
    let sender = world.owner_in_region(PUMP_KEY, 0)?;
    let receiver = world.owner_in_region(PUMP_KEY, 1)?;
    world.until(at(0.7)).await;
    let sent = crate::procs::metric_sum(
        world.nodes[sender].spec.admin,
        "floodgate_region_frames_sent_total",
        &["region=\"r1\"", "kind=\"deltas\""],
    )
    .await;
    world.note(format!(
        "node {sender} sent {} delta messages to region 1 (its link to node {receiver} carries the pump key)",
        sent.map_or("?".to_owned(), |n| format!("{n}"))
    ));
    world.findings.insert(
        "link_before_restart".into(),
        serde_json::json!({
            "sender": sender, "receiver": receiver,
            "delta_messages_to_region_1": sent,
        }),
    );
    let restart = world.begin_span(format!("restart node {receiver} (region 1)"));
    world.stop(receiver).await;
    world.start_node(receiver).await?;
    world.end_span(restart);
    Ok(())
}

/// Region 0 (nodes and gateways) and everyone else. With one region, the first half of the
/// nodes and gateways against the rest.
fn region_sides(world: &World, scope: RegionScope) -> (Vec<Side>, Vec<Side>) {
    match scope {
        RegionScope::SharedRing if world.layout.regions >= 2 => one_region_sides(world, 0),
        RegionScope::SharedRing => {
            let nodes = world.layout.initial_nodes();
            let gateways = world.gateways.len();
            (
                vec![
                    Side::Nodes((0..nodes / 2).collect()),
                    Side::Gateways((0..gateways / 2).collect()),
                ],
                vec![
                    Side::Nodes((nodes / 2..nodes + world.layout.spares).collect()),
                    Side::Gateways((gateways / 2..gateways).collect()),
                ],
            )
        }
    }
}

fn one_region_sides(world: &World, region: usize) -> (Vec<Side>, Vec<Side>) {
    let others: Vec<usize> = (0..world.layout.regions).filter(|r| *r != region).collect();
    let other_nodes = others.iter().flat_map(|r| world.region_nodes(*r)).collect();
    let other_gateways = others
        .iter()
        .flat_map(|r| world.region_gateways(*r))
        .collect();
    (
        vec![
            Side::Nodes(world.region_nodes(region)),
            Side::Gateways(world.region_gateways(region)),
        ],
        vec![Side::Nodes(other_nodes), Side::Gateways(other_gateways)],
    )
}

/// Every (inside, outside) pair except gateway to gateway (gateways never talk to each other).
fn cross_pairs(inside: &[Side], outside: &[Side]) -> Vec<(Side, Side)> {
    let mut pairs = Vec::new();
    for a in inside {
        for b in outside {
            if matches!((a, b), (Side::Gateways(_), Side::Gateways(_))) {
                continue;
            }
            pairs.push((a.clone(), b.clone()));
        }
    }
    pairs
}

/// The protocol version the cluster speaks, as a node's table (what `floodgate status` prints)
/// says: 2 from a node of the build before versions were negotiated.
async fn cluster_version(world: &World) -> anyhow::Result<u8> {
    let config = floodgate_client::ClientConfig::with_ca_file(world.setup.certs.join("ca.pem"));
    let table = floodgate_client::fetch_slot_table(&world.seeds(), &config)
        .await
        .context("fetching the slot table for the cluster version")?;
    Ok(table.cluster_version())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::{Record, Via};

    const MS: u64 = 1_000_000;

    /// Restarts of node 1: (down, time to ready, ready at), in ms.
    fn findings(restarts: &[(u64, u64, u64)]) -> serde_json::Map<String, serde_json::Value> {
        let restarts = restarts
            .iter()
            .map(|&(down_ms, ready_ms, ready_at_ms)| {
                let killed_at_ms = ready_at_ms.saturating_sub(down_ms + ready_ms);
                serde_json::json!({
                    "node": 1, "down_ms": down_ms, "ready_ms": ready_ms,
                    "killed_at_ns": killed_at_ms * MS, "ready_at_ns": ready_at_ms * MS,
                })
            })
            .collect();
        let mut findings = serde_json::Map::new();
        findings.insert("restarts".into(), serde_json::Value::Array(restarts));
        findings
    }

    /// `count` checks to node `routed_to` sent from `from_ms`, one a millisecond, decided `via`.
    fn checks(routed_to: u16, from_ms: u64, count: u64, via: Via) -> Vec<Record> {
        (0..count)
            .map(|i| Record {
                key: 0,
                gateway: 0,
                sent_ns: (from_ms + i) * MS,
                done_ns: (from_ms + i + 1) * MS,
                admitted: true,
                via,
                routed_to,
                reason: None,
            })
            .collect()
    }

    #[test]
    fn restarts_are_judged_on_their_time_to_ready() {
        let mut served = checks(1, 600, 200, Via::Node);
        served.extend(checks(1, 10_600, 200, Via::Node));
        assert!(
            judge_restarts(&findings(&[(300, 120, 0), (1_500, 2_000, 10_000)]), &served).is_empty()
        );
        let slow = judge_restarts(&findings(&[(300, 4_800, 0), (1_500, 100, 10_000)]), &served);
        assert_eq!(slow.len(), 1, "{slow:?}");
        assert!(
            slow[0].contains("4800 ms") && slow[0].contains("over 2000 ms"),
            "{slow:?}"
        );
        let one = judge_restarts(&findings(&[(300, 100, 0)]), &served);
        assert_eq!(one, ["1 of 2 restarts were made"]);
        assert_eq!(
            judge_restarts(&serde_json::Map::new(), &served),
            ["no restart was made"]
        );
    }

    /// Checks routed to a restarted node 0.2-3 s after it was ready: a failure mode may decide
    /// at most 3 of them, and some must have been routed there. Checks before the window, or to
    /// other nodes, do not count.
    #[test]
    fn a_restarted_node_must_be_reached_right_after_it_is_ready() {
        let restarts = findings(&[(300, 100, 0), (1_500, 100, 10_000)]);
        let mut records = checks(1, 600, 200, Via::Node);
        records.extend(checks(1, 10_600, 200, Via::Node));
        records.extend(checks(1, 10_000, 200, Via::Fallback));
        records.extend(checks(1, 13_000, 100, Via::Fallback));
        records.extend(checks(2, 10_600, 400, Via::Fallback));
        records.extend(checks(1, 100, 100, Via::Fallback));
        records.extend(checks(1, 10_900, 3, Via::Fallback));
        assert!(judge_restarts(&restarts, &records).is_empty());

        records.extend(checks(1, 11_000, 1, Via::FailClosed));
        let swallowed = judge_restarts(&restarts, &records);
        assert_eq!(swallowed.len(), 1, "{swallowed:?}");
        assert!(
            swallowed[0].contains("down 1500 ms: 4 of 204 checks"),
            "{swallowed:?}"
        );

        // A restart inside the failure detector's second is held to the same window, which
        // ends at the next kill (here 2,400 ms) where a short run puts it earlier.
        let short = findings(&[(300, 100, 0), (1_500, 100, 4_000)]);
        let mut short_run = checks(1, 600, 200, Via::Node);
        short_run.extend(checks(1, 2_450, 100, Via::Fallback));
        short_run.extend(checks(1, 4_600, 200, Via::Node));
        assert!(judge_restarts(&short, &short_run).is_empty());

        records.extend(checks(1, 2_000, 4, Via::Fallback));
        let quick = judge_restarts(&restarts, &records);
        assert_eq!(quick.len(), 2, "{quick:?}");
        assert!(
            quick[0].contains("down 300 ms: 4 of 204 checks"),
            "{quick:?}"
        );

        let nothing_routed = judge_restarts(&restarts, &checks(2, 10_600, 10, Via::Node));
        assert_eq!(nothing_routed.len(), 2, "{nothing_routed:?}");
        assert!(
            (nothing_routed.iter()).all(|v| v.starts_with("premise not reached")),
            "{nothing_routed:?}"
        );
    }
}
