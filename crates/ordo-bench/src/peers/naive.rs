//! The naive peers: a plain `Vec` of room structs with the sort keys stored
//! inline, updated in place by index, and the window recomputed from scratch
//! after every change. They produce no diffs.
//!
//! - [`Mode::TopK`] (`naive`): `select_nth_unstable_by` for the first `k`
//!   rooms of the order, then `sort_unstable_by` of those `k`.
//! - [`Mode::FullSort`] (`naive-full`): `sort_unstable_by` of all the
//!   filtered rooms.
//!
//! The view keeps `order`, a `Vec<u32>` of the indices of the rooms that pass
//! the filter; it is permuted in place by each recomputation (never
//! reallocated) and the window is copied out of its first `k` entries. The
//! comparator is the full one of the room-list view: `is_local` desc,
//! `recency` desc, `name` asc, `id` asc.

use std::cmp::Ordering;

use crate::data::{CreateView, LimitStep, ManyLists, Room, RoomFilter, Update, WINDOW_LIMIT};
use crate::harness::{time_ops, Measurement, MemProbe, OpPlan};

/// Which naive peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `naive`: select the top k, then sort them.
    TopK,
    /// `naive-full`: sort everything that passes the filter.
    FullSort,
}

/// A room as the naive peers store it: every field inline.
#[derive(Debug, Clone)]
pub struct NaiveRoom {
    /// Room id.
    pub id: String,
    /// Room name.
    pub name: String,
    /// Recency (sort key).
    pub recency: u64,
    /// Unread count.
    pub unread: u32,
    /// Local room (sort key).
    pub is_local: bool,
    /// Left room.
    pub left: bool,
    /// Direct message.
    pub is_dm: bool,
    /// Favourite.
    pub favourite: bool,
    /// Latest message preview.
    pub payload: Vec<u8>,
}

impl NaiveRoom {
    /// A copy of `r`.
    pub fn from_room(r: &Room) -> Self {
        NaiveRoom {
            id: r.id.clone(),
            name: r.name.clone(),
            recency: r.recency,
            unread: r.unread,
            is_local: r.is_local,
            left: r.left,
            is_dm: r.is_dm,
            favourite: r.favourite,
            payload: r.payload.clone(),
        }
    }

    /// Applies a new-message update in place (copies the preview into the
    /// existing buffer).
    #[inline]
    pub fn apply(&mut self, u: &Update) {
        self.recency = u.recency;
        self.payload.clear();
        self.payload.extend_from_slice(&u.payload);
    }

    #[inline]
    fn passes(&self, f: RoomFilter) -> bool {
        f.matches_fields(self.left, self.unread, self.is_dm, &self.name)
    }
}

/// The room-list comparator, with the `id` tie-breaker.
#[inline]
pub fn cmp(a: &NaiveRoom, b: &NaiveRoom) -> Ordering {
    b.is_local
        .cmp(&a.is_local)
        .then_with(|| b.recency.cmp(&a.recency))
        .then_with(|| a.name.cmp(&b.name))
        .then_with(|| a.id.cmp(&b.id))
}

/// A view over a `[NaiveRoom]`: filter, order, limit and the current window.
#[derive(Debug, Clone)]
pub struct NaiveView {
    mode: Mode,
    filter: RoomFilter,
    limit: usize,
    /// Indices of the rooms that pass the filter; its first `limit` entries
    /// are sorted after [`NaiveView::refresh`].
    pub order: Vec<u32>,
    /// The current window (room indices).
    pub window: Vec<u32>,
}

impl NaiveView {
    /// Opens a view: filters, recomputes, fills the window.
    pub fn open(rooms: &[NaiveRoom], filter: RoomFilter, limit: usize, mode: Mode) -> Self {
        let mut v =
            NaiveView { mode, filter, limit, order: Vec::new(), window: Vec::with_capacity(limit.min(rooms.len())) };
        v.set_filter(rooms, filter);
        v
    }

    /// Re-filters (reusing the `order` buffer) and recomputes.
    pub fn set_filter(&mut self, rooms: &[NaiveRoom], filter: RoomFilter) {
        self.filter = filter;
        self.order.clear();
        self.order.extend(rooms.iter().enumerate().filter(|(_, r)| r.passes(filter)).map(|(i, _)| i as u32));
        self.refresh(rooms);
    }

    /// Changes the limit and recomputes.
    pub fn set_limit(&mut self, rooms: &[NaiveRoom], limit: usize) {
        self.limit = limit;
        self.refresh(rooms);
    }

    /// Recomputes the order's sorted prefix and copies the window out of it.
    pub fn refresh(&mut self, rooms: &[NaiveRoom]) {
        let k = sort_prefix(&mut self.order, rooms, self.limit, self.mode);
        self.window.clear();
        self.window.extend_from_slice(&self.order[..k]);
    }
}

/// Makes `order[..k]` the first `k` rooms in view order (all of them in
/// `FullSort` mode) and returns `k` (capped at `order.len()`).
pub fn sort_prefix(order: &mut [u32], rooms: &[NaiveRoom], k: usize, mode: Mode) -> usize {
    let by = |a: &u32, b: &u32| cmp(&rooms[*a as usize], &rooms[*b as usize]);
    let k = k.min(order.len());
    match mode {
        Mode::FullSort => order.sort_unstable_by(by),
        Mode::TopK => {
            if k == 0 {
            } else if k < order.len() {
                order.select_nth_unstable_by(k - 1, by);
                order[..k].sort_unstable_by(by);
            } else {
                order.sort_unstable_by(by);
            }
        }
    }
    k
}

/// Copies of `rooms` as the naive peers store them.
pub fn build_rooms(rooms: &[Room]) -> Vec<NaiveRoom> {
    rooms.iter().map(NaiveRoom::from_room).collect()
}

/// `create`: time to filter and compute the first window (`Window`) or the
/// whole sorted view (`Full`, `naive-full` only).
pub fn create(rooms: &[Room], view: CreateView, plan: &OpPlan, mode: Mode) -> Option<Measurement> {
    let limit = match (view, mode) {
        (CreateView::Window, _) => WINDOW_LIMIT,
        (CreateView::Full, Mode::FullSort) => usize::MAX,
        (CreateView::Full, Mode::TopK) => return None,
    };
    let nrooms = build_rooms(rooms);
    let s = time_ops(plan, |_| {
        let v = NaiveView::open(&nrooms, RoomFilter::NotLeft, limit, mode);
        (0, v)
    });
    Some(s.measurement(false))
}

/// `new-message`: apply the update in place, recompute the window.
pub fn new_message(rooms: &[Room], updates: &[Update], plan: &OpPlan, mode: Mode) -> Option<Measurement> {
    let mut nrooms = build_rooms(rooms);
    let mut view = NaiveView::open(&nrooms, RoomFilter::NotLeft, WINDOW_LIMIT, mode);
    let s = time_ops(plan, |i| {
        let u = &updates[i];
        nrooms[u.room as usize].apply(u);
        view.refresh(&nrooms);
        (0, ())
    });
    Some(s.measurement(false))
}

/// `load-more`: change the limit, recompute the window; one measurement per
/// step.
pub fn load_more(rooms: &[Room], steps: &[LimitStep], plan: &OpPlan, mode: Mode) -> Option<Vec<Measurement>> {
    let nrooms = build_rooms(rooms);
    let mut view = NaiveView::open(&nrooms, RoomFilter::NotLeft, steps[0].from, mode);
    let s = time_ops(plan, |i| {
        view.set_limit(&nrooms, steps[i % steps.len()].to);
        (0, ())
    });
    Some(s.grouped(steps.len(), false))
}

/// `filter-switch`: operation `i` switches to `filters[(i + 1) % len]`;
/// one measurement per target filter, in the order of `filters` shifted by
/// one (result `k` is the switch to `filters[(k + 1) % len]`).
pub fn filter_switch(rooms: &[Room], filters: &[RoomFilter], plan: &OpPlan, mode: Mode) -> Option<Vec<Measurement>> {
    let nrooms = build_rooms(rooms);
    let mut view = NaiveView::open(&nrooms, filters[0], WINDOW_LIMIT, mode);
    let s = time_ops(plan, |i| {
        view.set_filter(&nrooms, filters[(i + 1) % filters.len()]);
        (0, ())
    });
    Some(s.grouped(filters.len(), false))
}

/// `fan-out`: apply the update, recompute the sorted prefix that covers the
/// furthest window, copy every window out of it.
pub fn fan_out(
    rooms: &[Room],
    updates: &[Update],
    offsets: &[usize],
    plan: &OpPlan,
    mode: Mode,
) -> Option<Measurement> {
    let mut nrooms = build_rooms(rooms);
    let end = offsets.iter().max().copied().unwrap_or(0) + WINDOW_LIMIT;
    let mut view = NaiveView::open(&nrooms, RoomFilter::NotLeft, end, mode);
    let mut windows: Vec<Vec<u32>> = offsets.iter().map(|_| Vec::with_capacity(WINDOW_LIMIT)).collect();
    let s = time_ops(plan, |i| {
        let u = &updates[i];
        nrooms[u.room as usize].apply(u);
        view.refresh(&nrooms);
        let sorted = &view.window;
        for (w, &off) in windows.iter_mut().zip(offsets) {
            w.clear();
            let lo = off.min(sorted.len());
            let hi = (off + WINDOW_LIMIT).min(sorted.len());
            w.extend_from_slice(&sorted[lo..hi]);
        }
        (0, ())
    });
    Some(s.measurement(false))
}

/// `many-lists`: each collection is its own `Vec<NaiveRoom>` plus view; an
/// update is applied to every collection holding the room and each of those
/// windows is recomputed. Memory per collection is measured while building.
pub fn many_lists(data: &ManyLists, updates: &[Update], plan: &OpPlan, mode: Mode) -> Option<Measurement> {
    let probe = MemProbe::start();
    let mut lists: Vec<(Vec<NaiveRoom>, NaiveView)> = (0..data.collections)
        .map(|c| {
            let rooms: Vec<NaiveRoom> =
                data.collection(c).iter().map(|&r| NaiveRoom::from_room(&data.rooms[r as usize])).collect();
            let view = NaiveView::open(&rooms, RoomFilter::NotLeft, WINDOW_LIMIT, mode);
            (rooms, view)
        })
        .collect();
    let mem = probe.per_unit(data.collections);
    let s = time_ops(plan, |i| {
        let u = &updates[i];
        for &(c, p) in data.memberships_of(u.room as usize) {
            let (rooms, view) = &mut lists[c as usize];
            rooms[p as usize].apply(u);
            view.refresh(rooms);
        }
        (0, ())
    });
    Some(mem.attach(s.measurement(false)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{cmp_rooms, generate_rooms, generate_updates, Dist};

    /// Brute force: apply all updates to a copy, full sort with the reference
    /// comparator, take `k`.
    fn brute_top(rooms: &[Room], updates: &[Update], f: RoomFilter, k: usize) -> Vec<String> {
        let mut rooms = rooms.to_vec();
        for u in updates {
            rooms[u.room as usize].recency = u.recency;
        }
        let mut v: Vec<&Room> = rooms.iter().filter(|r| f.matches(r)).collect();
        v.sort_by(|a, b| cmp_rooms(a, b));
        v.iter().take(k).map(|r| r.id.clone()).collect()
    }

    fn ids(rooms: &[NaiveRoom], w: &[u32]) -> Vec<String> {
        w.iter().map(|&i| rooms[i as usize].id.clone()).collect()
    }

    #[test]
    fn naive_peers_match_brute_force() {
        let rooms = generate_rooms(3000, 11);
        for dist in [Dist::Uniform, Dist::Zipf] {
            let updates = generate_updates(&rooms, 500, dist, 11);
            for mode in [Mode::TopK, Mode::FullSort] {
                let mut nrooms = build_rooms(&rooms);
                let mut view = NaiveView::open(&nrooms, RoomFilter::NotLeft, 20, mode);
                assert_eq!(ids(&nrooms, &view.window), brute_top(&rooms, &[], RoomFilter::NotLeft, 20));
                for (k, u) in updates.iter().enumerate() {
                    nrooms[u.room as usize].apply(u);
                    view.refresh(&nrooms);
                    if k % 97 == 0 {
                        assert_eq!(
                            ids(&nrooms, &view.window),
                            brute_top(&rooms, &updates[..=k], RoomFilter::NotLeft, 20)
                        );
                    }
                }
                // Other filters and a big limit, where recency-0 ties need the
                // name/id tie-breakers.
                for f in RoomFilter::ALL {
                    view.set_filter(&nrooms, f);
                    view.set_limit(&nrooms, 2500);
                    assert_eq!(ids(&nrooms, &view.window), brute_top(&rooms, &updates, f, 2500));
                }
            }
        }
    }
}
