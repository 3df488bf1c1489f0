//! The reverse index of one reference field: target id → the slots referencing it.
//!
//! When a target item changes, the engine reads the list of the slots whose
//! reference holds the target's id and moves each of them in the views that read
//! through the reference (see `engine::references`). As in the equality index
//! (`key_index`), the index keys lists by a 64-bit hash of the id, never a copy
//! of it: two ids that collide share one list, and the reader compares each
//! slot's reference with the target's id, so a collision costs work, never
//! correctness.
//!
//! Each list is one contiguous array of slots, and each slot knows its place in
//! its list, so a reference changing target leaves one list by a swap with the
//! last slot and joins another at its end, in O(1). (The lists were threaded
//! through per-slot `next` links before: reading a room's members was then a
//! chain of dependent cache misses, one per member, 30 % of a message's time at
//! 10 000 users; an array is read ahead by the hardware.) An emptied list keeps its
//! buffer for the next id, so the index allocates only when a list grows past
//! any size it had, or a new id appears while the table is full.

use hashbrown::{DefaultHashBuilder, HashTable};
use std::hash::BuildHasher;

use crate::ids::Slot;

/// A slot in no list (null reference, free slot).
const NOT_LISTED: u32 = u32::MAX;

/// One hash of a target id and its list. Exists while the list is not empty.
#[derive(Clone, Copy)]
struct Head {
    hash: u64,
    list: u32,
}

#[derive(Default)]
pub(crate) struct RefIndex {
    hasher: DefaultHashBuilder,
    heads: HashTable<Head>,
    /// The lists, by the index a head names; empty ones wait in `free_lists`.
    lists: Vec<Vec<Slot>>,
    /// Empty lists, with their buffers, for the next new id. Its capacity follows
    /// `lists`' so that emptying a list never allocates.
    free_lists: Vec<u32>,
    /// Per slot, its place in its list (`NOT_LISTED`: none).
    place: Vec<u32>,
    /// The most slots any list has held: what a reader copying a list out needs
    /// room for, known before a target change asks (so that it allocates nothing).
    longest_list_len: usize,
}

impl RefIndex {
    pub(crate) fn hash_id(&self, id: &str) -> u64 {
        self.hasher.hash_one(id)
    }

    /// Adds `slot` to the list of `hash` (the slot is in no list).
    pub(crate) fn link(&mut self, slot: Slot, hash: u64) {
        let index = slot as usize;
        if index >= self.place.len() {
            // New slots only: amortised growth, never in a steady state of updates.
            self.place.resize((index + 1).next_power_of_two(), NOT_LISTED);
        }
        debug_assert_eq!(self.place[index], NOT_LISTED);
        let list = match self.heads.find(hash, |head| head.hash == hash) {
            Some(head) => head.list,
            None => {
                let list = self.free_lists.pop().unwrap_or_else(|| {
                    self.lists.push(Vec::new());
                    if self.free_lists.capacity() < self.lists.len() {
                        self.free_lists.reserve_exact(self.lists.capacity() - self.free_lists.len());
                    }
                    (self.lists.len() - 1) as u32
                });
                self.heads.insert_unique(hash, Head { hash, list }, |head| head.hash);
                list
            }
        };
        let slots = &mut self.lists[list as usize];
        if slots.len() == slots.capacity() {
            // A quarter more, not double: most lists are built once and then change
            // by a member at a time (`spare_after_build` gives them room for that).
            slots.reserve_exact(slots.len() / 4 + 2);
        }
        self.place[index] = slots.len() as u32;
        slots.push(slot);
        self.longest_list_len = self.longest_list_len.max(slots.len());
    }

    /// The most slots any list has held (a high-water mark, never lowered).
    pub(crate) fn longest_list_len(&self) -> usize {
        self.longest_list_len
    }

    /// After the index is built by a scan: gives every list room for a few more
    /// slots (an eighth, at least two), so that a reference moving between two
    /// targets, which lists it in both for a moment, does not grow a full list.
    pub(crate) fn spare_after_build(&mut self) {
        for slots in &mut self.lists {
            slots.reserve_exact(slots.len() / 8 + 2);
        }
    }

    /// Takes `slot` out of the list of `hash` (where it must be).
    pub(crate) fn unlink(&mut self, slot: Slot, hash: u64) {
        let Ok(entry) = self.heads.find_entry(hash, |head| head.hash == hash) else {
            unreachable!("a listed slot's hash has a head")
        };
        let list = entry.get().list;
        let slots = &mut self.lists[list as usize];
        let place = std::mem::replace(&mut self.place[slot as usize], NOT_LISTED) as usize;
        debug_assert_eq!(slots[place], slot, "a slot's place names it");
        slots.swap_remove(place);
        if let Some(&moved) = slots.get(place) {
            self.place[moved as usize] = place as u32;
        }
        if slots.is_empty() {
            entry.remove();
            self.free_lists.push(list);
        }
    }

    /// The slots listed under `hash` (those whose reference has that hash).
    pub(crate) fn slots(&self, hash: u64) -> &[Slot] {
        self.heads.find(hash, |head| head.hash == hash).map_or(&[], |head| &self.lists[head.list as usize])
    }

    /// Heap bytes: 4 per slot for its place, 4 per listed slot, and the lists and heads.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.place.capacity() * std::mem::size_of::<u32>()
            + self.lists.iter().map(|slots| slots.capacity() * std::mem::size_of::<Slot>()).sum::<usize>()
            + self.lists.capacity() * std::mem::size_of::<Vec<Slot>>()
            + self.free_lists.capacity() * std::mem::size_of::<u32>()
            + self.heads.allocation_size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lists against a naive map, through links, unlinks and relinks.
    #[test]
    fn lists_match_a_naive_map() {
        let mut index = RefIndex::default();
        let mut naive: Vec<Option<u64>> = vec![None; 64];
        let mut state = 7u64;
        for _ in 0..5_000 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let slot = (state >> 33) as usize % 64;
            let hash = (state >> 20) % 5;
            if let Some(old) = naive[slot].take() {
                index.unlink(slot as Slot, old);
            }
            if !state.is_multiple_of(3) {
                index.link(slot as Slot, hash);
                naive[slot] = Some(hash);
            }
            for hash in 0..5 {
                let mut listed: Vec<usize> = index.slots(hash).iter().map(|&slot| slot as usize).collect();
                listed.sort_unstable();
                let expected: Vec<usize> = (0..64).filter(|&slot| naive[slot] == Some(hash)).collect();
                assert_eq!(listed, expected);
            }
        }
    }
}
