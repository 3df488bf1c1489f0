//! The runner: for each scenario and N, generate (or reuse) the data, run
//! every system on it with the same [`OpPlan`], and hand the results to the
//! reporter as [`Group`]s.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::data::{
    fan_out_offsets, generate_many_lists, generate_rooms, generate_updates, load_more_steps, CreateView, Dist,
    ManyLists, Room, RoomFilter,
};
use crate::harness::{Measurement, OpPlan};
use crate::ordo_system;
use crate::peers::eyeball;
use crate::peers::naive::{self, Mode};
use crate::report::{Group, Outcome, Row};

/// Scenario names, in run order.
pub const SCENARIOS: [&str; 8] = [
    "create",
    "new-message",
    "load-more",
    "filter-switch",
    "fan-out",
    "many-lists",
    "shared-predicate",
    "shared-rooms",
];

/// System names, in report order.
pub const SYSTEMS: [&str; 4] = ["ordo", "eyeball", "naive", "naive-full"];

/// N of a full run.
pub const SIZES: [usize; 4] = [1_000, 10_000, 100_000, 1_000_000];
/// N of a `--quick` run.
pub const QUICK_SIZES: [usize; 2] = [1_000, 10_000];
/// Windows of `fan-out`.
pub const FAN_OUT_WINDOWS: usize = 10_000;
/// Collections of `many-lists` (full run).
pub const MANY_LISTS_COLLECTIONS: usize = 100_000;
/// Collections of `many-lists` (`--quick`).
pub const QUICK_MANY_LISTS_COLLECTIONS: usize = 1_000;
/// Rooms per collection in `many-lists`.
pub const ROOMS_PER_COLLECTION: usize = 100;
/// Collections each room is in (its members) in `many-lists`.
pub const MEMBERS_PER_ROOM: usize = 50;

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Small N, small budgets (CI).
    pub quick: bool,
    /// Scenarios to run (names from [`SCENARIOS`]).
    pub scenarios: Vec<&'static str>,
    /// Systems to run (names from [`SYSTEMS`]).
    pub systems: Vec<&'static str>,
    /// N to run; `None` for the default of the mode. (`many-lists` is sized
    /// in collections and ignores this.)
    pub sizes: Option<Vec<usize>>,
    /// Seed of the data set and update streams.
    pub seed: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config { quick: false, scenarios: SCENARIOS.to_vec(), systems: SYSTEMS.to_vec(), sizes: None, seed: 1 }
    }
}

impl Config {
    /// The N to run.
    pub fn sizes(&self) -> Vec<usize> {
        match &self.sizes {
            Some(s) => s.clone(),
            None if self.quick => QUICK_SIZES.to_vec(),
            None => SIZES.to_vec(),
        }
    }

    /// Collections of `many-lists`.
    pub fn many_lists_collections(&self) -> usize {
        if self.quick {
            QUICK_MANY_LISTS_COLLECTIONS
        } else {
            MANY_LISTS_COLLECTIONS
        }
    }
}

/// The operation plan of a scenario. Every system of a (scenario, N) gets
/// the same plan; the time budget is per system.
pub fn plan(scenario: &str, quick: bool) -> OpPlan {
    // (warm-up, min ops, max ops, budget in ms)
    let (warmup, min_ops, max_ops, budget_ms) = match scenario {
        "create" => (2, 3, 50, 1_000),
        "new-message" => (50, 10, 5_000, 1_000),
        "load-more" => (18, 36, 18 * 100, 800),
        "filter-switch" => (4, 4, 200, 1_500),
        "fan-out" => (3, 5, 1_000, 1_500),
        "many-lists" => (20, 20, 5_000, 1_000),
        "shared-predicate" => (200, 20, 20_000, 1_000),
        other => panic!("unknown scenario {other}"),
    };
    if quick {
        OpPlan {
            warmup: warmup.min(10),
            // fan-out: eyeball's 10 000 pipelines take ~2 s per update.
            min_ops: if scenario == "fan-out" { 2 } else { min_ops.min(18) },
            max_ops: max_ops / 5,
            budget: Duration::from_millis(budget_ms / 12),
        }
    } else {
        OpPlan { warmup, min_ops, max_ops, budget: Duration::from_millis(budget_ms) }
    }
}

fn progress(msg: &str) {
    eprintln!("{msg}");
}

/// Runs the configured scenarios; `emit` receives each finished group.
#[derive(Debug)]
pub struct Runner {
    cfg: Config,
    rooms: BTreeMap<usize, Vec<Room>>,
}

impl Runner {
    /// A runner for `cfg`.
    pub fn new(cfg: Config) -> Self {
        Runner { cfg, rooms: BTreeMap::new() }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    fn ensure_rooms(&mut self, n: usize) {
        if !self.rooms.contains_key(&n) {
            let t = Instant::now();
            if n >= 100_000 {
                progress(&format!("building {n} rooms…"));
            }
            let rooms = generate_rooms(n, self.cfg.seed);
            if n >= 100_000 {
                progress(&format!("  built in {:.1} s", t.elapsed().as_secs_f64()));
            }
            self.rooms.insert(n, rooms);
        }
    }

    fn rows(&self, what: &str, mut run: impl FnMut(&'static str) -> Result<Option<Measurement>, String>) -> Vec<Row> {
        self.cfg
            .systems
            .iter()
            .map(|&system| {
                let t = Instant::now();
                let outcome = match run(system) {
                    Ok(Some(m)) => Outcome::Measured(m),
                    Ok(None) if system == "ordo" => Outcome::NotMeasured("not measured".into()),
                    Ok(None) => Outcome::NotMeasured("n/a".into()),
                    Err(why) => Outcome::NotMeasured(why),
                };
                let secs = t.elapsed().as_secs_f64();
                if secs > 2.0 {
                    progress(&format!("  {what} {system}: {secs:.1} s"));
                }
                Row { system, outcome }
            })
            .collect()
    }

    /// Runs one scenario for every configured N, emitting groups as they
    /// finish.
    pub fn run_scenario(&mut self, scenario: &'static str, emit: &mut dyn FnMut(Group)) {
        if scenario == "many-lists" {
            self.many_lists(emit);
            return;
        }
        if scenario == "shared-rooms" {
            // Its own data and systems: `ordo` (references), `ordo-fan-out` (with
            // `--system ordo`) and `eyeball`.
            let systems: Vec<&'static str> = crate::shared_rooms::SYSTEMS
                .iter()
                .copied()
                .filter(|system| self.cfg.systems.contains(&if *system == "eyeball" { "eyeball" } else { "ordo" }))
                .collect();
            crate::shared_rooms::run(self.cfg.quick, &systems, self.cfg.seed, emit);
            return;
        }
        if scenario == "shared-predicate" {
            // Its own data (items with owners), not the rooms.
            for n in self.cfg.sizes() {
                progress(&format!("[{scenario}] n={n}"));
                self.shared_predicate(n, emit);
            }
            return;
        }
        for n in self.cfg.sizes() {
            self.ensure_rooms(n);
            progress(&format!("[{scenario}] n={n}"));
            match scenario {
                "create" => self.create(n, emit),
                "new-message" => self.new_message(n, emit),
                "load-more" => self.load_more(n, emit),
                "filter-switch" => self.filter_switch(n, emit),
                "fan-out" => self.fan_out(n, emit),
                other => panic!("unknown scenario {other}"),
            }
        }
    }

    fn create(&self, n: usize, emit: &mut dyn FnMut(Group)) {
        let rooms = &self.rooms[&n];
        let plan = plan("create", self.cfg.quick);
        for view in [CreateView::Window, CreateView::Full] {
            let rows = self.rows(&format!("create n={n} {}", view.label()), |sys| {
                Ok(match sys {
                    "ordo" => ordo_system::create(rooms, view, &plan),
                    "eyeball" => eyeball::create(rooms, view, &plan),
                    "naive" => {
                        if view == CreateView::Full {
                            return Err("n/a (top-k only)".into());
                        }
                        naive::create(rooms, view, &plan, Mode::TopK)
                    }
                    _ => naive::create(rooms, view, &plan, Mode::FullSort),
                })
            });
            emit(Group { scenario: "create", n, dist: view.label().into(), rows });
        }
    }

    fn new_message(&self, n: usize, emit: &mut dyn FnMut(Group)) {
        let rooms = &self.rooms[&n];
        let plan = plan("new-message", self.cfg.quick);
        for dist in [Dist::Uniform, Dist::Zipf] {
            let updates = generate_updates(rooms, plan.inputs(), dist, self.cfg.seed);
            let rows = self.rows(&format!("new-message n={n} {}", dist.label()), |sys| {
                Ok(match sys {
                    "ordo" => ordo_system::new_message(rooms, &updates, &plan),
                    "eyeball" => eyeball::new_message(rooms, &updates, &plan),
                    "naive" => naive::new_message(rooms, &updates, &plan, Mode::TopK),
                    _ => naive::new_message(rooms, &updates, &plan, Mode::FullSort),
                })
            });
            emit(Group { scenario: "new-message", n, dist: dist.label().into(), rows });
        }
    }

    /// Turns per-system vectors (one measurement per kind) into one group
    /// per kind.
    fn emit_kinds(
        &self,
        scenario: &'static str,
        n: usize,
        labels: &[String],
        per_system: Vec<(&'static str, Option<Vec<Measurement>>)>,
        emit: &mut dyn FnMut(Group),
    ) {
        for (k, label) in labels.iter().enumerate() {
            let rows = per_system
                .iter()
                .map(|(system, res)| Row {
                    system,
                    outcome: match res {
                        Some(v) => Outcome::Measured(v[k].clone()),
                        None if *system == "ordo" => Outcome::NotMeasured("not measured".into()),
                        None => Outcome::NotMeasured("n/a".into()),
                    },
                })
                .collect();
            emit(Group { scenario, n, dist: label.clone(), rows });
        }
    }

    fn load_more(&self, n: usize, emit: &mut dyn FnMut(Group)) {
        let rooms = &self.rooms[&n];
        let plan = plan("load-more", self.cfg.quick);
        let steps = load_more_steps();
        let per_system = self
            .cfg
            .systems
            .iter()
            .map(|&sys| {
                let v = match sys {
                    "ordo" => ordo_system::load_more(rooms, &steps, &plan),
                    "eyeball" => eyeball::load_more(rooms, &steps, &plan),
                    "naive" => naive::load_more(rooms, &steps, &plan, Mode::TopK),
                    _ => naive::load_more(rooms, &steps, &plan, Mode::FullSort),
                };
                (sys, v)
            })
            .collect();
        let labels: Vec<String> = steps.iter().map(|s| s.label()).collect();
        self.emit_kinds("load-more", n, &labels, per_system, emit);
    }

    fn filter_switch(&self, n: usize, emit: &mut dyn FnMut(Group)) {
        let rooms = &self.rooms[&n];
        let plan = plan("filter-switch", self.cfg.quick);
        let filters = RoomFilter::ALL;
        let per_system = self
            .cfg
            .systems
            .iter()
            .map(|&sys| {
                let t = Instant::now();
                let v = match sys {
                    "ordo" => ordo_system::filter_switch(rooms, &filters, &plan),
                    "eyeball" => eyeball::filter_switch(rooms, &filters, &plan),
                    "naive" => naive::filter_switch(rooms, &filters, &plan, Mode::TopK),
                    _ => naive::filter_switch(rooms, &filters, &plan, Mode::FullSort),
                };
                let secs = t.elapsed().as_secs_f64();
                if secs > 2.0 {
                    progress(&format!("  filter-switch n={n} {sys}: {secs:.1} s"));
                }
                (sys, v)
            })
            .collect();
        let labels: Vec<String> = (0..filters.len())
            .map(|k| format!("{}->{}", filters[k].label(), filters[(k + 1) % filters.len()].label()))
            .collect();
        self.emit_kinds("filter-switch", n, &labels, per_system, emit);
    }

    fn fan_out(&self, n: usize, emit: &mut dyn FnMut(Group)) {
        let rooms = &self.rooms[&n];
        let plan = plan("fan-out", self.cfg.quick);
        let updates = generate_updates(rooms, plan.inputs(), Dist::Uniform, self.cfg.seed);
        let visible = rooms.iter().filter(|r| !r.left).count();
        let offsets = fan_out_offsets(visible, FAN_OUT_WINDOWS);
        let rows = self.rows(&format!("fan-out n={n}"), |sys| {
            Ok(match sys {
                "ordo" => ordo_system::fan_out(rooms, &updates, &offsets, &plan),
                "eyeball" => {
                    if let Some(why) = eyeball::limit_reason("fan-out", n) {
                        return Err(why);
                    }
                    eyeball::fan_out(rooms, &updates, &offsets, &plan)
                }
                "naive" => naive::fan_out(rooms, &updates, &offsets, &plan, Mode::TopK),
                _ => naive::fan_out(rooms, &updates, &offsets, &plan, Mode::FullSort),
            })
        });
        emit(Group { scenario: "fan-out", n, dist: Dist::Uniform.label().into(), rows });
    }

    /// Ordo against itself with view keying switched off (`ordo-unkeyed`): the
    /// peers have no row predicates to compare with.
    fn shared_predicate(&self, n: usize, emit: &mut dyn FnMut(Group)) {
        if !self.cfg.systems.contains(&"ordo") {
            return;
        }
        let plan = plan("shared-predicate", self.cfg.quick);
        let mut rng = crate::data::Rng::derived(self.cfg.seed, "shared-predicate-updates");
        let updates: Vec<(u32, u64)> =
            (0..plan.inputs()).map(|i| (rng.below(n as u64) as u32, 1_000_000_000_000 + i as u64)).collect();
        let mut per_system = Vec::new();
        for (system, is_keyed) in [("ordo", true), ("ordo-unkeyed", false)] {
            let t = Instant::now();
            let result = ordo_system::shared_predicate(n, &updates, &plan, self.cfg.seed, is_keyed);
            progress(&format!("  shared-predicate n={n} {system}: {:.1} s", t.elapsed().as_secs_f64()));
            per_system.push((system, result.map(Vec::from)));
        }
        let labels = ["create-view".to_owned(), "update".to_owned()];
        self.emit_kinds("shared-predicate", n, &labels, per_system, emit);
    }

    fn many_lists(&self, emit: &mut dyn FnMut(Group)) {
        let c = self.cfg.many_lists_collections();
        progress(&format!("[many-lists] building {c} collections × {ROOMS_PER_COLLECTION} rooms…"));
        let data: ManyLists = generate_many_lists(c, ROOMS_PER_COLLECTION, MEMBERS_PER_ROOM, self.cfg.seed);
        let plan = plan("many-lists", self.cfg.quick);
        let updates = generate_updates(&data.rooms, plan.inputs(), Dist::Uniform, self.cfg.seed);
        let rows = self.rows(&format!("many-lists n={c}"), |sys| {
            Ok(match sys {
                "ordo" => ordo_system::many_lists(&data, &updates, &plan),
                "eyeball" => eyeball::many_lists(&data, &updates, &plan),
                "naive" => naive::many_lists(&data, &updates, &plan, Mode::TopK),
                _ => naive::many_lists(&data, &updates, &plan, Mode::FullSort),
            })
        });
        emit(Group { scenario: "many-lists", n: c, dist: Dist::Uniform.label().into(), rows });
    }
}
