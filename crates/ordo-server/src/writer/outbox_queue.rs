//! A connection's outbox: what the writer thread queues for one connection, in
//! order, without ever waiting (the writer bounds what a connection may have
//! queued itself, through `ConnShared::queued_bytes`).
//!
//! A tokio channel would do, but it allocates a block of 32 slots when it is
//! made, over 4 KiB of `Outgoing` per connection, most of them idle: with a
//! hundred thousand connections held that is 400 MiB. This queue takes room
//! with its first message and keeps what a connection's usual bursts need.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

use super::Outgoing;

/// Room the queue keeps once it is empty again: what a busy connection has
/// queued at once in the usual case, so that it reuses it without allocating,
/// while a burst does not stay resident for the rest of the connection's life.
const RETAINED_SLOTS: usize = 16;

struct Queue {
    items: Mutex<VecDeque<Outgoing>>,
    /// Wakes the receiver: a message came, or the sender is gone.
    ready: Notify,
    sender_gone: AtomicBool,
    receiver_gone: AtomicBool,
}

impl Queue {
    fn items(&self) -> MutexGuard<'_, VecDeque<Outgoing>> {
        // A panic while the lock was held left a queue that is still whole:
        // every operation on it is a single push or pop.
        self.items.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The connection's end of an outbox was dropped.
#[derive(Debug, PartialEq, Eq)]
pub struct ReceiverGone;

/// The writer thread's end.
pub struct Outbox {
    queue: Arc<Queue>,
}

/// The connection's end.
pub struct OutboxReceiver {
    queue: Arc<Queue>,
}

/// A new, empty outbox: it allocates nothing for its messages until the first.
pub fn outbox() -> (Outbox, OutboxReceiver) {
    let queue = Arc::new(Queue {
        items: Mutex::new(VecDeque::new()),
        ready: Notify::new(),
        sender_gone: AtomicBool::new(false),
        receiver_gone: AtomicBool::new(false),
    });
    (Outbox { queue: queue.clone() }, OutboxReceiver { queue })
}

impl Outbox {
    /// Queues `message`; `Err` (and `message` dropped) when the connection's end is gone.
    pub fn send(&self, message: Outgoing) -> Result<(), ReceiverGone> {
        if self.queue.receiver_gone.load(Ordering::Acquire) {
            return Err(ReceiverGone);
        }
        self.queue.items().push_back(message);
        // A permit is kept when the receiver is not waiting yet, so a message
        // queued between its look at the queue and its wait still wakes it.
        self.queue.ready.notify_one();
        Ok(())
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        self.queue.sender_gone.store(true, Ordering::Release);
        self.queue.ready.notify_one();
    }
}

impl OutboxReceiver {
    /// The next message; `None` once the writer dropped its end and every
    /// message it queued before was taken.
    pub async fn recv(&mut self) -> Option<Outgoing> {
        loop {
            if let Some(message) = self.try_recv() {
                return Some(message);
            }
            if self.queue.sender_gone.load(Ordering::Acquire) {
                // What was queued before the sender went is still delivered.
                return self.try_recv();
            }
            self.queue.ready.notified().await;
        }
    }

    /// The next message if one is queued.
    pub fn try_recv(&mut self) -> Option<Outgoing> {
        let mut items = self.queue.items();
        let message = items.pop_front();
        if items.is_empty() && items.capacity() > RETAINED_SLOTS {
            items.shrink_to(RETAINED_SLOTS);
        }
        message
    }

    pub fn is_empty(&self) -> bool {
        self.queue.items().is_empty()
    }
}

impl Drop for OutboxReceiver {
    fn drop(&mut self) {
        self.queue.receiver_gone.store(true, Ordering::Release);
        // The frames' shared bodies go back to their pool now, not when the writer forgets the session.
        self.queue.items().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn wake() -> Outgoing {
        Outgoing::Wake
    }

    fn unsubscribed(handle: u32) -> Outgoing {
        Outgoing::Unsubscribed { handle }
    }

    fn handle_of(message: Outgoing) -> u32 {
        match message {
            Outgoing::Unsubscribed { handle } => handle,
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn messages_come_out_in_order_and_an_empty_queue_holds_no_room() {
        let (sender, mut receiver) = outbox();
        assert_eq!(receiver.queue.items().capacity(), 0, "no room before the first message");
        for handle in 0..100 {
            sender.send(unsubscribed(handle)).unwrap();
        }
        for handle in 0..100 {
            assert_eq!(handle_of(receiver.try_recv().unwrap()), handle);
        }
        assert!(receiver.try_recv().is_none() && receiver.is_empty());
        assert!(receiver.queue.items().capacity() <= RETAINED_SLOTS, "a burst's room is given back");
    }

    #[tokio::test]
    async fn a_waiting_receiver_wakes_for_a_message_and_ends_after_the_sender() {
        let (sender, mut receiver) = outbox();
        let waiting = tokio::spawn(async move {
            let first = receiver.recv().await.map(handle_of);
            let second = receiver.recv().await.map(handle_of);
            let end = receiver.recv().await.is_none();
            (first, second, end)
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        sender.send(unsubscribed(7)).unwrap();
        sender.send(unsubscribed(8)).unwrap();
        drop(sender);
        let (first, second, end) = tokio::time::timeout(Duration::from_secs(5), waiting).await.unwrap().unwrap();
        assert_eq!((first, second, end), (Some(7), Some(8), true), "queued before the drop, then the end");
    }

    #[test]
    fn a_send_after_the_receiver_went_fails() {
        let (sender, receiver) = outbox();
        sender.send(wake()).unwrap();
        drop(receiver);
        assert_eq!(sender.send(wake()), Err(ReceiverGone));
    }
}
