//! Kind 15: a client's lease requests (acquire, release, renew), each placed by its key's slot
//! like a check and decided on this node's lease store, answered with one kind 16. The store
//! itself is built here, its ids drawn from the operating system's secure generator.
//!
//! A request for a slot this node does not own is answered `not_owner` (not forwarded): the
//! client refreshes its slot table and sends it again to the owner. A takeover (the client lost
//! the owner) is decided here from the owner's replicas when this node is the slot's successor.

use floodgate::Clock;
use floodgate::cluster::ownership::{Arrival, Placement, Refusal};
use floodgate::lease::{
    Acquired, LeaseIdWidth, LeaseIds, LeaseStore, LeaseStoreConfig, LeaseStoreError, Renewed,
};
use floodgate::protocol::Feature;
use floodgate::wire::{
    ErrorCode, Frame, LeaseAnswer, LeaseAnswerBatch, LeaseOp, ValidLeaseRequest, WireLeaseAnswer,
    decode_lease_requests, encode_lease_answers,
};

use crate::check_path::CheckPath;
use crate::service::encode_error;

/// Answers one kind 15 frame: appends a kind 16 (or an error frame for a refused frame, whose
/// code it returns).
pub(crate) async fn answer_lease_requests(
    checks: &CheckPath,
    frame: &Frame,
    out: &mut Vec<u8>,
) -> Option<ErrorCode> {
    let requests = match decode_lease_requests(frame.version, &frame.payload, &checks.limits.wire())
    {
        Ok(requests) => requests,
        Err((code, message)) => {
            encode_error(out, frame.request_id, code, message);
            return Some(code);
        }
    };
    checks.slots.wait_until_joined().await;
    // 128-bit ids for a caller whose frame has them, once every member of the region reads
    // them too (its replicas carry the ids).
    let wide = Feature::WideLeaseIds;
    let width =
        if wide.readable_at(frame.version) && wide.readable_at(checks.members.region_version()) {
            LeaseIdWidth::Bits128
        } else {
            LeaseIdWidth::Bits64
        };
    let slots = requests.iter().map(|r| r.key.slot());
    let read_ns = checks.clock.now_ns();
    let (answers, table_version) = {
        // Gained slots wait (bounded) for their previous owner's hand-off, which brings the
        // leases. Decided under the gate: a table switch waits, so its hand-off holds these
        // grants.
        let _deciding = checks.slots.enter_deciding(slots, read_ns).await;
        let (placements, version) = checks.slots.place_each(
            requests
                .iter()
                .map(|r| (r.key.slot(), Arrival::from_client(r.takeover))),
            checks.clock.now_ns(),
        );
        let now_ns = checks.clock.now_ns();
        let answers: Vec<WireLeaseAnswer> = requests
            .iter()
            .zip(placements)
            .map(|(request, placement)| {
                let answer = match placement {
                    Placement::Decide | Placement::Takeover => {
                        decide(&checks.leases, request, now_ns, width)
                    }
                    Placement::Forward(_) | Placement::Refuse(Refusal::NotOwner) => {
                        LeaseAnswer::Error(ErrorCode::NotOwner)
                    }
                    // Waited for the hand-off already; lease callers know no `try_again`.
                    Placement::Refuse(Refusal::ShuttingDown | Refusal::TryAgain) => {
                        LeaseAnswer::Error(ErrorCode::ShuttingDown)
                    }
                };
                WireLeaseAnswer::from(answer)
            })
            .collect();
        (answers, version)
    };
    // In the layout the caller's frame had: what its version reads.
    encode_lease_answers(
        out,
        frame.version,
        frame.request_id,
        &LeaseAnswerBatch {
            answers,
            table_version,
        },
    );
    None
}

/// Decides one request on `leases` at `now_ns`; a grant's id is `width` wide.
pub(crate) fn decide(
    leases: &LeaseStore,
    request: &ValidLeaseRequest,
    now_ns: u64,
    width: LeaseIdWidth,
) -> LeaseAnswer {
    let key = request.key;
    match request.op {
        LeaseOp::Acquire(limit) => match leases.acquire(key, &limit, now_ns, width) {
            Ok(Acquired::Granted { lease, in_use }) => LeaseAnswer::Granted {
                lease_id: lease.id,
                in_use,
                expires_in_ns: lease.expires_at_ns - now_ns,
            },
            Ok(Acquired::Refused {
                in_use,
                retry_after_ns,
            }) => LeaseAnswer::Refused {
                in_use,
                retry_after_ns,
            },
            Err(LeaseStoreError::Full { .. }) => LeaseAnswer::Error(ErrorCode::StoreFull),
        },
        LeaseOp::Release { id } => {
            let released = leases.release(key, id, now_ns);
            LeaseAnswer::Released {
                was_held: released.released,
                in_use: released.in_use,
            }
        }
        LeaseOp::Renew { id, ttl_ns } => match leases.renew(key, id, ttl_ns, now_ns) {
            Renewed::Renewed { lease, in_use } => LeaseAnswer::Renewed {
                in_use,
                expires_in_ns: lease.expires_at_ns - now_ns,
            },
            Renewed::Unknown { in_use } => LeaseAnswer::NotHeld { in_use },
        },
    }
}

/// A lease store bounded at `max_leases` (default: the core's), its ids drawn from the
/// operating system's secure generator: a caller holding one lease cannot work out another's
/// id, and two nodes, or two lives of one node, grant the same id only by a 2^-64 chance.
pub(crate) fn lease_store(max_leases: Option<usize>) -> LeaseStore {
    let config = LeaseStoreConfig {
        max_leases: max_leases.unwrap_or(LeaseStoreConfig::default().max_leases),
    };
    LeaseStore::new(config, Box::new(SystemLeaseIds::new()))
}

/// Lease ids from the operating system's cryptographically secure generator: ring's
/// `SystemRandom` (getrandom), through the rustls provider the node's TLS already uses. Each id
/// is 128 fresh random bits (the store cuts them to 64 for a caller of an older version).
#[derive(Debug)]
pub(crate) struct SystemLeaseIds {
    random: &'static dyn rustls::crypto::SecureRandom,
}

impl SystemLeaseIds {
    /// Panics if the operating system has no random source to give (then no id is safe to
    /// grant); the first draw is made here, at start, so that shows before any lease is.
    pub(crate) fn new() -> Self {
        let ids = SystemLeaseIds {
            random: rustls::crypto::ring::default_provider().secure_random,
        };
        ids.next_id();
        ids
    }
}

impl LeaseIds for SystemLeaseIds {
    fn next_id(&self) -> floodgate::lease::LeaseId {
        let mut bytes = [0; 16];
        self.random
            .fill(&mut bytes)
            .expect("the operating system's random source failed: no lease id can be drawn");
        u128::from_le_bytes(bytes)
    }
}

/// Publishes the lease store's gauge and counters (called by the sweeper with what it last
/// published, so counters only ever grow by the difference).
#[derive(Debug, Default)]
pub(crate) struct LeaseMetrics {
    seen: [u64; 5],
}

impl LeaseMetrics {
    pub(crate) fn publish(&mut self, leases: &LeaseStore) {
        use std::sync::atomic::Ordering::Relaxed;
        metrics::gauge!("floodgate_leases_in_use").set(leases.held() as f64);
        let stats = leases.stats();
        let totals = [
            ("floodgate_lease_grants_total", stats.grants.load(Relaxed)),
            (
                "floodgate_lease_refusals_total",
                stats.refusals.load(Relaxed),
            ),
            (
                "floodgate_lease_releases_total",
                stats.releases.load(Relaxed),
            ),
            (
                "floodgate_lease_expiries_total",
                stats.expiries.load(Relaxed),
            ),
            ("floodgate_lease_store_full_total", stats.full.load(Relaxed)),
        ];
        for ((name, now), seen) in totals.into_iter().zip(&mut self.seen) {
            metrics::counter!(name).increment(now - *seen);
            *seen = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use floodgate::BucketKey;
    use floodgate::lease::LeaseLimit;

    use super::*;

    const SEC: u64 = 1_000_000_000;

    fn acquire(key: &[u8], max: u64) -> ValidLeaseRequest {
        ValidLeaseRequest {
            key: BucketKey::for_key(key),
            op: LeaseOp::Acquire(LeaseLimit::new(max, 10 * SEC).unwrap()),
            takeover: false,
        }
    }

    fn store() -> LeaseStore {
        LeaseStore::new(LeaseStoreConfig::default(), Box::new(SystemLeaseIds::new()))
    }

    /// The node's ids are 128 random bits each (64 for an older caller): 1,000 grants on one
    /// key are all distinct, none is 0, and no two are within 2^16 of each other (a counter's
    /// are 1 apart; 1,000 random ids come that close with a chance of about 2^-28).
    #[test]
    fn lease_ids_are_not_predictable_from_one_another() {
        let leases = store();
        let narrow = (0..1_000).map(|_| {
            match decide(
                &leases,
                &acquire(b"narrow", 100_000),
                SEC,
                LeaseIdWidth::Bits64,
            ) {
                LeaseAnswer::Granted { lease_id, .. } => lease_id,
                other => panic!("expected a grant, got {other:?}"),
            }
        });
        assert!(
            narrow
                .into_iter()
                .all(|id| id != 0 && id <= u128::from(u64::MAX))
        );
        let mut ids: Vec<u128> = (0..1_000)
            .map(
                |_| match decide(&leases, &acquire(b"k", 100_000), SEC, LeaseIdWidth::Bits128) {
                    LeaseAnswer::Granted { lease_id, .. } => lease_id,
                    other => panic!("expected a grant, got {other:?}"),
                },
            )
            .collect();
        assert!(ids.iter().all(|&id| id != 0));
        ids.sort_unstable();
        let closest = ids.windows(2).map(|w| w[1] - w[0]).min().unwrap();
        assert!(closest > 0, "two grants share an id");
        assert!(closest > 1 << 16, "two ids only {closest} apart");
        // The source itself: consecutive draws differ in about half their bits, not by a step.
        let source = SystemLeaseIds::new();
        let draws: Vec<u128> = (0..1_000).map(|_| source.next_id()).collect();
        let flipped: u32 = draws.windows(2).map(|w| (w[0] ^ w[1]).count_ones()).sum();
        let mean = f64::from(flipped) / 999.0;
        assert!(
            (60.0..=68.0).contains(&mean),
            "{mean} bits differ on average"
        );
    }

    #[test]
    fn answers_say_what_happened_to_each_request() {
        let leases = store();
        let LeaseAnswer::Granted {
            lease_id,
            in_use: 1,
            expires_in_ns,
        } = decide(&leases, &acquire(b"k", 1), SEC, LeaseIdWidth::Bits128)
        else {
            panic!("expected a grant");
        };
        assert_eq!(expires_in_ns, 10 * SEC);
        assert_eq!(
            decide(&leases, &acquire(b"k", 1), 4 * SEC, LeaseIdWidth::Bits128),
            LeaseAnswer::Refused {
                in_use: 1,
                retry_after_ns: 7 * SEC
            }
        );
        let renew = ValidLeaseRequest {
            op: LeaseOp::Renew {
                id: lease_id,
                ttl_ns: 20 * SEC,
            },
            ..acquire(b"k", 1)
        };
        assert_eq!(
            decide(&leases, &renew, 5 * SEC, LeaseIdWidth::Bits128),
            LeaseAnswer::Renewed {
                in_use: 1,
                expires_in_ns: 20 * SEC
            }
        );
        let release = ValidLeaseRequest {
            op: LeaseOp::Release { id: lease_id },
            ..acquire(b"k", 1)
        };
        assert_eq!(
            decide(&leases, &release, 6 * SEC, LeaseIdWidth::Bits128),
            LeaseAnswer::Released {
                was_held: true,
                in_use: 0
            }
        );
        assert_eq!(
            decide(&leases, &release, 6 * SEC, LeaseIdWidth::Bits128),
            LeaseAnswer::Released {
                was_held: false,
                in_use: 0
            }
        );
        assert_eq!(
            decide(&leases, &renew, 6 * SEC, LeaseIdWidth::Bits128),
            LeaseAnswer::NotHeld { in_use: 0 }
        );
    }

    /// Expiry driven through the node's answer path at chosen times: a lease holds its place
    /// until exactly its TTL, then the place is free, the expiry is counted and the node-wide
    /// count drops (the sweeper reclaims a key nobody touches again).
    #[test]
    fn an_abandoned_lease_frees_its_place_at_its_ttl() {
        let leases = store();
        assert!(matches!(
            decide(&leases, &acquire(b"k", 1), 0, LeaseIdWidth::Bits128),
            LeaseAnswer::Granted { .. }
        ));
        assert_eq!(
            decide(
                &leases,
                &acquire(b"k", 1),
                10 * SEC - 1,
                LeaseIdWidth::Bits128
            ),
            LeaseAnswer::Refused {
                in_use: 1,
                retry_after_ns: 1
            }
        );
        assert!(matches!(
            decide(&leases, &acquire(b"k", 1), 10 * SEC, LeaseIdWidth::Bits128),
            LeaseAnswer::Granted { in_use: 1, .. }
        ));
        decide(
            &leases,
            &acquire(b"untouched", 1),
            10 * SEC,
            LeaseIdWidth::Bits128,
        );
        assert_eq!(leases.held(), 2);
        assert_eq!(leases.sweep(20 * SEC, usize::MAX), 2);
        assert_eq!(leases.held(), 0);
        let expiries = leases
            .stats()
            .expiries
            .load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(expiries, 3);
    }
}
