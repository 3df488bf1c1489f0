//! Cluster mode: every node started with `--pg-table` is a candidate; the one
//! that holds the lease (`lease`) follows PostgreSQL and publishes each
//! transaction to the stream, the others apply it from there and stand by.
//!
//! A term, on the node that took the lease: claim the slot (a `claim` entry;
//! its apply here means every entry before it, the last holder's, is applied
//! here too, and answers the position they left); end the walsender that still
//! holds the slot, if any (a holder frozen past its lease); then as in single-node mode
//! (`prepare`: a copy when there is no position, else the collections as they
//! are) and follow, every change through the stream (`sink::Sink::Stream`),
//! each transaction confirmed to PostgreSQL once the stream's quorum holds it
//! and it is applied here. The lease is renewed every `LEASE_RENEW_EVERY` (in a
//! task of its own, which a busy term cannot hold up); a
//! renewal that fails (or is late) ends the term at once, as does an entry
//! fenced by a newer term. The node then stands by and looks for the lease again.

use std::sync::Arc;

use ordo_pgsource::slot::HolderEnded;
use ordo_pgsource::{Connection, Mode};
use tokio::sync::{oneshot, watch};

use super::config::PostgresOptions;
use super::follow::Ended;
use super::lease::{self, Attempt, Lease, LEASE_RENEW_EVERY};
use super::sink::{Sink, SinkError};
use super::status::{LeaseView, State};
use super::stream_entry::Applied;
use super::{not_following, prepare, read_only_collections, FollowStatus, Prepared, Started, Stored};
use crate::cluster::Cluster;
use crate::routing::Routes;
use crate::writer::WriterSender;

/// Starts this node's candidacy for the follower lease; returns at once.
pub fn start_clustered(
    options: &PostgresOptions,
    cluster: Arc<Cluster>,
    status: Arc<FollowStatus>,
    writer: &WriterSender,
    routes: &Routes,
    shutdown: watch::Receiver<bool>,
) -> Started {
    status.set_state(State::Standby);
    status.set_lease(LeaseView::default());
    let candidate = Candidate {
        options: options.clone(),
        cluster,
        status: status.clone(),
        writer: writer.clone(),
        routes: routes.clone(),
    };
    tokio::spawn(candidate.run(shutdown));
    Started { status, read_only: read_only_collections(options) }
}

struct Candidate {
    options: PostgresOptions,
    cluster: Arc<Cluster>,
    status: Arc<FollowStatus>,
    writer: WriterSender,
    routes: Routes,
}

/// What ended a term.
enum Event {
    Ended(Ended),
    /// A renewal failed (or was late): why.
    Lost(String),
    Shutdown,
}

/// Renews `lease` every `LEASE_RENEW_EVERY` until `stopped`, in a task of its
/// own: a term keeps its task busy for seconds at a time (a copy reads rows
/// as fast as PostgreSQL sends them and waits for each batch's apply in
/// place), which must not delay a renewal past the lease's TTL. A renewal
/// that fails is sent to `lost` and ends the renewals.
async fn keep_renewed(mut lease: Lease, lost: oneshot::Sender<String>, mut stopped: watch::Receiver<bool>) -> Lease {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(LEASE_RENEW_EVERY) => {}
            _ = stopped.wait_for(|stop| *stop) => return lease,
        }
        if let Err(error) = lease.renew().await {
            let _ = lost.send(error);
            return lease;
        }
    }
}

/// Gives the lease up once the renewals stopped.
async fn release(renewals: tokio::task::JoinHandle<Lease>) {
    if let Ok(lease) = renewals.await {
        lease.release().await;
    }
}

/// How one look for the lease ended.
enum Round {
    /// Look again after `LEASE_RENEW_EVERY`.
    Again,
    /// The server stops, or the follower failed for good on this node.
    Over,
}

impl Candidate {
    async fn run(self, mut shutdown: watch::Receiver<bool>) {
        loop {
            if let Round::Over = self.round(&mut shutdown).await {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(LEASE_RENEW_EVERY) => {}
                _ = shutdown.wait_for(|stopping| *stopping) => return,
            }
        }
    }

    fn node(&self) -> &str {
        &self.cluster.options.node_name
    }

    async fn round(&self, shutdown: &mut watch::Receiver<bool>) -> Round {
        let store = match lease::open_bucket(&self.cluster.jetstream(), self.cluster.options.replicas).await {
            Ok(store) => store,
            Err(error) => {
                tracing::warn!("{error}");
                return Round::Again;
            }
        };
        match lease::try_acquire(&store, &self.options.slot, self.node()).await {
            Ok(Attempt::Taken(lease)) => self.hold(*lease, shutdown).await,
            Ok(Attempt::HeldBy(holder)) => {
                self.status.set_lease(LeaseView { holder, held_here: false, term: 0 });
                Round::Again
            }
            Err(error) => {
                tracing::warn!("{error}");
                Round::Again
            }
        }
    }

    /// One term: follows while the lease is renewed; ends when either stops.
    async fn hold(&self, lease: Lease, shutdown: &mut watch::Receiver<bool>) -> Round {
        let term = lease.term;
        self.status.set_lease(LeaseView { holder: Some(self.node().to_owned()), held_here: true, term });
        crate::logging::say!("ordo: took the PostgreSQL follower lease (slot `{}`, term {term})", self.options.slot);
        tracing::info!(slot = %self.options.slot, term, "took the PostgreSQL follower lease");
        let (stop, stopped) = watch::channel(false);
        let (lost_tx, mut lost) = oneshot::channel();
        let renewals = tokio::spawn(keep_renewed(lease, lost_tx, stopped.clone()));
        let follow = self.follow_term(term, stopped);
        tokio::pin!(follow);
        let event = tokio::select! {
            ended = &mut follow => Event::Ended(ended),
            Ok(error) = &mut lost => Event::Lost(error),
            _ = shutdown.wait_for(|stopping| *stopping) => Event::Shutdown,
        };
        // Stops the renewals, and the term unless it ended.
        let _ = stop.send(true);
        let ended = match event {
            Event::Ended(ended) => ended,
            Event::Lost(error) => {
                // Stop at once: the lease may be another node's by now.
                let _ = (&mut follow).await;
                self.stand_by(term, &error);
                return Round::Again;
            }
            Event::Shutdown => {
                let _ = (&mut follow).await;
                release(renewals).await;
                return Round::Over;
            }
        };
        release(renewals).await;
        match ended {
            Ended::Lost(message) => {
                self.stand_by(term, &message);
                Round::Again
            }
            Ended::Failed | Ended::Stopped => {
                self.status.set_lease(LeaseView { holder: None, held_here: false, term: 0 });
                self.status.clear_positions();
                Round::Over
            }
        }
    }

    fn stand_by(&self, term: u64, why: &str) {
        crate::logging::say!("ordo: gave up the PostgreSQL follower lease (term {term}): {why}");
        tracing::warn!(term, "gave up the PostgreSQL follower lease: {why}");
        self.status.set_lease(LeaseView { holder: None, held_here: false, term: 0 });
        // The lag is the holder's to read (a standby has no stream).
        self.status.clear_positions();
        if self.status.state() != State::Reconnecting {
            self.status.set_state(State::Standby);
        }
    }

    /// Ends the walsender that still holds the slot, if one does: a holder
    /// frozen past its lease (`SIGSTOP`) keeps it until PostgreSQL's
    /// `wal_sender_timeout` (60 s by default), and this term could neither
    /// stream from the slot nor create it again until then. Only once the
    /// claim is applied: whatever that holder publishes is fenced by then.
    /// On failure (a role that may not end it) the stream retries until
    /// PostgreSQL ends it itself.
    async fn take_slot(&self) {
        let slot = self.options.slot.as_str();
        let ended = async {
            let mut connection = Connection::connect(&self.options.connect, Mode::Sql).await?;
            let ended = ordo_pgsource::slot::terminate_slot_holder(&mut connection, slot).await;
            let _ = connection.terminate().await;
            ended
        }
        .await;
        match ended {
            Ok(None) => {}
            Ok(Some(HolderEnded { pid, signals, released: true })) => {
                crate::logging::say!("ordo: ended the PostgreSQL backend {pid}, which still held slot `{slot}`");
                tracing::info!(slot, pid, signals, "ended the PostgreSQL backend that still held the slot");
            }
            Ok(Some(HolderEnded { pid, signals, .. })) => {
                tracing::warn!(slot, pid, signals, "the PostgreSQL backend that holds the slot did not end yet");
            }
            Err(error) => {
                let refused = matches!(&error, ordo_pgsource::Error::Server(server) if server.code == "42501");
                let hint = if refused {
                    "; the follower's role must be that backend's, or a member of pg_signal_backend"
                } else {
                    ""
                };
                eprintln!(
                    "ordo: WARNING: cannot end the PostgreSQL backend that holds slot `{slot}` (streaming from it \
                     waits until PostgreSQL's wal_sender_timeout ends it{hint}): {error}"
                );
                tracing::warn!(slot, %error, "cannot end the PostgreSQL backend that holds the slot");
            }
        }
    }

    /// Claims the slot for `term`, prepares (copies if no position is
    /// stored) and follows, until `stopped` or the term ends.
    async fn follow_term(&self, term: u64, mut stopped: watch::Receiver<bool>) -> Ended {
        let sink =
            Sink::stream(self.cluster.clone(), self.writer.clone(), self.routes.clone(), &self.options.slot, term);
        let Sink::Stream(stream) = &sink else { unreachable!("a stream sink") };
        let claimed = tokio::select! {
            claimed = stream.claim() => claimed,
            _ = stopped.wait_for(|stop| *stop) => return Ended::Stopped,
        };
        let stored = match claimed {
            Ok(Applied::Claimed { position, tables, collection }) => {
                Stored { collection: Some(collection), position, tables }
            }
            Ok(other) => return Ended::Lost(format!("the claim of the slot came back as {other:?}")),
            Err(error) => return Ended::Lost(error.message()),
        };
        let prepared = tokio::select! {
            prepared = async {
                self.take_slot().await;
                prepare(&self.options, stored, sink, &self.routes, &self.status).await
            } => prepared,
            _ = stopped.wait_for(|stop| *stop) => return Ended::Stopped,
        };
        match prepared {
            Ok(Prepared::Follow(follower)) => follower.run(stopped).await,
            Ok(Prepared::Gone(message)) => {
                // For good, as in single-node mode: this node gives the lease
                // up, and whichever node takes it next finds the same.
                not_following(&self.status, &message);
                Ended::Failed
            }
            Err(SinkError::Lost(message)) => Ended::Lost(message),
            Err(SinkError::Refused(message)) => {
                // PostgreSQL unreachable, a table that cannot be followed: the
                // next term (here or on another node) tries again.
                self.status.reconnecting(&message);
                Ended::Lost(message)
            }
        }
    }
}
