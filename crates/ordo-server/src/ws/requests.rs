//! A client's messages: the rate limit, parsing, the `auth` check, and each
//! request routed to what handles it (`unsubscribe` here; `subscribe`,
//! `set_range`, `set_view` in `subscriptions`; `resume` in `resume`), or parked
//! first when it waits for a `min_seq`.

use fastwebsockets::OpCode;

use super::park::Parked;
use super::read::Inbound;
use super::subscriptions::unknown_subscription;
use super::Connection;
use crate::error::{ApiError, ErrorCode};
use crate::min_seq::{self, SeqCheck};
use crate::wire::{self, ClientMessage, WindowSpec};
use crate::writer::Command;

impl Connection {
    pub(super) async fn on_inbound(&mut self, inbound: Inbound) {
        match inbound {
            Inbound::Text(text) => {
                if !self.bucket.try_take() {
                    let error = ApiError::new(
                        ErrorCode::RateLimited,
                        format!(
                            "more than {} messages per second; this one was ignored",
                            self.context.config.messages_per_second
                        ),
                    );
                    let (sub, req) = wire::SubAndReq::read(&text);
                    self.send_error(&error, sub.as_deref(), req.as_deref()).await;
                    return;
                }
                match crate::strict_json::parse::<ClientMessage>(&text, "the message") {
                    Ok(message) => self.on_message(message).await,
                    Err(error) => {
                        // Not `sub`: the message is not understood, so no subscription is
                        // refused (a client must not drop its list for a typo).
                        let (_, req) = wire::SubAndReq::read(&text);
                        self.send_error(&error, None, req.as_deref()).await;
                    }
                }
            }
            Inbound::Binary => {
                let error = ApiError::bad_request("binary frames are not part of the protocol; send JSON text");
                self.send_error(&error, None, None).await;
            }
            Inbound::Reply(opcode, payload) => {
                if !self.closed {
                    self.frame.clear();
                    self.frame.extend_from_slice(&payload);
                    self.write(opcode).await;
                    if opcode == OpCode::Close {
                        self.closed = true;
                    }
                }
            }
            Inbound::Closed => self.closed = true,
            Inbound::Fatal(code, reason) => self.close(code, reason).await,
        }
    }

    async fn on_message(&mut self, message: ClientMessage) {
        if let Err(error) = wire::check_req(message.req()) {
            // An id that is not one is not echoed; the request does nothing.
            self.send_error(&error, None, None).await;
            return;
        }
        let req: Option<Box<str>> = message.req().map(Box::from);
        if let ClientMessage::Auth { token, .. } = &message {
            // Not counted as the first message: `resume` may follow it.
            if let Err(error) = self.authenticate(token, req.as_deref()).await {
                self.send_error(&error, None, req.as_deref()).await;
            }
            return;
        }
        let Some(identity) = self.identity.clone() else {
            let error = ApiError::new(ErrorCode::Unauthorized, "send `{\"op\":\"auth\",\"token\":..}` first");
            self.send_error(&error, None, req.as_deref()).await;
            return;
        };
        if let Err(error) = self.context.gate.take_request(&identity) {
            self.send_error(&error, None, req.as_deref()).await;
            return;
        }
        let first = std::mem::replace(&mut self.may_resume, false);
        if let Some(min_seq) = self.awaits_its_collection(&message) {
            self.park(min_seq, Parked::Unchecked { message: Box::new(message), req });
            return;
        }
        self.dispatch(message, req, first).await;
    }

    /// The `min_seq` to wait for before checking `message`: a `subscribe` to a
    /// collection this node does not know (yet) whose `min_seq` it has not
    /// reached. In a cluster the collection may come with an entry this node has
    /// not applied; refusing it now would make the answer depend on the node.
    fn awaits_its_collection(&self, message: &ClientMessage) -> Option<u64> {
        let ClientMessage::Subscribe { collection, min_seq, filter, .. } = message else { return None };
        let SeqCheck::Wait(min_seq) = min_seq::check(*min_seq, min_seq::last(&self.seq)) else { return None };
        match self.readable_view(collection, filter) {
            Err(error) if error.code == ErrorCode::UnknownCollection => Some(min_seq),
            _ => None,
        }
    }

    /// Handles a message from an authenticated client within its request rate.
    pub(super) async fn dispatch(&mut self, message: ClientMessage, req: Option<Box<str>>, first: bool) {
        let result = match message {
            ClientMessage::Auth { .. } => unreachable!("handled above"),
            ClientMessage::Subscribe {
                sub,
                collection,
                filter,
                sort,
                offset,
                around,
                after,
                before,
                tail,
                limit,
                fields,
                payload,
                digest,
                min_seq,
                ..
            } => {
                let position = wire::PositionKeys { offset, around, after, before, tail };
                let spec = self
                    .check_subscribe(&sub, &collection, &filter, &sort, position, limit, fields.as_deref(), payload)
                    .map(|(collection, spec)| (collection, WindowSpec { digest, ..spec }));
                match spec {
                    Ok((collection, spec)) => match min_seq::check(min_seq, min_seq::last(&self.seq)) {
                        SeqCheck::Reached => {
                            self.start_subscription(sub, collection, spec, 0, req.clone()).await;
                            Ok(())
                        }
                        SeqCheck::Wait(min_seq) => {
                            self.park(
                                min_seq,
                                Parked::Subscribe { sub, collection, spec: Box::new(spec), req: req.clone() },
                            );
                            Ok(())
                        }
                        SeqCheck::Refused(error) => Err((error, Some(sub))),
                    },
                    Err(error) => Err((error, Some(sub))),
                }
            }
            ClientMessage::SetRange { sub, offset, around, after, before, tail, limit, .. } => {
                let position = wire::PositionKeys { offset, around, after, before, tail };
                self.set_range(&sub, position, limit, req.clone()).await.map_err(|e| (e, Some(sub)))
            }
            ClientMessage::SetView { sub, filter, sort, .. } => {
                self.set_view(&sub, &filter, &sort, req.clone()).await.map_err(|e| (e, Some(sub)))
            }
            ClientMessage::Unsubscribe { sub, .. } => match self.session.by_client_id.remove(&sub) {
                Some(handle) => {
                    if let Some(entry) = self.session.table.get_mut(handle) {
                        entry.unsubscribe_req = req.clone();
                    }
                    let command = Command::Unsubscribe { session: self.session.id, handle };
                    let _ = self.context.writer.send(command).await;
                    Ok(())
                }
                None => Err((unknown_subscription(&sub), Some(sub))),
            },
            ClientMessage::Resume { session, subs, .. } => {
                if first {
                    // The greatest `min_seq` worth waiting for; entries past
                    // `MAX_MIN_SEQ_AHEAD` are refused by the resume itself.
                    let last_seq = min_seq::last(&self.seq);
                    let wait = subs
                        .iter()
                        .filter_map(|entry| match min_seq::check(entry.min_seq, last_seq) {
                            SeqCheck::Wait(min_seq) => Some(min_seq),
                            SeqCheck::Reached | SeqCheck::Refused(_) => None,
                        })
                        .max();
                    match wait {
                        Some(min_seq) => {
                            self.park(min_seq, Parked::Resume { session, entries: subs, req: req.clone() })
                        }
                        None => self.resume(&session, subs, req.clone()).await,
                    }
                    Ok(())
                } else {
                    Err((ApiError::bad_request("`resume` must be the first message of a connection"), None))
                }
            }
        };
        if let Err((error, sub)) = result {
            self.send_error(&error, sub.as_deref(), req.as_deref()).await;
        }
    }
}
