//! A counting global allocator.
//!
//! Wraps [`System`] and counts every allocation (`alloc`, `alloc_zeroed` and
//! `realloc` each count as one) twice: for the whole process, with relaxed
//! atomics, and for the calling thread, in a thread-local, so tests running in
//! parallel threads do not disturb each other's counts. It also keeps the heap
//! bytes in use (requested sizes, without the allocator's own overhead), for
//! the process and for the thread. Nothing here asserts.
//!
//! A test binary or a benchmark installs it with
//! `#[global_allocator] static GLOBAL: CountingAllocator = CountingAllocator;`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);

thread_local! {
    static ALLOCATIONS_ON_THIS_THREAD: Cell<u64> = const { Cell::new(0) };
    static HEAP_BYTES_ON_THIS_THREAD: Cell<i64> = const { Cell::new(0) };
}

/// The counting allocator; see the module documentation.
#[derive(Debug, Default, Clone, Copy)]
pub struct CountingAllocator;

// SAFETY: every method forwards to `System` with the arguments it was given and
// returns its result; counting touches only atomics and const-initialised
// thread-local `Cell`s, which never allocate, so it cannot recurse into the
// allocator, and it has no effect on the memory handed out.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: our caller upholds `alloc`'s contract, which we pass through.
        let pointer = unsafe { System.alloc(layout) };
        if !pointer.is_null() {
            count_allocation(layout.size() as i64);
        }
        pointer
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: our caller upholds `alloc_zeroed`'s contract, which we pass through.
        let pointer = unsafe { System.alloc_zeroed(layout) };
        if !pointer.is_null() {
            count_allocation(layout.size() as i64);
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: `pointer` came from `System` through this allocator, with `layout`.
        unsafe { System.dealloc(pointer, layout) };
        add_live_bytes(-(layout.size() as i64));
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `pointer` came from `System` through this allocator, with `layout`;
        // the rest of `realloc`'s contract is our caller's, passed through.
        let new_pointer = unsafe { System.realloc(pointer, layout, new_size) };
        if !new_pointer.is_null() {
            count_allocation(new_size as i64 - layout.size() as i64);
        }
        new_pointer
    }
}

fn count_allocation(byte_delta: i64) {
    ALLOCATIONS.fetch_add(1, Relaxed);
    // `try_with`: a thread's last allocations may come after its thread-locals are gone.
    let _ = ALLOCATIONS_ON_THIS_THREAD.try_with(|count| count.set(count.get() + 1));
    add_live_bytes(byte_delta);
}

fn add_live_bytes(delta: i64) {
    LIVE_BYTES.fetch_add(delta, Relaxed);
    let _ = HEAP_BYTES_ON_THIS_THREAD.try_with(|bytes| bytes.set(bytes.get() + delta));
}

/// Allocations by the whole process since it started.
#[inline]
pub fn allocations() -> u64 {
    ALLOCATIONS.load(Relaxed)
}

/// Heap bytes the whole process holds through this allocator.
#[inline]
pub fn live_bytes() -> i64 {
    LIVE_BYTES.load(Relaxed)
}

/// Allocations by the calling thread since it started.
pub fn allocations_on_this_thread() -> u64 {
    ALLOCATIONS_ON_THIS_THREAD.with(Cell::get)
}

/// Heap bytes allocated and not yet freed by the calling thread. Memory freed by
/// another thread skews it, so measure code that runs on one thread.
pub fn heap_bytes_on_this_thread() -> i64 {
    HEAP_BYTES_ON_THIS_THREAD.with(Cell::get)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[global_allocator]
    static GLOBAL: CountingAllocator = CountingAllocator;

    #[test]
    fn counts_allocations_and_live_bytes() {
        // Other tests run in parallel threads, so the process-wide figures are
        // only checked for what holds whatever they do.
        let (before, before_on_this_thread, bytes_before) =
            (allocations(), allocations_on_this_thread(), heap_bytes_on_this_thread());
        let buffer: Vec<u8> = Vec::with_capacity(1 << 20);
        assert!(allocations() > before);
        assert_eq!(allocations_on_this_thread(), before_on_this_thread + 1);
        assert_eq!(heap_bytes_on_this_thread(), bytes_before + (1 << 20));
        assert!(live_bytes() >= (1 << 20));
        drop(buffer);
        assert_eq!(heap_bytes_on_this_thread(), bytes_before);
    }
}
