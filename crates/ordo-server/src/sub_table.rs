//! `SubTable`: one connection's subscriptions, keyed by the `u32` handles the
//! server hands out.
//!
//! Handles only grow, so appending keeps the keys sorted. Keys and values sit
//! in two parallel ring buffers (`VecDeque`), the keys apart so that a search
//! reads only keys: the 128 keys of a full connection are 512 bytes, eight
//! cache lines. This is the layout of SwiftNIO HTTP/2's `StreamMap`, which
//! keeps stream ids the same way. Removing the oldest entry, the common case,
//! is O(1) since the ring buffer's front just moves; removing elsewhere shifts
//! the shorter side, at most `len / 2` entries.
//!
//! Like `StreamMap`, a lookup scans a small table and binary-searches a
//! large one; see [`LINEAR_SCAN_MAX_LEN`] for where the two meet.
//!
//! The table puts no limit on its length: the server refuses a subscription
//! past its per-connection limit before it gets here.

use std::collections::VecDeque;
use std::fmt;

/// Tables of at most this many entries are searched by a linear scan, larger
/// ones by binary search.
///
/// Measured with `server-micro` (section d: release build, x86-64 AMD EPYC
/// VM, random present keys wrapped around the ring buffer, three runs): the
/// scan that counts the keys below the one sought, without branching (the
/// compiler vectorises it), takes 0.5–0.8× the time of std's binary search at
/// 2–4 keys (about 3 ns against 5–6 ns), the two are level at 6–12 keys, and
/// binary search wins from 16 keys on (1.2–1.4× at 16, 2–3.5× at 128); 8 is
/// in the middle of the level stretch. A scan that stops early, as
/// `StreamMap`'s does, loses to binary search from 3 keys on: its exit branch
/// is mispredicted on random keys. (`StreamMap` scans up to 200 streams, but
/// its binary search branches; std's does not.)
/// The differences are a few nanoseconds either way, and runs on this shared
/// machine vary by up to 2× at that scale; the order above held in every run.
pub const LINEAR_SCAN_MAX_LEN: usize = 8;

/// A subscription table: values keyed by `u32` handles inserted in
/// increasing order. See the module documentation.
#[derive(Debug, Clone)]
pub struct SubTable<V> {
    /// Strictly increasing; `keys[i]` is the key of `values[i]`.
    keys: VecDeque<u32>,
    values: VecDeque<V>,
    /// The greatest key ever inserted, even if removed since: a new key must
    /// exceed it, so that a removed handle is never reused by mistake.
    newest_key: Option<u32>,
}

/// [`SubTable::insert`] was given a key that does not exceed every key
/// inserted before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyNotIncreasing {
    /// The key that was refused.
    pub key: u32,
    /// The greatest key inserted so far.
    pub newest_key: u32,
}

impl fmt::Display for KeyNotIncreasing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "subscription handle {} is not greater than the newest handle {} (handles must increase)",
            self.key, self.newest_key
        )
    }
}

impl std::error::Error for KeyNotIncreasing {}

impl<V> Default for SubTable<V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V> SubTable<V> {
    /// An empty table.
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    /// An empty table with room for `capacity` entries before it reallocates.
    pub fn with_capacity(capacity: usize) -> Self {
        SubTable {
            keys: VecDeque::with_capacity(capacity),
            values: VecDeque::with_capacity(capacity),
            newest_key: None,
        }
    }

    /// Number of entries.
    #[inline]
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the table has no entries.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Adds `value` under `key`, which must exceed every key inserted before
    /// (removed ones included); otherwise nothing changes, `value` is dropped
    /// and the error says which key it had to exceed.
    pub fn insert(&mut self, key: u32, value: V) -> Result<(), KeyNotIncreasing> {
        if let Some(newest_key) = self.newest_key {
            if key <= newest_key {
                return Err(KeyNotIncreasing { key, newest_key });
            }
        }
        debug_assert!(self.keys.back().is_none_or(|&last| last < key));
        if self.values.capacity() == 0 {
            // Most connections hold one subscription: room for exactly one
            // (a first push would make room for four entries of a few hundred bytes).
            self.keys.reserve_exact(1);
            self.values.reserve_exact(1);
        }
        self.keys.push_back(key);
        self.values.push_back(value);
        self.newest_key = Some(key);
        Ok(())
    }

    /// The value under `key`.
    #[inline]
    pub fn get(&self, key: u32) -> Option<&V> {
        let index = self.index_of(key)?;
        Some(&self.values[index])
    }

    /// The value under `key`, mutably.
    #[inline]
    pub fn get_mut(&mut self, key: u32) -> Option<&mut V> {
        let index = self.index_of(key)?;
        Some(&mut self.values[index])
    }

    /// Whether `key` has a value.
    #[inline]
    pub fn contains_key(&self, key: u32) -> bool {
        self.index_of(key).is_some()
    }

    /// Removes and returns the value under `key`.
    pub fn remove(&mut self, key: u32) -> Option<V> {
        let index = self.index_of(key)?;
        if index == 0 {
            // The oldest subscription: the ring buffer's front just moves.
            self.keys.pop_front();
            return self.values.pop_front();
        }
        self.keys.remove(index);
        self.values.remove(index)
    }

    /// The entries in increasing key order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (u32, &V)> + ExactSizeIterator + '_ {
        self.keys.iter().copied().zip(self.values.iter())
    }

    /// The entries in increasing key order, values mutably.
    pub fn iter_mut(&mut self) -> impl DoubleEndedIterator<Item = (u32, &mut V)> + ExactSizeIterator + '_ {
        self.keys.iter().copied().zip(self.values.iter_mut())
    }

    /// Keeps only the entries for which `keep` returns true, in key order.
    pub fn retain(&mut self, mut keep: impl FnMut(u32, &mut V) -> bool) {
        // Kept entries are swapped down to the front, so entries `kept..next`
        // are always the ones refused so far. If `keep` panics, the guard
        // removes those and the keys stay sorted.
        struct Guard<'a, V> {
            table: &'a mut SubTable<V>,
            kept: usize,
            next: usize,
        }
        impl<V> Drop for Guard<'_, V> {
            fn drop(&mut self) {
                self.table.keys.drain(self.kept..self.next);
                self.table.values.drain(self.kept..self.next);
            }
        }
        let len = self.len();
        let mut guard = Guard { table: self, kept: 0, next: 0 };
        while guard.next < len {
            let index = guard.next;
            if keep(guard.table.keys[index], &mut guard.table.values[index]) {
                guard.table.keys.swap(guard.kept, index);
                guard.table.values.swap(guard.kept, index);
                guard.kept += 1;
            }
            guard.next += 1;
        }
    }

    /// Removes every entry, yielding them in key order. Entries not yet
    /// yielded when the iterator is dropped are removed too. Handles stay
    /// used: the next key must still exceed the newest one inserted.
    pub fn drain(&mut self) -> impl DoubleEndedIterator<Item = (u32, V)> + ExactSizeIterator + '_ {
        self.keys.drain(..).zip(self.values.drain(..))
    }

    /// The position of `key` in the buffers.
    #[inline]
    fn index_of(&self, key: u32) -> Option<usize> {
        if self.keys.len() <= LINEAR_SCAN_MAX_LEN {
            self.index_by_linear_scan(key)
        } else {
            self.index_by_binary_search(key)
        }
    }

    /// The position of `key`, by counting the keys below it: no early exit,
    /// so no branch per key, and the compiler vectorises the count.
    #[inline]
    fn index_by_linear_scan(&self, key: u32) -> Option<usize> {
        let (front, back) = self.keys.as_slices();
        let count_below = |keys: &[u32]| keys.iter().fold(0u32, |count, &k| count + u32::from(k < key));
        let index = (count_below(front) + count_below(back)) as usize;
        (self.keys.get(index) == Some(&key)).then_some(index)
    }

    #[inline]
    fn index_by_binary_search(&self, key: u32) -> Option<usize> {
        self.keys.binary_search(&key).ok()
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_first_subscription_takes_room_for_one() {
        let mut table: SubTable<[u8; 400]> = SubTable::default();
        table.insert(1, [0; 400]).unwrap();
        assert_eq!(table.values.capacity(), 1);
        table.insert(2, [0; 400]).unwrap();
        assert!(table.get(1).is_some() && table.get(2).is_some());
    }

    use super::*;
    use std::collections::BTreeMap;

    use crate::rng::Rng;

    /// A value that owns heap memory, so that a lost or doubled value would
    /// show up under Miri or as a mismatch.
    type Value = String;

    fn assert_same(table: &SubTable<Value>, model: &BTreeMap<u32, Value>, context: &str) {
        assert_eq!(table.len(), model.len(), "{context}: len");
        assert_eq!(table.is_empty(), model.is_empty(), "{context}: is_empty");
        let entries: Vec<(u32, &Value)> = table.iter().collect();
        let expected: Vec<(u32, &Value)> = model.iter().map(|(&k, v)| (k, v)).collect();
        assert_eq!(entries, expected, "{context}: entries");
        assert_eq!(table.iter().len(), model.len(), "{context}: iter().len()");
        let reversed: Vec<u32> = table.iter().rev().map(|(k, _)| k).collect();
        let expected_reversed: Vec<u32> = model.keys().rev().copied().collect();
        assert_eq!(reversed, expected_reversed, "{context}: reversed keys");
    }

    /// Random operations against a `BTreeMap`, compared after every step. The
    /// table grows towards `target_len_high`, then shrinks towards
    /// `target_len_low`, and again; its ring buffers wrap around as the
    /// oldest entries leave.
    fn run_model(seed: u64, target_len_low: usize, target_len_high: usize, steps: usize) {
        let mut rng = Rng::new(seed);
        let mut table: SubTable<Value> = SubTable::with_capacity(rng.below(4) as usize);
        let mut model: BTreeMap<u32, Value> = BTreeMap::new();
        let mut newest_key: Option<u32> = None;
        let mut growing = true;
        let (mut max_len, mut steps_wrapped, mut threshold_crossings, mut was_above) = (0, 0, 0, false);
        for step in 0..steps {
            let context = format!("seed {seed}, low {target_len_low}, high {target_len_high}, step {step}");
            if growing && model.len() >= target_len_high {
                growing = false;
            } else if !growing && model.len() <= target_len_low {
                growing = true;
            }
            // A key to look up or remove: mostly present ones, sometimes a
            // removed one, one between two present ones, or one never inserted.
            let any_key = |rng: &mut Rng| -> u32 {
                let upper = newest_key.map_or(0, |k| k + 2);
                if !model.is_empty() && rng.chance(80) {
                    let nth = rng.below(model.len() as u64) as usize;
                    *model.keys().nth(nth).unwrap()
                } else {
                    rng.below(u64::from(upper) + 1) as u32
                }
            };
            match rng.below(1000) {
                0..=399 => {
                    let insert_percent = if growing { 75 } else { 25 };
                    if rng.chance(insert_percent) {
                        let key = newest_key.map_or(rng.below(3) as u32, |k| k + 1 + rng.below(3) as u32);
                        let value = format!("v{key}");
                        assert_eq!(table.insert(key, value.clone()), Ok(()), "{context}: insert {key}");
                        model.insert(key, value);
                        newest_key = Some(key);
                    } else if rng.chance(60) {
                        // Subscriptions mostly close oldest-first.
                        let key = model.keys().next().copied().unwrap_or(0);
                        assert_eq!(table.remove(key), model.remove(&key), "{context}: remove oldest {key}");
                    } else {
                        let key = any_key(&mut rng);
                        assert_eq!(table.remove(key), model.remove(&key), "{context}: remove {key}");
                    }
                }
                400..=449 => {
                    // A key that does not increase is refused and changes nothing.
                    if let Some(newest) = newest_key {
                        let key = newest - rng.below(u64::from(newest) + 1) as u32;
                        let refused = table.insert(key, "refused".to_owned());
                        assert_eq!(
                            refused,
                            Err(KeyNotIncreasing { key, newest_key: newest }),
                            "{context}: refuse {key}"
                        );
                    }
                }
                450..=749 => {
                    let key = any_key(&mut rng);
                    assert_eq!(table.get(key), model.get(&key), "{context}: get {key}");
                    assert_eq!(table.contains_key(key), model.contains_key(&key), "{context}: contains {key}");
                }
                750..=899 => {
                    let key = any_key(&mut rng);
                    let suffix = format!("+{step}");
                    if let Some(value) = table.get_mut(key) {
                        value.push_str(&suffix);
                    }
                    if let Some(value) = model.get_mut(&key) {
                        value.push_str(&suffix);
                    }
                }
                900..=997 => {
                    let suffix = format!("*{step}");
                    for (key, value) in table.iter_mut() {
                        if key % 3 == 0 {
                            value.push_str(&suffix);
                        }
                    }
                    for (key, value) in model.iter_mut() {
                        if key % 3 == 0 {
                            value.push_str(&suffix);
                        }
                    }
                }
                998 => {
                    let modulus = 2 + rng.below(5) as u32;
                    let suffix = format!("r{step}");
                    table.retain(|key, value| {
                        value.push_str(&suffix);
                        key % modulus != 0
                    });
                    model.retain(|key, value| {
                        value.push_str(&suffix);
                        key % modulus != 0
                    });
                }
                _ => {
                    if rng.chance(10) {
                        let drained: Vec<(u32, Value)> = table.drain().collect();
                        let expected: Vec<(u32, Value)> = std::mem::take(&mut model).into_iter().collect();
                        assert_eq!(drained, expected, "{context}: drain");
                    } else {
                        // Half-consumed drains still empty the table.
                        let first = table.drain().next();
                        assert_eq!(first, std::mem::take(&mut model).into_iter().next(), "{context}: drain first");
                    }
                }
            }
            assert_same(&table, &model, &context);
            max_len = max_len.max(table.len());
            if !table.keys.as_slices().1.is_empty() {
                steps_wrapped += 1;
            }
            let above = table.len() > LINEAR_SCAN_MAX_LEN;
            if above != was_above {
                threshold_crossings += 1;
                was_above = above;
            }
        }
        // The run did what it is for: reached its high mark and, when the
        // table was big enough, searched its keys wrapped around the buffer,
        // and crossed the scan threshold both ways when its marks straddle it.
        assert!(max_len >= target_len_high, "seed {seed}: reached only {max_len} entries, not {target_len_high}");
        if target_len_high >= 4 {
            assert!(steps_wrapped >= steps / 20, "seed {seed}: keys wrapped in only {steps_wrapped} steps");
        }
        if target_len_low < LINEAR_SCAN_MAX_LEN && LINEAR_SCAN_MAX_LEN < target_len_high {
            assert!(threshold_crossings >= 6, "seed {seed}: crossed the threshold {threshold_crossings} times");
        }
    }

    #[test]
    fn matches_btreemap_model_across_the_scan_threshold() {
        let t = LINEAR_SCAN_MAX_LEN;
        let ranges = [(0, 1), (0, 4), (1, 2), (t - 2, t + 2), (t - 1, t + 1), (1, 3 * t), (16, 128), (100, 300)];
        for seed in 1..=6 {
            for &(low, high) in &ranges {
                run_model(seed, low, high, 4_000.max(high * 40));
            }
        }
    }

    #[test]
    fn both_searches_find_every_key_when_the_ring_buffer_wraps() {
        // Remove from the front and push at the back so the buffer wraps,
        // then look up every key, present or not, both ways.
        for max_len in [1, 2, 3, LINEAR_SCAN_MAX_LEN, LINEAR_SCAN_MAX_LEN + 1, 70] {
            let mut table = SubTable::with_capacity(2);
            let mut steps_wrapped = 0;
            for key in 0..200u32 {
                table.insert(key * 2, key).unwrap();
                if table.len() > max_len {
                    let oldest = table.iter().next().unwrap().0;
                    table.remove(oldest);
                }
                if !table.keys.as_slices().1.is_empty() {
                    steps_wrapped += 1;
                }
                for probe in 0..=key * 2 + 2 {
                    let context = format!("max_len {max_len}, probe {probe}");
                    let expected = table.iter().position(|(k, _)| k == probe);
                    assert_eq!(table.index_by_linear_scan(probe), expected, "linear, {context}");
                    assert_eq!(table.index_by_binary_search(probe), expected, "binary, {context}");
                    assert_eq!(table.get(probe), expected.map(|index| &table.values[index]), "get, {context}");
                }
            }
            assert!(max_len == 1 || steps_wrapped > 0, "max_len {max_len}: never wrapped");
        }
    }

    #[test]
    fn refuses_a_removed_handle() {
        let mut table = SubTable::new();
        table.insert(7, "a").unwrap();
        assert_eq!(table.remove(7), Some("a"));
        let error = table.insert(7, "b").unwrap_err();
        assert_eq!(error, KeyNotIncreasing { key: 7, newest_key: 7 });
        assert!(error.to_string().contains("not greater than the newest handle 7"));
        assert!(table.is_empty());
        table.insert(8, "c").unwrap();
        assert_eq!(table.get(8), Some(&"c"));
    }

    #[test]
    fn retain_keeps_keys_sorted_when_the_predicate_panics() {
        let mut table = SubTable::new();
        for key in 0..10u32 {
            table.insert(key, key).unwrap();
        }
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            table.retain(|key, _| {
                assert!(key != 6, "stop at 6");
                key % 2 == 1
            })
        }));
        assert!(outcome.is_err());
        // 0, 2, 4 were refused; 6 panicked and stays, with everything after it.
        let keys: Vec<u32> = table.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, [1, 3, 5, 6, 7, 8, 9]);
        for key in 0..10 {
            assert_eq!(table.get(key).is_some(), keys.contains(&key));
        }
    }
}
