//! Check groups as sent. A call's group is written over the one its caller sent last: the stream
//! task hands each group back with its answer, into the caller's reply slot, so a warm client
//! allocates no group and no key per call, and no pool shared by every caller sits on the path.
//! Key buffers a shorter call cut from its group are kept per node for a longer call's.

use crossbeam_queue::ArrayQueue;
use floodgate::check::Check;
use floodgate::wire::WireCheck;

/// Most spare key buffers kept per node; beyond it a cut key is freed.
const SPARE_KEYS: usize = 16_384;

/// Key buffers of checks cut from a group (lock-free: every caller of a node may take from it).
#[derive(Debug)]
pub(crate) struct SpareKeys(ArrayQueue<Vec<u8>>);

impl Default for SpareKeys {
    fn default() -> Self {
        SpareKeys(ArrayQueue::new(SPARE_KEYS))
    }
}

impl SpareKeys {
    /// `checks` as a group to send (marked as a takeover when `takeover`), written over
    /// `group`'s checks and key buffers.
    pub(crate) fn fill(
        &self,
        mut group: Vec<WireCheck>,
        checks: &[Check],
        takeover: bool,
    ) -> Vec<WireCheck> {
        if group.len() > checks.len() {
            for cut in group.drain(checks.len()..) {
                let _ = self.0.push(cut.key);
            }
        }
        for (i, check) in checks.iter().enumerate() {
            // `Vec::new()` allocates nothing: the key bytes go into a reused buffer below.
            let fresh = WireCheck {
                takeover,
                peek: check.peek,
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
                key = self.0.pop().unwrap_or_default();
            }
            key.clear();
            key.extend_from_slice(&check.key);
            *wire = WireCheck { key, ..fresh };
        }
        group
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
        let spare = SpareKeys::default();
        let limit = Limit::gcra(10, 1_000_000_000, 10).unwrap();
        let other = Limit::gcra(5, 1_000_000_000, 7).unwrap();
        let three = spare.fill(Vec::new(), &checks(&["a-long-key", "b", "c"], limit), true);
        assert_eq!(three.len(), 3);
        assert!(three.iter().all(|c| c.takeover));
        let first_key = three[0].key.as_ptr();
        let one = spare.fill(three, &[Check::new("x", other).cost(2)], false);
        assert_eq!(one, [WireCheck::new("x", &other, 2)]);
        // The first check's key buffer was reused, not replaced.
        assert_eq!(one[0].key.as_ptr(), first_key);
    }

    #[test]
    fn keys_cut_from_a_group_serve_the_next_longer_call() {
        let spare = SpareKeys::default();
        let limit = Limit::gcra(10, 1_000_000_000, 10).unwrap();
        let three = spare.fill(Vec::new(), &checks(&["k1", "k2", "k3"], limit), false);
        let cut: Vec<*const u8> = three[1..].iter().map(|c| c.key.as_ptr()).collect();
        let one = spare.fill(three, &checks(&["k4"], limit), false);
        let again = spare.fill(one, &checks(&["k5", "k6", "k7"], limit), false);
        let reused: Vec<*const u8> = again[1..].iter().map(|c| c.key.as_ptr()).collect();
        assert_eq!(reused.len(), 2);
        assert!(reused.iter().all(|p| cut.contains(p)), "{reused:?} {cut:?}");
        assert_eq!(again[2].key, b"k7");
    }
}
