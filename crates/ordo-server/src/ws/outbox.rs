//! What the writer thread sends a connection (its outbox): frames of diffs, each
//! wrapped in its envelope (`sub`, `seq`, `req`) and retained for resume, or
//! dropped while a reset is due; acks, refusals, unsubscribes and ends.

use std::sync::atomic::Ordering;

use fastwebsockets::OpCode;

use super::write::push_req;
use super::{Connection, RetainedFrame};
use crate::frame::{write_diffs_frame, write_json_str, DiffsHeader};
use crate::metrics::{self, Stage, METRICS};
use crate::writer::{Answer, Command, Outgoing, SubHandle, FRAME_OVERHEAD_BYTES};

impl Connection {
    /// Tells the writer thread the outbox is empty when it asked to hear it: a
    /// connection that fell behind gets its due resets only once it has caught up.
    pub(super) async fn maybe_report_drained(&mut self) {
        if self.session.outbox.is_empty() && self.session.shared.want_drain_notice.swap(false, Ordering::AcqRel) {
            // Boxed: rare, and its state would otherwise be part of every connection's task.
            let _ = Box::pin(self.context.writer.send(Command::Drained { session: self.session.id })).await;
        }
    }

    /// Answers a request whose frame was dropped here (the connection fell
    /// behind; the Reset that is due carries the change).
    fn ack_dropped(&mut self, handle: SubHandle, answers: Option<Answer>) {
        let Some(Answer { req }) = answers else { return };
        if let Some(sub) = self.session.table.get(handle).map(|entry| entry.client_id.clone()) {
            self.queue_ack(&sub, req.as_deref());
        }
    }

    pub(super) async fn on_outgoing(&mut self, outgoing: Outgoing) {
        match outgoing {
            Outgoing::Diffs { handle, epoch, body, n_diffs, is_reset, write_seq, answers, extra, queued_at } => {
                metrics::record_stage(Stage::FrameQueue, queued_at.elapsed());
                let cost = body.len() + FRAME_OVERHEAD_BYTES;
                self.session.shared.queued_bytes.fetch_sub(cost, Ordering::AcqRel);
                metrics::sub_queued(cost);
                let is_stale = epoch < self.session.shared.epoch.load(Ordering::Acquire);
                let Some(entry) = self.session.table.get_mut(handle) else { return };
                if is_stale || (entry.awaiting_reset && !is_reset) {
                    // Dropped: the connection fell behind (or a resume could not
                    // replay) and a reset is due; it will say where the window is,
                    // and the request this frame answered gets an `ack` now.
                    entry.range_due = extra.range.or(entry.range_due);
                    self.ack_dropped(handle, answers);
                    return;
                }
                let mut extra = extra;
                extra.range = extra.range.or(entry.range_due.take());
                entry.awaiting_reset = false;
                entry.seq += 1;
                let seq = entry.seq;
                if let Some((offset, limit)) = extra.range {
                    // Where a key-positioned request placed the window: what a resume compares.
                    (entry.spec.offset, entry.spec.limit, entry.spec.seek) = (offset as usize, limit as usize, None);
                }
                entry.retain(RetainedFrame { seq, write_seq, body: body.clone(), n_diffs, extra });
                // A subscription's first frame answers its `subscribe`; a later one
                // may answer a change of window. (Both at once cannot happen: the
                // first frame is the subscribe's Reset. Should it, the change gets an ack.)
                let subscribe_req = entry.subscribe_req.take();
                let (req, also_ack) = match (subscribe_req, answers) {
                    (Some(req), answers) => (Some(req), answers),
                    (None, Some(Answer { req })) => (req, None),
                    (None, None) => (None, None),
                };
                self.frame.clear();
                let header = DiffsHeader { sub: &entry.client_id, seq, write_seq, req: req.as_deref(), extra };
                write_diffs_frame(&mut self.frame, &header, &body);
                let also_ack = also_ack.map(|answer| (entry.client_id.clone(), answer));
                metrics::add(&METRICS.diffs_sent, n_diffs as u64);
                self.queue_frame(OpCode::Text);
                if let Some((sub, Answer { req })) = also_ack {
                    self.queue_ack(&sub, req.as_deref());
                }
            }
            Outgoing::Ack { handle, req } => {
                if let Some(sub) = self.session.table.get(handle).map(|entry| entry.client_id.clone()) {
                    self.queue_ack(&sub, req.as_deref());
                }
            }
            Outgoing::Wake => {}
            rare => Box::pin(self.on_rare_outgoing(rare)).await,
        }
    }

    /// Refusals, unsubscribes and ends: they write a frame of their own at once.
    /// Boxed where they run, so that every connection's task is not as large as
    /// their state (the frames of diffs above need none).
    async fn on_rare_outgoing(&mut self, outgoing: Outgoing) {
        match outgoing {
            Outgoing::SubscribeFailed { handle, error } => {
                if let Some(entry) = self.session.table.remove(handle) {
                    self.session.by_client_id.remove(&entry.client_id);
                    self.send_error(&error, Some(&entry.client_id), entry.subscribe_req.as_deref()).await;
                }
            }
            Outgoing::RequestFailed { handle, error, spec, req } => {
                let sub = self.session.table.get_mut(handle).map(|entry| {
                    if let Some(spec) = spec {
                        // What the window really is, for a later resume to compare with.
                        entry.spec = *spec;
                    }
                    entry.client_id.clone()
                });
                self.send_error(&error, sub.as_deref(), req.as_deref()).await;
            }
            Outgoing::Unsubscribed { handle } => {
                if let Some(entry) = self.session.table.remove(handle) {
                    self.frame.clear();
                    self.frame.extend_from_slice(b"{\"type\":\"unsubscribed\",\"sub\":");
                    write_json_str(&mut self.frame, &entry.client_id);
                    push_req(&mut self.frame, entry.unsubscribe_req.as_deref());
                    self.frame.push(b'}');
                    self.write(OpCode::Text).await;
                }
            }
            Outgoing::Ended { handle, reason, message } => {
                // The writer has detached it: no frame of it follows, and its id is free.
                if let Some(entry) = self.session.table.remove(handle) {
                    self.session.by_client_id.remove(&entry.client_id);
                    self.send_ended(&entry.client_id, reason, &message).await;
                }
            }
            Outgoing::Diffs { .. } | Outgoing::Ack { .. } | Outgoing::Wake => {
                unreachable!("handled by on_outgoing")
            }
        }
    }
}
