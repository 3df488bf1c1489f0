//! Where tokens come from: none, a fixed token, or a provider called for a fresh one.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::Error;

/// What a token provider returns.
pub type TokenFuture = Pin<Box<dyn Future<Output = Result<String, String>> + Send>>;

/// How the client authenticates (`Authorization: Bearer` on HTTP, the `auth` message on the WebSocket).
#[derive(Clone, Default)]
pub enum Auth {
    /// A server without auth.
    #[default]
    None,
    /// One token for the client's life: when it expires the server closes the WebSocket (4401)
    /// and refuses HTTP requests.
    Token(String),
    /// Called for a fresh token: at start, shortly before the current one expires, on
    /// `auth_expired`, after a close with 4401 and after an HTTP 401.
    Provider(Arc<dyn Fn() -> TokenFuture + Send + Sync>),
}

impl Auth {
    pub fn provider<F, Fut>(provider: F) -> Auth
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<String, String>> + Send + 'static,
    {
        Auth::Provider(Arc::new(move || Box::pin(provider())))
    }
}

impl std::fmt::Debug for Auth {
    // Never prints a token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Auth::None => "Auth::None",
            Auth::Token(_) => "Auth::Token(..)",
            Auth::Provider(_) => "Auth::Provider(..)",
        })
    }
}

/// The token in use, shared by the HTTP helpers and the WebSocket task.
pub(crate) struct TokenSource {
    auth: Auth,
    cached: tokio::sync::Mutex<Option<String>>,
}

impl TokenSource {
    pub(crate) fn new(auth: Auth) -> TokenSource {
        let cached = match &auth {
            Auth::Token(token) => Some(token.clone()),
            _ => None,
        };
        TokenSource { auth, cached: tokio::sync::Mutex::new(cached) }
    }

    pub(crate) fn has_auth(&self) -> bool {
        !matches!(self.auth, Auth::None)
    }

    pub(crate) fn can_refresh(&self) -> bool {
        matches!(self.auth, Auth::Provider(_))
    }

    /// The token in use, fetched from the provider the first time.
    pub(crate) async fn current(&self) -> Result<Option<String>, Error> {
        let mut cached = self.cached.lock().await;
        if cached.is_none() {
            if let Auth::Provider(provider) = &self.auth {
                *cached = Some(provider().await.map_err(Error::Auth)?);
            }
        }
        Ok(cached.clone())
    }

    /// A fresh token from the provider (the fixed token for `Auth::Token`), kept as the one in use.
    pub(crate) async fn refresh(&self) -> Result<Option<String>, Error> {
        let mut cached = self.cached.lock().await;
        if let Auth::Provider(provider) = &self.auth {
            *cached = Some(provider().await.map_err(Error::Auth)?);
        }
        Ok(cached.clone())
    }
}
