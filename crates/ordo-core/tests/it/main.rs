//! Integration tests of the engine's public API (one binary, as eyeball does).

mod alloc;
mod bad_input;
mod model;
mod reference;

#[global_allocator]
static ALLOCATOR: alloc::CountingAllocator = alloc::CountingAllocator;
