//! TCP connections that have not sent a whole request head yet. Each may wait
//! up to the header timeout, and each holds a place under the connection cap
//! meanwhile, so a flood of sockets that send nothing (or half a head) could
//! fill the cap and keep every real client out for as long as the flood lasts. They get a share of the cap
//! instead (`limits::unauthenticated_cap`, the same share as WebSockets waiting
//! for `auth`): past it, the socket that has waited longest is closed to make
//! room, so a client that sends its request at once always gets in.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::metrics::{self, METRICS};

/// The sockets waiting for their first request, oldest first.
pub struct SilentSockets {
    share: usize,
    /// At most `share` entries, so the linear search of `leave` stays short.
    waiting: Mutex<VecDeque<(u64, oneshot::Sender<()>)>>,
    next_id: std::sync::atomic::AtomicU64,
}

/// One socket's place among the silent ones; it leaves when dropped (when its
/// first request head is complete, or it closes).
pub struct SilentSocket {
    sockets: Arc<SilentSockets>,
    id: u64,
}

/// Resolves when the socket must close to make room for a newer one; never
/// once it has left the silent ones.
pub struct Eviction(oneshot::Receiver<()>);

impl Eviction {
    pub async fn wait(&mut self) {
        if (&mut self.0).await.is_err() {
            // The socket left (its place was dropped): it is never evicted now.
            std::future::pending::<()>().await;
        }
    }
}

impl SilentSockets {
    pub fn new(share: usize) -> SilentSockets {
        SilentSockets {
            share: share.max(1),
            waiting: Mutex::new(VecDeque::new()),
            next_id: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// A new socket starts waiting; the longest waiting one is told to close
    /// when the share is full.
    pub fn enter(self: &Arc<Self>) -> (SilentSocket, Eviction) {
        let id = self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (evict, evicted) = oneshot::channel();
        let mut waiting = self.waiting.lock().expect("silent sockets lock");
        if waiting.len() >= self.share {
            if let Some((_, oldest)) = waiting.pop_front() {
                let _ = oldest.send(());
                metrics::add(&METRICS.silent_sockets_closed, 1);
            }
        }
        waiting.push_back((id, evict));
        (SilentSocket { sockets: self.clone(), id }, Eviction(evicted))
    }
}

impl Drop for SilentSocket {
    fn drop(&mut self) {
        let mut waiting = self.sockets.waiting.lock().expect("silent sockets lock");
        if let Some(index) = waiting.iter().position(|(id, _)| *id == self.id) {
            waiting.remove(index);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_share_the_longest_waiting_socket_is_told_to_close() {
        let sockets = Arc::new(SilentSockets::new(2));
        let (_first, mut first_eviction) = sockets.enter();
        let (second, _) = sockets.enter();
        drop(second);
        let (third, mut third_eviction) = sockets.enter();
        assert!(first_eviction.0.try_recv().is_err(), "room was made by the one that left");
        let (fourth, mut fourth_eviction) = sockets.enter();
        assert!(first_eviction.0.try_recv().is_ok(), "the oldest goes first");
        assert!(third_eviction.0.try_recv().is_err());
        assert!(fourth_eviction.0.try_recv().is_err());
        let (fifth, _) = sockets.enter();
        assert!(third_eviction.0.try_recv().is_ok());
        drop((third, fourth, fifth));
        assert!(sockets.waiting.lock().unwrap().is_empty());
    }
}
