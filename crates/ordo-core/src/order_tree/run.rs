//! A small view's index: its entries in one sorted run, two parallel arrays sized
//! to the view.
//!
//! A user's room list is about a hundred entries. In the node tree that is two
//! 1.3 KB leaves and a 1.8 KB inner node whatever the view holds (about 57 bytes
//! per entry at a hundred), where a run costs the entries' own 20 bytes and a
//! sixteenth of slack. Rank is the position, so select is an index and a removal
//! needs no counts to fix on the way up; the run has no slot → leaf map, but a
//! scan of at most [`RUN_MAX`] slots finds an entry without its old prefix.
//!
//! A removal by slot leaves a *gap*: the entry stays in the arrays, skipped by
//! every read, until the next insert fills it or another change closes it. The
//! engine moves an item as a removal followed by an insert, so a room moving from
//! rank `p` to the top shifts the `p` entries before it once, instead of the
//! `len - p` after it and then all `len` again.

use std::cmp::Ordering;

use crate::ids::Slot;
use crate::prefetch::{prefetch, prefetch_lines};
use crate::sort::Prefix;

use super::{Entry, PackedEntry};

/// Past this many entries a view's index becomes a node tree: a shift of a run
/// moves up to `RUN_MAX` × 20 bytes, and a binary search over a run touches a
/// cache line per step, where the tree's leaves keep both within 1.3 KB.
pub(crate) const RUN_MAX: usize = 192;
/// A run holding entries has at least this many places (640 bytes, half a tree
/// leaf): the members of a small keyed view come and go (items changing owner),
/// and a run grown a few places at a time would allocate each time the view
/// reached a size it never had.
const GROWN_CAPACITY_MIN: usize = 32;

/// Places for `len` entries and a sixteenth more (at least [`GROWN_CAPACITY_MIN`]):
/// at a hundred entries, 21.2 bytes per entry, so that the view's entries with its
/// fixed part stay within the 24 bytes an entry that a user's room list may cost.
/// The slack serves a view's first few new members (a move needs none: it leaves
/// a gap and fills it).
fn capacity_for(len: usize) -> usize {
    (len + len / 16).max(GROWN_CAPACITY_MIN)
}

pub(crate) struct Run {
    prefixes: Vec<Prefix>,
    slots: Vec<Slot>,
    /// Place of the entry removed last and not yet shifted out (`NO_GAP`: none);
    /// ranks at or past it are read one place further on.
    gap: usize,
}

const NO_GAP: usize = usize::MAX;

/// Lines of slots a move's first prefetch asks for: all the slots of a run of up
/// to 128 entries (a user's 100 rooms), which the scan for the moving entry reads.
/// The prefixes are asked for once the scan has found the place
/// ([`Run::prefetch_shift_of`]): exactly the lines the move shifts, where a fixed
/// guess missed some and asked for others in vain (a line asked for in vain
/// costs as much as one missed while the memory system is saturated).
const RUN_SLOT_PREFETCH_LINES: usize = 8;

impl Run {
    /// A run of entries already in order, with a sixteenth more places (at least
    /// [`GROWN_CAPACITY_MIN`]): a view's first new member then finds room, as its
    /// first move does, instead of allocating on the update that brings it.
    pub(crate) fn from_sorted(entries: &[PackedEntry]) -> Run {
        debug_assert!(entries.len() <= RUN_MAX);
        let capacity = if entries.is_empty() { 0 } else { capacity_for(entries.len()) };
        let mut run = Run { prefixes: Vec::with_capacity(capacity), slots: Vec::with_capacity(capacity), gap: NO_GAP };
        for entry in entries.iter().map(|entry| entry.unpack()) {
            run.prefixes.push(entry.prefix);
            run.slots.push(entry.slot);
        }
        run
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.slots.len() - usize::from(self.gap != NO_GAP)
    }

    /// Where the entry of rank `rank` sits in the arrays.
    #[inline]
    fn place_of(&self, rank: usize) -> usize {
        rank + usize::from(rank >= self.gap)
    }

    /// The entries in order, to build a node tree from when the run outgrows [`RUN_MAX`].
    pub(crate) fn packed_entries(&self) -> Vec<PackedEntry> {
        (0..self.len()).map(|rank| self.select(rank)).map(|entry| PackedEntry::new(entry.prefix, entry.slot)).collect()
    }

    /// Shifts the gap's entry out, if there is one.
    fn close_gap(&mut self) {
        if self.gap != NO_GAP {
            self.prefixes.remove(self.gap);
            self.slots.remove(self.gap);
            self.gap = NO_GAP;
        }
    }

    /// Asks the cache for what a move reads first: the slots, scanned for the
    /// one that moves.
    #[inline]
    pub(crate) fn prefetch(&self) {
        prefetch_lines(&self.slots, RUN_SLOT_PREFETCH_LINES);
    }

    /// Once the slots are in cache (after [`Run::prefetch`]): asks for the
    /// prefixes between the front and `slot`'s place, which a move of `slot` to
    /// the top (the chat case) reads and shifts.
    #[inline]
    pub(crate) fn prefetch_shift_of(&self, slot: Slot) {
        let Some(place) = self.position_of_slot(slot) else {
            return;
        };
        let prefixes_per_line = 64 / std::mem::size_of::<Prefix>();
        for prefix in self.prefixes[..=place].iter().step_by(prefixes_per_line) {
            prefetch(prefix);
        }
        // The last line, when the first prefix does not start one.
        prefetch(&self.prefixes[place]);
    }

    /// Where `slot` is, by a scan (a run is small and its slots contiguous), 16
    /// slots at a time: whether a block holds it is an OR of 16 compares with no
    /// exit between them, which the compiler turns into a few vector
    /// instructions; only the block that does is searched slot by slot (a plain
    /// `position`, with an exit per slot, cost about 4 instructions per slot).
    #[inline]
    fn position_of_slot(&self, slot: Slot) -> Option<usize> {
        let blocks = self.slots.chunks_exact(16);
        let tail_start = self.slots.len() - blocks.remainder().len();
        for (block_index, block) in blocks.enumerate() {
            let block: &[Slot; 16] = block.try_into().expect("blocks of 16");
            if block.iter().fold(false, |is_here, &held| is_here | (held == slot)) {
                return block.iter().position(|&held| held == slot).map(|index| block_index * 16 + index);
            }
        }
        self.slots[tail_start..].iter().position(|&held| held == slot).map(|index| tail_start + index)
    }

    #[inline]
    pub(crate) fn holds_slot(&self, slot: Slot) -> bool {
        self.position_of_slot(slot).is_some_and(|place| place != self.gap)
    }

    /// Inserts an entry that is not in the run; returns its rank. Fills the gap
    /// if there is one (shifting only the entries between the gap and the new
    /// place); else grows the run when full (a view gaining members past its
    /// slack), which a move never does.
    pub(crate) fn insert(&mut self, entry: Entry, compare: &impl Fn(Entry, Entry) -> Ordering) -> usize {
        // The chat case: a room moving to the top goes before every entry.
        let rank = if self.len() > 0 && entry.prefix < self.select(0).prefix {
            0
        } else {
            self.partition_point(entry, compare)
        };
        let gap = self.gap;
        if gap != NO_GAP {
            if rank <= gap {
                self.prefixes.copy_within(rank..gap, rank + 1);
                self.slots.copy_within(rank..gap, rank + 1);
            } else {
                self.prefixes.copy_within(gap + 1..rank + 1, gap);
                self.slots.copy_within(gap + 1..rank + 1, gap);
            }
            self.prefixes[rank] = entry.prefix;
            self.slots[rank] = entry.slot;
            self.gap = NO_GAP;
            return rank;
        }
        if self.slots.len() == self.slots.capacity() {
            let more = capacity_for(self.slots.len() + 16) - self.slots.len();
            self.prefixes.reserve_exact(more);
            self.slots.reserve_exact(more);
        }
        self.prefixes.insert(rank, entry.prefix);
        self.slots.insert(rank, entry.slot);
        rank
    }

    /// Removes an entry that is in the run; returns the rank it had.
    pub(crate) fn remove(&mut self, entry: Entry, compare: &impl Fn(Entry, Entry) -> Ordering) -> usize {
        self.close_gap();
        let rank = self.rank_of(entry, compare);
        self.gap = rank;
        rank
    }

    /// Removes the entry of `slot`, found by a scan, leaving a gap; returns its
    /// rank and prefix.
    pub(crate) fn remove_slot(&mut self, slot: Slot) -> (usize, Prefix) {
        self.remove_slot_if_held(slot).expect("removed slot must be in the index (index out of sync with item data)")
    }

    /// As `remove_slot`, for a slot that may not be in the run (`None`): one scan
    /// answers both questions.
    pub(crate) fn remove_slot_if_held(&mut self, slot: Slot) -> Option<(usize, Prefix)> {
        self.close_gap();
        let place = self.position_of_slot(slot)?;
        self.gap = place;
        Some((place, self.prefixes[place]))
    }

    /// The rank of an entry that is in the run.
    pub(crate) fn rank_of(&self, entry: Entry, compare: &impl Fn(Entry, Entry) -> Ordering) -> usize {
        let rank = self.partition_point(entry, compare);
        assert!(
            rank < self.len() && self.select(rank).slot == entry.slot,
            "entry must be in the index (index out of sync with item data)"
        );
        rank
    }

    /// How many entries sort before `entry` (in the run or not).
    pub(crate) fn position_of(&self, entry: Entry, compare: &impl Fn(Entry, Entry) -> Ordering) -> usize {
        self.partition_point(entry, compare)
    }

    #[inline]
    pub(crate) fn select(&self, rank: usize) -> Entry {
        let place = self.place_of(rank);
        Entry { prefix: self.prefixes[place], slot: self.slots[place] }
    }

    /// Appends the slots of ranks `start..end` (clipped to the run) to `out`.
    pub(crate) fn collect_range(&self, start: usize, end: usize, out: &mut Vec<Slot>) {
        let end = end.min(self.len());
        if start >= end {
            return;
        }
        // The places of the ranks, around the gap.
        let (first, last) = (self.place_of(start), self.place_of(end - 1));
        if first <= self.gap && self.gap <= last {
            out.extend_from_slice(&self.slots[first..self.gap]);
            out.extend_from_slice(&self.slots[self.gap + 1..=last]);
        } else {
            out.extend_from_slice(&self.slots[first..=last]);
        }
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.prefixes.capacity() * std::mem::size_of::<Prefix>() + self.slots.capacity() * std::mem::size_of::<Slot>()
    }

    /// Number of entries that precede `entry`: a binary search on the prefixes
    /// (plain `u128` compares), then the equal-prefix run, almost always empty,
    /// resolved with the full comparison.
    #[inline]
    fn partition_point(&self, entry: Entry, compare: &impl Fn(Entry, Entry) -> Ordering) -> usize {
        let before = |&prefix: &Prefix| prefix < entry.prefix;
        let mut rank = if self.gap == NO_GAP {
            self.prefixes.partition_point(before)
        } else {
            // The two sides of the gap, each in order.
            let n_left = self.prefixes[..self.gap].partition_point(before);
            if n_left < self.gap {
                n_left
            } else {
                self.gap + self.prefixes[self.gap + 1..].partition_point(before)
            }
        };
        while rank < self.len() && self.select(rank).prefix == entry.prefix {
            if compare(self.select(rank), entry) != Ordering::Less {
                break;
            }
            rank += 1;
        }
        rank
    }

    #[cfg(test)]
    pub(crate) fn check_invariants(&self, compare: impl Fn(Entry, Entry) -> Ordering) {
        assert_eq!(self.prefixes.len(), self.slots.len(), "parallel arrays");
        assert!(self.gap == NO_GAP || self.gap < self.slots.len(), "gap past the end");
        assert!(self.len() <= RUN_MAX, "a run past RUN_MAX");
        for index in 1..self.len() {
            // Ranks, read around the gap.
            assert_eq!(compare(self.select(index - 1), self.select(index)), Ordering::Less, "entries out of order");
        }
    }
}
