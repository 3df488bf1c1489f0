//! A driver for profiling `shared-rooms` (one target update moving a room in
//! every member's list), without the peers in the profile.
//!
//! `cargo run --release -p ordo-bench --example shared_rooms_layouts_profile -- USERS ROOMS MESSAGES [fan-out]`
//! prints the median per message; under `perf record` the messages dominate
//! once MESSAGES is a few thousand.

use std::time::Duration;

use ordo_bench::harness::OpPlan;
use ordo_bench::shared_rooms::{generate, generate_messages, ordo_fan_out, ordo_refs};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, default: usize| args.get(i).map_or(default, |a| a.parse().expect("a number"));
    let (users, rooms, messages) = (arg(1, 2_000), arg(2, 1_000), arg(3, 2_000));
    let fan_out = args.get(4).is_some_and(|a| a == "fan-out");
    let data = generate(users, rooms, 1);
    let plan = OpPlan { warmup: 10, min_ops: messages, max_ops: messages, budget: Duration::from_secs(3_600) };
    let stream = generate_messages(&data, plan.inputs(), 1);
    let measured = if fan_out { ordo_fan_out(&data, &stream, &plan) } else { ordo_refs(&data, &stream, &plan) };
    println!("{:?}", measured.expect("runs"));
}
