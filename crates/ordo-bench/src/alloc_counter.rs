//! A counting global allocator.
//!
//! Wraps [`System`] and counts, with relaxed atomics, every allocation
//! (`alloc`, `alloc_zeroed` and `realloc` each count as one) and the number of
//! live heap bytes. The harness reads the allocation count around each timed
//! operation; the live-byte count is used for the memory figures of
//! `many-lists`. Nothing here asserts: an allocation on a hot path is a
//! number in the report, not an error.
//!
//! The allocator is installed as the `#[global_allocator]` by the library
//! (see `lib.rs`), so it is active in the benchmark binary and in the tests.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);

/// The counting allocator; see the module documentation.
#[derive(Debug, Default, Clone, Copy)]
pub struct CountingAlloc;

// SAFETY: every method forwards to `System` with the arguments it was given;
// the counters have no effect on the memory handed out.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            ALLOCS.fetch_add(1, Relaxed);
            LIVE_BYTES.fetch_add(layout.size() as i64, Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            ALLOCS.fetch_add(1, Relaxed);
            LIVE_BYTES.fetch_add(layout.size() as i64, Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        LIVE_BYTES.fetch_sub(layout.size() as i64, Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            ALLOCS.fetch_add(1, Relaxed);
            LIVE_BYTES.fetch_add(new_size as i64 - layout.size() as i64, Relaxed);
        }
        p
    }
}

/// Number of allocations (alloc, alloc_zeroed, realloc) since the start of
/// the process.
#[inline]
pub fn allocations() -> u64 {
    ALLOCS.load(Relaxed)
}

/// Heap bytes currently allocated through the global allocator (requested
/// sizes, not counting the allocator's own overhead).
#[inline]
pub fn live_bytes() -> i64 {
    LIVE_BYTES.load(Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_allocations_and_live_bytes() {
        // Other tests run in parallel threads, so only check monotonic facts
        // that hold regardless of what they do.
        let before = allocations();
        let v: Vec<u8> = Vec::with_capacity(1 << 20);
        let after = allocations();
        assert!(after > before);
        assert!(live_bytes() >= (1 << 20));
        drop(v);
    }
}
