//! What every write builds on its way, counted: a write grant (built for every
//! write part, an admin's too: the usual single group of limits is held inline)
//! and, in cluster mode, the stream entry each node decodes (its one op inline,
//! its strings borrowed from the message, its caller's claims read only when
//! the caller is not the last one's). Neither allocates.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use ordo_server::cluster::entry::{Decoded, Kind};
use ordo_server::rules::Grant;
use ordo_server::write_rules::{parse_write, WriteDoc, WriteGrant, WriteLimits};

struct CountingAllocator;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is passed on to the system allocator unchanged; the
// counter is a thread-local `Cell` of plain integers, which allocates nothing.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|count| count.set(count.get() + 1));
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` through `alloc` above, with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn allocations_in(work: impl FnOnce()) -> u64 {
    let before = ALLOCATIONS.with(Cell::get);
    work();
    ALLOCATIONS.with(Cell::get) - before
}

#[test]
fn an_admins_grant_and_a_one_rule_grant_allocate_nothing() {
    assert_eq!(allocations_in(|| drop(std::hint::black_box(WriteGrant::everything()))), 0);
    let one_rule = allocations_in(|| {
        let mut grant = WriteGrant::default();
        grant.add(&WriteLimits::EVERYTHING, Grant::All);
        assert!(std::hint::black_box(&grant).is_unrestricted());
    });
    assert_eq!(one_rule, 0);
    // A second group of other limits spills to the heap, and still holds both.
    let doc: WriteDoc = serde_json::from_str(r#"{"remove": false}"#).unwrap();
    let (_, no_removal) = parse_write(&doc).unwrap().expect("a grant");
    let mut limits_of_two = 0;
    let two = allocations_in(|| {
        let mut grant = WriteGrant::everything();
        grant.add(&no_removal, Grant::All);
        limits_of_two = grant.groups().len();
    });
    assert_eq!(limits_of_two, 2);
    assert!(two > 0, "the second group is on the heap");
}

#[test]
fn a_one_op_stream_entry_decodes_without_allocating() {
    let one_op = br#"{"kind":"write","collection":"rooms","ops":[{"op":"upsert","id":"r1","fields":{"recency":7}}],"caller":{"sub":"anonymous","role":"admin","claims":{}}}"#;
    let mut n_ops = 0;
    let allocations = allocations_in(|| {
        let entry = Decoded::decode(one_op).unwrap();
        assert_eq!(entry.kind, Kind::Write);
        n_ops = entry.ops.as_deref().map_or(0, <[_]>::len);
    });
    assert_eq!(n_ops, 1);
    assert_eq!(allocations, 0, "a one-op entry is decoded in place");
    // Two ops spill to the heap, and both are there.
    let two_ops = br#"{"kind":"write","collection":"rooms","ops":[{"op":"upsert","id":"r1"},{"op":"remove","id":"r2"}],"caller":{"sub":"anonymous","role":"admin","claims":{}}}"#;
    let entry = Decoded::decode(two_ops).unwrap();
    let ids: Vec<&str> = entry.ops.as_deref().unwrap().iter().map(|op| &*op.id).collect();
    assert_eq!(ids, ["r1", "r2"]);
}

/// A token's claims (auth on) are read into the identity once, for the first
/// entry of their caller; each next entry of that caller is told apart from
/// the identity kept by its claims' text, which it does not copy. (A claim
/// holding an array or an object costs one allocation: serde_json skips a
/// nested value with a stack it grows on the heap.)
#[test]
fn an_entry_of_the_last_caller_with_claims_decodes_without_allocating() {
    let entry_of = |recency: u64| {
        format!(
            r#"{{"kind":"write","collection":"rooms","ops":[{{"op":"upsert","id":"r1","fields":{{"recency":{recency}}}}}],"caller":{{"sub":"u7","role":"writer","claims":{{"sub":"u7","team":"blue","exp":1800000000}}}}}}"#
        )
    };
    let first = entry_of(1);
    let first = Decoded::decode(first.as_bytes()).unwrap();
    let identity = first.caller.identity().unwrap();
    assert_eq!(identity.claims["team"], "blue");
    let claims_text = first.caller.claims_text().to_owned();
    let next = entry_of(2);
    let mut is_the_same_caller = false;
    let allocations = allocations_in(|| {
        let entry = Decoded::decode(next.as_bytes()).unwrap();
        is_the_same_caller = entry.caller.is(&identity, &claims_text);
    });
    assert!(is_the_same_caller);
    assert_eq!(allocations, 0, "the next entry of the same caller reads no claims");
}
