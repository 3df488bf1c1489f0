//! What Ordo's test suites and benchmarks share, kept in one place so the copies
//! cannot drift apart:
//!
//! - [`alloc::CountingAllocator`], a global allocator that counts allocations
//!   per thread and per process, and the heap bytes in use;
//! - [`rng::Rng`], the seeded generator of the model tests, so a failure can be
//!   replayed from its seed;
//! - [`room_schema`], the room list's engine schema;
//! - [`server::spawn_server`], starting an `ordo serve` process and waiting for
//!   the address it reports;
//! - [`postgres::PostgresServer`], a throw-away PostgreSQL server on a Unix
//!   socket, for the tests that follow one by logical replication.

pub mod alloc;
pub mod postgres;
pub mod rng;
pub mod server;

use ordo_core::{FieldType, Schema};

/// The room list's fields, as a Matrix client keeps them (the engine's benchmark
/// and its allocation tests build the same rooms).
pub fn room_schema() -> Schema {
    Schema::new()
        .with_field("name", FieldType::String)
        .with_field("recency", FieldType::U64)
        .with_field("is_local", FieldType::Bool)
        .with_field("left", FieldType::Bool)
        .with_field("unread", FieldType::U64)
        .with_field("is_dm", FieldType::Bool)
        .with_field("favourite", FieldType::Bool)
}
