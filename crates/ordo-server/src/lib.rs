//! Ordo's server: `ordo serve`. An HTTP API for schemas, writes and one-shot
//! queries, and WebSocket subscriptions that keep a client's copy of a window
//! equal to the server's (docs/PROTOCOL.md). One writer thread owns the engine
//! and the store ([`writer`]); network tasks talk to it through a bounded queue.

pub mod access;
pub mod api;
pub mod auth;
pub mod backup;
pub mod backup_cmd;
pub mod cli;
pub mod cluster;
pub mod demo;
pub mod demo_data;
pub mod digest;
pub mod encode;
pub mod error;
pub mod frame;
pub mod frame_body;
pub mod http;
pub mod http_state;
pub mod idempotency;
pub mod limits;
pub mod logging;
pub mod metrics;
pub mod min_seq;
pub mod name_routes;
pub mod pg_follow;
pub mod rate_limit;
pub mod refs;
pub mod related;
#[cfg(test)]
mod repeated_keys_tests;
pub mod rng;
pub mod routing;
pub mod rules;
pub mod server;
pub mod silent_sockets;
pub mod strict_json;
pub mod sub_table;
pub mod submit;
pub mod wire;
pub mod write_buffers;
pub mod write_guard;
pub mod write_rules;
pub mod writer;
pub mod ws;
