//! `resume`: a reconnecting client takes its parked session back (only its own
//! identity's, and only with an unspent token: a new one is issued each time)
//! and each listed subscription either replays the frames it missed or resets.

use std::collections::HashSet;
use std::sync::Arc;

use fastwebsockets::OpCode;

use super::{Connection, RetainedFrame};
use crate::auth;
use crate::error::{ApiError, ErrorCode};
use crate::frame::{write_diffs_frame, DiffsHeader};
use crate::limits;
use crate::metrics::{self, METRICS};
use crate::min_seq::{self, SeqCheck};
use crate::wire::{self, WindowSpec};
use crate::writer::{share_key, Command, Outgoing, SubHandle};

impl Connection {
    /// `req` is echoed on `resumed`. Each entry's `min_seq` has been waited for
    /// already (see `Connection::park`); an entry whose store `seq` is still short
    /// of it is refused with `seq_not_reached`, as its `subscribe` would be.
    pub(super) async fn resume(&mut self, token: &str, entries: Vec<wire::ResumeEntry>, req: Option<Box<str>>) {
        let last_seq = min_seq::last(&self.seq);
        let mut outcomes: Vec<serde_json::Value> = Vec::with_capacity(entries.len());
        let mut replays: Vec<SubHandle> = Vec::new();
        // What the writer queued for an adopted session, handled after the answer.
        let mut queued: Vec<Outgoing> = Vec::new();
        if let Some(old) = self.context.registry.take(token, &self.session.owner) {
            // Adopt the old session: its queue, table and retained frames.
            let fresh = std::mem::replace(&mut self.session, old);
            let _ = self.context.writer.send(Command::DropSession { session: fresh.id }).await;
            // A resume token is good for one resume: whoever saw this one cannot reuse it.
            self.session.token = auth::new_session_token();
            queued = self.end_subscriptions_ended_while_parked().await;
        }
        let mut listed: Vec<SubHandle> = Vec::with_capacity(entries.len());
        // Ids seen so far in this resume: a second entry for one id is refused,
        // as a second `subscribe` of it would be.
        let mut seen: HashSet<String> = HashSet::with_capacity(entries.len());
        for entry in entries {
            let checked = if !seen.insert(entry.sub.clone()) {
                Err(ApiError::new(
                    ErrorCode::SubscriptionExists,
                    format!("subscription `{}` is listed twice in this resume; the first entry stands", entry.sub),
                ))
            } else if listed.len() >= limits::MAX_SUBSCRIPTIONS_PER_CONNECTION {
                // The subscriptions not listed are closed below, so after the
                // resume the connection holds exactly the entries listed.
                Err(ApiError::limit(format!(
                    "a connection holds at most {} subscriptions (max_subscriptions_per_connection); \
                     this resume lists more",
                    limits::MAX_SUBSCRIPTIONS_PER_CONNECTION
                )))
            } else {
                self.check_resume_entry(&entry).and_then(|checked| match min_seq::check(entry.min_seq, last_seq) {
                    SeqCheck::Reached => Ok(checked),
                    SeqCheck::Refused(error) => Err(error),
                    SeqCheck::Wait(min_seq) => Err(min_seq::not_reached(min_seq, last_seq)),
                })
            };
            let (collection, spec) = match checked {
                Ok(checked) => checked,
                Err(error) => {
                    metrics::count_error(error.code);
                    outcomes.push(serde_json::json!({"sub": entry.sub, "error": {"code": error.code.as_str(), "message": error.message}}));
                    continue;
                }
            };
            let existing = self.session.by_client_id.get(&entry.sub).copied();
            let same = existing.and_then(|handle| {
                let sub = self.session.table.get(handle)?;
                // The same schema too: a projection holds field ids, which a schema
                // change renumbers (the window's own projection followed it by name).
                (sub.collection.id == collection.id
                    && Arc::ptr_eq(&sub.collection.schema, &collection.schema)
                    && share_key(collection.id, &sub.spec) == share_key(collection.id, &spec)
                    // The writer watches the relationship the subscription opened
                    // with: only the very same one keeps it (the rule there may differ).
                    && sub.spec.relation == spec.relation)
                    .then_some(handle)
            });
            match same {
                Some(handle) => {
                    listed.push(handle);
                    let sub = self.session.table.get_mut(handle).expect("live");
                    // A `subscribe` of the old connection was answered there, or never.
                    sub.subscribe_req = None;
                    let oldest = sub.retained.front().map_or(sub.seq + 1, |frame| frame.seq);
                    if entry.last_seq <= sub.seq && entry.last_seq + 1 >= oldest {
                        let n = sub.seq - entry.last_seq;
                        metrics::add(&METRICS.resume_replayed, 1);
                        outcomes.push(serde_json::json!({"sub": entry.sub, "replayed": n}));
                        replays.push(handle);
                        sub.awaiting_reset = false;
                        // Remember where to replay from in `seq` until the frames go out.
                        sub.retained.retain(|frame| frame.seq > entry.last_seq);
                    } else {
                        metrics::add(&METRICS.resume_reset, 1);
                        outcomes.push(serde_json::json!({"sub": entry.sub, "reset": true}));
                        sub.awaiting_reset = true;
                        sub.seq = entry.last_seq;
                        let _ = self.context.writer.send(Command::Resync { session: self.session.id, handle }).await;
                    }
                }
                None => {
                    if let Some(handle) = existing {
                        // Same id, another definition: the old one goes.
                        self.forget(handle).await;
                    }
                    metrics::add(&METRICS.resume_reset, 1);
                    outcomes.push(serde_json::json!({"sub": entry.sub, "reset": true}));
                    self.start_subscription(entry.sub.clone(), collection, spec, entry.last_seq, None).await;
                    listed.push(self.session.next_handle - 1);
                }
            }
        }
        // Subscriptions of the old session that the client did not list are closed.
        let unlisted: Vec<SubHandle> =
            self.session.table.iter().map(|(handle, _)| handle).filter(|handle| !listed.contains(handle)).collect();
        for handle in unlisted {
            self.forget(handle).await;
        }
        let mut answer = serde_json::json!({"type": "resumed", "session": self.session.token, "subs": outcomes});
        if let Some(req) = req {
            answer["req"] = (*req).into();
        }
        self.send_json(&answer).await;
        for handle in replays {
            let Some(sub) = self.session.table.get(handle) else { continue };
            let frames: Vec<RetainedFrame> = sub.retained.iter().cloned().collect();
            let client_id = sub.client_id.clone();
            for RetainedFrame { seq, write_seq, body, n_diffs, extra } in frames {
                // As first sent (`write_seq`, `total` and all), but `req`: the old connection's.
                self.frame.clear();
                let header = DiffsHeader { sub: &client_id, seq, write_seq, req: None, extra };
                write_diffs_frame(&mut self.frame, &header, &body);
                metrics::add(&METRICS.diffs_sent, n_diffs as u64);
                self.write(OpCode::Text).await;
            }
        }
        for outgoing in queued {
            self.on_outgoing(outgoing).await;
        }
        self.flush().await;
        self.maybe_report_drained().await;
    }

    /// Subscriptions of an adopted session that a drop or a field removal ended
    /// while it was parked: the writer detached them and queued their
    /// `Outgoing::Ended` in the session's outbox, which is the only word on what
    /// ended (guessing from schemas cannot tell which view a window had when a
    /// field went). Their `ended` frames go out first, so the resume treats their
    /// ids as free; everything else queued is returned, in order, to be handled
    /// after the `resumed` answer, where the connection would have handled it.
    async fn end_subscriptions_ended_while_parked(&mut self) -> Vec<Outgoing> {
        let mut rest = Vec::new();
        while let Some(outgoing) = self.session.outbox.try_recv() {
            match outgoing {
                Outgoing::Ended { .. } => self.on_outgoing(outgoing).await,
                other => rest.push(other),
            }
        }
        rest
    }

    /// Closes a subscription without telling the client (it did not ask for it).
    pub(super) async fn forget(&mut self, handle: SubHandle) {
        if let Some(entry) = self.session.table.remove(handle) {
            self.session.by_client_id.remove(&entry.client_id);
        }
        let _ = self.context.writer.send(Command::Unsubscribe { session: self.session.id, handle }).await;
    }

    pub(super) fn check_resume_entry(
        &self,
        entry: &wire::ResumeEntry,
    ) -> Result<(Arc<crate::routing::CollectionEntry>, WindowSpec), ApiError> {
        wire::check_sub_id(&entry.sub)?;
        if let Some(cluster) = &self.context.cluster {
            cluster.status.check_not_lagging()?;
        }
        let (collection, access) = self.readable_view(&entry.collection, &entry.filter)?;
        let read_schema = self.read_schema(&collection, &entry.filter, &entry.sort, entry.fields.as_deref())?;
        let schema = read_schema.as_ref().unwrap_or(&collection.schema);
        let position = wire::PositionKeys { offset: entry.offset, tail: entry.tail, ..Default::default() };
        let mut spec = wire::window_spec(
            schema,
            &entry.filter,
            &entry.sort,
            position,
            entry.limit,
            entry.fields.as_deref(),
            entry.payload,
        )?;
        wire::restrict_spec(&mut spec, access.predicate.as_ref(), schema)?;
        spec.relation = access.relation;
        spec.digest = entry.digest;
        Ok((collection, spec))
    }
}
