//! `flagship`: the chat's room lists over shared rooms, through the server with
//! authenticated subscribers, in the flagship's layout (`rooms` + `members`, one
//! write per message) and in the fan-out layout (a copy per member, one write
//! per member) of the same chat, one after the other in the same run.

use std::path::Path;
use std::sync::atomic::Ordering;

use hyper::Method;

use ordo_bench::live::chat::{chat_collection, chat_losses, chat_user, ChatLosses};
use ordo_bench::live::flagship::{
    flagship_marks, load_fan_out_layout, load_rooms_layout, membership_id, rooms_layout_losses, FlagshipChat,
    FlagshipLayout, FlagshipUpdates, FAN_OUT_FIELDS, ROOMS_FIELDS,
};
use ordo_bench::live::http::{fetch_metrics, metric, HttpPool};
use ordo_bench::live::phase::LiveResult;
use ordo_bench::live::stats::Clock;
use ordo_bench::live::subscriber::{SubscriberAuth, SubscriberSpec};
use ordo_bench::live::verify::verify_filtered_lists;
use ordo_bench::live::Result;
use ordo_server::auth::Role;

use crate::auth::{expect_forbidden, expect_no_rows, CHAT_RULES, FLAGSHIP_RULES};
use crate::options::Options;
use crate::report::count_failures;
use crate::runner::{run_scenario, RunFigures, Scenario};
use crate::server::Target;

/// Printed with the figures: the flagship benchmark's goals (`SCENARIOS.md`).
const FLAGSHIP_GOAL: &str =
    "goals: the rooms layout's highest rate at p99 ≤ 50 ms ≥ 5× fan-out's; 0 lost; 0 lists different from a query";

/// One layout of the flagship chat.
pub struct Flagship {
    layout: FlagshipLayout,
    chat: FlagshipChat,
    n_users: usize,
    window_limit: usize,
    rate: f64,
    seed: u64,
}

impl Flagship {
    pub fn new(options: &Options, layout: FlagshipLayout) -> Flagship {
        let chat = FlagshipChat::generate(
            options.flagship_users,
            options.flagship_rooms,
            options.flagship_rooms_per_user,
            options.seed,
        );
        Flagship {
            layout,
            chat,
            n_users: options.flagship_users,
            window_limit: options.window_limit,
            rate: options.flagship_rate,
            seed: options.seed,
        }
    }

    fn rooms(&self) -> bool {
        self.layout == FlagshipLayout::Rooms
    }

    /// Subscriber `index`'s view, as admin checks it: collection and filter.
    fn view_of(&self, index: usize) -> (String, Option<String>) {
        if self.rooms() {
            ("members".to_string(), Some(format!(r#"{{"field":"owner","op":"eq","value":"{}"}}"#, chat_user(index))))
        } else {
            (chat_collection(index), None)
        }
    }
}

impl Scenario for Flagship {
    type Updates = FlagshipUpdates;

    fn name(&self) -> &'static str {
        if self.rooms() {
            "flagship-rooms"
        } else {
            "flagship-fan-out"
        }
    }

    fn header(&self, options: &Options) -> String {
        let largest = self.chat.members_of_room.iter().map(Vec::len).max().unwrap_or(0);
        format!(
            "== flagship, {} layout: {} users × {} of {} rooms (Zipf sizes, largest {largest} members, {} memberships); each user's subscriber on its top {} by the rooms' activity; {:.0} messages/s to Zipf-chosen rooms, a read mark per ten, for {:.1} s ==",
            if self.rooms() { "rooms" } else { "fan-out" },
            self.n_users,
            options.flagship_rooms_per_user,
            self.chat.n_rooms,
            self.chat.n_memberships(),
            self.window_limit,
            self.rate,
            options.seconds
        )
    }

    fn rate(&self, _options: &Options) -> f64 {
        self.rate
    }

    fn n_subscribers(&self) -> usize {
        self.n_users
    }

    fn n_collections(&self) -> usize {
        if self.rooms() {
            self.chat.n_rooms
        } else {
            self.n_users
        }
    }

    fn rules(&self) -> &'static str {
        if self.rooms() {
            FLAGSHIP_RULES
        } else {
            CHAT_RULES
        }
    }

    fn auth_note(&self) -> String {
        format!(
            "{} subscribers, each with its own reader token (sub = its user id) sent as an `auth` message; messages and read marks with a writer token (the app's backend)",
            self.n_users
        )
    }

    async fn load(&mut self, pool: &mut HttpPool) -> Result<()> {
        if self.rooms() {
            load_rooms_layout(pool, &self.chat).await
        } else {
            load_fan_out_layout(pool, &self.chat).await
        }
    }

    async fn check_rules(&self, pool: &mut HttpPool, target: &Target) -> Result<()> {
        if self.n_users < 2 {
            return Ok(());
        }
        let reader = target.token(&chat_user(0), Role::Reader);
        if !self.rooms() {
            let path = format!("/v1/collections/{}/query", chat_collection(1));
            let what = format!("reader `{}` querying {}", chat_user(0), chat_collection(1));
            return expect_forbidden(pool, reader, &what, &path, r#"{"limit":1}"#).await;
        }
        let what = format!("reader `{}` querying `rooms` directly", chat_user(0));
        expect_forbidden(pool, reader.clone(), &what, "/v1/collections/rooms/query", r#"{"limit":1}"#).await?;
        let other = self.view_of(1).1.expect("a filter");
        let what = format!("reader `{}` asking `members` for the memberships of `{}`", chat_user(0), chat_user(1));
        let query = format!(r#"{{"filter":{other},"limit":1}}"#);
        expect_no_rows(pool, reader.clone(), &what, "/v1/collections/members/query", &query).await?;
        let room = self.chat.rooms_of_user[1][0] as usize;
        let what = format!("reader `{}` marking `{}` read", chat_user(0), membership_id(1, room));
        let mark =
            format!(r#"{{"ops":[{{"op":"upsert","id":"{}","set_max":{{"read_upto":1}}}}]}}"#, membership_id(1, room));
        expect_forbidden(pool, reader, &what, "/v1/collections/members/batch", &mark).await
    }

    fn subscriber(&self, index: usize, target: &Target, max_update_number: u64) -> SubscriberSpec {
        let (collection, _) = self.view_of(index);
        SubscriberSpec {
            authority: target.authority.clone(),
            collection,
            // The rules' row predicate picks the user's memberships: no filter of its own.
            filter: None,
            fields: Some(if self.rooms() { ROOMS_FIELDS } else { FAN_OUT_FIELDS }),
            sort_field: if self.rooms() { "room.recency" } else { "recency" },
            window_limit: self.window_limit,
            marks: flagship_marks(self.layout),
            max_update_number,
            auth: target
                .token(&chat_user(index), Role::Reader)
                .map(|token| SubscriberAuth { sub: chat_user(index), token }),
        }
    }

    fn updates(&mut self) -> FlagshipUpdates {
        FlagshipUpdates::new(self.layout, &self.chat, self.seed)
    }

    /// Checked as admin, the owner filter spelled out: an independent reference
    /// for the view the rules' predicate built.
    async fn verify(&self, pool: &mut HttpPool, live: &LiveResult) -> Result<(usize, Option<String>)> {
        let (sort, fields) = if self.rooms() { ("room.recency", ROOMS_FIELDS) } else { ("recency", FAN_OUT_FIELDS) };
        verify_filtered_lists(pool, &live.outcomes, |index| self.view_of(index), sort, self.window_limit, Some(fields))
            .await
    }

    fn report_deliveries(&self, live: &LiveResult, updates: &FlagshipUpdates) {
        let ChatLosses {
            lost,
            extra,
            reset_collections,
            written_in_reset_collections,
            missing_in_reset_collections,
            resets,
        } = if self.rooms() {
            rooms_layout_losses(&live.outcomes, &live.stats, &self.chat)
        } else {
            chat_losses(&live.outcomes, &live.stats)
        };
        count_failures(lost);
        let acked = live.stats.acked.load(Ordering::Relaxed);
        let writes_per_message = if updates.n_messages == 0 { 0.0 } else { acked as f64 / updates.n_messages as f64 };
        println!(
            "  messages: {} written ({writes_per_message:.1} item writes acknowledged per message)",
            updates.n_messages
        );
        println!(
            "  losses: {lost} member deliveries of acknowledged messages never received (over subscribers without a reset){}",
            if extra > 0 { format!("; {extra} received but never acknowledged") } else { String::new() },
        );
        println!(
            "  announced resets: {resets} in {reset_collections} subscriptions ({written_in_reset_collections} deliveries due there, {missing_in_reset_collections} of them never received)"
        );
    }

    fn metric_names(&self) -> &'static [&'static str] {
        &["ordo_frames_encoded_total", "ordo_frames_sent_total", "ordo_resets_slow_total", "ordo_batches_total"]
    }

    fn goal(&self) -> Option<&'static str> {
        Some(FLAGSHIP_GOAL)
    }

    /// What a message to the largest room costs in log bytes: a few messages
    /// to it alone, the server's log counter read around them.
    async fn probe(&mut self, pool: &mut HttpPool, updates: &mut FlagshipUpdates) -> Result<()> {
        let Some(room) = (0..self.chat.n_rooms).max_by_key(|&room| self.chat.members_of_room[room].len()) else {
            return Ok(());
        };
        let before = fetch_metrics(pool).await;
        for _ in 0..LOG_PROBE_MESSAGES {
            let request = updates.message_to(room);
            let reply = pool.request(Method::POST, request.path, request.body).await?;
            if reply.status != 200 {
                return Err(
                    format!("a message to the largest room was answered {}: {}", reply.status, reply.text()).into()
                );
            }
        }
        let after = fetch_metrics(pool).await;
        match (metric(&before, LOG_BYTES_METRIC), metric(&after, LOG_BYTES_METRIC)) {
            (Some(before), Some(after)) => println!(
                "  log bytes per message to the largest room ({} members): {:.0} (over {LOG_PROBE_MESSAGES} messages)",
                self.chat.members_of_room[room].len(),
                (after - before) / LOG_PROBE_MESSAGES as f64
            ),
            _ => println!("  log bytes per message: the server's metrics do not say ({LOG_BYTES_METRIC})"),
        }
        Ok(())
    }
}

/// Messages the log probe sends to the largest room.
const LOG_PROBE_MESSAGES: usize = 20;
const LOG_BYTES_METRIC: &str = "ordo_log_bytes_total";

/// The latency bound of the search: end-to-end p99 over every member's frame.
const SEARCH_P99_BOUND_US: u64 = 50_000;
/// A run keeps up when it sends at least this share of the rate aimed at.
const SEARCH_KEPT_UP: f64 = 0.95;

/// `--flagship-rates`: each layout at each rate in turn, a fresh server each,
/// while it keeps up (sends its rate, loses nothing); then, per layout, the
/// highest rate held within the latency bound and the highest it kept up
/// with at all, and the ratios of the two layouts' (the goal is ≥ 5×).
pub async fn search_rates(
    options: &Options,
    server_binary: Option<&Path>,
    subscriber_runtime: &tokio::runtime::Handle,
    clock: Clock,
) -> Result<()> {
    let mut searches = Vec::new();
    for layout in [FlagshipLayout::Rooms, FlagshipLayout::FanOut] {
        let mut search = LayoutSearch::default();
        for &rate in &options.flagship_rates {
            let mut flagship = Flagship::new(options, layout);
            flagship.rate = rate;
            let figures = run_scenario(&mut flagship, options, server_binary, subscriber_runtime, clock).await?;
            let verdict = search.record(rate, &figures);
            println!("  rate search, {}: {rate:.0} messages/s: {verdict}\n", flagship.name());
            if search.stopped {
                break;
            }
        }
        searches.push(search);
    }
    print_search(&searches, options.flagship_rates.last().copied().unwrap_or(0.0));
    Ok(())
}

/// One layout's search so far.
#[derive(Default)]
struct LayoutSearch {
    /// The highest rate kept up with within the p99 bound, and its p99 (µs).
    within_bound: Option<(f64, u64)>,
    /// The highest rate kept up with at all, and its p99 (µs).
    kept_up: Option<(f64, u64)>,
    /// A rate was not kept up with: higher ones are not tried.
    stopped: bool,
}

impl LayoutSearch {
    /// Records a run at `rate`; says what it showed.
    fn record(&mut self, rate: f64, figures: &RunFigures) -> String {
        if figures.failures > 0 {
            self.stopped = true;
            return format!("{} correctness failures: the search of this layout stops", figures.failures);
        }
        // The writer sends whole messages at ticks: a run may end one short of rate × seconds.
        let planned = figures.target_rate * figures.seconds;
        if (figures.sent as f64) < (planned - 1.0).min(SEARCH_KEPT_UP * planned) {
            self.stopped = true;
            return format!(
                "not kept up with (sent {} of {planned:.0} messages): the search of this layout stops",
                figures.sent
            );
        }
        self.kept_up = Some((rate, figures.p99_us));
        if figures.p99_us > SEARCH_P99_BOUND_US {
            return format!("kept up with, p99 {} over the bound", ms(figures.p99_us));
        }
        self.within_bound = Some((rate, figures.p99_us));
        format!("kept up with, p99 {} within the bound", ms(figures.p99_us))
    }
}

fn ms(us: u64) -> String {
    format!("{:.1} ms", us as f64 / 1e3)
}

fn print_search(searches: &[LayoutSearch], highest_tried: f64) {
    let describe = |held: Option<(f64, u64)>| match held {
        Some((rate, p99)) => {
            format!("{}{rate:.0} messages/s (p99 {})", if rate >= highest_tried { "≥ " } else { "" }, ms(p99))
        }
        None => "none of the rates tried".to_string(),
    };
    let ratio = |rooms: Option<(f64, u64)>, fan_out: Option<(f64, u64)>| match (rooms, fan_out) {
        (Some(_), Some((fan_out, _))) if fan_out >= highest_tried => {
            "not known (fan-out held every rate tried: try higher ones)".to_string()
        }
        (Some((rooms, _)), Some((fan_out, _))) => {
            format!("{}{:.1}× (goal ≥ 5×)", if rooms >= highest_tried { "≥ " } else { "" }, rooms / fan_out)
        }
        _ => "not known (a layout held none of the rates tried: try lower ones)".to_string(),
    };
    let (rooms, fan_out) = (&searches[0], &searches[1]);
    println!("== flagship rate search: per layout, the highest rate kept up with (sent, nothing lost) ==");
    println!(
        "  with p99 ≤ 50 ms: rooms layout {}; fan-out layout {}",
        describe(rooms.within_bound),
        describe(fan_out.within_bound)
    );
    println!("    ratio {}", ratio(rooms.within_bound, fan_out.within_bound));
    println!(
        "  at any latency:   rooms layout {}; fan-out layout {}",
        describe(rooms.kept_up),
        describe(fan_out.kept_up)
    );
    println!("    ratio {}", ratio(rooms.kept_up, fan_out.kept_up));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(target_rate: f64, sent: u64, p99_ms: u64, failures: u64) -> RunFigures {
        RunFigures { sent, target_rate, seconds: 10.0, p99_us: p99_ms * 1_000, failures }
    }

    #[test]
    fn a_search_keeps_the_highest_rate_within_the_bound_and_the_highest_kept_up_with() {
        let mut search = LayoutSearch::default();
        // One message short of rate × seconds still keeps up (whole messages at ticks).
        search.record(1.0, &figures(1.0, 9, 30, 0));
        assert_eq!(search.within_bound, Some((1.0, 30_000)));
        search.record(10.0, &figures(10.0, 99, 80, 0));
        assert_eq!((search.within_bound, search.kept_up), (Some((1.0, 30_000)), Some((10.0, 80_000))));
        assert!(!search.stopped, "over the bound, the search goes on to find the ceiling");
        search.record(20.0, &figures(20.0, 120, 900, 0));
        assert!(search.stopped);
        assert_eq!(search.kept_up, Some((10.0, 80_000)), "a rate not kept up with is not recorded");
    }

    #[test]
    fn a_run_that_loses_anything_stops_the_search() {
        let mut search = LayoutSearch::default();
        search.record(5.0, &figures(5.0, 50, 10, 1));
        assert!(search.stopped);
        assert_eq!((search.within_bound, search.kept_up), (None, None));
    }
}
