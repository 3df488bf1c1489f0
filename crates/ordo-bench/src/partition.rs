//! A model of the plan past one log (docs/SCALING.md, "Past one log"): collections
//! partitioned across K streams, each materialised by its own node group, with a
//! routing table that maps hash slots to streams and moves slots between them.
//! Nothing here is built into `ordo serve` (future work); this model checks the
//! design's rules before anyone builds it:
//!
//! - a slot is the hash of the collection name, or of the owner for collections
//!   partitioned by owner (`slot_of`), into `SLOTS` slots;
//! - a write is routed with the router's copy of the table (possibly stale) and
//!   appended to one stream; the stream's node group decides at apply time, from
//!   the stream's own order, whether the slot is still its own — so a write that
//!   arrives after the slot moved is refused (`moved`) on every node of that group
//!   alike, and the router refreshes its table and retries;
//! - a move is: table says `Moving` (writes for the slot wait), `Fence` entry in
//!   the old stream (after it, the old group refuses the slot and hands over the
//!   slot's items as of the fence), `Adopt` entry with those items in the new
//!   stream, table says the new stream;
//! - a view pinned to one slot (its collection, or `owner = X` for an owner-
//!   partitioned collection) runs on that slot's group; any other view is either
//!   refused (`cross_partition`) or gathered: run on every group and merged.
//!
//! `check` runs a random schedule (writes from routers with stale tables, moves
//! started and finished in between, views) against a single-map reference and
//! returns the first broken rule. `crates/ordo-bench/tests/partition.rs` runs it
//! with seeds; `partition-sim` prints its statistics and the load skew of owner
//! hashing.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::data::Rng;

/// Hash slots (the unit of placement and of moves).
pub const SLOTS: u32 = 64;

/// FNV-1a 64: stable across Rust versions and machines (a routing hash must be;
/// `DefaultHasher` is not promised to be).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// How a collection is spread: whole (every item in the collection's slot) or by
/// owner (each owner's items in the owner's slot; one user's room list stays in
/// one partition).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartitionBy {
    Collection,
    Owner,
}

/// The slot of an item: of the collection name, or of `collection/owner`.
pub fn slot_of(collection: &str, by: PartitionBy, owner: &str) -> u32 {
    let h = match by {
        PartitionBy::Collection => fnv1a(collection.as_bytes()),
        PartitionBy::Owner => fnv1a(format!("{collection}/{owner}").as_bytes()),
    };
    (h % u64::from(SLOTS)) as u32
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    Owned(usize),
    /// Writes for the slot wait (routers answer "retry") until the move ends.
    Moving {
        from: usize,
        to: usize,
    },
}

/// The routing table: every slot's stream, with an epoch bumped on each change.
#[derive(Clone, Debug)]
pub struct RoutingTable {
    pub epoch: u64,
    pub slots: Vec<SlotState>,
}

impl RoutingTable {
    /// Slots spread round robin over `streams` streams.
    pub fn new(streams: usize) -> RoutingTable {
        RoutingTable { epoch: 1, slots: (0..SLOTS).map(|s| SlotState::Owned(s as usize % streams)).collect() }
    }
}

type ItemKey = (String, String); // (collection, item id)

#[derive(Clone, Debug)]
struct Item {
    owner: String,
    value: i64,
    write_id: u64,
}

#[derive(Clone, Debug)]
enum Entry {
    Write { write_id: u64, slot: u32, collection: String, owner: String, item: String, value: i64 },
    Fence { slot: u32 },
    Adopt { slot: u32, items: Vec<(ItemKey, Item)> },
}

/// What a write's apply answered (the same on every node of the group).
#[derive(Debug, PartialEq)]
enum Outcome {
    Applied,
    Moved,
}

/// One stream and the state its node group materialises from it (every node of
/// the group applies the same entries in the same order, so one state stands for
/// all of them).
#[derive(Default)]
struct Group {
    log: Vec<Entry>,
    owned: HashSet<u32>,
    items: BTreeMap<ItemKey, Item>,
    /// Which slot each item is in (to hand a slot over at a fence).
    slot_of_item: HashMap<ItemKey, u32>,
}

impl Group {
    /// Appends and applies one entry (the model applies at once; the real nodes
    /// apply in the same order, later).
    fn append(&mut self, entry: Entry, rules: &Rules) -> (Outcome, Vec<(ItemKey, Item)>) {
        self.log.push(entry.clone());
        match entry {
            Entry::Write { write_id, slot, collection, owner, item, value } => {
                // The rule that keeps a moved slot's writes out of the old stream.
                if rules.fence_check && !self.owned.contains(&slot) {
                    return (Outcome::Moved, Vec::new());
                }
                let key = (collection, item);
                self.slot_of_item.insert(key.clone(), slot);
                self.items.insert(key, Item { owner, value, write_id });
                (Outcome::Applied, Vec::new())
            }
            Entry::Fence { slot } => {
                self.owned.remove(&slot);
                let keys: Vec<ItemKey> =
                    self.slot_of_item.iter().filter(|(_, s)| **s == slot).map(|(k, _)| k.clone()).collect();
                let mut handed = Vec::with_capacity(keys.len());
                for key in keys {
                    self.slot_of_item.remove(&key);
                    if let Some(item) = self.items.remove(&key) {
                        handed.push((key, item));
                    }
                }
                (Outcome::Applied, handed)
            }
            Entry::Adopt { slot, items } => {
                self.owned.insert(slot);
                for (key, item) in items {
                    self.slot_of_item.insert(key.clone(), slot);
                    self.items.insert(key, item);
                }
                (Outcome::Applied, Vec::new())
            }
        }
    }
}

/// Switches for the rules the model checks: each `false` is a broken design the
/// tests must catch (they do: see the tests' mutation cases).
#[derive(Clone, Copy, Debug)]
pub struct Rules {
    /// Apply refuses a write for a slot its stream no longer owns.
    pub fence_check: bool,
    /// A gathered view merges every group's window (false: asks only the first group).
    pub gather_all: bool,
}

impl Default for Rules {
    fn default() -> Rules {
        Rules { fence_check: true, gather_all: true }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Config {
    pub streams: usize,
    pub routers: usize,
    pub collections: usize,
    pub owners: usize,
    pub items: usize,
    pub steps: usize,
    /// Views that are not pinned to one slot: gathered (true) or refused.
    pub gather: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config { streams: 4, routers: 3, collections: 3, owners: 20, items: 100, steps: 1500, gather: true }
    }
}

#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    pub writes_acked: u64,
    pub writes_moved_retried: u64,
    pub writes_waited_for_move: u64,
    pub moves: u64,
    pub views_pinned: u64,
    pub views_gathered: u64,
    pub views_refused: u64,
}

/// A view: items of `collection` (optionally of one owner), by value descending
/// then item id, first `limit`.
fn view(items: &BTreeMap<ItemKey, Item>, collection: &str, owner: Option<&str>, limit: usize) -> Vec<(i64, String)> {
    let mut rows: Vec<(i64, String)> = items
        .iter()
        .filter(|((c, _), it)| c == collection && owner.is_none_or(|o| it.owner == o))
        .map(|((_, id), it)| (it.value, id.clone()))
        .collect();
    rows.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    rows.truncate(limit);
    rows
}

fn collection_name(c: usize) -> String {
    format!("c{c}")
}

/// Collection 0 is partitioned whole, the others by owner.
fn partition_by(c: usize) -> PartitionBy {
    if c == 0 {
        PartitionBy::Collection
    } else {
        PartitionBy::Owner
    }
}

/// Runs one random schedule and checks the rules as it goes (see the end of the loop).
pub fn check(seed: u64, config: Config, rules: Rules) -> Result<Stats, String> {
    let mut rng = Rng::new(seed);
    let mut table = RoutingTable::new(config.streams);
    let mut groups: Vec<Group> = (0..config.streams).map(|_| Group::default()).collect();
    for (slot, state) in table.slots.iter().enumerate() {
        if let SlotState::Owned(s) = state {
            groups[*s].owned.insert(slot as u32);
        }
    }
    // Each router's copy of the table; refreshed now and then (stale in between).
    let mut routers: Vec<RoutingTable> = vec![table.clone(); config.routers];
    // The reference: one map, the order of acknowledgements.
    let mut reference: BTreeMap<ItemKey, Item> = BTreeMap::new();
    // An item keeps its owner (its owner is its partition key).
    let item_owner: Vec<String> = (0..config.items).map(|i| format!("u{}", i % config.owners)).collect();
    // A move in progress: (slot, from, to, fence appended?).
    let mut moving: Option<(u32, usize, usize)> = None;
    let mut stats = Stats::default();
    let mut next_write_id = 1u64;

    for step in 0..config.steps {
        let roll = rng.below(100);
        if roll < 70 {
            // A write from a random router.
            let r = rng.below(config.routers as u64) as usize;
            let c = rng.below(config.collections as u64) as usize;
            let i = rng.below(config.items as u64) as usize;
            let (collection, item, owner) = (collection_name(c), format!("i{i}"), item_owner[i].clone());
            let slot = slot_of(&collection, partition_by(c), &owner);
            let value = rng.below(1000) as i64;
            let write_id = next_write_id;
            next_write_id += 1;
            // The router tries with its table; `moved` refreshes it and retries
            // (bounded: two tries must do, since a refreshed table is current).
            let mut acked = false;
            for attempt in 0..3 {
                let stream = match routers[r].slots[slot as usize] {
                    SlotState::Owned(s) => s,
                    SlotState::Moving { .. } => {
                        // The writer is told to retry after the move; the model
                        // drops the write (never acknowledged), as a client whose
                        // retry comes later would send a new one.
                        stats.writes_waited_for_move += 1;
                        break;
                    }
                };
                let entry = Entry::Write {
                    write_id,
                    slot,
                    collection: collection.clone(),
                    owner: owner.clone(),
                    item: item.clone(),
                    value,
                };
                let (outcome, _) = groups[stream].append(entry, &rules);
                match outcome {
                    Outcome::Applied => {
                        acked = true;
                        break;
                    }
                    Outcome::Moved => {
                        stats.writes_moved_retried += 1;
                        routers[r] = table.clone();
                        if attempt == 2 {
                            return Err(format!("step {step}: write {write_id} still `moved` after a table refresh"));
                        }
                    }
                }
            }
            if acked {
                stats.writes_acked += 1;
                reference.insert((collection, item), Item { owner, value, write_id });
            }
        } else if roll < 78 {
            // A move starts or finishes (one at a time, as the routing layer would).
            match moving.take() {
                None => {
                    let slot = rng.below(u64::from(SLOTS)) as u32;
                    let SlotState::Owned(from) = table.slots[slot as usize] else { unreachable!() };
                    let to = (from + 1 + rng.below(config.streams as u64 - 1) as usize) % config.streams;
                    table.slots[slot as usize] = SlotState::Moving { from, to };
                    table.epoch += 1;
                    // The fence goes into the old stream at once; routers with an
                    // older table may still publish there: apply refuses them.
                    let (_, handed) = groups[from].append(Entry::Fence { slot }, &rules);
                    groups[to].append(Entry::Adopt { slot, items: handed }, &rules);
                    moving = Some((slot, from, to));
                }
                Some((slot, _from, to)) => {
                    table.slots[slot as usize] = SlotState::Owned(to);
                    table.epoch += 1;
                    stats.moves += 1;
                }
            }
        } else if roll < 85 {
            // A router refreshes its table.
            let r = rng.below(config.routers as u64) as usize;
            routers[r] = table.clone();
        } else {
            // A view: pinned to one owner, or over a whole collection.
            let c = rng.below(config.collections as u64) as usize;
            let collection = collection_name(c);
            let limit = 1 + rng.below(20) as usize;
            let pinned_owner =
                if rng.chance(0.6) { Some(format!("u{}", rng.below(config.owners as u64))) } else { None };
            let expected = view(&reference, &collection, pinned_owner.as_deref(), limit);
            let got = match (partition_by(c), &pinned_owner) {
                (PartitionBy::Collection, _) | (PartitionBy::Owner, Some(_)) => {
                    stats.views_pinned += 1;
                    let slot = slot_of(&collection, partition_by(c), pinned_owner.as_deref().unwrap_or(""));
                    // Reads go to the slot's owner; during a move the data is in
                    // the new stream already (adopted at the fence).
                    let stream = match table.slots[slot as usize] {
                        SlotState::Owned(s) | SlotState::Moving { to: s, .. } => s,
                    };
                    view(&groups[stream].items, &collection, pinned_owner.as_deref(), limit)
                }
                (PartitionBy::Owner, None) if !config.gather => {
                    stats.views_refused += 1;
                    continue; // refused: `cross_partition` (nothing to compare)
                }
                (PartitionBy::Owner, None) => {
                    stats.views_gathered += 1;
                    let asked = if rules.gather_all { groups.len() } else { 1 };
                    let mut merged: Vec<(i64, String)> =
                        groups[..asked].iter().flat_map(|g| view(&g.items, &collection, None, limit)).collect();
                    merged.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
                    merged.truncate(limit);
                    merged
                }
            };
            if got != expected {
                return Err(format!(
                    "step {step}: view of {collection} owner {pinned_owner:?} limit {limit}: got {got:?}, reference {expected:?}"
                ));
            }
        }
        // The item count after every step (a write applied twice, or applied by
        // a group that no longer owns its slot, shows at once); the full check
        // of every key now and then and at the end (it is O(keys × groups)).
        let total: usize = groups.iter().map(|g| g.items.len()).sum();
        if total != reference.len() {
            return Err(format!("step {step}: {total} items across groups, {} acknowledged keys", reference.len()));
        }
        if step % 64 == 0 || step + 1 == config.steps {
            check_placement(step, &table, &groups, &reference, moving)?;
        }
    }
    Ok(stats)
}

/// Every acknowledged write is in exactly one group, the one that owns its slot,
/// with the last acknowledged value; nothing else is anywhere.
fn check_placement(
    step: usize,
    table: &RoutingTable,
    groups: &[Group],
    reference: &BTreeMap<ItemKey, Item>,
    moving: Option<(u32, usize, usize)>,
) -> Result<(), String> {
    let total: usize = groups.iter().map(|g| g.items.len()).sum();
    if total != reference.len() {
        return Err(format!("step {step}: {total} items across groups, {} acknowledged keys", reference.len()));
    }
    for (key, want) in reference {
        let holders: Vec<usize> = (0..groups.len()).filter(|&g| groups[g].items.contains_key(key)).collect();
        if holders.len() != 1 {
            return Err(format!("step {step}: {key:?} held by groups {holders:?}, want exactly one"));
        }
        let group = &groups[holders[0]];
        let slot = group.slot_of_item[key];
        let owner = match table.slots[slot as usize] {
            SlotState::Owned(s) => s,
            SlotState::Moving { to, .. } => {
                debug_assert_eq!(moving.map(|m| m.0), Some(slot));
                to
            }
        };
        if holders[0] != owner {
            return Err(format!("step {step}: {key:?} in group {} but slot {slot} belongs to {owner}", holders[0]));
        }
        let got = &group.items[key];
        if got.write_id != want.write_id || got.value != want.value {
            return Err(format!(
                "step {step}: {key:?} holds write {} = {}, last acknowledged was write {} = {}",
                got.write_id, got.value, want.write_id, want.value
            ));
        }
    }
    Ok(())
}

/// Share of the writes the busiest of `streams` streams takes when `owners`
/// owners write with Zipf(`exponent`) activity and the collection is partitioned
/// by owner over `SLOTS` slots placed round robin. 1/streams is perfect balance;
/// the single-log ceiling divided by this share is what K streams sustain.
pub fn busiest_stream_share(streams: usize, owners: usize, exponent: f64) -> f64 {
    let table = RoutingTable::new(streams);
    let mut load = vec![0.0f64; streams];
    let mut sum = 0.0;
    for rank in 0..owners {
        let weight = 1.0 / ((rank + 1) as f64).powf(exponent);
        let slot = slot_of("memberships", PartitionBy::Owner, &format!("u{rank}"));
        let SlotState::Owned(s) = table.slots[slot as usize] else { unreachable!() };
        load[s] += weight;
        sum += weight;
    }
    load.iter().cloned().fold(0.0, f64::max) / sum
}
