//! Where a requested window starts: `offset`, or at most one key anchor
//! (`around`, `after`, `before`, `tail`) in its place.

use serde::Deserialize;

use ordo_core::{Filter, WindowAnchor};

use crate::error::ApiError;
use crate::limits;

/// `"around":{"id":"!a","row":5}`: the item at row `row` of the window.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AroundRequest {
    pub id: String,
    #[serde(default)]
    pub row: usize,
}

/// The position keys of a request, as sent (each message lists them itself, so
/// that unknown keys are refused; see `ClientMessage`).
#[derive(Clone, Debug, Default)]
pub struct PositionKeys {
    pub offset: Option<usize>,
    pub around: Option<AroundRequest>,
    pub after: Option<String>,
    pub before: Option<String>,
    pub tail: Option<bool>,
}

/// A window's position, checked.
#[derive(Clone, Debug, PartialEq)]
pub enum Position {
    Offset(usize),
    /// The last `limit` rows, following the view's end.
    Tail,
    /// At an item's place, found by the writer thread.
    Seek(Seek),
}

/// A position relative to an item.
#[derive(Clone, Debug, PartialEq)]
pub struct Seek {
    pub anchor: SeekAnchor,
    /// The access rule's row predicate, if one applies: an item outside it must
    /// read exactly as a missing one (its place in the view would tell that it
    /// exists), so the writer thread checks it before looking for the item.
    pub rule: Option<Filter>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SeekAnchor {
    Around { id: String, row: usize },
    After(String),
    Before(String),
}

impl SeekAnchor {
    pub fn id(&self) -> &str {
        match self {
            SeekAnchor::Around { id, .. } | SeekAnchor::After(id) | SeekAnchor::Before(id) => id,
        }
    }

    pub fn as_anchor(&self) -> WindowAnchor<'_> {
        match self {
            SeekAnchor::Around { id, row } => WindowAnchor::Around { id, row: *row },
            SeekAnchor::After(id) => WindowAnchor::After(id),
            SeekAnchor::Before(id) => WindowAnchor::Before(id),
        }
    }
}

impl PositionKeys {
    /// Checks that at most one position is given (none: offset 0) and that an
    /// anchor fits the limits; `limit` is the window's, for `around`'s row.
    pub fn check(self, limit: usize) -> Result<Position, ApiError> {
        let PositionKeys { offset, around, after, before, tail } = self;
        let tail = tail.filter(|&tail| tail);
        let given: Vec<&str> = [
            offset.map(|_| "offset"),
            around.as_ref().map(|_| "around"),
            after.as_ref().map(|_| "after"),
            before.as_ref().map(|_| "before"),
            tail.map(|_| "tail"),
        ]
        .into_iter()
        .flatten()
        .collect();
        if given.len() > 1 {
            return Err(ApiError::bad_request(format!(
                "a window has one position; this request gives {} (use one of offset, around, after, before, tail)",
                given.join(" and ")
            )));
        }
        let seek = |anchor: SeekAnchor| -> Result<Position, ApiError> {
            let id_bytes = anchor.id().len();
            if id_bytes > ordo_core::limits::MAX_ID_BYTES {
                return Err(ApiError::limit(format!(
                    "the anchor id is {id_bytes} bytes; an id has at most {}",
                    ordo_core::limits::MAX_ID_BYTES
                )));
            }
            Ok(Position::Seek(Seek { anchor, rule: None }))
        };
        if let Some(AroundRequest { id, row }) = around {
            if row >= limit.max(1) {
                return Err(ApiError::bad_request(format!(
                    "`around.row` is {row}, outside a window of {limit} rows (the row must be below the limit)"
                )));
            }
            return seek(SeekAnchor::Around { id, row });
        }
        if let Some(id) = after {
            return seek(SeekAnchor::After(id));
        }
        if let Some(id) = before {
            return seek(SeekAnchor::Before(id));
        }
        if tail.is_some() {
            return Ok(Position::Tail);
        }
        let offset = offset.unwrap_or(0);
        if offset > limits::MAX_WINDOW_OFFSET {
            return Err(ApiError::limit(format!(
                "the window offset is {offset}; at most {} is allowed",
                limits::MAX_WINDOW_OFFSET
            )));
        }
        Ok(Position::Offset(offset))
    }
}
