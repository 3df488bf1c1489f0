//! Taking a replication slot from a connection that still holds it.
//!
//! A slot streams to one walsender at a time (`pg_replication_slots.active_pid`).
//! A client that is frozen rather than dead (`SIGSTOP`, a VM paused) keeps its
//! walsender, and so the slot, until PostgreSQL's `wal_sender_timeout` (60 s by
//! default) ends it; another client asking for the slot meanwhile is refused
//! (`55006`, object in use). A client that knows the holder has lost the right
//! to stream (cluster mode's lease, fenced by term) ends that walsender itself.

use std::time::Duration;

use postgres_protocol::escape::escape_literal;

use crate::error::Error;
use crate::wire::Connection;

/// How long [`terminate_slot_holder`] waits for the walsender it signalled to
/// let the slot go (a terminated backend releases it on exit, in milliseconds).
pub const RELEASE_WAIT: Duration = Duration::from_secs(5);
const RELEASE_POLL: Duration = Duration::from_millis(100);

/// The backend that holds `slot` now, if any (not this connection's).
pub async fn slot_holder(connection: &mut Connection, slot: &str) -> Result<Option<i32>, Error> {
    let rows = connection
        .query_rows(&format!(
            "SELECT active_pid FROM pg_replication_slots \
             WHERE slot_name = {} AND active_pid IS NOT NULL AND active_pid <> pg_backend_pid()",
            escape_literal(slot)
        ))
        .await?;
    let pid = rows.into_iter().next().and_then(|row| row.into_iter().next().flatten());
    pid.map(|pid| pid.parse().map_err(|_| Error::Protocol(format!("an active_pid that is not a number: {pid}"))))
        .transpose()
}

/// What [`terminate_slot_holder`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HolderEnded {
    /// The walsender's process id.
    pub pid: i32,
    /// How many times it was signalled.
    pub signals: u32,
    /// Whether the slot was free by the end of [`RELEASE_WAIT`].
    pub released: bool,
}

/// Ends the walsender that holds `slot`, if one does, and waits (at most
/// [`RELEASE_WAIT`]) for the slot to be free.
///
/// The signal is sent again while the slot stays held: a walsender whose
/// client reads nothing (frozen, its socket full) handles the first one by
/// sending the client its error, and that write blocks too; a signal that
/// comes while it is blocked there makes it drop the message and exit.
///
/// `pg_terminate_backend` is allowed on a backend of the same role (or with
/// `pg_signal_backend`, or as a superuser; a superuser's backend only by a
/// superuser). A refusal is `Error::Server` (`42501`), not transient.
pub async fn terminate_slot_holder(connection: &mut Connection, slot: &str) -> Result<Option<HolderEnded>, Error> {
    let Some(pid) = slot_holder(connection, slot).await? else { return Ok(None) };
    let deadline = tokio::time::Instant::now() + RELEASE_WAIT;
    let mut ended = HolderEnded { pid, signals: 0, released: false };
    while !ended.released && tokio::time::Instant::now() < deadline {
        connection.query_rows(&format!("SELECT pg_terminate_backend({pid})")).await?;
        ended.signals += 1;
        tokio::time::sleep(RELEASE_POLL).await;
        ended.released = slot_holder(connection, slot).await? != Some(pid);
    }
    Ok(Some(ended))
}
