//! A cache hint: start loading the line at an address without waiting for it, so the misses of
//! a pass over cold keys overlap instead of adding up (the crate's one use of `unsafe` for it),
//! and which items of such a pass to prefetch when.

use std::ops::Range;

/// Items prefetched together, one burst ahead of those being worked on.
pub const PREFETCH_BURST: usize = 8;

/// For a pass over `len` items, at item `i`: the items whose lines to start loading now. At
/// every `PREFETCH_BURST`-th item, the burst after `i`'s (and at the start, the first burst
/// too), so the misses of a burst overlap while the one before it is worked on; empty
/// otherwise.
pub fn burst_ahead(i: usize, len: usize) -> Range<usize> {
    if !i.is_multiple_of(PREFETCH_BURST) {
        return 0..0;
    }
    let from = if i == 0 { 0 } else { i + PREFETCH_BURST };
    let to = (i + 2 * PREFETCH_BURST).min(len);
    from.min(to)..to
}

/// Asks the CPU to start loading the cache line holding `addr`. A hint only: nothing is read,
/// so any address (stale, dangling, or past a table's end) is harmless.
#[inline]
pub(crate) fn prefetch(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is a hint that never faults and has no architectural effect, whatever
    // the address; SSE is part of the x86_64 baseline.
    #[allow(unsafe_code)]
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(addr as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_goes_out_at_the_start_of_each_one_for_the_burst_after() {
        assert_eq!(
            burst_ahead(0, 100),
            0..16,
            "the first two bursts at the start"
        );
        assert_eq!(burst_ahead(8, 100), 16..24);
        assert!(burst_ahead(3, 100).is_empty(), "nothing between bursts");
        assert_eq!(burst_ahead(88, 100), 96..100, "clipped at the end");
        assert!(burst_ahead(96, 100).is_empty());
        assert_eq!(burst_ahead(0, 5), 0..5);
    }
}
