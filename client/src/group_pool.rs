//! Check groups as sent, with their key buffers, pooled per node: a call fills a group from the
//! pool and the stream task gives it back once the frame is out, so a warm client allocates no
//! group and no key per call.

use crossbeam_queue::ArrayQueue;
use floodgate::check::Check;
use floodgate::wire::WireCheck;

/// Most groups kept per node: enough for every call in flight at a few thousand concurrent
/// callers; beyond it a returned group is freed.
const POOLED_GROUPS: usize = 4_096;
/// Most spare key buffers kept per node (those of checks a shorter call cut from a group).
const POOLED_KEYS: usize = 4 * POOLED_GROUPS;

/// Lock-free pools (every caller and stream task of a node takes from them): groups, and the
/// key buffers of checks cut from a group, so a group that served a one-check call serves a
/// three-check call next without allocating its keys.
#[derive(Debug)]
pub(crate) struct GroupPool {
    groups: ArrayQueue<Vec<WireCheck>>,
    keys: ArrayQueue<Vec<u8>>,
}

impl Default for GroupPool {
    fn default() -> Self {
        GroupPool {
            groups: ArrayQueue::new(POOLED_GROUPS),
            keys: ArrayQueue::new(POOLED_KEYS),
        }
    }
}

impl GroupPool {
    /// `checks` as a group to send (marked as a takeover when `takeover`), written over a
    /// pooled group's checks and key buffers.
    pub(crate) fn fill(&self, checks: &[Check], takeover: bool) -> Vec<WireCheck> {
        let mut group = self.groups.pop().unwrap_or_default();
        if group.len() > checks.len() {
            for cut in group.drain(checks.len()..) {
                let _ = self.keys.push(cut.key);
            }
        }
        for (i, check) in checks.iter().enumerate() {
            // `Vec::new()` allocates nothing: the key bytes go into a reused buffer below.
            let fresh = WireCheck {
                takeover,
                ..WireCheck::new(Vec::new(), &check.limit, check.cost)
            };
            let wire = match group.get_mut(i) {
                Some(wire) => wire,
                None => {
                    group.push(fresh.clone());
                    &mut group[i]
                }
            };
            let mut key = std::mem::take(&mut wire.key);
            if key.capacity() == 0 {
                key = self.keys.pop().unwrap_or_default();
            }
            key.clear();
            key.extend_from_slice(&check.key);
            *wire = WireCheck { key, ..fresh };
        }
        group
    }

    /// Gives a sent group back for the next call.
    pub(crate) fn give_back(&self, group: Vec<WireCheck>) {
        let _ = self.groups.push(group);
    }
}

#[cfg(test)]
mod tests {
    use floodgate::Limit;

    use super::*;

    fn checks(keys: &[&str], limit: Limit) -> Vec<Check> {
        keys.iter().map(|k| Check::new(*k, limit)).collect()
    }

    #[test]
    fn a_group_is_written_over_in_place_and_cut_to_the_call() {
        let pool = GroupPool::default();
        let limit = Limit::gcra(10, 1_000_000_000, 10).unwrap();
        let other = Limit::gcra(5, 1_000_000_000, 7).unwrap();
        let three = pool.fill(&checks(&["a-long-key", "b", "c"], limit), true);
        assert_eq!(three.len(), 3);
        assert!(three.iter().all(|c| c.takeover));
        let first_key = three[0].key.as_ptr();
        pool.give_back(three);
        let one = pool.fill(&[Check::new("x", other).cost(2)], false);
        assert_eq!(one, [WireCheck::new("x", &other, 2)]);
        // The first check's key buffer was reused, not replaced.
        assert_eq!(one[0].key.as_ptr(), first_key);
    }

    #[test]
    fn keys_cut_from_a_group_serve_the_next_longer_call() {
        let pool = GroupPool::default();
        let limit = Limit::gcra(10, 1_000_000_000, 10).unwrap();
        let three = pool.fill(&checks(&["k1", "k2", "k3"], limit), false);
        let cut: Vec<*const u8> = three[1..].iter().map(|c| c.key.as_ptr()).collect();
        pool.give_back(three);
        let one = pool.fill(&checks(&["k4"], limit), false);
        pool.give_back(one);
        let again = pool.fill(&checks(&["k5", "k6", "k7"], limit), false);
        let reused: Vec<*const u8> = again[1..].iter().map(|c| c.key.as_ptr()).collect();
        assert_eq!(reused.len(), 2);
        assert!(reused.iter().all(|p| cut.contains(p)), "{reused:?} {cut:?}");
        assert_eq!(again[2].key, b"k7");
    }
}
