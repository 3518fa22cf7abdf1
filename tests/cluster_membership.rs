//! Membership converges, detects a crash in about a second, readmits a restarted node, spreads
//! a graceful leave, and heals after a partition: a seeded simulation of the sans-I/O state
//! machines over a lossy, delaying network (membership without
//! consensus). Every assertion names its seed so a failure replays exactly.

use std::collections::BTreeMap;

use floodgate::cluster::membership::{MAX_DEPARTURE_HEARTBEAT_LEAD, MemberDigest};
use floodgate::cluster::{
    Gossip, MemberInfo, MemberState, Membership, MembershipConfig, SlotTable,
};

const MS: u64 = 1_000_000;
const STEP: u64 = 10 * MS;

struct Sim {
    seed: u64,
    rng: u64,
    now: u64,
    nodes: BTreeMap<String, Membership>,
    down: Vec<String>,
    /// Pairs of node ids that cannot talk.
    cut: Vec<(String, String)>,
    in_flight: Vec<(u64, String, Gossip)>,
}

fn info(i: usize) -> MemberInfo {
    MemberInfo {
        id: format!("n{i}"),
        addr: format!("10.0.0.{i}:7100"),
        region: "r1".into(),
    }
}

impl Sim {
    fn new(seed: u64, n: usize) -> Self {
        let mut sim = Sim {
            seed,
            rng: seed | 1,
            now: 1_000 * MS,
            nodes: BTreeMap::new(),
            down: vec![],
            cut: vec![],
            in_flight: vec![],
        };
        for i in 0..n {
            sim.start(i, 1);
        }
        sim
    }

    fn start(&mut self, i: usize, incarnation: u64) {
        let seeds = vec![info(0).addr];
        let m = Membership::new(
            info(i),
            incarnation,
            seeds,
            MembershipConfig::default(),
            self.now,
            self.seed ^ i as u64,
        );
        self.nodes.insert(info(i).id, m);
        self.down.retain(|d| *d != info(i).id);
    }

    fn random(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    fn id_of_addr(addr: &str) -> String {
        format!(
            "n{}",
            addr.trim_start_matches("10.0.0.").trim_end_matches(":7100")
        )
    }

    fn blocked(&self, a: &str, b: &str) -> bool {
        self.cut
            .iter()
            .any(|(x, y)| (x == a && y == b) || (x == b && y == a))
    }

    fn run_for(&mut self, duration: u64) {
        let end = self.now + duration;
        while self.now < end {
            self.now += STEP;
            let ids: Vec<String> = self
                .nodes
                .keys()
                .filter(|id| !self.down.contains(id))
                .cloned()
                .collect();
            for id in &ids {
                let out = self.nodes.get_mut(id).unwrap().poll(self.now);
                for msg in out {
                    let to = Self::id_of_addr(&msg.to);
                    // 5% loss, 1-30 ms delay.
                    if self.random() % 100 < 5 || self.blocked(id, &to) {
                        continue;
                    }
                    let delay = (1 + self.random() % 30) * MS;
                    self.in_flight.push((self.now + delay, to, msg.gossip));
                }
            }
            let now = self.now;
            let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.in_flight)
                .into_iter()
                .partition(|(at, _, _)| *at <= now);
            self.in_flight = later;
            for (_, to, gossip) in due {
                if !self.down.contains(&to)
                    && let Some(node) = self.nodes.get_mut(&to)
                {
                    node.handle_gossip(now, &gossip);
                }
            }
        }
    }

    fn state(&self, observer: &str, of: &str) -> Option<MemberState> {
        self.nodes[observer].state_of(of)
    }

    fn up(&self) -> Vec<String> {
        self.nodes
            .keys()
            .filter(|id| !self.down.contains(id))
            .cloned()
            .collect()
    }

    /// Runs until `done` holds for every live node or `limit` passes; returns the time taken.
    fn until(&mut self, limit: u64, done: impl Fn(&Sim, &str) -> bool) -> Option<u64> {
        let start = self.now;
        while self.now - start <= limit {
            if self.up().iter().all(|id| done(self, id)) {
                return Some(self.now - start);
            }
            self.run_for(STEP);
        }
        None
    }
}

const SEEDS: [u64; 6] = [1, 7, 42, 1234, 99_991, 0xDEAD_BEEF];

#[test]
fn five_nodes_converge_through_one_seed_and_agree_on_ownership() {
    for seed in SEEDS {
        let mut sim = Sim::new(seed, 5);
        let took = sim.until(3_000 * MS, |s, id| s.nodes[id].owners().len() == 5);
        assert!(took.is_some(), "seed {seed}: no convergence in 3 s");
        let tables: Vec<SlotTable> = sim
            .up()
            .iter()
            .map(|id| SlotTable::compute(1, &sim.nodes[id].owners()))
            .collect();
        assert!(
            tables.windows(2).all(|w| w[0] == w[1]),
            "seed {seed}: views disagree"
        );
    }
}

#[test]
fn a_crashed_node_is_dead_everywhere_in_about_a_second_and_a_restart_is_readmitted() {
    for seed in SEEDS {
        let mut sim = Sim::new(seed, 5);
        sim.until(3_000 * MS, |s, id| s.nodes[id].owners().len() == 5)
            .unwrap();
        sim.down.push("n3".into());
        // Nobody declares it dead before `dead_after` (1 s) of silence...
        sim.run_for(900 * MS);
        assert!(
            sim.up()
                .iter()
                .all(|id| sim.state(id, "n3") != Some(MemberState::Dead)),
            "seed {seed}: dead too early"
        );
        // ...and everybody has within 1.5 s of the crash.
        let took = sim.until(600 * MS, |s, id| {
            s.state(id, "n3") == Some(MemberState::Dead)
        });
        assert!(
            took.is_some(),
            "seed {seed}: crash not detected within 1.5 s"
        );
        assert!(
            sim.up().iter().all(|id| sim.nodes[id].owners().len() == 4),
            "seed {seed}"
        );
        // The node restarts (new incarnation): everyone readmits it.
        sim.start(3, 2);
        let took = sim.until(2_000 * MS, |s, id| s.nodes[id].owners().len() == 5);
        assert!(
            took.is_some(),
            "seed {seed}: restart not readmitted within 2 s"
        );
    }
}

#[test]
fn a_graceful_leave_spreads_quickly() {
    for seed in SEEDS {
        let mut sim = Sim::new(seed, 4);
        sim.until(3_000 * MS, |s, id| s.nodes[id].owners().len() == 4)
            .unwrap();
        let now = sim.now;
        for msg in sim.nodes.get_mut("n2").unwrap().leave(now) {
            sim.in_flight
                .push((now + MS, Sim::id_of_addr(&msg.to), msg.gossip));
        }
        sim.down.push("n2".into());
        let took = sim.until(500 * MS, |s, id| {
            s.state(id, "n2") == Some(MemberState::Left)
        });
        assert!(took.is_some(), "seed {seed}: leave not seen within 0.5 s");
    }
}

#[test]
fn a_partition_heals() {
    for seed in SEEDS {
        let mut sim = Sim::new(seed, 5);
        sim.until(3_000 * MS, |s, id| s.nodes[id].owners().len() == 5)
            .unwrap();
        for a in ["n0", "n1"] {
            for b in ["n2", "n3", "n4"] {
                sim.cut.push((a.into(), b.into()));
            }
        }
        sim.run_for(3_000 * MS);
        assert_eq!(sim.nodes["n0"].owners(), vec!["n0", "n1"], "seed {seed}");
        assert_eq!(
            sim.nodes["n4"].owners(),
            vec!["n2", "n3", "n4"],
            "seed {seed}"
        );
        sim.cut.clear();
        let took = sim.until(3_000 * MS, |s, id| s.nodes[id].owners().len() == 5);
        assert!(
            took.is_some(),
            "seed {seed}: partition did not heal within 3 s"
        );
    }
}

/// A peer that forges one departure of a live member, at its current incarnation and as far
/// ahead of its heartbeat as a receiver takes, keeps it out of the others' views only until the
/// member's own heartbeats pass the forged one: relays of the forgery do not keep it going.
#[test]
fn a_forged_departure_is_overtaken_by_the_members_own_heartbeats() {
    for seed in SEEDS {
        let mut sim = Sim::new(seed, 5);
        sim.until(3_000 * MS, |s, id| s.nodes[id].owners().len() == 5)
            .unwrap();
        let n0 = &sim.nodes["n0"];
        let forged = Gossip {
            members: vec![MemberDigest {
                info: info(3),
                incarnation: n0.incarnation_of("n3").unwrap(),
                // The furthest ahead of what n0 heard that it takes.
                heartbeat: n0.heartbeat_of("n3").unwrap() + MAX_DEPARTURE_HEARTBEAT_LEAD,
                left: true,
                versions: None,
                joining: false,
            }],
        };
        let now = sim.now;
        drop(sim.nodes.get_mut("n0").unwrap().handle_gossip(now, &forged));
        assert_eq!(
            sim.state("n0", "n3"),
            Some(MemberState::Left),
            "seed {seed}"
        );
        // 64 rounds of n3's heartbeats, then gossip carries them round.
        let took = sim.until(10_000 * MS, |s, id| {
            s.state(id, "n3") == Some(MemberState::Alive)
        });
        assert!(took.is_some(), "seed {seed}: n3 still out after 10 s");
        sim.run_for(40_000 * MS);
        assert!(
            sim.up().iter().all(|id| sim.nodes[id].owners().len() == 5),
            "seed {seed}: the forged departure came back"
        );
    }
}

/// A forged departure of a member nobody knows yet, at its address and at an incarnation its
/// real start cannot pass, is kept by the node it was sent to but not relayed: the member joins
/// the others at once and that node once it forgets the forgery (30 s).
#[test]
fn a_forged_departure_of_a_newcomer_is_not_relayed() {
    for seed in SEEDS {
        let mut sim = Sim::new(seed, 4);
        sim.until(3_000 * MS, |s, id| s.nodes[id].owners().len() == 4)
            .unwrap();
        let forged = Gossip {
            members: vec![MemberDigest {
                info: info(4),
                incarnation: sim.now / MS + 3_600_000,
                heartbeat: u64::MAX,
                left: true,
                versions: None,
                joining: false,
            }],
        };
        let now = sim.now;
        drop(sim.nodes.get_mut("n1").unwrap().handle_gossip(now, &forged));
        sim.start(4, 2);
        let took = sim.until(40_000 * MS, |s, id| s.nodes[id].owners().len() == 5);
        assert!(took.is_some(), "seed {seed}: n4 not admitted within 40 s");
    }
}

/// Versions: a member's range is learned from digests of its current life, forgotten when it
/// restarts (perhaps as another build), and taken as version 2 alone until a digest says; the
/// cluster version is the highest version every slot-owning member speaks.
mod versions {
    use floodgate::cluster::membership::MemberDigest;
    use floodgate::cluster::{Gossip, Membership, MembershipConfig};
    use floodgate::protocol::{self, VersionRange};

    use super::info;

    fn digest(
        i: usize,
        incarnation: u64,
        heartbeat: u64,
        versions: Option<VersionRange>,
    ) -> Gossip {
        Gossip {
            members: vec![MemberDigest {
                info: info(i),
                incarnation,
                heartbeat,
                left: false,
                versions,
                joining: false,
            }],
        }
    }

    fn node() -> Membership {
        Membership::new(info(0), 1, Vec::new(), MembershipConfig::default(), 0, 7)
    }

    const NEW: Option<VersionRange> = Some(protocol::SUPPORTED);

    #[test]
    fn a_member_of_unknown_range_holds_the_cluster_at_version_2() {
        let mut me = node();
        assert_eq!(me.cluster_version(), Some(protocol::NEWEST));
        // Gossiped in version 2's layout: no range.
        drop(me.handle_gossip(1, &digest(1, 5, 1, None)));
        assert_eq!(me.versions_of("n1"), Some(protocol::UNKNOWN_MEMBER));
        assert_eq!(me.cluster_version(), Some(2));
        // The same life's digest with its range (from a peer speaking version 3).
        drop(me.handle_gossip(2, &digest(1, 5, 1, NEW)));
        assert_eq!(me.cluster_version(), Some(protocol::NEWEST));
        // A later digest of that life relayed by an old node keeps what was learned.
        drop(me.handle_gossip(3, &digest(1, 5, 2, None)));
        assert_eq!(me.cluster_version(), Some(protocol::NEWEST));
    }

    #[test]
    fn a_restart_forgets_the_range_until_the_new_life_says() {
        let mut me = node();
        drop(me.handle_gossip(1, &digest(1, 5, 1, NEW)));
        assert_eq!(me.cluster_version(), Some(protocol::NEWEST));
        // Restarted (rolled back, say): its new life is heard of through an old node first.
        drop(me.handle_gossip(2, &digest(1, 6, 0, None)));
        assert_eq!(me.versions_of("n1"), Some(protocol::UNKNOWN_MEMBER));
        assert_eq!(me.cluster_version(), Some(2));
    }

    #[test]
    fn departed_members_do_not_hold_the_cluster_back() {
        let mut me = node();
        drop(me.handle_gossip(1, &digest(1, 5, 1, None)));
        assert_eq!(me.cluster_version(), Some(2));
        let mut left = digest(1, 5, 2, None);
        left.members[0].left = true;
        drop(me.handle_gossip(2, &left));
        assert_eq!(me.cluster_version(), Some(protocol::NEWEST));
    }

    #[test]
    fn members_sharing_no_version_leave_no_cluster_version() {
        let mut me = node().with_versions(VersionRange::new(2, 2).unwrap());
        drop(me.handle_gossip(1, &digest(1, 5, 1, VersionRange::new(3, 4))));
        assert_eq!(me.cluster_version(), None);
    }
}
