//! A small view's index: its entries in one sorted run, two parallel arrays sized
//! to the view.
//!
//! A user's room list is about a hundred entries. In the node tree that is two
//! 1.3 KB leaves and a 1.8 KB inner node whatever the view holds (about 57 bytes
//! per entry at a hundred), where a run costs the entries' own 20 bytes and a
//! sixteenth of slack. A run has no slot → leaf map: a scan of its slots finds an
//! entry without its old prefix.
//!
//! The slack is kept as *free places* among the entries, so that a change moves
//! few of them: places before the first entry (the *head*), and up to
//! [`MAX_GAPS`] *gaps* left by removals, skipped by every read. The engine moves
//! an item as a removal followed by an insert; a room moving to the top of its
//! list leaves a gap where it was and takes the head's last free place, shifting
//! nothing, or, when the head is empty, shifts the entries up to the nearest gap
//! (about `len / free places` of them, where a packed run shifted every entry
//! before the old place). Every free place holds [`FREE`] as its slot, so a scan
//! for a slot never finds one.
//!
//! Invariants: the head is `0..head`; every gap lies after it and holds a prefix
//! in order with its neighbours, so that the prefixes from the head on never
//! decrease and one binary search over them, gaps included, counts the entries
//! before a prefix; the place right after the head is an entry (a gap there is
//! taken into the head).

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
/// Gaps a run keeps track of (a place is a byte: a run never has more than
/// `capacity_for(RUN_MAX + 16)` places). A removal when all are taken first
/// shifts the entries before the first gap into the head.
const MAX_GAPS: usize = 12;
/// The slot of a free place: never an item's (`limits::MAX_ITEMS_PER_COLLECTION`
/// is below it).
const FREE: Slot = Slot::MAX;

const _: () = assert!(capacity_for(RUN_MAX + 16) <= u8::MAX as usize);
const _: () = assert!((crate::limits::MAX_ITEMS_PER_COLLECTION as u64) < FREE as u64);

/// Places for `len` entries and a sixteenth more (at least [`GROWN_CAPACITY_MIN`]):
/// at a hundred entries, 21.2 bytes per entry, so that the view's entries with its
/// fixed part stay within the 24 bytes an entry that a user's room list may cost.
/// The slack serves a view's first few new members, and a move's shift (a move
/// needs no new place: its removal frees one).
const fn capacity_for(len: usize) -> usize {
    let places = len + len / 16;
    if places > GROWN_CAPACITY_MIN {
        places
    } else {
        GROWN_CAPACITY_MIN
    }
}

pub(crate) struct Run {
    /// The prefix of each place; the two arrays have one element per place.
    prefixes: Vec<Prefix>,
    /// The slot of each place ([`FREE`] for a free one).
    slots: Vec<Slot>,
    /// Free places before the first entry.
    head: u8,
    n_gaps: u8,
    /// The gaps' places, ascending (the first `n_gaps`).
    gaps: [u8; MAX_GAPS],
}

/// Lines of slots a move's first prefetch asks for: all the slots of a run of up
/// to 128 places (a user's 100 rooms and their slack), which the scan for the
/// moving entry reads. The prefixes are asked for once the scan has found the
/// place ([`Run::prefetch_shift_of`]).
const RUN_SLOT_PREFETCH_LINES: usize = 8;

impl Run {
    /// A run of entries already in order, its slack in the head: a view's first
    /// new member then finds room, as its first moves to the top do, instead of
    /// allocating on the update that brings it.
    pub(crate) fn from_sorted(entries: &[PackedEntry]) -> Run {
        debug_assert!(entries.len() <= RUN_MAX);
        let places = if entries.is_empty() { 0 } else { capacity_for(entries.len()) };
        Run::packed_into(places, entries.iter().map(|entry| entry.unpack()))
    }

    /// A run of `places` places holding `entries` (in order) at its end.
    fn packed_into(places: usize, entries: impl ExactSizeIterator<Item = Entry>) -> Run {
        let head = places - entries.len();
        let mut run = Run {
            prefixes: Vec::with_capacity(places),
            slots: Vec::with_capacity(places),
            head: head as u8,
            n_gaps: 0,
            gaps: [0; MAX_GAPS],
        };
        run.prefixes.resize(head, 0);
        run.slots.resize(head, FREE);
        for entry in entries {
            run.prefixes.push(entry.prefix);
            run.slots.push(entry.slot);
        }
        run
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.slots.len() - usize::from(self.head) - usize::from(self.n_gaps)
    }

    #[inline]
    fn gaps(&self) -> &[u8] {
        &self.gaps[..usize::from(self.n_gaps)]
    }

    /// Where the entry of rank `rank` sits in the arrays.
    #[inline]
    fn place_of(&self, rank: usize) -> usize {
        let mut place = usize::from(self.head) + rank;
        for &gap in self.gaps() {
            if usize::from(gap) > place {
                break;
            }
            place += 1;
        }
        place
    }

    /// The rank of the entry (or gap) at `place`, at or past the head: the
    /// entries before it.
    #[inline]
    fn rank_at(&self, place: usize) -> usize {
        let gaps_before = self.gaps().iter().take_while(|&&gap| usize::from(gap) < place).count();
        place - usize::from(self.head) - gaps_before
    }

    /// The entries in order, to build a node tree from when the run outgrows [`RUN_MAX`].
    pub(crate) fn packed_entries(&self) -> Vec<PackedEntry> {
        (0..self.len()).map(|rank| self.select(rank)).map(|entry| PackedEntry::new(entry.prefix, entry.slot)).collect()
    }

    /// Asks the cache for what a move reads first: the slots, scanned for the
    /// one that moves.
    #[inline]
    pub(crate) fn prefetch(&self) {
        prefetch_lines(&self.slots, RUN_SLOT_PREFETCH_LINES);
    }

    /// Once the slots are in cache (after [`Run::prefetch`]): asks for the
    /// prefixes a move of `slot` to the top (the chat case) reads and writes:
    /// its own, and the head's last free place when there is one, else those
    /// up to the first free place after the head.
    #[inline]
    pub(crate) fn prefetch_shift_of(&self, slot: Slot) {
        let Some(place) = self.position_of_slot(slot) else {
            return;
        };
        prefetch(&self.prefixes[place]);
        let head = usize::from(self.head);
        let gaps_full = usize::from(self.n_gaps) == MAX_GAPS;
        if head > 0 && !gaps_full {
            prefetch(&self.prefixes[head - 1]);
            prefetch(&self.prefixes[head]);
            return;
        }
        // The last free place a move to the top shifts up to: every gap's when
        // they join the head, else the first free place after the head.
        let first_free = if head == 0 {
            self.gaps().last().map_or(place, |&gap| usize::from(gap).max(place))
        } else {
            self.gaps().first().map_or(place, |&gap| usize::from(gap).min(place))
        };
        let prefixes_per_line = 64 / std::mem::size_of::<Prefix>();
        for prefix in self.prefixes[head.saturating_sub(1)..=first_free].iter().step_by(prefixes_per_line) {
            prefetch(prefix);
        }
        prefetch(&self.prefixes[first_free]);
    }

    /// Where `slot` is, by a scan (a run is small and its slots contiguous), 16
    /// slots at a time: whether a block holds it is an OR of 16 compares with no
    /// exit between them, which the compiler turns into a few vector
    /// instructions; only the block that does is searched slot by slot (a plain
    /// `position`, with an exit per slot, cost about 4 instructions per slot).
    /// Free places hold [`FREE`], which no slot asked for is.
    #[inline]
    fn position_of_slot(&self, slot: Slot) -> Option<usize> {
        debug_assert_ne!(slot, FREE);
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
        self.position_of_slot(slot).is_some()
    }

    /// Inserts an entry that is not in the run; returns its rank. It takes a
    /// free place between its neighbours when there is one; else the entries
    /// between its place and the nearest free place shift by one; else (no
    /// free place at all: a view gaining members past its slack, which a move
    /// never is) the run grows.
    pub(crate) fn insert(&mut self, entry: Entry, compare: &impl Fn(Entry, Entry) -> Ordering) -> usize {
        debug_assert_ne!(entry.slot, FREE);
        // The chat case: a room moving to the top goes before every entry.
        let rank = if self.len() > 0 && entry.prefix < self.select(0).prefix {
            0
        } else {
            self.partition_point(entry, compare)
        };
        if self.len() == self.slots.len() {
            self.grow();
        }
        // The place of the entry that will follow it (the end when none).
        let mut next = if rank < self.len() { self.place_of(rank) } else { self.slots.len() };
        if next == 0 && self.n_gaps > 0 {
            // A move to the top with no free place in the head: every gap joins it.
            self.squeeze_gaps_into_head();
            next = usize::from(self.head);
        }
        let head = usize::from(self.head);
        let place = if next == head && head > 0 {
            self.head -= 1;
            head - 1
        } else if next > head && self.slots[next - 1] == FREE {
            self.take_gaps_before(next, entry.prefix)
        } else {
            self.shift_to_free_place(next)
        };
        self.prefixes[place] = entry.prefix;
        self.slots[place] = entry.slot;
        rank
    }

    /// Shifts the entries before each gap towards the end, so that every free
    /// place is in the head: one pass over the run for as many moves to the top
    /// as it has free places.
    fn squeeze_gaps_into_head(&mut self) {
        let n_gaps = usize::from(self.n_gaps);
        // From the last gap back: the entries before gap `i` (and after gap
        // `i - 1`) move `n_gaps - i` places on, into space already vacated.
        for index in (0..n_gaps).rev() {
            let start = if index > 0 { usize::from(self.gaps[index - 1]) + 1 } else { usize::from(self.head) };
            let end = usize::from(self.gaps[index]);
            self.prefixes.copy_within(start..end, start + n_gaps - index);
            self.slots.copy_within(start..end, start + n_gaps - index);
        }
        let head = usize::from(self.head);
        self.slots[head..head + n_gaps].fill(FREE);
        self.head += self.n_gaps;
        self.n_gaps = 0;
    }

    /// Takes the gap right before `next` for a new entry of prefix `prefix`;
    /// the gaps between it and the entry before stay gaps but take this prefix,
    /// so the prefixes stay in order. Returns the place taken.
    fn take_gaps_before(&mut self, next: usize, prefix: Prefix) -> usize {
        let taken = next - 1;
        let index = self.gap_index(taken).expect("a free place after the head is a gap");
        let mut before = index;
        while before > 0 && usize::from(self.gaps[before - 1]) == usize::from(self.gaps[before]) - 1 {
            before -= 1;
            self.prefixes[usize::from(self.gaps[before])] = prefix;
        }
        self.remove_gap(index);
        taken
    }

    /// Frees the place right before `next` (or `next` itself, when the nearer
    /// free place is after it) by shifting the entries between it and the
    /// nearest free place by one; returns the place freed for the new entry.
    fn shift_to_free_place(&mut self, next: usize) -> usize {
        let head = usize::from(self.head);
        // The nearest free place before `next`: the last gap before it, or the head's last place.
        let gaps_before = self.gaps().iter().take_while(|&&gap| usize::from(gap) < next).count();
        let left = if gaps_before > 0 { Some(usize::from(self.gaps[gaps_before - 1])) } else { head.checked_sub(1) };
        let right = self.gaps().get(gaps_before).map(|&gap| usize::from(gap));
        let shift_left = match (left, right) {
            (Some(left), Some(right)) => next - left <= right - next,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => unreachable!("a run with no free place grows first"),
        };
        if shift_left {
            let left = left.expect("chosen");
            self.prefixes.copy_within(left + 1..next, left);
            self.slots.copy_within(left + 1..next, left);
            if gaps_before > 0 {
                self.remove_gap(gaps_before - 1);
            } else {
                self.head -= 1;
            }
            next - 1
        } else {
            let right = right.expect("chosen");
            self.prefixes.copy_within(next..right, next + 1);
            self.slots.copy_within(next..right, next + 1);
            self.remove_gap(gaps_before);
            next
        }
    }

    /// A run with no free place gets the slack of a larger view, in its head.
    #[cold]
    fn grow(&mut self) {
        let places = capacity_for(self.slots.len() + 16);
        let entries: Vec<Entry> = (0..self.len()).map(|rank| self.select(rank)).collect();
        *self = Run::packed_into(places, entries.into_iter());
    }

    /// Removes an entry that is in the run; returns the rank it had.
    pub(crate) fn remove(&mut self, entry: Entry, compare: &impl Fn(Entry, Entry) -> Ordering) -> usize {
        self.make_room_for_a_gap();
        let rank = self.rank_of(entry, compare);
        self.free_place(self.place_of(rank));
        rank
    }

    /// Removes the entry of `slot`, found by a scan, leaving a free place;
    /// returns its rank and prefix.
    pub(crate) fn remove_slot(&mut self, slot: Slot) -> (usize, Prefix) {
        self.remove_slot_if_held(slot).expect("removed slot must be in the index (index out of sync with item data)")
    }

    /// As `remove_slot`, for a slot that may not be in the run (`None`): one scan
    /// answers both questions.
    pub(crate) fn remove_slot_if_held(&mut self, slot: Slot) -> Option<(usize, Prefix)> {
        let mut place = self.position_of_slot(slot)?;
        if let Some(shifted_end) = self.make_room_for_a_gap() {
            if place < shifted_end {
                place += 1;
            }
        }
        let rank = self.rank_at(place);
        self.free_place(place);
        Some((rank, self.prefixes[place]))
    }

    /// When every gap is taken, shifts the entries between the head and the
    /// first gap by one place, so the first gap becomes the head's last place;
    /// returns the end of the places that moved (the first gap's), if any did.
    fn make_room_for_a_gap(&mut self) -> Option<usize> {
        if usize::from(self.n_gaps) < MAX_GAPS {
            return None;
        }
        let head = usize::from(self.head);
        let first_gap = usize::from(self.gaps[0]);
        self.prefixes.copy_within(head..first_gap, head + 1);
        self.slots.copy_within(head..first_gap, head + 1);
        self.slots[head] = FREE;
        self.head += 1;
        self.remove_gap(0);
        self.absorb_gaps_into_head();
        Some(first_gap)
    }

    /// Makes the entry at `place` free: the head's last place when it is the
    /// first entry, else a gap (its prefix left in place, in order).
    fn free_place(&mut self, place: usize) {
        self.slots[place] = FREE;
        let index = self.gaps().partition_point(|&gap| usize::from(gap) < place);
        self.gaps.copy_within(index..usize::from(self.n_gaps), index + 1);
        self.gaps[index] = place as u8;
        self.n_gaps += 1;
        self.absorb_gaps_into_head();
    }

    /// Gaps right after the head become head places.
    fn absorb_gaps_into_head(&mut self) {
        while self.n_gaps > 0 && self.gaps[0] == self.head {
            self.head += 1;
            self.remove_gap(0);
        }
    }

    fn gap_index(&self, place: usize) -> Option<usize> {
        self.gaps().iter().position(|&gap| usize::from(gap) == place)
    }

    fn remove_gap(&mut self, index: usize) {
        self.gaps.copy_within(index + 1..usize::from(self.n_gaps), index);
        self.n_gaps -= 1;
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
        let mut place = self.place_of(start);
        let mut remaining = end - start;
        // The stretches between gaps, from the first rank's place on.
        let first_place = place;
        for &gap in self.gaps().iter().filter(|&&gap| usize::from(gap) > first_place) {
            let stretch = (usize::from(gap) - place).min(remaining);
            out.extend_from_slice(&self.slots[place..place + stretch]);
            remaining -= stretch;
            if remaining == 0 {
                return;
            }
            place = usize::from(gap) + 1;
        }
        out.extend_from_slice(&self.slots[place..place + remaining]);
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.prefixes.capacity() * std::mem::size_of::<Prefix>() + self.slots.capacity() * std::mem::size_of::<Slot>()
    }

    /// Number of entries that precede `entry`: a binary search on the prefixes
    /// from the head on (plain `u128` compares; the gaps' prefixes are in
    /// order), then the equal-prefix run, almost always empty, resolved with the
    /// full comparison.
    #[inline]
    fn partition_point(&self, entry: Entry, compare: &impl Fn(Entry, Entry) -> Ordering) -> usize {
        let head = usize::from(self.head);
        let place = head + self.prefixes[head..].partition_point(|&prefix| prefix < entry.prefix);
        let mut rank = self.rank_at(place);
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
        let head = usize::from(self.head);
        assert_eq!(self.prefixes.len(), self.slots.len(), "parallel arrays");
        assert!(head <= self.slots.len(), "head past the end");
        assert!(self.len() <= RUN_MAX, "a run past RUN_MAX");
        assert!(self.gaps().windows(2).all(|pair| pair[0] < pair[1]), "gaps ascending");
        assert!(self.gaps().iter().all(|&gap| usize::from(gap) > head), "a gap right after the head");
        assert!(self.gaps().last().is_none_or(|&gap| usize::from(gap) < self.slots.len()), "gap past the end");
        for place in 0..self.slots.len() {
            let is_free = place < head || self.gap_index(place).is_some();
            assert_eq!(self.slots[place] == FREE, is_free, "place {place}: free places hold FREE, entries a slot");
        }
        assert!(self.prefixes[head..].windows(2).all(|pair| pair[0] <= pair[1]), "prefixes from the head in order");
        for rank in 1..self.len() {
            assert_eq!(compare(self.select(rank - 1), self.select(rank)), Ordering::Less, "entries out of order");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_of_hundred() -> (Run, Vec<Prefix>) {
        let prefixes: Vec<Prefix> = (0..100).map(|i| 1_000 + i as Prefix).collect();
        let entries: Vec<PackedEntry> = (0..100).map(|i| PackedEntry::new(prefixes[i], i as Slot)).collect();
        (Run::from_sorted(&entries), prefixes)
    }

    /// The chat pattern: while the head has a free place, a room moving to the
    /// top writes two places (the one it leaves, the one it takes) and moves no
    /// other entry; once the head is empty, one pass puts every free place back
    /// into it.
    #[test]
    fn a_move_to_the_top_moves_no_other_entry_while_the_head_has_room() {
        let (mut run, mut prefixes) = run_of_hundred();
        let compare = |left: Entry, right: Entry| left.prefix.cmp(&right.prefix).then(left.slot.cmp(&right.slot));
        let free_places = run.slots.len() - run.len();
        assert_eq!(usize::from(run.head), free_places, "the slack starts in the head");
        let mut top = 1_000 as Prefix;
        let mut squeezes = 0;
        for step in 0..500u32 {
            let slot = step * 37 % 100;
            let head_before = run.head;
            let places_before = run.slots.clone();
            let (_, prefix) = run.remove_slot(slot);
            assert_eq!(prefix, prefixes[slot as usize]);
            top -= 1;
            prefixes[slot as usize] = top;
            assert_eq!(run.insert(Entry { prefix: top, slot }, &compare), 0);
            let n_written = places_before.iter().zip(&run.slots).filter(|(before, after)| before != after).count();
            if head_before > 0 {
                assert!(n_written <= 2, "step {step}: {n_written} places written with room in the head");
            } else {
                squeezes += 1;
                // The free places and the one the move left, less the one it took.
                assert_eq!(usize::from(run.head), free_places, "step {step}: the squeeze fills the head");
            }
            run.check_invariants(compare);
        }
        // One squeeze every `free_places + 1` moves, fewer when a move's room was
        // the first entry (its place joins the head: no squeeze needed).
        assert!(squeezes > 0 && squeezes <= 500 / (free_places + 1), "{squeezes} squeezes");
    }
}
