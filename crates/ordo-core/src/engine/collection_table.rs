//! The engine's collections by [`CollectionId`], with room for drops.
//!
//! A dropped collection leaves its slot empty, and the next collection created
//! reuses the slot with its generation raised by one. A `CollectionId` carries
//! the generation it was issued with, so an id kept past its collection's drop
//! finds nothing (`UnknownCollection`) instead of silently naming the new
//! collection in the same slot. Why generations rather than never reusing a
//! slot: a server that creates and drops collections all day would otherwise
//! grow the table without bound (every input has a limit, and this one is
//! `MAX_COLLECTIONS` live collections, not collections ever created). A
//! generation is 32 bits: an id could alias again only after 2^32 drops of
//! collections in the same slot while it was kept.

use std::hash::BuildHasher;

use hashbrown::{DefaultHashBuilder, HashTable};

use super::CollectionState;
use crate::ids::CollectionId;

struct Entry {
    generation: u32,
    state: Option<CollectionState>,
}

#[derive(Default)]
pub(super) struct CollectionTable {
    entries: Vec<Entry>,
    /// Empty slots, reused by the next creations.
    free: Vec<u32>,
    n_live: usize,
    /// Live collections by name: slot indices, hashed by the name the collection
    /// holds (4 bytes an entry; a map keyed by a copy of the name costs each
    /// user's list about 70 bytes).
    by_name: HashTable<u32>,
    hasher: DefaultHashBuilder,
}

impl CollectionTable {
    /// Number of live collections.
    pub(super) fn len(&self) -> usize {
        self.n_live
    }

    /// Adds a collection; its name must be free ([`CollectionTable::id_by_name`]).
    pub(super) fn insert(&mut self, state: CollectionState) -> CollectionId {
        debug_assert!(self.id_by_name(state.collection.name()).is_none());
        self.n_live += 1;
        let hash = self.hasher.hash_one(state.collection.name());
        let id = self.insert_entry(state);
        let (entries, hasher) = (&self.entries, &self.hasher);
        self.by_name.insert_unique(hash, id.index, |&index| hasher.hash_one(Self::name_at(entries, index)));
        id
    }

    /// The live collection named `name`.
    pub(super) fn id_by_name(&self, name: &str) -> Option<CollectionId> {
        let hash = self.hasher.hash_one(name);
        let &index = self.by_name.find(hash, |&index| Self::name_at(&self.entries, index) == name)?;
        Some(self.id_at(index))
    }

    fn name_at(entries: &[Entry], index: u32) -> &str {
        entries[index as usize].state.as_ref().expect("named collections are live").collection.name()
    }

    fn insert_entry(&mut self, state: CollectionState) -> CollectionId {
        match self.free.pop() {
            Some(index) => {
                let entry = &mut self.entries[index as usize];
                debug_assert!(entry.state.is_none());
                entry.generation = entry.generation.wrapping_add(1);
                entry.state = Some(state);
                CollectionId { index, generation: entry.generation }
            }
            None => {
                super::push_with_slack_of_an_eighth(&mut self.entries, Entry { generation: 0, state: Some(state) });
                CollectionId { index: (self.entries.len() - 1) as u32, generation: 0 }
            }
        }
    }

    /// Takes a collection out; its id (and every copy of it) is dead from now on.
    pub(super) fn remove(&mut self, id: CollectionId) -> Option<CollectionState> {
        let entry = self.entries.get(id.index as usize).filter(|entry| entry.generation == id.generation)?;
        let name = entry.state.as_ref()?.collection.name();
        let hash = self.hasher.hash_one(name);
        if let Ok(found) = self.by_name.find_entry(hash, |&index| index == id.index) {
            found.remove();
        }
        let state = self.entries[id.index as usize].state.take().expect("checked live");
        self.free.push(id.index);
        self.n_live -= 1;
        Some(state)
    }

    pub(super) fn get(&self, id: CollectionId) -> Option<&CollectionState> {
        let entry = self.entries.get(id.index as usize)?;
        (entry.generation == id.generation).then_some(entry.state.as_ref()).flatten()
    }

    pub(super) fn get_mut(&mut self, id: CollectionId) -> Option<&mut CollectionState> {
        let entry = self.entries.get_mut(id.index as usize)?;
        if entry.generation != id.generation {
            return None;
        }
        entry.state.as_mut()
    }

    /// The id of the live collection in slot `index` (views know their slot).
    /// One collection mutably and every other one shared (a referencing collection
    /// written while its reference targets are read).
    pub(super) fn split_mut(&mut self, id: CollectionId) -> Option<(&mut CollectionState, OtherCollections<'_>)> {
        let index = id.index as usize;
        let entry = self.entries.get(index)?;
        if entry.generation != id.generation || entry.state.is_none() {
            return None;
        }
        let (before, rest) = self.entries.split_at_mut(index);
        let (entry, after) = rest.split_first_mut().expect("index is in range");
        let state = entry.state.as_mut().expect("checked live");
        Some((state, OtherCollections { before, after, index: id.index }))
    }

    pub(super) fn id_at(&self, index: u32) -> CollectionId {
        let entry = &self.entries[index as usize];
        debug_assert!(entry.state.is_some(), "a view's collection is live");
        CollectionId { index, generation: entry.generation }
    }

    /// Live collections, in slot order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &CollectionState> {
        self.entries.iter().filter_map(|entry| entry.state.as_ref())
    }

    /// Ids of the live collections, in slot order.
    pub(super) fn ids(&self) -> Vec<CollectionId> {
        (0..self.entries.len() as u32)
            .filter(|&index| self.entries[index as usize].state.is_some())
            .map(|index| self.id_at(index))
            .collect()
    }
}

/// By slot: for views, whose collection is live as long as they are.
impl std::ops::Index<u32> for CollectionTable {
    type Output = CollectionState;

    fn index(&self, index: u32) -> &CollectionState {
        self.entries[index as usize].state.as_ref().expect("a view's collection is live")
    }
}

impl std::ops::IndexMut<u32> for CollectionTable {
    fn index_mut(&mut self, index: u32) -> &mut CollectionState {
        self.entries[index as usize].state.as_mut().expect("a view's collection is live")
    }
}

/// Every collection but the one [`CollectionTable::split_mut`] lent mutably.
pub(super) struct OtherCollections<'a> {
    before: &'a [Entry],
    after: &'a [Entry],
    index: u32,
}

impl OtherCollections<'_> {
    pub(super) fn get(&self, id: CollectionId) -> Option<&CollectionState> {
        let entry = match (id.index).cmp(&self.index) {
            std::cmp::Ordering::Less => self.before.get(id.index as usize)?,
            std::cmp::Ordering::Equal => return None,
            std::cmp::Ordering::Greater => self.after.get((id.index - self.index - 1) as usize)?,
        };
        (entry.generation == id.generation).then_some(entry.state.as_ref()).flatten()
    }
}
