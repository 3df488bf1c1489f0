//! Frame bodies (the JSON array of one window change's diffs) recycled through
//! a bounded pool, so that encoding a frame allocates nothing once the server
//! runs steadily.
//!
//! A body is shared by every subscriber of its window and kept by each one's
//! resume retention, so the thread that drops it last (usually a network thread
//! evicting it from a retention ring, long after the writer made it) is the one
//! that can reuse it. That holder puts the whole `Arc` back, its count block
//! included, in a lock-free queue of bodies of its size class; the writer
//! thread takes one from there for each new body. A plain free-list of byte
//! buffers would still allocate an `Arc` per body.
//!
//! Everything is bounded: a body over `FRAME_BODY_POOLED_BYTES_MAX` is never
//! pooled, and each class keeps at most `FRAME_BODY_POOL_BYTES_PER_CLASS` of
//! bodies (and at most `FRAME_BODY_POOL_ENTRIES_PER_CLASS_MAX` of them). A body's
//! capacity is its class's size, at most twice its length (or the smallest
//! class, `FRAME_BODY_CLASS_BYTES_MIN`).
//!
//! The last holder is the one that finds the `Arc` unique (`Arc::get_mut`)
//! when it drops it. Two holders dropping theirs at the same instant may both
//! see the other's reference; then neither recycles and the body is freed as
//! any `Arc` is: a lost reuse, never a shared buffer.

use std::ops::Deref;
use std::sync::{Arc, LazyLock};

use crossbeam_queue::ArrayQueue;

use crate::metrics::{self, METRICS};

/// The smallest body capacity handed out: classes double from here.
pub const FRAME_BODY_CLASS_BYTES_MIN: usize = 128;
/// Bodies up to this many bytes come from the pool and go back to it; larger
/// ones (a big window's reset) are allocated at their size and freed.
pub const FRAME_BODY_POOLED_BYTES_MAX: usize = 64 * 1024;
/// Bytes of bodies each size class keeps for reuse at most.
pub const FRAME_BODY_POOL_BYTES_PER_CLASS: usize = 1024 * 1024;
/// Bodies each size class keeps for reuse at most (the small classes' bound).
pub const FRAME_BODY_POOL_ENTRIES_PER_CLASS_MAX: usize = 4096;

/// 128 B, 256 B, ... 64 KiB.
const N_CLASSES: usize =
    (FRAME_BODY_POOLED_BYTES_MAX.trailing_zeros() - FRAME_BODY_CLASS_BYTES_MIN.trailing_zeros()) as usize + 1;

const _: () = assert!(FRAME_BODY_CLASS_BYTES_MIN.is_power_of_two() && FRAME_BODY_POOLED_BYTES_MAX.is_power_of_two());
const _: () = assert!(FRAME_BODY_CLASS_BYTES_MIN << (N_CLASSES - 1) == FRAME_BODY_POOLED_BYTES_MAX);

type Pooled = Arc<Vec<u8>>;

/// The idle bodies of each size class, process-wide: a body may be made by one
/// server's writer and dropped by any thread.
static POOL: LazyLock<[ArrayQueue<Pooled>; N_CLASSES]> =
    LazyLock::new(|| std::array::from_fn(|class| ArrayQueue::new(class_entries_max(class))));

fn class_bytes(class: usize) -> usize {
    FRAME_BODY_CLASS_BYTES_MIN << class
}

fn class_entries_max(class: usize) -> usize {
    (FRAME_BODY_POOL_BYTES_PER_CLASS / class_bytes(class)).clamp(1, FRAME_BODY_POOL_ENTRIES_PER_CLASS_MAX)
}

/// The class whose bodies hold `len` bytes, if such a body is pooled.
fn class_for_len(len: usize) -> Option<usize> {
    if len > FRAME_BODY_POOLED_BYTES_MAX {
        return None;
    }
    let capacity = len.max(FRAME_BODY_CLASS_BYTES_MIN).next_power_of_two();
    Some((capacity.trailing_zeros() - FRAME_BODY_CLASS_BYTES_MIN.trailing_zeros()) as usize)
}

/// The class a body of `capacity` came from (only class-sized bodies go back).
fn class_for_capacity(capacity: usize) -> Option<usize> {
    let class = class_for_len(capacity)?;
    (class_bytes(class) == capacity).then_some(class)
}

/// One window change's diffs as a JSON array, shared by every subscriber of the
/// window and by each one's resume retention; cloning it allocates nothing.
#[derive(Clone, Debug)]
pub struct FrameBody {
    /// `None` only while the body is being dropped.
    bytes: Option<Pooled>,
}

impl FrameBody {
    /// A body holding a copy of `bytes`, in a recycled buffer when one of its
    /// size is idle (counted in `ordo_frame_body_pool_misses_total` otherwise).
    pub fn copy_from(bytes: &[u8]) -> FrameBody {
        let Some(class) = class_for_len(bytes.len()) else {
            metrics::add(&METRICS.frame_body_pool_misses, 1);
            return FrameBody { bytes: Some(Arc::new(bytes.to_vec())) };
        };
        let mut pooled = match POOL[class].pop() {
            Some(pooled) => pooled,
            None => {
                metrics::add(&METRICS.frame_body_pool_misses, 1);
                Arc::new(Vec::with_capacity(class_bytes(class)))
            }
        };
        match Arc::get_mut(&mut pooled) {
            Some(buffer) => {
                buffer.clear();
                buffer.extend_from_slice(bytes);
            }
            // Cannot happen: only a unique `Arc` is put back, and none is cloned in the pool.
            None => pooled = Arc::new(bytes.to_vec()),
        }
        FrameBody { bytes: Some(pooled) }
    }
}

impl Deref for FrameBody {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.bytes.as_deref().map_or(&[], Vec::as_slice)
    }
}

impl Drop for FrameBody {
    fn drop(&mut self) {
        let Some(mut pooled) = self.bytes.take() else { return };
        // Unique: every other holder has dropped its copy, and none can appear.
        let Some(buffer) = Arc::get_mut(&mut pooled) else { return };
        let Some(class) = class_for_capacity(buffer.capacity()) else { return };
        buffer.clear();
        // A full class frees the body (the pool's bound).
        let _ = POOL[class].push(pooled);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_double_from_the_smallest_to_the_largest_pooled_size() {
        assert_eq!(class_for_len(0), Some(0));
        assert_eq!(class_for_len(FRAME_BODY_CLASS_BYTES_MIN), Some(0));
        assert_eq!(class_for_len(FRAME_BODY_CLASS_BYTES_MIN + 1), Some(1));
        assert_eq!(class_for_len(FRAME_BODY_POOLED_BYTES_MAX), Some(N_CLASSES - 1));
        assert_eq!(class_for_len(FRAME_BODY_POOLED_BYTES_MAX + 1), None);
        for class in 0..N_CLASSES {
            assert_eq!(class_for_capacity(class_bytes(class)), Some(class));
            assert_eq!(class_for_capacity(class_bytes(class) + 1), None);
            assert!(class_entries_max(class) * class_bytes(class) <= FRAME_BODY_POOL_BYTES_PER_CLASS);
        }
    }

    #[test]
    fn a_body_holds_its_bytes_and_its_copies_share_them() {
        let body = FrameBody::copy_from(b"[{\"Clear\":{}}]");
        let copy = body.clone();
        assert_eq!(&*copy, b"[{\"Clear\":{}}]");
        assert_eq!(copy.as_ptr(), body.as_ptr());
        drop(body);
        assert_eq!(&*copy, b"[{\"Clear\":{}}]", "a copy outlives the body it was cloned from");
        let large = vec![b'x'; FRAME_BODY_POOLED_BYTES_MAX + 1];
        assert_eq!(&*FrameBody::copy_from(&large), &large[..]);
    }

    #[test]
    fn a_body_dropped_by_its_last_holder_is_reused_with_its_buffer() {
        // The 16 KiB class: no other test of this binary makes frames that large, so no
        // other thread takes this body from the pool first.
        let bytes = vec![b'a'; 12 * 1024];
        let body = FrameBody::copy_from(&bytes);
        let copy = body.clone();
        let pointer = body.as_ptr();
        drop(body);
        drop(copy);
        let again = FrameBody::copy_from(&bytes[..9000]);
        assert_eq!(again.as_ptr(), pointer, "the buffer came back from the pool");
        assert_eq!(again.len(), 9000);
    }
}
