//! Integration tests of the engine's public API (one binary, as eyeball does).

mod model;
mod reference;
