//! Errors answered to clients: a stable code, an HTTP status, and a message a
//! person can act on. The codes are listed in `docs/PROTOCOL.md`.

use ordo_core::{BatchError, CreateCollectionError, Precondition, SchemaChangeError, SchemaError, ViewError};
use ordo_store::StoreError;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    BadJson,
    BadRequest,
    InvalidSchema,
    InvalidBatch,
    InvalidView,
    LimitExceeded,
    UnknownCollection,
    NotFound,
    CollectionExists,
    RateLimited,
    UnknownSubscription,
    SubscriptionExists,
    StoreFull,
    ShuttingDown,
    Internal,
    Unauthorized,
    Forbidden,
    OriginNotAllowed,
    HostNotAllowed,
    InvalidRules,
    /// A write's precondition did not hold (409); nothing of the batch was written.
    Conflict,
    BackupRunning,
    SeqNotReached,
    /// Cluster mode: the node is too far behind the stream to take subscribers (503).
    Lagging,
    /// Cluster mode: the stream did not take or return a write in time (503); the
    /// write may still be applied (a retry with the same request is not deduplicated).
    ClusterUnavailable,
    /// An `Idempotency-Key` sent again with another request (422).
    IdempotencyKeyReused,
    /// A write to a collection that follows a PostgreSQL table (409): write to
    /// the table in PostgreSQL instead (docs/POSTGRES.md).
    ReadOnlySource,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 27] = [
        ErrorCode::BadJson,
        ErrorCode::BadRequest,
        ErrorCode::InvalidSchema,
        ErrorCode::InvalidBatch,
        ErrorCode::InvalidView,
        ErrorCode::LimitExceeded,
        ErrorCode::UnknownCollection,
        ErrorCode::NotFound,
        ErrorCode::CollectionExists,
        ErrorCode::RateLimited,
        ErrorCode::UnknownSubscription,
        ErrorCode::SubscriptionExists,
        ErrorCode::StoreFull,
        ErrorCode::ShuttingDown,
        ErrorCode::Internal,
        ErrorCode::Unauthorized,
        ErrorCode::Forbidden,
        ErrorCode::OriginNotAllowed,
        ErrorCode::HostNotAllowed,
        ErrorCode::InvalidRules,
        ErrorCode::Conflict,
        ErrorCode::BackupRunning,
        ErrorCode::SeqNotReached,
        ErrorCode::Lagging,
        ErrorCode::ClusterUnavailable,
        ErrorCode::IdempotencyKeyReused,
        ErrorCode::ReadOnlySource,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadJson => "bad_json",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::InvalidSchema => "invalid_schema",
            ErrorCode::InvalidBatch => "invalid_batch",
            ErrorCode::InvalidView => "invalid_view",
            ErrorCode::LimitExceeded => "limit_exceeded",
            ErrorCode::UnknownCollection => "unknown_collection",
            ErrorCode::NotFound => "not_found",
            ErrorCode::CollectionExists => "collection_exists",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::UnknownSubscription => "unknown_subscription",
            ErrorCode::SubscriptionExists => "subscription_exists",
            ErrorCode::StoreFull => "store_full",
            ErrorCode::ShuttingDown => "shutting_down",
            ErrorCode::Internal => "internal",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::OriginNotAllowed => "origin_not_allowed",
            ErrorCode::HostNotAllowed => "host_not_allowed",
            ErrorCode::InvalidRules => "invalid_rules",
            ErrorCode::Conflict => "conflict",
            ErrorCode::BackupRunning => "backup_running",
            ErrorCode::SeqNotReached => "seq_not_reached",
            ErrorCode::Lagging => "lagging",
            ErrorCode::ClusterUnavailable => "cluster_unavailable",
            ErrorCode::IdempotencyKeyReused => "idempotency_key_reused",
            ErrorCode::ReadOnlySource => "read_only_source",
        }
    }

    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::BadJson | ErrorCode::BadRequest | ErrorCode::InvalidSchema | ErrorCode::InvalidView => 400,
            ErrorCode::InvalidBatch | ErrorCode::IdempotencyKeyReused => 422,
            ErrorCode::LimitExceeded => 400,
            ErrorCode::UnknownCollection | ErrorCode::NotFound => 404,
            ErrorCode::CollectionExists => 409,
            ErrorCode::RateLimited => 429,
            ErrorCode::UnknownSubscription | ErrorCode::SubscriptionExists => 400,
            ErrorCode::StoreFull => 507,
            ErrorCode::ShuttingDown | ErrorCode::SeqNotReached | ErrorCode::Lagging | ErrorCode::ClusterUnavailable => {
                503
            }
            ErrorCode::Internal => 500,
            ErrorCode::Unauthorized => 401,
            ErrorCode::Forbidden | ErrorCode::OriginNotAllowed => 403,
            ErrorCode::HostNotAllowed => 421,
            ErrorCode::InvalidRules => 400,
            ErrorCode::Conflict => 409,
            ErrorCode::BackupRunning => 409,
            ErrorCode::ReadOnlySource => 409,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    /// Overrides the code's usual status (413 for a body too large).
    pub status: Option<u16>,
    /// The batch op a `conflict` names (also in the message), for clients to act on.
    pub op: Option<usize>,
    /// A `conflict`'s message without the state the item was found in (its
    /// version, whether it exists): what a caller that may not read the whole
    /// collection is told, so that a precondition cannot read a hidden item.
    pub without_found_state: Option<String>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError { code, message: message.into(), status: None, op: None, without_found_state: None }
    }

    pub fn status(&self) -> u16 {
        self.status.unwrap_or_else(|| self.code.http_status())
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorCode::BadRequest, message)
    }

    pub fn limit(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorCode::LimitExceeded, message)
    }

    pub fn unknown_collection(name: &str) -> ApiError {
        ApiError::new(ErrorCode::UnknownCollection, format!("no collection named `{name}`"))
    }

    pub fn shutting_down() -> ApiError {
        ApiError::new(ErrorCode::ShuttingDown, "the server is shutting down; nothing was done")
    }

    /// A JSON syntax error is `bad_json`; JSON of the wrong shape is `bad_request`.
    pub fn from_json(error: &serde_json::Error) -> ApiError {
        use serde_json::error::Category;
        match error.classify() {
            // serde_json refuses a number past f64's range (1e400) as a syntax error; say what the limit is.
            Category::Syntax if error.to_string().contains("number out of range") => ApiError::new(
                ErrorCode::BadJson,
                format!("not valid JSON: {error} (a number must fit an f64: at most about 1.8e308 in magnitude)"),
            ),
            Category::Syntax | Category::Eof => ApiError::new(ErrorCode::BadJson, format!("not valid JSON: {error}")),
            // serde's derived structs refuse a known key given twice: one text, one meaning
            // (see `strict_json`), so it is refused as every repeated key is.
            Category::Data if error.to_string().starts_with("duplicate field") => {
                ApiError::new(ErrorCode::BadJson, format!("not valid JSON: {error}; an object names each key once"))
            }
            // A typed parse's own refusal of a text with no one meaning (`strict_json::Refusal`).
            Category::Data if error.to_string().starts_with("not valid JSON: ") => {
                ApiError::new(ErrorCode::BadJson, error.to_string())
            }
            Category::Data | Category::Io => ApiError::bad_request(error.to_string()),
        }
    }

    /// The error as a caller that may not read every item of the collection
    /// sees it: a conflict without the state the item was found in.
    pub fn for_partial_reader(self) -> ApiError {
        match self.without_found_state {
            Some(message) => ApiError { message, without_found_state: None, ..self },
            None => self,
        }
    }

    /// `{"error":{"code":..,"message":..}}`
    pub fn to_json_body(&self) -> Vec<u8> {
        let body = match self.op {
            Some(op) => serde_json::json!({"error": {"code": self.code.as_str(), "message": self.message, "op": op}}),
            None => serde_json::json!({"error": {"code": self.code.as_str(), "message": self.message}}),
        };
        serde_json::to_vec(&body).expect("an error serialises")
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

impl From<ViewError> for ApiError {
    fn from(error: ViewError) -> ApiError {
        let code = match error {
            ViewError::UnknownCollection => ErrorCode::UnknownCollection,
            ViewError::UnknownWindow => ErrorCode::UnknownSubscription,
            ViewError::UnknownItem { .. } => ErrorCode::NotFound,
            ViewError::AnchorRowOutsideWindow { .. } => ErrorCode::BadRequest,
            _ => ErrorCode::InvalidView,
        };
        ApiError::new(code, error.to_string())
    }
}

impl From<BatchError> for ApiError {
    fn from(error: BatchError) -> ApiError {
        if let BatchError::Conflict { op_index, id, expected, .. } = &error {
            let expected = match expected {
                Precondition::Exists => "`{\"exists\":true}`".to_owned(),
                Precondition::NotExists => "`{\"exists\":false}`".to_owned(),
                Precondition::Version(version) => format!("`{{\"version\":{version}}}`"),
            };
            let without_found_state = format!("op {op_index} (`{id}`): the precondition {expected} does not hold");
            return ApiError {
                op: Some(*op_index),
                without_found_state: Some(without_found_state),
                ..ApiError::new(ErrorCode::Conflict, error.to_string())
            };
        }
        let code = match error {
            BatchError::UnknownCollection => ErrorCode::UnknownCollection,
            BatchError::TooManyOps { .. } | BatchError::BatchTooLarge | BatchError::CollectionFull { .. } => {
                ErrorCode::LimitExceeded
            }
            _ => ErrorCode::InvalidBatch,
        };
        ApiError::new(code, error.to_string())
    }
}

impl From<SchemaError> for ApiError {
    fn from(error: SchemaError) -> ApiError {
        ApiError::new(ErrorCode::InvalidSchema, error.to_string())
    }
}

impl From<CreateCollectionError> for ApiError {
    fn from(error: CreateCollectionError) -> ApiError {
        let code = match error {
            CreateCollectionError::NameTaken { .. } => ErrorCode::CollectionExists,
            CreateCollectionError::NameInvalid { .. } => ErrorCode::BadRequest,
            CreateCollectionError::TooManyCollections { .. } => ErrorCode::LimitExceeded,
            CreateCollectionError::Schema(_) => ErrorCode::InvalidSchema,
        };
        ApiError::new(code, error.to_string())
    }
}

impl From<SchemaChangeError> for ApiError {
    fn from(error: SchemaChangeError) -> ApiError {
        let code = match error {
            SchemaChangeError::UnknownCollection => ErrorCode::UnknownCollection,
            SchemaChangeError::UnknownField { .. } => ErrorCode::NotFound,
            SchemaChangeError::Schema(SchemaError::TooManyFields { .. }) => ErrorCode::LimitExceeded,
            SchemaChangeError::DefaultTooLong { .. } => ErrorCode::LimitExceeded,
            _ => ErrorCode::InvalidSchema,
        };
        ApiError::new(code, error.to_string())
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> ApiError {
        match error {
            StoreError::Batch(error) => error.into(),
            StoreError::SchemaChange(error) => error.into(),
            StoreError::CreateCollection(error) => error.into(),
            // A full disk is not a bug: writes are refused until there is room
            // again, then go on without a restart (docs/STORAGE.md).
            StoreError::MapFull { .. } | StoreError::DiskFull { .. } => {
                ApiError::new(ErrorCode::StoreFull, error.to_string())
            }
            StoreError::BackupRunning { .. } => ApiError::new(ErrorCode::BackupRunning, error.to_string()),
            StoreError::BackupDestination { .. } => ApiError::bad_request(error.to_string()),
            other => ApiError::new(ErrorCode::Internal, other.to_string()),
        }
    }
}
