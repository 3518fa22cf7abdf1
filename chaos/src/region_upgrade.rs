//! `region-upgrade`'s own measure: what each region's exchange carried while the regions ran
//! different builds and once every node ran this one, read from the nodes' counters, and the
//! verdict on it. The bound on the global keys is the checker's, as for every scenario; this
//! says whether the exchange itself kept flowing across the builds, in the layout each link
//! could speak. A delta frame's `version` label is the layout it was written in: the newest
//! layout of kind 13 on a link of this build's version, an older one on a link to an older
//! build.

use floodgate::protocol::NEWEST;
use floodgate::wire::FrameKind;
use serde_json::{Map, Value};

use crate::procs::{metrics_page, sum_samples};
use crate::world::World;

/// The layout this build writes delta frames in to another node of this build.
fn newest_layout() -> u8 {
    FrameKind::RegionDeltas.layout_at(NEWEST)
}

/// The findings' names: the old build's protocol version (its cluster's), and what the
/// exchange carried with the regions on different builds and with every node on this one.
pub const OLD_VERSION: &str = "old_version";
pub const MIXED: &str = "mixed_builds";
pub const ALL_NEW: &str = "every_node_new";

/// One region's counters, summed over its running nodes.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExchangeCounts {
    received_newest: f64,
    received_older: f64,
    applied: f64,
}

/// Per region: delta messages received in the newest layout and in older ones (an older
/// build's nodes do not label the version: they count as older, the only ones they read), and
/// messages applied.
pub async fn exchange_counts(world: &World) -> [ExchangeCounts; 2] {
    const RECEIVED: &str = "floodgate_region_frames_received_total";
    let newest = format!("version=\"{}\"", newest_layout());
    let mut counts = [ExchangeCounts::default(); 2];
    for node in world.nodes.iter().filter(|n| n.is_running()) {
        // One read of the page, so the three counts are of one moment.
        let page = metrics_page(node.spec.admin).await.unwrap_or_default();
        let all = sum_samples(&page, RECEIVED, &["kind=\"deltas\""]);
        let at_newest = sum_samples(&page, RECEIVED, &["kind=\"deltas\"", &newest]);
        let applied = sum_samples(&page, "floodgate_region_applied_messages", &[]);
        let region = &mut counts[node.spec.region.min(1)];
        let (all, at_newest) = (all.unwrap_or(0.0), at_newest.unwrap_or(0.0));
        region.received_newest += at_newest;
        region.received_older += all - at_newest;
        region.applied += applied.unwrap_or(0.0);
    }
    counts
}

/// What each region's counters rose by from `start` to `end` (no node restarted between).
pub fn counts_between(start: &[ExchangeCounts; 2], end: &[ExchangeCounts; 2]) -> Value {
    let region = |r: usize| {
        serde_json::json!({
            "delta_messages_received_in_newest_layout": end[r].received_newest - start[r].received_newest,
            "delta_messages_received_in_older_layouts": end[r].received_older - start[r].received_older,
            "messages_applied": end[r].applied - start[r].applied,
        })
    };
    serde_json::json!({ "region 0": region(0), "region 1": region(1) })
}

/// The verdict on the findings (`extra`), one line per failure:
/// - with region 0 on the old build and region 1 on this one, each read the other's deltas:
///   region 0 applied messages, and region 1 received delta messages, in older layouts only
///   when the old build writes an older one;
/// - with every node on this build, both regions received deltas in the newest layout and
///   none in an older one: the links moved to the newest version.
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

    fn region(newest: f64, older: f64, applied: f64) -> Value {
        serde_json::json!({
            "delta_messages_received_in_newest_layout": newest,
            "delta_messages_received_in_older_layouts": older,
            "messages_applied": applied,
        })
    }

    fn findings(old: u8, mixed: [Value; 2], all_new: [Value; 2]) -> Map<String, Value> {
        let [m0, m1] = mixed;
        let [n0, n1] = all_new;
        let mut extra = Map::new();
        extra.insert(OLD_VERSION.into(), serde_json::json!(old));
        extra.insert(
            MIXED.into(),
            serde_json::json!({"region 0": m0, "region 1": m1}),
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

    #[test]
    fn stretches_not_measured_fail() {
        assert_eq!(judge(&Map::new()).len(), 6);
    }
}
