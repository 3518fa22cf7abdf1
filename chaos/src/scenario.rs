//! The scenarios: what each does to the cluster, and the over-admission bound it is held to,
//! derived from the documented failure model (docs/CLUSTER.md, docs/LEASES.md).

use std::time::Duration;

use crate::keys::KeySpec;

/// Over-admission a scenario may add, per window of a key's limit, in windows a fault touched
/// (plus a settling time after it). Fallback buckets are counted apart, always: a gateway whose
/// fallback bucket admitted in a window adds one limit, as documented for failure mode open.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Bound {
    /// Extra whole limits (1.0: "twice the limit while it lasts").
    pub limits: f64,
    /// Extra bursts (GCRA's burst; a window's count).
    pub bursts: f64,
    /// Extra refill: the key's rate over this long.
    pub rate_for: Duration,
    /// Where the bound comes from, in words.
    pub why: &'static str,
}

impl Bound {
    pub fn exact() -> Self {
        Bound {
            limits: 0.0,
            bursts: 0.0,
            rate_for: Duration::ZERO,
            why: "exact: the owner decides every check",
        }
    }

    /// A crash: the successor decides from replicas at most one sync interval (100 ms) old.
    pub fn crash() -> Self {
        Bound {
            limits: 0.0,
            bursts: 1.0,
            rate_for: Duration::from_millis(100),
            why: "crash: one burst + 100 ms of rate per moved key (replicas one sync interval behind)",
        }
    }

    /// Two deciders for one key while a partition lasts; merges keep the stricter copy.
    pub fn partition(why: &'static str) -> Self {
        Bound {
            limits: 1.0,
            bursts: 0.0,
            rate_for: Duration::ZERO,
            why,
        }
    }

    pub fn extra_per_window(&self, key: &KeySpec) -> u64 {
        let limits = self.limits * key.allowed_per_window() as f64;
        let bursts = self.bursts * key.burst() as f64;
        let rate = key.rate_over(self.rate_for.as_nanos() as u64);
        (limits + bursts + rate).ceil() as u64
    }

    /// Short form for the table: `exact`, `+1 limit`, `+1 burst +100ms`.
    pub fn short(&self) -> String {
        let mut parts = Vec::new();
        if self.limits > 0.0 {
            parts.push(format!("+{} limit", self.limits));
        }
        if self.bursts > 0.0 {
            parts.push(format!("+{} burst", self.bursts));
        }
        if !self.rate_for.is_zero() {
            parts.push(format!("+{}ms rate", self.rate_for.as_millis()));
        }
        if parts.is_empty() {
            "exact".to_owned()
        } else {
            parts.join(" ")
        }
    }
}

/// What the timeline does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    Steady,
    Kill,
    CrashRestart,
    Pause,
    RollingRestart,
    Churn,
    RegionPartition,
    WanDelay,
    ClientPartition,
    RulesReload,
    KeyFlood,
    HostileFlood,
    ClockSkew,
    LeaseGatewayKill,
    RollingUpgrade,
    Stall,
    RegionRestart,
    RegionUpgrade,
}

/// Which endpoints a regional fault splits. Each region has its own ring, so a region cut off
/// moves no region-scoped key; only global keys cross the cut. The variant's name is older
/// than per-region rings: the split is region 0 against the rest (`timeline::region_sides`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegionScope {
    /// Region 0's nodes and gateways against the rest (with one region: half against half).
    SharedRing,
}

#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: &'static str,
    pub about: &'static str,
    pub plan: Plan,
    pub bound: Bound,
    /// Least share of checks a node must decide (the rest fall back or fail closed).
    pub min_availability: f64,
    /// Log lines (substrings) this scenario provokes on purpose at ERROR.
    pub expected_errors: &'static [&'static str],
    pub region_scope: RegionScope,
    /// Runs an older build beside this one (`--old-node-bin`, `--old-gateway-bin`): left out of
    /// `all` without them.
    pub needs_old_builds: bool,
    /// (regions, nodes per region) the scenario always runs with, whatever `run` was given.
    pub layout: Option<(usize, usize)>,
}

/// What a graceful leave makes its peers log at ERROR today: a draining node refuses new
/// connections, and peers dialing it log the refused handshake as they would a certificate
/// failure. Expected (the leave is on purpose), so not a verdict, but the report names it.
const LEAVE_ERRORS: &[&str] = &[
    "peer handshake failed: aborted by peer: the server refused to accept a new connection",
    "peer handshake failed: closed",
];
/// The hostile client's frames of an unknown protocol version: a node says so at ERROR (as
/// for a caller of another build), once per 10 s, and counts the rest.
const HOSTILE_ERRORS: &[&str] = &["closed a stream: frame of protocol version 99"];

/// Every scenario, in the order `all` runs them.
// A table, one entry per scenario: long on purpose, so the scenarios read side by side.
pub fn catalogue() -> Vec<Scenario> {
    let base = |name, about, plan, bound, min_availability| Scenario {
        name,
        about,
        plan,
        bound,
        min_availability,
        expected_errors: &[],
        region_scope: RegionScope::SharedRing,
        needs_old_builds: false,
        layout: None,
    };
    vec![
        base(
            "steady",
            "load with no fault",
            Plan::Steady,
            Bound::exact(),
            0.99,
        ),
        base(
            "kill",
            "kill -9 of a key's owner under load; it stays down",
            Plan::Kill,
            Bound::crash(),
            0.80,
        ),
        Scenario {
            bound: Bound {
                why: "crash, then a restart at the same address: the successors decide the moved keys from replicas at most one sync interval old; the new life joins and takes them back by hand-off (exact); each new life ready within 2 s, and after each restart the checks routed to it 0.2-3 s after it was ready (until the next kill) decided by a node (all but 3)",
                ..Bound::crash()
            },
            ..base(
                "crash-restart",
                "kill -9 of a key's owner under load, started again at its address 0.3 s later (a supervisor's restart, before the failure detector declares it dead); at 60% again, down 1.5 s (declared dead first, so the clients see it leave their tables and come back)",
                Plan::CrashRestart,
                Bound::crash(),
                0.80,
            )
        },
        Scenario {
            bound: Bound::partition(
                "pause: the paused owner is declared dead (1 s) and its successor takes over; on SIGCONT it decides again from its 3 s old buckets until tables agree: a partition, up to twice the limit",
            ),
            ..base(
                "pause",
                "SIGSTOP of a key's owner for 3 s, then SIGCONT",
                Plan::Pause,
                Bound::exact(),
                0.70,
            )
        },
        Scenario {
            expected_errors: LEAVE_ERRORS,
            bound: Bound {
                why: "exact: graceful leave and join hand every bucket over (docs: nothing is lost); no failed check",
                ..Bound::exact()
            },
            ..base(
                "rolling-restart",
                "every node in turn: SIGTERM, start again, wait until ready",
                Plan::RollingRestart,
                Bound::exact(),
                0.95,
            )
        },
        Scenario {
            expected_errors: LEAVE_ERRORS,
            bound: Bound {
                why: "exact: joins and graceful leaves hand buckets over",
                ..Bound::exact()
            },
            ..base(
                "churn",
                "two nodes join and two leave (SIGTERM) under load",
                Plan::Churn,
                Bound::exact(),
                0.90,
            )
        },
        Scenario {
            bound: Bound {
                why: "exact for region keys: each region has its own ring and its gateways talk to its own nodes, so the cut moves no region key and each region's copy is held to the limit; global keys: the global bound with the partition bound (k = 2)",
                ..Bound::exact()
            },
            ..base(
                "region-partition",
                "region 0 cut off from the other regions (nodes and gateways), then healed",
                Plan::RegionPartition,
                Bound::exact(),
                0.60,
            )
        },
        Scenario {
            bound: Bound {
                why: "exact: delay and 1% loss move no key (heartbeats stay well inside 500 ms)",
                ..Bound::exact()
            },
            ..base(
                "wan-delay",
                "50 ms +- 20 ms and 1% loss on every path between regions",
                Plan::WanDelay,
                Bound::exact(),
                0.90,
            )
        },
        base(
            "client-partition",
            "gateway 0 cut from a key's owner: it takes over through the successor while the others reach the owner",
            Plan::ClientPartition,
            Bound::partition(
                "client-side cut: the successor and the live owner both decide: up to twice the limit while it lasts; fail-closed checks never admit without a node",
            ),
            0.80,
        ),
        Scenario {
            bound: Bound {
                why: "exact under the limits in force: the largest burst plus the fastest rate over the longest period (a changed limit carries the debt over)",
                ..Bound::exact()
            },
            ..base(
                "rules-reload",
                "the rules file edited under load: 20/s -> 10/2s (a period change) -> 5/s; each step held to its own limit once it settles",
                Plan::RulesReload,
                Bound::exact(),
                0.95,
            )
        },
        Scenario {
            bound: Bound {
                why: "exact for the known keys: the flood's one-off keys are evicted before keys in use; node memory bounded by --max-keys",
                ..Bound::exact()
            },
            ..base(
                "key-flood",
                "random keys flooded past --max-keys beside the known keys",
                Plan::KeyFlood,
                Bound::exact(),
                0.90,
            )
        },
        Scenario {
            expected_errors: HOSTILE_ERRORS,
            bound: Bound {
                why: "exact: hostile frames close only their own streams",
                ..Bound::exact()
            },
            ..base(
                "hostile-flood",
                "garbage datagrams and garbage, oversized and forbidden frames from a hostile client",
                Plan::HostileFlood,
                Bound::exact(),
                0.95,
            )
        },
        Scenario {
            expected_errors: LEAVE_ERRORS,
            bound: Bound {
                limits: 0.0,
                bursts: 1.0,
                rate_for: Duration::from_millis(250),
                why: "clock skew (not in the docs; derived): a hand-off from a clock 250 ms off shifts GCRA times and window edges by the skew: one burst + 250 ms of rate per moved key",
            },
            ..base(
                "clock-skew",
                "one node's clock 250 ms ahead (--test-only-clock-skew-ms); it leaves gracefully halfway",
                Plan::ClockSkew,
                Bound::exact(),
                0.90,
            )
        },
        Scenario {
            bound: Bound {
                why: "token leases: hot keys are decided at the gateways against tokens taken from the owner's bucket, so a window may see the tokens the gateways hold beside what the bucket allows in it (the key's lease allowance, always); a killed gateway only strands its lease (under-admission), so the fault adds nothing",
                ..Bound::exact()
            },
            ..base(
                "lease-gateway-kill",
                "two hot keys leased (token leases) by every gateway of their region; gateway 0 killed at 40% (its runtime dropped: nothing returned)",
                Plan::LeaseGatewayKill,
                Bound::exact(),
                0.90,
            )
        },
        Scenario {
            bound: Bound {
                why: "exact: every stall (20-200 ms) is shorter than the failure detector (suspect after 500 ms of silence, dead after 1 s), so the owner never stops owning its keys and no other node may decide them; fallback buckets add a limit per gateway, as always",
                ..Bound::exact()
            },
            ..base(
                "stall",
                "SIGSTOP of the node owning the busiest keys for 20-200 ms (seeded), then SIGCONT, every 0.5-1.5 s from 20% to 90% of the run",
                Plan::Stall,
                Bound::exact(),
                0.80,
            )
        },
        Scenario {
            expected_errors: LEAVE_ERRORS,
            // Two regions of two nodes: a region keeps a node to hand its buckets to while the
            // other restarts, and the restarted node owns the keys of one exchange link.
            layout: Some((2, 2)),
            bound: Bound {
                why: "the global bound: a graceful restart hands the region's buckets over and back (exact), and the exchange applies each message exactly once across it, duplicated and reordered datagrams included; region keys exact",
                ..Bound::exact()
            },
            ..base(
                "region-restart",
                "two regions; global keys under load, a pump keeping one exchange link over 5,000 messages (--region-sync-interval 2ms) and a pulsed global key on that link, with 2% of datagrams between regions duplicated and 2% reordered; at 70% the link's receiver in region 1 restarts (SIGTERM, start again), then more load",
                Plan::RegionRestart,
                Bound::exact(),
                0.90,
            )
        },
        Scenario {
            expected_errors: LEAVE_ERRORS,
            needs_old_builds: true,
            // Three nodes, so a key keeps two live members to move between while one restarts.
            layout: Some((1, 3)),
            bound: Bound {
                why: "exact: the rolling restart's graceful leaves and joins, across builds: an old node hands its buckets to new ones and back; no failed check outside a node's or gateway's restart but a rare missed deadline (at most 1 in 500 checks)",
                ..Bound::exact()
            },
            ..base(
                "rolling-upgrade",
                "3 nodes and gateways of an OLD build (--old-node-bin, --old-gateway-bin) beside in-process gateways of this one, under load; each node in turn SIGTERMed and started from this build, then each old gateway process replaced by this build's",
                Plan::RollingUpgrade,
                Bound::exact(),
                0.95,
            )
        },
        Scenario {
            expected_errors: LEAVE_ERRORS,
            needs_old_builds: true,
            // Two nodes a region: each restart hands its buckets to a live member and back.
            layout: Some((2, 2)),
            bound: Bound {
                why: "the global bound across builds: while one region runs the old build and the other this one, their exchange speaks the newest version both read, and each graceful restart hands its buckets over and back (exact); region keys exact",
                ..Bound::exact()
            },
            ..base(
                "region-upgrade",
                "two regions of an OLD build (--old-node-bin) under load with global keys; region 1's nodes in turn SIGTERMed and started from this build, a stretch with the regions on different builds, then region 0's; the exchange must flow both ways on the older version while mixed and on the newest after",
                Plan::RegionUpgrade,
                Bound::exact(),
                0.90,
            )
        },
    ]
}

pub fn find(name: &str) -> Option<Scenario> {
    catalogue().into_iter().find(|s| s.name == name)
}

/// The scenarios `run --scenario` names: `all`, or names separated by commas. With
/// `old_builds` false (no `--old-node-bin`/`--old-gateway-bin`), `all` leaves out the scenarios
/// that need them and naming one is an error that says what to give.
pub fn select(spec: &str, old_builds: bool) -> Result<Vec<Scenario>, String> {
    if spec == "all" {
        return Ok(catalogue()
            .into_iter()
            .filter(|s| old_builds || !s.needs_old_builds)
            .collect());
    }
    spec.split(',')
        .map(|name| {
            let scenario =
                find(name).ok_or_else(|| format!("no scenario `{name}`: `floodgate-chaos list` names them"))?;
            if scenario.needs_old_builds && !old_builds {
                return Err(format!(
                    "scenario `{name}` runs an older build beside this one: give --old-node-bin PATH and --old-gateway-bin PATH (that build's floodgate-node and examples/gateway; `make upgrade-test` builds them)"
                ));
            }
            Ok(scenario)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(scenarios: &[Scenario]) -> Vec<&'static str> {
        scenarios.iter().map(|s| s.name).collect()
    }

    #[test]
    fn all_leaves_out_the_upgrade_unless_the_old_builds_are_given() {
        let without = select("all", false).unwrap();
        assert!(!names(&without).contains(&"rolling-upgrade"));
        assert!(!names(&without).contains(&"region-upgrade"));
        assert_eq!(without.len(), catalogue().len() - 2);
        let with = select("all", true).unwrap();
        assert_eq!(names(&with), names(&catalogue()));
        assert!(names(&with).contains(&"rolling-upgrade"));
    }

    #[test]
    fn naming_the_upgrade_needs_the_old_builds_and_says_which_flags() {
        let error = select("steady,rolling-upgrade", false).unwrap_err();
        assert!(
            error.contains("--old-node-bin") && error.contains("--old-gateway-bin"),
            "{error}"
        );
        assert_eq!(
            names(&select("rolling-upgrade", true).unwrap()),
            ["rolling-upgrade"]
        );
        assert_eq!(
            names(&select("steady,kill", false).unwrap()),
            ["steady", "kill"]
        );
        assert!(
            select("nope", true)
                .unwrap_err()
                .contains("no scenario `nope`")
        );
    }

    #[test]
    fn the_upgrade_is_held_to_the_rolling_restart_bound_on_three_nodes() {
        let upgrade = find("rolling-upgrade").unwrap();
        let restart = find("rolling-restart").unwrap();
        assert_eq!(upgrade.bound.short(), "exact");
        assert_eq!(upgrade.min_availability, restart.min_availability);
        assert_eq!(upgrade.expected_errors, LEAVE_ERRORS);
        assert_eq!(upgrade.layout, Some((1, 3)));
        let old_builds: Vec<&str> = catalogue()
            .iter()
            .filter(|s| s.needs_old_builds)
            .map(|s| s.name)
            .collect();
        assert_eq!(old_builds, ["rolling-upgrade", "region-upgrade"]);
        let regions = find("region-upgrade").unwrap();
        assert_eq!(regions.layout, Some((2, 2)));
        assert_eq!(regions.bound.short(), "exact");
    }

    #[test]
    fn the_new_scenarios_run_in_all_and_stall_and_region_keys_are_exact() {
        let all = names(&select("all", false).unwrap());
        assert!(all.contains(&"stall") && all.contains(&"region-restart"));
        assert!(all.contains(&"crash-restart"));
        assert_eq!(
            find("crash-restart").unwrap().bound.short(),
            find("kill").unwrap().bound.short()
        );
        assert_eq!(find("stall").unwrap().bound.short(), "exact");
        assert_eq!(find("region-partition").unwrap().bound.short(), "exact");
        assert_eq!(find("region-restart").unwrap().layout, Some((2, 2)));
    }
}
