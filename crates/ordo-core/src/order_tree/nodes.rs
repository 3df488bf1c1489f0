//! A counted B+tree: the sorted index of one view.
//!
//! Entries are `(prefix, slot)` pairs (see `sort.rs`), ordered by prefix and, on
//! equal prefixes, by a caller-supplied tie-breaker that reads the items. Inner
//! nodes keep, per child, the child's entry count (so rank and select are
//! O(log n)) and the child's exact first entry (so a search never compares with an
//! entry that has left the tree, whose item data may since have changed).
//!
//! Leaves store prefixes and slots in two parallel arrays: 20 bytes per entry, and
//! a binary search over a leaf reads one contiguous run of `u128`s.
//!
//! Nodes live in two arenas indexed by `u32` with free lists, so steady-state
//! churn (an item leaving one place and entering another) reuses nodes and
//! allocates nothing. The free lists are threaded through the freed nodes (a
//! leaf's first slot, an inner node's first child); a freed node's `parent` is
//! left stale and set again when the node is reused.
//!
//! Every node knows its parent, and a tree of at least [`SLOT_MAP_MIN_LEN`]
//! entries over densely numbered slots keeps a slot → leaf map (`leaf_of`), so
//! that an item leaves the tree without a search: its leaf is looked up, the
//! slot found by a scan of the leaf's slots, and the rank summed on the way up
//! through the parents (`remove_slot`). At a million entries the search it
//! replaces was a chain of dependent cache misses down the tree and inside a
//! 1.3 KB leaf, and it needed the item's old sort prefix encoded first.

use std::cmp::Ordering;

use crate::ids::Slot;
use crate::sort::Prefix;

use super::{Entry, PackedEntry};

const LEAF_CAPACITY: usize = 64;
const INNER_CAPACITY: usize = 64;
/// A node below this many entries is merged with or refilled from a sibling. Half
/// for leaves: under the room list's churn (entries leave anywhere, enter at the
/// front) a quarter let leaves settle near a third full, and a 1M-room view grew
/// from 22 to 58 bytes per room after 3M updates; at half it settles at 37.
const LEAF_MIN: usize = LEAF_CAPACITY / 2;
const INNER_MIN: usize = INNER_CAPACITY / 4;
/// Trees from this many entries keep the slot → leaf map (4 bytes per slot).
/// Below it a search is a few cached compares, and small views (many small
/// lists) keep their memory.
pub(crate) const SLOT_MAP_MIN_LEN: usize = 512;
/// The map is indexed by slot, so it is kept only where the slots are dense: at
/// most this many map places per entry (a keyed view of a few thousand items
/// in a collection of millions would otherwise pay 4 bytes per item of the
/// whole collection).
const SLOT_MAP_MAX_SPREAD: usize = 2;

type NodeIndex = u32;
/// No node: the end of a free list, the root's parent, and a slot not in the tree.
const NO_NODE: NodeIndex = NodeIndex::MAX;

struct Leaf {
    len: u32,
    /// The inner node holding this leaf (`NO_NODE` for the root). Sits in the
    /// padding before `prefixes`: free.
    parent: NodeIndex,
    prefixes: [Prefix; LEAF_CAPACITY],
    slots: [Slot; LEAF_CAPACITY],
}

struct Inner {
    len: u32,
    /// As `Leaf::parent` (also in padding).
    parent: NodeIndex,
    /// Entries below each child.
    counts: [u32; INNER_CAPACITY],
    children: [NodeIndex; INNER_CAPACITY],
    /// Each child's first entry.
    first_prefixes: [Prefix; INNER_CAPACITY],
    first_slots: [Slot; INNER_CAPACITY],
}

// The layout is part of the memory budget (≤ 40 bytes per room per view): pin it.
const _: () = assert!(std::mem::size_of::<Leaf>() <= 16 + LEAF_CAPACITY * 20);
const _: () = assert!(std::mem::size_of::<Inner>() <= 16 + INNER_CAPACITY * 28);
// `find_u32` scans whole nodes of 64.
const _: () = assert!(LEAF_CAPACITY == 64 && INNER_CAPACITY == 64);

impl Leaf {
    fn empty() -> Leaf {
        Leaf { len: 0, parent: NO_NODE, prefixes: [0; LEAF_CAPACITY], slots: [0; LEAF_CAPACITY] }
    }

    fn entry(&self, index: usize) -> Entry {
        Entry { prefix: self.prefixes[index], slot: self.slots[index] }
    }
}

impl Inner {
    fn empty() -> Inner {
        Inner {
            len: 0,
            parent: NO_NODE,
            counts: [0; INNER_CAPACITY],
            children: [0; INNER_CAPACITY],
            first_prefixes: [0; INNER_CAPACITY],
            first_slots: [0; INNER_CAPACITY],
        }
    }

    fn first(&self, index: usize) -> Entry {
        Entry { prefix: self.first_prefixes[index], slot: self.first_slots[index] }
    }

    fn set_first(&mut self, index: usize, entry: Entry) {
        self.first_prefixes[index] = entry.prefix;
        self.first_slots[index] = entry.slot;
    }

    fn total(&self) -> u32 {
        self.counts[..self.len as usize].iter().sum()
    }

    /// Removes child `index`, shifting the later ones left.
    fn remove_child(&mut self, index: usize) {
        let len = self.len as usize;
        self.counts.copy_within(index + 1..len, index);
        self.children.copy_within(index + 1..len, index);
        self.first_prefixes.copy_within(index + 1..len, index);
        self.first_slots.copy_within(index + 1..len, index);
        self.len -= 1;
    }

    fn insert_child(&mut self, index: usize, child: NodeIndex, count: u32, first: Entry) {
        let len = self.len as usize;
        debug_assert!(len < INNER_CAPACITY);
        self.counts.copy_within(index..len, index + 1);
        self.children.copy_within(index..len, index + 1);
        self.first_prefixes.copy_within(index..len, index + 1);
        self.first_slots.copy_within(index..len, index + 1);
        self.counts[index] = count;
        self.children[index] = child;
        self.set_first(index, first);
        self.len += 1;
    }
}

struct Split {
    right: NodeIndex,
    right_count: u32,
    right_first: Entry,
}

pub(crate) struct NodeTree {
    leaves: Vec<Leaf>,
    inners: Vec<Inner>,
    /// Heads of the free lists of the two arenas (`NO_NODE`: empty). The lists are
    /// threaded through the freed nodes themselves (`free_leaf`, `free_inner`), so freeing a node
    /// never allocates: with a list per user, a collection's first merge would
    /// otherwise grow a free-list vector, one allocation per list (`many-lists`).
    free_leaves: NodeIndex,
    free_inners: NodeIndex,
    root: NodeIndex,
    /// 0: the root is a leaf.
    height: u32,
    len: usize,
    /// Slot → the leaf holding it (`NO_NODE`: not in the tree), for trees of at
    /// least `SLOT_MAP_MIN_LEN` entries over dense slots (see the module docs).
    leaf_of: Option<Vec<NodeIndex>>,
}

impl NodeTree {
    /// An empty tree holds no node: its root leaf (1.3 KB) comes with its first
    /// entry, so an empty view costs nothing but its struct (a user's list of a
    /// collection with no items yet; see `tests/it/many_lists.rs`).
    pub(crate) fn new() -> NodeTree {
        NodeTree {
            leaves: Vec::new(),
            inners: Vec::new(),
            free_leaves: NO_NODE,
            free_inners: NO_NODE,
            root: 0,
            height: 0,
            len: 0,
            leaf_of: None,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Builds a tree from entries already in order, leaves filled completely: the
    /// cheapest layout to create and the smallest in memory.
    pub(crate) fn from_sorted(entries: &[PackedEntry]) -> NodeTree {
        let mut tree = NodeTree::new();
        if entries.is_empty() {
            return tree;
        }
        tree.leaves.clear();
        // Slack of an eighth (as `reserve_arena_growth` adds later), so that the first
        // splits after a build reuse capacity instead of reallocating the arena.
        let n_leaves = entries.len().div_ceil(LEAF_CAPACITY);
        // But never more than the tree can use while its size holds (every leaf but
        // the root keeps at least `LEAF_MIN` entries): a 100-entry view, a user's
        // room list, needs three leaves at most, and a fourth would be 13 bytes per
        // entry never used.
        let n_leaves_max = (entries.len() / LEAF_MIN).max(n_leaves);
        tree.leaves.reserve_exact((n_leaves + n_leaves / 8 + 2).min(n_leaves_max));
        // (node, count, first entry) of the level being built.
        let mut level: Vec<(NodeIndex, u32, Entry)> = Vec::new();
        for chunk in balanced_chunks(entries.len(), LEAF_CAPACITY, LEAF_MIN) {
            let mut leaf = Leaf::empty();
            for (offset, entry) in entries[chunk.clone()].iter().map(|entry| entry.unpack()).enumerate() {
                leaf.prefixes[offset] = entry.prefix;
                leaf.slots[offset] = entry.slot;
            }
            leaf.len = chunk.len() as u32;
            level.push((tree.leaves.len() as NodeIndex, leaf.len, entries[chunk.start].unpack()));
            tree.leaves.push(leaf);
        }
        let mut child_height = 0;
        let mut height = 0;
        while level.len() > 1 {
            let mut next_level = Vec::with_capacity(level.len().div_ceil(INNER_CAPACITY));
            for chunk in balanced_chunks(level.len(), INNER_CAPACITY, INNER_MIN) {
                let mut inner = Inner::empty();
                for (offset, &(child, count, first)) in level[chunk.clone()].iter().enumerate() {
                    inner.children[offset] = child;
                    inner.counts[offset] = count;
                    inner.set_first(offset, first);
                }
                inner.len = chunk.len() as u32;
                let index = tree.inners.len() as NodeIndex;
                next_level.push((index, inner.total(), level[chunk.start].2));
                tree.inners.push(inner);
                tree.fix_parents(index, child_height + 1);
            }
            level = next_level;
            height += 1;
            child_height += 1;
        }
        tree.root = level[0].0;
        tree.height = height;
        tree.len = entries.len();
        let max_slot = entries.iter().map(|entry| entry.slot).max().expect("not empty");
        tree.try_enable_slot_map(max_slot);
        tree
    }

    /// Starts the slot → leaf map if the tree is large and its slots dense
    /// enough (`max_slot`: the largest slot in the tree). One allocation, once.
    fn try_enable_slot_map(&mut self, max_slot: Slot) {
        if self.leaf_of.is_some() || self.len < SLOT_MAP_MIN_LEN || max_slot as usize >= SLOT_MAP_MAX_SPREAD * self.len
        {
            return;
        }
        let mut leaf_of = vec![NO_NODE; max_slot as usize + 1];
        self.for_each_leaf(self.root, self.height, &mut |index, leaf| {
            for &slot in &leaf.slots[..leaf.len as usize] {
                leaf_of[slot as usize] = index;
            }
        });
        self.leaf_of = Some(leaf_of);
    }

    fn for_each_leaf(&self, node: NodeIndex, height: u32, visit: &mut impl FnMut(NodeIndex, &Leaf)) {
        if height == 0 {
            visit(node, &self.leaves[node as usize]);
            return;
        }
        let inner = &self.inners[node as usize];
        for &child in &inner.children[..inner.len as usize] {
            self.for_each_leaf(child, height - 1, visit);
        }
    }

    /// Whether the tree keeps the slot → leaf map (so `remove_slot` works).
    #[cfg(test)]
    pub(crate) fn has_slot_map(&self) -> bool {
        self.leaf_of.is_some()
    }

    /// Whether `slot` is in the tree, when the tree keeps the slot → leaf map
    /// (which names every slot's leaf, and `NO_NODE` for slots not in the tree);
    /// `None` without the map.
    #[inline]
    pub(crate) fn holds_slot(&self, slot: Slot) -> Option<bool> {
        let leaf_of = self.leaf_of.as_ref()?;
        Some(leaf_of.get(slot as usize).is_some_and(|&leaf| leaf != NO_NODE))
    }

    /// Records that `slot` is in leaf `leaf` (no-op without the map). The map
    /// grows with the collection's slots, amortised like a `Vec` push.
    #[inline]
    fn map_slot(&mut self, slot: Slot, leaf: NodeIndex) {
        if let Some(leaf_of) = &mut self.leaf_of {
            let index = slot as usize;
            if index >= leaf_of.len() {
                leaf_of.resize(index + 1, NO_NODE);
            }
            leaf_of[index] = leaf;
        }
    }

    /// Records that the slots of leaf `leaf` at `positions` are in it.
    fn map_leaf_range(&mut self, leaf: NodeIndex, positions: std::ops::Range<usize>) {
        if self.leaf_of.is_none() {
            return;
        }
        for position in positions {
            let slot = self.leaves[leaf as usize].slots[position];
            self.map_slot(slot, leaf);
        }
    }

    /// Sets the parent of a node at `height`.
    fn set_parent(&mut self, node: NodeIndex, height: u32, parent: NodeIndex) {
        if height == 0 {
            self.leaves[node as usize].parent = parent;
        } else {
            self.inners[node as usize].parent = parent;
        }
    }

    /// Points every child of inner node `inner` (at `height`) back at it.
    fn fix_parents(&mut self, inner: NodeIndex, height: u32) {
        let node = &self.inners[inner as usize];
        let (len, children) = (node.len as usize, node.children);
        for &child in &children[..len] {
            self.set_parent(child, height - 1, inner);
        }
    }

    /// Inserts an entry that is not in the tree; returns its rank.
    // Into the engine's update path through `OrderTree`'s dispatch: a call here
    // cost about 50 instructions per update (callgrind, `new_message_profile`).
    #[inline(always)]
    pub(crate) fn insert(&mut self, entry: Entry, compare: impl Fn(Entry, Entry) -> Ordering) -> usize {
        if self.leaves.is_empty() {
            // The first entry ever: the root leaf `new` left out (before the fast
            // path, which needs a root leaf to look into).
            self.leaves.push(Leaf::empty());
        }
        let rank = match self.insert_into_first_leaf(entry, &compare) {
            Some(rank) => rank,
            None => self.insert_with_search(entry, &compare),
        };
        if self.len == SLOT_MAP_MIN_LEN && self.leaf_of.is_none() {
            self.on_reaching_slot_map_size();
        }
        rank
    }

    /// A tree that grew to the slot map's size: decide once per crossing (O(size)).
    #[cold]
    #[inline(never)]
    fn on_reaching_slot_map_size(&mut self) {
        let mut max_slot = 0;
        self.for_each_leaf(self.root, self.height, &mut |_, leaf| {
            max_slot = leaf.slots[..leaf.len as usize].iter().copied().fold(max_slot, Slot::max);
        });
        self.try_enable_slot_map(max_slot);
    }

    /// The chat case: an entry that belongs in the first leaf (a room moving to
    /// the top), when that leaf has room. Down the first children, one prefix
    /// compare per level against the second child's first entry; then the
    /// counts and first entries of the first children, without the general
    /// descent's search and sums. `None`: insert with the search.
    fn insert_into_first_leaf(&mut self, entry: Entry, compare: &impl Fn(Entry, Entry) -> Ordering) -> Option<usize> {
        let mut node = self.root;
        for _ in 0..self.height {
            let inner = &self.inners[node as usize];
            if inner.len > 1 && entry.prefix >= inner.first_prefixes[1] {
                return None;
            }
            node = inner.children[0];
        }
        let leaf = &mut self.leaves[node as usize];
        let len = leaf.len as usize;
        if len == LEAF_CAPACITY {
            return None;
        }
        let position = partition_point_leaf(leaf, entry, compare);
        leaf.prefixes.copy_within(position..len, position + 1);
        leaf.slots.copy_within(position..len, position + 1);
        leaf.prefixes[position] = entry.prefix;
        leaf.slots[position] = entry.slot;
        leaf.len += 1;
        let mut node = self.root;
        for _ in 0..self.height {
            let inner = &mut self.inners[node as usize];
            inner.counts[0] += 1;
            if position == 0 {
                inner.set_first(0, entry);
            }
            node = inner.children[0];
        }
        self.map_slot(entry.slot, node);
        self.len += 1;
        Some(position)
    }

    // Kept out of `insert`'s body: the chat case (first-leaf insert) then stays a
    // short run of code, and the update path fits the instruction cache better.
    #[inline(never)]
    fn insert_with_search(&mut self, entry: Entry, compare: &impl Fn(Entry, Entry) -> Ordering) -> usize {
        let (rank, split) = self.insert_below(self.root, self.height, entry, compare);
        if let Some(split) = split {
            let old_root = self.root;
            let old_root_first = self.first_entry(old_root, self.height);
            let total = self.len as u32 + 1;
            let mut root = Inner::empty();
            root.insert_child(0, old_root, total - split.right_count, old_root_first);
            root.insert_child(1, split.right, split.right_count, split.right_first);
            self.root = self.alloc_inner(root);
            self.height += 1;
            self.fix_parents(self.root, self.height);
        }
        self.len += 1;
        rank
    }

    /// Removes an entry that is in the tree; returns the rank it had.
    pub(crate) fn remove(&mut self, entry: Entry, compare: impl Fn(Entry, Entry) -> Ordering) -> usize {
        let rank = self.remove_below(self.root, self.height, entry, &compare);
        self.len -= 1;
        self.collapse_root();
        rank
    }

    /// A root with a single child is replaced by that child.
    fn collapse_root(&mut self) {
        while self.height > 0 && self.inners[self.root as usize].len == 1 {
            let old_root = self.root;
            self.root = self.inners[old_root as usize].children[0];
            self.free_inner(old_root);
            self.height -= 1;
            self.set_parent(self.root, self.height, NO_NODE);
        }
    }

    /// Removes the entry of `slot` found through the slot → leaf map, without a
    /// search: returns the rank and prefix it had, or `None` when the tree keeps
    /// no map (then use `remove`). The slot must be in the tree.
    // Into the engine's update path through `OrderTree`'s dispatch: a call here
    // cost about 50 instructions per update (callgrind, `new_message_profile`).
    #[inline(always)]
    pub(crate) fn remove_slot(&mut self, slot: Slot) -> Option<(usize, Prefix)> {
        let leaf_of = self.leaf_of.as_mut()?;
        let leaf_index = leaf_of.get(slot as usize).copied().unwrap_or(NO_NODE);
        assert!(leaf_index != NO_NODE, "removed slot must be in the tree (index out of sync with item data)");
        leaf_of[slot as usize] = NO_NODE;
        let leaf = &mut self.leaves[leaf_index as usize];
        let len = leaf.len as usize;
        let position = find_u32(&leaf.slots, slot);
        assert!(position < len, "the slot → leaf map names the slot's leaf");
        let prefix = leaf.prefixes[position];
        leaf.prefixes.copy_within(position + 1..len, position);
        leaf.slots.copy_within(position + 1..len, position);
        leaf.len -= 1;
        // Up through the parents: what `remove_below` does on its way back.
        let mut rank = position;
        let mut child = leaf_index;
        for height in 1..=self.height {
            let node =
                if height == 1 { self.leaves[child as usize].parent } else { self.inners[child as usize].parent };
            let inner = &mut self.inners[node as usize];
            let child_index = find_u32(&inner.children, child);
            assert!(child_index < inner.len as usize, "a node's parent lists it");
            inner.counts[child_index] -= 1;
            rank += inner.counts[..child_index].iter().map(|&count| count as usize).sum::<usize>();
            self.after_child_removal(node, height, child_index, child);
            child = node;
        }
        self.len -= 1;
        self.collapse_root();
        Some((rank, prefix))
    }

    /// After an entry left `child` (child `child_index` of `node`, at `height`):
    /// refreshes the child's first entry and rebalances it if underfull.
    fn after_child_removal(&mut self, node: NodeIndex, height: u32, child_index: usize, child: NodeIndex) {
        let child_len = self.node_len(child, height - 1);
        if child_len > 0 {
            let child_first = self.first_entry(child, height - 1);
            self.inners[node as usize].set_first(child_index, child_first);
        }
        let child_min = if height == 1 { LEAF_MIN } else { INNER_MIN };
        if child_len < child_min && self.inners[node as usize].len > 1 {
            self.rebalance_child(node, height, child_index);
        }
    }

    /// The rank of an entry that is in the tree.
    pub(crate) fn rank_of(&self, entry: Entry, compare: impl Fn(Entry, Entry) -> Ordering) -> usize {
        let (rank, leaf, position) = self.descend(entry, &compare);
        let leaf = &self.leaves[leaf as usize];
        assert!(
            position < leaf.len as usize && leaf.slots[position] == entry.slot,
            "entry must be in the tree (index out of sync with item data)"
        );
        rank
    }

    /// How many entries sort before `entry`, which need not be in the tree: its
    /// rank if it is, else the rank it would take if inserted. O(log n).
    pub(crate) fn position_of(&self, entry: Entry, compare: impl Fn(Entry, Entry) -> Ordering) -> usize {
        self.descend(entry, &compare).0
    }

    /// (entries before `entry`, the leaf where it is or would be, its index there).
    fn descend(&self, entry: Entry, compare: &impl Fn(Entry, Entry) -> Ordering) -> (usize, NodeIndex, usize) {
        if self.leaves.is_empty() {
            // A tree that never held an entry has no root leaf (see `new`).
            return (0, 0, 0);
        }
        let mut node = self.root;
        let mut rank = 0;
        for _ in 0..self.height {
            let inner = &self.inners[node as usize];
            let child_index = Self::child_for(inner, entry, compare);
            rank += inner.counts[..child_index].iter().map(|&count| count as usize).sum::<usize>();
            node = inner.children[child_index];
        }
        let position = partition_point_leaf(&self.leaves[node as usize], entry, compare);
        (rank + position, node, position)
    }

    /// The entry at `rank`.
    pub(crate) fn select(&self, mut rank: usize) -> Entry {
        debug_assert!(rank < self.len);
        let mut node = self.root;
        for _ in 0..self.height {
            let inner = &self.inners[node as usize];
            let mut child_index = 0;
            while rank >= inner.counts[child_index] as usize {
                rank -= inner.counts[child_index] as usize;
                child_index += 1;
            }
            node = inner.children[child_index];
        }
        self.leaves[node as usize].entry(rank)
    }

    /// Appends the slots of ranks `start..end` (clipped to the tree) to `out`.
    pub(crate) fn collect_range(&self, start: usize, end: usize, out: &mut Vec<Slot>) {
        let end = end.min(self.len);
        if start < end {
            self.collect_below(self.root, self.height, start, end, out);
        }
    }

    fn collect_below(&self, node: NodeIndex, height: u32, start: usize, end: usize, out: &mut Vec<Slot>) {
        if height == 0 {
            out.extend_from_slice(&self.leaves[node as usize].slots[start..end]);
            return;
        }
        let inner = &self.inners[node as usize];
        let mut child_start = 0;
        for child_index in 0..inner.len as usize {
            let child_end = child_start + inner.counts[child_index] as usize;
            if child_end > start && child_start < end {
                let from = start.max(child_start) - child_start;
                let to = end.min(child_end) - child_start;
                self.collect_below(inner.children[child_index], height - 1, from, to, out);
            }
            if child_end >= end {
                break;
            }
            child_start = child_end;
        }
    }

    fn first_entry(&self, node: NodeIndex, height: u32) -> Entry {
        if height == 0 {
            self.leaves[node as usize].entry(0)
        } else {
            self.inners[node as usize].first(0)
        }
    }

    fn node_len(&self, node: NodeIndex, height: u32) -> usize {
        if height == 0 {
            self.leaves[node as usize].len as usize
        } else {
            self.inners[node as usize].len as usize
        }
    }

    fn alloc_leaf(&mut self, leaf: Leaf) -> NodeIndex {
        let free = self.free_leaves;
        if free != NO_NODE {
            self.free_leaves = self.leaves[free as usize].slots[0];
        }
        alloc_node(&mut self.leaves, free, leaf)
    }

    fn alloc_inner(&mut self, inner: Inner) -> NodeIndex {
        let free = self.free_inners;
        if free != NO_NODE {
            self.free_inners = self.inners[free as usize].children[0];
        }
        alloc_node(&mut self.inners, free, inner)
    }

    /// Puts an unlinked leaf on the free list; its first slot links to the next one.
    fn free_leaf(&mut self, leaf: NodeIndex) {
        let node = &mut self.leaves[leaf as usize];
        node.len = 0;
        node.slots[0] = self.free_leaves;
        self.free_leaves = leaf;
    }

    /// Puts an unlinked inner node on the free list; its first child links to the next one.
    fn free_inner(&mut self, inner: NodeIndex) {
        let node = &mut self.inners[inner as usize];
        node.len = 0;
        node.children[0] = self.free_inners;
        self.free_inners = inner;
    }

    /// Index of the child whose range holds `entry`: the last child whose first
    /// entry is not after it (the first child when the entry precedes them all).
    #[inline]
    fn child_for(inner: &Inner, entry: Entry, compare: &impl Fn(Entry, Entry) -> Ordering) -> usize {
        let len = inner.len as usize;
        // The chat case first: an entry entering near the front (a room moving to
        // the top) belongs to the first child; one compare instead of a search.
        if len > 1 && entry.prefix < inner.first_prefixes[1] {
            return 0;
        }
        // Binary search on the cached prefixes (plain u128 compares); only children
        // whose first prefix equals the entry's need the full comparison.
        let mut n_not_after = inner.first_prefixes[..len].partition_point(|&prefix| prefix < entry.prefix);
        while n_not_after < len
            && inner.first_prefixes[n_not_after] == entry.prefix
            && compare(inner.first(n_not_after), entry) != Ordering::Greater
        {
            n_not_after += 1;
        }
        n_not_after.max(1) - 1
    }

    fn insert_below(
        &mut self,
        node: NodeIndex,
        height: u32,
        entry: Entry,
        compare: &impl Fn(Entry, Entry) -> Ordering,
    ) -> (usize, Option<Split>) {
        if height == 0 {
            return self.insert_into_leaf(node, entry, compare);
        }
        let (child_index, child) = {
            let inner = &self.inners[node as usize];
            let child_index = Self::child_for(inner, entry, compare);
            (child_index, inner.children[child_index])
        };
        let (rank_in_child, split) = self.insert_below(child, height - 1, entry, compare);
        let child_first = self.first_entry(child, height - 1);
        let inner = &mut self.inners[node as usize];
        let rank = inner.counts[..child_index].iter().map(|&count| count as usize).sum::<usize>() + rank_in_child;
        inner.counts[child_index] += 1;
        inner.set_first(child_index, child_first);
        let Some(split) = split else {
            return (rank, None);
        };
        inner.counts[child_index] -= split.right_count;
        if (inner.len as usize) < INNER_CAPACITY {
            inner.insert_child(child_index + 1, split.right, split.right_count, split.right_first);
            self.set_parent(split.right, height - 1, node);
            return (rank, None);
        }
        // Split this inner node in two halves, then place the new child.
        let mut right = Inner::empty();
        let half = INNER_CAPACITY / 2;
        let moved = INNER_CAPACITY - half;
        right.counts[..moved].copy_from_slice(&inner.counts[half..]);
        right.children[..moved].copy_from_slice(&inner.children[half..]);
        right.first_prefixes[..moved].copy_from_slice(&inner.first_prefixes[half..]);
        right.first_slots[..moved].copy_from_slice(&inner.first_slots[half..]);
        right.len = moved as u32;
        inner.len = half as u32;
        if child_index < half {
            inner.insert_child(child_index + 1, split.right, split.right_count, split.right_first);
        } else {
            right.insert_child(child_index + 1 - half, split.right, split.right_count, split.right_first);
        }
        let right_count = right.total();
        let right_first = right.first(0);
        let right_index = self.alloc_inner(right);
        // The new child sits in either half; the right half's children moved.
        self.set_parent(split.right, height - 1, node);
        self.fix_parents(right_index, height);
        (rank, Some(Split { right: right_index, right_count, right_first }))
    }

    fn insert_into_leaf(
        &mut self,
        node: NodeIndex,
        entry: Entry,
        compare: &impl Fn(Entry, Entry) -> Ordering,
    ) -> (usize, Option<Split>) {
        let leaf = &mut self.leaves[node as usize];
        let len = leaf.len as usize;
        let position = partition_point_leaf(leaf, entry, compare);
        if len < LEAF_CAPACITY {
            leaf.prefixes.copy_within(position..len, position + 1);
            leaf.slots.copy_within(position..len, position + 1);
            leaf.prefixes[position] = entry.prefix;
            leaf.slots[position] = entry.slot;
            leaf.len += 1;
            self.map_slot(entry.slot, node);
            return (position, None);
        }
        let split_at = LEAF_CAPACITY / 2;
        let mut right = Leaf::empty();
        // The parent places the new leaf (and fixes this if the parent splits).
        right.parent = leaf.parent;
        right.prefixes[..LEAF_CAPACITY - split_at].copy_from_slice(&leaf.prefixes[split_at..]);
        right.slots[..LEAF_CAPACITY - split_at].copy_from_slice(&leaf.slots[split_at..]);
        right.len = (LEAF_CAPACITY - split_at) as u32;
        leaf.len = split_at as u32;
        let goes_left = position <= split_at;
        let target = if goes_left { leaf } else { &mut right };
        let local = if goes_left { position } else { position - split_at };
        let target_len = target.len as usize;
        target.prefixes.copy_within(local..target_len, local + 1);
        target.slots.copy_within(local..target_len, local + 1);
        target.prefixes[local] = entry.prefix;
        target.slots[local] = entry.slot;
        target.len += 1;
        let right_count = right.len;
        let right_first = right.entry(0);
        let right_index = self.alloc_leaf(right);
        if goes_left {
            self.map_slot(entry.slot, node);
        }
        self.map_leaf_range(right_index, 0..right_count as usize);
        (position, Some(Split { right: right_index, right_count, right_first }))
    }

    fn remove_below(
        &mut self,
        node: NodeIndex,
        height: u32,
        entry: Entry,
        compare: &impl Fn(Entry, Entry) -> Ordering,
    ) -> usize {
        if height == 0 {
            let leaf = &mut self.leaves[node as usize];
            let len = leaf.len as usize;
            let position = partition_point_leaf(leaf, entry, compare);
            assert!(
                position < len && leaf.slots[position] == entry.slot,
                "removed entry must be in the tree (index out of sync with item data)"
            );
            leaf.prefixes.copy_within(position + 1..len, position);
            leaf.slots.copy_within(position + 1..len, position);
            leaf.len -= 1;
            if let Some(leaf_of) = &mut self.leaf_of {
                leaf_of[entry.slot as usize] = NO_NODE;
            }
            return position;
        }
        let (child_index, child) = {
            let inner = &self.inners[node as usize];
            let child_index = Self::child_for(inner, entry, compare);
            (child_index, inner.children[child_index])
        };
        let rank_in_child = self.remove_below(child, height - 1, entry, compare);
        let rank = {
            let inner = &mut self.inners[node as usize];
            inner.counts[child_index] -= 1;
            inner.counts[..child_index].iter().map(|&count| count as usize).sum::<usize>() + rank_in_child
        };
        self.after_child_removal(node, height, child_index, child);
        rank
    }

    /// Merges an underfull child with a neighbour, or evens out their entries.
    #[cold]
    #[inline(never)]
    fn rebalance_child(&mut self, node: NodeIndex, height: u32, child_index: usize) {
        let inner = &self.inners[node as usize];
        let left_index = if child_index + 1 < inner.len as usize { child_index } else { child_index - 1 };
        let (left, right) = (inner.children[left_index], inner.children[left_index + 1]);
        if height == 1 {
            self.rebalance_leaves(node, left_index, left, right);
        } else {
            self.rebalance_inners(node, height - 1, left_index, left, right);
        }
    }

    fn rebalance_leaves(&mut self, parent: NodeIndex, left_index: usize, left: NodeIndex, right: NodeIndex) {
        let (left_leaf, right_leaf) = two_mut(&mut self.leaves, left as usize, right as usize);
        let (left_len, right_len) = (left_leaf.len as usize, right_leaf.len as usize);
        let total = left_len + right_len;
        if total <= LEAF_CAPACITY {
            left_leaf.prefixes[left_len..total].copy_from_slice(&right_leaf.prefixes[..right_len]);
            left_leaf.slots[left_len..total].copy_from_slice(&right_leaf.slots[..right_len]);
            left_leaf.len = total as u32;
            right_leaf.len = 0;
            let parent_inner = &mut self.inners[parent as usize];
            parent_inner.counts[left_index] = total as u32;
            parent_inner.remove_child(left_index + 1);
            self.free_leaf(right);
            self.map_leaf_range(left, left_len..total);
            return;
        }
        let left_target = total / 2;
        // Which leaf received entries, and where they now are in it.
        let (receiver, received) =
            if left_len < left_target { (left, left_len..left_target) } else { (right, 0..left_len - left_target) };
        if left_len < left_target {
            let moved = left_target - left_len;
            left_leaf.prefixes[left_len..left_target].copy_from_slice(&right_leaf.prefixes[..moved]);
            left_leaf.slots[left_len..left_target].copy_from_slice(&right_leaf.slots[..moved]);
            right_leaf.prefixes.copy_within(moved..right_len, 0);
            right_leaf.slots.copy_within(moved..right_len, 0);
        } else {
            let moved = left_len - left_target;
            right_leaf.prefixes.copy_within(0..right_len, moved);
            right_leaf.slots.copy_within(0..right_len, moved);
            right_leaf.prefixes[..moved].copy_from_slice(&left_leaf.prefixes[left_target..left_len]);
            right_leaf.slots[..moved].copy_from_slice(&left_leaf.slots[left_target..left_len]);
        }
        left_leaf.len = left_target as u32;
        right_leaf.len = (total - left_target) as u32;
        let right_first = right_leaf.entry(0);
        let parent_inner = &mut self.inners[parent as usize];
        parent_inner.counts[left_index] = left_target as u32;
        parent_inner.counts[left_index + 1] = (total - left_target) as u32;
        parent_inner.set_first(left_index + 1, right_first);
        self.map_leaf_range(receiver, received);
    }

    /// `height`: that of `left` and `right`.
    fn rebalance_inners(
        &mut self,
        parent: NodeIndex,
        height: u32,
        left_index: usize,
        left: NodeIndex,
        right: NodeIndex,
    ) {
        let (left_inner, right_inner) = two_mut(&mut self.inners, left as usize, right as usize);
        let (left_len, right_len) = (left_inner.len as usize, right_inner.len as usize);
        let total = left_len + right_len;
        if total <= INNER_CAPACITY {
            left_inner.counts[left_len..total].copy_from_slice(&right_inner.counts[..right_len]);
            left_inner.children[left_len..total].copy_from_slice(&right_inner.children[..right_len]);
            left_inner.first_prefixes[left_len..total].copy_from_slice(&right_inner.first_prefixes[..right_len]);
            left_inner.first_slots[left_len..total].copy_from_slice(&right_inner.first_slots[..right_len]);
            left_inner.len = total as u32;
            right_inner.len = 0;
            let left_total = left_inner.total();
            let parent_inner = &mut self.inners[parent as usize];
            parent_inner.counts[left_index] = left_total;
            parent_inner.remove_child(left_index + 1);
            self.free_inner(right);
            self.fix_parents(left, height);
            return;
        }
        let left_target = total / 2;
        if left_len < left_target {
            let moved = left_target - left_len;
            left_inner.counts[left_len..left_target].copy_from_slice(&right_inner.counts[..moved]);
            left_inner.children[left_len..left_target].copy_from_slice(&right_inner.children[..moved]);
            left_inner.first_prefixes[left_len..left_target].copy_from_slice(&right_inner.first_prefixes[..moved]);
            left_inner.first_slots[left_len..left_target].copy_from_slice(&right_inner.first_slots[..moved]);
            right_inner.counts.copy_within(moved..right_len, 0);
            right_inner.children.copy_within(moved..right_len, 0);
            right_inner.first_prefixes.copy_within(moved..right_len, 0);
            right_inner.first_slots.copy_within(moved..right_len, 0);
        } else {
            let moved = left_len - left_target;
            right_inner.counts.copy_within(0..right_len, moved);
            right_inner.children.copy_within(0..right_len, moved);
            right_inner.first_prefixes.copy_within(0..right_len, moved);
            right_inner.first_slots.copy_within(0..right_len, moved);
            right_inner.counts[..moved].copy_from_slice(&left_inner.counts[left_target..left_len]);
            right_inner.children[..moved].copy_from_slice(&left_inner.children[left_target..left_len]);
            right_inner.first_prefixes[..moved].copy_from_slice(&left_inner.first_prefixes[left_target..left_len]);
            right_inner.first_slots[..moved].copy_from_slice(&left_inner.first_slots[left_target..left_len]);
        }
        left_inner.len = left_target as u32;
        right_inner.len = (total - left_target) as u32;
        let (left_total, right_total, right_first) = (left_inner.total(), right_inner.total(), right_inner.first(0));
        let parent_inner = &mut self.inners[parent as usize];
        parent_inner.counts[left_index] = left_total;
        parent_inner.counts[left_index + 1] = right_total;
        parent_inner.set_first(left_index + 1, right_first);
        self.fix_parents(left, height);
        self.fix_parents(right, height);
    }

    /// Heap bytes held by the nodes.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.leaves.capacity() * std::mem::size_of::<Leaf>()
            + self.inners.capacity() * std::mem::size_of::<Inner>()
            + self.leaf_of.as_ref().map_or(0, |leaf_of| leaf_of.capacity() * 4)
    }

    /// Checks every structural invariant; panics with a message on the first broken one.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self, compare: impl Fn(Entry, Entry) -> Ordering) {
        if self.leaves.is_empty() {
            assert_eq!(self.len, 0, "entries without a root leaf");
            return;
        }
        let mut all = Vec::new();
        let count = self.check_below(self.root, self.height, true, &mut all);
        assert_eq!(count, self.len, "root count");
        for pair in all.windows(2) {
            assert_eq!(compare(pair[0], pair[1]), Ordering::Less, "entries out of order");
        }
        self.check_parents(self.root, self.height, NO_NODE);
        // The slot → leaf map, against a search of every leaf.
        if let Some(leaf_of) = &self.leaf_of {
            let mut expected = vec![NO_NODE; leaf_of.len()];
            self.for_each_leaf(self.root, self.height, &mut |index, leaf| {
                for &slot in &leaf.slots[..leaf.len as usize] {
                    assert!((slot as usize) < expected.len(), "slot {slot} past the map");
                    expected[slot as usize] = index;
                }
            });
            assert_eq!(leaf_of, &expected, "slot → leaf map");
        }
    }

    #[cfg(test)]
    fn check_parents(&self, node: NodeIndex, height: u32, parent: NodeIndex) {
        if height == 0 {
            assert_eq!(self.leaves[node as usize].parent, parent, "leaf parent");
            return;
        }
        let inner = &self.inners[node as usize];
        assert_eq!(inner.parent, parent, "inner parent");
        for &child in &inner.children[..inner.len as usize] {
            self.check_parents(child, height - 1, node);
        }
    }

    #[cfg(test)]
    fn check_below(&self, node: NodeIndex, height: u32, is_root: bool, all: &mut Vec<Entry>) -> usize {
        if height == 0 {
            let leaf = &self.leaves[node as usize];
            assert!(is_root || leaf.len as usize >= LEAF_MIN, "underfull leaf: {}", leaf.len);
            for index in 0..leaf.len as usize {
                all.push(leaf.entry(index));
            }
            return leaf.len as usize;
        }
        let inner = &self.inners[node as usize];
        assert!(inner.len >= 2 || !is_root || inner.len >= 1, "root inner without children");
        assert!(is_root || inner.len as usize >= INNER_MIN, "underfull inner: {}", inner.len);
        let mut total = 0;
        for child_index in 0..inner.len as usize {
            let child = inner.children[child_index];
            let before = all.len();
            let count = self.check_below(child, height - 1, false, all);
            assert_eq!(count, inner.counts[child_index] as usize, "child count");
            assert_eq!(all[before], inner.first(child_index), "child first entry");
            total += count;
        }
        total
    }
}

/// The index of the first `needle` in `haystack` (64 if none), comparing 16 at
/// a time into a bit mask, which the compiler turns into vector compares: a
/// node's first `len` places hold distinct values and the rest stale ones, so
/// the first match of a value known to be among the `len` is the right one.
#[inline]
fn find_u32(haystack: &[u32; 64], needle: u32) -> usize {
    for (chunk_index, chunk) in haystack.chunks_exact(16).enumerate() {
        let mask =
            chunk.iter().enumerate().fold(0u32, |mask, (index, &value)| mask | (u32::from(value == needle) << index));
        if mask != 0 {
            return chunk_index * 16 + mask.trailing_zeros() as usize;
        }
    }
    64
}

/// Places a node in its arena: at `free`, a place just taken off a free list, or,
/// when that is `NO_NODE`, at the end.
fn alloc_node<T>(arena: &mut Vec<T>, free: NodeIndex, node: T) -> NodeIndex {
    match free {
        NO_NODE => {
            reserve_arena_growth(arena);
            arena.push(node);
            (arena.len() - 1) as NodeIndex
        }
        index => {
            arena[index as usize] = node;
            index
        }
    }
}

/// Grows a node arena by an eighth instead of doubling it: node arenas are most of
/// a view's memory, and a doubling would leave up to half of it unused.
fn reserve_arena_growth<T>(arena: &mut Vec<T>) {
    if arena.len() == arena.capacity() {
        arena.reserve_exact((arena.len() / 8).max(4));
    }
}

/// Number of entries of a leaf that precede `entry`.
#[inline]
fn partition_point_leaf(leaf: &Leaf, entry: Entry, compare: &impl Fn(Entry, Entry) -> Ordering) -> usize {
    let len = leaf.len as usize;
    // Binary search on prefixes first (plain u128 compares), then resolve the
    // equal-prefix run, which is almost always empty, with the full comparison.
    let low = leaf.prefixes[..len].partition_point(|&prefix| prefix < entry.prefix);
    let mut position = low;
    while position < len && leaf.prefixes[position] == entry.prefix {
        if compare(leaf.entry(position), entry) != Ordering::Less {
            break;
        }
        position += 1;
    }
    position
}

/// Splits `n` items into chunks of at most `capacity`, none (but a lone one) under `min`.
fn balanced_chunks(n: usize, capacity: usize, min: usize) -> Vec<std::ops::Range<usize>> {
    let mut chunks = Vec::with_capacity(n.div_ceil(capacity));
    let mut start = 0;
    while start < n {
        let remaining = n - start;
        let size =
            if remaining > capacity && remaining - capacity < min { remaining / 2 } else { remaining.min(capacity) };
        chunks.push(start..start + size);
        start += size;
    }
    chunks
}

/// Two distinct elements of a slice, mutably, in the order asked (siblings may sit
/// anywhere in the arena).
fn two_mut<T>(items: &mut [T], first: usize, second: usize) -> (&mut T, &mut T) {
    assert_ne!(first, second);
    if first < second {
        let (head, tail) = items.split_at_mut(second);
        (&mut head[first], &mut tail[0])
    } else {
        let (head, tail) = items.split_at_mut(first);
        (&mut tail[0], &mut head[second])
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{compare_with, Rng};
    use super::*;

    #[test]
    fn model_random_inserts_removes_match_sorted_vec() {
        let mut n_with_map = 0;
        for seed in 0..40u64 {
            let mut rng = Rng(seed);
            let n_slots = [10usize, 200, 3000][seed as usize % 3];
            // Few distinct prefixes so that ties (and the secondary key) matter.
            let prefix_range = [3u64, 50, 1 << 40][(seed as usize / 3) % 3];
            let secondary: Vec<u64> = (0..n_slots).map(|_| rng.below(5)).collect();
            let compare = compare_with(&secondary);
            let mut tree = if seed % 4 == 0 {
                NodeTree::new()
            } else {
                let mut initial: Vec<Entry> = (0..n_slots / 2)
                    .map(|slot| Entry { prefix: rng.below(prefix_range) as u128, slot: slot as Slot })
                    .collect();
                initial.sort_by(|&a, &b| compare(a, b));
                let packed: Vec<PackedEntry> = initial.iter().map(|e| PackedEntry::new(e.prefix, e.slot)).collect();
                NodeTree::from_sorted(&packed)
            };
            let mut model: Vec<Entry> = Vec::new();
            let mut member: Vec<Option<Entry>> = vec![None; n_slots];
            // Recover what from_sorted loaded.
            let mut loaded = Vec::new();
            tree.collect_range(0, tree.len(), &mut loaded);
            for slot in loaded {
                let rank = model.len();
                let entry = tree.select(rank);
                assert_eq!(entry.slot, slot);
                member[slot as usize] = Some(entry);
                model.push(entry);
            }
            let steps = 4 * n_slots;
            for step in 0..steps {
                let slot = rng.below(n_slots as u64) as usize;
                match member[slot] {
                    Some(entry) => {
                        let expected = model.iter().position(|&e| e == entry).unwrap();
                        assert_eq!(tree.rank_of(entry, &compare), expected, "seed {seed} step {step}: rank_of");
                        assert_eq!(tree.position_of(entry, &compare), expected, "seed {seed} step {step}: position_of");
                        // With the slot → leaf map, remove without a search every other time.
                        let rank = match (step % 2 == 0).then(|| tree.remove_slot(slot as Slot)).flatten() {
                            Some((rank, prefix)) => {
                                assert_eq!(prefix, entry.prefix, "seed {seed} step {step}: remove_slot prefix");
                                rank
                            }
                            None => tree.remove(entry, &compare),
                        };
                        assert_eq!(rank, expected, "seed {seed} step {step}: remove rank");
                        model.remove(expected);
                        member[slot] = None;
                    }
                    None => {
                        let entry = Entry { prefix: rng.below(prefix_range) as u128, slot: slot as Slot };
                        let expected = model.partition_point(|&e| compare(e, entry) == Ordering::Less);
                        // An absent entry's position is where it would be inserted.
                        assert_eq!(tree.position_of(entry, &compare), expected, "seed {seed} step {step}: position_of");
                        let rank = tree.insert(entry, &compare);
                        assert_eq!(rank, expected, "seed {seed} step {step}: insert rank");
                        model.insert(expected, entry);
                        member[slot] = Some(entry);
                    }
                }
                assert_eq!(tree.len(), model.len());
                if step % 64 == 0 || n_slots <= 200 {
                    tree.check_invariants(&compare);
                    let mut slots = Vec::new();
                    tree.collect_range(0, tree.len(), &mut slots);
                    let expected: Vec<Slot> = model.iter().map(|e| e.slot).collect();
                    assert_eq!(slots, expected, "seed {seed} step {step}: contents");
                    if !model.is_empty() {
                        let rank = rng.below(model.len() as u64) as usize;
                        assert_eq!(tree.select(rank), model[rank], "seed {seed}: select");
                        // Ask past the end too: the range is clipped to the tree.
                        let end = (rank + 28).min(model.len());
                        let mut window = Vec::new();
                        tree.collect_range(rank, rank + 28, &mut window);
                        assert_eq!(window, expected[rank..end], "seed {seed}: range");
                    }
                }
            }
            // The map is kept from SLOT_MAP_MIN_LEN entries over dense slots (every
            // seed's slots are dense): built by `from_sorted` or on growing to it.
            if seed % 4 != 0 && n_slots / 2 >= SLOT_MAP_MIN_LEN {
                assert!(tree.has_slot_map(), "seed {seed}: built large, no map");
            }
            if n_slots < SLOT_MAP_MIN_LEN {
                assert!(!tree.has_slot_map(), "seed {seed}: small tree with a map");
            }
            n_with_map += usize::from(tree.has_slot_map());
            // Drain completely: the tree must shrink back to an empty root leaf.
            for (index, entry) in member.iter().flatten().enumerate() {
                if index % 2 == 0 && tree.has_slot_map() {
                    tree.remove_slot(entry.slot).expect("map kept");
                } else {
                    tree.remove(*entry, &compare);
                }
                if index % 97 == 0 {
                    tree.check_invariants(&compare);
                }
            }
            assert_eq!(tree.len(), 0);
            assert_eq!(tree.height, 0, "seed {seed}: empty tree keeps inner nodes");
        }
        // Both kinds of tree were exercised, including maps started by growth (seed % 4 == 0).
        assert!(n_with_map >= 10, "only {n_with_map} trees with a slot map");
    }

    #[test]
    fn front_churn_matches_model() {
        // The chat pattern: an entry leaves a random place and enters near the front
        // (behind a few pinned entries), through `insert_into_first_leaf` while the
        // first leaf has room and the search when it splits; removal by slot.
        let n = 5_000usize;
        let secondary = vec![0u64; n];
        let compare = compare_with(&secondary);
        let pinned = 4u128;
        let mut top = 1u128 << 40;
        let mut prefixes: Vec<u128> =
            (0..n).map(|i| if (i as u128) < pinned { i as u128 } else { top + i as u128 }).collect();
        let mut model: Vec<Entry> = (0..n).map(|i| Entry { prefix: prefixes[i], slot: i as Slot }).collect();
        model.sort_by(|&a, &b| compare(a, b));
        let packed: Vec<PackedEntry> = model.iter().map(|e| PackedEntry::new(e.prefix, e.slot)).collect();
        let mut tree = NodeTree::from_sorted(&packed);
        assert!(tree.has_slot_map());
        let mut rng = Rng(11);
        for step in 0..20_000 {
            let slot = pinned as usize + rng.below((n - pinned as usize) as u64) as usize;
            let entry = Entry { prefix: prefixes[slot], slot: slot as Slot };
            let expected = model.iter().position(|&e| e == entry).unwrap();
            assert_eq!(tree.remove_slot(slot as Slot), Some((expected, entry.prefix)), "step {step}: remove");
            model.remove(expected);
            top -= 1;
            prefixes[slot] = top;
            let entry = Entry { prefix: top, slot: slot as Slot };
            let expected = model.partition_point(|&e| compare(e, entry) == Ordering::Less);
            assert_eq!(expected, pinned as usize);
            assert_eq!(tree.insert(entry, &compare), expected, "step {step}: insert");
            model.insert(expected, entry);
            if step % 500 == 0 {
                tree.check_invariants(&compare);
                let mut slots = Vec::new();
                tree.collect_range(0, n, &mut slots);
                assert!(slots.iter().eq(model.iter().map(|e| &e.slot)), "step {step}: contents");
            }
        }
        tree.check_invariants(&compare);
    }

    #[test]
    fn slot_map_only_over_dense_slots() {
        let compare = |left: Entry, right: Entry| left.prefix.cmp(&right.prefix).then(left.slot.cmp(&right.slot));
        // Every third slot of a collection: the map would cost 12 bytes per entry.
        let sparse: Vec<PackedEntry> = (0..2000).map(|i| PackedEntry::new(i as u128, 3 * i as Slot)).collect();
        let mut tree = NodeTree::from_sorted(&sparse);
        assert!(!tree.has_slot_map());
        assert_eq!(tree.remove_slot(3), None, "no map, no removal by slot");
        // Dense: kept, and removal by slot gives the rank and prefix.
        let dense: Vec<PackedEntry> = (0..2000).map(|i| PackedEntry::new(i as u128 * 7, i as Slot)).collect();
        let mut tree = NodeTree::from_sorted(&dense);
        assert!(tree.has_slot_map());
        assert_eq!(tree.remove_slot(1500), Some((1500, 1500 * 7)));
        tree.check_invariants(compare);
        // A small tree that grows to the size over dense slots gets one.
        let mut tree = NodeTree::new();
        for slot in 0..SLOT_MAP_MIN_LEN as Slot {
            assert!(!tree.has_slot_map());
            tree.insert(Entry { prefix: u128::from(slot), slot }, compare);
        }
        assert!(tree.has_slot_map());
        tree.check_invariants(compare);
    }

    #[test]
    fn from_sorted_builds_valid_trees_of_every_small_size() {
        let secondary = vec![0u64; 5000];
        let compare = compare_with(&secondary);
        for n in (0..300).chain([4095, 4096, 4097, 4160]) {
            let entries: Vec<PackedEntry> = (0..n).map(|i| PackedEntry::new(i as u128, i as Slot)).collect();
            let tree = NodeTree::from_sorted(&entries);
            tree.check_invariants(&compare);
            assert_eq!(tree.len(), n);
        }
    }

    #[test]
    fn steady_churn_reuses_nodes() {
        // The new-message pattern: an entry leaves a random place and enters at the front.
        let n = 20_000usize;
        let mut prefixes: Vec<u128> = (0..n).map(|i| (n - i) as u128 * 10).collect();
        let secondary = vec![0u64; n];
        let compare = compare_with(&secondary);
        let mut entries: Vec<Entry> = (0..n).map(|i| Entry { prefix: prefixes[i], slot: i as Slot }).collect();
        entries.sort_by(|&a, &b| compare(a, b));
        let packed: Vec<PackedEntry> = entries.iter().map(|e| PackedEntry::new(e.prefix, e.slot)).collect();
        let mut tree = NodeTree::from_sorted(&packed);
        let mut rng = Rng(7);
        let mut top = (n as u128 + 1) * 10;
        let mut warm_capacity = (0, 0);
        for step in 0..200_000 {
            let slot = rng.below(n as u64) as usize;
            tree.remove(Entry { prefix: prefixes[slot], slot: slot as Slot }, &compare);
            top += 1;
            prefixes[slot] = top;
            let rank = tree.insert(Entry { prefix: top, slot: slot as Slot }, &compare);
            assert_eq!(rank, n - 1);
            if step == 100_000 {
                warm_capacity = (tree.leaves.len(), tree.inners.len());
            }
        }
        tree.check_invariants(&compare);
        // The arenas reach a working size and then recycle nodes: a little jitter
        // in the peak is fine, steady growth is not.
        assert!(tree.leaves.len() <= warm_capacity.0 + warm_capacity.0 / 100 + 2, "leaf arena kept growing");
        assert!(tree.inners.len() <= warm_capacity.1 + 2, "inner arena kept growing");
    }
}
