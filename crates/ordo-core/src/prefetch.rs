//! Cache hints: ask for a line ahead of its use, so that a loop over cold
//! per-item state (every member's list, for one message) keeps many misses in
//! flight instead of waiting for each in turn. A hint changes no result: it
//! neither faults nor writes, and a wrong or useless one costs only bandwidth.

/// Asks the CPU to bring the cache line holding `value`'s first byte into every
/// cache level. A no-op where no prefetch instruction is known.
#[inline(always)]
pub(crate) fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        let pointer = (value as *const T).cast::<i8>();
        // SAFETY: `_mm_prefetch` is only a hint: it reads nothing into the program,
        // never faults (not even on an invalid address) and writes nothing; the
        // pointer comes from a live reference anyway. SSE, which it needs, is part
        // of every x86_64 CPU.
        unsafe { core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(pointer) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

/// Bytes of one cache line on the CPUs Ordo targets.
const CACHE_LINE_BYTES: usize = 64;

/// Asks for the first `n_lines_max` cache lines of `items` (all of them when fewer).
#[inline]
pub(crate) fn prefetch_lines<T>(items: &[T], n_lines_max: usize) {
    let n_bytes = std::mem::size_of_val(items).min(n_lines_max * CACHE_LINE_BYTES);
    let first = items.as_ptr().cast::<u8>();
    for offset in (0..n_bytes).step_by(CACHE_LINE_BYTES) {
        // SAFETY: `offset < n_bytes <= size_of_val(items)`, so the address lies in
        // `items`, one allocation, whose bytes the reference makes readable.
        prefetch(unsafe { &*first.add(offset) });
    }
}
