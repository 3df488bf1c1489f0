//! `flagship`: the chat's room lists over shared rooms, through the server with
//! authenticated subscribers, in the flagship's layout (`rooms` + `members`, one
//! write per message) and in the fan-out layout (a copy per member, one write
//! per member) of the same chat, one after the other in the same run.

use std::sync::atomic::Ordering;

use ordo_bench::live::chat::{chat_collection, chat_losses, chat_user, ChatLosses};
use ordo_bench::live::flagship::{
    flagship_marks, load_fan_out_layout, load_rooms_layout, membership_id, rooms_layout_losses, FlagshipChat,
    FlagshipLayout, FlagshipUpdates, FAN_OUT_FIELDS, ROOMS_FIELDS,
};
use ordo_bench::live::http::HttpPool;
use ordo_bench::live::phase::LiveResult;
use ordo_bench::live::subscriber::{SubscriberAuth, SubscriberSpec};
use ordo_bench::live::verify::verify_filtered_lists;
use ordo_bench::live::Result;
use ordo_server::auth::Role;

use crate::auth::{expect_forbidden, expect_no_rows, CHAT_RULES, FLAGSHIP_RULES};
use crate::options::Options;
use crate::report::count_failures;
use crate::runner::Scenario;
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
}
