//! One scenario end to end: start the world, connect the gateways, drive load while the
//! timeline plays, stop everything, then check the records and the logs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use floodgate_client::{Client, ClientConfig};
use tokio::sync::watch;

use crate::bounds;
use crate::checker::{self, CheckInput, CheckResult, FaultSpan};
use crate::gateway_procs::{Build, GatewayLaunch, GatewayProcess, HttpGateway, HttpSlot, Upgrade};
use crate::keys::{
    KeySpec, LEASE_HOT_ABOVE_PER_SEC, Pulse, global_keys, lease_keys, per_region, standard_keys,
};
use crate::load::{self, Front, LoadPlan, Record};
use crate::rules::RulesFile;
use crate::scenario::{Plan, Scenario};
use crate::timeline::{
    self, LEASE_VICTIM_GATEWAY, PUMP_KEY, PUMP_LINK_MESSAGES, SKEW_MS, SKEWED_NODE,
};
use crate::world::{Layout, World};

/// What `run` was asked for.
#[derive(Debug, Clone)]
pub struct RunSettings {
    pub seed: u64,
    pub duration: Duration,
    pub regions: usize,
    pub nodes_per_region: usize,
    pub gateways_per_region: usize,
    pub out: PathBuf,
    pub node_bin: PathBuf,
    /// Replaces every scenario's availability floor (`--availability-floor`). Availability
    /// depends on how loaded the machine is; a test on a shared machine judges only safety.
    pub availability_floor: Option<f64>,
    /// Replaces the client's default call timeout (`--client-timeout`; `None`: the default).
    pub client_timeout: Option<Duration>,
    /// The builds `rolling-upgrade` runs (`None`: it is not run).
    pub upgrade: Option<UpgradeBins>,
}

/// `rolling-upgrade`'s binaries: the old build's node and example gateway, and this build's
/// example gateway (this build's node is `node_bin`).
#[derive(Debug, Clone)]
pub struct UpgradeBins {
    pub old_node: PathBuf,
    pub old_gateway: PathBuf,
    pub new_gateway: PathBuf,
}

/// One scenario's outcome, as `report.json` holds it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ScenarioReport {
    pub scenario: String,
    pub seed: u64,
    pub passed: bool,
    pub checks: u64,
    pub admitted: u64,
    pub allowed: u64,
    pub bound: u64,
    pub bound_rule: String,
    pub bound_why: String,
    pub availability: f64,
    pub p99_latency_ms: f64,
    pub worst_ratio: f64,
    pub worst_key: String,
    pub violations: Vec<String>,
    pub faults: Vec<FaultSpan>,
    pub events: Vec<(f64, String)>,
    pub by_source: Vec<(crate::load::Via, u64)>,
    pub extra: serde_json::Value,
    #[serde(skip)]
    pub result: Option<CheckResult>,
    #[serde(skip)]
    pub series: Vec<crate::svg::KeySeries>,
}

/// `--max-keys` for every node; `key-flood` uses a small one so the flood passes it.
const MAX_KEYS: usize = 1 << 20;
const FLOOD_MAX_KEYS: usize = 4_096;
/// Longest a scenario may run past its duration (slow restarts) before it is called off.
const OVERRUN: Duration = Duration::from_secs(90);

/// Runs one scenario: its world started, driven and judged, then stopped; the nodes' logs
/// are read last.
pub async fn run_scenario(
    scenario: &Scenario,
    settings: &RunSettings,
) -> anyhow::Result<ScenarioReport> {
    let fixed;
    let settings = match scenario.layout {
        Some((regions, nodes_per_region)) => {
            fixed = RunSettings {
                regions,
                nodes_per_region,
                ..settings.clone()
            };
            &fixed
        }
        None => settings,
    };
    let upgrade = if scenario.needs_old_builds {
        Some(settings.upgrade.clone().with_context(|| {
            format!(
                "{} needs --old-node-bin and --old-gateway-bin",
                scenario.name
            )
        })?)
    } else {
        None
    };
    let dir = settings.out.join(scenario.name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir)?;
    let rules = match scenario.plan {
        Plan::RulesReload => Some(RulesFile::create(dir.join("rules.yaml"))?),
        Plan::RollingUpgrade => Some(RulesFile::create_fixed(dir.join("rules.yaml"))?),
        _ => None,
    };
    let mut world = start_world(scenario, settings, rules.as_ref(), upgrade.as_ref(), &dir).await?;
    let outcome = drive_and_check(
        scenario,
        settings,
        &mut world,
        rules.as_ref(),
        upgrade.as_ref(),
        &dir,
    )
    .await;
    world.shutdown().await;
    let mut report = outcome?;
    let log_findings = checker::scan_logs(&dir.join("logs"), scenario.expected_errors);
    for line in log_findings.iter().take(10) {
        report.violations.push(format!("node log: {line}"));
    }
    if log_findings.len() > 10 {
        report
            .violations
            .push(format!("node logs: {} more lines", log_findings.len() - 10));
    }
    report.passed = report.violations.is_empty();
    Ok(report)
}

/// The scenario's nodes, started with its layout, binary and flags.
async fn start_world(
    scenario: &Scenario,
    settings: &RunSettings,
    rules: Option<&RulesFile>,
    upgrade: Option<&UpgradeBins>,
    dir: &Path,
) -> anyhow::Result<World> {
    let layout = Layout {
        regions: settings.regions,
        nodes_per_region: settings.nodes_per_region,
        spares: if scenario.plan == Plan::Churn { 2 } else { 0 },
        gateways_per_region: settings.gateways_per_region,
    };
    let max_keys = if scenario.plan == Plan::KeyFlood {
        FLOOD_MAX_KEYS
    } else {
        MAX_KEYS
    };
    let skewed = scenario.plan == Plan::ClockSkew;
    let region_restart = scenario.plan == Plan::RegionRestart;
    let setup = crate::procs::NodeSetup {
        // The upgrade starts every node from the old build; the timeline moves them over.
        binary: upgrade.map_or_else(|| settings.node_bin.clone(), |u| u.old_node.clone()),
        certs: settings.out.join("certs"),
        logs: dir.join("logs"),
        seeds: Vec::new(),
        max_keys,
        rules: rules.map(|r| r.path.clone()),
    };
    let mut world = World::start(
        layout,
        setup,
        |index| {
            if skewed && index == SKEWED_NODE {
                vec![format!("--test-only-clock-skew-ms={SKEW_MS}")]
            } else if region_restart {
                // At the default 100 ms a link carries at most 10 messages a second (one per
                // destination per interval): 5,000 would take over 8 minutes. Every 2 ms, with
                // the pump admitting every millisecond, a link passes 5,000 in under 15 s.
                vec![format!("--region-sync-interval={REGION_RESTART_SYNC}")]
            } else {
                Vec::new()
            }
        },
        settings.seed,
    )
    .await?;
    world.upgrade_to = upgrade.map(|_| settings.node_bin.clone());
    Ok(world)
}

/// Connects the gateways, drives the load while the timeline plays, then judges the records
/// and writes the scenario's files.
async fn drive_and_check(
    scenario: &Scenario,
    settings: &RunSettings,
    world: &mut World,
    rules: Option<&RulesFile>,
    upgrade: Option<&UpgradeBins>,
    dir: &Path,
) -> anyhow::Result<ScenarioReport> {
    let leased = scenario.plan == Plan::LeaseGatewayKill;
    let config = gateway_config(settings, world, leased);
    let front = if rules.is_some() {
        Front::Rules
    } else {
        Front::Client
    };
    connect_gateways(world, settings, &config, front, leased).await?;
    if let Some(bins) = upgrade.filter(|_| scenario.plan == Plan::RollingUpgrade) {
        // The example gateway's own `--timeout` default (50 ms) is not the client's: the
        // processes are given the client's default, so they run as the in-process gateways do.
        start_gateway_processes(world, bins, config.timeout, settings)
            .await
            .context("starting the old build's gateways")?;
    }
    settle(world).await?;
    let keys = scenario_keys(scenario, settings, world, rules, leased)?;
    let mut run = drive_load(scenario, settings, world, rules, &keys, leased).await?;
    plan_findings(scenario, world, &mut run).await;
    let result = check_records(scenario, settings, world, &keys, &mut run);
    plan_checks(scenario, settings, world, &keys, &mut run);
    write_decisions(&dir.join("decisions.csv"), &run.records, &keys)?;
    let series = crate::svg::series(&run.records, &keys, &result, &scenario.bound, &world.spans);
    crate::svg::write(
        &dir.join(format!("{}.svg", scenario.name)),
        scenario.name,
        &series,
        &world.spans,
        run.run_ns,
    )?;
    Ok(ScenarioReport {
        scenario: scenario.name.to_owned(),
        seed: settings.seed,
        passed: run.violations.is_empty(),
        checks: result.checks,
        admitted: result.admitted,
        allowed: result.allowed,
        bound: result.bound,
        bound_rule: scenario.bound.short(),
        bound_why: scenario.bound.why.to_owned(),
        availability: result.availability,
        p99_latency_ms: result.p99_latency_ms,
        worst_ratio: result.worst_ratio,
        worst_key: result.worst_key.clone(),
        violations: run.violations,
        faults: world.spans.clone(),
        events: world
            .events
            .iter()
            .map(|(t, e)| (*t as f64 / 1e9, e.clone()))
            .collect(),
        by_source: result.by_source.clone(),
        extra: serde_json::Value::Object(run.extra),
        result: Some(result),
        series,
    })
}

/// The checker's verdict on the records against the scenario's bound; its violations join the
/// run's.
fn check_records(
    scenario: &Scenario,
    settings: &RunSettings,
    world: &World,
    keys: &[KeySpec],
    run: &mut Driven,
) -> CheckResult {
    let input = CheckInput {
        keys,
        bound: &scenario.bound,
        faults: &world.spans,
        min_availability: settings
            .availability_floor
            .unwrap_or(scenario.min_availability),
        run_ns: run.run_ns,
        regions: settings.regions,
        fault_sides: bounds::fault_sides(scenario.plan, settings.regions),
        origin_unix_ns: world.origin_unix_ns,
    };
    let result = checker::check(&run.records, &input);
    let global: Vec<_> = result.keys.iter().filter(|k| k.global).collect();
    if !global.is_empty() {
        run.extra
            .insert("global_keys".into(), serde_json::json!(global));
    }
    run.violations.extend(result.violations.iter().cloned());
    result
}

/// Every gateway at the client's defaults (timeout, breaker): what operators run.
fn gateway_config(settings: &RunSettings, world: &World, leased: bool) -> ClientConfig {
    let mut config = ClientConfig::with_ca_file(world.setup.certs.join("ca.pem"));
    if let Some(timeout) = settings.client_timeout {
        config.timeout = timeout;
    }
    if leased {
        config.token_leases.enabled = true;
        config.token_leases.hot_above_per_sec = LEASE_HOT_ABOVE_PER_SEC;
    }
    config
}

/// `gateways_per_region` in-process gateways in every region.
async fn connect_gateways(
    world: &mut World,
    settings: &RunSettings,
    config: &ClientConfig,
    front: Front,
    leased: bool,
) -> anyhow::Result<()> {
    let seeds = world.seeds();
    for region in 0..settings.regions {
        // With several regions a gateway talks to its own region's nodes only, as a real one
        // does: seeded with them and taking slot tables from its region alone (otherwise it
        // follows whichever region's table it hears first, and every region's gateways end up
        // deciding in that region).
        let (seeds, config) = if settings.regions >= 2 {
            let mine: Vec<_> = world
                .region_nodes(region)
                .into_iter()
                .filter_map(|n| seeds.get(n).copied())
                .collect();
            let mut config = config.clone();
            config.region = Some(format!("r{region}"));
            (mine, config)
        } else {
            (seeds.clone(), config.clone())
        };
        for _ in 0..settings.gateways_per_region {
            let index = world.gateways.len();
            let gateway = if leased && index == LEASE_VICTIM_GATEWAY {
                connect_killable_gateway(world, index, region, &seeds, config.clone(), front).await
            } else {
                load::connect_gateway(
                    index,
                    region,
                    &seeds,
                    config.clone(),
                    front,
                    &world.directory,
                )
                .await
            }
            .with_context(|| format!("connecting gateway {index}"))?;
            world.gateways.push(gateway);
        }
    }
    Ok(())
}

/// The keys the load checks: the rules file's or the standard ones in every region, plus the
/// scenario's own.
fn scenario_keys(
    scenario: &Scenario,
    settings: &RunSettings,
    world: &World,
    rules: Option<&RulesFile>,
    leased: bool,
) -> anyhow::Result<Vec<KeySpec>> {
    let mut keys: Vec<KeySpec> = per_region(
        match rules {
            Some(rules) => rules.keys(),
            None => standard_keys(),
        },
        settings.regions,
    );
    // Keys shared by every region (the rules file's keys stay region-scoped).
    if rules.is_none() {
        keys.extend(global_keys(settings.regions));
    }
    if leased {
        keys.extend(per_region(
            lease_keys(settings.gateways_per_region),
            settings.regions,
        ));
    }
    if scenario.plan == Plan::RegionRestart {
        keys.push(pulsed_key_on_pump_link(world)?);
    }
    Ok(keys)
}

/// What the load and the timeline left: the records, when the run ended, each node's live
/// buckets, what was measured on the way and whether the timeline finished.
struct Driven {
    records: Vec<Record>,
    run_ns: u64,
    live: Vec<Option<f64>>,
    extra: serde_json::Map<String, serde_json::Value>,
    violations: Vec<String>,
}

/// Starts the load (and the scenario's side load), plays the timeline, measures what must be
/// read while the nodes still run, then stops the load and closes the fault spans.
async fn drive_load(
    scenario: &Scenario,
    settings: &RunSettings,
    world: &mut World,
    rules: Option<&RulesFile>,
    keys: &[KeySpec],
    leased: bool,
) -> anyhow::Result<Driven> {
    // The run's clock starts with the load.
    world.set_origin();
    let plan = Arc::new(LoadPlan {
        health: world.health.clone(),
        keys: keys.to_vec(),
        origin: world.origin,
        tasks_per_gateway: 2,
        max_in_flight: 256,
        router: world.upgrade.as_ref().and(world.gateways.first().cloned()),
    });
    let (stop_tx, stop) = watch::channel(false);
    let hard_deadline = world.origin + settings.duration + OVERRUN;
    let http: Vec<Arc<HttpSlot>> = world
        .upgrade
        .as_ref()
        .map(|u| u.gateways.iter().map(|g| g.slot.clone()).collect())
        .unwrap_or_default();
    let load = tokio::spawn(load::drive(
        plan,
        world.gateways.clone(),
        http,
        settings.seed,
        stop.clone(),
        hard_deadline,
    ));
    let side_load = start_side_load(scenario, settings, world, &stop, hard_deadline)?;
    let rss_before = node_rss(world);
    let played = tokio::time::timeout(
        settings.duration + OVERRUN,
        timeline::play(scenario, world, settings.duration, rules, keys),
    )
    .await;
    let mut extra = serde_json::Map::new();
    if scenario.plan == Plan::KeyFlood {
        extra.insert("rss_before".into(), serde_json::json!(rss_before));
        extra.insert("rss_after".into(), serde_json::json!(node_rss(world)));
    }
    let live = live_buckets(world).await;
    if leased {
        extra.insert("token_leases".into(), token_lease_stats(world));
    }
    let _ = stop_tx.send(true);
    let records: Vec<Record> = load.await.context("the load task failed")?;
    let side = match side_load {
        Some(task) => Some(task.await.context("the side load failed")?),
        None => None,
    };
    let run_ns = world.now_ns();
    world.close_spans(run_ns);
    let mut violations = Vec::new();
    match played {
        Ok(Ok(())) => {}
        Ok(Err(e)) => violations.push(format!("timeline failed: {e:#}")),
        Err(_) => violations.push(format!(
            "timeline did not finish within {:?}",
            settings.duration + OVERRUN
        )),
    }
    if let Some(side) = side {
        extra.insert("side_load".into(), side);
    }
    Ok(Driven {
        records,
        run_ns,
        live,
        extra,
        violations,
    })
}

/// The token-lease counters of every gateway still alive.
fn token_lease_stats(world: &World) -> serde_json::Value {
    let stats: serde_json::Map<String, serde_json::Value> = world
        .gateways
        .iter()
        .filter(|g| !world.health.gateway_killed(g.index))
        .filter_map(|g| {
            let s = g.client.token_lease_stats()?;
            Some((
                format!("gateway {}", g.index),
                serde_json::json!({
                    "local_allowed": s.local_allowed, "local_denied": s.local_denied,
                    "granted": s.granted, "returned": s.returned, "held": s.held,
                }),
            ))
        })
        .collect();
    serde_json::Value::Object(stats)
}

/// What the scenario itself found on the way (the timeline's findings, its premise, the nodes'
/// own counters), before the records are checked.
async fn plan_findings(scenario: &Scenario, world: &mut World, run: &mut Driven) {
    let Driven {
        records,
        live,
        extra,
        violations,
        ..
    } = run;
    if scenario.plan == Plan::RegionRestart {
        let exchange = region_exchange(world).await;
        extra.insert("region_exchange".into(), exchange);
        let before = world
            .findings
            .get("link_before_restart")
            .and_then(|l| l["delta_messages_to_region_1"].as_f64());
        if before.is_none_or(|n| n < PUMP_LINK_MESSAGES) {
            violations.push(format!(
                "premise not reached: the pump link carried {} delta messages before the restart, not over {PUMP_LINK_MESSAGES}",
                before.map_or("an unknown number of".to_owned(), |n| n.to_string())
            ));
        }
    }
    if scenario.plan == Plan::Stall {
        stall_findings(world, extra).await;
    }
    if scenario.plan == Plan::CrashRestart {
        violations.extend(crate::timeline::judge_restarts(&world.findings, records));
    }
    for (name, value) in std::mem::take(&mut world.findings) {
        extra.insert(name, value);
    }
    if scenario.plan == Plan::RegionUpgrade {
        violations.extend(crate::region_upgrade::judge(extra));
    }
    if scenario.plan == Plan::KeyFlood {
        check_memory(extra, live, FLOOD_MAX_KEYS, violations);
        extra.insert("live_buckets".into(), serde_json::json!(live));
    }
}

/// `stall`: the checks each node decided as a takeover (for a slot it does not own): with the
/// owner never declared dead, every one was decided beside a live owner. And each stall's
/// length.
async fn stall_findings(world: &World, extra: &mut serde_json::Map<String, serde_json::Value>) {
    let mut takeovers = serde_json::Map::new();
    for node in world.nodes.iter().filter(|n| n.is_running()) {
        let n =
            crate::procs::metric_sum(node.spec.admin, "floodgate_takeover_checks_total", &[]).await;
        takeovers.insert(format!("node {}", node.spec.index), serde_json::json!(n));
    }
    extra.insert(
        "takeover_checks".into(),
        serde_json::Value::Object(takeovers),
    );
    let stalls: Vec<u64> = world
        .spans
        .iter()
        .map(|s| s.end_ns.saturating_sub(s.start_ns) / 1_000_000)
        .collect();
    extra.insert("stalls_ms".into(), serde_json::json!(stalls));
}

/// The checks only some scenarios add to the checker's: availability outside the upgrade's
/// restarts, and each phase of a rules reload.
fn plan_checks(
    scenario: &Scenario,
    settings: &RunSettings,
    world: &World,
    keys: &[KeySpec],
    run: &mut Driven,
) {
    let Driven {
        records,
        run_ns,
        extra,
        violations,
        ..
    } = run;
    if scenario.needs_old_builds {
        // Judged with availability: `--availability-floor 0` asks for safety only.
        let deadline = gateway_config(settings, world, false).timeout;
        if settings.availability_floor != Some(0.0)
            && let Some(found) = checker::failed_outside(records, &world.restart_windows, deadline)
        {
            violations.push(found);
        }
    }
    match scenario.plan {
        Plan::RollingUpgrade => {
            extra.insert("upgrade".into(), upgrade_extra(world, records));
        }
        Plan::RegionUpgrade => {
            extra.insert(
                "restart_windows".into(),
                serde_json::json!(world.restart_windows),
            );
        }
        _ => {}
    }
    if scenario.plan == Plan::RulesReload {
        let phases = rules_phases(world, *run_ns);
        let (found, worst) = checker::check_phases(
            records,
            keys,
            &phases,
            RULES_SETTLE_NS,
            world.origin_unix_ns,
        );
        violations.extend(found);
        extra.insert("phase_worst_ratio".into(), serde_json::json!(worst));
    }
}

/// Starts `gateways_per_region` example-gateway processes of the old build per region (one
/// region here), each serving an HTTP place of the load, beside the in-process gateways.
async fn start_gateway_processes(
    world: &mut World,
    bins: &UpgradeBins,
    timeout: Duration,
    settings: &RunSettings,
) -> anyhow::Result<()> {
    let launch = GatewayLaunch {
        seeds: world.seeds(),
        ca: world.setup.certs.join("ca.pem"),
        timeout,
        logs: world.setup.logs.clone(),
    };
    let mut gateways = Vec::new();
    let mut started = Vec::new();
    for place in 0..settings.gateways_per_region * settings.regions {
        let index = world.gateways.len() + place;
        let process = GatewayProcess::start(
            &launch,
            &bins.old_gateway,
            Build::Old,
            index,
            crate::procs::free_tcp_addr()?,
            crate::procs::free_tcp_addr()?,
        )
        .await?;
        world.note(format!(
            "gateway {index} (old build) serves on {}",
            process.listen
        ));
        let region = place / settings.gateways_per_region;
        let slot = Arc::new(HttpSlot::new(place, region, index, process.listen));
        started.push((index, Build::Old, bins.old_gateway.clone()));
        gateways.push(HttpGateway { slot, process });
    }
    world.upgrade = Some(Upgrade {
        new_gateway_bin: bins.new_gateway.clone(),
        launch,
        gateways,
        started,
    });
    Ok(())
}

/// `rolling-upgrade`'s part of `extra`: every gateway with its build, the restart windows,
/// checks per gateway build, and checks a node decided per gateway build before, during and after
/// the node upgrade: which build's gateways the old and new nodes answered.
fn upgrade_extra(world: &World, records: &[Record]) -> serde_json::Value {
    let mut builds: Vec<(usize, Build, String)> = world
        .gateways
        .iter()
        .map(|g| (g.index, Build::New, "in-process".to_owned()))
        .collect();
    if let Some(upgrade) = &world.upgrade {
        builds.extend(
            upgrade
                .started
                .iter()
                .map(|(index, build, binary)| (*index, *build, binary.display().to_string())),
        );
    }
    let build_of = |gateway: u16| {
        builds
            .iter()
            .find(|(index, ..)| *index == gateway as usize)
            .map(|(_, build, _)| *build)
    };
    let nodes: Vec<&FaultSpan> = world
        .restart_windows
        .iter()
        .filter(|w| w.label.starts_with("node "))
        .collect();
    let first = nodes.first().map_or(u64::MAX, |w| w.start_ns);
    let last = nodes.last().map_or(u64::MAX, |w| w.end_ns);
    let summary = upgrade_summary(records, &build_of, first, last);
    serde_json::json!({
        "gateways": builds.iter().map(|(index, build, what)| serde_json::json!({
            "index": index, "build": build, "binary": what,
        })).collect::<Vec<_>>(),
        "restart_windows": world.restart_windows,
        "by_gateway_build": summary,
    })
}

/// Per gateway build: checks, admitted, denied by a node, not decided by a node; and checks a
/// node decided before the node upgrade (`first_ns`, the first SIGTERM: every node old), during
/// it (builds mixed from the first node's return) and after it (`last_ns`: every node new).
fn upgrade_summary(
    records: &[Record],
    build_of: &dyn Fn(u16) -> Option<Build>,
    first_ns: u64,
    last_ns: u64,
) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for build in [Build::Old, Build::New] {
        let mine: Vec<&Record> = records
            .iter()
            .filter(|r| build_of(r.gateway) == Some(build))
            .collect();
        let decided = |from: u64, to: u64| {
            mine.iter()
                .filter(|r| r.via.by_a_node() && r.sent_ns >= from && r.sent_ns < to)
                .count()
        };
        let name = match build {
            Build::Old => "old",
            Build::New => "new",
        };
        out.insert(
            name.into(),
            serde_json::json!({
                "checks": mine.len(),
                "admitted": mine.iter().filter(|r| r.admitted).count(),
                "denied_by_a_node": mine.iter().filter(|r| !r.admitted && r.via.by_a_node()).count(),
                "not_decided_by_a_node": mine.iter().filter(|r| !r.via.by_a_node()).count(),
                "decided_before_node_upgrade": decided(0, first_ns),
                "decided_during_node_upgrade": decided(first_ns, last_ns),
                "decided_after_node_upgrade": decided(last_ns, u64::MAX),
            }),
        );
    }
    serde_json::Value::Object(out)
}

/// Longest the cluster may take to agree on one table after the last node is ready.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(20);
/// Quiet time after the tables agree: hand-offs of the last join are done within 500 ms and a
/// joining node waits at most 1 s to hear from the cluster.
const SETTLE_QUIET: Duration = Duration::from_millis(1_500);

/// Waits until every gateway routes by the same table as the other gateways of its region,
/// naming every running node of that region (each region has its own ring), so the run starts
/// from a settled cluster (a start-up transient is not a scenario's fault).
async fn settle(world: &World) -> anyhow::Result<()> {
    let running = |region: usize| -> Vec<String> {
        world
            .nodes
            .iter()
            .filter(|n| n.is_running() && n.spec.region == region)
            .map(|n| n.spec.advertise.to_string())
            .collect()
    };
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        let agreed = world.gateways.iter().all(|g| {
            let first = world
                .gateways
                .iter()
                .find(|f| f.region == g.region)
                .and_then(|f| f.client.slot_table());
            g.client.slot_table().is_some_and(|t| {
                Some(t.version()) == first.as_ref().map(|f| f.version())
                    && running(g.region)
                        .iter()
                        .all(|addr| t.members().iter().any(|m| &m.addr == addr))
            })
        });
        if agreed {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the gateways' slot tables did not agree on each region's running nodes within {SETTLE_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(SETTLE_QUIET).await;
    Ok(())
}

/// Every decision of the run, one line each, for looking into a finding.
fn write_decisions(path: &Path, records: &[Record], keys: &[KeySpec]) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(
        out,
        "sent_ms,answered_ms,key,gateway,routed_to,via,admitted,reason"
    )?;
    for r in records {
        writeln!(
            out,
            "{:.3},{:.3},{},{},{},{:?},{},{}",
            r.sent_ns as f64 / 1e6,
            r.done_ns as f64 / 1e6,
            keys[r.key as usize].name,
            r.gateway,
            r.routed_to,
            r.via,
            r.admitted,
            r.reason.map(|why| why.to_string()).unwrap_or_default()
        )?;
    }
    out.flush()?;
    Ok(())
}

/// After a rules edit, how long until every check carries the new limit: the node polls the
/// file every 250 ms, gateways ask for a newer version every 200 ms; a second covers both with
/// room for a loaded host.
const RULES_SETTLE_NS: u64 = 1_000_000_000;

/// The stretches between the timeline's rules edits, each under the next step's limit.
fn rules_phases(world: &World, run_ns: u64) -> Vec<checker::Phase> {
    let mut starts = vec![0u64];
    starts.extend(
        world
            .events
            .iter()
            .filter(|(_, what)| what.starts_with("rules file edited"))
            .map(|(at, _)| *at),
    );
    starts
        .iter()
        .enumerate()
        .map(|(limit, &start_ns)| checker::Phase {
            start_ns,
            end_ns: starts.get(limit + 1).copied().unwrap_or(run_ns),
            limit,
        })
        .collect()
}

/// The flood or the hostile client beside the gateways, in its own task.
fn start_side_load(
    scenario: &Scenario,
    settings: &RunSettings,
    world: &World,
    stop: &watch::Receiver<bool>,
    deadline: Instant,
) -> anyhow::Result<Option<tokio::task::JoinHandle<serde_json::Value>>> {
    // The side load starts with the fault span (a fifth in) and ends with it.
    let begin = world.origin + settings.duration.mul_f64(0.2);
    let end = (world.origin + settings.duration.mul_f64(0.9)).min(deadline);
    match scenario.plan {
        Plan::KeyFlood => {
            let client = world.gateways[0].client.clone();
            // An hour's limit: a flooded bucket stays live for the run, so the flood really
            // fills the store past --max-keys instead of expiring behind itself.
            let limit = floodgate::Limit::gcra(5, 3_600 * 1_000_000_000, 5)?;
            let stop = stop.clone();
            let seed = settings.seed;
            Ok(Some(tokio::spawn(async move {
                tokio::time::sleep_until(begin.into()).await;
                let sent = load::flood_random_keys(client, limit, 3_000, seed, stop, end).await;
                serde_json::json!({ "flooded_keys": sent })
            })))
        }
        Plan::HostileFlood => {
            let nodes = world.seeds();
            let ca = world.setup.certs.join("ca.pem");
            let stop = stop.clone();
            let seed = settings.seed;
            Ok(Some(tokio::spawn(async move {
                tokio::time::sleep_until(begin.into()).await;
                match crate::hostile::run(nodes, &ca, seed, stop, end).await {
                    Ok(stats) => serde_json::json!(stats),
                    Err(e) => serde_json::json!({ "error": format!("{e:#}") }),
                }
            })))
        }
        Plan::RegionRestart => {
            // One gateway of each region, the whole run long: both directions of the link.
            let pumps: Vec<Client> = (0..settings.regions)
                .filter_map(|region| world.gateways.iter().find(|g| g.region == region))
                .map(|g| g.client.clone())
                .collect();
            let limit = floodgate::Limit::gcra(5_000, 1_000_000_000, 5_000)?;
            let stop = stop.clone();
            Ok(Some(tokio::spawn(async move {
                let mut tasks = tokio::task::JoinSet::new();
                for client in pumps {
                    tasks.spawn(load::pump(
                        client,
                        PUMP_KEY,
                        limit,
                        Duration::from_millis(1),
                        stop.clone(),
                        deadline,
                    ));
                }
                let (mut sent, mut admitted) = (0, 0);
                while let Some(Ok((s, a))) = tasks.join_next().await {
                    sent += s;
                    admitted += a;
                }
                serde_json::json!({ "pump_checks": sent, "pump_admitted_by_a_node": admitted })
            })))
        }
        _ => Ok(None),
    }
}

/// `region-restart`'s node flag: the exchange's sync interval.
const REGION_RESTART_SYNC: &str = "2ms";

/// `region-restart`: a global GCRA key (20/s, burst 20) whose owners in both regions are the
/// pump key's, offered 200/s in pulses: 1 s on, 1.5 s off (both regions' buckets fill up again),
/// region 1 starting 300 ms after region 0. Region 0 takes a burst first; a region 1 that hears
/// region 0's deltas then admits only the refill, one that does not hear them takes a second
/// burst, over the global bound.
fn pulsed_key_on_pump_link(world: &World) -> anyhow::Result<KeySpec> {
    let link = (
        world.owner_in_region(PUMP_KEY, 0)?,
        world.owner_in_region(PUMP_KEY, 1)?,
    );
    for i in 0..1_000 {
        let name = format!("chaos:restart:pulse:{i}");
        if (
            world.owner_in_region(&name, 0)?,
            world.owner_in_region(&name, 1)?,
        ) == link
        {
            return Ok(KeySpec {
                name,
                limits: vec![floodgate::Limit::gcra(20, 1_000_000_000, 20)?],
                failure_mode: floodgate_client::FailureMode::Open,
                offered_per_second: 200.0,
                region: None,
                scope: floodgate::region::Scope::Global,
                lease_extra: 0,
                pulse: Some(Pulse {
                    period_ns: 2_500_000_000,
                    on_ns: 1_000_000_000,
                    region_lag_ns: 300_000_000,
                }),
            });
        }
    }
    anyhow::bail!("no pulse key shares the pump key's owners {link:?}")
}

/// Per running node: delta messages sent to each other region, and messages applied and
/// refused (out of the sequence window, an older session, a full sender table).
async fn region_exchange(world: &World) -> serde_json::Value {
    let mut nodes = serde_json::Map::new();
    for node in world.nodes.iter().filter(|n| n.is_running()) {
        let admin = node.spec.admin;
        let mut sent = serde_json::Map::new();
        for region in (0..world.layout.regions).filter(|r| *r != node.spec.region) {
            let label = format!("region=\"r{region}\"");
            sent.insert(
                format!("r{region}"),
                serde_json::json!(
                    crate::procs::metric_sum(
                        admin,
                        "floodgate_region_frames_sent_total",
                        &[&label, "kind=\"deltas\""],
                    )
                    .await
                ),
            );
        }
        let applied =
            crate::procs::metric_sum(admin, "floodgate_region_applied_messages", &[]).await;
        let refused =
            crate::procs::metric_sum(admin, "floodgate_region_refused_messages", &[]).await;
        nodes.insert(
            format!("node {}", node.spec.index),
            serde_json::json!({
                "region": node.spec.region,
                "delta_messages_sent": sent,
                "applied_messages": applied,
                "refused_messages": refused,
            }),
        );
    }
    serde_json::Value::Object(nodes)
}

fn node_rss(world: &World) -> Vec<Option<u64>> {
    world.nodes.iter().map(|n| n.rss_bytes()).collect()
}

async fn live_buckets(world: &World) -> Vec<Option<f64>> {
    let mut live = Vec::new();
    for node in &world.nodes {
        live.push(if node.is_running() {
            crate::procs::metric(node.spec.admin, "floodgate_live_buckets").await
        } else {
            None
        });
    }
    live
}

/// Memory stays bounded under a key flood: live buckets within `--max-keys`, and resident
/// memory grown by less than what a store of `--max-keys` could explain many times over.
fn check_memory(
    extra: &serde_json::Map<String, serde_json::Value>,
    live: &[Option<f64>],
    max_keys: usize,
    violations: &mut Vec<String>,
) {
    for (node, count) in live.iter().enumerate() {
        match count {
            Some(count) if *count > max_keys as f64 => violations.push(format!(
                "node {node}: {count} live buckets, over --max-keys {max_keys}"
            )),
            Some(_) => {}
            None => violations.push(format!("node {node}: live buckets not readable")),
        }
    }
    let read = |name: &str| -> Vec<Option<u64>> {
        extra
            .get(name)
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .unwrap_or_default()
    };
    // 64 MiB: buffers, connections and allocator slack; a store that grew with the flood would
    // need far more for the tens of thousands of flooded keys.
    const GROWTH: u64 = 64 << 20;
    for (node, (before, after)) in read("rss_before")
        .into_iter()
        .zip(read("rss_after"))
        .enumerate()
    {
        if let (Some(before), Some(after)) = (before, after)
            && after > before + GROWTH
        {
            violations.push(format!(
                "node {node}: resident memory grew from {before} to {after} bytes under the flood"
            ));
        }
    }
}

/// Connects a gateway whose client runs on a runtime of its own, which the timeline can drop to
/// kill the gateway as a crash would (`World::kill_gateway`).
async fn connect_killable_gateway(
    world: &mut World,
    index: usize,
    region: usize,
    seeds: &[std::net::SocketAddr],
    config: ClientConfig,
    front: Front,
) -> anyhow::Result<load::Gateway> {
    let runtime = crate::world::GatewayRuntime::new()?;
    let handle = runtime
        .handle()
        .context("the gateway's runtime is already gone")?;
    let directory = world.directory.clone();
    let seeds = seeds.to_vec();
    // Connected on its runtime: the client's background tasks live (and die) there.
    let gateway = handle
        .spawn(async move {
            load::connect_gateway(index, region, &seeds, config, front, &directory).await
        })
        .await
        .context("the gateway's runtime stopped while connecting")??;
    world.gateway_runtimes.push((index, runtime));
    Ok(gateway)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::Via;

    #[test]
    fn the_upgrade_summary_splits_checks_by_gateway_build_and_node_stretch() {
        let record = |gateway: u16, sent_s: u64, admitted: bool, via: Via| Record {
            key: 0,
            gateway,
            sent_ns: sent_s * 1_000_000_000,
            done_ns: sent_s * 1_000_000_000 + 1_000_000,
            admitted,
            via,
            routed_to: 0,
            reason: None,
        };
        // Gateway 0 in-process (new), 1 an old process, 2 its new successor; nodes upgraded
        // from 3 s to 9 s.
        let records = [
            record(0, 1, true, Via::Node),
            record(1, 1, false, Via::Node),
            record(1, 4, true, Via::Takeover),
            record(1, 5, false, Via::FailClosed),
            record(0, 8, false, Via::Error),
            record(2, 10, true, Via::Node),
            record(0, 11, false, Via::Node),
        ];
        let build_of = |g: u16| match g {
            1 => Some(Build::Old),
            0 | 2 => Some(Build::New),
            _ => None,
        };
        let s = upgrade_summary(&records, &build_of, 3_000_000_000, 9_000_000_000);
        assert_eq!(
            s["old"],
            serde_json::json!({
                "checks": 3, "admitted": 1, "denied_by_a_node": 1, "not_decided_by_a_node": 1,
                "decided_before_node_upgrade": 1, "decided_during_node_upgrade": 1,
                "decided_after_node_upgrade": 0,
            })
        );
        assert_eq!(
            s["new"],
            serde_json::json!({
                "checks": 4, "admitted": 2, "denied_by_a_node": 1, "not_decided_by_a_node": 1,
                "decided_before_node_upgrade": 1, "decided_during_node_upgrade": 0,
                "decided_after_node_upgrade": 2,
            })
        );
    }
}
