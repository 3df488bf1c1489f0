//! The source against a real PostgreSQL 15 (one throw-away server per test,
//! started by `ordo_test_kit::postgres::PostgresServer`).

mod harness;
mod model;
mod refusals;
mod tls;
mod types;
