//! The partitioning design of docs/SCALING.md ("Past one log"), checked by its
//! model (`ordo_bench::partition`): random writes from routers with stale tables,
//! slot moves between streams, pinned and gathered views, each step against a
//! one-map reference. `ORDO_PARTITION_SEEDS` runs more seeds.

use ordo_bench::partition::{busiest_stream_share, check, slot_of, Config, PartitionBy, Rules, SLOTS};

fn seeds() -> u64 {
    std::env::var("ORDO_PARTITION_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(8)
}

#[test]
fn every_write_lands_in_exactly_one_stream_through_moves() {
    for seed in 0..seeds() {
        for streams in [2, 3, 5] {
            let config = Config { streams, ..Config::default() };
            let stats =
                check(seed, config, Rules::default()).unwrap_or_else(|e| panic!("seed {seed}, {streams} streams: {e}"));
            // The schedule did exercise what it claims to.
            assert!(stats.moves > 0 && stats.writes_acked > 0, "seed {seed}: {stats:?}");
        }
    }
}

#[test]
fn stale_routers_are_refused_then_retried() {
    // Over all seeds, some writes hit a fenced slot and were retried: the fence
    // path is exercised, not only the happy path.
    let retried: u64 =
        (0..seeds()).map(|seed| check(seed, Config::default(), Rules::default()).unwrap().writes_moved_retried).sum();
    assert!(retried > 0);
}

#[test]
fn without_the_fence_check_a_moved_slot_loses_writes() {
    // The rule `fence_check` stands for is needed: without it, some seed breaks.
    let rules = Rules { fence_check: false, ..Rules::default() };
    let broken = (0..seeds()).filter(|&seed| check(seed, Config::default(), rules).is_err()).count();
    assert!(broken > 0, "no seed caught a write applied by a stream that no longer owns its slot");
}

#[test]
fn cross_partition_views_are_gathered_from_every_group_or_refused() {
    let rules = Rules { gather_all: false, ..Rules::default() };
    let broken = (0..seeds()).filter(|&seed| check(seed, Config::default(), rules).is_err()).count();
    assert!(broken > 0, "asking one group for a cross-partition view went unnoticed");
    // Refusing instead of gathering is always consistent (nothing is answered).
    let refuse = Config { gather: false, ..Config::default() };
    for seed in 0..seeds() {
        let stats = check(seed, refuse, Rules { gather_all: false, ..Rules::default() }).unwrap();
        assert_eq!(stats.views_gathered, 0);
        assert!(stats.views_refused > 0);
    }
}

#[test]
fn slots_are_stable_and_in_range() {
    // The hash is part of the placement: it must not change between builds.
    assert_eq!(slot_of("rooms", PartitionBy::Collection, "anyone"), slot_of("rooms", PartitionBy::Collection, "other"));
    assert_eq!(ordo_bench::partition::fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    for owner in 0..1000 {
        assert!(slot_of("memberships", PartitionBy::Owner, &format!("u{owner}")) < SLOTS);
    }
}

#[test]
fn owner_hashing_spreads_load() {
    // Uniform owners: the busiest of 4 streams takes close to a quarter.
    let share = busiest_stream_share(4, 10_000, 0.0);
    assert!(share < 0.30, "busiest of 4 streams takes {share}");
    // One stream takes everything.
    assert!((busiest_stream_share(1, 100, 1.0) - 1.0).abs() < 1e-9);
}
