//! One integration-test binary for the crate (as eyeball does).

mod e2e;
mod failover;
mod scripted;
mod server;
mod state;
mod vectors;
