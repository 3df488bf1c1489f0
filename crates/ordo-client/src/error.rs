//! The one error type of the crate.

use std::fmt;

/// What went wrong. `Api` is the server's answer with its stable `code`
/// (`docs/PROTOCOL.md`, error table); match on `code`, not on `message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The server refused the request: HTTP status, stable code, a human message, and
    /// for a refused batch op (`conflict`) its index.
    Api { status: u16, code: String, message: String, op: Option<u64> },
    /// The request never got an answer (connect, I/O, a bad URL).
    Transport(String),
    /// The answer was not what the protocol says (not JSON, a missing key, a type that does not fit `T`).
    Decode(String),
    /// The token provider failed.
    Auth(String),
    /// The client was closed.
    Closed,
}

impl Error {
    /// The server's error code, for `Api` errors.
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::Api { code, .. } => Some(code),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Api { status, code, message, .. } => write!(f, "{status} {code}: {message}"),
            Error::Transport(message) => write!(f, "transport: {message}"),
            Error::Decode(message) => write!(f, "unexpected answer: {message}"),
            Error::Auth(message) => write!(f, "token provider: {message}"),
            Error::Closed => write!(f, "the client is closed"),
        }
    }
}

impl std::error::Error for Error {}
