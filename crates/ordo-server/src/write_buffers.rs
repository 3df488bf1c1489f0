//! Batch buffers and result lists that came back from the writer thread, kept
//! for this network thread's next writes (go-capnp's reused segments): in a
//! steady stream of writes, building a batch allocates nothing, and neither
//! does the writer's answer. Bounded in count and in size.

use std::cell::RefCell;

use ordo_core::{Batch, CollectionId};

use crate::limits::{MAX_POOLED_BATCHES, MAX_POOLED_BATCH_BYTES, MAX_POOLED_LIST_PARTS, MAX_POOLED_PART_LISTS};
use crate::writer::WriteResults;

#[derive(Default)]
struct Pool {
    batches: Vec<Batch>,
    lists: Vec<Vec<(CollectionId, Batch)>>,
    results: Vec<WriteResults>,
}

thread_local! {
    static POOL: RefCell<Pool> = RefCell::new(Pool::default());
}

/// An empty batch, with grown buffers when one is pooled.
pub fn take_batch() -> Batch {
    POOL.with(|pool| pool.borrow_mut().batches.pop()).unwrap_or_default()
}

/// An empty list of parts.
pub fn take_list() -> Vec<(CollectionId, Batch)> {
    POOL.with(|pool| pool.borrow_mut().lists.pop()).unwrap_or_default()
}

pub fn give_batch(mut batch: Batch) {
    // A batch grown by one huge write is not worth keeping.
    if batch.n_bytes() > MAX_POOLED_BATCH_BYTES {
        return;
    }
    batch.clear();
    POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        if pool.batches.len() < MAX_POOLED_BATCHES {
            pool.batches.push(batch);
        }
    });
}

/// Takes back a list's batches and the list itself.
pub fn give_list(mut list: Vec<(CollectionId, Batch)>) {
    for (_, batch) in list.drain(..) {
        give_batch(batch);
    }
    POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        if pool.lists.len() < MAX_POOLED_PART_LISTS && list.capacity() <= MAX_POOLED_LIST_PARTS {
            pool.lists.push(list);
        }
    });
}

/// An empty list with room for `n_parts` results, for the writer thread to answer
/// a write in. Sized here, so that the writer thread never grows it: a list given
/// back on another network thread (a task moves between them) leaves this one's
/// pool short, and then this thread allocates, not the writer.
pub fn take_results(n_parts: usize) -> WriteResults {
    let mut results = POOL.with(|pool| pool.borrow_mut().results.pop()).unwrap_or_default();
    results.reserve(n_parts);
    results
}

/// Takes back a write's results once they are answered, as long as a list of parts.
pub fn give_results(mut results: WriteResults) {
    results.clear();
    POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        if pool.results.len() < MAX_POOLED_PART_LISTS && results.capacity() <= MAX_POOLED_LIST_PARTS {
            pool.results.push(results);
        }
    });
}
