//! The check batch (kinds 1, 10 and inside 12) and its packed layout on the wire.
//!
//! In memory a batch is groups of [`WireCheck`]s, each carrying its key and its limit. On the
//! wire it is packed: every distinct limit once, all keys in one byte string, and 16 bytes per
//! check (cost, where its key ends, which limit, flags). A gateway's checks mostly share a few
//! rules' limits and have short keys, so a check takes about a third of the 80 bytes it took as
//! an archived `WireCheck` in its own group: fewer datagrams per frame, and less to encrypt,
//! copy and validate at both ends. The packing is [`CheckBatch`]'s own rkyv `Archive` impl, so
//! messages that embed a batch pack it too.

use std::collections::HashMap;

use rkyv::rancor::{Fallible, Source};
use rkyv::ser::{Allocator, Writer};
use rkyv::{Archive, Deserialize, Place, Serialize};

use super::ErrorCode;
use super::messages::{
    Refusal, ValidCheck, WireCheck, WireLimits, access_validated, check_key_len, limit_from_wire,
};
use super::packing::{Packed, unpack_error};
use crate::{BucketKey, Limit};

/// Client → node: groups of checks. Each group decides all-or-nothing (one gateway request's
/// checks); groups are independent, and none is empty. Decisions come back flattened, in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CheckBatch {
    pub groups: Vec<Vec<WireCheck>>,
}

/// A limit as packed: once per distinct limit of a batch.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WireLimit {
    pub rate: u64,
    pub period_ns: u64,
    pub burst: u64,
    /// `Algorithm` in wire order: 0 gcra, 1 fixed-window, 2 sliding-window, 3 sliding-log.
    pub algorithm: u8,
}

/// A check as packed.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackedCheck {
    pub cost: u64,
    /// Where this check's key ends in [`PackedBatch::keys`]; it starts where the previous
    /// check's ended (the first's at 0).
    pub key_end: u32,
    /// Index into [`PackedBatch::limits`].
    pub limit: u16,
    /// [`STARTS_GROUP`], [`REFUND`], [`TAKEOVER`], [`PEEK`], [`CHARGE`].
    pub flags: u8,
}

/// The first check of a group (the first check of a batch must carry it).
pub const STARTS_GROUP: u8 = 1;
/// [`WireCheck::refund`].
pub const REFUND: u8 = 2;
/// [`WireCheck::takeover`].
pub const TAKEOVER: u8 = 4;
/// [`WireCheck::peek`] (protocol version 6: an older node refuses the frame as malformed).
pub const PEEK: u8 = 8;
/// [`WireCheck::charge`] (protocol version 6, as [`PEEK`]).
pub const CHARGE: u8 = 16;
const KNOWN_FLAGS: u8 = STARTS_GROUP | REFUND | TAKEOVER | PEEK | CHARGE;

/// A check batch as archived: the layout a [`CheckBatch`] is packed into.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct PackedBatch {
    pub limits: Vec<WireLimit>,
    pub keys: Vec<u8>,
    pub checks: Vec<PackedCheck>,
}

/// The archived form of a [`CheckBatch`].
pub type ArchivedCheckBatch = ArchivedPackedBatch;

/// Why a batch cannot be packed (only a batch no client sends: an empty group, or more keys or
/// limits than one frame can hold).
#[derive(Debug, thiserror::Error)]
#[error("cannot pack a check batch: {0}")]
pub struct PackError(&'static str);

/// Limits with a linear scan while few (a gateway's usual case), a map once many.
#[derive(Default)]
struct LimitTable {
    index: HashMap<WireLimit, u16>,
}

/// Above this many distinct limits the table indexes them in a map.
const SCANNED_LIMITS: usize = 16;

impl LimitTable {
    fn index_of(
        &mut self,
        limit: WireLimit,
        limits: &mut Vec<WireLimit>,
    ) -> Result<u16, PackError> {
        let found = if limits.len() <= SCANNED_LIMITS {
            limits.iter().position(|l| *l == limit)
        } else {
            if self.index.is_empty() {
                self.index = (0u16..).zip(limits.iter()).map(|(i, l)| (*l, i)).collect();
            }
            self.index.get(&limit).map(|&i| usize::from(i))
        };
        if let Some(i) = found {
            // Lossless: every index was checked below when its limit was added.
            return Ok(i as u16);
        }
        let i = u16::try_from(limits.len()).map_err(|_| PackError("over 65,536 limits"))?;
        limits.push(limit);
        if !self.index.is_empty() {
            self.index.insert(limit, i);
        }
        Ok(i)
    }
}

impl PackedBatch {
    /// Packs `batch`.
    pub fn pack(batch: &CheckBatch) -> Result<Self, PackError> {
        let checks = batch.groups.iter().map(Vec::len).sum();
        let key_bytes = batch.groups.iter().flatten().map(|c| c.key.len()).sum();
        let mut packed = PackedBatch {
            limits: Vec::new(),
            keys: Vec::with_capacity(key_bytes),
            checks: Vec::with_capacity(checks),
        };
        let mut table = LimitTable::default();
        for group in &batch.groups {
            if group.is_empty() {
                return Err(PackError("an empty group"));
            }
            for (i, check) in group.iter().enumerate() {
                packed.keys.extend_from_slice(&check.key);
                let key_end = u32::try_from(packed.keys.len())
                    .map_err(|_| PackError("over 4 GiB of keys"))?;
                let limit = WireLimit {
                    rate: check.rate,
                    period_ns: check.period_ns,
                    burst: check.burst,
                    algorithm: check.algorithm,
                };
                let limit = table.index_of(limit, &mut packed.limits)?;
                let flags = flag(i == 0, STARTS_GROUP)
                    | flag(check.refund, REFUND)
                    | flag(check.takeover, TAKEOVER)
                    | flag(check.peek, PEEK)
                    | flag(check.charge, CHARGE);
                packed.checks.push(PackedCheck {
                    cost: check.cost,
                    key_end,
                    limit,
                    flags,
                });
            }
        }
        Ok(packed)
    }
}

fn flag(set: bool, bit: u8) -> u8 {
    if set { bit } else { 0 }
}

/// One packed check, read back with its key and limit.
struct CheckView<'a> {
    starts_group: bool,
    key: &'a [u8],
    limit: usize,
    cost: u64,
    refund: bool,
    takeover: bool,
    peek: bool,
    charge: bool,
}

fn malformed(message: String) -> Refusal {
    (ErrorCode::MalformedPayload, message)
}

impl ArchivedPackedBatch {
    /// Number of checks over all groups.
    pub fn check_count(&self) -> usize {
        self.checks.len()
    }

    /// Calls `each` on every check in order, after checking what the archive's validation
    /// cannot: that the first check starts a group, that keys and limits are where the checks
    /// say, that no key byte is left over, and that no flag is unknown.
    fn walk(
        &self,
        mut each: impl FnMut(CheckView<'_>) -> Result<(), Refusal>,
    ) -> Result<(), Refusal> {
        if self.limits.len() > self.checks.len() {
            return Err(malformed(format!(
                "{} limits for {} checks",
                self.limits.len(),
                self.checks.len()
            )));
        }
        let keys = self.keys.as_slice();
        let mut key_start = 0;
        for (n, check) in self.checks.iter().enumerate() {
            let flags = check.flags;
            if flags & !KNOWN_FLAGS != 0 {
                return Err(malformed(format!("check {n}: unknown flags {flags:#04x}")));
            }
            let starts_group = flags & STARTS_GROUP != 0;
            if n == 0 && !starts_group {
                return Err(malformed("the first check starts no group".to_owned()));
            }
            let key_end = check.key_end.to_native() as usize;
            let Some(key) = keys.get(key_start..key_end) else {
                return Err(malformed(format!(
                    "check {n}: key bytes {key_start}..{key_end} of {}",
                    keys.len()
                )));
            };
            let limit = usize::from(check.limit.to_native());
            if limit >= self.limits.len() {
                return Err(malformed(format!(
                    "check {n}: limit {limit} of {}",
                    self.limits.len()
                )));
            }
            each(CheckView {
                starts_group,
                key,
                limit,
                cost: check.cost.to_native(),
                refund: flags & REFUND != 0,
                takeover: flags & TAKEOVER != 0,
                peek: flags & PEEK != 0,
                charge: flags & CHARGE != 0,
            })?;
            key_start = key_end;
        }
        if key_start != keys.len() {
            return Err(malformed(format!(
                "{} key bytes, of which the checks use {key_start}",
                keys.len()
            )));
        }
        Ok(())
    }

    /// The batch as sent (structure checked, limits not validated).
    pub fn unpack(&self) -> Result<CheckBatch, Refusal> {
        let mut groups: Vec<Vec<WireCheck>> = Vec::new();
        self.walk(|check| {
            let limit = &self.limits[check.limit];
            let wire = WireCheck {
                key: check.key.to_vec(),
                algorithm: limit.algorithm,
                rate: limit.rate.to_native(),
                period_ns: limit.period_ns.to_native(),
                burst: limit.burst.to_native(),
                cost: check.cost,
                refund: check.refund,
                takeover: check.takeover,
                peek: check.peek,
                charge: check.charge,
            };
            match groups.last_mut() {
                Some(group) if !check.starts_group => group.push(wire),
                _ => groups.push(vec![wire]),
            }
            Ok(())
        })?;
        Ok(CheckBatch { groups })
    }
}

impl Archive for CheckBatch {
    type Archived = ArchivedPackedBatch;
    type Resolver = Packed<PackedBatch>;

    fn resolve(&self, resolver: Self::Resolver, out: Place<Self::Archived>) {
        resolver.resolve(out);
    }
}

impl<S> Serialize<S> for CheckBatch
where
    S: Fallible + Allocator + Writer + ?Sized,
    S::Error: Source,
{
    fn serialize(&self, serializer: &mut S) -> Result<Self::Resolver, S::Error> {
        let packed = PackedBatch::pack(self).map_err(S::Error::new)?;
        Packed::serialize(packed, serializer)
    }
}

impl<D> Deserialize<CheckBatch, D> for ArchivedPackedBatch
where
    D: Fallible + ?Sized,
    D::Error: Source,
{
    fn deserialize(&self, _: &mut D) -> Result<CheckBatch, D::Error> {
        self.unpack().map_err(unpack_error)
    }
}

/// Validates a check batch payload and converts it: every group's checks, in order. Nothing is
/// read from `payload` before rkyv has validated the whole archive.
pub fn decode_check_batch(
    payload: &[u8],
    limits: &WireLimits,
) -> Result<Vec<Vec<ValidCheck>>, Refusal> {
    let batch = access_validated::<ArchivedCheckBatch>(payload, "check batch")?;
    decode_groups(batch, limits)
}

/// Validates and converts the groups of an archived check batch.
pub(crate) fn decode_groups(
    batch: &ArchivedCheckBatch,
    limits: &WireLimits,
) -> Result<Vec<Vec<ValidCheck>>, Refusal> {
    let mut groups = CheckGroups::default();
    decode_archived_into(batch, limits, &mut groups)?;
    Ok(groups.iter().map(<[ValidCheck]>::to_vec).collect())
}

/// A validated check batch, flat: every check in order and where each group ends. Reused from
/// frame to frame ([`decode_check_batch_into`]), it costs no allocation per group, where
/// `Vec<Vec<ValidCheck>>` costs one per gateway request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckGroups {
    checks: Vec<ValidCheck>,
    /// Exclusive end, in `checks`, of each group.
    ends: Vec<usize>,
    /// The batch's limits, validated.
    limits: Vec<Limit>,
}

impl CheckGroups {
    /// Number of groups.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Number of checks over all groups.
    pub fn check_count(&self) -> usize {
        self.checks.len()
    }

    /// Group `i`'s checks.
    pub fn group(&self, i: usize) -> Option<&[ValidCheck]> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        self.checks.get(start..end)
    }

    /// Every group's checks, in order.
    pub fn iter(&self) -> impl Iterator<Item = &[ValidCheck]> + Clone {
        (0..self.len()).filter_map(|i| self.group(i))
    }

    fn clear(&mut self) {
        self.checks.clear();
        self.ends.clear();
        self.limits.clear();
    }

    /// Ends the group being read, if any, after checking it.
    fn close_group(&mut self) -> Result<(), Refusal> {
        let start = self.ends.last().copied().unwrap_or(0);
        if start < self.checks.len() {
            check_group(&self.checks[start..])?;
            self.ends.push(self.checks.len());
        }
        Ok(())
    }
}

/// Group `i`'s checks; panics when there is no group `i`, as a slice index does.
impl std::ops::Index<usize> for CheckGroups {
    type Output = [ValidCheck];

    fn index(&self, i: usize) -> &[ValidCheck] {
        let end = self.ends[i];
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.checks[start..end]
    }
}

/// Groups already validated one by one, flattened in order.
impl From<Vec<Vec<ValidCheck>>> for CheckGroups {
    fn from(nested: Vec<Vec<ValidCheck>>) -> Self {
        let mut groups = CheckGroups {
            checks: Vec::with_capacity(nested.iter().map(Vec::len).sum()),
            ends: Vec::with_capacity(nested.len()),
            limits: Vec::new(),
        };
        for group in nested {
            groups.checks.extend(group);
            groups.ends.push(groups.checks.len());
        }
        groups
    }
}

/// [`decode_check_batch`] into `groups` (cleared first), reusing its buffers. On a refusal
/// `groups` holds nothing usable.
pub fn decode_check_batch_into(
    payload: &[u8],
    limits: &WireLimits,
    groups: &mut CheckGroups,
) -> Result<(), Refusal> {
    let batch = access_validated::<ArchivedCheckBatch>(payload, "check batch")?;
    decode_archived_into(batch, limits, groups)
}

pub(super) fn decode_archived_into(
    batch: &ArchivedCheckBatch,
    limits: &WireLimits,
    groups: &mut CheckGroups,
) -> Result<(), Refusal> {
    groups.clear();
    if batch.check_count() > limits.max_batch {
        return Err((
            ErrorCode::BatchTooLarge,
            format!(
                "{} checks in one frame; the maximum is {}",
                batch.check_count(),
                limits.max_batch
            ),
        ));
    }
    // Each distinct limit is validated once, not once per check.
    for limit in batch.limits.iter() {
        let limit = valid_limit(limit)?;
        limits.admit(&limit)?;
        groups.limits.push(limit);
    }
    batch.walk(|check| {
        if check.starts_group {
            groups.close_group()?;
        }
        check_key_len(check.key.len(), limits)?;
        groups.checks.push(ValidCheck {
            key: BucketKey::for_key(check.key),
            limit: groups.limits[check.limit],
            cost: check.cost,
            refund: check.refund,
            takeover: check.takeover,
            peek: check.peek,
            charge: check.charge,
        });
        Ok(())
    })?;
    groups.close_group()
}

/// Validates `batch` into `groups` (cleared first) as [`decode_check_batch_into`] validates
/// the same batch archived: the same checks in the same order, the same refusals, without
/// packing it. For a batch that [`CheckBatch::fits_packed`]; on a refusal `groups` holds
/// nothing usable.
pub fn validate_check_batch_into(
    batch: &CheckBatch,
    limits: &WireLimits,
    groups: &mut CheckGroups,
) -> Result<(), Refusal> {
    groups.clear();
    let count: usize = batch.groups.iter().map(Vec::len).sum();
    if count > limits.max_batch {
        return Err((
            ErrorCode::BatchTooLarge,
            format!(
                "{count} checks in one frame; the maximum is {}",
                limits.max_batch
            ),
        ));
    }
    groups.checks.reserve(count);
    // Every limit before any key, as the decoder reads the packed limits first (in the order
    // they first appear), validating each distinct one once.
    let mut seen: Vec<WireLimit> = Vec::new();
    let mut table = LimitTable::default();
    for check in batch.groups.iter().flatten() {
        let wire = WireLimit {
            rate: check.rate,
            period_ns: check.period_ns,
            burst: check.burst,
            algorithm: check.algorithm,
        };
        let before = seen.len();
        let index = table
            .index_of(wire, &mut seen)
            .map_err(|e| malformed(e.to_string()))?;
        if seen.len() > before {
            let limit = limit_from_wire(wire.algorithm, wire.rate, wire.period_ns, wire.burst)?;
            limits.admit(&limit)?;
            groups.limits.push(limit);
        }
        groups.checks.push(ValidCheck {
            key: BucketKey::for_key(&check.key),
            limit: groups.limits[usize::from(index)],
            cost: check.cost,
            refund: check.refund,
            takeover: check.takeover,
            peek: check.peek,
            charge: check.charge,
        });
    }
    let mut at = 0;
    for group in &batch.groups {
        let start = at;
        for check in group {
            check_key_len(check.key.len(), limits)?;
            at += 1;
        }
        if at > start {
            check_group(&groups.checks[start..at])?;
            groups.ends.push(at);
        }
    }
    Ok(())
}

impl CheckBatch {
    /// True when the batch packs (no empty group, at most 65,536 distinct limits) into at most
    /// `max_bytes`: found without packing it, from a bound on its packed size (its keys, 16
    /// bytes a check, 32 a limit, the layout's fixed bytes and padding), so a batch near the
    /// bound answers false though it may fit.
    pub fn fits_packed(&self, max_bytes: usize) -> bool {
        let mut checks = 0usize;
        let mut key_bytes = 0usize;
        for group in &self.groups {
            if group.is_empty() {
                return false;
            }
            checks += group.len();
            key_bytes = key_bytes.saturating_add(group.iter().map(|c| c.key.len()).sum());
        }
        // At most one distinct limit per check.
        let bound = key_bytes
            .saturating_add(checks.saturating_mul(16 + 32))
            .saturating_add(PACKED_LAYOUT_BYTES);
        checks <= usize::from(u16::MAX) && bound <= max_bytes
    }
}

/// More than a packed batch takes beyond its keys, checks and limits: its three vectors' heads
/// (8 bytes each) and padding to align each vector's contents (up to 8 bytes each).
const PACKED_LAYOUT_BYTES: usize = 64;

/// A packed limit as the store takes it, or why not.
fn valid_limit(limit: &ArchivedWireLimit) -> Result<Limit, Refusal> {
    limit_from_wire(
        limit.algorithm,
        limit.rate.to_native(),
        limit.period_ns.to_native(),
        limit.burst.to_native(),
    )
}

/// A check is at most one of a refund, a peek and a charge; a group is all refunds or none,
/// and all charges or none.
fn check_group(checks: &[ValidCheck]) -> Result<(), Refusal> {
    let refused = |message: &str| Err((ErrorCode::MalformedPayload, message.to_owned()));
    if checks
        .iter()
        .any(|c| u8::from(c.refund) + u8::from(c.peek) + u8::from(c.charge) > 1)
    {
        return refused("a check is at most one of a refund, a peek and a charge");
    }
    if checks.iter().any(|c| c.refund) && !checks.iter().all(|c| c.refund) {
        return refused("a group mixes refunds and checks");
    }
    if checks.iter().any(|c| c.charge) && !checks.iter().all(|c| c.charge) {
        return refused("a group mixes charges and checks");
    }
    Ok(())
}

/// `batch` archived, for tests here and in the wire module.
#[cfg(test)]
pub(crate) fn archive(batch: &CheckBatch) -> rkyv::util::AlignedVec {
    rkyv::to_bytes::<rkyv::rancor::Error>(batch).unwrap()
}

#[cfg(test)]
mod tests {
    use rkyv::rancor;

    use super::*;
    use crate::Algorithm;

    fn limit() -> Limit {
        Limit::gcra(10, 1_000_000_000, 10).unwrap()
    }

    fn check(key: &str) -> WireCheck {
        WireCheck::new(key, &limit(), 1)
    }

    fn refund(key: &str) -> WireCheck {
        WireCheck::refund(key, &limit(), 1)
    }

    fn payload(groups: Vec<Vec<WireCheck>>) -> rkyv::util::AlignedVec {
        archive(&CheckBatch { groups })
    }

    /// A packed batch archived as it is, however malformed.
    fn raw(packed: &PackedBatch) -> rkyv::util::AlignedVec {
        rkyv::to_bytes::<rancor::Error>(packed).unwrap()
    }

    #[test]
    fn a_batch_unpacks_to_what_was_packed() {
        let other = Limit::window(Algorithm::SlidingWindow, 5, 60_000_000_000).unwrap();
        let mut taken_over = WireCheck::new("t", &other, 0);
        taken_over.takeover = true;
        let batch = CheckBatch {
            groups: vec![
                vec![
                    check("user:1"),
                    WireCheck::new("ip:1", &other, 3),
                    check(""),
                ],
                vec![refund("user:2")],
                vec![taken_over],
            ],
        };
        let bytes = archive(&batch);
        let back = rkyv::from_bytes::<CheckBatch, rancor::Error>(&bytes).unwrap();
        assert_eq!(back, batch);
        let packed = PackedBatch::pack(&batch).unwrap();
        assert_eq!(packed.limits.len(), 2, "each distinct limit once");
        assert_eq!(packed.keys, b"user:1ip:1user:2t");
    }

    #[test]
    fn many_distinct_limits_get_one_entry_each() {
        let limits: Vec<Limit> = (1..=40)
            .map(|r| Limit::gcra(r, 1_000_000_000, r).unwrap())
            .collect();
        let groups = limits
            .iter()
            .chain(limits.iter().rev())
            .map(|l| vec![WireCheck::new("k", l, 1)])
            .collect();
        let batch = CheckBatch { groups };
        let packed = PackedBatch::pack(&batch).unwrap();
        assert_eq!(packed.limits.len(), 40);
        let back = rkyv::from_bytes::<CheckBatch, rancor::Error>(&archive(&batch)).unwrap();
        assert_eq!(back, batch);
    }

    #[test]
    fn a_check_takes_about_a_third_of_its_unpacked_size() {
        let one = |n: usize| {
            payload(
                (0..n)
                    .map(|i| vec![check(&format!("user:{i:06}"))])
                    .collect(),
            )
            .len()
        };
        let per_check = (one(257) - one(1)) / 256;
        // 11 key bytes and 16 of check.
        assert_eq!(per_check, 27);
    }

    #[test]
    fn an_empty_group_cannot_be_packed() {
        assert!(
            PackedBatch::pack(&CheckBatch {
                groups: vec![vec![]]
            })
            .is_err()
        );
        assert!(
            rkyv::to_bytes::<rancor::Error>(&CheckBatch {
                groups: vec![vec![]]
            })
            .is_err()
        );
        let empty = payload(vec![]);
        assert_eq!(
            decode_check_batch(&empty, &WireLimits::default()),
            Ok(vec![])
        );
    }

    #[test]
    fn the_flat_decoding_reads_the_same_groups_and_refuses_the_same_batches() {
        let limits = WireLimits::default();
        let mut flat = CheckGroups::default();
        let good = payload(vec![
            vec![check("a")],
            vec![check("b"), check("c"), check("d")],
            vec![refund("e")],
        ]);
        let nested = decode_check_batch(&good, &limits).unwrap();
        decode_check_batch_into(&good, &limits, &mut flat).unwrap();
        assert_eq!(flat.len(), 3);
        assert_eq!(flat.check_count(), 5);
        assert_eq!(flat.iter().collect::<Vec<_>>(), nested);
        assert_eq!(nested[1][2].key, BucketKey::for_key(b"d"));
        assert_eq!(flat.group(3), None);
        assert_eq!(&flat[1], nested[1].as_slice());
        // Flattened from nested groups: the same groups, indexed the same way.
        let from_nested = CheckGroups::from(nested.clone());
        assert_eq!(from_nested.iter().collect::<Vec<_>>(), nested);
        assert_eq!(&from_nested[2], nested[2].as_slice());
        // Reused: a second, smaller batch replaces the first.
        decode_check_batch_into(&payload(vec![vec![check("z")]]), &limits, &mut flat).unwrap();
        assert_eq!(flat.len(), 1);
        assert_eq!(flat.check_count(), 1);
        for (bad, code) in [
            (
                payload(vec![vec![check("a"), refund("b")]]),
                ErrorCode::MalformedPayload,
            ),
            (
                payload(vec![vec![check(&"k".repeat(limits.max_key_bytes + 1))]]),
                ErrorCode::KeyTooLong,
            ),
            (
                payload(vec![vec![check("a"); limits.max_batch + 1]]),
                ErrorCode::BatchTooLarge,
            ),
        ] {
            let expected = decode_check_batch(&bad, &limits).unwrap_err();
            let got = decode_check_batch_into(&bad, &limits, &mut flat).unwrap_err();
            assert_eq!(got, expected);
            assert_eq!(got.0, code, "{}", got.1);
        }
    }

    /// Peeks and charges travel as flags 8 and 16 and read back as sent; a group mixing
    /// charges and checks, or a check with two kinds at once, is refused.
    #[test]
    fn peeks_and_charges_travel_as_their_flags() {
        let limits = WireLimits::default();
        let batch = CheckBatch {
            groups: vec![
                vec![check("a"), WireCheck::peek("tokens:k", &limit(), 5)],
                vec![
                    WireCheck::charge("tokens:k", &limit(), 40),
                    WireCheck::charge("tokens:j", &limit(), 2),
                ],
            ],
        };
        let packed = PackedBatch::pack(&batch).unwrap();
        let flags: Vec<u8> = packed.checks.iter().map(|c| c.flags).collect();
        assert_eq!(flags, [STARTS_GROUP, PEEK, STARTS_GROUP | CHARGE, CHARGE]);
        let groups = decode_check_batch(&archive(&batch), &limits).unwrap();
        assert!(!groups[0][0].peek && groups[0][1].peek && !groups[0][1].charge);
        assert!(groups[1].iter().all(|c| c.charge && !c.peek && c.cost > 0));
        let mixed = payload(vec![vec![check("a"), WireCheck::charge("b", &limit(), 1)]]);
        let (code, message) = decode_check_batch(&mixed, &limits).unwrap_err();
        assert_eq!(code, ErrorCode::MalformedPayload);
        assert!(message.contains("mixes charges and checks"), "{message}");
        let mut both = WireCheck::charge("b", &limit(), 1);
        both.peek = true;
        let (code, message) = decode_check_batch(&payload(vec![vec![both]]), &limits).unwrap_err();
        assert_eq!(code, ErrorCode::MalformedPayload);
        assert!(message.contains("at most one of"), "{message}");
    }

    #[test]
    fn packed_batches_that_do_not_hold_together_are_refused() {
        let good = PackedBatch::pack(&CheckBatch {
            groups: vec![vec![check("ab")], vec![check("cd")]],
        })
        .unwrap();
        let limits = WireLimits::default();
        let refusal = |packed: PackedBatch| {
            let refusal = decode_check_batch(&raw(&packed), &limits).unwrap_err();
            assert!(
                rkyv::from_bytes::<CheckBatch, rancor::Error>(&raw(&packed)).is_err()
                    || refusal.0 == ErrorCode::InvalidLimit
            );
            refusal
        };
        let mut cases = Vec::new();
        let mut p = good.clone();
        p.checks[0].flags = 0;
        cases.push((p, "starts no group"));
        let mut p = good.clone();
        p.checks[1].flags |= 0x80;
        cases.push((p, "unknown flags"));
        let mut p = good.clone();
        p.checks[0].key_end = 9;
        cases.push((p, "key bytes 0..9 of 4"));
        let mut p = good.clone();
        p.checks[1].key_end = 1;
        cases.push((p, "key bytes 2..1 of 4"));
        let mut p = good.clone();
        p.keys.push(b'x');
        cases.push((p, "5 key bytes, of which the checks use 4"));
        let mut p = good.clone();
        p.checks[1].limit = 1;
        cases.push((p, "limit 1 of 1"));
        let mut p = good.clone();
        p.limits = vec![p.limits[0]; 3];
        cases.push((p, "3 limits for 2 checks"));
        for (packed, says) in cases {
            let (code, message) = refusal(packed);
            assert_eq!(code, ErrorCode::MalformedPayload, "{message}");
            assert!(message.contains(says), "{message}");
        }
        let mut p = good.clone();
        p.limits[0].algorithm = 9;
        let (code, message) = refusal(p);
        assert_eq!(code, ErrorCode::InvalidLimit);
        assert!(message.contains("unknown algorithm 9"), "{message}");
        let mut p = good;
        p.limits[0].rate = 0;
        assert_eq!(refusal(p).0, ErrorCode::InvalidLimit);
    }

    /// Validating a batch as it is refuses and accepts exactly what decoding it archived does,
    /// over seeded random batches (sizes, keys, limits valid or not, flags), and the packed
    /// size bound is never below the archive's size.
    #[test]
    fn validating_unpacked_agrees_with_decoding_packed() {
        let limits = WireLimits {
            max_batch: 12,
            max_key_bytes: 40,
            max_period_ns: 3_600_000_000_000,
            max_log_limit: 50,
        };
        let wire = |l: Limit| {
            let c = WireCheck::new("", &l, 1);
            WireLimit {
                rate: c.rate,
                period_ns: c.period_ns,
                burst: c.burst,
                algorithm: c.algorithm,
            }
        };
        let candidates = [
            wire(limit()),
            wire(Limit::gcra(5, 60_000_000_000, 5).unwrap()),
            // A period past `max_period_ns`, a sliding log past `max_log_limit`, a zero rate.
            wire(Limit::gcra(1, 7_200_000_000_000, 1).unwrap()),
            wire(Limit::new(Algorithm::SlidingLog, 100, 1_000_000_000, 100).unwrap()),
            WireLimit {
                rate: 0,
                period_ns: 1_000_000_000,
                burst: 1,
                algorithm: 0,
            },
        ];
        let mut seed: u64 = 0x5eed;
        let mut next = |n: u64| {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) % n
        };
        let (mut accepted, mut refused) = (0, 0);
        for _ in 0..3_000 {
            let mut groups = Vec::new();
            for _ in 0..1 + next(5) {
                let mut group = Vec::new();
                for _ in 0..1 + next(4) {
                    let spread = if next(4) == 0 { 5 } else { 2 };
                    let l = candidates[next(spread) as usize];
                    let key_len = if next(10) == 0 { 41 } else { next(12) } as usize;
                    let mut check = WireCheck {
                        key: vec![b'k'; key_len],
                        algorithm: l.algorithm,
                        rate: l.rate,
                        period_ns: l.period_ns,
                        burst: l.burst,
                        cost: next(3),
                        refund: false,
                        takeover: next(8) == 0,
                        peek: false,
                        charge: false,
                    };
                    match next(12) {
                        0 => check.refund = true,
                        1 => check.peek = true,
                        2 => check.charge = true,
                        _ => {}
                    }
                    group.push(check);
                }
                groups.push(group);
            }
            let batch = CheckBatch { groups };
            let archived = archive(&batch);
            assert!(!batch.fits_packed(archived.len() - 1));
            let mut decoded = CheckGroups::default();
            let mut validated = CheckGroups::default();
            let decoding = decode_check_batch_into(&archived, &limits, &mut decoded);
            let validating = validate_check_batch_into(&batch, &limits, &mut validated);
            assert_eq!(decoding, validating, "{batch:?}");
            if decoding.is_ok() {
                assert_eq!(decoded, validated);
                accepted += 1;
            } else {
                refused += 1;
            }
        }
        assert!(accepted > 300 && refused > 300, "{accepted} {refused}");
    }
}
