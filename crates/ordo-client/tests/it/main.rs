//! One integration-test binary for the crate (as eyeball does).

mod state;

mod vectors;
