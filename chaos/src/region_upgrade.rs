//! `region-upgrade`'s own measure: what each region's exchange carried while the regions ran
//! different builds and once every node ran this one, read from the nodes' counters, and the
//! verdict on it. The bound on the global keys is the checker's, as for every scenario; this
//! says whether the exchange itself kept flowing across the builds, in the layout each link
//! could speak, and whether a region already upgraded replicated and handed off in the newest
//! layouts though the other region was still old. A frame's `version` label is the layout it
//! was written in: for deltas the newest layout of kind 13 on a link of this build's version,
//! an older one on a link to an older build; for replicas (kind 7) the newest once every
//! member of the sender's region runs this build; for a hand-off, the newest its link speaks.

use floodgate::protocol::NEWEST;
use floodgate::wire::FrameKind;
use serde_json::{Map, Value};

use crate::procs::{metrics_page, sum_samples};
use crate::world::World;

/// The layout this build writes delta frames in to another node of this build.
fn newest_layout() -> u8 {
    FrameKind::RegionDeltas.layout_at(NEWEST)
}

/// The layout this build writes replicas in within a region of this build, and hand-offs in
/// to a node of this build.
fn newest_replicate_layout() -> u8 {
    FrameKind::Replicate.layout_at(NEWEST)
}

/// The findings' names: the old build's protocol version (its cluster's), and what the
/// exchange carried with the regions on different builds and with every node on this one.
pub const OLD_VERSION: &str = "old_version";
pub const MIXED: &str = "mixed_builds";
pub const ALL_NEW: &str = "every_node_new";
/// Within `MIXED`, beside the regions: the hand-offs received by region 1's node upgraded last
/// (when it joined its region, the other member already of this build), read as it ends.
pub const LAST_JOIN: &str = "last_join_of_region_1";

/// One region's counters, summed over its running nodes.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExchangeCounts {
    received_newest: f64,
    received_older: f64,
    applied: f64,
    replicas: Layouts,
}

/// Frames received in the newest layout and in older ones.
#[derive(Debug, Clone, Copy, Default)]
pub struct Layouts {
    newest: f64,
    older: f64,
}

impl Layouts {
    /// The kind 7 frames carrying `of` (`replicas` or `handoff`) that a metrics page counts
    /// (an older build has no such counter: nothing received).
    fn of_replicate(page: &str, of: &str) -> Layouts {
        const RECEIVED: &str = "floodgate_replicate_frames_received_total";
        let of = format!("of=\"{of}\"");
        let newest = format!("version=\"{}\"", newest_replicate_layout());
        let all = sum_samples(page, RECEIVED, &[&of]).unwrap_or(0.0);
        let newest = sum_samples(page, RECEIVED, &[&of, &newest]).unwrap_or(0.0);
        Layouts {
            newest,
            older: all - newest,
        }
    }
}

/// Per region: delta messages received in the newest layout and in older ones (an older
/// build's nodes do not label the version: they count as older, the only ones they read),
/// messages applied, and replicate frames of replicas received by layout.
pub async fn exchange_counts(world: &World) -> [ExchangeCounts; 2] {
    const RECEIVED: &str = "floodgate_region_frames_received_total";
    let newest = format!("version=\"{}\"", newest_layout());
    let mut counts = [ExchangeCounts::default(); 2];
    for node in world.nodes.iter().filter(|n| n.is_running()) {
        // One read of the page, so the counts are of one moment.
        let page = metrics_page(node.spec.admin).await.unwrap_or_default();
        let all = sum_samples(&page, RECEIVED, &["kind=\"deltas\""]);
        let at_newest = sum_samples(&page, RECEIVED, &["kind=\"deltas\"", &newest]);
        let applied = sum_samples(&page, "floodgate_region_applied_messages", &[]);
        let replicas = Layouts::of_replicate(&page, "replicas");
        let region = &mut counts[node.spec.region.min(1)];
        let (all, at_newest) = (all.unwrap_or(0.0), at_newest.unwrap_or(0.0));
        region.received_newest += at_newest;
        region.received_older += all - at_newest;
        region.applied += applied.unwrap_or(0.0);
        region.replicas.newest += replicas.newest;
        region.replicas.older += replicas.older;
    }
    counts
}

/// The lowest region version the running nodes of `region` publish
/// (`floodgate_region_protocol_version`; 0 where a node publishes none).
pub async fn region_version(world: &World, region: usize) -> f64 {
    let mut lowest: Option<f64> = None;
    for node in world.nodes.iter().filter(|n| n.is_running()) {
        if node.spec.region.min(1) != region {
            continue;
        }
        let page = metrics_page(node.spec.admin).await.unwrap_or_default();
        let version = sum_samples(&page, "floodgate_region_protocol_version", &[]).unwrap_or(0.0);
        lowest = Some(lowest.map_or(version, |l| l.min(version)));
    }
    lowest.unwrap_or(0.0)
}

/// The hand-off frames `node` received since it started, by layout.
pub async fn handoffs_received(world: &World, node: usize) -> Value {
    let page = metrics_page(world.nodes[node].spec.admin)
        .await
        .unwrap_or_default();
    let handoffs = Layouts::of_replicate(&page, "handoff");
    serde_json::json!({
        "handoff_frames_received_in_newest_layout": handoffs.newest,
        "handoff_frames_received_in_older_layouts": handoffs.older,
    })
}

/// What each region's counters rose by from `start` to `end` (no node restarted between).
pub fn counts_between(start: &[ExchangeCounts; 2], end: &[ExchangeCounts; 2]) -> Value {
    let region = |r: usize| {
        let (start, end) = (&start[r], &end[r]);
        serde_json::json!({
            "delta_messages_received_in_newest_layout": end.received_newest - start.received_newest,
            "delta_messages_received_in_older_layouts": end.received_older - start.received_older,
            "messages_applied": end.applied - start.applied,
            "replica_frames_received_in_newest_layout": end.replicas.newest - start.replicas.newest,
            "replica_frames_received_in_older_layouts": end.replicas.older - start.replicas.older,
        })
    };
    serde_json::json!({ "region 0": region(0), "region 1": region(1) })
}

/// The verdict on the findings (`extra`), one line per failure:
/// - with region 0 on the old build and region 1 on this one, each read the other's deltas:
///   region 0 applied messages, and region 1 received delta messages, in older layouts only
///   when the old build writes an older one;
/// - with every node on this build, both regions received deltas in the newest layout and
///   none in an older one: the links moved to the newest version;
/// - in a region whose nodes all run this build (region 1 while mixed, both after), replicas
///   went in the newest layout of kind 7 and none in an older one, and (region 1 while mixed)
///   its nodes published this build's newest region version: what stays in a region follows
///   that region's version, not the other region's older build;
/// - region 1's node upgraded last received its join's hand-off in the newest layout, none in
///   an older one: a hand-off follows its link, though the old region's gossip told of that
///   node's restart first, with no version range (the old build's layout has none).
pub fn judge(extra: &Map<String, Value>) -> Vec<String> {
    let mut found = Vec::new();
    let count = |stretch: &str, region: &str, what: &str| {
        extra
            .get(stretch)
            .and_then(|s| s.get(region))
            .and_then(|r| r.get(what))
            .and_then(Value::as_f64)
    };
    let mut expect =
        |stretch: &str, region: &str, what: &str, ok: fn(f64) -> bool, want: &str| match count(
            stretch, region, what,
        ) {
            Some(n) if ok(n) => {}
            Some(n) => found.push(format!("{stretch}: {region}'s {what} was {n}, {want}")),
            None => found.push(format!("{stretch}: {region}'s {what} was not measured")),
        };
    expect(
        MIXED,
        "region 0",
        "messages_applied",
        |n| n > 0.0,
        "expected some: the old build read none of the new build's deltas",
    );
    let newer_than_old = extra
        .get(OLD_VERSION)
        .and_then(Value::as_u64)
        .and_then(|old| u8::try_from(old).ok())
        .is_some_and(|old| FrameKind::RegionDeltas.layout_at(old) < newest_layout());
    if newer_than_old {
        expect(
            MIXED,
            "region 1",
            "delta_messages_received_in_older_layouts",
            |n| n > 0.0,
            "expected some: the new build read none of the old build's deltas",
        );
        expect(
            MIXED,
            "region 1",
            "delta_messages_received_in_newest_layout",
            |n| n == 0.0,
            "expected none: a link to the old build cannot speak the newest layout",
        );
    } else {
        expect(
            MIXED,
            "region 1",
            "delta_messages_received_in_newest_layout",
            |n| n > 0.0,
            "expected some: the new build read none of the old build's deltas",
        );
    }
    let replicated = [
        (MIXED, "region 1"),
        (ALL_NEW, "region 0"),
        (ALL_NEW, "region 1"),
    ];
    for (stretch, region) in replicated {
        expect(
            stretch,
            region,
            "replica_frames_received_in_newest_layout",
            |n| n > 0.0,
            "expected some: its nodes all run this build",
        );
        expect(
            stretch,
            region,
            "replica_frames_received_in_older_layouts",
            |n| n == 0.0,
            "expected none: its nodes all run this build",
        );
    }
    expect(
        MIXED,
        "region 1",
        "region_protocol_version",
        |n| n == f64::from(NEWEST),
        "expected this build's newest: its nodes all run this build",
    );
    expect(
        MIXED,
        LAST_JOIN,
        "handoff_frames_received_in_newest_layout",
        |n| n > 0.0,
        "expected some: it joined a member of this build",
    );
    expect(
        MIXED,
        LAST_JOIN,
        "handoff_frames_received_in_older_layouts",
        |n| n == 0.0,
        "expected none: its link to the other member speaks the newest",
    );
    for region in ["region 0", "region 1"] {
        expect(
            ALL_NEW,
            region,
            "delta_messages_received_in_newest_layout",
            |n| n > 0.0,
            "expected some: the upgraded links did not move to the newest layout",
        );
        expect(
            ALL_NEW,
            region,
            "delta_messages_received_in_older_layouts",
            |n| n == 0.0,
            "expected none: every node runs this build",
        );
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A region's counts, its replicas all in the newest layout (as a region of this build's
    /// are; the judge reads no replicas of a region on the old build).
    fn region(newest: f64, older: f64, applied: f64) -> Value {
        serde_json::json!({
            "delta_messages_received_in_newest_layout": newest,
            "delta_messages_received_in_older_layouts": older,
            "messages_applied": applied,
            "replica_frames_received_in_newest_layout": 12.0,
            "replica_frames_received_in_older_layouts": 0.0,
            "region_protocol_version": f64::from(NEWEST),
        })
    }

    fn with_replicas(mut region: Value, newest: f64, older: f64) -> Value {
        region["replica_frames_received_in_newest_layout"] = newest.into();
        region["replica_frames_received_in_older_layouts"] = older.into();
        region
    }

    /// The findings, region 1's last node having received its join's hand-off in the newest
    /// layout.
    fn findings(old: u8, mixed: [Value; 2], all_new: [Value; 2]) -> Map<String, Value> {
        let [m0, m1] = mixed;
        let [n0, n1] = all_new;
        let mut extra = Map::new();
        extra.insert(OLD_VERSION.into(), serde_json::json!(old));
        let last_join = serde_json::json!({
            "handoff_frames_received_in_newest_layout": 1.0,
            "handoff_frames_received_in_older_layouts": 0.0,
        });
        extra.insert(
            MIXED.into(),
            serde_json::json!({"region 0": m0, "region 1": m1, LAST_JOIN: last_join}),
        );
        extra.insert(
            ALL_NEW.into(),
            serde_json::json!({"region 0": n0, "region 1": n1}),
        );
        extra
    }

    fn upgraded() -> [Value; 2] {
        [region(40.0, 0.0, 40.0), region(38.0, 0.0, 38.0)]
    }

    #[test]
    fn an_exchange_that_flowed_on_each_stretchs_version_passes() {
        // The old build counts what it received as older (it labels no version).
        let mixed = [region(0.0, 35.0, 35.0), region(0.0, 33.0, 33.0)];
        assert_eq!(
            judge(&findings(2, mixed.clone(), upgraded())),
            Vec::<String>::new()
        );
        // A build on 12 negotiates, but writes deltas in version 4's layout: older too.
        assert_eq!(
            judge(&findings(12, mixed, upgraded())),
            Vec::<String>::new()
        );
    }

    #[test]
    fn each_missing_direction_or_version_is_named() {
        // The old region applied nothing of the new one's.
        let found = judge(&findings(
            2,
            [region(0.0, 30.0, 0.0), region(0.0, 33.0, 33.0)],
            upgraded(),
        ));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("region 0's messages_applied"),
            "{found:?}"
        );
        // The new region heard nothing, and a link to the old build claimed the newest version.
        let found = judge(&findings(
            2,
            [region(0.0, 35.0, 35.0), region(5.0, 0.0, 5.0)],
            upgraded(),
        ));
        assert_eq!(found.len(), 2, "{found:?}");
        // After the upgrade one region still received at an older version, the other nothing.
        let found = judge(&findings(
            2,
            [region(0.0, 35.0, 35.0), region(0.0, 33.0, 33.0)],
            [region(40.0, 3.0, 43.0), region(0.0, 0.0, 0.0)],
        ));
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found
                .iter()
                .any(|f| f.contains("region 0's delta_messages_received_in_older_layouts"))
        );
        assert!(
            found
                .iter()
                .any(|f| f.contains("region 1's delta_messages_received_in_newest_layout"))
        );
    }

    #[test]
    fn an_old_build_as_new_as_this_one_must_speak_the_newest_while_mixed() {
        let mixed = [region(35.0, 0.0, 35.0), region(33.0, 0.0, 33.0)];
        assert!(judge(&findings(NEWEST, mixed, upgraded())).is_empty());
        let older = [region(0.0, 35.0, 35.0), region(0.0, 33.0, 33.0)];
        assert_eq!(judge(&findings(NEWEST, older, upgraded())).len(), 1);
    }

    /// Region 1, all on this build while region 0 is old, must replicate in the newest layout
    /// (an older one says it followed the cluster's version, not its region's), and its last
    /// node's join hand-off must come in it (an older one: not the link's version).
    #[test]
    fn a_region_of_this_build_replicating_in_an_older_layout_is_named() {
        let mixed = || [region(0.0, 35.0, 35.0), region(0.0, 33.0, 33.0)];
        let [m0, m1] = mixed();
        let found = judge(&findings(2, [m0, with_replicas(m1, 0.0, 9.0)], upgraded()));
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found
                .iter()
                .all(|f| f.contains("region 1's replica_frames"))
        );
        let [m0, mut m1] = mixed();
        m1["region_protocol_version"] = 2.0.into();
        let found = judge(&findings(2, [m0, m1], upgraded()));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("region 1's region_protocol_version was 2"));
        let mut extra = findings(2, mixed(), upgraded());
        extra[MIXED][LAST_JOIN]["handoff_frames_received_in_newest_layout"] = 0.0.into();
        extra[MIXED][LAST_JOIN]["handoff_frames_received_in_older_layouts"] = 1.0.into();
        let found = judge(&extra);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.iter().all(|f| f.contains(LAST_JOIN)), "{found:?}");
        // After the upgrade, a region that replicated nothing.
        let [n0, n1] = upgraded();
        let found = judge(&findings(2, mixed(), [with_replicas(n0, 0.0, 0.0), n1]));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("every_node_new: region 0's replica_frames_received_in_newest"));
    }

    #[test]
    fn stretches_not_measured_fail() {
        // Deltas 6, replicas 6 (three regions' stretches), region 1's version while mixed 1,
        // the last join's hand-offs 2.
        assert_eq!(judge(&Map::new()).len(), 15);
    }
}
