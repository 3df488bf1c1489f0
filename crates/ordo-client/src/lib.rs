//! Rust client for Ordo: HTTP helpers (schemas, writes, queries,
//! items) and live lists kept equal to a server window over a WebSocket.
//!
//! A [`LiveList<T>`] holds an `imbl::Vector<T>` and yields one
//! `Vec<eyeball_im::VectorDiff<T>>` per server frame ([`LiveList::entries`]), so a
//! matrix-rust-sdk-style UI can use it where it uses eyeball-im today. The client
//! reconnects with backoff, resumes (replay or Reset), refreshes tokens, and checks
//! every frame's `seq` and window digest: a list is never silently wrong — a gap, a
//! frame whose diffs do not apply or one whose digest is not the list's makes the list
//! subscribe again, and it keeps its items until the new subscription's Reset replaces them.
//!
//! The protocol is `docs/PROTOCOL.md` in the repository; the socket-free core
//! ([`protocol::ProtocolState`]) is what the protocol vectors test.
#![doc = include_str!("../README.md")]

mod auth;
pub mod digest;
mod error;
pub mod http;
mod list;
mod live;
mod nodes;
pub mod protocol;
pub mod wire;

pub use auth::{Auth, TokenFuture};
pub use error::Error;
pub use http::Http;
pub use hyper::Method;
pub use list::{DiffStream, ListStatus, LiveList, PageController, MAX_PENDING_BATCHES};
pub use live::{Backoff, Client, ClientBuilder, ConnectionState};
pub use nodes::{NodeRotation, NodeUrls};
pub use wire::{
    Collection, DeleteResult, Dropped, Ended, Field, Item, NewField, Op, Precondition, QueryResult, SchemaChange,
    Upsert, View, WriteResult,
};

// The list types, re-exported so that a UI uses the very versions this crate does.
pub use eyeball_im::VectorDiff;
pub use imbl::Vector;
