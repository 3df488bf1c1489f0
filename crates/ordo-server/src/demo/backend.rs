//! The demo's backend: what a chat app's server would do with a writer token,
//! done through the same paths as the HTTP API (`Submitter`), so it works alike
//! on one node and in a cluster, and subscribers see ordinary diffs.

use std::sync::Arc;

use serde_json::{json, Value as Json};
use tokio::sync::oneshot;

use crate::access::Gate;
use crate::auth::Identity;
use crate::error::ApiError;
use crate::routing::{CollectionEntry, Routes};
use crate::rules::{RuleSet, RulesDoc};
use crate::submit::{Submitter, WriteParts, WriteSource};
use crate::wire::{self, MultiBatchRequest, SchemaRequest};
use crate::writer::{Command, WriterSender};

/// Writes for the demo, as its backend.
pub struct Backend {
    pub submit: Submitter,
    pub writer: WriterSender,
    pub routes: Routes,
    identity: Identity,
}

impl Backend {
    pub fn new(submit: Submitter, writer: WriterSender, routes: Routes) -> Backend {
        Backend { submit, writer, routes, identity: Identity::anonymous_admin() }
    }

    pub fn entry(&self, name: &str) -> Option<Arc<CollectionEntry>> {
        self.routes.read().expect("routes lock").get(name).cloned()
    }

    /// Creates `name` with `fields` (`[(name, type)]`, a `ref` targeting `target`).
    pub async fn create_collection(&self, name: &str, fields: Json) -> Result<Arc<CollectionEntry>, String> {
        let body = json!({ "fields": fields }).to_string();
        let request: SchemaRequest = serde_json::from_str(&body).map_err(|error| error.to_string())?;
        let schema = request
            .to_schema(|target| self.entry(target).map(|entry| entry.id))
            .map_err(|error| format!("the demo's `{name}`: {error}"))?;
        let created = self.submit.create_collection(&self.identity, name, schema, body.as_bytes()).await;
        Ok(created.map_err(|error| format!("creating the demo's `{name}`: {error}"))?.1)
    }

    /// One `POST /v1/batch` body (`{"writes":[{"collection":..,"ops":[..]}, ..]}`),
    /// each part atomic on its own; the first refusal is the error.
    pub async fn write(&self, writes: &Json) -> Result<(), ApiError> {
        let body = writes.to_string();
        let multi: MultiBatchRequest =
            serde_json::from_str(&body).map_err(|error| ApiError::bad_request(error.to_string()))?;
        let mut parts = WriteParts::default();
        for part in &multi.writes {
            let entry = self
                .entry(&part.collection)
                .ok_or_else(|| ApiError::bad_request(format!("no `{}`", part.collection)))?;
            let mut batch = ordo_core::Batch::new();
            wire::fill_batch(&mut batch, &entry.schema, &part.ops, 0)?;
            parts.batches.push((entry.id, batch));
        }
        let source = WriteSource::Multi { body: body.as_bytes(), refused: &[] };
        let results = self.submit.write(&self.identity, parts, source).await?;
        results.into_iter().try_for_each(|result| result.map(|_| ()))
    }

    /// An item's JSON (`{"id":..,"fields":{..}}`), or `None` when it is missing.
    pub async fn get_item(&self, collection: &str, id: &str) -> Result<Option<Json>, String> {
        let Some(entry) = self.entry(collection) else { return Ok(None) };
        let (reply, answer) = oneshot::channel();
        let command = Command::GetItem { collection: entry.id, id: id.to_owned(), predicate: None, reply };
        let item = ask(&self.writer, command, answer).await?;
        Ok(item.and_then(|bytes| serde_json::from_slice(&bytes).ok()))
    }

    /// One page of `collection` in id order, only `fields` shown.
    pub async fn page(
        &self,
        collection: &str,
        offset: usize,
        limit: usize,
        fields: &[String],
    ) -> Result<Vec<Json>, String> {
        let Some(entry) = self.entry(collection) else { return Ok(Vec::new()) };
        let position = wire::PositionKeys { offset: Some(offset), ..Default::default() };
        let spec = wire::window_spec(&entry.schema, &Json::Null, &[], position, limit, Some(fields), false)
            .map_err(|error| error.to_string())?;
        let (reply, answer) = oneshot::channel();
        let command = Command::Query { collection: entry.id, schema: entry.schema.clone(), spec, reply };
        let body = ask(&self.writer, command, answer).await?.map_err(|error| error.to_string())?;
        let mut page: Json = serde_json::from_slice(&body).map_err(|error| error.to_string())?;
        Ok(page["items"].as_array_mut().map(std::mem::take).unwrap_or_default())
    }

    /// Adds `rules` to the stored document, unless it already names one of their collections.
    pub async fn install_rules(&self, gate: &Gate, rules: Json) -> Result<(), String> {
        let current = gate.rules();
        let added: RulesDoc = serde_json::from_value(rules).map_err(|error| error.to_string())?;
        let named = |collection: &str| current.doc().rules.iter().any(|rule| rule.collection == collection);
        if added.rules.iter().any(|rule| named(&rule.collection)) {
            return Ok(());
        }
        let mut doc = current.doc().clone();
        doc.rules.extend(added.rules);
        let compiled = RuleSet::compile(doc.clone()).map_err(|error| format!("the demo's access rules: {error}"))?;
        let text = serde_json::to_string(&doc).expect("rules serialise");
        self.submit.set_rules(&self.identity, text, compiled, gate).await.map_err(|error| error.to_string())?;
        Ok(())
    }
}

/// Sends a command to the writer thread and waits for its answer.
pub async fn ask<T>(writer: &WriterSender, command: Command, answer: oneshot::Receiver<T>) -> Result<T, String> {
    const STOPPED: &str = "the writer thread stopped";
    writer.send(command).await.map_err(|_| STOPPED.to_owned())?;
    answer.await.map_err(|_| STOPPED.to_owned())
}
