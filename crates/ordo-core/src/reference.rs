//! The reverse index of one reference field: target id → the slots referencing it.
//!
//! When a target item changes, the engine walks the list of the slots whose
//! reference holds the target's id and moves each of them in the views that read
//! through the reference (see `engine::references`). As in the equality index
//! (`key_index`), the index keys lists by a 64-bit hash of the id, never a copy
//! of it: two ids that collide share one list, and the walker compares each
//! slot's reference with the target's id, so a collision costs work, never
//! correctness. Each list is threaded through two per-slot arrays, so a
//! reference changing target is unlinked and linked in O(1) and never allocates;
//! the table allocates only when a new id appears while its capacity is full.

use hashbrown::{DefaultHashBuilder, HashTable};
use std::hash::BuildHasher;

use crate::collection::Slot;

/// The end of a slot list.
pub(crate) const NO_SLOT: Slot = Slot::MAX;

/// One hash of a target id: the head of its list. Exists while the list is not empty.
#[derive(Clone, Copy)]
struct Head {
    hash: u64,
    first_slot: Slot,
}

#[derive(Default)]
pub(crate) struct RefIndex {
    hasher: DefaultHashBuilder,
    heads: HashTable<Head>,
    /// Per slot, the next and previous slot of its list (`NO_SLOT` at the ends and
    /// for slots in no list: null references, free slots).
    next: Vec<Slot>,
    previous: Vec<Slot>,
}

impl RefIndex {
    pub(crate) fn hash_id(&self, id: &str) -> u64 {
        self.hasher.hash_one(id)
    }

    /// Adds `slot` to the list of `hash` (the slot is in no list).
    pub(crate) fn link(&mut self, slot: Slot, hash: u64) {
        let index = slot as usize;
        if index >= self.next.len() {
            // New slots only: amortised growth, never in a steady state of updates.
            let len = (index + 1).next_power_of_two();
            self.next.resize(len, NO_SLOT);
            self.previous.resize(len, NO_SLOT);
        }
        debug_assert!(self.next[index] == NO_SLOT && self.previous[index] == NO_SLOT);
        match self.heads.find_mut(hash, |head| head.hash == hash) {
            Some(head) => {
                let old_first = head.first_slot;
                head.first_slot = slot;
                self.next[index] = old_first;
                self.previous[old_first as usize] = slot;
            }
            None => {
                self.heads.insert_unique(hash, Head { hash, first_slot: slot }, |head| head.hash);
            }
        }
    }

    /// Takes `slot` out of the list of `hash` (where it must be).
    pub(crate) fn unlink(&mut self, slot: Slot, hash: u64) {
        let index = slot as usize;
        let (next, previous) = (self.next[index], self.previous[index]);
        if previous == NO_SLOT {
            let Ok(entry) = self.heads.find_entry(hash, |head| head.hash == hash) else {
                unreachable!("a linked slot's hash has a head")
            };
            debug_assert_eq!(entry.get().first_slot, slot);
            if next == NO_SLOT {
                entry.remove();
            } else {
                entry.into_mut().first_slot = next;
            }
        } else {
            self.next[previous as usize] = next;
        }
        if next != NO_SLOT {
            self.previous[next as usize] = previous;
        }
        self.next[index] = NO_SLOT;
        self.previous[index] = NO_SLOT;
    }

    /// The first slot of the list of `hash` (`NO_SLOT`: none).
    pub(crate) fn first(&self, hash: u64) -> Slot {
        self.heads.find(hash, |head| head.hash == hash).map_or(NO_SLOT, |head| head.first_slot)
    }

    /// The slot after `slot` in its list (`NO_SLOT`: the end).
    pub(crate) fn next(&self, slot: Slot) -> Slot {
        self.next[slot as usize]
    }

    /// Heap bytes: 8 per slot plus the table of heads.
    pub(crate) fn heap_bytes(&self) -> usize {
        (self.next.capacity() + self.previous.capacity()) * std::mem::size_of::<Slot>()
            + self.heads.capacity() * (std::mem::size_of::<Head>() + 1)
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
                let mut listed = Vec::new();
                let mut slot = index.first(hash);
                while slot != NO_SLOT {
                    listed.push(slot as usize);
                    slot = index.next(slot);
                }
                listed.sort_unstable();
                let expected: Vec<usize> = (0..64).filter(|&slot| naive[slot] == Some(hash)).collect();
                assert_eq!(listed, expected);
            }
        }
    }
}
