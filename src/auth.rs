//! Who may call: JWT verification, scopes, queue patterns, the local secret, the cluster credential.
//!
//! A token is a JWT signed with HS256 (a shared secret) or RS256, ES256 or EdDSA (public keys from PEM files);
//! several keys may be configured at once and a token's `kid` header picks one, so keys can be rotated. `exp` is
//! required, and so are `iss` and `aud` when an issuer or audience is configured; `exp`, `nbf`, `iss` and `aud` are
//! checked with a small leeway. Claims: `sub` (who), `tid` (the
//! tenant every task, queue, key and dead letter of the caller belongs to), `scope` (space separated) or
//! `scopes` (a list) of `enqueue`, `work`, `read`, `admin`, and optionally `queues`: the queue name patterns
//! (`*` matches any run of characters) the token may use.
//!
//! With `auth = "none"` (never the default) every caller is the `default` tenant with every scope.
//!
//! Peers prove themselves on the Raft port with a credential derived from the cluster secret; a client token
//! is not such a credential.
//!
//! Refusals are [`AuthError`] values; what they look like on the wire (reason codes, gRPC codes, HTTP statuses) is
//! the API layer's business (`api/error.rs`): nothing here knows about it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::{AuthMode, Config};

/// The tenant of every caller when authentication is off.
pub const DEFAULT_TENANT: &str = "default";
/// The key id of the secret a single node creates in its data directory.
pub const LOCAL_KID: &str = "local";
/// Where, under the data directory, that secret lives.
pub const LOCAL_SECRET_FILE: &str = "auth/local.hs256";
/// The metadata header carrying a peer's cluster credential on the Raft port.
pub use raftq_proto::reason::header::CLUSTER_AUTH as CLUSTER_AUTH_HEADER;

/// Why a caller is refused: no acceptable token (unauthenticated), or a token that does not allow this
/// (permission denied).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("a bearer token is required (authorization: Bearer <jwt>)")]
    Missing,
    /// Not a JWT, or a claim is missing or malformed.
    #[error("{0}")]
    Invalid(String),
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet (nbf)")]
    NotYetValid,
    /// The issuer is not the configured one, or the token names none.
    #[error("{0}")]
    WrongIssuer(String),
    /// The audience is not the configured one, or the token names none.
    #[error("{0}")]
    WrongAudience(String),
    #[error("no configured key for {0}")]
    UnknownKey(String),
    #[error("{0}")]
    BadSignature(String),
    #[error("this operation needs the '{}' scope, which the token does not grant", .0.name())]
    ScopeRequired(Scope),
    #[error("queue '{0}' is outside the queues this token may use")]
    QueueNotAllowed(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Enqueue,
    Work,
    Read,
    Admin,
}

impl Scope {
    pub const ALL: [Scope; 4] = [Scope::Enqueue, Scope::Work, Scope::Read, Scope::Admin];

    pub fn name(self) -> &'static str {
        match self {
            Scope::Enqueue => "enqueue",
            Scope::Work => "work",
            Scope::Read => "read",
            Scope::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|c| c.name() == s)
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// An authenticated caller: identity, tenant, what it may do, and until when.
#[derive(Clone, Debug)]
pub struct Caller {
    pub subject: String,
    pub tenant: String,
    /// The token it presented, passed on when its requests go to the leader.
    pub token: String,
    scopes: u8,
    /// Queue name patterns; `None`: every queue.
    queues: Option<Arc<[String]>>,
    /// When the token expires (ms since the epoch); streams are closed then.
    pub expires_at_ms: Option<u64>,
}

impl Caller {
    /// The caller when authentication is off: the default tenant, every scope, every queue.
    pub fn anonymous(token: &str) -> Caller {
        Caller {
            subject: "anonymous".into(),
            tenant: DEFAULT_TENANT.into(),
            token: token.to_string(),
            scopes: u8::MAX,
            queues: None,
            expires_at_ms: None,
        }
    }

    pub fn has(&self, scope: Scope) -> bool {
        self.scopes & scope.bit() != 0
    }

    /// Refused unless the token grants `scope`.
    pub fn require(&self, scope: Scope) -> Result<(), AuthError> {
        if self.has(scope) {
            return Ok(());
        }
        Err(AuthError::ScopeRequired(scope))
    }

    /// Whether the token names the queues it may use (else it may use all of its tenant's).
    pub fn limited_to_queues(&self) -> bool {
        self.queues.is_some()
    }

    pub fn may_use_queue(&self, queue: &str) -> bool {
        self.queues.as_ref().is_none_or(|ps| ps.iter().any(|p| pattern_matches(p, queue)))
    }

    /// Refused unless the token's queue patterns admit `queue`.
    pub fn check_queue(&self, queue: &str) -> Result<(), AuthError> {
        if self.may_use_queue(queue) {
            return Ok(());
        }
        Err(AuthError::QueueNotAllowed(queue.to_string()))
    }
}

/// Whether `name` matches `pattern`, where `*` stands for any run of characters (also none).
pub fn pattern_matches(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

/// The claims raftq reads from a token (others are ignored).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Claims {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tid: Option<String>,
    /// OAuth style: scopes separated by spaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scopes: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queues: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exp: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iat: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iss: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aud: Option<serde_json::Value>,
}

struct Key {
    kid: String,
    alg: Algorithm,
    key: DecodingKey,
}

struct Jwt {
    keys: Vec<Key>,
    issuer: Option<String>,
    audience: Option<String>,
    leeway_s: u64,
}

/// Turns bearer tokens into callers.
pub struct Authenticator {
    jwt: Option<Jwt>,
}

fn valid_tenant(t: &str) -> bool {
    !t.is_empty() && t.len() <= 64 && t.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// The algorithm a key file is for, from its name `<kid>.<alg>` or `<kid>.<alg>.pem`.
fn parse_alg(name: &str) -> Option<Algorithm> {
    match name.to_ascii_lowercase().as_str() {
        "hs256" => Some(Algorithm::HS256),
        "rs256" => Some(Algorithm::RS256),
        "es256" => Some(Algorithm::ES256),
        "eddsa" | "ed25519" => Some(Algorithm::EdDSA),
        _ => None,
    }
}

fn load_key(kid: &str, alg: Algorithm, path: &Path) -> Result<Key, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("auth key {}: {e}", path.display()))?;
    let bad = |e: jsonwebtoken::errors::Error| format!("auth key {}: {e}", path.display());
    let key = match alg {
        Algorithm::HS256 => {
            let secret = trim_secret(&bytes);
            if secret.len() < 32 {
                return Err(format!("auth key {}: an HS256 secret must be at least 32 bytes", path.display()));
            }
            DecodingKey::from_secret(secret)
        }
        Algorithm::RS256 => DecodingKey::from_rsa_pem(&bytes).map_err(bad)?,
        Algorithm::ES256 => DecodingKey::from_ec_pem(&bytes).map_err(bad)?,
        Algorithm::EdDSA => DecodingKey::from_ed_pem(&bytes).map_err(bad)?,
        other => return Err(format!("auth key {}: algorithm {other:?} is not supported", path.display())),
    };
    Ok(Key { kid: kid.to_string(), alg, key })
}

/// A secret file's bytes without surrounding whitespace (files usually end with a newline).
pub fn trim_secret(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(bytes.len());
    let end = bytes.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(start, |i| i + 1);
    &bytes[start..end]
}

/// The keys of a directory: every file named `<kid>.<alg>` or `<kid>.<alg>.pem` (alg: hs256, rs256, es256,
/// eddsa). Other files are skipped with a warning.
fn load_dir(dir: &Path) -> Result<Vec<Key>, String> {
    let mut keys = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| format!("auth_keys_dir {}: {e}", dir.display()))?;
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for path in paths {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
        if name.starts_with('.') || !path.is_file() {
            continue;
        }
        let stem = name.strip_suffix(".pem").unwrap_or(name);
        match stem.rsplit_once('.').and_then(|(kid, alg)| parse_alg(alg).map(|a| (kid, a))) {
            Some((kid, alg)) if !kid.is_empty() => keys.push(load_key(kid, alg, &path)?),
            _ => {
                tracing::warn!(file = %path.display(), "not a key file (<kid>.<hs256|rs256|es256|eddsa>[.pem]); skipped")
            }
        }
    }
    Ok(keys)
}

/// Creates (once) and reads the secret of a node started with authentication on and no keys configured.
pub fn local_secret(data_dir: &Path) -> std::io::Result<Vec<u8>> {
    ensure_secret(&data_dir.join(LOCAL_SECRET_FILE))
}

/// Reads the secret at `path`, creating a random one first when there is none. Creation is atomic and the
/// first creator wins, so nodes sharing a volume may all start at once and agree.
pub fn ensure_secret(path: &Path) -> std::io::Result<Vec<u8>> {
    if let Ok(b) = std::fs::read(path) {
        return Ok(trim_secret(&b).to_vec());
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let secret: String = (0..4).map(|_| format!("{:016x}", rand::random::<u64>())).collect();
    let tmp = path.with_extension(format!("tmp{:08x}", rand::random::<u32>()));
    {
        use std::io::Write;
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        let mut f = opts.open(&tmp)?;
        f.write_all(secret.as_bytes())?;
        f.write_all(b"\n")?;
        f.sync_all()?;
    }
    // A hard link never replaces: whoever links first created the secret everyone reads.
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            tracing::info!(file = %path.display(), "created a token secret; mint tokens with `raftq token issue`")
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    Ok(trim_secret(&std::fs::read(path)?).to_vec())
}

impl Authenticator {
    pub fn none() -> Authenticator {
        Authenticator { jwt: None }
    }

    /// The verifier a node's configuration asks for; a single node with no keys configured gets a secret of its
    /// own in its data directory.
    pub fn from_config(cfg: &Config) -> Result<Authenticator, String> {
        if cfg.auth == AuthMode::None {
            return Ok(Authenticator::none());
        }
        let mut keys = Vec::new();
        if let Some(dir) = &cfg.auth_keys_dir {
            keys.extend(load_dir(dir)?);
        }
        if let Some(path) = &cfg.auth_hs256_secret_file {
            if cfg.auth_hs256_secret_create {
                ensure_secret(path).map_err(|e| format!("creating {}: {e}", path.display()))?;
            }
            keys.push(load_key("hs256", Algorithm::HS256, path)?);
        }
        if let Some(s) = &cfg.auth_hs256_secret {
            if s.len() < 32 {
                return Err("auth_hs256_secret must be at least 32 bytes".into());
            }
            keys.push(Key { kid: "hs256".into(), alg: Algorithm::HS256, key: DecodingKey::from_secret(s.as_bytes()) });
        }
        if keys.is_empty() {
            if cfg.peers.len() > 1 {
                return Err("a cluster with authentication needs the same keys on every node: set \
                            auth_hs256_secret_file or auth_keys_dir (or run with --auth none)"
                    .into());
            }
            let secret = local_secret(&cfg.data_dir).map_err(|e| format!("creating the local secret: {e}"))?;
            keys.push(Key { kid: LOCAL_KID.into(), alg: Algorithm::HS256, key: DecodingKey::from_secret(&secret) });
        }
        let mut seen = HashMap::new();
        for k in &keys {
            if seen.insert(k.kid.clone(), ()).is_some() {
                return Err(format!("two auth keys have the key id '{}'", k.kid));
            }
        }
        Ok(Authenticator {
            jwt: Some(Jwt {
                keys,
                issuer: cfg.auth_issuer.clone(),
                audience: cfg.auth_audience.clone(),
                leeway_s: cfg.auth_leeway_s,
            }),
        })
    }

    pub fn enabled(&self) -> bool {
        self.jwt.is_some()
    }

    /// The caller a bearer token stands for, or why it is refused.
    pub fn authenticate(&self, token: &str) -> Result<Caller, AuthError> {
        let Some(jwt) = &self.jwt else { return Ok(Caller::anonymous(token)) };
        if token.is_empty() {
            return Err(AuthError::Missing);
        }
        let header = jsonwebtoken::decode_header(token).map_err(|e| AuthError::Invalid(format!("not a JWT: {e}")))?;
        let candidates: Vec<&Key> = match &header.kid {
            Some(kid) => jwt.keys.iter().filter(|k| &k.kid == kid).collect(),
            None => jwt.keys.iter().filter(|k| k.alg == header.alg).collect(),
        };
        if candidates.is_empty() {
            let what = header.kid.as_deref().map(|k| format!("key id '{k}'")).unwrap_or(format!("{:?}", header.alg));
            return Err(AuthError::UnknownKey(what));
        }
        // A configured issuer or audience is required, not only checked when the token happens to name one.
        let mut required = vec!["exp"];
        required.extend(jwt.issuer.as_ref().map(|_| "iss"));
        required.extend(jwt.audience.as_ref().map(|_| "aud"));
        let mut last = None;
        for key in candidates {
            let mut v = Validation::new(key.alg);
            v.leeway = jwt.leeway_s;
            v.validate_nbf = true;
            v.set_required_spec_claims(&required);
            if let Some(iss) = &jwt.issuer {
                v.set_issuer(&[iss]);
            }
            match &jwt.audience {
                Some(aud) => v.set_audience(&[aud]),
                None => v.validate_aud = false,
            }
            match jsonwebtoken::decode::<Claims>(token, &key.key, &v) {
                Ok(data) => return caller_of(token, data.claims),
                Err(e) => last = Some(e),
            }
        }
        let e = last.expect("one key was tried");
        Err(match e.kind() {
            ErrorKind::ExpiredSignature => AuthError::Expired,
            ErrorKind::ImmatureSignature => AuthError::NotYetValid,
            ErrorKind::InvalidIssuer => AuthError::WrongIssuer("the token's issuer (iss) is not accepted".into()),
            ErrorKind::InvalidAudience => AuthError::WrongAudience("the token's audience (aud) is not accepted".into()),
            ErrorKind::MissingRequiredClaim(c) if c == "iss" => {
                AuthError::WrongIssuer("the token names no issuer (iss), and this server requires one".into())
            }
            ErrorKind::MissingRequiredClaim(c) if c == "aud" => {
                AuthError::WrongAudience("the token names no audience (aud), and this server requires one".into())
            }
            ErrorKind::InvalidSignature => {
                AuthError::BadSignature("the token's signature does not verify with the configured key".into())
            }
            ErrorKind::InvalidAlgorithm => {
                AuthError::BadSignature("the token's algorithm does not match its key".into())
            }
            ErrorKind::MissingRequiredClaim(c) => AuthError::Invalid(format!("the token has no '{c}' claim")),
            _ => AuthError::Invalid(format!("the token cannot be read: {e}")),
        })
    }
}

fn caller_of(token: &str, c: Claims) -> Result<Caller, AuthError> {
    let tenant = c.tid.ok_or_else(|| AuthError::Invalid("the token has no 'tid' (tenant) claim".into()))?;
    if !valid_tenant(&tenant) {
        return Err(AuthError::Invalid("the token's tenant must be 1 to 64 of [A-Za-z0-9._-]".into()));
    }
    let mut scopes = 0u8;
    let named =
        c.scope.iter().flat_map(|s| s.split_whitespace().map(String::from)).chain(c.scopes.into_iter().flatten());
    for s in named {
        // Unknown scopes are other services' business: ignored.
        if let Some(s) = Scope::parse(&s) {
            scopes |= s.bit();
        }
    }
    Ok(Caller {
        subject: c.sub.unwrap_or_default(),
        tenant,
        token: token.to_string(),
        scopes,
        queues: c.queues.map(Into::into),
        expires_at_ms: c.exp.map(|e| e.saturating_mul(1000)),
    })
}

/// What `raftq token issue` puts in a token.
pub struct TokenSpec<'a> {
    pub subject: &'a str,
    pub tenant: &'a str,
    pub scopes: &'a [Scope],
    pub queues: Option<Vec<String>>,
    pub ttl_s: u64,
    pub issuer: Option<&'a str>,
    pub audience: Option<&'a str>,
}

/// Signs an HS256 token with `secret`, naming key id `kid` in its header when given (without one, the server
/// tries each HS256 key it has).
pub fn issue(secret: &[u8], kid: Option<&str>, spec: &TokenSpec<'_>) -> Result<String, String> {
    let now = jsonwebtoken::get_current_timestamp();
    let claims = Claims {
        sub: Some(spec.subject.to_string()),
        tid: Some(spec.tenant.to_string()),
        scope: Some(spec.scopes.iter().map(|s| s.name()).collect::<Vec<_>>().join(" ")),
        queues: spec.queues.clone(),
        exp: Some(now + spec.ttl_s),
        iat: Some(now),
        nbf: Some(now),
        iss: spec.issuer.map(String::from),
        aud: spec.audience.map(|a| serde_json::Value::String(a.to_string())),
        ..Default::default()
    };
    let mut header = Header::new(Algorithm::HS256);
    header.kid = kid.map(String::from);
    jsonwebtoken::encode(&header, &claims, &EncodingKey::from_secret(secret)).map_err(|e| e.to_string())
}

/// A short-lived token with every scope for tenant `default`, minted from the local node's secret when this
/// user can read it: the CLI's fallback when no token is given, so a local single node needs no set-up.
pub fn local_cli_token(data_dir: &Path) -> Result<Option<String>, String> {
    // The secret file the environment names (as it names it to a node, e.g. inside its container), else the
    // local node's own secret.
    let (path, kid) = match std::env::var_os("RAFTQ_AUTH_HS256_SECRET_FILE") {
        Some(p) => (PathBuf::from(p), None),
        None => (data_dir.join(LOCAL_SECRET_FILE), Some(LOCAL_KID)),
    };
    let Ok(bytes) = std::fs::read(&path) else { return Ok(None) };
    let spec = TokenSpec {
        subject: "raftq-cli",
        tenant: DEFAULT_TENANT,
        scopes: &Scope::ALL,
        queues: None,
        ttl_s: 3600,
        issuer: None,
        audience: None,
    };
    issue(trim_secret(&bytes), kid, &spec)
        .map(Some)
        .map_err(|e| format!("minting a token from {}: {e}", path.display()))
}

/// The credential a peer presents on the Raft port: a digest of the cluster secret (the secret itself never
/// travels).
pub fn cluster_credential(secret: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(b"raftq-raft-port-v1\0");
    h.update(secret);
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Equal in time independent of where the inputs differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The cluster secret of a node: configured, or else the HS256 secret tokens are signed with (every node of a
/// cluster shares it), or else none (the Raft port is then open: only with `--auth none`, or on a single node).
pub fn cluster_secret(cfg: &Config) -> Result<Option<Vec<u8>>, String> {
    if let Some(s) = &cfg.cluster_secret {
        return Ok(Some(s.as_bytes().to_vec()));
    }
    if let Some(p) = &cfg.cluster_secret_file {
        let b = std::fs::read(p).map_err(|e| format!("cluster_secret_file {}: {e}", p.display()))?;
        return Ok(Some(trim_secret(&b).to_vec()));
    }
    if cfg.auth == AuthMode::None {
        return Ok(None);
    }
    if let Some(p) = &cfg.auth_hs256_secret_file {
        let b = if cfg.auth_hs256_secret_create { ensure_secret(p) } else { std::fs::read(p) };
        let b = b.map_err(|e| format!("auth_hs256_secret_file {}: {e}", p.display()))?;
        return Ok(Some(trim_secret(&b).to_vec()));
    }
    if let Some(s) = &cfg.auth_hs256_secret {
        return Ok(Some(s.as_bytes().to_vec()));
    }
    if cfg.peers.len() > 1 {
        return Err("a cluster with authentication needs a cluster secret for its Raft port: set \
                    cluster_secret_file (or auth_hs256_secret_file, which then serves both)"
            .into());
    }
    // A single node: its own local secret, so a node that was never given the secret cannot disturb it.
    Ok(Some(local_secret(&cfg.data_dir).map_err(|e| format!("creating the local secret: {e}"))?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_with_stars() {
        assert!(pattern_matches("emails", "emails"));
        assert!(!pattern_matches("emails", "emails2"));
        assert!(pattern_matches("reports.*", "reports.daily"));
        assert!(pattern_matches("reports.*", "reports."));
        assert!(!pattern_matches("reports.*", "report"));
        assert!(pattern_matches("*", "anything"));
        assert!(pattern_matches("a*b*c", "aXXbYYc"));
        assert!(pattern_matches("a*b*c", "abc"));
        assert!(!pattern_matches("a*b*c", "acb"));
        assert!(!pattern_matches("*.x", "x"));
        assert!(pattern_matches("*b", "bb"));
    }

    #[test]
    fn scopes_come_from_either_claim() {
        let c = Claims {
            tid: Some("t1".into()),
            scope: Some("enqueue read other".into()),
            scopes: Some(vec!["admin".into()]),
            ..Default::default()
        };
        let caller = caller_of("x", c).unwrap();
        assert!(caller.has(Scope::Enqueue) && caller.has(Scope::Read) && caller.has(Scope::Admin));
        assert!(!caller.has(Scope::Work));
        assert_eq!(caller.require(Scope::Work).unwrap_err(), AuthError::ScopeRequired(Scope::Work));
    }

    /// The documented format of a created secret file: 64 hex characters, used as text (not hex-decoded), with
    /// surrounding whitespace stripped.
    #[test]
    fn a_created_secret_is_hex_text_used_as_it_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.hs256");
        let cfg =
            Config { auth_hs256_secret_file: Some(path.clone()), auth_hs256_secret_create: true, ..Config::default() };
        let auth = Authenticator::from_config(&cfg).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let secret = text.trim();
        assert_eq!(secret.len(), 64, "{text:?}");
        assert!(secret.bytes().all(|b| b.is_ascii_hexdigit()), "{text:?}");
        let spec = TokenSpec {
            subject: "s",
            tenant: "t",
            scopes: &[Scope::Read],
            queues: None,
            ttl_s: 60,
            issuer: None,
            audience: None,
        };
        // The file's text with a newline, as `echo` or an editor leaves it, signs valid tokens.
        std::fs::write(&path, format!("{secret}\n")).unwrap();
        let auth_nl = Authenticator::from_config(&Config { auth_hs256_secret_create: false, ..cfg.clone() }).unwrap();
        let token = issue(secret.as_bytes(), None, &spec).unwrap();
        assert_eq!(auth.authenticate(&token).unwrap().tenant, "t");
        assert_eq!(auth_nl.authenticate(&token).unwrap().tenant, "t");
        // Signing with the hex-decoded bytes is the documented mistake.
        let decoded: Vec<u8> =
            (0..secret.len()).step_by(2).map(|i| u8::from_str_radix(&secret[i..i + 2], 16).unwrap()).collect();
        let wrong = issue(&decoded, None, &spec).unwrap();
        assert!(matches!(auth.authenticate(&wrong).unwrap_err(), AuthError::BadSignature(_)));
    }

    #[test]
    fn a_token_needs_a_well_formed_tenant() {
        let none = Claims { scope: Some("read".into()), ..Default::default() };
        assert!(matches!(caller_of("x", none).unwrap_err(), AuthError::Invalid(_)));
        let bad = Claims { tid: Some("a/b".into()), ..Default::default() };
        assert!(matches!(caller_of("x", bad).unwrap_err(), AuthError::Invalid(_)));
    }

    #[test]
    fn credentials_compare_whole() {
        let a = cluster_credential(b"one secret that is long enough..");
        assert!(constant_time_eq(a.as_bytes(), cluster_credential(b"one secret that is long enough..").as_bytes()));
        assert!(!constant_time_eq(a.as_bytes(), cluster_credential(b"another").as_bytes()));
        assert!(!constant_time_eq(b"ab", b"abc"));
    }
}
