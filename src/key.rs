//! `BucketKey`: the fixed-size identity of one bucket, a 96-bit hash of (rule, key bytes).
//!
//! Storing a hash instead of the key bytes keeps every bucket the same small size whatever the
//! key's length; at 96 bits two keys collide with probability about n² / 2⁹⁷ (1e-17 for a
//! million keys). xxh3 is stable across builds and platforms.

use xxhash_rust::xxh3::{xxh3_64, xxh3_128_with_seed};

/// `xxh3_64(b"")`: the seed of keys under the empty rule ([`BucketKey::for_key`]), computed once
/// (a unit test pins it).
const EMPTY_RULE_SEED: u64 = 0x2d06_8005_38d3_94c2;

/// What a zero `hash` becomes ([`BucketKey::from_u128`]); any non-zero constant would do.
const ZERO_HASH_STAND_IN: u64 = 0x9e37_79b9_7f4a_7c15;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BucketKey {
    /// Hashes the key inside its shard's table; never zero.
    pub(crate) hash: u64,
    /// Picks the shard and tells apart keys whose `hash` collides.
    pub(crate) check: u32,
}

impl BucketKey {
    /// The bucket of `key` under `rule`. The rule's own hash seeds the key's, so ("ab", "c") and
    /// ("a", "bc") differ. Both are one-shot hashes: the streaming hasher costs more to set up
    /// than a short key costs to hash.
    pub fn new(rule: &[u8], key: &[u8]) -> Self {
        Self::from_u128(xxh3_128_with_seed(key, xxh3_64(rule)))
    }

    /// The bucket of key bytes that already carry their rule (what clients send, and what the
    /// cluster routes by): `new(b"", key)` without hashing the empty rule each time.
    pub fn for_key(key: &[u8]) -> Self {
        Self::from_u128(xxh3_128_with_seed(key, EMPTY_RULE_SEED))
    }

    /// Builds a key from a 128-bit hash computed elsewhere (e.g. sent over the wire). Every key
    /// is built here, so no key has a zero `hash`: the store's GCRA table marks empty slots with
    /// it, and a key that had one would be lost in its own slot. A zero is mapped to a fixed
    /// stand-in (sharing a bucket with the one key that has the stand-in and the same `check`:
    /// as likely as any other 96-bit collision).
    #[inline]
    pub fn from_u128(digest: u128) -> Self {
        // Truncations are intended: low 64 bits and the next 32.
        let hash = match digest as u64 {
            0 => ZERO_HASH_STAND_IN,
            hash => hash,
        };
        BucketKey {
            hash,
            check: (digest >> 64) as u32,
        }
    }

    /// The cluster slot of this bucket (0..4096): the top 12 bits of `check`, independent of the
    /// bits that pick the store shard (the low ones) and the table slot (`hash`).
    pub fn slot(self) -> u16 {
        (self.check >> 20) as u16
    }

    /// The 96 significant bits, for the wire and for logs.
    pub fn to_u128(self) -> u128 {
        u128::from(self.hash) | (u128::from(self.check) << 64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn for_key_is_the_key_under_the_empty_rule() {
        assert_eq!(EMPTY_RULE_SEED, xxh3_64(b""));
        assert_eq!(
            BucketKey::for_key(b"user:42"),
            BucketKey::new(b"", b"user:42")
        );
    }

    #[test]
    fn no_key_has_a_zero_hash() {
        let key = BucketKey::from_u128(7 << 64);
        assert_ne!(key.hash, 0);
        assert_eq!(key.check, 7);
        assert_eq!(key.slot(), BucketKey::from_u128(7 << 64 | 1).slot());
    }
}
