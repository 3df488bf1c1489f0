//! Follows PostgreSQL tables by logical replication, for Ordo to serve them as
//! live ordered views.
//!
//! The steps, in order:
//! 1. [`wire::Connection::connect`] in [`wire::Mode::Replication`];
//! 2. [`catalog::describe_tables`] checks the publication and the tables;
//! 3. on a first start, [`copy::create_slot_and_copy`] creates the slot and
//!    copies every table at the slot's snapshot, returning the position from
//!    which the stream continues;
//! 4. [`stream::ChangeStream::start`] streams from a position, and
//!    [`stream::ChangeStream::next_transaction`] hands over one whole committed
//!    transaction at a time, its values typed ([`value::Value`]);
//! 5. [`stream::ChangeStream::confirm`] tells PostgreSQL a position is durable
//!    on the caller's side: only then may PostgreSQL recycle the WAL before it.
//!
//! Nothing here knows Ordo's store or server: the caller decides what durable
//! means and where the last applied position is kept.

pub mod catalog;
pub mod copy;
pub mod error;
pub mod lsn;
pub mod pgoutput;
pub mod slot;
pub mod stream;
pub mod tls;
pub mod value;
pub mod wire;

pub use catalog::{Table, TableName, UnsupportedColumns};
pub use error::Error;
pub use lsn::Lsn;
pub use stream::{Change, ChangeStream, Field, Transaction};
pub use tls::Tls;
pub use value::{ColumnType, Value};
pub use wire::{ConnectConfig, Connection, Host, Mode};
