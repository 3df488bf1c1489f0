//! The writer thread: it owns the [`Database`] (engine and LMDB environment), so
//! every write transaction begins and ends on that one thread, as LMDB requires.
//! Other threads send it batches through a bounded queue; batches that queue up
//! while a commit is in flight are written together in the next transaction
//! (group commit) and each is still acknowledged on its own.

use std::sync::mpsc::{self, Receiver, RecvError, SyncSender};
use std::thread::JoinHandle;

use ordo_core::{Batch, CollectionId, DiffSink};

use crate::database::{Ack, Database, PendingWrite};
use crate::error::StoreError;

/// Most batches written in one transaction: bounds the latency one commit adds
/// to the batches behind it.
pub const MAX_BATCHES_PER_COMMIT: usize = 256;
/// Most bytes of batches written in one transaction, for the same reason.
pub const MAX_BYTES_PER_COMMIT: usize = 64 * 1024 * 1024;

type Job = Box<dyn FnOnce(&mut Database, &mut dyn DiffSink) + Send>;

// A write is moved once into the queue and once out; boxing it to shrink the
// enum would cost an allocation per write instead.
#[allow(clippy::large_enum_variant)]
enum Request {
    Write { write: PendingWrite, reply: mpsc::Sender<(Batch, Result<Ack, StoreError>)> },
    Run(Job),
}

/// The writer thread has stopped (it was shut down, or panicked).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriterStopped;

impl std::fmt::Display for WriterStopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the store's writer thread has stopped")
    }
}

impl std::error::Error for WriterStopped {}

/// The outcome of one submitted batch; the batch comes back for reuse.
pub struct WriteTicket(Receiver<(Batch, Result<Ack, StoreError>)>);

impl WriteTicket {
    /// Blocks until the batch is committed (`Ok`) or refused.
    pub fn wait(self) -> Result<(Batch, Result<Ack, StoreError>), WriterStopped> {
        self.0.recv().map_err(|RecvError| WriterStopped)
    }
}

pub struct Writer {
    requests: Option<SyncSender<Request>>,
    thread: Option<JoinHandle<Database>>,
}

impl Writer {
    /// Moves `database` to a new writer thread. `queue_capacity` bounds the
    /// batches waiting; `submit` blocks when it is reached. Diffs of the windows
    /// go to `sink`, on the writer thread.
    pub fn spawn(database: Database, sink: Box<dyn DiffSink + Send>, queue_capacity: usize) -> Writer {
        let (requests, receiver) = mpsc::sync_channel(queue_capacity.max(1));
        let thread = std::thread::Builder::new()
            .name("ordo-writer".to_owned())
            .spawn(move || run_writer(database, sink, receiver))
            .expect("spawning the writer thread");
        Writer { requests: Some(requests), thread: Some(thread) }
    }

    /// Queues a batch. Its ticket yields the acknowledgement once the batch is durable.
    pub fn submit(&self, collection: CollectionId, batch: Batch) -> Result<WriteTicket, WriterStopped> {
        let (reply, receiver) = mpsc::channel();
        let request = Request::Write { write: PendingWrite::new(collection, batch), reply };
        self.requests.as_ref().ok_or(WriterStopped)?.send(request).map_err(|_| WriterStopped)?;
        Ok(WriteTicket(receiver))
    }

    /// Runs `job` on the writer thread, after the batches queued before it, and
    /// returns its result: window operations, collection creation, reads.
    pub fn run<R: Send + 'static>(
        &self,
        job: impl FnOnce(&mut Database, &mut dyn DiffSink) -> R + Send + 'static,
    ) -> Result<R, WriterStopped> {
        let (reply, receiver) = mpsc::channel();
        let job: Job = Box::new(move |database, sink| {
            let _ = reply.send(job(database, sink));
        });
        self.requests.as_ref().ok_or(WriterStopped)?.send(Request::Run(job)).map_err(|_| WriterStopped)?;
        receiver.recv().map_err(|_| WriterStopped)
    }

    /// Finishes every queued request, stops the thread and returns the database.
    pub fn shutdown(mut self) -> Result<Database, WriterStopped> {
        self.requests = None;
        self.thread.take().expect("joined once").join().map_err(|_| WriterStopped)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.requests = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run_writer(mut database: Database, mut sink: Box<dyn DiffSink + Send>, receiver: Receiver<Request>) -> Database {
    let mut group: Vec<PendingWrite> = Vec::new();
    let mut replies: Vec<mpsc::Sender<(Batch, Result<Ack, StoreError>)>> = Vec::new();
    let mut waiting: Option<Request> = None;
    loop {
        let first = match waiting.take() {
            Some(request) => request,
            None => match receiver.recv() {
                Ok(request) => request,
                Err(RecvError) => return database,
            },
        };
        match first {
            Request::Run(job) => {
                job(&mut database, sink.as_mut());
                continue;
            }
            Request::Write { write, reply } => {
                let mut n_bytes = write.batch.n_bytes();
                group.push(write);
                replies.push(reply);
                // Whatever queued up during the last commit joins this one.
                while group.len() < MAX_BATCHES_PER_COMMIT && n_bytes < MAX_BYTES_PER_COMMIT {
                    match receiver.try_recv() {
                        Ok(Request::Write { write, reply }) => {
                            n_bytes += write.batch.n_bytes();
                            group.push(write);
                            replies.push(reply);
                        }
                        Ok(run) => {
                            waiting = Some(run);
                            break;
                        }
                        Err(_) => break,
                    }
                }
            }
        }
        database.write_group(&mut group, sink.as_mut());
        for (write, reply) in group.drain(..).zip(replies.drain(..)) {
            let result = write.result.expect("every write of a group gets a result");
            // A submitter that stopped waiting is not an error.
            let _ = reply.send((write.batch, result));
        }
    }
}
