//! `Router`: which of the given nodes a call goes to before the cluster's slot table is known
//! (see `slots`), or with nodes that serve none.

use xxhash_rust::xxh3::xxh3_64;

/// Routes a call by a stable hash of its first key, so every gateway sends a key to the same
/// node (and so one bucket). Jump consistent hashing (Lamping & Veach, 2014) moves only 1/n of
/// the keys when a node is added at the end of the list. Only a fallback: once a node gives its
/// slot table, calls go to the owner of their first key's slot.
#[derive(Debug, Clone)]
pub(crate) struct Router {
    nodes: usize,
}

impl Router {
    /// A router over `nodes` nodes (at least one: the config validation guarantees it).
    pub(crate) fn new(nodes: usize) -> Self {
        Router {
            nodes: nodes.max(1),
        }
    }

    /// Index of the node that decides `key`.
    pub(crate) fn route(&self, key: &[u8]) -> usize {
        if self.nodes == 1 {
            return 0;
        }
        jump_hash(xxh3_64(key), self.nodes)
    }
}

/// Jump consistent hash: a bucket in `0..buckets` for `key`, stable as buckets are appended.
fn jump_hash(mut key: u64, buckets: usize) -> usize {
    let mut bucket: i64 = -1;
    let mut next: i64 = 0;
    let buckets = i64::try_from(buckets).unwrap_or(i64::MAX);
    while next < buckets {
        bucket = next;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        // The published algorithm's float arithmetic: exact enough, and fixed for all builds.
        next = ((bucket + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    // `bucket` ends in 0..buckets: the loop runs at least once since buckets >= 1.
    usize::try_from(bucket).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_stable_and_in_range() {
        let router = Router::new(3);
        for i in 0..1_000u32 {
            let key = format!("user:{i}");
            let node = router.route(key.as_bytes());
            assert!(node < 3);
            assert_eq!(node, router.route(key.as_bytes()));
        }
        assert_eq!(Router::new(1).route(b"anything"), 0);
    }

    #[test]
    fn keys_spread_over_nodes() {
        let router = Router::new(4);
        let mut counts = [0usize; 4];
        for i in 0..4_000u32 {
            counts[router.route(format!("k{i}").as_bytes())] += 1;
        }
        assert!(
            counts.iter().all(|&c| (800..1_200).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn adding_a_node_moves_only_keys_to_the_new_node() {
        let (three, four) = (Router::new(3), Router::new(4));
        let mut moved = 0;
        for i in 0..4_000u32 {
            let key = format!("k{i}");
            let (a, b) = (three.route(key.as_bytes()), four.route(key.as_bytes()));
            if a != b {
                assert_eq!(b, 3, "a key moved between old nodes");
                moved += 1;
            }
        }
        assert!((700..1_300).contains(&moved), "{moved}");
    }
}
