//! Linear probing over a power-of-two slice of slots, shared by the tables that keep their keys
//! in their slots (the store's GCRA buckets, an outbox's per-key counts): a lookup walks from
//! the key's home slot to the key or the first empty slot, and a removal shifts the rest of
//! the probe run back, so no tombstones build up and no lookup breaks.

/// The first slot from `start` (walking on, wrapping) for which `is` holds, or `None` at the
/// first empty one. The slots are never all full (the tables grow before).
#[inline]
pub(crate) fn find<T>(
    slots: &[T],
    start: usize,
    is: impl Fn(&T) -> bool,
    is_empty: impl Fn(&T) -> bool,
) -> Option<usize> {
    let mask = slots.len() - 1;
    let mut i = start & mask;
    loop {
        let slot = &slots[i];
        if is(slot) {
            return Some(i);
        }
        if is_empty(slot) {
            return None;
        }
        i = (i + 1) & mask;
    }
}

/// The first empty slot from `start` (walking on, wrapping): where a new key goes. The slots are
/// never all full.
#[inline]
pub(crate) fn first_empty<T>(slots: &[T], start: usize, is_empty: impl Fn(&T) -> bool) -> usize {
    let mask = slots.len() - 1;
    let mut i = start & mask;
    while !is_empty(&slots[i]) {
        i = (i + 1) & mask;
    }
    i
}

/// Empties the occupied slot `hole`, moving back each later slot of its run whose `home` (the
/// slot its probe starts at, masked here as `find` masks its start) does not lie cyclically in
/// (hole, slot], so every key stays reachable from its home.
pub(crate) fn remove_at<T: Default>(
    slots: &mut [T],
    mut hole: usize,
    home: impl Fn(&T) -> usize,
    is_empty: impl Fn(&T) -> bool,
) {
    let mask = slots.len() - 1;
    let mut next = hole;
    loop {
        next = (next + 1) & mask;
        if is_empty(&slots[next]) {
            break;
        }
        let home = home(&slots[next]) & mask;
        let stays = if hole <= next {
            hole < home && home <= next
        } else {
            hole < home || home <= next
        };
        if !stays {
            slots.swap(hole, next);
            hole = next;
        }
    }
    slots[hole] = T::default();
}
