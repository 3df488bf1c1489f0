//! Integration tests of the engine's public API (one binary, as eyeball does).

mod alloc;
mod atomics;
mod bad_input;
mod bulk_load;
mod conversions;
mod key_windows;
mod keyed_views;
mod large_views;
mod layouts;
mod many_lists;
mod many_windows;
mod model;
mod ref_fields;
mod ref_limits;
mod ref_memory;
mod ref_model;
mod reference;
mod schema_model;
mod shared_plans;
mod single_upsert;
mod window_changes;
mod window_contents;

#[global_allocator]
static ALLOCATOR: alloc::CountingAllocator = alloc::CountingAllocator;
