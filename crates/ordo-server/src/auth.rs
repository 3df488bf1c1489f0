//! Verified identity: JSON Web Tokens checked with `jsonwebtoken` (no crypto of
//! our own). HS256 with a shared secret, or EdDSA / ES256 / RS256 with public
//! keys from a JWKS file. Each key fixes the one algorithm it verifies, so a
//! token cannot pick another (`alg: none` does not even parse, and an RS256 key
//! never checks an HS256 signature). `docs/SECURITY.md` is the contract.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde_json::Value as Json;

use crate::limits;

/// What a token may do. `Admin` bypasses the access rules; the others get
/// exactly what the rules grant them (`crate::rules`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    Reader,
    Writer,
    Admin,
}

impl Role {
    pub fn parse(name: &str) -> Option<Role> {
        match name {
            "reader" => Some(Role::Reader),
            "writer" => Some(Role::Writer),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Reader => "reader",
            Role::Writer => "writer",
            Role::Admin => "admin",
        }
    }
}

/// A verified caller.
#[derive(Debug)]
pub struct Identity {
    pub sub: String,
    pub role: Role,
    /// Every claim of the token, for the rules' `{claim}` and `$claim` bindings.
    pub claims: serde_json::Map<String, Json>,
    /// The token's `exp`, in seconds since the Unix epoch (`u64::MAX`: never).
    pub expires_at: u64,
    /// Names the identity for sessions, quotas and refreshes: the claims that
    /// say who it is (all but the time claims), as canonical JSON.
    pub key: Arc<str>,
}

impl Identity {
    /// The identity of every request when the server runs without auth.
    pub fn anonymous_admin() -> Identity {
        Identity {
            sub: "anonymous".to_owned(),
            role: Role::Admin,
            claims: serde_json::Map::new(),
            expires_at: u64::MAX,
            key: Arc::from("anonymous"),
        }
    }

    /// A claim's value as rules bind it: strings as they are, integers and
    /// booleans in their JSON spelling; anything else does not bind.
    /// `None` also for a value outside the claim alphabet: a claim is put into
    /// a collection pattern as a value, so it must not carry the pattern's
    /// syntax (`lists/{sub}` with `sub` = `bob/archive` would name
    /// `lists/bob/archive`). `sub` is checked when the token is verified.
    pub fn claim_text(&self, name: &str) -> Option<String> {
        if name == "sub" {
            return Some(self.sub.clone());
        }
        let text = match self.claims.get(name)? {
            Json::String(text) => text.clone(),
            Json::Number(number) if number.is_i64() || number.is_u64() => number.to_string(),
            Json::Bool(value) => value.to_string(),
            _ => return None,
        };
        if is_claim_text(&text) {
            Some(text)
        } else {
            crate::metrics::add(&crate::metrics::METRICS.claims_outside_alphabet, 1);
            None
        }
    }

    /// The JSON shown to the client (`authed`, `welcome`).
    pub fn to_json(&self) -> Json {
        let mut object = serde_json::json!({"sub": self.sub, "role": self.role.as_str()});
        if self.expires_at != u64::MAX {
            object["expires_at"] = self.expires_at.into();
        }
        object
    }
}

/// Why a token was refused: a label for `ordo_auth_failures_total` and the log,
/// and the message the client gets. Never contains the token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthFailure {
    Missing,
    TooLarge,
    Malformed,
    Algorithm,
    UnknownKey,
    BadSignature,
    Expired,
    NotYetValid,
    WrongAudience,
    WrongIssuer,
    BadClaims,
    /// `sub` holds a character outside the claim alphabet (`is_claim_text`).
    BadSubject,
}

impl AuthFailure {
    pub const ALL: [AuthFailure; 12] = [
        AuthFailure::Missing,
        AuthFailure::TooLarge,
        AuthFailure::Malformed,
        AuthFailure::Algorithm,
        AuthFailure::UnknownKey,
        AuthFailure::BadSignature,
        AuthFailure::Expired,
        AuthFailure::NotYetValid,
        AuthFailure::WrongAudience,
        AuthFailure::WrongIssuer,
        AuthFailure::BadClaims,
        AuthFailure::BadSubject,
    ];

    pub fn reason(self) -> &'static str {
        match self {
            AuthFailure::Missing => "missing",
            AuthFailure::TooLarge => "too_large",
            AuthFailure::Malformed => "malformed",
            AuthFailure::Algorithm => "algorithm",
            AuthFailure::UnknownKey => "unknown_key",
            AuthFailure::BadSignature => "bad_signature",
            AuthFailure::Expired => "expired",
            AuthFailure::NotYetValid => "not_yet_valid",
            AuthFailure::WrongAudience => "wrong_audience",
            AuthFailure::WrongIssuer => "wrong_issuer",
            AuthFailure::BadClaims => "bad_claims",
            AuthFailure::BadSubject => "bad_subject",
        }
    }

    pub fn message(self) -> String {
        match self {
            AuthFailure::Missing => "this request needs a token: `Authorization: Bearer <jwt>`".to_owned(),
            AuthFailure::TooLarge => format!("the token is over {} bytes", limits::MAX_TOKEN_BYTES),
            AuthFailure::Malformed => "the token is not a well-formed JWT".to_owned(),
            AuthFailure::Algorithm => "the token's algorithm is not accepted for its key".to_owned(),
            AuthFailure::UnknownKey => "the token names no key this server knows (`kid`)".to_owned(),
            AuthFailure::BadSignature => "the token's signature does not verify".to_owned(),
            AuthFailure::Expired => "the token has expired".to_owned(),
            AuthFailure::NotYetValid => "the token is not valid yet (`nbf`)".to_owned(),
            AuthFailure::WrongAudience => "the token's audience (`aud`) is not this server".to_owned(),
            AuthFailure::WrongIssuer => "the token's issuer (`iss`) is not accepted".to_owned(),
            AuthFailure::BadSubject => {
                "the token's `sub` holds a character outside A-Z a-z 0-9 - _ . @ : + = | ~ (docs/SECURITY.md, \"Claims are values\")".to_owned()
            }
            AuthFailure::BadClaims => {
                "the token's claims are not acceptable (`sub` a string of 1..=255 bytes, `exp` a number, the role one of admin, writer, reader)".to_owned()
            }
        }
    }
}

/// The claim alphabet: what a claim bound into a collection pattern may hold.
/// Letters, digits and `- _ . @ : + = | ~` cover the subjects identity
/// providers issue (UUIDs, numbers, e-mail addresses, `auth0|…`, Matrix's
/// `@user:server`), and none of them is pattern syntax (`/`, `*`, `{`, `}`)
/// or changes meaning in a URL path (`%`, `?`, `#`).
pub fn is_claim_text(text: &str) -> bool {
    text.bytes().all(is_claim_byte)
}

pub fn is_claim_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"-_.@:+=|~".contains(&byte)
}

/// A public key of the JWKS file, with the one algorithm it verifies.
struct PublicKey {
    kid: Option<String>,
    algorithm: Algorithm,
    key: DecodingKey,
}

/// How tokens are checked; built once at start from the command line.
pub struct Verifier {
    secret: Option<DecodingKey>,
    public_keys: Vec<PublicKey>,
    audience: Option<String>,
    issuer: Option<String>,
    role_claim: String,
}

/// `ordo serve`'s auth options.
#[derive(Clone, Debug, Default)]
pub struct AuthOptions {
    /// The HS256 shared secret (at least 32 bytes).
    pub secret: Option<Vec<u8>>,
    pub jwks_path: Option<std::path::PathBuf>,
    pub audience: Option<String>,
    pub issuer: Option<String>,
    pub role_claim: Option<String>,
}

impl AuthOptions {
    pub fn is_configured(&self) -> bool {
        self.secret.is_some() || self.jwks_path.is_some()
    }
}

/// Reads a secret file: its bytes with surrounding white space trimmed.
pub fn read_secret_file(path: &Path) -> Result<Vec<u8>, String> {
    let bytes =
        std::fs::read(path).map_err(|error| format!("cannot read the secret file {}: {error}", path.display()))?;
    let secret = bytes.trim_ascii().to_vec();
    check_secret(&secret)?;
    Ok(secret)
}

pub fn check_secret(secret: &[u8]) -> Result<(), String> {
    if secret.len() < limits::MIN_SECRET_BYTES {
        return Err(format!(
            "the HS256 secret is {} bytes; at least {} are needed (e.g. `head -c 32 /dev/urandom | base64 > secret`)",
            secret.len(),
            limits::MIN_SECRET_BYTES
        ));
    }
    Ok(())
}

/// A fresh random secret for `--demo`: 32 bytes from the OS's CSPRNG, as hex.
pub fn generate_secret() -> Vec<u8> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the OS's random source");
    hex(&bytes).into_bytes()
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

impl Verifier {
    pub fn new(options: &AuthOptions) -> Result<Verifier, String> {
        let public_keys = match &options.jwks_path {
            Some(path) => load_jwks(path)?,
            None => Vec::new(),
        };
        Ok(Verifier {
            secret: options.secret.as_deref().map(DecodingKey::from_secret),
            public_keys,
            audience: options.audience.clone(),
            issuer: options.issuer.clone(),
            role_claim: options.role_claim.clone().unwrap_or_else(|| "role".to_owned()),
        })
    }

    /// Checks a token and returns who it names.
    pub fn verify(&self, token: &str) -> Result<Identity, AuthFailure> {
        if token.len() > limits::MAX_TOKEN_BYTES {
            return Err(AuthFailure::TooLarge);
        }
        if token.is_empty() {
            return Err(AuthFailure::Missing);
        }
        let header = jsonwebtoken::decode_header(token).map_err(|error| match error.kind() {
            ErrorKind::InvalidAlgorithmName | ErrorKind::UnsupportedAlgorithm | ErrorKind::InvalidAlgorithm => {
                AuthFailure::Algorithm
            }
            _ => AuthFailure::Malformed,
        })?;
        let (algorithm, key) = self.key_for(&header)?;
        let mut validation = Validation::new(algorithm);
        validation.leeway = limits::TOKEN_LEEWAY_SECS;
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp", "sub"]);
        match &self.audience {
            Some(audience) => {
                validation.set_audience(&[audience]);
                validation.required_spec_claims.insert("aud".to_owned());
            }
            None => validation.validate_aud = false,
        }
        if let Some(issuer) = &self.issuer {
            validation.set_issuer(&[issuer]);
            validation.required_spec_claims.insert("iss".to_owned());
        }
        let data = jsonwebtoken::decode::<serde_json::Map<String, Json>>(token, key, &validation)
            .map_err(|error| failure_of(error.kind()))?;
        check_one_meaning(token)?;
        self.identity(data.claims)
    }

    fn key_for(&self, header: &Header) -> Result<(Algorithm, &DecodingKey), AuthFailure> {
        if header.alg == Algorithm::HS256 {
            return self.secret.as_ref().map(|key| (Algorithm::HS256, key)).ok_or(AuthFailure::Algorithm);
        }
        let candidates = || self.public_keys.iter();
        let key = match &header.kid {
            Some(kid) => candidates().find(|key| key.kid.as_deref() == Some(kid.as_str())),
            None if self.public_keys.len() == 1 => self.public_keys.first(),
            None => None,
        };
        let key =
            key.ok_or(if self.public_keys.is_empty() { AuthFailure::Algorithm } else { AuthFailure::UnknownKey })?;
        if key.algorithm != header.alg {
            return Err(AuthFailure::Algorithm);
        }
        Ok((key.algorithm, &key.key))
    }

    fn identity(&self, claims: serde_json::Map<String, Json>) -> Result<Identity, AuthFailure> {
        let sub = match claims.get("sub") {
            Some(Json::String(sub)) if !sub.is_empty() && sub.len() <= limits::MAX_SUBJECT_BYTES => sub.clone(),
            _ => return Err(AuthFailure::BadClaims),
        };
        if !is_claim_text(&sub) {
            return Err(AuthFailure::BadSubject);
        }
        let role = match claims.get(&self.role_claim) {
            None => Role::Reader,
            Some(Json::String(name)) => Role::parse(name).ok_or(AuthFailure::BadClaims)?,
            Some(_) => return Err(AuthFailure::BadClaims),
        };
        let expires_at = claims.get("exp").and_then(Json::as_u64).ok_or(AuthFailure::BadClaims)?;
        let key = identity_key(&claims);
        Ok(Identity { sub, role, claims, expires_at, key })
    }
}

/// `Identity::key` of a token's claims: every claim but the ones that change
/// on a refresh, as canonical JSON (names sorted).
pub fn identity_key(claims: &serde_json::Map<String, Json>) -> Arc<str> {
    let who: BTreeMap<&String, &Json> =
        claims.iter().filter(|(name, _)| !matches!(name.as_str(), "exp" | "nbf" | "iat" | "jti")).collect();
    Arc::from(serde_json::to_string(&who).expect("claims serialise"))
}

fn failure_of(kind: &ErrorKind) -> AuthFailure {
    match kind {
        ErrorKind::InvalidSignature => AuthFailure::BadSignature,
        ErrorKind::ExpiredSignature => AuthFailure::Expired,
        ErrorKind::ImmatureSignature => AuthFailure::NotYetValid,
        ErrorKind::InvalidAudience => AuthFailure::WrongAudience,
        ErrorKind::InvalidIssuer => AuthFailure::WrongIssuer,
        ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName | ErrorKind::UnsupportedAlgorithm => {
            AuthFailure::Algorithm
        }
        ErrorKind::MissingRequiredClaim(_) | ErrorKind::InvalidClaimFormat(_) | ErrorKind::InvalidSubject => {
            AuthFailure::BadClaims
        }
        // A payload that is not a JSON object of claims is a bad token, whatever the signature says.
        ErrorKind::Json(_) | ErrorKind::Utf8(_) => AuthFailure::BadClaims,
        _ => AuthFailure::Malformed,
    }
}

/// A token's header and claims, as signed, must name each key once at every
/// depth, and hold no integer too wide for 64 bits: the map `decode` fills keeps
/// one value of a repeated claim (`role` as `reader`, then `admin`), and
/// another reader of the same token (a proxy, a second service) may keep the
/// other. Refused as `bad_claims`. The segments are decoded into a stack buffer:
/// a token is at most `MAX_TOKEN_BYTES`.
fn check_one_meaning(token: &str) -> Result<(), AuthFailure> {
    let mut buffer = [0u8; limits::MAX_TOKEN_BYTES / 4 * 3 + 3];
    for segment in token.split('.').take(2) {
        let json = decode_base64url(segment.as_bytes(), &mut buffer).ok_or(AuthFailure::Malformed)?;
        crate::strict_json::check(json, crate::strict_json::MAX_DEPTH, crate::strict_json::Integers::Exact64)
            .map_err(|_| AuthFailure::BadClaims)?;
    }
    Ok(())
}

/// Base64url without padding (a JWT segment) into `out`; `None` when malformed or
/// longer than `out`.
fn decode_base64url<'o>(text: &[u8], out: &'o mut [u8]) -> Option<&'o [u8]> {
    let sextet = |byte: u8| -> Option<u32> {
        Some(match byte {
            b'A'..=b'Z' => byte - b'A',
            b'a'..=b'z' => byte - b'a' + 26,
            b'0'..=b'9' => byte - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => return None,
        } as u32)
    };
    let mut length = 0;
    for chunk in text.chunks(4) {
        if chunk.len() == 1 {
            return None;
        }
        let mut bits = 0u32;
        for (index, &byte) in chunk.iter().enumerate() {
            bits |= sextet(byte)? << (18 - 6 * index);
        }
        let n_bytes = chunk.len() - 1;
        let bytes = out.get_mut(length..length + n_bytes)?;
        for (index, byte) in bytes.iter_mut().enumerate() {
            *byte = (bits >> (16 - 8 * index)) as u8;
        }
        length += n_bytes;
    }
    Some(&out[..length])
}

/// Reads a JWKS file. Each key's algorithm comes from its type (RSA: RS256,
/// EC P-256: ES256, OKP Ed25519: EdDSA), never from a token; symmetric (`oct`)
/// keys are refused: the shared secret has its own option.
fn load_jwks(path: &Path) -> Result<Vec<PublicKey>, String> {
    let text = std::fs::read_to_string(path).map_err(|error| format!("cannot read {}: {error}", path.display()))?;
    let set: JwkSet = crate::strict_json::parse(text.as_bytes(), "the JWKS document")
        .map_err(|error| format!("{} is not a JWKS document: {}", path.display(), error.message))?;
    if set.keys.is_empty() || set.keys.len() > limits::MAX_JWKS_KEYS {
        return Err(format!("{} must hold 1..={} keys", path.display(), limits::MAX_JWKS_KEYS));
    }
    let mut keys = Vec::with_capacity(set.keys.len());
    for (index, jwk) in set.keys.iter().enumerate() {
        let algorithm = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => Algorithm::RS256,
            AlgorithmParameters::EllipticCurve(params) if params.curve == EllipticCurve::P256 => Algorithm::ES256,
            AlgorithmParameters::OctetKeyPair(params) if params.curve == EllipticCurve::Ed25519 => Algorithm::EdDSA,
            _ => {
                return Err(format!(
                    "{}: key {index} is not an RSA, EC P-256 or Ed25519 public key (the HS256 secret has --auth-secret-file)",
                    path.display()
                ))
            }
        };
        let key = DecodingKey::from_jwk(jwk).map_err(|error| format!("{}: key {index}: {error}", path.display()))?;
        keys.push(PublicKey { kid: jwk.common.key_id.clone(), algorithm, key });
    }
    if keys.len() > 1 && keys.iter().any(|key| key.kid.is_none()) {
        return Err(format!("{}: with more than one key, every key needs a `kid`", path.display()));
    }
    Ok(keys)
}

/// Seconds since the Unix epoch.
pub fn now_unix() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs())
}

/// Mints an HS256 token (`ordo token`, the demo's users, tests).
pub fn mint(
    secret: &[u8],
    role_claim: &str,
    sub: &str,
    role: Role,
    ttl_secs: u64,
    extra: &serde_json::Map<String, Json>,
) -> String {
    let now = now_unix();
    let mut claims = extra.clone();
    claims.insert("sub".to_owned(), sub.into());
    claims.insert(role_claim.to_owned(), role.as_str().into());
    claims.insert("iat".to_owned(), now.into());
    claims.insert("exp".to_owned(), (now + ttl_secs).into());
    jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(secret))
        .expect("HS256 signing cannot fail")
}

/// A session token: 128 bits from the OS's CSPRNG, as 32 hex digits.
pub fn new_session_token() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the OS's random source");
    hex(&bytes)
}

/// The bearer token of an `Authorization` header, if it has one.
pub fn bearer(header: &str) -> Option<&str> {
    let (scheme, token) = header.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verifier(secret: &[u8]) -> Verifier {
        Verifier::new(&AuthOptions { secret: Some(secret.to_vec()), ..AuthOptions::default() }).unwrap()
    }

    #[test]
    fn a_minted_token_verifies_and_names_its_subject() {
        let secret = b"0123456789abcdef0123456789abcdef";
        let token = mint(secret, "role", "u42", Role::Writer, 60, &serde_json::Map::new());
        let identity = verifier(secret).verify(&token).unwrap();
        assert_eq!((identity.sub.as_str(), identity.role), ("u42", Role::Writer));
        let other = verifier(b"another secret of thirty-two byte").verify(&token);
        assert_eq!(other.unwrap_err(), AuthFailure::BadSignature);
    }

    #[test]
    fn identity_keys_ignore_time_claims() {
        let secret = b"0123456789abcdef0123456789abcdef";
        let a =
            verifier(secret).verify(&mint(secret, "role", "u1", Role::Reader, 60, &serde_json::Map::new())).unwrap();
        let b =
            verifier(secret).verify(&mint(secret, "role", "u1", Role::Reader, 600, &serde_json::Map::new())).unwrap();
        let c =
            verifier(secret).verify(&mint(secret, "role", "u1", Role::Writer, 60, &serde_json::Map::new())).unwrap();
        assert_eq!(a.key, b.key);
        assert_ne!(a.key, c.key);
    }

    #[test]
    fn bearer_takes_the_token_of_any_case_of_scheme() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer abc "), Some("abc"));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("Bearer"), None);
    }

    #[test]
    fn base64url_decodes_as_jwt_segments_are_written() {
        let mut out = [0u8; 16];
        for (text, bytes) in [("", &b""[..]), ("YQ", b"a"), ("YWI", b"ab"), ("YWJj", b"abc"), ("-_8", &[0xfb, 0xff])] {
            assert_eq!(decode_base64url(text.as_bytes(), &mut out), Some(bytes), "{text}");
        }
        assert_eq!(decode_base64url(b"YWJjZ", &mut out), None, "a lone last character");
        assert_eq!(decode_base64url(b"YW=j", &mut out), None, "padding is not base64url");
        assert_eq!(decode_base64url(b"YWJjYWJjYWJjYWJjYWJjYWJj", &mut out), None, "past the buffer");
    }

    /// A JWKS document repeating a key (a key's `x`, twice with two values) has no
    /// one key to verify with: refused at start.
    #[test]
    fn a_jwks_document_repeating_a_key_is_refused() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/keys/jwks.json");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(load_jwks(&path).is_ok());
        let other_key = "\"x\": \"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\", \"x\"";
        let repeated = text.replacen("\"x\"", other_key, 1);
        assert_ne!(repeated, text);
        // A parse alone keeps one copy and goes on: the refusal is the repetition's.
        assert!(serde_json::from_str::<JwkSet>(&repeated).is_ok());
        let dir = std::env::temp_dir().join(format!("ordo-jwks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("jwks.json");
        std::fs::write(&file, repeated).unwrap();
        let error = load_jwks(&file).err().expect("a repeated key is refused");
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(error.contains("repeats the key `x`"), "{error}");
    }
}
