//! One id, one live address: a second node gossiping an id that a live member holds at another
//! address is refused with an `IdConflict`, the node that started later yields, and the holder
//! keeps its id and slots. Restarts at the same address and moves after death or leave still
//! go through. Drives the sans-I/O membership directly.

use floodgate::cluster::{
    ConflictVerdict, Gossip, IdConflict, MemberInfo, MemberState, Membership, MembershipConfig,
    SlotTable,
};
use floodgate::wire::{FrameKind, decode_id_conflict, encode_message};

const MS: u64 = 1_000_000;
const STEP: u64 = 10 * MS;

fn info(id: &str, addr: &str) -> MemberInfo {
    MemberInfo {
        id: id.into(),
        addr: addr.into(),
        region: "r1".into(),
    }
}

/// A membership; every one also has a seed nobody answers at, so each of its rounds sends at
/// least one message (its digest) even while it knows nobody. One given no seeds of its own is
/// the first of its cluster, as a node started without seeds is: it has founded it.
fn node(id: &str, addr: &str, incarnation: u64, seeds: &[&str], now: u64) -> Membership {
    let first = seeds.is_empty();
    let mut seeds: Vec<String> = seeds.iter().map(|s| s.to_string()).collect();
    seeds.push("10.255.255.255:1".into());
    let mut membership = Membership::new(
        info(id, addr),
        incarnation,
        seeds,
        MembershipConfig::default(),
        now,
        incarnation ^ 0x5eed,
    );
    if first {
        membership.found();
    }
    membership
}

/// What `node` gossips at its next round (its own digest included).
fn gossip_of(node: &mut Membership, now: u64) -> Gossip {
    node.poll(now)
        .into_iter()
        .next()
        .map(|o| o.gossip)
        .unwrap_or_default()
}

/// A lossless network of memberships addressed by their `addr`: gossip and conflicts are
/// delivered at once; the ones sent to an address nobody has are dropped.
struct Net {
    now: u64,
    nodes: Vec<Membership>,
    /// Verdicts received, per node index.
    verdicts: Vec<Vec<ConflictVerdict>>,
}

impl Net {
    fn index_of(&self, addr: &str) -> Option<usize> {
        self.nodes
            .iter()
            .position(|n| n.info(n.me()).is_some_and(|i| i.addr == addr))
    }

    fn add(&mut self, node: Membership) -> usize {
        self.nodes.push(node);
        self.verdicts.push(Vec::new());
        self.nodes.len() - 1
    }

    fn run_for(&mut self, duration: u64) {
        let end = self.now + duration;
        while self.now < end {
            self.now += STEP;
            let mut gossip = Vec::new();
            for node in &mut self.nodes {
                gossip.extend(node.poll(self.now));
            }
            for message in gossip {
                let Some(to) = self.index_of(&message.to) else {
                    continue;
                };
                let conflicts = self.nodes[to].handle_gossip(self.now, &message.gossip);
                for conflict in conflicts {
                    // Through the wire and its validation, as a node sends it.
                    let mut frame = Vec::new();
                    encode_message(&mut frame, FrameKind::IdConflict, 0, &conflict);
                    let decoded = decode_id_conflict(&frame[16..]).expect("a valid conflict");
                    if let Some(claimant) = self.index_of(&decoded.claimant_addr) {
                        let verdict = self.nodes[claimant].handle_conflict(&decoded);
                        self.verdicts[claimant].push(verdict);
                    }
                }
            }
        }
    }
}

#[test]
fn a_second_node_with_a_live_id_is_refused_and_the_holder_keeps_its_slots() {
    let start = 1_000 * MS;
    let mut net = Net {
        now: start,
        nodes: Vec::new(),
        verdicts: Vec::new(),
    };
    let real = net.add(node("n1", "10.0.0.1:7100", 1_000, &[], start));
    let other = net.add(node(
        "n2",
        "10.0.0.2:7100",
        1_001,
        &["10.0.0.1:7100"],
        start,
    ));
    net.run_for(500 * MS);
    let table_before = SlotTable::compute(1, &net.nodes[other].owners());
    assert_eq!(net.nodes[other].owners(), ["n1", "n2"]);
    assert_eq!(net.nodes[real].owners(), ["n1", "n2"]);

    // Started later (a larger incarnation), with n1's id, at another address, seeded with n2.
    let newcomer = net.add(node(
        "n1",
        "10.0.0.3:7100",
        5_000,
        &["10.0.0.2:7100"],
        net.now,
    ));
    net.run_for(2_000 * MS);

    assert!(
        net.verdicts[newcomer].contains(&ConflictVerdict::Refused),
        "the newcomer was never told: {:?}",
        net.verdicts[newcomer]
    );
    assert!(net.nodes[newcomer].is_refused());
    assert!(!net.nodes[real].is_refused());
    for observer in [real, other] {
        let n1 = net.nodes[observer].info("n1").unwrap();
        assert_eq!(n1.addr, "10.0.0.1:7100", "observer {observer}");
        assert_eq!(
            net.nodes[observer].state_of("n1"),
            Some(MemberState::Alive),
            "observer {observer}"
        );
        assert_eq!(
            SlotTable::compute(1, &net.nodes[observer].owners()),
            table_before,
            "observer {observer}: ownership moved"
        );
    }
    // Refused, it stays silent: no gossip, no leave.
    assert!(net.nodes[newcomer].poll(net.now + 1_000 * MS).is_empty());
    assert!(net.nodes[newcomer].leave(net.now).is_empty());
}

#[test]
fn the_holder_answers_a_claim_on_its_own_id_and_keeps_it() {
    let mut real = node("n1", "10.0.0.1:7100", 1_000, &[], 0);
    let mut newcomer = node("n1", "10.0.0.3:7100", 5_000, &["10.0.0.1:7100"], 0);
    let conflicts = real.handle_gossip(STEP, &gossip_of(&mut newcomer, STEP));
    assert_eq!(
        conflicts,
        [IdConflict {
            id: "n1".into(),
            holder_addr: "10.0.0.1:7100".into(),
            holder_incarnation: 1_000,
            claimant_addr: "10.0.0.3:7100".into(),
            claimant_incarnation: 5_000,
        }]
    );
    assert_eq!(
        newcomer.handle_conflict(&conflicts[0]),
        ConflictVerdict::Refused
    );
    // The newcomer's own digest naming the real node's address reaches the real node as a
    // conflict too: the real node started first and keeps its id.
    let reverse = IdConflict {
        id: "n1".into(),
        holder_addr: "10.0.0.3:7100".into(),
        holder_incarnation: 5_000,
        claimant_addr: "10.0.0.1:7100".into(),
        claimant_incarnation: 1_000,
    };
    assert_eq!(real.handle_conflict(&reverse), ConflictVerdict::Kept);
    assert!(!real.is_refused());
    // Conflicts about another id or another claimant address are not ours.
    let elsewhere = IdConflict {
        claimant_addr: "10.0.0.9:7100".into(),
        ..conflicts[0].clone()
    };
    assert_eq!(real.handle_conflict(&elsewhere), ConflictVerdict::Ignored);
    let other_id = IdConflict {
        id: "n7".into(),
        ..reverse
    };
    assert_eq!(real.handle_conflict(&other_id), ConflictVerdict::Ignored);
}

#[test]
fn a_restart_at_the_same_address_is_readmitted_without_conflict() {
    let mut observer = node("n2", "10.0.0.2:7100", 1, &[], 0);
    let mut first = node("n1", "10.0.0.1:7100", 1, &[], 0);
    assert!(
        observer
            .handle_gossip(STEP, &gossip_of(&mut first, STEP))
            .is_empty()
    );
    let mut restarted = node("n1", "10.0.0.1:7100", 2, &[], 2 * STEP);
    assert!(
        observer
            .handle_gossip(2 * STEP, &gossip_of(&mut restarted, 2 * STEP))
            .is_empty()
    );
    assert_eq!(observer.state_of("n1"), Some(MemberState::Alive));
}

#[test]
fn an_id_moves_to_another_address_only_once_the_old_one_is_dead_or_gone() {
    let config = MembershipConfig::default();
    for gone in ["dead", "left"] {
        let mut observer = node("n2", "10.0.0.2:7100", 1, &[], 0);
        let mut old = node("n1", "10.0.0.1:7100", 1, &[], 0);
        observer.handle_gossip(STEP, &gossip_of(&mut old, STEP));
        old.handle_gossip(STEP, &gossip_of(&mut observer, STEP));
        let mut moved = node("n1", "10.0.0.5:7100", 9, &[], 2 * STEP);

        // Still alive (or only suspect) at the old address: the move is refused.
        let conflicts = observer.handle_gossip(2 * STEP, &gossip_of(&mut moved, 2 * STEP));
        assert_eq!(conflicts.len(), 1, "{gone}");
        observer.poll(STEP + config.suspect_after_ns);
        assert_eq!(observer.state_of("n1"), Some(MemberState::Suspect));
        let now = STEP + config.suspect_after_ns + STEP;
        let mut moved = node("n1", "10.0.0.5:7100", 9, &[], now);
        assert_eq!(
            observer
                .handle_gossip(now, &gossip_of(&mut moved, now))
                .len(),
            1,
            "{gone}: taken while suspect"
        );
        assert_eq!(observer.info("n1").unwrap().addr, "10.0.0.1:7100");

        let now = if gone == "dead" {
            let now = 3 * STEP + config.suspect_after_ns + config.dead_after_ns;
            observer.poll(now);
            assert_eq!(observer.state_of("n1"), Some(MemberState::Dead));
            now
        } else {
            let now = now + STEP;
            let farewell = old.leave(now);
            observer.handle_gossip(now, &farewell[0].gossip);
            assert_eq!(observer.state_of("n1"), Some(MemberState::Left));
            now
        };
        let mut moved = node("n1", "10.0.0.5:7100", 9, &[], now + STEP);
        assert!(
            observer
                .handle_gossip(now + STEP, &gossip_of(&mut moved, now + STEP))
                .is_empty(),
            "{gone}"
        );
        assert_eq!(observer.info("n1").unwrap().addr, "10.0.0.5:7100", "{gone}");
        assert_eq!(observer.state_of("n1"), Some(MemberState::Alive), "{gone}");
    }
}

#[test]
fn a_departure_gossiped_from_another_address_does_not_remove_the_live_holder() {
    let mut observer = node("n2", "10.0.0.2:7100", 1, &[], 0);
    let mut real = node("n1", "10.0.0.1:7100", 1, &[], 0);
    observer.handle_gossip(STEP, &gossip_of(&mut real, STEP));
    let mut impostor = node("n1", "10.0.0.3:7100", 9, &["10.0.0.2:7100"], STEP);
    // The impostor knows the observer (so its leave goes there), then leaves.
    impostor.handle_gossip(2 * STEP, &gossip_of(&mut observer, 2 * STEP));
    let farewell = impostor.leave(3 * STEP);
    assert!(!farewell.is_empty());
    let conflicts = observer.handle_gossip(3 * STEP, &farewell[0].gossip);
    assert!(conflicts.is_empty());
    assert_eq!(observer.state_of("n1"), Some(MemberState::Alive));
    assert_eq!(observer.info("n1").unwrap().addr, "10.0.0.1:7100");
}

#[test]
fn conflicts_from_one_message_are_bounded() {
    let mut observer = node("n0", "10.0.0.100:7100", 1, &[], 0);
    let mut claims = Gossip::default();
    for i in 0..50 {
        let mut holder = node(
            &format!("n{}", i + 1),
            &format!("10.0.1.{i}:7100"),
            1,
            &[],
            0,
        );
        observer.handle_gossip(STEP, &gossip_of(&mut holder, STEP));
        let mut claimant = node(
            &format!("n{}", i + 1),
            &format!("10.0.2.{i}:7100"),
            2,
            &[],
            0,
        );
        claims
            .members
            .extend(gossip_of(&mut claimant, STEP).members);
    }
    let conflicts = observer.handle_gossip(2 * STEP, &claims);
    assert_eq!(
        conflicts.len(),
        floodgate::cluster::membership::MAX_CONFLICTS_PER_GOSSIP
    );
    assert_eq!(observer.owners().len(), 51);
}

#[test]
fn a_malformed_conflict_is_refused_with_a_reason() {
    let valid = IdConflict {
        id: "n1".into(),
        holder_addr: "10.0.0.1:7100".into(),
        holder_incarnation: 1,
        claimant_addr: "10.0.0.3:7100".into(),
        claimant_incarnation: 2,
    };
    let encode = |c: &IdConflict| {
        let mut frame = Vec::new();
        encode_message(&mut frame, FrameKind::IdConflict, 0, c);
        frame[16..].to_vec()
    };
    assert_eq!(decode_id_conflict(&encode(&valid)).unwrap(), valid);
    let cases = [
        (
            IdConflict {
                id: String::new(),
                ..valid.clone()
            },
            "id of 0 bytes",
        ),
        (
            IdConflict {
                claimant_addr: "x".repeat(300),
                ..valid.clone()
            },
            "claimant address of 300 bytes",
        ),
        (
            IdConflict {
                claimant_addr: valid.holder_addr.clone(),
                ..valid.clone()
            },
            "same address",
        ),
    ];
    for (conflict, reason) in cases {
        let (_, message) = decode_id_conflict(&encode(&conflict)).unwrap_err();
        assert!(message.contains(reason), "{message}");
    }
    let (_, message) = decode_id_conflict(&[0xAB; 7]).unwrap_err();
    assert!(message.contains("invalid id conflict"), "{message}");
}
