//! The ownership invariant under a seeded simulation: many seeds of machines over a network
//! that delays, loses, duplicates and reorders, with crashes, restarts, joins and leaves; at
//! every change, at most one node decides each slot outside the named windows.
//!
//! `FLOODGATE_SIM_SEED=123` replays exactly one seed; `FLOODGATE_SIM_SEEDS=5000` runs more.

use floodgate::cluster::ownership::sim::{Sim, SimConfig, run_seed};

/// Seeds each run covers (fast: every run is virtual time).
const SEEDS: u64 = 200;

fn seeds() -> Vec<u64> {
    floodgate::simulation::seeds_from_env(SEEDS)
}

#[test]
fn at_most_one_node_decides_a_slot_outside_the_named_windows() {
    let mut totals = (0, 0, 0, 0);
    for seed in seeds() {
        match run_seed(seed) {
            Ok(report) => {
                totals.0 += report.checks;
                totals.1 += report.windows_seen;
                totals.2 += report.table_switches;
                totals.3 += report.handoffs_completed;
            }
            Err(failure) => panic!("{failure}"),
        }
    }
    eprintln!(
        "checked {} instants, {} inside windows, {} table switches, {} hand-offs completed",
        totals.0, totals.1, totals.2, totals.3
    );
    // The runs move slots: a simulation where nothing moves would prove nothing.
    assert!(totals.2 > 0 && totals.3 > 0, "{totals:?}");
}

/// One seed gives the same run twice: replaying a printed seed shows the same failure.
#[test]
fn a_seed_replays_exactly() {
    for seed in [1, 7, 42] {
        assert_eq!(run_seed(seed).ok(), run_seed(seed).ok());
    }
}

/// The checker can fail: with the windows not excused, some seeds have two deciders at once
/// (the windows do happen), and the failure names its seed.
#[test]
fn without_the_windows_the_checker_finds_double_deciders() {
    let failures: Vec<_> = (0..40)
        .filter_map(|seed| {
            let config = SimConfig {
                excuse_windows: false,
                ..SimConfig::from_seed(seed)
            };
            Sim::new(seed, config).run().err()
        })
        .collect();
    assert!(!failures.is_empty(), "no window happened in 40 seeds");
    let shown = failures[0].to_string();
    assert!(
        shown.contains(&format!("FLOODGATE_SIM_SEED={}", failures[0].seed)),
        "{shown}"
    );
    assert!(shown.contains("decided by"), "{shown}");
}

/// The checker catches a driver bug outside every window: a node that sends its hand-offs
/// before it switches tables (no deciding gate) keeps deciding slots their new owner already
/// decides from the hand-off.
#[test]
fn a_hand_off_sent_before_the_switch_is_caught() {
    let caught = (0..40).find_map(|seed| {
        let config = SimConfig {
            send_before_switch: true,
            ..SimConfig::from_seed(seed)
        };
        Sim::new(seed, config).run().err()
    });
    let failure = caught.expect("no seed of 40 caught a hand-off sent before the switch");
    assert!(failure.message.contains("decided by"), "{failure}");
}

/// A rolling upgrade from the build before protocol negotiation (version 2 alone) to this one,
/// under every seed's faults: one decider per slot outside the windows, and every node's
/// cluster version spoken by every member it knows in its current life. Some runs get the
/// whole cluster onto the newest version (the others had a crash or a loss in the way).
#[test]
fn a_rolling_upgrade_keeps_the_invariant_and_a_cluster_version_every_member_speaks() {
    let mut reached = 0;
    // A quarter of the seeds: each run is as long as the plain invariant's.
    for seed in seeds().into_iter().take(SEEDS as usize / 4) {
        let config = SimConfig {
            rolling_upgrade: true,
            ..SimConfig::from_seed(seed)
        };
        let report = Sim::new(seed, config)
            .run()
            .unwrap_or_else(|f| panic!("{f}"));
        assert!(report.newest_cluster_version >= floodgate::protocol::OLDEST);
        if report.newest_cluster_version == floodgate::protocol::NEWEST {
            reached += 1;
        }
    }
    assert!(reached > 0, "no run reached the newest version");
}

/// Without faults, the upgrade ends with every node speaking the newest version: the cluster
/// version moves up once the last old member is gone, and not before (the check above).
#[test]
fn a_quiet_rolling_upgrade_ends_with_the_whole_cluster_on_the_newest_version() {
    for seed in [3, 11, 29] {
        let config = SimConfig {
            nodes: 4,
            max_nodes: 4,
            loss_per_mille: 0,
            duplicate_per_mille: 0,
            crash_per_mille: 0,
            leave_per_mille: 0,
            join_per_mille: 0,
            rolling_upgrade: true,
            ..SimConfig::from_seed(seed)
        };
        let report = Sim::new(seed, config)
            .run()
            .unwrap_or_else(|f| panic!("{f}"));
        assert_eq!(
            report.cluster_versions_at_end,
            vec![floodgate::protocol::NEWEST; 4],
            "seed {seed}"
        );
    }
}

/// The version check can fail: an old build that claims this build's range makes the others
/// speak a version it does not.
#[test]
fn an_old_member_misreporting_its_versions_is_caught() {
    let caught = (0..40).find_map(|seed| {
        let config = SimConfig {
            rolling_upgrade: true,
            old_build_claims_newest: true,
            ..SimConfig::from_seed(seed)
        };
        Sim::new(seed, config).run().err()
    });
    let failure = caught.expect("no seed of 40 caught a misreported range");
    assert!(failure.message.contains("cluster version"), "{failure}");
}
