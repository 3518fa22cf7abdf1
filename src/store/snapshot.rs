//! The snapshot file format: long-period buckets as explicit little-endian bytes behind a magic,
//! a format version and a checksum. Pure (no I/O): the node reads and writes the files.
//!
//! Layout (every integer little-endian):
//!
//! ```text
//! header   magic "FGSNAPv\n" (8) | version u16 | reserved u16 = 0 | count u32
//!          | written_unix_ns u64 | body_len u64                                  = 32 bytes
//! body     `count` entries, `body_len` bytes
//! trailer  xxh3-64 of header and body, u64
//! entry    key: hash u64, check u32 | algorithm u8 (0 gcra, 1 fixed-window, 2 sliding-window,
//!          3 sliding-log), then by algorithm:
//!          gcra    tat_ns u64 | margin_ms u32
//!          window  rate u64 | period_ns u64 | window u64 | count u64 | previous u64
//!          log     rate u64 | period_ns u64 | n u32 | n × time_ns u64 (oldest first)
//! ```
//!
//! Times are the node's clock: nanoseconds since the Unix epoch, so they mean the same after a
//! restart. The decoder trusts nothing: every length is checked before it is used, every limit is
//! rebuilt through [`Limit::new`], and the buckets it returns still go through the store's merge
//! (which keeps the stricter copy and clamps implausible windows and log times).

use xxhash_rust::xxh3::xxh3_64;

use super::{BucketState, BucketValue};
use crate::algorithm::{SlidingLog, WindowState, fixed_window, sliding_window};
use crate::{Algorithm, BucketKey, Limit, NANOS_PER_SEC};

/// First bytes of every snapshot file (the newline catches text-mode mangling).
pub const SNAPSHOT_MAGIC: [u8; 8] = *b"FGSNAPv\n";
/// The format this code writes, and the newest it reads.
pub const SNAPSHOT_VERSION: u16 = 1;
/// Header bytes before the first entry.
pub const SNAPSHOT_HEADER_BYTES: usize = 32;
/// Checksum bytes after the last entry.
pub const SNAPSHOT_TRAILER_BYTES: usize = 8;
/// Buckets of limits at least this long are snapshotted: shorter ones refill within minutes, so a
/// restart that forgets them gives back little, and they change too often to write every second.
pub const LONG_PERIOD_NS: u64 = 3_600 * NANOS_PER_SEC;
/// A burst-1 GCRA bucket (no margin to judge its period by) is kept while it is at least this far
/// from full: forgetting it gives back at most this much refill time.
pub const BURST_ONE_MIN_REMAINING_NS: u64 = 60 * NANOS_PER_SEC;

/// Bytes of the key and algorithm tag that open every entry.
const ENTRY_PREFIX_BYTES: usize = 8 + 4 + 1;
/// The smallest entry (GCRA): bounds how many entries a body of a given length can hold.
const MIN_ENTRY_BYTES: usize = ENTRY_PREFIX_BYTES + 8 + 4;
/// The largest entry: a sliding log of its largest limit.
pub const MAX_ENTRY_BYTES: usize =
    ENTRY_PREFIX_BYTES + 8 + 8 + 4 + 8 * crate::SLIDING_LOG_MAX_LIMIT as usize;

/// A decoded snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// When it was written, by the writer's clock (nanoseconds since the Unix epoch).
    pub written_unix_ns: u64,
    pub buckets: Vec<BucketState>,
}

/// Why a snapshot was refused. Each message says what was wrong in words an operator can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    #[error(
        "only {len} bytes, shorter than a snapshot's {} header and checksum bytes: truncated or empty",
        SNAPSHOT_HEADER_BYTES + SNAPSHOT_TRAILER_BYTES
    )]
    TooShort { len: usize },
    #[error("does not start with the floodgate snapshot magic: not a snapshot file")]
    BadMagic,
    #[error(
        "format version {version} is newer than this node reads (up to {SNAPSHOT_VERSION}): written by a newer floodgate"
    )]
    TooNew { version: u16 },
    #[error("format version 0 does not exist: not a snapshot this program wrote")]
    VersionZero,
    #[error("reserved header field is {value}, expected 0")]
    Reserved { value: u16 },
    #[error("holds {count} buckets, more than the {max} this store can hold")]
    TooManyBuckets { count: u64, max: u64 },
    #[error(
        "the header announces {expected} bytes of buckets but the file has {actual}: truncated or appended to"
    )]
    LengthMismatch { expected: u64, actual: u64 },
    #[error("announces {count} buckets, more than its {body_len} bytes of buckets can hold")]
    CountExceedsBody { count: u64, body_len: u64 },
    #[error(
        "checksum mismatch (stored {stored:016x}, computed {computed:016x}): the file is corrupt"
    )]
    BadChecksum { stored: u64, computed: u64 },
    #[error("bucket {index}: {reason}")]
    BadBucket { index: u64, reason: String },
    #[error("{extra} bytes after the last of {count} buckets")]
    TrailingBytes { extra: usize, count: u64 },
}

/// True for a bucket worth keeping across a restart: a window or log whose limit period is
/// [`LONG_PERIOD_NS`] or more; a GCRA bucket (whose state has no period) whose margin says so —
/// a margin of half an hour or more, which every limit of an hour or more has with a burst of 2
/// or more — or, with burst 1 (margin 0), while it is [`BURST_ONE_MIN_REMAINING_NS`] from full.
pub fn is_long_period(state: &BucketState, now_ns: u64) -> bool {
    match &state.value {
        BucketValue::Gcra { tat_ns, margin_ms } => {
            u64::from(*margin_ms) * 1_000_000 >= LONG_PERIOD_NS / 2
                || (*margin_ms == 0 && tat_ns.saturating_sub(now_ns) >= BURST_ONE_MIN_REMAINING_NS)
        }
        BucketValue::Window { limit, .. } | BucketValue::Log { limit, .. } => {
            limit.period_ns() >= LONG_PERIOD_NS
        }
    }
}

/// True when the bucket still holds something at `now` (an expired bucket equals a fresh one, so
/// dropping it on load changes no decision).
pub fn is_live(state: &BucketState, now_ns: u64) -> bool {
    match &state.value {
        BucketValue::Gcra { tat_ns, .. } => *tat_ns > now_ns,
        BucketValue::Window { limit, state } => match limit.algorithm() {
            Algorithm::SlidingWindow => !sliding_window::is_expired(limit, state, now_ns),
            _ => !fixed_window::is_expired(limit, state, now_ns),
        },
        BucketValue::Log { limit, times_ns } => {
            !SlidingLog::from_times(limit, times_ns).is_expired(limit, now_ns)
        }
    }
}

/// Appends the snapshot of `buckets` to `out`. At most `u32::MAX` buckets are written (far beyond
/// any store); sliding logs longer than [`crate::SLIDING_LOG_MAX_LIMIT`] are cut to their newest
/// times, so every file this writes decodes.
pub fn encode_snapshot(buckets: &[BucketState], written_unix_ns: u64, out: &mut Vec<u8>) {
    let start = out.len();
    let count = buckets.len().min(u32::MAX as usize);
    out.extend_from_slice(&SNAPSHOT_MAGIC);
    out.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&(count as u32).to_le_bytes());
    out.extend_from_slice(&written_unix_ns.to_le_bytes());
    let body_len_at = out.len();
    out.extend_from_slice(&0u64.to_le_bytes());
    let body_start = out.len();
    for bucket in &buckets[..count] {
        encode_bucket(bucket, out);
    }
    let body_len = (out.len() - body_start) as u64;
    out[body_len_at..body_start].copy_from_slice(&body_len.to_le_bytes());
    let checksum = xxh3_64(&out[start..]);
    out.extend_from_slice(&checksum.to_le_bytes());
}

/// A hash of an encoded snapshot's buckets, without its write time: equal for two snapshots of
/// the same state, so a writer can skip writing what it already wrote.
pub fn snapshot_content_hash(encoded: &[u8]) -> u64 {
    let end = encoded.len().saturating_sub(SNAPSHOT_TRAILER_BYTES);
    xxh3_64(encoded.get(SNAPSHOT_HEADER_BYTES..end).unwrap_or_default())
}

/// Most bytes a valid snapshot of at most `max_buckets` buckets can have.
pub fn max_snapshot_bytes(max_buckets: usize) -> u64 {
    (SNAPSHOT_HEADER_BYTES + SNAPSHOT_TRAILER_BYTES) as u64
        + (max_buckets as u64).saturating_mul(MAX_ENTRY_BYTES as u64)
}

/// Decodes and validates a snapshot from arbitrary bytes; never panics. Bounded only by the
/// input's length; a store should use [`decode_snapshot_limited`] with its capacity.
pub fn decode_snapshot(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
    decode_snapshot_limited(bytes, usize::MAX)
}

/// Decodes and validates a snapshot of at most `max_buckets` buckets.
pub fn decode_snapshot_limited(
    bytes: &[u8],
    max_buckets: usize,
) -> Result<Snapshot, SnapshotError> {
    if bytes.len() < SNAPSHOT_HEADER_BYTES + SNAPSHOT_TRAILER_BYTES {
        return Err(SnapshotError::TooShort { len: bytes.len() });
    }
    let mut header = Reader::new(&bytes[..SNAPSHOT_HEADER_BYTES]);
    if header.take(8) != Some(&SNAPSHOT_MAGIC[..]) {
        return Err(SnapshotError::BadMagic);
    }
    // The header's fixed 32 bytes are present (checked above), so these reads cannot fail.
    let version = header.u16().unwrap_or(0);
    match version {
        0 => return Err(SnapshotError::VersionZero),
        v if v > SNAPSHOT_VERSION => return Err(SnapshotError::TooNew { version: v }),
        _ => {}
    }
    let reserved = header.u16().unwrap_or(u16::MAX);
    if reserved != 0 {
        return Err(SnapshotError::Reserved { value: reserved });
    }
    let count = u64::from(header.u32().unwrap_or(u32::MAX));
    let written_unix_ns = header.u64().unwrap_or(0);
    let body_len = header.u64().unwrap_or(u64::MAX);
    if count > max_buckets as u64 {
        return Err(SnapshotError::TooManyBuckets {
            count,
            max: max_buckets as u64,
        });
    }
    let actual = (bytes.len() - SNAPSHOT_HEADER_BYTES - SNAPSHOT_TRAILER_BYTES) as u64;
    if body_len != actual {
        return Err(SnapshotError::LengthMismatch {
            expected: body_len,
            actual,
        });
    }
    let (covered, trailer) = bytes.split_at(bytes.len() - SNAPSHOT_TRAILER_BYTES);
    let stored = Reader::new(trailer).u64().unwrap_or(0);
    let computed = xxh3_64(covered);
    if stored != computed {
        return Err(SnapshotError::BadChecksum { stored, computed });
    }
    let body = &covered[SNAPSHOT_HEADER_BYTES..];
    // A count the body cannot hold is refused before anything is allocated for it.
    if count.saturating_mul(MIN_ENTRY_BYTES as u64) > body.len() as u64 {
        return Err(SnapshotError::CountExceedsBody {
            count,
            body_len: actual,
        });
    }
    let mut reader = Reader::new(body);
    let mut buckets = Vec::with_capacity(count as usize);
    for index in 0..count {
        let bucket = decode_bucket(&mut reader)
            .map_err(|reason| SnapshotError::BadBucket { index, reason })?;
        buckets.push(bucket);
    }
    if !reader.rest().is_empty() {
        return Err(SnapshotError::TrailingBytes {
            extra: reader.rest().len(),
            count,
        });
    }
    Ok(Snapshot {
        written_unix_ns,
        buckets,
    })
}

fn algorithm_tag(algorithm: Algorithm) -> u8 {
    match algorithm {
        Algorithm::Gcra => 0,
        Algorithm::FixedWindow => 1,
        Algorithm::SlidingWindow => 2,
        Algorithm::SlidingLog => 3,
    }
}

fn encode_bucket(bucket: &BucketState, out: &mut Vec<u8>) {
    out.extend_from_slice(&bucket.key.hash.to_le_bytes());
    out.extend_from_slice(&bucket.key.check.to_le_bytes());
    match &bucket.value {
        BucketValue::Gcra { tat_ns, margin_ms } => {
            out.push(algorithm_tag(Algorithm::Gcra));
            out.extend_from_slice(&tat_ns.to_le_bytes());
            out.extend_from_slice(&margin_ms.to_le_bytes());
        }
        BucketValue::Window { limit, state } => {
            out.push(algorithm_tag(limit.algorithm()));
            for field in [
                limit.rate(),
                limit.period_ns(),
                state.window,
                state.count,
                state.previous,
            ] {
                out.extend_from_slice(&field.to_le_bytes());
            }
        }
        BucketValue::Log { limit, times_ns } => {
            out.push(algorithm_tag(Algorithm::SlidingLog));
            out.extend_from_slice(&limit.rate().to_le_bytes());
            out.extend_from_slice(&limit.period_ns().to_le_bytes());
            let newest = &times_ns[times_ns
                .len()
                .saturating_sub(crate::algorithm::SlidingLog::most_entries(limit))..];
            out.extend_from_slice(&(newest.len() as u32).to_le_bytes());
            for time in newest {
                out.extend_from_slice(&time.to_le_bytes());
            }
        }
    }
}

fn decode_bucket(reader: &mut Reader<'_>) -> Result<BucketState, String> {
    let truncated = || "ends early".to_owned();
    let hash = reader.u64().ok_or_else(truncated)?;
    let check = reader.u32().ok_or_else(truncated)?;
    if hash == 0 {
        // The store marks empty slots with a zero hash; no real key has one.
        return Err("key hash is zero, which no key has".to_owned());
    }
    let key = BucketKey { hash, check };
    let tag = reader.u8().ok_or_else(truncated)?;
    let algorithm = *Algorithm::ALL
        .get(usize::from(tag))
        .ok_or_else(|| format!("unknown algorithm {tag}"))?;
    let value = match algorithm {
        Algorithm::Gcra => BucketValue::Gcra {
            tat_ns: reader.u64().ok_or_else(truncated)?,
            margin_ms: reader.u32().ok_or_else(truncated)?,
        },
        Algorithm::FixedWindow | Algorithm::SlidingWindow => {
            let rate = reader.u64().ok_or_else(truncated)?;
            let period_ns = reader.u64().ok_or_else(truncated)?;
            let limit = Limit::window(algorithm, rate, period_ns).map_err(|e| e.to_string())?;
            BucketValue::Window {
                limit,
                state: WindowState {
                    window: reader.u64().ok_or_else(truncated)?,
                    count: reader.u64().ok_or_else(truncated)?,
                    previous: reader.u64().ok_or_else(truncated)?,
                },
            }
        }
        Algorithm::SlidingLog => {
            let rate = reader.u64().ok_or_else(truncated)?;
            let period_ns = reader.u64().ok_or_else(truncated)?;
            let limit = Limit::window(algorithm, rate, period_ns).map_err(|e| e.to_string())?;
            let n = u64::from(reader.u32().ok_or_else(truncated)?);
            if n > crate::algorithm::SlidingLog::most_entries(&limit) as u64 {
                return Err(format!(
                    "a log of {n} times is longer than twice its limit {} (one limit owed)",
                    limit.burst()
                ));
            }
            // n <= 2 * SLIDING_LOG_MAX_LIMIT here, so the take is small and checked.
            let raw = reader.take(n as usize * 8).ok_or_else(truncated)?;
            let times_ns: Vec<u64> = raw
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
                .collect();
            if times_ns.windows(2).any(|w| w[0] > w[1]) {
                return Err("log times are not oldest first".to_owned());
            }
            BucketValue::Log { limit, times_ns }
        }
    };
    Ok(BucketState { key, value })
}

/// Reads little-endian integers from a byte slice; every read checks the length first.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes }
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < n {
            return None;
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Some(head)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    fn u8(&mut self) -> Option<u8> {
        self.array::<1>().map(|b| b[0])
    }

    fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_le_bytes)
    }

    fn rest(&self) -> &'a [u8] {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: u64 = 3_600 * NANOS_PER_SEC;
    const NOW: u64 = 1_700_000_000 * NANOS_PER_SEC;

    fn key(n: u64) -> BucketKey {
        BucketKey::for_key(&n.to_le_bytes())
    }

    fn samples() -> Vec<BucketState> {
        let daily = Limit::window(Algorithm::FixedWindow, 5, 24 * HOUR).unwrap();
        let sliding = Limit::window(Algorithm::SlidingWindow, 100, HOUR).unwrap();
        let log = Limit::window(Algorithm::SlidingLog, 3, 24 * HOUR).unwrap();
        vec![
            BucketState {
                key: key(1),
                value: BucketValue::Gcra {
                    tat_ns: NOW + 20 * HOUR,
                    margin_ms: 19 * 3_600_000,
                },
            },
            BucketState {
                key: key(2),
                value: BucketValue::Window {
                    limit: daily,
                    state: WindowState {
                        window: NOW / daily.period_ns(),
                        count: 5,
                        previous: 2,
                    },
                },
            },
            BucketState {
                key: key(3),
                value: BucketValue::Window {
                    limit: sliding,
                    state: WindowState {
                        window: NOW / HOUR,
                        count: 7,
                        previous: 0,
                    },
                },
            },
            BucketState {
                key: key(4),
                value: BucketValue::Log {
                    limit: log,
                    times_ns: vec![NOW - HOUR, NOW - 1, NOW],
                },
            },
        ]
    }

    fn encoded(buckets: &[BucketState]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_snapshot(buckets, NOW, &mut out);
        out
    }

    /// Rewrites the checksum so a test can reach the checks behind it.
    fn reseal(bytes: &mut [u8]) {
        let end = bytes.len() - SNAPSHOT_TRAILER_BYTES;
        let checksum = xxh3_64(&bytes[..end]);
        bytes[end..].copy_from_slice(&checksum.to_le_bytes());
    }

    #[test]
    fn every_kind_of_bucket_round_trips() {
        let buckets = samples();
        let decoded = decode_snapshot_limited(&encoded(&buckets), 4).unwrap();
        assert_eq!(decoded.written_unix_ns, NOW);
        assert_eq!(decoded.buckets, buckets);
        let empty = decode_snapshot(&encoded(&[])).unwrap();
        assert!(empty.buckets.is_empty());
    }

    #[test]
    fn the_content_hash_ignores_the_write_time_only() {
        let buckets = samples();
        let mut later = Vec::new();
        encode_snapshot(&buckets, NOW + 1, &mut later);
        assert_eq!(
            snapshot_content_hash(&encoded(&buckets)),
            snapshot_content_hash(&later)
        );
        assert_ne!(
            snapshot_content_hash(&encoded(&buckets)),
            snapshot_content_hash(&encoded(&buckets[1..]))
        );
    }

    #[test]
    fn a_foreign_file_is_refused() {
        let mut bytes = encoded(&samples());
        bytes[0] = b'X';
        assert_eq!(decode_snapshot(&bytes), Err(SnapshotError::BadMagic));
        let text = b"this is a text file that happens to be long enough to pass the length check";
        assert_eq!(decode_snapshot(text), Err(SnapshotError::BadMagic));
    }

    #[test]
    fn newer_and_unknown_versions_are_refused() {
        let mut bytes = encoded(&samples());
        bytes[8..10].copy_from_slice(&(SNAPSHOT_VERSION + 1).to_le_bytes());
        reseal(&mut bytes);
        let err = decode_snapshot(&bytes).unwrap_err();
        assert_eq!(
            err,
            SnapshotError::TooNew {
                version: SNAPSHOT_VERSION + 1
            }
        );
        assert!(err.to_string().contains("newer floodgate"), "{err}");
        bytes[8..10].copy_from_slice(&0u16.to_le_bytes());
        reseal(&mut bytes);
        assert_eq!(decode_snapshot(&bytes), Err(SnapshotError::VersionZero));
    }

    #[test]
    fn any_flipped_bit_is_refused() {
        let clean = encoded(&samples());
        for at in 0..clean.len() {
            let mut bytes = clean.clone();
            bytes[at] ^= 0x10;
            assert!(decode_snapshot(&bytes).is_err(), "flip at byte {at} passed");
        }
        let mut bytes = clean.clone();
        bytes[SNAPSHOT_HEADER_BYTES + 3] ^= 1;
        assert!(matches!(
            decode_snapshot(&bytes),
            Err(SnapshotError::BadChecksum { .. })
        ));
    }

    #[test]
    fn truncated_and_extended_files_are_refused() {
        let clean = encoded(&samples());
        for len in 0..clean.len() {
            assert!(
                decode_snapshot(&clean[..len]).is_err(),
                "truncated to {len} passed"
            );
        }
        assert!(matches!(
            decode_snapshot(&clean[..10]),
            Err(SnapshotError::TooShort { len: 10 })
        ));
        assert!(matches!(
            decode_snapshot(&clean[..clean.len() - 1]),
            Err(SnapshotError::LengthMismatch { .. })
        ));
        let mut longer = clean.clone();
        longer.push(0);
        assert!(matches!(
            decode_snapshot(&longer),
            Err(SnapshotError::LengthMismatch { .. })
        ));
    }

    #[test]
    fn counts_beyond_the_store_or_the_body_are_refused() {
        let bytes = encoded(&samples());
        assert_eq!(
            decode_snapshot_limited(&bytes, 3),
            Err(SnapshotError::TooManyBuckets { count: 4, max: 3 })
        );
        // A count the body cannot hold: refused before allocating.
        let mut huge = bytes.clone();
        huge[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        reseal(&mut huge);
        assert!(matches!(
            decode_snapshot(&huge),
            Err(SnapshotError::CountExceedsBody { .. })
        ));
        // A count smaller than the body: the rest is refused, not ignored.
        let mut fewer = bytes.clone();
        fewer[12..16].copy_from_slice(&3u32.to_le_bytes());
        reseal(&mut fewer);
        assert!(matches!(
            decode_snapshot(&fewer),
            Err(SnapshotError::TrailingBytes { count: 3, .. })
        ));
        let mut reserved = bytes;
        reserved[10] = 1;
        reseal(&mut reserved);
        assert_eq!(
            decode_snapshot(&reserved),
            Err(SnapshotError::Reserved { value: 1 })
        );
    }

    #[test]
    fn invalid_buckets_are_refused_even_with_a_valid_checksum() {
        const FIRST: usize = SNAPSHOT_HEADER_BYTES;
        let first = FIRST;
        type Corruption = fn(&mut [u8]);
        let cases: [(Corruption, &str); 2] = [
            (|b| b[FIRST + 12] = 9, "unknown algorithm 9"),
            (|b| b[FIRST..FIRST + 8].fill(0), "hash is zero"),
        ];
        for (corrupt, expected) in cases {
            let mut bytes = encoded(&samples());
            corrupt(&mut bytes);
            reseal(&mut bytes);
            let err = decode_snapshot(&bytes).unwrap_err();
            assert!(
                matches!(&err, SnapshotError::BadBucket { index: 0, reason } if reason.contains(expected)),
                "{err}"
            );
        }
        // A window whose limit is invalid (rate 0).
        let window = &samples()[1..2];
        let mut bytes = encoded(window);
        bytes[first + 13..first + 21].fill(0);
        reseal(&mut bytes);
        let err = decode_snapshot(&bytes).unwrap_err();
        assert!(err.to_string().contains("rate must be at least 1"), "{err}");
        // A log longer than twice its limit of 3 (one limit owed).
        let log = &samples()[3..4];
        let mut bytes = encoded(log);
        bytes[first + 29..first + 33].copy_from_slice(&7u32.to_le_bytes());
        reseal(&mut bytes);
        let err = decode_snapshot(&bytes).unwrap_err();
        assert!(
            err.to_string().contains("longer than twice its limit"),
            "{err}"
        );
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let clean = encoded(&samples());
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for round in 0..2_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut bytes = clean.clone();
            bytes[(x as usize) % clean.len()] = (x >> 32) as u8;
            bytes.truncate(clean.len() - round % 7);
            reseal_if_long_enough(&mut bytes);
            let _ = decode_snapshot(&bytes);
        }
    }

    fn reseal_if_long_enough(bytes: &mut [u8]) {
        if bytes.len() >= SNAPSHOT_HEADER_BYTES + SNAPSHOT_TRAILER_BYTES {
            reseal(bytes);
        }
    }

    #[test]
    fn only_long_period_buckets_are_kept() {
        let gcra = |tat_ns, margin_ms| BucketState {
            key: key(9),
            value: BucketValue::Gcra { tat_ns, margin_ms },
        };
        // 5/d: margin 4 intervals of 4.8 h.
        assert!(is_long_period(&gcra(NOW + HOUR, 4 * 17_280_000), NOW));
        // 2/h, the shortest multi-token hourly limit: margin 30 min.
        assert!(is_long_period(&gcra(NOW + HOUR, 1_800_000), NOW));
        // 100/min: margin under a minute.
        assert!(!is_long_period(
            &gcra(NOW + 60 * NANOS_PER_SEC, 59_400),
            NOW
        ));
        // 1/d (burst 1): kept while at least a minute from full.
        assert!(is_long_period(&gcra(NOW + 10 * HOUR, 0), NOW));
        assert!(!is_long_period(&gcra(NOW + NANOS_PER_SEC, 0), NOW));
        let window = |period_ns| BucketState {
            key: key(9),
            value: BucketValue::Window {
                limit: Limit::window(Algorithm::FixedWindow, 10, period_ns).unwrap(),
                state: WindowState::default(),
            },
        };
        assert!(is_long_period(&window(HOUR), NOW));
        assert!(!is_long_period(&window(HOUR - 1), NOW));
    }

    /// The whole path a restart takes: export the long-period buckets, encode, decode, merge
    /// into a fresh store; the used-up daily key stays used up, the per-second one is not kept.
    #[test]
    fn a_used_up_daily_key_stays_used_up_through_a_snapshot() {
        use crate::{BucketStore, StoreConfig};
        let config = StoreConfig {
            max_keys: 64,
            shards: 4,
        };
        let store = BucketStore::new(config).unwrap();
        let daily = Limit::gcra(5, 24 * HOUR, 5).unwrap();
        let per_second = Limit::gcra(10, NANOS_PER_SEC, 10).unwrap();
        let (quota, burst) = (BucketKey::for_key(b"daily"), BucketKey::for_key(b"second"));
        for _ in 0..5 {
            assert!(store.check(quota, &daily, 1, NOW).unwrap().is_allowed());
        }
        assert!(
            store
                .check(burst, &per_second, 10, NOW)
                .unwrap()
                .is_allowed()
        );
        let mut kept = Vec::new();
        store.export_matching(NOW, &|b| is_long_period(b, NOW), &mut kept);
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].key, quota);

        let decoded = decode_snapshot_limited(&encoded(&kept), 64).unwrap();
        let restarted = BucketStore::new(config).unwrap();
        let later = NOW + HOUR;
        assert_eq!(restarted.merge(&decoded.buckets, later), 0);
        assert!(
            !restarted
                .check(quota, &daily, 1, later)
                .unwrap()
                .is_allowed()
        );
        assert!(
            restarted
                .check(burst, &per_second, 10, later)
                .unwrap()
                .is_allowed()
        );
    }

    #[test]
    fn expired_buckets_are_not_live() {
        let buckets = samples();
        assert!(buckets.iter().all(|b| is_live(b, NOW)));
        let day_later = NOW + 3 * 24 * HOUR;
        assert!(buckets.iter().all(|b| !is_live(b, day_later)));
    }
}
