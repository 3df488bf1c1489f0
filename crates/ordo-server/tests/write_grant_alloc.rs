//! A write grant is built for every write part (an admin's too): the usual
//! single group of limits is held inline, so building one allocates nothing.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

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
