//! A connection's subscriptions opened and changed: `subscribe` checked (ids,
//! caps, the lag, the rules) and registered with the writer thread; `set_range`
//! and `set_view` checked against the rules and schema as they are now.

use std::collections::VecDeque;
use std::sync::Arc;

use super::{Connection, SubEntry};
use crate::error::{ApiError, ErrorCode};
use crate::limits;
use crate::routing::CollectionEntry;
use crate::wire::{self, WindowSpec};
use crate::writer::{Command, SubHandle};

impl Connection {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn check_subscribe(
        &self,
        sub: &str,
        collection: &str,
        filter: &serde_json::Value,
        sort: &[wire::SortRequest],
        position: wire::PositionKeys,
        limit: usize,
        fields: Option<&[String]>,
        payload: bool,
    ) -> Result<(Arc<CollectionEntry>, WindowSpec), ApiError> {
        wire::check_sub_id(sub)?;
        if let Some(cluster) = &self.context.cluster {
            cluster.status.check_not_lagging()?;
        }
        if self.session.by_client_id.contains_key(sub) {
            return Err(ApiError::new(
                ErrorCode::SubscriptionExists,
                format!("subscription `{sub}` exists on this connection; unsubscribe first or pick another id"),
            ));
        }
        if self.session.table.len() >= limits::MAX_SUBSCRIPTIONS_PER_CONNECTION {
            return Err(ApiError::limit(format!(
                "a connection holds at most {} subscriptions",
                limits::MAX_SUBSCRIPTIONS_PER_CONNECTION
            )));
        }
        let (entry, access) = self.readable_view(collection, filter)?;
        let read_schema = self.read_schema(&entry, filter, sort, fields)?;
        let schema = read_schema.as_ref().unwrap_or(&entry.schema);
        let mut spec = wire::window_spec(schema, filter, sort, position, limit, fields, payload)?;
        wire::restrict_spec(&mut spec, access.predicate.as_ref(), schema)?;
        spec.relation = access.relation;
        Ok((entry, spec))
    }

    /// Registers the subscription here, then asks the writer thread for its window;
    /// its first frame (a Reset) gets `seq = first_seq + 1`, and `req`.
    pub(super) async fn start_subscription(
        &mut self,
        client_id: String,
        collection: Arc<CollectionEntry>,
        spec: WindowSpec,
        first_seq: u64,
        req: Option<Box<str>>,
    ) {
        let handle = self.session.next_handle;
        self.session.next_handle += 1;
        let entry = SubEntry {
            client_id: client_id.clone(),
            collection: collection.clone(),
            spec: spec.clone(),
            seq: first_seq,
            retained: VecDeque::new(),
            retained_bytes: 0,
            awaiting_reset: false,
            range_due: None,
            subscribe_req: req,
            unsubscribe_req: None,
        };
        self.session.table.insert(handle, entry).expect("handles increase");
        self.session.by_client_id.insert(client_id, handle);
        let schema = collection.schema.clone();
        let owner = self.view_budget_owner();
        let command =
            Command::Subscribe { session: self.session.id, handle, collection: collection.id, schema, spec, owner };
        let _ = self.context.writer.send(command).await;
    }

    fn handle_of(&self, sub: &str) -> Result<SubHandle, ApiError> {
        self.session.by_client_id.get(sub).copied().ok_or_else(|| unknown_subscription(sub))
    }

    pub(super) async fn set_range(
        &mut self,
        sub: &str,
        position: wire::PositionKeys,
        limit: usize,
        req: Option<Box<str>>,
    ) -> Result<(), ApiError> {
        let handle = self.handle_of(sub)?;
        wire::check_range(0, limit)?;
        let mut position = position.check(limit)?;
        if let wire::Position::Seek(seek) = &mut position {
            // The rules as they are now: an item outside them reads as missing.
            let entry = self.session.table.get(handle).expect("mapped handles are live");
            let (name, filter) = (entry.collection.name.clone(), entry.spec.def.filter.clone());
            seek.rule = self.seek_rule(&name, filter)?;
        }
        let entry = self.session.table.get_mut(handle).expect("mapped handles are live");
        // Recorded now for a later resume to compare with; a key position is
        // recorded when its answer says where it landed.
        entry.spec.set_position(position.clone());
        entry.spec.limit = limit;
        let command = Command::SetRange { session: self.session.id, handle, position, limit, req };
        let _ = self.context.writer.send(command).await;
        Ok(())
    }

    pub(super) async fn set_view(
        &mut self,
        sub: &str,
        filter: &serde_json::Value,
        sort: &[wire::SortRequest],
        req: Option<Box<str>>,
    ) -> Result<(), ApiError> {
        let handle = self.handle_of(sub)?;
        let entry = self.session.table.get(handle).expect("mapped handles are live");
        let (name, subscribed_id) = (entry.collection.name.clone(), entry.collection.id);
        // The rules and the schema as they are now: a view change never widens past
        // the rules, and may name fields added since the subscription opened.
        let (current, access) = self.readable_view(&name, filter)?;
        if current.id != subscribed_id {
            // Dropped (and made again): the subscription's `ended` is on its way.
            return Err(ApiError::new(
                ErrorCode::UnknownCollection,
                format!("collection `{name}` was dropped since this subscription opened"),
            ));
        }
        let entry = self.session.table.get(handle).expect("mapped handles are live");
        // The projection stays: its fields read through references are checked again too.
        let shown = entry.spec.projection.through.clone();
        let read_schema = self.read_schema(&current, filter, sort, Some(&shown))?;
        let schema = read_schema.as_ref().unwrap_or(&current.schema);
        let mut def = wire::view_def(schema, filter, sort)?.showing(shown);
        wire::restrict(&mut def, access.predicate.as_ref(), schema)?;
        let entry = self.session.table.get_mut(handle).expect("mapped handles are live");
        entry.spec.def = def.clone();
        entry.spec.relation = access.relation.clone();
        let owner = self.view_budget_owner();
        let relation = access.relation;
        let command = Command::SetView { session: self.session.id, handle, def, req, owner, relation };
        let _ = self.context.writer.send(command).await;
        Ok(())
    }
}

pub(super) fn unknown_subscription(sub: &str) -> ApiError {
    ApiError::new(ErrorCode::UnknownSubscription, format!("no subscription `{sub}` on this connection"))
}
