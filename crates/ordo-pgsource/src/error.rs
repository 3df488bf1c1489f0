//! The errors of the source, each with a message an operator can act on: what
//! failed, on which table and column, and what to change.

use std::fmt;

use crate::pgoutput::DecodeError;
use crate::value::ValueError;

/// An error PostgreSQL sent (`ErrorResponse`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerError {
    pub severity: String,
    /// The SQLSTATE, `28P01` for a wrong password, say.
    pub code: String,
    pub message: String,
    pub detail: Option<String>,
}

impl ServerError {
    /// The message, and the detail after it in brackets when PostgreSQL sent one.
    pub fn explained(&self) -> String {
        match &self.detail {
            Some(detail) => format!("{} ({detail})", self.message),
            None => self.message.clone(),
        }
    }
}

/// The SQLSTATE of a failed password check.
pub const SQLSTATE_INVALID_PASSWORD: &str = "28P01";
/// The SQLSTATE of an object that does not exist (a slot or publication, say).
pub const SQLSTATE_UNDEFINED_OBJECT: &str = "42704";
/// The SQLSTATE of an object in the wrong state (a replication slot PostgreSQL
/// invalidated, say).
pub const SQLSTATE_OBJECT_NOT_IN_PREREQUISITE_STATE: &str = "55000";
/// The SQLSTATE of an object that exists already (a publication, say).
pub const SQLSTATE_DUPLICATE_OBJECT: &str = "42710";
/// The SQLSTATE of a statement the role may not run (not the owner, no grant).
pub const SQLSTATE_INSUFFICIENT_PRIVILEGE: &str = "42501";

#[derive(Debug)]
pub enum Error {
    Io(std::io::Error),
    Server(ServerError),
    /// The server said something this client does not expect at that point.
    Protocol(String),
    /// An authentication method this client does not speak, or a SCRAM exchange
    /// that did not verify the server.
    Authentication(String),
    /// TLS was required and could not be had or verified: the server declines
    /// it, its certificate does not chain to the CA or does not name the host,
    /// a CA file that cannot be read. Not transient: a configuration to fix.
    Tls(String),
    MissingPublication {
        publication: String,
    },
    /// PostgreSQL refused to create the publication (asked for by the caller
    /// when it was missing).
    CannotCreatePublication {
        publication: String,
        cause: ServerError,
    },
    TableNotFound {
        table: String,
    },
    TableNotPublished {
        table: String,
        publication: String,
    },
    NoPrimaryKey {
        table: String,
    },
    /// A followed table left the publication, was dropped, or was dropped and
    /// created again, after the follower described it: its changes no longer
    /// reach the stream.
    NoLongerFollowed {
        table: String,
        publication: String,
        reason: String,
    },
    UnsupportedType {
        table: String,
        column: String,
        type_name: String,
    },
    Value {
        table: String,
        column: String,
        error: ValueError,
    },
    Decode(DecodeError),
    /// A transaction with more changes than the configured bound.
    TransactionTooLarge {
        limit: usize,
    },
    /// The slot the follower resumes from is gone (dropped, or invalidated by
    /// `max_slot_wal_keep_size`): the changes since are lost to it.
    SlotLost {
        slot: String,
        reason: String,
    },
}

impl Error {
    /// Whether retrying the same work later may succeed (a lost connection, a
    /// restarting server), as opposed to a configuration or data error.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Io(_) => true,
            // Class 08 (connection exception), 57 (operator intervention: a
            // terminated backend, a shutting-down server), 53 (insufficient
            // resources), and 55006 (object in use: the slot is still held by
            // the walsender of a connection that just ended).
            Error::Server(error) => {
                ["08", "57", "53"].iter().any(|class| error.code.starts_with(class)) || error.code == "55006"
            }
            _ => false,
        }
    }
}

/// What recovers from a position the follower cannot go on from (a lost
/// slot, a transaction past the bound): a new copy, taken after it.
const RECOVERY_BY_A_NEW_COPY: &str = "copy the tables anew: with `ordo serve`, restart with a new --pg-slot name (a first start: the followed collections are emptied and copied again) and drop the old slot in PostgreSQL if it is still there";

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io(error) => write!(f, "connection to PostgreSQL failed: {error}"),
            Error::Server(error) => {
                write!(f, "PostgreSQL {} {}: {}", error.severity, error.code, error.explained())
            }
            Error::Protocol(what) => write!(f, "unexpected message from PostgreSQL: {what}"),
            Error::Authentication(what) => write!(f, "authentication with PostgreSQL failed: {what}"),
            Error::Tls(what) => write!(f, "TLS with PostgreSQL: {what}"),
            Error::MissingPublication { publication } => write!(
                f,
                "the publication `{publication}` does not exist: create it (`CREATE PUBLICATION {publication} FOR TABLE ...`) or name an existing one"
            ),
            Error::CannotCreatePublication { publication, cause } if cause.code == SQLSTATE_INSUFFICIENT_PRIVILEGE => {
                write!(
                    f,
                    "cannot create the publication `{publication}`: {}. Creating it needs the CREATE privilege on the database and ownership of every followed table: create it as the tables' owner (`CREATE PUBLICATION {publication} FOR TABLE ...`), or log in as a role that has both",
                    cause.message
                )
            }
            Error::CannotCreatePublication { publication, cause } => {
                write!(f, "cannot create the publication `{publication}`: PostgreSQL {} {}", cause.code, cause.message)
            }
            Error::TableNotFound { table } => write!(f, "the followed table `{table}` does not exist"),
            Error::TableNotPublished { table, publication } => write!(
                f,
                "the table `{table}` is not in the publication `{publication}`: `ALTER PUBLICATION {publication} ADD TABLE {table}`"
            ),
            Error::NoLongerFollowed { table, publication, reason } => write!(
                f,
                "the followed table `{table}` {reason}: its changes no longer reach Ordo. Remove it from --pg-table, or put it back in the publication `{publication}` and follow it anew (a new --pg-slot, or a restart without it and then with it: its collection is copied again)"
            ),
            Error::NoPrimaryKey { table } => write!(
                f,
                "the table `{table}` has no primary key: a followed table needs one (it is the item id, and deletes name rows by it)"
            ),
            Error::UnsupportedType { table, column, type_name } => write!(
                f,
                "the column `{table}.{column}` has the type `{type_name}`, which is not followed (see docs/POSTGRES.md for the types that are)"
            ),
            Error::Value { table, column, error } => write!(f, "in `{table}.{column}`: {error}"),
            Error::Decode(error) => error.fmt(f),
            Error::TransactionTooLarge { limit } => write!(
                f,
                "a transaction has more than {limit} changes, the bound of one Ordo batch: it is not applied, and resuming from the same slot meets it again. Recovery: {RECOVERY_BY_A_NEW_COPY}; keep the transactions on followed tables under the bound (a bulk load in several transactions)"
            ),
            Error::SlotLost { slot, reason } => write!(
                f,
                "the replication slot `{slot}` is lost ({reason}): the changes since the last applied position cannot be had. Recovery: {RECOVERY_BY_A_NEW_COPY}"
            ),
        }
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(error: std::io::Error) -> Self {
        Error::Io(error)
    }
}

impl From<DecodeError> for Error {
    fn from(error: DecodeError) -> Self {
        Error::Decode(error)
    }
}
