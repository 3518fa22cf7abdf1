//! The admission times a sliding log holds, oldest first: up to [`INLINE`] in place, more on
//! the heap. Most keys of a per-user or per-IP limit admit a few times a period, and a log
//! checked cold then costs one cache miss (its slot) instead of two (its slot, then its times).

use std::collections::VecDeque;
use std::iter::Chain;
use std::slice::Iter;

/// Times held in place: as many as a new log has room for.
pub const INLINE: usize = 4;

#[derive(Debug, Clone)]
pub(super) enum Times {
    /// The times in `times[..len]`, oldest first.
    Inline { len: u8, times: [u64; INLINE] },
    /// Once more than [`INLINE`] were needed; it stays on the heap until the log is dropped.
    Heap(VecDeque<u64>),
}

impl Default for Times {
    fn default() -> Self {
        Times::Inline {
            len: 0,
            times: [0; INLINE],
        }
    }
}

/// The same times, wherever they are kept.
impl PartialEq for Times {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for Times {}

impl From<Vec<u64>> for Times {
    fn from(times: Vec<u64>) -> Self {
        if times.len() <= INLINE {
            let mut inline = Times::default();
            times.into_iter().for_each(|t| inline.push_back(t));
            inline
        } else {
            Times::Heap(times.into())
        }
    }
}

impl FromIterator<u64> for Times {
    fn from_iter<I: IntoIterator<Item = u64>>(iter: I) -> Self {
        Times::from(iter.into_iter().collect::<Vec<u64>>())
    }
}

impl Times {
    /// Empty, with room for `room` times (in place when they fit).
    pub(super) fn with_room(room: usize) -> Self {
        if room <= INLINE {
            Times::default()
        } else {
            Times::Heap(VecDeque::with_capacity(room))
        }
    }

    fn as_slices(&self) -> (&[u64], &[u64]) {
        match self {
            Times::Inline { len, times } => (&times[..usize::from(*len)], &[]),
            Times::Heap(times) => times.as_slices(),
        }
    }

    pub(super) fn iter(&self) -> Chain<Iter<'_, u64>, Iter<'_, u64>> {
        let (older, newer) = self.as_slices();
        older.iter().chain(newer)
    }

    pub(super) fn len(&self) -> usize {
        match self {
            Times::Inline { len, .. } => usize::from(*len),
            Times::Heap(times) => times.len(),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `i`-th oldest time.
    pub(super) fn get(&self, i: usize) -> Option<u64> {
        match self {
            Times::Inline { len, times } => times[..usize::from(*len)].get(i).copied(),
            Times::Heap(times) => times.get(i).copied(),
        }
    }

    pub(super) fn back(&self) -> Option<u64> {
        self.len().checked_sub(1).and_then(|last| self.get(last))
    }

    /// Times it holds without growing.
    pub(super) fn room(&self) -> usize {
        match self {
            Times::Inline { .. } => INLINE,
            Times::Heap(times) => times.capacity(),
        }
    }

    /// Times it has room for on the heap (none while they are in place).
    pub(super) fn heap_room(&self) -> usize {
        match self {
            Times::Inline { .. } => 0,
            Times::Heap(times) => times.capacity(),
        }
    }

    /// The heap room of times made or grown to hold `room` (none while they fit in place).
    pub(super) fn heap_room_for(room: usize) -> usize {
        if room <= INLINE { 0 } else { room }
    }

    /// Appends `count` copies of `t` (a time no older than the newest held).
    pub(super) fn push_n(&mut self, t: u64, count: usize) {
        if let Times::Inline { len, times } = self {
            let at = usize::from(*len);
            if at + count <= INLINE {
                times[at..at + count].fill(t);
                *len += count as u8; // at most INLINE
                return;
            }
            // Past the room in place: on the heap from now on, grown as a `VecDeque` grows.
            self.spill((at + count).max(2 * INLINE));
        }
        if let Times::Heap(times) = self {
            times.extend(std::iter::repeat_n(t, count));
        }
    }

    fn push_back(&mut self, t: u64) {
        self.push_n(t, 1);
    }

    /// Drops the `count` oldest times (all of them if fewer).
    pub(super) fn drop_oldest(&mut self, count: usize) {
        match self {
            Times::Inline { len, times } => {
                let held = usize::from(*len);
                let count = count.min(held);
                times.copy_within(count..held, 0);
                *len -= count as u8; // at most INLINE
            }
            Times::Heap(times) => {
                times.drain(..count.min(times.len()));
            }
        }
    }

    /// Keeps the `keep` oldest times.
    pub(super) fn truncate(&mut self, keep: usize) {
        match self {
            Times::Inline { len, .. } => *len = (*len).min(u8::try_from(keep).unwrap_or(u8::MAX)),
            Times::Heap(times) => times.truncate(keep),
        }
    }

    /// Makes room for `additional` times beyond those held, exactly.
    pub(super) fn reserve_exact(&mut self, additional: usize) {
        let wanted = self.len() + additional;
        match self {
            Times::Inline { .. } if wanted <= INLINE => {}
            Times::Inline { .. } => self.spill(wanted),
            Times::Heap(times) => times.reserve_exact(additional),
        }
    }

    /// Moves the times held in place to the heap, with room for `room`.
    fn spill(&mut self, room: usize) {
        let mut heap = VecDeque::with_capacity(room);
        heap.extend(self.iter().copied());
        *self = Times::Heap(heap);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every operation agrees with a plain `VecDeque`, before and after the move to the heap.
    #[test]
    fn behaves_like_a_deque() {
        let mut times = Times::default();
        let mut model: VecDeque<u64> = VecDeque::new();
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut now = 0;
        for step in 0..5_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            match x % 5 {
                0 | 1 => {
                    now += x % 3;
                    let count = (x >> 8) as usize % 3;
                    times.push_n(now, count);
                    model.extend(std::iter::repeat_n(now, count));
                }
                2 => {
                    let count = (x >> 8) as usize % 3;
                    times.drop_oldest(count);
                    model.drain(..count.min(model.len()));
                }
                3 => {
                    let keep = (x >> 8) as usize % 6;
                    times.truncate(keep);
                    model.truncate(keep);
                }
                _ => {
                    let additional = (x >> 8) as usize % 4;
                    times.reserve_exact(additional);
                    assert!(times.room() >= model.len() + additional, "step {step}");
                }
            }
            assert!(
                times.iter().copied().eq(model.iter().copied()),
                "step {step}"
            );
            assert_eq!(times.len(), model.len());
            assert_eq!(times.get(0), model.front().copied());
            assert_eq!(times.back(), model.back().copied());
            assert_eq!(times.get(1), model.get(1).copied());
        }
        assert!(
            matches!(times, Times::Heap(_)),
            "the walk must have needed the heap for this test to mean anything"
        );
    }

    #[test]
    fn a_few_times_stay_in_place_and_more_go_to_the_heap() {
        let mut times = Times::with_room(INLINE);
        times.push_n(7, INLINE);
        assert_eq!((times.heap_room(), times.room()), (0, INLINE));
        times.reserve_exact(4);
        assert_eq!(times.heap_room(), INLINE + 4);
        assert_eq!(Times::with_room(INLINE + 1).heap_room(), INLINE + 1);
        assert_eq!(Times::from(vec![1, 2, 3]).heap_room(), 0);
        assert_eq!(Times::from(vec![1, 2, 3]), Times::from_iter([1, 2, 3]));
        assert!(Times::from(vec![1; INLINE + 1]).heap_room() > INLINE);
    }
}
