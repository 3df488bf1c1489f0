//! `LiveList<T>`: a window's items as an `imbl::Vector<T>` and its changes as a
//! stream of `Vec<eyeball_im::VectorDiff<T>>` batches, one per server frame.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};

use eyeball_im::VectorDiff;
use futures_core::Stream;
use imbl::Vector;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::mpsc::UnboundedSender;

use crate::live::Command;
use crate::protocol::ListSink;
use crate::wire::{decode_diffs, Ended};
use crate::Error;

/// Batches a stream may hold unread. Past it the stream's queue is replaced by one
/// `Reset` with the current items (as eyeball-im does for a lagging subscriber), so a
/// consumer that stops polling costs one list, not an unbounded queue.
pub const MAX_PENDING_BATCHES: usize = 64;

/// What a list knows besides its items.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListStatus {
    /// The last `seq` applied (0: no frame yet).
    pub seq: u64,
    /// The view's length, from the last frame that carried `total`.
    pub total: Option<u64>,
    /// The last `write_seq` a frame carried.
    pub write_seq: Option<u64>,
    /// Set when the server ended (or refused) the subscription: no frame follows.
    pub ended: Option<Ended>,
    /// The last refused request (`set_range`, `set_view`) or lost frame, as `code: message`.
    pub last_error: Option<String>,
    /// Frames whose window digest was not the list's (each made the list subscribe again).
    pub n_digest_mismatches: u64,
}

struct Queue<T> {
    batches: VecDeque<Vec<VectorDiff<T>>>,
    waker: Option<Waker>,
    closed: bool,
}

struct Inner<T> {
    items: Vector<T>,
    status: ListStatus,
    queues: Vec<Weak<Mutex<Queue<T>>>>,
    closed: bool,
}

pub(crate) struct Shared<T> {
    inner: Mutex<Inner<T>>,
}

impl<T: Clone> Shared<T> {
    pub(crate) fn new() -> Arc<Shared<T>> {
        let inner = Inner { items: Vector::new(), status: ListStatus::default(), queues: Vec::new(), closed: false };
        Arc::new(Shared { inner: Mutex::new(inner) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<T>> {
        // A panic while holding the lock cannot leave the list half-applied (it is swapped whole).
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn note_error(&self, error: String) {
        self.lock().status.last_error = Some(error);
    }
}

impl<T> Inner<T> {
    fn close(&mut self) {
        self.closed = true;
        for queue in self.queues.drain(..).filter_map(|queue| queue.upgrade()) {
            let mut queue = queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            queue.closed = true;
            if let Some(waker) = queue.waker.take() {
                waker.wake();
            }
        }
    }
}

/// The task's side of a list: decodes frames into `T` and publishes them.
pub(crate) struct TypedSink<T> {
    pub(crate) shared: Arc<Shared<T>>,
}

impl<T> Drop for TypedSink<T> {
    // The subscription is gone (or the client is): every stream ends.
    fn drop(&mut self) {
        self.shared.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).close();
    }
}

impl<T: Clone + DeserializeOwned + Send + Sync + 'static> ListSink for TypedSink<T> {
    fn apply(&mut self, diffs: &Value) -> Result<bool, String> {
        let mut inner = self.shared.lock();
        let decoded = decode_diffs::<T>(diffs, inner.items.len())?;
        let reset = decoded.iter().any(|diff| diff.is_reset());
        // Checked above, so `apply` cannot panic; on a clone (O(1) for imbl) all the same,
        // so readers never see half a frame.
        let mut items = inner.items.clone();
        let batch: Vec<VectorDiff<T>> = decoded.into_iter().map(VectorDiff::from).collect();
        for diff in &batch {
            diff.clone().apply(&mut items);
        }
        inner.items = items;
        if batch.is_empty() {
            // A frame with no diffs (the answer to a `set_range` that changed nothing):
            // nothing for a UI to do.
            return Ok(reset);
        }
        let Inner { items, queues, .. } = &mut *inner;
        queues.retain(|queue| queue.strong_count() > 0);
        for queue in queues.iter().filter_map(Weak::upgrade) {
            let mut queue = queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if queue.batches.len() >= MAX_PENDING_BATCHES {
                queue.batches.clear();
                queue.batches.push_back(vec![VectorDiff::Reset { values: items.clone() }]);
            } else {
                queue.batches.push_back(batch.clone());
            }
            if let Some(waker) = queue.waker.take() {
                waker.wake();
            }
        }
        Ok(reset)
    }

    fn len(&self) -> usize {
        self.shared.lock().items.len()
    }

    fn set_seq(&mut self, seq: u64) {
        self.shared.lock().status.seq = seq;
    }

    fn set_total(&mut self, total: u64) {
        self.shared.lock().status.total = Some(total);
    }

    fn set_write_seq(&mut self, write_seq: u64) {
        self.shared.lock().status.write_seq = Some(write_seq);
    }

    fn note_error(&mut self, error: String) {
        self.shared.note_error(error);
    }

    fn note_digest_mismatch(&mut self) {
        self.shared.lock().status.n_digest_mismatches += 1;
    }

    fn end(&mut self, ended: Ended) {
        let mut inner = self.shared.lock();
        inner.status.ended = Some(ended);
        inner.close();
    }
}

/// A stream of the list's changes: one `Vec<VectorDiff<T>>` per server frame, in order.
/// Ends when the subscription ends (unsubscribed, ended by the server, refused, or the
/// client is gone).
pub struct DiffStream<T> {
    queue: Arc<Mutex<Queue<T>>>,
}

impl<T> Stream for DiffStream<T> {
    type Item = Vec<VectorDiff<T>>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut queue = self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(batch) = queue.batches.pop_front() {
            return Poll::Ready(Some(batch));
        }
        if queue.closed {
            return Poll::Ready(None);
        }
        queue.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// A live window of a view. Dropping it unsubscribes.
pub struct LiveList<T: Clone> {
    pub(crate) sub: String,
    pub(crate) shared: Arc<Shared<T>>,
    pub(crate) commands: UnboundedSender<Command>,
}

impl<T: Clone> LiveList<T> {
    /// The subscription id on the wire.
    pub fn id(&self) -> &str {
        &self.sub
    }

    /// The items now (an O(1) clone).
    pub fn items(&self) -> Vector<T> {
        self.shared.lock().items.clone()
    }

    /// The items now and a stream of every later change, taken at one instant: applying
    /// the stream's batches to the items keeps them equal to the list.
    pub fn entries(&self) -> (Vector<T>, DiffStream<T>) {
        let mut inner = self.shared.lock();
        let queue = Arc::new(Mutex::new(Queue { batches: VecDeque::new(), waker: None, closed: inner.closed }));
        inner.queues.push(Arc::downgrade(&queue));
        (inner.items.clone(), DiffStream { queue })
    }

    pub fn status(&self) -> ListStatus {
        self.shared.lock().status.clone()
    }

    /// The view's length, when the server has sent one (`total`).
    pub fn total(&self) -> Option<u64> {
        self.shared.lock().status.total
    }

    /// Why the server ended the subscription, if it did.
    pub fn ended(&self) -> Option<Ended> {
        self.shared.lock().status.ended.clone()
    }

    /// Moves or grows the window ("load more": the same offset, a larger limit).
    pub fn set_range(&self, offset: u64, limit: u64) -> Result<(), Error> {
        self.commands.send(Command::SetRange { sub: self.sub.clone(), offset, limit }).map_err(|_| Error::Closed)
    }

    /// Changes the filter and sort, keeping the range (`None`: no filter / order by id).
    pub fn set_view(&self, filter: Option<Value>, sort: Option<Value>) -> Result<(), Error> {
        self.commands.send(Command::SetView { sub: self.sub.clone(), filter, sort }).map_err(|_| Error::Closed)
    }
}

/// "Load more" for a window that starts at 0, as matrix-rust-sdk's
/// `RoomListDynamicEntriesController` does: the window grows by one page at a time.
pub struct PageController {
    sub: String,
    commands: UnboundedSender<Command>,
    page_size: u64,
    limit: std::sync::atomic::AtomicU64,
}

impl PageController {
    /// Grows the window by one page (`set_range(0, limit + page_size)`).
    pub fn add_one_page(&self) -> Result<(), Error> {
        let limit = self.limit.fetch_add(self.page_size, std::sync::atomic::Ordering::SeqCst) + self.page_size;
        self.commands.send(Command::SetRange { sub: self.sub.clone(), offset: 0, limit }).map_err(|_| Error::Closed)
    }

    /// Back to the first page.
    pub fn reset_to_one_page(&self) -> Result<(), Error> {
        self.limit.store(self.page_size, std::sync::atomic::Ordering::SeqCst);
        self.commands
            .send(Command::SetRange { sub: self.sub.clone(), offset: 0, limit: self.page_size })
            .map_err(|_| Error::Closed)
    }

    /// The window's limit as last asked for.
    pub fn limit(&self) -> u64 {
        self.limit.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl<T: Clone> LiveList<T> {
    /// The items, their changes, and a controller that grows the window page by page:
    /// the shape of matrix-rust-sdk's `RoomList::entries_with_dynamic_adapters`. The
    /// window is set to `0..page_size` now.
    pub fn entries_with_dynamic_adapters(
        &self,
        page_size: u64,
    ) -> Result<(Vector<T>, DiffStream<T>, PageController), Error> {
        let controller = PageController {
            sub: self.sub.clone(),
            commands: self.commands.clone(),
            page_size,
            limit: std::sync::atomic::AtomicU64::new(page_size),
        };
        controller.reset_to_one_page()?;
        let (values, stream) = self.entries();
        Ok((values, stream, controller))
    }
}

impl<T: Clone> Drop for LiveList<T> {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Unsubscribe { sub: self.sub.clone() });
    }
}
