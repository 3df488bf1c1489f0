//! The sorted index of one view: a small view's entries in one sorted run
//! (`run`), a larger view's in a counted B+tree (`nodes`).
//!
//! Entries are `(prefix, slot)` pairs (see `sort.rs`), ordered by prefix and, on
//! equal prefixes, by a caller-supplied tie-breaker that reads the items. Both
//! forms answer the same questions (insert and remove with rank, rank and select,
//! ranges) in O(log n) compares; a run shifts up to [`run::RUN_MAX`] entries per
//! change, which at that size costs less than the tree's bookkeeping and a
//! third of its memory. A run that outgrows `RUN_MAX` becomes a tree for good
//! (a view that shrinks again keeps its tree: no conversions back and forth
//! around the threshold).

mod nodes;
mod run;

use std::cmp::Ordering;

use crate::ids::Slot;
use crate::sort::Prefix;

use nodes::NodeTree;
use run::{Run, RUN_MAX};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) prefix: Prefix,
    pub(crate) slot: Slot,
}

/// An entry without `u128`'s 16-byte alignment: 24 bytes instead of 32, for the
/// large vectors a view is built from (see `ViewIndex::Partial`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PackedEntry {
    prefix_high: u64,
    prefix_low: u64,
    pub(crate) slot: Slot,
}

const _: () = assert!(std::mem::size_of::<PackedEntry>() == 24);

impl PackedEntry {
    #[inline]
    pub(crate) fn new(prefix: Prefix, slot: Slot) -> PackedEntry {
        PackedEntry { prefix_high: (prefix >> 64) as u64, prefix_low: prefix as u64, slot }
    }

    #[inline]
    pub(crate) fn unpack(self) -> Entry {
        Entry { prefix: (self.prefix_high as u128) << 64 | self.prefix_low as u128, slot: self.slot }
    }
}

pub(crate) struct OrderTree {
    form: Form,
}

enum Form {
    Run(Run),
    /// Boxed: most views are runs (a user's list), and an inline tree would make
    /// every view's struct 40 bytes larger (counted in each list's fixed heap,
    /// which must stay within 1 KiB: `tests/it/many_lists.rs`).
    Nodes(Box<NodeTree>),
}

impl OrderTree {
    /// Builds the index from entries already in order. An empty one holds no
    /// heap: an empty view costs nothing but its struct (a user's list of a
    /// collection with no items yet).
    pub(crate) fn from_sorted(entries: &[PackedEntry]) -> OrderTree {
        let form = if entries.len() <= RUN_MAX {
            Form::Run(Run::from_sorted(entries))
        } else {
            Form::Nodes(Box::new(NodeTree::from_sorted(entries)))
        };
        OrderTree { form }
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        match &self.form {
            Form::Run(run) => run.len(),
            Form::Nodes(tree) => tree.len(),
        }
    }

    /// Asks the cache for the entries a move reads first (a run's arrays; a node
    /// tree's are found by a search, so it asks for nothing).
    #[inline]
    pub(crate) fn prefetch(&self) {
        if let Form::Run(run) = &self.form {
            run.prefetch();
        }
    }

    /// Once [`OrderTree::prefetch`]'s lines are in cache: asks for what a move of
    /// `slot` to the front shifts (a run's entries up to its place).
    #[inline]
    pub(crate) fn prefetch_shift_of(&self, slot: Slot) {
        if let Form::Run(run) = &self.form {
            run.prefetch_shift_of(slot);
        }
    }

    /// Whether `slot` is in the index, when that costs less than evaluating a
    /// filter: a run's scan, or a large tree's slot → leaf map; `None` otherwise.
    #[inline]
    pub(crate) fn holds_slot(&self, slot: Slot) -> Option<bool> {
        match &self.form {
            Form::Run(run) => Some(run.holds_slot(slot)),
            Form::Nodes(tree) => tree.holds_slot(slot),
        }
    }

    /// Inserts an entry that is not in the index; returns its rank.
    #[inline]
    pub(crate) fn insert(&mut self, entry: Entry, compare: impl Fn(Entry, Entry) -> Ordering) -> usize {
        match &mut self.form {
            Form::Run(run) if run.len() < RUN_MAX => run.insert(entry, &compare),
            Form::Run(_) => self.grow_into_nodes().insert(entry, compare),
            Form::Nodes(tree) => tree.insert(entry, compare),
        }
    }

    /// A full run becomes a node tree (once per view, when it grows past `RUN_MAX`).
    #[cold]
    #[inline(never)]
    fn grow_into_nodes(&mut self) -> &mut NodeTree {
        let Form::Run(run) = &self.form else { unreachable!("only a run grows into nodes") };
        self.form = Form::Nodes(Box::new(NodeTree::from_sorted(&run.packed_entries())));
        let Form::Nodes(tree) = &mut self.form else { unreachable!("just built") };
        tree
    }

    /// Removes an entry that is in the index; returns the rank it had.
    #[inline]
    pub(crate) fn remove(&mut self, entry: Entry, compare: impl Fn(Entry, Entry) -> Ordering) -> usize {
        match &mut self.form {
            Form::Run(run) => run.remove(entry, &compare),
            Form::Nodes(tree) => tree.remove(entry, compare),
        }
    }

    /// Removes the entry of `slot` without a search by prefix: returns the rank
    /// and prefix it had, or `None` when the index cannot find it by slot alone
    /// (a tree without its slot → leaf map: use `remove`). The slot must be in
    /// the index.
    #[inline]
    pub(crate) fn remove_slot(&mut self, slot: Slot) -> Option<(usize, Prefix)> {
        match &mut self.form {
            Form::Run(run) => Some(run.remove_slot(slot)),
            Form::Nodes(tree) => tree.remove_slot(slot),
        }
    }

    /// Removes the entry of `slot` if the index holds it, when the index can tell
    /// by slot alone: `Some(Some((rank, prefix)))` removed, `Some(None)` not held,
    /// `None` the index cannot tell (a tree without its slot → leaf map). For a
    /// run that is one scan where `holds_slot` and then `remove_slot` were two.
    #[inline]
    pub(crate) fn remove_slot_if_held(&mut self, slot: Slot) -> Option<Option<(usize, Prefix)>> {
        match &mut self.form {
            Form::Run(run) => Some(run.remove_slot_if_held(slot)),
            Form::Nodes(tree) => {
                let is_held = tree.holds_slot(slot)?;
                Some(is_held.then(|| tree.remove_slot(slot).expect("the tree keeps its slot → leaf map")))
            }
        }
    }

    /// The rank of an entry that is in the index.
    pub(crate) fn rank_of(&self, entry: Entry, compare: impl Fn(Entry, Entry) -> Ordering) -> usize {
        match &self.form {
            Form::Run(run) => run.rank_of(entry, &compare),
            Form::Nodes(tree) => tree.rank_of(entry, compare),
        }
    }

    /// How many entries sort before `entry`, which need not be in the index.
    pub(crate) fn position_of(&self, entry: Entry, compare: impl Fn(Entry, Entry) -> Ordering) -> usize {
        match &self.form {
            Form::Run(run) => run.position_of(entry, &compare),
            Form::Nodes(tree) => tree.position_of(entry, compare),
        }
    }

    /// The entry at `rank`.
    #[inline]
    pub(crate) fn select(&self, rank: usize) -> Entry {
        match &self.form {
            Form::Run(run) => run.select(rank),
            Form::Nodes(tree) => tree.select(rank),
        }
    }

    /// Appends the slots of ranks `start..end` (clipped to the index) to `out`.
    pub(crate) fn collect_range(&self, start: usize, end: usize, out: &mut Vec<Slot>) {
        match &self.form {
            Form::Run(run) => run.collect_range(start, end, out),
            Form::Nodes(tree) => tree.collect_range(start, end, out),
        }
    }

    /// Heap bytes held by the index.
    pub(crate) fn heap_bytes(&self) -> usize {
        match &self.form {
            Form::Run(run) => run.heap_bytes(),
            Form::Nodes(tree) => size_of::<NodeTree>() + tree.heap_bytes(),
        }
    }

    /// Whether the index is a node tree (a run past `RUN_MAX`).
    #[cfg(test)]
    pub(crate) fn is_nodes(&self) -> bool {
        matches!(self.form, Form::Nodes(_))
    }

    /// Checks every structural invariant; panics with a message on the first broken one.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self, compare: impl Fn(Entry, Entry) -> Ordering) {
        match &self.form {
            Form::Run(run) => run.check_invariants(compare),
            Form::Nodes(tree) => tree.check_invariants(compare),
        }
    }
}

#[cfg(test)]
mod test_support {
    use super::*;

    pub(super) use crate::test_rng::Rng;

    /// Ties on prefix are broken by a secondary key held outside the tree, as the
    /// engine does with item fields.
    pub(super) fn compare_with(secondary: &[u64]) -> impl Fn(Entry, Entry) -> Ordering + '_ {
        move |left: Entry, right: Entry| {
            left.prefix
                .cmp(&right.prefix)
                .then(secondary[left.slot as usize].cmp(&secondary[right.slot as usize]))
                .then(left.slot.cmp(&right.slot))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{compare_with, Rng};
    use super::*;

    /// Both forms against a sorted `Vec`: sizes that stay runs, that cross
    /// `RUN_MAX` (the run turns into a tree) and shrink back, with removals by
    /// entry and by slot, and a tie-breaker outside the index.
    #[test]
    fn model_runs_and_their_growth_into_trees_match_a_sorted_vec() {
        let mut n_grown = 0;
        for seed in 0..24u64 {
            let mut rng = Rng(seed);
            let n_slots = [40usize, RUN_MAX, 3 * RUN_MAX][seed as usize % 3];
            let prefix_range = [3u64, 1 << 40][(seed as usize / 3) % 2];
            let secondary: Vec<u64> = (0..n_slots).map(|_| rng.below(5)).collect();
            let compare = compare_with(&secondary);
            let mut model: Vec<Entry> = (0..n_slots / 4)
                .map(|slot| Entry { prefix: rng.below(prefix_range) as u128, slot: slot as Slot })
                .collect();
            model.sort_by(|&a, &b| compare(a, b));
            let packed: Vec<PackedEntry> = model.iter().map(|e| PackedEntry::new(e.prefix, e.slot)).collect();
            let mut index = OrderTree::from_sorted(&packed);
            let mut member: Vec<Option<Entry>> = vec![None; n_slots];
            for &entry in &model {
                member[entry.slot as usize] = Some(entry);
            }
            for step in 0..6 * n_slots {
                let slot = rng.below(n_slots as u64) as usize;
                // Mostly inserts in the first half of the run, mostly removals after.
                let wants_insert = rng.below(100) < if step < 3 * n_slots { 70 } else { 30 };
                match (member[slot], wants_insert) {
                    (Some(entry), false) => {
                        let expected = model.iter().position(|&e| e == entry).unwrap();
                        assert_ne!(index.holds_slot(entry.slot), Some(false), "seed {seed} step {step}: not held");
                        assert_eq!(index.rank_of(entry, &compare), expected, "seed {seed} step {step}: rank_of");
                        let by_slot = match step % 3 {
                            0 => index.remove_slot(entry.slot),
                            1 => index.remove_slot_if_held(entry.slot).map(|held| held.expect("a member is held")),
                            _ => None,
                        };
                        let asked_by_slot = step % 3 != 2;
                        assert!(
                            by_slot.is_some() || !asked_by_slot || index.is_nodes(),
                            "seed {seed} step {step}: a run removes by slot"
                        );
                        let rank = match by_slot {
                            Some((rank, prefix)) => {
                                assert_eq!(prefix, entry.prefix, "seed {seed} step {step}: remove_slot prefix");
                                rank
                            }
                            None => index.remove(entry, &compare),
                        };
                        assert_eq!(rank, expected, "seed {seed} step {step}: remove rank");
                        model.remove(expected);
                        member[slot] = None;
                        assert_ne!(index.holds_slot(entry.slot), Some(true), "seed {seed} step {step}: still held");
                    }
                    (None, true) => {
                        let entry = Entry { prefix: rng.below(prefix_range) as u128, slot: slot as Slot };
                        // Asking to remove a slot not held changes nothing.
                        let answer = index.remove_slot_if_held(entry.slot);
                        assert!(
                            answer == Some(None) || (answer.is_none() && index.is_nodes()),
                            "seed {seed} step {step}"
                        );
                        assert_eq!(index.len(), model.len(), "seed {seed} step {step}: removed a slot not held");
                        let expected = model.partition_point(|&e| compare(e, entry) == Ordering::Less);
                        assert_eq!(
                            index.position_of(entry, &compare),
                            expected,
                            "seed {seed} step {step}: position_of"
                        );
                        assert_eq!(index.insert(entry, &compare), expected, "seed {seed} step {step}: insert rank");
                        model.insert(expected, entry);
                        member[slot] = Some(entry);
                    }
                    _ => continue,
                }
                assert_eq!(index.len(), model.len());
                assert!(index.is_nodes() || model.len() <= RUN_MAX, "seed {seed} step {step}: a run past RUN_MAX");
                if step % 16 == 0 {
                    index.check_invariants(&compare);
                    let mut slots = Vec::new();
                    index.collect_range(0, index.len(), &mut slots);
                    assert!(slots.iter().eq(model.iter().map(|e| &e.slot)), "seed {seed} step {step}: contents");
                    if !model.is_empty() {
                        let rank = rng.below(model.len() as u64) as usize;
                        assert_eq!(index.select(rank), model[rank], "seed {seed} step {step}: select");
                        let mut window = Vec::new();
                        index.collect_range(rank, rank + 20, &mut window);
                        assert_eq!(window, slots[rank..(rank + 20).min(model.len())], "seed {seed}: range");
                    }
                }
            }
            // Never more than RUN_MAX entries in a run; past it, a tree.
            if !index.is_nodes() {
                assert!(model.len() <= RUN_MAX);
            }
            n_grown += usize::from(index.is_nodes());
        }
        assert!(n_grown >= 4, "only {n_grown} runs grew into trees");
    }

    #[test]
    fn a_hundred_entry_view_is_a_run_of_under_24_bytes_per_entry() {
        let mut prefixes: Vec<u128> = (0..100).map(|i| 1_000 + i as u128).collect();
        let entries: Vec<PackedEntry> = (0..100).map(|i| PackedEntry::new(prefixes[i], i as Slot)).collect();
        let mut index = OrderTree::from_sorted(&entries);
        assert!(!index.is_nodes());
        // A sixteenth of slack: a first new member allocates nothing.
        assert_eq!(index.heap_bytes(), 106 * 20);
        // The chat pattern: an entry leaves its place and enters at the front.
        let secondary = vec![0u64; 100];
        let compare = compare_with(&secondary);
        let mut top = 1_000u128;
        for step in 0..1_000u64 {
            let slot = (step * 37 % 100) as Slot;
            assert_eq!(index.remove_slot(slot).map(|(_, prefix)| prefix), Some(prefixes[slot as usize]));
            top -= 1;
            prefixes[slot as usize] = top;
            assert_eq!(index.insert(Entry { prefix: top, slot }, &compare), 0);
        }
        index.check_invariants(&compare);
        assert_eq!(index.heap_bytes(), 106 * 20, "moves grow nothing");
    }
}
