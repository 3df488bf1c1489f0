//! `chat` and `chat-shared`: users with a room list each, every user watched by
//! one subscriber on its top by `recency`; each update moves a random room of a
//! random user to the top. Per user a collection (`chat`), or every user's rooms
//! in one collection `rooms` with an `owner` field (`chat-shared`), seen through
//! the subscriber's own filter or, with `--auth`, the rules' row predicate.

use std::sync::atomic::Ordering;

use ordo_bench::live::chat::{
    chat_collection, chat_losses, chat_marks, chat_user, load_chat, load_shared_chat, owner_filter, ChatLayout,
    ChatLosses, ChatUpdates,
};
use ordo_bench::live::http::HttpPool;
use ordo_bench::live::phase::LiveResult;
use ordo_bench::live::subscriber::{SubscriberAuth, SubscriberSpec};
use ordo_bench::live::verify::{verify_filtered_lists, verify_lists};
use ordo_bench::live::Result;
use ordo_server::auth::Role;

use crate::auth::{expect_forbidden, expect_no_rows, CHAT_RULES, SHARED_RULES};
use crate::options::Options;
use crate::report::count_failures;
use crate::runner::Scenario;
use crate::server::Target;

/// Printed next to the chat figures: the chat scenario's goals (`SCENARIOS.md`).
const CHAT_GOAL: &str = "goal: p99 ≤ 10 ms, 0 lost, server ≤ 1 core";

/// The chat scenario of one run, in one of its layouts.
pub struct Chat {
    layout: ChatLayout,
    n_collections: usize,
    n_rooms: usize,
    window_limit: usize,
    seed: u64,
    auth: bool,
}

impl Chat {
    pub fn new(options: &Options, layout: ChatLayout) -> Chat {
        Chat {
            layout,
            n_collections: options.chat_collections,
            n_rooms: options.chat_rooms,
            window_limit: options.window_limit,
            seed: options.seed,
            auth: options.auth,
        }
    }

    fn shared(&self) -> bool {
        self.layout == ChatLayout::Shared
    }

    /// The view of user `index`'s subscriber: a collection and, in chat-shared
    /// without auth, the filter it sends itself.
    fn view_of(&self, index: usize) -> (String, Option<String>) {
        match (self.shared(), self.auth) {
            (false, _) => (chat_collection(index), None),
            (true, false) => ("rooms".to_string(), Some(owner_filter(index))),
            (true, true) => ("rooms".to_string(), None),
        }
    }
}

impl Scenario for Chat {
    type Updates = ChatUpdates;

    fn name(&self) -> &'static str {
        if self.shared() {
            "chat-shared"
        } else {
            "chat"
        }
    }

    fn header(&self, options: &Options) -> String {
        let (n_collections, n_rooms, window_limit) = (self.n_collections, self.n_rooms, self.window_limit);
        if self.shared() {
            format!(
                "== chat-shared: {n_collections} users × {n_rooms} rooms in one collection `rooms` (field `owner`); one subscriber per user on its own rooms' top {window_limit} by recency desc ({}); {:.0} updates/s for {:.1} s ==",
                if self.auth { "the rules' row predicate owner == $sub" } else { "its own filter owner == user" },
                options.chat_rate,
                options.seconds
            )
        } else {
            format!(
                "== chat: {n_collections} users × {n_rooms} rooms; one subscriber per user on its top {window_limit} by recency desc; {:.0} updates/s for {:.1} s ==",
                options.chat_rate, options.seconds
            )
        }
    }

    fn rate(&self, options: &Options) -> f64 {
        options.chat_rate
    }

    fn n_subscribers(&self) -> usize {
        self.n_collections
    }

    fn n_collections(&self) -> usize {
        self.n_collections
    }

    fn rules(&self) -> &'static str {
        if self.shared() {
            SHARED_RULES
        } else {
            CHAT_RULES
        }
    }

    fn auth_note(&self) -> String {
        let n_collections = self.n_collections;
        if self.shared() {
            format!(
                "{n_collections} subscribers, each with its own reader token (sub = its user id) sent as an `auth` message and no filter of its own; live writes with a writer token; set-up and checks as admin"
            )
        } else {
            format!(
                "{n_collections} subscribers, each with its own reader token (sub = its user id: `0000` reads `user-0000`) sent as an `auth` message; live writes with a writer token; set-up and checks as admin"
            )
        }
    }

    async fn load(&mut self, pool: &mut HttpPool) -> Result<()> {
        if self.shared() {
            load_shared_chat(pool, self.n_collections, self.n_rooms, self.seed).await
        } else {
            load_chat(pool, self.n_collections, self.n_rooms, self.seed).await
        }
    }

    async fn check_rules(&self, pool: &mut HttpPool, target: &Target) -> Result<()> {
        if self.n_collections < 2 {
            return Ok(());
        }
        let reader = target.token(&chat_user(0), Role::Reader);
        if self.shared() {
            let what = format!("reader `{}` asking `rooms` for the rows of `{}`", chat_user(0), chat_user(1));
            let query = format!(
                r#"{{"filter":{},"sort":[{{"field":"recency","dir":"desc"}}],"offset":0,"limit":1}}"#,
                owner_filter(1)
            );
            expect_no_rows(pool, reader, &what, "/v1/collections/rooms/query", &query).await
        } else {
            let query = r#"{"sort":[{"field":"recency","dir":"desc"}],"offset":0,"limit":1}"#;
            let path = format!("/v1/collections/{}/query", chat_collection(1));
            let what = format!("reader `{}` querying {}", chat_user(0), chat_collection(1));
            expect_forbidden(pool, reader, &what, &path, query).await
        }
    }

    fn subscriber(&self, index: usize, target: &Target, max_update_number: u64) -> SubscriberSpec {
        let (collection, filter) = self.view_of(index);
        SubscriberSpec {
            authority: target.authority.clone(),
            collection,
            filter,
            fields: None,
            sort_field: "recency",
            window_limit: self.window_limit,
            marks: chat_marks(),
            max_update_number,
            auth: target
                .token(&chat_user(index), Role::Reader)
                .map(|token| SubscriberAuth { sub: chat_user(index), token }),
        }
    }

    fn updates(&mut self) -> ChatUpdates {
        ChatUpdates::new(self.seed, self.n_collections, self.n_rooms, self.layout)
    }

    /// Checked as admin, with the owner filter spelled out in chat-shared: an
    /// independent reference for the view the rules' predicate built.
    async fn verify(&self, pool: &mut HttpPool, live: &LiveResult) -> Result<(usize, Option<String>)> {
        if self.shared() {
            let reference = |index: usize| ("rooms".to_string(), Some(owner_filter(index)));
            verify_filtered_lists(pool, &live.outcomes, reference, "recency", self.window_limit, None).await
        } else {
            verify_lists(pool, &live.outcomes, chat_collection, "recency", self.window_limit).await
        }
    }

    fn report_deliveries(&self, live: &LiveResult, _updates: &ChatUpdates) {
        let ChatLosses {
            lost,
            extra,
            reset_collections,
            written_in_reset_collections,
            missing_in_reset_collections,
            resets,
        } = chat_losses(&live.outcomes, &live.stats);
        count_failures(lost);
        println!(
            "  losses: {lost} of {} acknowledged updates (over {} users without a reset){}",
            live.stats.acked.load(Ordering::Relaxed) - written_in_reset_collections,
            self.n_collections as u64 - reset_collections,
            if extra > 0 { format!("; {extra} received but never acknowledged") } else { String::new() },
        );
        println!(
            "  announced resets: {resets} in {reset_collections} subscriptions ({written_in_reset_collections} updates written there, {missing_in_reset_collections} of them never received)"
        );
    }

    fn metric_names(&self) -> &'static [&'static str] {
        &[
            "ordo_frames_encoded_total",
            "ordo_frames_sent_total",
            "ordo_resets_slow_total",
            "ordo_batches_total",
            "ordo_thread_allocations_total{thread=\"network\"}",
            "ordo_thread_allocations_total{thread=\"writer\"}",
            "ordo_frame_delivery_allocations_total",
            "ordo_frame_body_pool_misses_total",
        ]
    }

    fn goal(&self) -> Option<&'static str> {
        Some(CHAT_GOAL)
    }
}
