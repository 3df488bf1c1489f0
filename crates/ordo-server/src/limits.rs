//! Every limit the server enforces on its inputs, in one place; `GET /v1/limits`
//! returns them and `docs/PROTOCOL.md` documents them. The engine's own limits
//! (id length, filter depth, fields per schema...) are in `ordo_core::limits`.

/// Largest client WebSocket message (after reassembling fragments).
pub const MAX_INBOUND_FRAME_BYTES: usize = 64 * 1024;
/// Largest HTTP request body.
pub const MAX_HTTP_BODY_BYTES: usize = 16 * 1024 * 1024;
/// Most operations in one HTTP write (one batch, or all parts of a multi-collection write).
pub const MAX_OPS_PER_REQUEST: usize = 10_000;
/// Most subscriptions one WebSocket connection may hold.
pub const MAX_SUBSCRIPTIONS_PER_CONNECTION: usize = 128;
/// Largest window a client may subscribe to or query.
pub const MAX_WINDOW_LIMIT: usize = 1_000;
/// Diff frames of a window up to this many rows (its `limit`) carry the window
/// digest; a larger window's frames carry it only for a subscription that asked
/// (`"digest": true`), since hashing a window costs a walk of all its rows.
pub const DIGEST_WINDOW_ROWS_MAX: usize = 256;
/// Largest window offset (slot indices are `u32` in the engine).
pub const MAX_WINDOW_OFFSET: usize = u32::MAX as usize;
/// Longest client-chosen subscription id, in bytes.
pub const MAX_SUBSCRIPTION_ID_BYTES: usize = 64;
/// Longest client request id (`req` in a WebSocket message), in bytes: as long
/// as a subscription id, so a client can reuse its scheme for both.
pub const MAX_REQUEST_ID_BYTES: usize = 64;
/// Longest `X-Request-Id` the HTTP API echoes, in bytes (visible ASCII only;
/// anything else is ignored, not echoed).
pub const MAX_HTTP_REQUEST_ID_BYTES: usize = 128;
/// How long a request with `min_seq` (query, subscribe, resume entry) waits for
/// the store to reach that batch before it is refused with `seq_not_reached`.
pub const MIN_SEQ_WAIT_MS: u64 = 5_000;
/// A `min_seq` more than this many batches past the store's last one is refused
/// at once instead of after the wait: reaching it within `MIN_SEQ_WAIT_MS` would
/// take two million batches a second, far more than one writer commits.
pub const MAX_MIN_SEQ_AHEAD: u64 = 10_000_000;
/// Longest `contains` needle or `prefix` in a filter, in bytes: the match is
/// O(haystack × needle), so a client must not choose the needle's size freely.
pub const MAX_FILTER_STRING_BYTES: usize = 256;
/// WebSocket messages per second per connection (token bucket) and the burst allowed.
pub const DEFAULT_WS_MESSAGES_PER_SECOND: u32 = 100;
pub const WS_MESSAGE_BURST: u32 = 200;
/// HTTP requests per second per TCP connection, and the burst allowed.
pub const DEFAULT_HTTP_REQUESTS_PER_SECOND: u32 = 5_000;
pub const HTTP_REQUEST_BURST: u32 = 10_000;
/// Bytes of frames a connection may have waiting before it is treated as slow.
pub const DEFAULT_OUTBOUND_BUFFER_BYTES: usize = 1024 * 1024;
/// How long a slow connection may go without writing anything before it is closed (code 4001).
pub const DEFAULT_SLOW_CLOSE_AFTER_SECS: u64 = 10;
/// How long a disconnected session is held for resume, by default.
pub const DEFAULT_SESSION_RETENTION_SECS: u64 = 60;
/// Per subscription: frames, and bytes of frames, kept for replay on resume.
pub const RETAINED_FRAMES_PER_SUBSCRIPTION: usize = 256;
pub const RETAINED_BYTES_PER_SUBSCRIPTION: usize = 256 * 1024;
/// Descriptors kept free of connections under `RLIMIT_NOFILE`: LMDB's files, the
/// write-ahead log's segments (and the one being preallocated), the runtime's
/// epoll and wake-up descriptors, the listener, and the connections being
/// refused below. Without this margin the server runs out of descriptors for
/// its own files before it refuses a connection.
pub const DESCRIPTOR_RESERVE: usize = 128;
/// Connections past the cap that may be answering their `503` at once (each
/// holds a descriptor for at most `REFUSAL_LINGER_MS`); more are closed unanswered.
pub const MAX_REFUSING_CONNECTIONS: usize = 32;
/// How long a refused connection is kept to read what the client sent, so that
/// closing it sends a FIN after the `503`, not a reset that could discard it.
pub const REFUSAL_LINGER_MS: u64 = 500;
/// How long a new connection may take to send a complete request head (or the
/// HTTP/2 preface), and how long an HTTP/1.1 connection may sit idle between
/// requests, by default (`--header-timeout`).
pub const DEFAULT_HEADER_TIMEOUT_SECS: u64 = 10;
/// Backoff after `accept` fails for lack of descriptors (EMFILE, ENFILE): the
/// first wait, doubled on each failure in a row up to the last value.
pub const ACCEPT_BACKOFF_FIRST_MS: u64 = 5;
pub const ACCEPT_BACKOFF_MAX_MS: u64 = 1_000;
/// A failing `accept` is logged at most once per this many milliseconds (with
/// the count of failures since the last line).
pub const ACCEPT_ERROR_LOG_INTERVAL_MS: u64 = 1_000;
/// Network threads by default: one per core, at most this many. Two beat one for
/// the chat load on a 2-core machine (docs/BENCHMARKS.md); more is unmeasured.
pub const DEFAULT_MAX_NETWORK_THREADS: usize = 4;
/// Most network threads `--network-threads` accepts.
pub const MAX_NETWORK_THREADS: usize = 64;
/// Requests waiting for the writer thread; network tasks wait when it is full.
pub const WRITER_QUEUE_CAPACITY: usize = 4_096;
/// Per network thread: write batches kept for reuse, the largest one kept (in
/// bytes held), lists of parts kept, and the longest list kept (in parts); the
/// lists of a write's results are kept by the same two bounds as lists of parts.
/// Beyond these, buffers are freed.
pub const MAX_POOLED_BATCHES: usize = 4_096;
pub const MAX_POOLED_BATCH_BYTES: usize = 64 * 1024;
pub const MAX_POOLED_PART_LISTS: usize = 64;
pub const MAX_POOLED_LIST_PARTS: usize = 1_024;
/// Deepest nesting of arrays and objects in an item's payload (a scalar is 0,
/// `[]` is 1). The text is stored and sent verbatim, but a client parsing it
/// (a browser's `JSON.parse`, a recursive decoder) may overflow its stack.
pub const MAX_PAYLOAD_DEPTH: usize = 64;
/// Budgets for sessions parked for resume (their connection is gone), in
/// estimated bytes: server-wide and per owner (the identity that opened them).
/// Past either, the oldest parked sessions (of that owner, for the second) are
/// dropped; their resume resets every subscription.
pub const MAX_PARKED_BYTES: usize = 256 * 1024 * 1024;
pub const MAX_PARKED_BYTES_PER_OWNER: usize = 64 * 1024 * 1024;
/// The cost of a parked session is its retained frames' bytes, the frames
/// still queued for it, these per session and per subscription, and, per
/// subscription, its window limit times the per-item estimate: the engine's
/// window holds a slot (4 bytes) and a pending entry per item, a view's
/// `OrderTree` entry is 20 bytes, and the first frame encodes every item.
/// An over-estimate when windows are shared, which errs on the safe side.
pub const PARKED_SESSION_OVERHEAD_BYTES: usize = 4 * 1024;
pub const PARKED_SUBSCRIPTION_OVERHEAD_BYTES: usize = 1024;
pub const PARKED_WINDOW_ITEM_BYTES: usize = 64;

/// Largest bearer token accepted, in bytes (a JWT with a few claims is well under 1 KiB).
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;
/// Shortest HS256 secret `ordo serve` accepts (RFC 7518: at least the hash size).
pub const MIN_SECRET_BYTES: usize = 32;
/// Clock skew allowed on a token's `exp` and `nbf`, in seconds.
pub const TOKEN_LEEWAY_SECS: u64 = 30;
/// Longest `sub` claim, in bytes.
pub const MAX_SUBJECT_BYTES: usize = 255;
/// Most public keys in a JWKS file.
pub const MAX_JWKS_KEYS: usize = 64;
/// Verified tokens remembered (each until it expires), so repeated tokens are not verified again.
pub const MAX_CACHED_TOKENS: usize = 4_096;
/// Most access rules.
pub const MAX_RULES: usize = 256;
/// A WebSocket opened without a token must send `auth` within this many seconds
/// (else close 4401): a client sends it right after the `welcome`, so a long
/// wait only helps sockets that never will.
pub const AUTH_TIMEOUT_SECS: u64 = 3;
/// WebSockets that have not authenticated yet hold at most this share of the
/// connection cap (`max_connections / 8`, at least `MIN_UNAUTHENTICATED_CONNECTIONS`);
/// past it, the one that has waited longest is closed (4401) to make room, so
/// that sockets which never authenticate cannot take the places of users with
/// a token. See `unauthenticated_cap`.
pub const UNAUTHENTICATED_SHARE_DIVISOR: usize = 8;
pub const MIN_UNAUTHENTICATED_CONNECTIONS: usize = 8;
/// After its token expires, a WebSocket has this many seconds to send a fresh one (else close 4401).
pub const AUTH_EXPIRY_GRACE_SECS: u64 = 30;
/// Most WebSocket connections one `reader` identity may hold at once.
pub const MAX_CONNECTIONS_PER_IDENTITY: usize = 32;
/// Requests (HTTP requests and WebSocket messages together) per second per
/// `reader` identity, across all its connections, and the burst allowed.
pub const IDENTITY_REQUESTS_PER_SECOND: u32 = 200;
pub const IDENTITY_REQUEST_BURST: u32 = 400;
/// Collections one non-admin identity may create per hour (rules granting `create`).
pub const COLLECTIONS_CREATED_PER_IDENTITY_PER_HOUR: u32 = 100;
/// Views one `reader` identity may hold at once: distinct views behind its
/// subscriptions, over all its connections and the sessions parked for it, and
/// their estimated bytes (see `VIEW_ITEM_BYTES`). Past either, `subscribe`,
/// `set_view` and a `resume` entry are refused with `limit_exceeded`.
pub const MAX_VIEWS_PER_IDENTITY: usize = 256;
pub const MAX_VIEW_BYTES_PER_IDENTITY: usize = 64 * 1024 * 1024;
/// A view's estimated bytes: this per item in it when the identity comes to hold
/// it (an `OrderTree` entry is 20 bytes, membership bits and slack make ~26 B
/// measured), plus `VIEW_BASE_BYTES` for its fixed heap (~1 KiB measured).
pub const VIEW_ITEM_BYTES: usize = 32;
pub const VIEW_BASE_BYTES: usize = 1024;
/// Identities whose counters are kept; past it, idle ones are forgotten first.
pub const MAX_TRACKED_IDENTITIES: usize = 100_000;
/// Lifetime of the tokens `POST /demo/token` hands out (the page refreshes them).
pub const DEMO_TOKEN_TTL_SECS: u64 = 300;

/// Every limit by name, for `GET /v1/limits` and the `welcome` frame.
pub fn as_json() -> serde_json::Value {
    let mut json = serde_json::json!({
        "max_inbound_frame_bytes": MAX_INBOUND_FRAME_BYTES,
        "max_http_body_bytes": MAX_HTTP_BODY_BYTES,
        "max_ops_per_request": MAX_OPS_PER_REQUEST,
        "max_subscriptions_per_connection": MAX_SUBSCRIPTIONS_PER_CONNECTION,
        "max_window_limit": MAX_WINDOW_LIMIT,
        "digest_window_rows_max": DIGEST_WINDOW_ROWS_MAX,
        "max_subscription_id_bytes": MAX_SUBSCRIPTION_ID_BYTES,
        "max_request_id_bytes": MAX_REQUEST_ID_BYTES,
        "max_http_request_id_bytes": MAX_HTTP_REQUEST_ID_BYTES,
        "min_seq_wait_ms": MIN_SEQ_WAIT_MS,
        "max_min_seq_ahead": MAX_MIN_SEQ_AHEAD,
        "max_filter_string_bytes": MAX_FILTER_STRING_BYTES,
        "max_id_bytes": ordo_core::limits::MAX_ID_BYTES,
        "max_string_field_bytes": ordo_core::limits::MAX_STRING_FIELD_BYTES,
        "max_payload_bytes": ordo_core::limits::MAX_PAYLOAD_BYTES,
        "max_fields_per_schema": ordo_core::limits::MAX_FIELDS_PER_SCHEMA,
        "max_sort_keys": ordo_core::limits::MAX_SORT_KEYS,
        "max_collated_sort_keys": ordo_core::limits::MAX_COLLATED_SORT_KEYS,
        "max_collation_locale_bytes": ordo_core::limits::MAX_COLLATION_LOCALE_BYTES,
        "max_filter_depth": ordo_core::limits::MAX_FILTER_DEPTH,
        "max_filter_nodes": ordo_core::limits::MAX_FILTER_NODES,
        "max_filter_in_values": ordo_core::limits::MAX_FILTER_IN_VALUES,
        "max_collection_name_bytes": ordo_core::limits::MAX_COLLECTION_NAME_BYTES,
        "ws_message_burst": WS_MESSAGE_BURST,
        "retained_frames_per_subscription": RETAINED_FRAMES_PER_SUBSCRIPTION,
        "retained_bytes_per_subscription": RETAINED_BYTES_PER_SUBSCRIPTION,
        "max_token_bytes": MAX_TOKEN_BYTES,
        "token_leeway_secs": TOKEN_LEEWAY_SECS,
        "auth_timeout_secs": AUTH_TIMEOUT_SECS,
        "auth_expiry_grace_secs": AUTH_EXPIRY_GRACE_SECS,
        "max_connections_per_identity": MAX_CONNECTIONS_PER_IDENTITY,
        "identity_requests_per_second": IDENTITY_REQUESTS_PER_SECOND,
        "identity_request_burst": IDENTITY_REQUEST_BURST,
        "collections_created_per_identity_per_hour": COLLECTIONS_CREATED_PER_IDENTITY_PER_HOUR,
        "max_rules": MAX_RULES,
        "max_backup_path_bytes": MAX_BACKUP_PATH_BYTES,
        "max_payload_depth": MAX_PAYLOAD_DEPTH,
    });
    // Apart: one `json!` of every key would pass the macro's recursion limit.
    json["max_views_per_identity"] = MAX_VIEWS_PER_IDENTITY.into();
    json["max_view_bytes_per_identity"] = MAX_VIEW_BYTES_PER_IDENTITY.into();
    json["view_item_bytes"] = VIEW_ITEM_BYTES.into();
    json["view_base_bytes"] = VIEW_BASE_BYTES.into();
    json
}

/// The most TCP connections a descriptor limit of `nofile_soft` (the soft
/// `RLIMIT_NOFILE` after `raise_open_file_limit`) leaves room for: the limit
/// less `DESCRIPTOR_RESERVE` (half the limit when the limit is tiny), so that
/// `accept` never meets EMFILE. The default of `--max-connections`.
pub fn connections_below_descriptor_limit(nofile_soft: u64) -> usize {
    let nofile = usize::try_from(nofile_soft).unwrap_or(usize::MAX);
    let below_limit = if nofile > 2 * DESCRIPTOR_RESERVE { nofile - DESCRIPTOR_RESERVE } else { nofile / 2 };
    below_limit.max(1)
}

/// The connection cap in force (`max_connections`: HTTP and WebSocket alike,
/// counted from `accept`; past it a connection gets a minimal `503
/// limit_exceeded` and is closed): `--max-connections` if given, else all the
/// descriptor limit leaves room for. A cap above that room is refused, since
/// the server would run out of descriptors before it refused a connection.
pub fn connection_cap(nofile_soft: u64, requested: Option<usize>) -> Result<usize, String> {
    let room = connections_below_descriptor_limit(nofile_soft);
    match requested {
        None => Ok(room),
        Some(0) => Err("--max-connections is at least 1".to_owned()),
        Some(requested) if requested > room => Err(format!(
            "--max-connections {requested} is more than the descriptor limit leaves room for: {room} \
             (RLIMIT_NOFILE {nofile_soft} less {DESCRIPTOR_RESERVE} kept for the server's own files); \
             raise the limit (`ulimit -n`, systemd's LimitNOFILE) or lower --max-connections"
        )),
        Some(requested) => Ok(requested),
    }
}

/// How many WebSockets without an identity yet may be open under a connection
/// cap of `max_connections`: an eighth, at least a few (never more than the cap).
pub fn unauthenticated_cap(max_connections: usize) -> usize {
    (max_connections / UNAUTHENTICATED_SHARE_DIVISOR).max(MIN_UNAUTHENTICATED_CONNECTIONS).min(max_connections)
}

/// The estimated bytes of a view of `n_items` items (see `VIEW_ITEM_BYTES`).
pub fn view_cost_bytes(n_items: usize) -> usize {
    n_items.saturating_mul(VIEW_ITEM_BYTES).saturating_add(VIEW_BASE_BYTES)
}

/// `ordo serve --demo`: rooms of the chat written into an empty `rooms` collection
/// at start (with their memberships and a few messages each).
pub const DEMO_ROOMS: usize = 10_000;
/// `ordo serve --demo`: the simulator's messages per second at start (`--demo-rate`).
pub const DEFAULT_DEMO_MESSAGES_PER_SECOND: u32 = 20;
/// The simulator's highest rate (`--demo-rate`, `POST /demo/simulator`): at 5 000
/// messages/s one demo already keeps the writer thread busy on a small machine.
pub const MAX_DEMO_MESSAGES_PER_SECOND: u32 = 5_000;
/// Messages the simulator writes in one tick at most (three ops each, well inside
/// `MAX_OPS_PER_REQUEST`): a stall never turns into a larger burst.
pub const MAX_DEMO_MESSAGES_PER_TICK: usize = 1_000;
/// `POST /demo/send`: a message's text, in bytes.
pub const MAX_DEMO_TEXT_BYTES: usize = 1_000;

/// `--log-segment-size`: the write-ahead log's segment size (each also
/// preallocated as a spare: a busy server holds up to two), by default
/// `ordo_store::DEFAULT_LOG_SEGMENT_BYTES` (16 MiB). Below 1 MiB, rotations
/// (a directory sync each) come too often; above 1 GiB, a spare is a waste.
pub const MIN_LOG_SEGMENT_BYTES: u64 = 1 << 20;
pub const MAX_LOG_SEGMENT_BYTES: u64 = 1 << 30;
/// Longest backup destination path (`POST /v1/backup`'s `to`), in bytes.
pub const MAX_BACKUP_PATH_BYTES: usize = 4096;
