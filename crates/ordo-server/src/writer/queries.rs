//! The writer thread's one-shot reads: a query's window (opened, captured and
//! closed at once), an item, a collection's length or item ids, and the gauges
//! of `/metrics`.

use ordo_core::CollectionId;

use super::fanout::FanoutTarget;
use super::subscriptions::check_seek_visible;
use super::Writer;
use crate::encode::write_item;
use crate::error::ApiError;
use crate::metrics::WriterGauges;
use crate::wire::{Projection, WindowSpec};

impl Writer {
    pub(super) fn query(&mut self, collection: CollectionId, spec: WindowSpec) -> Result<Vec<u8>, ApiError> {
        let fanout = &mut self.fanout;
        fanout.target = FanoutTarget::Capture;
        fanout.captured.clear();
        fanout.capture_projection = Some(spec.projection.clone());
        let opened = match check_seek_visible(&self.database, collection, spec.seek.as_ref()) {
            Ok(()) => self
                .database
                .open_window_at(collection, &spec.def, spec.anchor(), spec.limit, fanout)
                .map_err(Into::into),
            Err(error) => Err(error),
        };
        let fanout = &mut self.fanout;
        fanout.target = FanoutTarget::Subscribers;
        fanout.capture_projection = None;
        let (window, range) = opened?;
        let total = self.database.view_len(window)?;
        self.database.close_window(window)?;
        let mut out = Vec::with_capacity(fanout.captured.len() + 96);
        out.extend_from_slice(b"{\"total\":");
        crate::frame::write_u64(&mut out, total as u64);
        out.extend_from_slice(b",\"offset\":");
        crate::frame::write_u64(&mut out, range.offset as u64);
        // The writer applies batches one at a time: the answer reflects every
        // batch up to the last one applied, and none after.
        out.extend_from_slice(b",\"write_seq\":");
        crate::frame::write_u64(&mut out, self.database.last_seq());
        out.extend_from_slice(b",\"items\":");
        out.extend_from_slice(&fanout.captured);
        out.push(b'}');
        Ok(out)
    }

    /// An item as `GET .../items/{id}` answers it; `None` when it is missing or
    /// outside the caller's row predicate (the two read alike).
    pub(super) fn get_item(
        &self,
        collection: CollectionId,
        id: &str,
        predicate: Option<&ordo_core::Filter>,
    ) -> Option<Vec<u8>> {
        let collection = self.database.engine().collection(collection)?;
        let item = collection.get(id)?;
        if let Some(predicate) = predicate {
            // Compiled here: the schema is this collection's for sure.
            let compiled = ordo_core::CompiledFilter::compile(predicate, collection.schema()).ok()?;
            if !compiled.matches_item(item) {
                return None;
            }
        }
        let mut out = Vec::new();
        write_item(&mut out, item, &Projection::all(collection.schema()));
        Some(out)
    }

    pub(super) fn collection_len(&self, collection: CollectionId) -> usize {
        self.database.engine().collection(collection).map_or(0, |c| c.len())
    }

    pub(super) fn item_ids(&self, collection: CollectionId) -> Vec<String> {
        let Some(collection) = self.database.engine().collection(collection) else { return Vec::new() };
        collection.items().map(|item| item.id().to_owned()).collect()
    }

    pub(super) fn gauges(&self) -> WriterGauges {
        let stats = self.database.engine().stats();
        WriterGauges {
            n_collections: stats.n_collections,
            n_items: stats.n_items,
            n_views: stats.n_views,
            n_windows: stats.n_windows,
            n_subscriptions: self.fanout.sessions.values().map(|session| session.subs.len()).sum(),
            n_sessions: self.fanout.sessions.len(),
            largest_identity_view_bytes: self.view_budgets.largest_owner_bytes(),
            n_budgeted_identities: self.view_budgets.n_owners(),
            last_seq: self.database.last_seq(),
            checkpointed_seq: self.database.checkpointed_seq(),
            log_bytes: self.database.log_bytes_appended(),
        }
    }
}
