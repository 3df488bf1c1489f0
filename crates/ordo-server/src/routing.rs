//! The routing table the network threads read: collection names to the
//! collection's id and schema as the writer thread last published them. Only the
//! writer thread changes it (a collection created, changed or dropped); network
//! tasks hold its lock for one lookup.

use std::sync::{Arc, RwLock};

use ordo_core::{CollectionId, Engine, Schema};

use crate::name_routes::NameRoutes;

/// Whether a collection name is reserved for the server (`_ordo...`, any case).
pub fn is_reserved_name(name: &str) -> bool {
    name.len() >= 5 && name.as_bytes()[..5].eq_ignore_ascii_case(b"_ordo")
}

/// A collection as network tasks see it. Immutable: a schema change publishes a
/// new entry in its place (see `writer/schema_change.rs`).
#[derive(Debug)]
pub struct CollectionEntry {
    pub id: CollectionId,
    pub name: String,
    /// The collection's own fields (never the engine's derived ones).
    pub schema: Arc<Schema>,
    /// Each `ref` field's name and its target collection's name (see `refs`).
    pub ref_targets: Vec<(String, String)>,
}

impl CollectionEntry {
    /// The entry network tasks see for a collection of the engine: its schema
    /// without the engine's derived fields (those come and go with views, and
    /// must never stand in for the checks here), and each `ref` field's target
    /// by name (a target cannot be dropped or renamed while referenced).
    pub(crate) fn from_engine(engine: &Engine, id: CollectionId) -> Option<CollectionEntry> {
        let collection = engine.collection(id)?;
        let schema = collection.schema().without_derived();
        let ref_targets = schema
            .fields()
            .iter()
            .filter_map(|field| {
                let target = field.field_type.ref_target()?;
                Some((field.name.clone(), engine.collection(target)?.name().to_owned()))
            })
            .collect();
        Some(CollectionEntry { id, name: collection.name().to_owned(), schema: Arc::new(schema), ref_targets })
    }
}

/// Collection routing, shared with network tasks. Only the writer thread writes it
/// (when a collection is created); readers hold the lock for one lookup.
pub type Routes = Arc<RwLock<NameRoutes<Arc<CollectionEntry>>>>;
