//! Views: one filter and one sort over a collection, with the sorted index that
//! every window of the view shares.

use std::cmp::Ordering;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::collection::Collection;
use crate::filter::{CompiledFilter, FilterScratch};
use crate::ids::Slot;
use crate::key_index::ViewKey;
use crate::order_tree::{Entry, OrderTree, PackedEntry};
use crate::prefetch::prefetch_lines;
use crate::schema::{FieldId, Schema};
use crate::sort::CompiledSort;
use crate::view_def::ViewDef;

/// The sorted index, built lazily: creating a view sorts only what its first
/// window needs; the rest is sorted when something else needs it.
pub(crate) enum ViewIndex {
    /// Every member, with `entries[..n_sorted]` the smallest `n_sorted` entries in order.
    Partial {
        entries: Vec<PackedEntry>,
        n_sorted: usize,
    },
    Ready(OrderTree),
}

impl ViewIndex {
    pub(crate) fn tree_mut(&mut self) -> &mut OrderTree {
        match self {
            ViewIndex::Ready(tree) => tree,
            ViewIndex::Partial { .. } => unreachable!("ensure_ready runs before every update"),
        }
    }
}

/// What a view computes: its definition, compiled against a schema. Immutable,
/// and shared by the views with the same definition over the same schema (a
/// million users' room lists hold one; see `engine::shared`).
pub(crate) struct ViewPlan {
    pub(crate) def: ViewDef,
    pub(crate) filter: CompiledFilter,
    /// Shared further than the plan: see [`MovePlan`].
    pub(crate) moves: Arc<MovePlan>,
    /// The schema the filter and sort were compiled against: held, so that its
    /// address names it for as long as the plan lives.
    pub(crate) schema: Arc<Schema>,
}

impl ViewPlan {
    pub(crate) fn compile(def: &ViewDef, schema: &Arc<Schema>) -> Result<ViewPlan, crate::error::ViewError> {
        let filter = CompiledFilter::compile(&def.filter, schema)?;
        let moves = Arc::new(MovePlan::new(CompiledSort::compile(&def.sort, schema)?, &filter));
        Ok(ViewPlan { def: def.clone(), filter, moves, schema: Arc::clone(schema) })
    }
}

/// What moving an item within a view reads of its plan: the compiled sort and
/// which fields the filter reads. Views whose definitions differ only in their
/// filter's literals share one (every user's room list, `owner == <user>`, has a
/// plan of its own), so that a message moving a room in every member's list
/// reads it from cache: each list's own plan would be lines missed per list.
#[derive(PartialEq)]
pub(crate) struct MovePlan {
    pub(crate) sort: CompiledSort,
    /// Every field the filter reads (see [`CompiledFilter::reads_fields`]).
    pub(crate) filter_fields: Box<[FieldId]>,
}

impl MovePlan {
    pub(crate) fn new(sort: CompiledSort, filter: &CompiledFilter) -> MovePlan {
        MovePlan { sort, filter_fields: filter.reads_fields().into() }
    }
}

/// Lines of a `MovePlan` a move's prefetch asks for: all of it (its sort keys,
/// behind a pointer, are the next step's).
const MOVE_PLAN_PREFETCH_LINES: usize = 1;

pub(crate) struct View {
    pub(crate) collection: u32,
    pub(crate) plan: Arc<ViewPlan>,
    /// The plan's, held here too so that a move reads it without the plan.
    pub(crate) moves: Arc<MovePlan>,
    pub(crate) index: ViewIndex,
    /// The key the view is registered under in its collection's `KeyIndex`, if any.
    pub(crate) key: Option<ViewKey>,
    membership: Membership,
    /// Windows open on this view (a user's list has one: inline, no line of its own).
    pub(crate) windows: SmallVec<[u32; 2]>,
}

/// How a view knows whether an item is in it before the item changes.
enum Membership {
    /// One bit per slot: saves re-running the filter on the old item data at every
    /// update. Unkeyed views, which every update visits.
    Bits(Vec<u64>),
    /// The filter, evaluated on the item's current data. Keyed views: at a million
    /// slots, bits would cost 125 KB per view (1.25 GB for 10 000 users' views of
    /// one collection), and only updates of the key's items evaluate it. Exact
    /// because an item's data changes only in an operation that visits every view
    /// it is in (see `key_index`).
    Filter,
}

impl View {
    /// Creates a view, sorting just enough to serve `n_first` entries. A keyed view
    /// comes with its key and the candidate slots the equality index lists for it;
    /// an unkeyed one filters the whole collection.
    pub(crate) fn build(
        collection_index: u32,
        plan: Arc<ViewPlan>,
        keyed: Option<(ViewKey, &[Slot])>,
        collection: &Collection,
        filter_scratch: &mut FilterScratch,
        n_first: usize,
    ) -> View {
        let (filter, sort) = (&plan.filter, &plan.moves.sort);
        let (slots, membership) = match keyed {
            Some((_, candidates)) => {
                // Every candidate is tested: a hash collision may have mixed in other values.
                let slots: Vec<Slot> = candidates
                    .iter()
                    .copied()
                    .filter(|&slot| filter.matches(collection, slot, filter_scratch))
                    .collect();
                (slots, Membership::Filter)
            }
            None => {
                let mut slots = Vec::with_capacity(collection.len());
                filter.select_matching(collection, filter_scratch, &mut slots);
                let mut member_bits = vec![0u64; collection.slot_capacity().div_ceil(64)];
                for &slot in &slots {
                    member_bits[slot as usize / 64] |= 1 << (slot % 64);
                }
                (slots, Membership::Bits(member_bits))
            }
        };
        // Key by key over the members, then pair up: column-at-a-time encoding.
        let mut prefixes = Vec::new();
        sort.encode_prefixes(collection, &slots, &mut prefixes);
        let entries = prefixes.iter().zip(&slots).map(|(&prefix, &slot)| PackedEntry::new(prefix, slot)).collect();
        let mut view = View {
            collection: collection_index,
            moves: Arc::clone(&plan.moves),
            plan,
            index: ViewIndex::Partial { entries, n_sorted: 0 },
            key: keyed.map(|(key, _)| key),
            membership,
            windows: SmallVec::new(),
        };
        view.sort_first(collection, n_first);
        view
    }

    /// Registers the view under `key` (see `engine::key_lone_view`): from now on
    /// the filter on current data, or the index, says who is a member.
    pub(crate) fn become_keyed(&mut self, key: ViewKey) {
        self.key = Some(key);
        self.membership = Membership::Filter;
    }

    /// Whether the item in `slot`, with its current data, is in the view.
    pub(crate) fn is_member(&self, collection: &Collection, slot: Slot, filter_scratch: &mut FilterScratch) -> bool {
        match &self.membership {
            Membership::Bits(bits) => bits.get(slot as usize / 64).is_some_and(|word| word & (1 << (slot % 64)) != 0),
            Membership::Filter => {
                // A large tree's slot → leaf map knows its members exactly: one load
                // instead of the filter (the room list's `left == false` read again at
                // every update of a room).
                if let ViewIndex::Ready(tree) = &self.index {
                    if let Some(is_member) = tree.holds_slot(slot) {
                        return is_member;
                    }
                }
                self.plan.filter.matches(collection, slot, filter_scratch)
            }
        }
    }

    /// Takes the item in `slot` out of the index if it is a member, when the
    /// index itself says so (a keyed view whose index finds entries by slot): one
    /// lookup for `is_member` and the removal. `Some(None)`: not a member;
    /// `None`: ask `is_member` and remove by entry.
    /// Asks the cache for what moving an entry reads of this view, once the
    /// view itself is in cache: its plan, its index's entries, its windows' list.
    #[inline]
    pub(crate) fn prefetch_for_move(&self) {
        prefetch_lines(std::slice::from_ref(&*self.moves), MOVE_PLAN_PREFETCH_LINES);
        if let ViewIndex::Ready(tree) = &self.index {
            tree.prefetch();
        }
        prefetch_lines(&self.windows, 1);
    }

    /// Once [`View::prefetch_for_move`]'s lines are in cache: what a move of
    /// `slot` to the front shifts.
    #[inline]
    pub(crate) fn prefetch_shift_of(&self, slot: Slot) {
        if let ViewIndex::Ready(tree) = &self.index {
            tree.prefetch_shift_of(slot);
        }
    }

    /// The next step, once the plan is in cache: the sort keys it points to.
    #[inline]
    pub(crate) fn prefetch_plan_parts(&self) {
        self.moves.sort.prefetch();
    }

    pub(crate) fn remove_if_member(&mut self, slot: Slot) -> Option<Option<(usize, crate::sort::Prefix)>> {
        match (&self.membership, &mut self.index) {
            (Membership::Filter, ViewIndex::Ready(tree)) => tree.remove_slot_if_held(slot),
            _ => None,
        }
    }

    pub(crate) fn set_member(&mut self, slot: Slot, is_member: bool) {
        let Membership::Bits(member_bits) = &mut self.membership else {
            return;
        };
        let word_index = slot as usize / 64;
        if word_index >= member_bits.len() {
            if !is_member {
                return;
            }
            // Grows only when the collection grows; amortised like a Vec push.
            member_bits.resize(word_index + 1, 0);
        }
        if is_member {
            member_bits[word_index] |= 1 << (slot % 64);
        } else {
            member_bits[word_index] &= !(1 << (slot % 64));
        }
    }

    pub(crate) fn len(&self) -> usize {
        match &self.index {
            ViewIndex::Partial { entries, .. } => entries.len(),
            ViewIndex::Ready(tree) => tree.len(),
        }
    }

    /// Makes sure the first `n_first` entries of a partial index are sorted.
    fn sort_first(&mut self, collection: &Collection, n_first: usize) {
        let sort = &self.moves.sort;
        let ViewIndex::Partial { entries, n_sorted } = &mut self.index else {
            return;
        };
        let n_first = n_first.min(entries.len());
        if n_first <= *n_sorted {
            return;
        }
        let compare =
            |left: &PackedEntry, right: &PackedEntry| compare_entries(sort, collection, left.unpack(), right.unpack());
        let rest = &mut entries[*n_sorted..];
        let n_wanted = n_first - *n_sorted;
        if n_wanted < rest.len() {
            // Partition around the n_wanted-th entry: O(n), then sort only the head.
            rest.select_nth_unstable_by(n_wanted, compare);
        }
        rest[..n_wanted].sort_unstable_by(compare);
        *n_sorted = n_first;
    }

    /// Turns a partial index into the full tree (sorting the remainder once).
    pub(crate) fn ensure_ready(&mut self, collection: &Collection) {
        let n_entries = match &self.index {
            ViewIndex::Partial { entries, .. } => entries.len(),
            ViewIndex::Ready(_) => return,
        };
        self.sort_first(collection, n_entries);
        if let ViewIndex::Partial { entries, .. } = &self.index {
            self.index = ViewIndex::Ready(OrderTree::from_sorted(entries));
        }
    }

    /// Appends the slots of ranks `offset..offset + limit` to `out`.
    pub(crate) fn collect_range(&mut self, collection: &Collection, offset: usize, limit: usize, out: &mut Vec<Slot>) {
        let end = offset.saturating_add(limit);
        if let ViewIndex::Partial { n_sorted, entries } = &self.index {
            if end > *n_sorted && *n_sorted < entries.len() {
                // A window past the sorted head: sort everything, it will be needed.
                self.ensure_ready(collection);
            }
        }
        match &self.index {
            ViewIndex::Partial { entries, n_sorted } => {
                let end = end.min(*n_sorted);
                if offset < end {
                    out.extend(entries[offset..end].iter().map(|entry| entry.slot));
                }
            }
            ViewIndex::Ready(tree) => tree.collect_range(offset, end, out),
        }
    }

    /// Heap bytes held by the view's index and membership bits.
    pub(crate) fn heap_bytes(&self) -> usize {
        let index_bytes = match &self.index {
            ViewIndex::Partial { entries, .. } => entries.capacity() * std::mem::size_of::<PackedEntry>(),
            ViewIndex::Ready(tree) => tree.heap_bytes(),
        };
        let membership_bytes = match &self.membership {
            Membership::Bits(bits) => bits.capacity() * 8,
            Membership::Filter => 0,
        };
        let windows_bytes = if self.windows.spilled() { self.windows.capacity() * 4 } else { 0 };
        index_bytes + membership_bytes + windows_bytes
    }
}

#[inline]
pub(crate) fn compare_entries(sort: &CompiledSort, collection: &Collection, left: Entry, right: Entry) -> Ordering {
    sort.compare_entries(collection, (left.prefix, left.slot), (right.prefix, right.slot))
}
