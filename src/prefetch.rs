//! A cache hint: start loading the line at an address without waiting for it, so the misses of
//! a pass over cold keys overlap instead of adding up. The crate's one use of `unsafe` for it.

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
