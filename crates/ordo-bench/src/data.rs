//! The seeded, deterministic data set of `SCENARIOS.md`: the room
//! collection, the update streams, the filters of `filter-switch`, the window
//! offsets of `fan-out` and the collections of `many-lists`.
//!
//! Everything is generated before any timing starts, and every system (Ordo
//! and the peers) is handed the same slices, so all of them see exactly the
//! same rooms and the same updates in the same order.

use std::cmp::Ordering;
use std::collections::HashSet;

/// Rooms' `recency` values are below this; updates set values above it.
pub const RECENCY_MAX_INITIAL: u64 = 1_000_000_000;
/// Rooms with `is_local == true` (exactly this many, when N ≥ 4).
pub const LOCAL_ROOMS: usize = 4;
/// The window of the room-list view.
pub const WINDOW_LIMIT: usize = 20;
/// The non-ASCII letters that 2% of names contain (one each).
pub const NON_ASCII_LETTERS: [char; 8] = ['é', 'ß', 'Ω', 'ø', 'ñ', 'ü', 'ç', 'å'];

/// A small, fast, seedable PRNG (splitmix64). Not for cryptography; only for
/// a reproducible data set.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// An independent generator derived from `seed` and a stream name, so that
    /// e.g. the update stream does not depend on how many numbers the room
    /// generator drew.
    pub fn derived(seed: u64, stream: &str) -> Self {
        // FNV-1a of the stream name, mixed with the seed.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in stream.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        let mut r = Rng(seed ^ h);
        r.next_u64();
        r
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (multiply-shift; the bias is below 2⁻³² for the
    /// ranges used here). `n` must be > 0.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    #[inline]
    pub fn range_inclusive(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// Uniform in `[0, 1)`.
    #[inline]
    pub fn unit_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// True with probability `p`.
    #[inline]
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit_f64() < p
    }

    /// Fisher–Yates shuffle.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
}

/// One room of the collection (see the table in `SCENARIOS.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Room {
    /// `!room{n:08}:example.org`.
    pub id: String,
    /// 12–20 lowercase ASCII letters; 2% contain one letter of
    /// [`NON_ASCII_LETTERS`].
    pub name: String,
    /// Milliseconds; distinct among non-zero values, in `1..10⁹`; 0 for 10%.
    pub recency: u64,
    /// True for exactly [`LOCAL_ROOMS`] rooms (never left ones).
    pub is_local: bool,
    /// True for 5%.
    pub left: bool,
    /// 0 for 70%, else `1..=200`.
    pub unread: u32,
    /// True for 30%.
    pub is_dm: bool,
    /// True for 5%.
    pub favourite: bool,
    /// ~200 bytes of opaque "latest message preview"; not used for sorting.
    pub payload: Vec<u8>,
}

/// The room id for index `n`.
pub fn room_id(n: usize) -> String {
    format!("!room{n:08}:example.org")
}

const PAYLOAD_ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz .,!?'";

/// A preview of 180–220 printable bytes.
pub fn random_payload(rng: &mut Rng) -> Vec<u8> {
    let len = rng.range_inclusive(180, 220) as usize;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let mut bits = rng.next_u64();
        for _ in 0..12 {
            if out.len() == len {
                break;
            }
            out.push(PAYLOAD_ALPHABET[(bits & 31) as usize]);
            bits >>= 5;
        }
    }
    out
}

fn random_name(rng: &mut Rng) -> String {
    let len = rng.range_inclusive(12, 20) as usize;
    let mut name: Vec<char> = (0..len).map(|_| (b'a' + rng.below(26) as u8) as char).collect();
    if rng.chance(0.02) {
        let pos = rng.below(len as u64) as usize;
        name[pos] = NON_ASCII_LETTERS[rng.below(NON_ASCII_LETTERS.len() as u64) as usize];
    }
    name.into_iter().collect()
}

/// Generates the N rooms for `seed`. Deterministic: the same `(n, seed)`
/// always gives the same rooms.
pub fn generate_rooms(n: usize, seed: u64) -> Vec<Room> {
    let mut rng = Rng::derived(seed, "rooms");
    // Distinct non-zero recencies: draw and reject duplicates.
    let mut used = HashSet::with_capacity(n);
    let mut rooms: Vec<Room> = (0..n)
        .map(|i| {
            let recency = if rng.chance(0.10) {
                0
            } else {
                loop {
                    let r = rng.range_inclusive(1, RECENCY_MAX_INITIAL - 1);
                    if used.insert(r) {
                        break r;
                    }
                }
            };
            let left = rng.chance(0.05);
            let unread = if rng.chance(0.70) { 0 } else { rng.range_inclusive(1, 200) as u32 };
            let is_dm = rng.chance(0.30);
            let favourite = rng.chance(0.05);
            Room {
                id: room_id(i),
                name: random_name(&mut rng),
                recency,
                is_local: false,
                left,
                unread,
                is_dm,
                favourite,
                payload: random_payload(&mut rng),
            }
        })
        .collect();
    // Exactly LOCAL_ROOMS local rooms, chosen at random; they are never left.
    let mut chosen = HashSet::new();
    while chosen.len() < LOCAL_ROOMS.min(n) {
        chosen.insert(rng.below(n as u64) as usize);
    }
    for i in chosen {
        rooms[i].is_local = true;
        rooms[i].left = false;
    }
    rooms
}

/// The order of the room-list view: `is_local` desc, `recency` desc, `name`
/// asc, `id` asc (total).
pub fn cmp_rooms(a: &Room, b: &Room) -> Ordering {
    b.is_local
        .cmp(&a.is_local)
        .then_with(|| b.recency.cmp(&a.recency))
        .then_with(|| a.name.cmp(&b.name))
        .then_with(|| a.id.cmp(&b.id))
}

/// How the rooms touched by an update stream are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dist {
    /// Uniform over the non-left rooms.
    Uniform,
    /// Zipf with s = 1.0 over a random permutation of the non-left rooms.
    Zipf,
}

impl Dist {
    /// The label used in the report.
    pub fn label(self) -> &'static str {
        match self {
            Dist::Uniform => "uniform",
            Dist::Zipf => "zipf",
        }
    }
}

/// One new-message update: room `room` (an index into the room slice the
/// stream was generated for) gets `recency` (a new maximum, larger than every
/// earlier value) and `payload` as its new preview.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    /// Index into the rooms slice.
    pub room: u32,
    /// The new recency: `RECENCY_MAX_INITIAL + 1 + k` for the k-th update.
    pub recency: u64,
    /// The new ~200-byte preview.
    pub payload: Vec<u8>,
}

/// Generates `count` updates over the non-left rooms of `rooms`.
/// Deterministic for `(rooms, count, dist, seed)`; a shorter stream is a
/// prefix of a longer one.
pub fn generate_updates(rooms: &[Room], count: usize, dist: Dist, seed: u64) -> Vec<Update> {
    let mut rng = Rng::derived(seed, dist.label());
    let mut live: Vec<u32> = (0..rooms.len() as u32).filter(|&i| !rooms[i as usize].left).collect();
    assert!(!live.is_empty(), "no non-left room to update");
    // Zipf: rank k (1-based) has weight 1/k; ranks are a random permutation.
    let cdf: Vec<f64> = match dist {
        Dist::Uniform => Vec::new(),
        Dist::Zipf => {
            rng.shuffle(&mut live);
            let mut acc = 0.0;
            (0..live.len())
                .map(|k| {
                    acc += 1.0 / (k as f64 + 1.0);
                    acc
                })
                .collect()
        }
    };
    (0..count)
        .map(|k| {
            let room = match dist {
                Dist::Uniform => live[rng.below(live.len() as u64) as usize],
                Dist::Zipf => {
                    let u = rng.unit_f64() * cdf[cdf.len() - 1];
                    let rank = cdf.partition_point(|&c| c <= u).min(live.len() - 1);
                    live[rank]
                }
            };
            Update { room, recency: RECENCY_MAX_INITIAL + 1 + k as u64, payload: random_payload(&mut rng) }
        })
        .collect()
}

/// The four filters of `filter-switch`, switched through in this order
/// (cyclically).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoomFilter {
    /// `left == false` (the room-list view's filter).
    NotLeft,
    /// `unread > 0`.
    Unread,
    /// `is_dm == true`.
    Dm,
    /// `name contains "ab"`, case-insensitive.
    NameContainsAb,
}

impl RoomFilter {
    /// The filters in switching order; the view starts on `ALL[0]`.
    pub const ALL: [RoomFilter; 4] =
        [RoomFilter::NotLeft, RoomFilter::Unread, RoomFilter::Dm, RoomFilter::NameContainsAb];

    /// Short label for reports.
    pub fn label(self) -> &'static str {
        match self {
            RoomFilter::NotLeft => "not-left",
            RoomFilter::Unread => "unread",
            RoomFilter::Dm => "dm",
            RoomFilter::NameContainsAb => "name~ab",
        }
    }

    /// Whether a room with these fields passes the filter. Shared by every
    /// peer so that all of them evaluate the same predicate.
    #[inline]
    pub fn matches_fields(self, left: bool, unread: u32, is_dm: bool, name: &str) -> bool {
        match self {
            RoomFilter::NotLeft => !left,
            RoomFilter::Unread => unread > 0,
            RoomFilter::Dm => is_dm,
            RoomFilter::NameContainsAb => contains_ab_ignore_case(name),
        }
    }

    /// Whether `room` passes the filter.
    #[inline]
    pub fn matches(self, room: &Room) -> bool {
        self.matches_fields(room.left, room.unread, room.is_dm, &room.name)
    }
}

/// Case-insensitive `contains("ab")` without allocating. Comparing bytes with
/// ASCII case folding is exact here: no non-ASCII character case-folds to
/// `a` or `b`, and UTF-8 continuation bytes never equal an ASCII byte.
#[inline]
pub fn contains_ab_ignore_case(name: &str) -> bool {
    name.as_bytes().windows(2).any(|w| w.eq_ignore_ascii_case(b"ab"))
}

/// What `create` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateView {
    /// The first window (offset 0, limit 20): a Reset of 20 rooms.
    Window,
    /// The full sorted view, no window (only where the system has one).
    Full,
}

impl CreateView {
    /// The label used in the report's `dist` column.
    pub fn label(self) -> &'static str {
        match self {
            CreateView::Window => "window",
            CreateView::Full => "full",
        }
    }
}

/// A step of `load-more`: the window limit goes from `from` to `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitStep {
    /// The limit before the step.
    pub from: usize,
    /// The limit after the step.
    pub to: usize,
}

impl LimitStep {
    /// Label such as `20->40`.
    pub fn label(self) -> String {
        format!("{}->{}", self.from, self.to)
    }
}

/// The `load-more` cycle: 20 → 200 by 20, then back to 20 (18 steps). The
/// cycle starts and ends at a limit of 20, so it can be repeated.
pub fn load_more_steps() -> Vec<LimitStep> {
    let up = (1..10).map(|k| LimitStep { from: 20 * k, to: 20 * (k + 1) });
    let down = (1..10).rev().map(|k| LimitStep { from: 20 * (k + 1), to: 20 * k });
    up.chain(down).collect()
}

/// The window offsets of `fan-out`: 0, 20, 40, … wrapping around before the
/// end of the `visible` rooms, so that every window is full when
/// `visible ≥ 20`.
pub fn fan_out_offsets(visible: usize, windows: usize) -> Vec<usize> {
    let wrap = (visible - visible % WINDOW_LIMIT).max(WINDOW_LIMIT);
    (0..windows).map(|i| (i * WINDOW_LIMIT) % wrap).collect()
}

/// The data of `many-lists`: one universe of rooms and `collections` lists of
/// `per_collection` rooms each, every room being in exactly `members`
/// collections (its members' room lists). Each collection holds its own copy
/// of its rooms' data.
#[derive(Debug, Clone)]
pub struct ManyLists {
    /// The room universe (`collections × per_collection / members` rooms).
    pub rooms: Vec<Room>,
    /// Number of collections.
    pub collections: usize,
    /// Rooms per collection.
    pub per_collection: usize,
    /// Collections per room.
    pub members: usize,
    /// `collection_rooms[c * per_collection + p]` is the room index at
    /// position `p` of collection `c`.
    pub collection_rooms: Vec<u32>,
    /// `memberships[r * members + k]` is `(collection, position)` of room `r`
    /// in its k-th collection.
    pub memberships: Vec<(u32, u32)>,
}

impl ManyLists {
    /// The room indices of collection `c`, by position.
    pub fn collection(&self, c: usize) -> &[u32] {
        &self.collection_rooms[c * self.per_collection..(c + 1) * self.per_collection]
    }

    /// The `(collection, position)` pairs that hold room `r`.
    pub fn memberships_of(&self, r: usize) -> &[(u32, u32)] {
        &self.memberships[r * self.members..(r + 1) * self.members]
    }
}

/// Generates the `many-lists` data: `members` rounds; each round shuffles the
/// room universe and deals it out, `per_collection` rooms at a time, to
/// `collections / members` collections. `collections` must be a multiple of
/// `members`.
pub fn generate_many_lists(collections: usize, per_collection: usize, members: usize, seed: u64) -> ManyLists {
    assert!(
        collections.is_multiple_of(members) && collections > 0,
        "collections must be a positive multiple of members"
    );
    let n_rooms = collections * per_collection / members;
    let rooms = generate_rooms(n_rooms, seed);
    let mut rng = Rng::derived(seed, "many-lists");
    let per_round = collections / members;
    let mut collection_rooms = vec![0u32; collections * per_collection];
    let mut memberships = vec![(0u32, 0u32); n_rooms * members];
    let mut seen = vec![0usize; n_rooms];
    let mut perm: Vec<u32> = (0..n_rooms as u32).collect();
    for round in 0..members {
        rng.shuffle(&mut perm);
        for (k, &r) in perm.iter().enumerate() {
            let c = round * per_round + k / per_collection;
            let p = k % per_collection;
            collection_rooms[c * per_collection + p] = r;
            let r = r as usize;
            memberships[r * members + seen[r]] = (c as u32, p as u32);
            seen[r] += 1;
        }
    }
    ManyLists { rooms, collections, per_collection, members, collection_rooms, memberships }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_for_a_seed() {
        assert_eq!(generate_rooms(2000, 7), generate_rooms(2000, 7));
        assert_ne!(generate_rooms(2000, 7), generate_rooms(2000, 8));
        let rooms = generate_rooms(2000, 7);
        let a = generate_updates(&rooms, 300, Dist::Zipf, 7);
        assert_eq!(a, generate_updates(&rooms, 300, Dist::Zipf, 7));
        // A shorter stream is a prefix of a longer one.
        assert_eq!(a[..100], generate_updates(&rooms, 100, Dist::Zipf, 7)[..]);
    }

    #[test]
    fn distribution_rules() {
        let n = 50_000;
        let rooms = generate_rooms(n, 42);
        assert_eq!(rooms.len(), n);
        assert_eq!(rooms.iter().filter(|r| r.is_local).count(), LOCAL_ROOMS);
        assert!(rooms.iter().filter(|r| r.is_local).all(|r| !r.left));
        for (i, r) in rooms.iter().enumerate() {
            assert_eq!(r.id, format!("!room{:08}:example.org", i));
            let chars = r.name.chars().count();
            assert!((12..=20).contains(&chars), "{}", r.name);
            let non_ascii = r.name.chars().filter(|c| !c.is_ascii()).count();
            assert!(non_ascii <= 1);
            assert!(r.name.chars().all(|c| c.is_ascii_lowercase() || NON_ASCII_LETTERS.contains(&c)));
            assert!(r.recency < RECENCY_MAX_INITIAL);
            assert!(r.unread <= 200);
            assert!((180..=220).contains(&r.payload.len()));
        }
        let mut nonzero: Vec<u64> = rooms.iter().map(|r| r.recency).filter(|&r| r != 0).collect();
        let count = nonzero.len();
        nonzero.sort_unstable();
        nonzero.dedup();
        assert_eq!(nonzero.len(), count, "non-zero recencies are distinct");
        let frac = |p: &dyn Fn(&Room) -> bool| rooms.iter().filter(|r| p(r)).count() as f64 / n as f64;
        let near = |x: f64, want: f64| (x - want).abs() < 0.01;
        assert!(near(frac(&|r| r.recency == 0), 0.10));
        assert!(near(frac(&|r| r.left), 0.05));
        assert!(near(frac(&|r| r.unread == 0), 0.70));
        assert!(near(frac(&|r| r.is_dm), 0.30));
        assert!(near(frac(&|r| r.favourite), 0.05));
        assert!(near(frac(&|r| !r.name.is_ascii()), 0.02));
    }

    #[test]
    fn updates_rules() {
        let rooms = generate_rooms(5000, 3);
        for dist in [Dist::Uniform, Dist::Zipf] {
            let ups = generate_updates(&rooms, 5000, dist, 3);
            let mut last = RECENCY_MAX_INITIAL;
            for u in &ups {
                assert!(!rooms[u.room as usize].left);
                assert!(u.recency > last);
                last = u.recency;
                assert!((180..=220).contains(&u.payload.len()));
            }
            let mut counts = vec![0usize; rooms.len()];
            for u in &ups {
                counts[u.room as usize] += 1;
            }
            let max = *counts.iter().max().unwrap();
            match dist {
                // Zipf's top rank gets 1/H(4750) ≈ 11% of the updates.
                Dist::Zipf => assert!(max > 300, "zipf max {max}"),
                Dist::Uniform => assert!(max < 15, "uniform max {max}"),
            }
        }
    }

    #[test]
    fn filters_and_steps() {
        assert!(contains_ab_ignore_case("xxaBy"));
        assert!(contains_ab_ignore_case("AB"));
        assert!(!contains_ab_ignore_case("aéb"));
        let steps = load_more_steps();
        assert_eq!(steps.len(), 18);
        assert_eq!(steps[0], LimitStep { from: 20, to: 40 });
        assert_eq!(steps[8], LimitStep { from: 180, to: 200 });
        assert_eq!(steps[9], LimitStep { from: 200, to: 180 });
        assert_eq!(steps[17], LimitStep { from: 40, to: 20 });
        let offs = fan_out_offsets(950, 100);
        assert_eq!(offs[0], 0);
        assert_eq!(offs[46], 920);
        assert_eq!(offs[47], 0);
        assert!(offs.iter().all(|&o| o + WINDOW_LIMIT <= 950));
    }

    #[test]
    fn many_lists_shape() {
        let ml = generate_many_lists(100, 100, 50, 1);
        assert_eq!(ml.rooms.len(), 200);
        for c in 0..100 {
            let mut rs = ml.collection(c).to_vec();
            rs.sort_unstable();
            rs.dedup();
            assert_eq!(rs.len(), 100, "a collection holds distinct rooms");
        }
        for r in 0..200 {
            let ms = ml.memberships_of(r);
            assert_eq!(ms.len(), 50);
            for &(c, p) in ms {
                assert_eq!(ml.collection(c as usize)[p as usize] as usize, r);
            }
        }
    }
}
