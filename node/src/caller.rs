//! Who sent a check batch, as far as answering it goes: what its connection's version
//! understands, and, for a gateway, what it may refund.
//!
//! A refund gives units back to a bucket, so a gateway free to refund anything could refill any
//! key at will. A gateway connection may refund on a key at most what this node granted it on
//! that key since it connected (answered allowed, here or through a forward); a refund group
//! not covered in full is refused with `forbidden`, nothing refunded. Grants are kept in a
//! table of [`CREDIT_ENTRIES`] entries per connection indexed by the key's hash: a key whose
//! entry another key took since loses its credit, so a refund errs towards refusal (the units
//! come back as the bucket refills), never towards over-admission. A peer's forwarded refund
//! was checked where the gateway is connected and is trusted. Token leases share the credit:
//! tokens granted are credit, and tokens returned beyond it are not given back.

use floodgate::BucketKey;
use floodgate::wire::{ErrorCode, ValidCheck, WireDecision};

/// Keys with credit per gateway connection: 16 bytes each, 16 KiB a connection, allocated at
/// its first grant.
pub(crate) const CREDIT_ENTRIES: usize = 1024;

/// The connection a batch came on.
#[derive(Clone, Copy)]
pub(crate) struct Caller<'a> {
    /// It understands `try_again` (its version has `floodgate::protocol::Feature::TryAgain`).
    pub(crate) try_again: bool,
    /// A gateway's: what it may refund. `None` for a peer (and the RLS front, which refunds
    /// nothing unless its operator allows negative hits).
    pub(crate) credit: Option<&'a RefundCredit>,
}

impl Caller<'_> {
    /// A peer speaking `try_again` or not: trusted with refunds.
    pub(crate) fn trusted(try_again: bool) -> Caller<'static> {
        Caller {
            try_again,
            credit: None,
        }
    }

    /// Takes the refund groups of a batch from this caller's credit, each whole or not at all,
    /// and returns which groups are refused (empty when none is).
    pub(crate) fn take_refunds<'g>(
        &self,
        groups: impl Iterator<Item = &'g [ValidCheck]> + Clone,
    ) -> Vec<bool> {
        let Some(credit) = self.credit else {
            return Vec::new();
        };
        if !groups.clone().any(is_refund) {
            return Vec::new();
        }
        let mut entries = credit.entries.lock();
        let refused: Vec<bool> = groups
            .map(|group| is_refund(group) && !take(&mut entries, group))
            .collect();
        if refused.contains(&true) {
            refused
        } else {
            Vec::new()
        }
    }

    /// Settles a batch once answered (`decisions`, one per check in order; `refused` as
    /// [`Caller::take_refunds`] gave it): credits what was granted, and gives back what a
    /// refund group took when it was not decided after all (`try_again`, an owner gone).
    pub(crate) fn settle<'g>(
        &self,
        groups: impl Iterator<Item = &'g [ValidCheck]>,
        decisions: &[WireDecision],
        refused: &[bool],
    ) {
        let Some(credit) = self.credit else {
            return;
        };
        let mut entries = credit.entries.lock();
        let mut rest = decisions;
        for (i, group) in groups.enumerate() {
            let Some((answers, after)) = rest.split_at_checked(group.len()) else {
                return;
            };
            rest = after;
            if !is_refund(group) {
                for (check, answer) in group.iter().zip(answers) {
                    // A peek took nothing. A charge gives no credit either: it is spent, never
                    // refunded, and what it took (its cost less what was forgiven) is not in
                    // its answer, so crediting it would let a gateway refund units it never took.
                    let took = match answer.to_decision() {
                        Ok(decision) if decision.is_allowed() && !check.peek && !check.charge => {
                            check.cost
                        }
                        _ => 0,
                    };
                    if took > 0 {
                        credit_key(&mut entries, check.key, took);
                    }
                }
            } else if !refused.get(i).copied().unwrap_or(false)
                && answers.first().is_some_and(|a| a.to_decision().is_err())
            {
                for check in group {
                    credit_key(&mut entries, check.key, check.cost);
                }
            }
        }
    }
}

impl Caller<'_> {
    /// Of `returning` tokens of a token lease on `key`, what may be given back: all from a
    /// peer, at most what this gateway was granted there (taken from its credit).
    pub(crate) fn take_returned(&self, key: BucketKey, returning: u64) -> u64 {
        let Some(credit) = self.credit else {
            return returning;
        };
        let id = key_id(key);
        let mut entries = credit.entries.lock();
        match entries.get_mut(index(id)) {
            Some(entry) if entry.key == id => {
                let taken = returning.min(entry.units);
                entry.units -= taken;
                taken
            }
            _ => 0,
        }
    }

    /// Records tokens of a token lease on `key` granted to this caller.
    pub(crate) fn granted_tokens(&self, key: BucketKey, granted: u64) {
        if let Some(credit) = self.credit {
            credit_key(&mut credit.entries.lock(), key, granted);
        }
    }
}

fn is_refund(group: &[ValidCheck]) -> bool {
    group.first().is_some_and(|c| c.refund)
}

/// What a refused refund group's checks answer.
pub(crate) const REFUND_REFUSED: ErrorCode = ErrorCode::Forbidden;

/// Units a gateway connection was granted per key and has not refunded.
#[derive(Debug, Default)]
pub(crate) struct RefundCredit {
    entries: parking_lot::Mutex<Vec<Entry>>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Entry {
    /// The key's hash (0: free).
    key: u64,
    units: u64,
}

/// Adds `units` to `key`'s entry, which it takes over from any other key.
fn credit_key(entries: &mut Vec<Entry>, key: BucketKey, units: u64) {
    if units == 0 {
        return;
    }
    if entries.is_empty() {
        entries.resize(CREDIT_ENTRIES, Entry::default());
    }
    let id = key_id(key);
    let entry = &mut entries[index(id)];
    if entry.key != id {
        *entry = Entry { key: id, units: 0 };
    }
    entry.units = entry.units.saturating_add(units);
}

/// Takes every refund of `group` from `entries`, or none when one is not covered.
fn take(entries: &mut [Entry], group: &[ValidCheck]) -> bool {
    let covered = group.iter().all(|check| {
        let id = key_id(check.key);
        // Two refunds of one key in a group need their sum covered.
        let wanted: u64 = group
            .iter()
            .filter(|c| key_id(c.key) == id)
            .map(|c| c.cost)
            .fold(0, u64::saturating_add);
        wanted == 0
            || entries
                .get(index(id))
                .is_some_and(|e| e.key == id && e.units >= wanted)
    });
    if covered {
        for check in group {
            if let Some(entry) = entries.get_mut(index(key_id(check.key))) {
                entry.units -= check.cost.min(entry.units);
            }
        }
    }
    covered
}

/// The low 64 bits of the key's hash: never zero (`BucketKey::from_u128`), so 0 marks a free
/// entry; two keys share them once in 2^64.
fn key_id(key: BucketKey) -> u64 {
    key.to_u128() as u64
}

fn index(id: u64) -> usize {
    (id % CREDIT_ENTRIES as u64) as usize
}
