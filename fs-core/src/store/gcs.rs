//! `GcsStore`: the bucket over the GCS JSON API, through the `gcloud-storage` crate.
//!
//! Why this crate and not the official `google-cloud-storage`: the official crate does object
//! metadata (list, get, delete, compose, rewrite) only over gRPC v2, which no local emulator
//! serves, and its resumable uploads lose the port in the Host header against an emulator that
//! is not on port 80. `gcloud-storage` speaks JSON/HTTP for everything and works against
//! fake-gcs-server on any port, so the same code path is tested locally and used in production.
//!
//! Every request runs inside a `gcs` tracing span with its operation, key and duration, and is
//! retried per [`super::retry`]. Each HTTP attempt is counted and timed in [`crate::metrics`]
//! by operation. Credentials are never logged, and neither are resumable session URLs: whoever
//! holds one can write the object, so every error message is stripped of the request's URL
//! query and scrubbed of secret parameters ([`redact_url`], [`scrub`]) before it leaves this
//! module.

use std::future::Future;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use futures::TryStreamExt;
use gcloud_storage::client::{Client, ClientConfig};
use gcloud_storage::http::objects::compose::{ComposeObjectRequest, ComposingTargets};
use gcloud_storage::http::objects::copy::CopyObjectRequest;
use gcloud_storage::http::objects::delete::DeleteObjectRequest;
use gcloud_storage::http::objects::download::Range as GcsRange;
use gcloud_storage::http::objects::get::GetObjectRequest;
use gcloud_storage::http::objects::list::ListObjectsRequest;
use gcloud_storage::http::objects::patch::PatchObjectRequest;
use gcloud_storage::http::objects::upload::{UploadObjectRequest, UploadType};
use gcloud_storage::http::objects::{Object, SourceObjects};
use gcloud_storage::http::resumable_upload_client::{ChunkSize, UploadStatus};
use gcloud_storage::http::Error as GcsError;
use tracing::Instrument;

use super::range_get::{Got, RangeGetter, TokenFn};
use super::retry::{with_retry, RetryPolicy};
use super::{
    decode_crc32c, encode_crc32c, ByteStream, ChunkOutcome, ListPage, ListRequest, ObjectMeta,
    ObjectStore, Precondition, ResumableSession, StoreError, StoreErrorKind, StoreResult,
    WriteOptions,
};

/// How the client proves who it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// Application Default Credentials: `GOOGLE_APPLICATION_CREDENTIALS`, gcloud's ADC file,
    /// then the GCE metadata server.
    ApplicationDefault,
    /// A service-account or authorized-user JSON key file.
    KeyFile(PathBuf),
    /// No credentials: public buckets and emulators.
    Anonymous,
}

/// Where the JSON API lives and how to authenticate to it.
#[derive(Debug, Clone)]
pub struct GcsOptions {
    /// Base URL, e.g. `https://storage.googleapis.com` or `http://127.0.0.1:4443`.
    pub endpoint: String,
    pub credentials: Credentials,
    pub retry: RetryPolicy,
    /// What the user should know before the mount starts (the environment chose the
    /// endpoint, a key file others can read), said on the terminal and in the log.
    pub notes: Vec<String>,
}

/// The variable emulators and Google's own clients take an emulator's `host:port` from.
pub const EMULATOR_VAR: &str = "STORAGE_EMULATOR_HOST";

impl GcsOptions {
    pub const DEFAULT_ENDPOINT: &'static str = "https://storage.googleapis.com";

    /// Resolves endpoint and credentials: an explicit `endpoint` wins, then
    /// `STORAGE_EMULATOR_HOST`, then the public endpoint.
    ///
    /// A token sent in clear text can be replayed by anyone on the path, so credentials go
    /// only over `https://`, or plain `http://` to a loopback address, unless `insecure` (the
    /// user's explicit `--insecure-endpoint`). An explicit endpoint must carry its scheme. The
    /// variable keeps its usual meaning (`host:port` of a plain-HTTP emulator) and is always
    /// anonymous, so it is refused together with a key file: an inherited variable must not
    /// quietly send a real key's tokens to whatever host it names.
    pub fn resolve(
        endpoint: Option<String>,
        key_file: Option<PathBuf>,
        anonymous: bool,
        insecure: bool,
    ) -> Result<Self, String> {
        let emulator = std::env::var(EMULATOR_VAR).ok().filter(|s| !s.is_empty());
        Self::resolve_with(endpoint, key_file, anonymous, insecure, emulator)
    }

    /// [`Self::resolve`], with the variable's value given.
    fn resolve_with(
        endpoint: Option<String>,
        key_file: Option<PathBuf>,
        anonymous: bool,
        insecure: bool,
        emulator: Option<String>,
    ) -> Result<Self, String> {
        if let Some(e) = &endpoint {
            if !e.contains("://") {
                return Err(format!(
                    "--endpoint {e} needs a scheme: https://{e}, or http://{e} for an emulator"
                ));
            }
        }
        let mut notes = Vec::new();
        let from_env = match (&endpoint, emulator) {
            (None, Some(host)) => Some(host),
            _ => None,
        };
        if let Some(host) = &from_env {
            if key_file.is_some() {
                return Err(format!(
                    "{EMULATOR_VAR}={host} points bucketdrive at an emulator, which is sent no \
                     credentials, but --key-file was given too: unset {EMULATOR_VAR} to use the \
                     key file with the real endpoint (or give --endpoint), or drop --key-file"
                ));
            }
        }
        let endpoint = match (endpoint, &from_env) {
            (Some(e), _) => e,
            (None, Some(host)) if host.contains("://") => host.clone(),
            (None, Some(host)) => format!("http://{host}"),
            (None, None) => Self::DEFAULT_ENDPOINT.to_string(),
        };
        let endpoint = endpoint.trim_end_matches('/').to_string();
        if let Some(host) = &from_env {
            notes.push(format!(
                "{EMULATOR_VAR}={host} is set: using the emulator at {endpoint}, anonymously, \
                 instead of Google Cloud Storage"
            ));
        }
        let credentials = if anonymous || from_env.is_some() {
            Credentials::Anonymous
        } else if let Some(k) = key_file {
            notes.extend(key_file_note(&k));
            if let Some(uri) = key_token_uri(&k) {
                if !credentials_safe_at(&uri)? && !insecure {
                    return Err(format!(
                        "refusing key file {}: its token_uri {uri} would receive the key's \
                         signed assertion (or refresh token) in clear text; use an https:// \
                         token_uri, or --insecure-endpoint",
                        k.display()
                    ));
                }
            }
            Credentials::KeyFile(k)
        } else {
            Credentials::ApplicationDefault
        };
        if credentials != Credentials::Anonymous {
            match (credentials_safe_at(&endpoint)?, insecure) {
                (true, _) => {}
                (false, true) => notes.push(format!(
                    "--insecure-endpoint: credentials go to {endpoint} in clear text"
                )),
                (false, false) => {
                    return Err(format!(
                        "refusing to send credentials to {endpoint} in clear text: use an \
                         https:// endpoint, --anonymous (public buckets, emulators), or \
                         --insecure-endpoint to send them anyway"
                    ))
                }
            }
        }
        Ok(GcsOptions {
            endpoint,
            credentials,
            retry: RetryPolicy::default(),
            notes,
        })
    }
}

/// Whether a token may be sent to `endpoint`: over TLS, or to this machine (plain HTTP to a
/// loopback address never leaves it).
fn credentials_safe_at(endpoint: &str) -> Result<bool, String> {
    let url = reqwest::Url::parse(endpoint).map_err(|e| format!("endpoint {endpoint}: {e}"))?;
    let host = url.host_str().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|a| a.is_loopback());
    Ok(match url.scheme() {
        "https" => true,
        "http" => loopback,
        other => return Err(format!("endpoint {endpoint}: unknown scheme {other}")),
    })
}

/// The `token_uri` a key file names, if it can be read and names one: where the key's signed
/// assertion (or an authorized user's refresh token) is posted for a token.
fn key_token_uri(path: &std::path::Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json.get("token_uri")?.as_str().map(str::to_string)
}

/// A warning when the key file can be read by users other than its owner, as ssh gives for
/// a private key: anyone who can read it can act as the service account.
fn key_file_note(path: &std::path::Path) -> Option<String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
        (mode & 0o077 != 0).then(|| {
            format!(
                "key file {} can be read by other users (mode {mode:03o}): anyone who can read \
                 it can act as its account; chmod 600 it",
                path.display()
            )
        })
    }
    #[cfg(not(unix))]
    {
        // Windows: the file's ACL decides, which the profile directory normally keeps private.
        let _ = path;
        None
    }
}

/// A bucket on GCS (or on an emulator speaking its JSON API).
pub struct GcsStore {
    client: Client,
    bucket: String,
    retry: RetryPolicy,
    /// Ranged GETs received straight into the part's buffer ([`super::range_get`]); `None`
    /// where the client must send them (through a proxy).
    ranges: Option<RangeGetter>,
}

impl GcsStore {
    /// Builds a client. Fails on unreadable or invalid credentials; does not touch the bucket.
    pub async fn connect(bucket: &str, opts: &GcsOptions) -> StoreResult<Self> {
        super::tls::install_crypto_provider();
        let mut http = reqwest::Client::builder();
        if opts.endpoint.starts_with("http://") {
            // Plain HTTP is allowed for credentials only because it stays on this machine: an
            // HTTP_PROXY from the environment would carry the bearer token across the network.
            http = http.no_proxy();
        }
        let http = http
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(64)
            .build()
            .map_err(|e| {
                StoreError::new(StoreErrorKind::Other, format!("building HTTP client: {e}"))
            })?;
        let base = ClientConfig {
            storage_endpoint: opts.endpoint.clone(),
            http: Some(reqwest_middleware::ClientBuilder::new(http).build()),
            ..Default::default()
        };
        let auth_err = |e: gcloud_storage::client::google_cloud_auth::error::Error| {
            StoreError::new(
                StoreErrorKind::PermissionDenied,
                scrub(&format!("credentials: {e}")),
            )
        };
        let config = match &opts.credentials {
            Credentials::Anonymous => base.anonymous(),
            Credentials::ApplicationDefault => base.with_auth().await.map_err(auth_err)?,
            Credentials::KeyFile(path) => {
                let file = gcloud_storage::client::google_cloud_auth::credentials::CredentialsFile::new_from_file(
                    path.to_string_lossy().into_owned(),
                )
                .await
                .map_err(|e| {
                    StoreError::new(
                        StoreErrorKind::PermissionDenied,
                        scrub(&format!("cannot use key file {}: {e}", path.display())),
                    )
                })?;
                base.with_credentials(file).await.map_err(auth_err)?
            }
        };
        let token: Option<TokenFn> = config.token_source_provider.as_ref().map(|p| {
            let source = p.token_source();
            let f: TokenFn = Arc::new(move || {
                let source = source.clone();
                Box::pin(async move { source.token().await.map_err(|e| scrub(&e.to_string())) })
            });
            f
        });
        let ranges = if opts.endpoint.starts_with("https://") && proxy_in_environment() {
            tracing::debug!("a proxy is set: ranged GETs go through the HTTP client");
            None
        } else {
            match RangeGetter::new(&opts.endpoint, bucket, token) {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::debug!(error = %e, "ranged GETs go through the HTTP client");
                    None
                }
            }
        };
        Ok(GcsStore {
            client: Client::new(config),
            bucket: bucket.to_string(),
            retry: opts.retry,
            ranges,
        })
    }

    /// Proves the bucket exists and the credentials may list it, with a one-line reason if not.
    pub async fn check_access(&self) -> Result<(), String> {
        let req = ListRequest {
            max_results: Some(1),
            ..Default::default()
        };
        match self.list(&req).await {
            Ok(_) => Ok(()),
            Err(e) => Err(match e.kind {
                StoreErrorKind::NotFound => format!("bucket {:?} does not exist", self.bucket),
                StoreErrorKind::PermissionDenied => {
                    format!("access to bucket {:?} denied: {}", self.bucket, e.message)
                }
                _ => format!("cannot reach bucket {:?}: {}", self.bucket, e.message),
            }),
        }
    }

    /// Runs one logical request with a span, a duration log, and retries. Each attempt is one
    /// HTTP request, and is counted and timed as one (the metrics see what GCS sees and bills;
    /// the log line sees the caller's wait, backoff included).
    async fn call<T, F, Fut>(&self, op: &'static str, key: &str, mut f: F) -> StoreResult<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = StoreResult<T>>,
    {
        let span = tracing::debug_span!("gcs", op, key, bucket = %self.bucket);
        async {
            let start = Instant::now();
            let attempt = || {
                let request = f();
                async move {
                    let sent = Instant::now();
                    let r = request.await;
                    let error = r.as_ref().err().map(|e| e.kind);
                    crate::metrics::store_request(op, sent.elapsed(), error);
                    r
                }
            };
            let r = with_retry(self.retry, op, key, attempt).await;
            let elapsed_ms = start.elapsed().as_secs_f64() * 1000.0;
            match &r {
                Ok(_) => tracing::debug!(elapsed_ms, "ok"),
                Err(e) => tracing::debug!(elapsed_ms, error = %e, "failed"),
            }
            r
        }
        .instrument(span)
        .await
    }

    fn upload_request(&self, pre: Precondition) -> UploadObjectRequest {
        UploadObjectRequest {
            bucket: self.bucket.clone(),
            if_generation_match: pre.if_generation_match(),
            ..Default::default()
        }
    }

    fn object_resource(&self, key: &str, opts: &WriteOptions) -> Object {
        Object {
            name: key.to_string(),
            bucket: self.bucket.clone(),
            content_type: opts.content_type.clone(),
            metadata: if opts.metadata.is_empty() {
                None
            } else {
                Some(opts.metadata.clone())
            },
            crc32c: opts.crc32c.map(encode_crc32c),
            ..Default::default()
        }
    }
}

/// Whether the environment names a proxy the HTTP client would send `https` requests
/// through (it reads the same variables), so ranged GETs must go through the client too.
fn proxy_in_environment() -> bool {
    ["HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|s| !s.is_empty()))
}

/// Classifies a client error once; every caller sees only [`StoreErrorKind`]. Messages are
/// made safe to log here, once, since they travel into retries, warnings and status lines.
fn classify(e: GcsError) -> StoreError {
    let (kind, message) = match e {
        GcsError::Response(r) => return StoreError::from_status(r.code, scrub(&r.message)),
        GcsError::HttpClient(e) | GcsError::RawResponse(e, _) => {
            match (e.status(), certificate_error(&e)) {
                (Some(s), _) => {
                    return StoreError::from_status(s.as_u16(), redact_url(e).to_string());
                }
                // Asking again gets the same certificate: no retry, and say what is wrong.
                (None, Some(why)) => (StoreErrorKind::Other, untrusted(&why, redact_url(e))),
                (None, None)
                    if e.is_timeout()
                        || e.is_connect()
                        || e.is_request()
                        || e.is_body()
                        || e.is_decode() =>
                {
                    (StoreErrorKind::Transient, redact_url(e).to_string())
                }
                (None, None) => (StoreErrorKind::Other, redact_url(e).to_string()),
            }
        }
        // A middleware error is an `anyhow` chain; its text is scrubbed below.
        GcsError::HttpMiddleware(e) => (StoreErrorKind::Transient, format!("{e:#}")),
        GcsError::TokenSource(e) => (StoreErrorKind::PermissionDenied, format!("token: {e}")),
        GcsError::InvalidRangeHeader(s) => (StoreErrorKind::InvalidArgument, s),
    };
    StoreError::new(kind, scrub(&message))
}

/// What rustls said of the server's certificate, if the request failed because it would not
/// trust it. rustls's error sits inside `io::Error`s (one in another), whose `source()` skips
/// what they wrap, so the walk goes into each one's inner error instead.
pub(super) fn certificate_error(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(
            tls @ (rustls::Error::InvalidCertificate(_)
            | rustls::Error::NoCertificatesPresented
            | rustls::Error::UnsupportedNameType),
        ) = err.downcast_ref::<rustls::Error>()
        {
            return Some(tls.to_string());
        }
        next = match err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => err.source(),
        };
    }
    None
}

/// What a request refused for its endpoint's certificate (`why`, from [`certificate_error`])
/// says, and what to do about it.
pub(super) fn untrusted(why: &str, what: impl std::fmt::Display) -> String {
    format!(
        "the endpoint's TLS certificate is not trusted ({why}); a private CA can be trusted \
         with SSL_CERT_FILE: {what}"
    )
}

/// Drops the query, the fragment and any user or password from the URL an HTTP error carries
/// (and prints in its message). The query of a resumable upload holds its `upload_id`, which
/// is all it takes to write to that upload; the path (bucket, object) stays, for diagnosis.
fn redact_url(mut e: reqwest::Error) -> reqwest::Error {
    if let Some(url) = e.url_mut() {
        url.set_query(None);
        url.set_fragment(None);
        let _ = url.set_username("");
        let _ = url.set_password(None);
    }
    e
}

/// Query parameters whose values are secrets, wherever they show up in a message.
const SECRET_PARAMS: &[&str] = &["upload_id", "access_token", "x-goog-signature", "signature"];

/// Replaces the value of every secret parameter (`name=value`, case-insensitive) in `text`
/// with `<redacted>`: a last guard for messages that quote a URL without going through
/// [`redact_url`], such as a server's own error text.
pub(crate) fn scrub(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        let hit = SECRET_PARAMS.iter().find_map(|p| {
            let key = format!("{p}=");
            let at_boundary = i == 0 || {
                let b = lower.as_bytes()[i - 1];
                !(b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            };
            (at_boundary && lower[i..].starts_with(&key)).then_some(key.len())
        });
        match hit {
            Some(len) => {
                out.push_str(&text[i..i + len]);
                out.push_str("<redacted>");
                i += len;
                while i < text.len()
                    && !matches!(text.as_bytes()[i], b'&' | b' ' | b')' | b'"' | b'\'' | b',')
                    && !text.as_bytes()[i].is_ascii_whitespace()
                {
                    i += 1;
                }
            }
            None => {
                let ch = text[i..].chars().next().map_or(1, char::len_utf8);
                out.push_str(&text[i..i + ch]);
                i += ch;
            }
        }
    }
    out
}

fn to_meta(o: Object) -> ObjectMeta {
    ObjectMeta {
        metadata_trimmed: false,
        crc32c: o.crc32c.as_deref().and_then(decode_crc32c),
        updated: o
            .updated
            .map(SystemTime::from)
            .unwrap_or(SystemTime::UNIX_EPOCH),
        size: o.size.max(0) as u64,
        generation: o.generation,
        metageneration: o.metageneration,
        content_type: o.content_type,
        metadata: o.metadata.unwrap_or_default(),
        key: o.name,
    }
}

/// GCS's limit on an object's custom metadata, keys and values together.
const CUSTOM_METADATA_LIMIT: usize = 8 * 1024;

impl GcsStore {
    /// The object resource of `key` (of `generation`, or the live one).
    async fn resource(&self, key: &str, generation: Option<i64>) -> StoreResult<Object> {
        let req = GetObjectRequest {
            bucket: self.bucket.clone(),
            object: key.to_string(),
            generation,
            ..Default::default()
        };
        self.call("head", key, || async {
            self.client.get_object(&req).await.map_err(classify)
        })
        .await
    }

    /// The body of a marked copy, and the source's metageneration it was read from: a copy
    /// request with a body takes every editable field from the body alone (none from the
    /// source), so each of them is read from the source generation first and sent back, the
    /// custom metadata with the mark added. `None`: the source's custom metadata leaves no room
    /// for the mark, and the copy goes without it (it is then never believed after a lost
    /// answer, nor taken back).
    async fn marked_resource(
        &self,
        src: &str,
        generation: i64,
        token: &str,
    ) -> StoreResult<Option<(Object, i64)>> {
        let o = self.resource(src, Some(generation)).await?;
        let metageneration = o.metageneration;
        let body = marked_body(o, token);
        if body.is_none() {
            tracing::warn!(key = %src, "no room for a rename's mark in the object's metadata; copied without it");
        }
        Ok(body.map(|b| (b, metageneration)))
    }
}

/// The copy body that keeps every editable field of the source `o` and adds the mark `token`
/// to its custom metadata; `None` if that would pass GCS's limit on custom metadata.
fn marked_body(o: Object, token: &str) -> Option<Object> {
    let mut metadata = o.metadata.unwrap_or_default();
    metadata.insert(super::RENAME_KEY.to_string(), token.to_string());
    let size: usize = metadata.iter().map(|(k, v)| k.len() + v.len()).sum();
    (size <= CUSTOM_METADATA_LIMIT).then(|| Object {
        content_type: o.content_type,
        content_encoding: o.content_encoding,
        content_disposition: o.content_disposition,
        content_language: o.content_language,
        cache_control: o.cache_control,
        custom_time: o.custom_time,
        temporary_hold: o.temporary_hold,
        event_based_hold: o.event_based_hold,
        metadata: Some(metadata),
        ..Default::default()
    })
}

#[async_trait::async_trait]
impl ObjectStore for GcsStore {
    async fn head(&self, key: &str) -> StoreResult<ObjectMeta> {
        self.resource(key, None).await.map(to_meta)
    }

    async fn list(&self, req: &ListRequest) -> StoreResult<ListPage> {
        let r = ListObjectsRequest {
            bucket: self.bucket.clone(),
            prefix: Some(req.prefix.clone()).filter(|p| !p.is_empty()),
            delimiter: req.delimiter.clone(),
            page_token: req.page_token.clone(),
            max_results: req.max_results.map(|m| m.min(i32::MAX as u32) as i32),
            ..Default::default()
        };
        self.call("list", &req.prefix, || async {
            let resp = self.client.list_objects(&r).await.map_err(classify)?;
            Ok(ListPage {
                objects: resp
                    .items
                    .unwrap_or_default()
                    .into_iter()
                    .map(to_meta)
                    .collect(),
                prefixes: resp.prefixes.unwrap_or_default(),
                next_page_token: resp.next_page_token.filter(|t| !t.is_empty()),
            })
        })
        .await
    }

    async fn get_range(
        &self,
        key: &str,
        generation: i64,
        range: Range<u64>,
    ) -> StoreResult<ByteStream> {
        if range.start >= range.end {
            return Ok(Box::pin(futures::stream::empty()));
        }
        let req = GetObjectRequest {
            bucket: self.bucket.clone(),
            object: key.to_string(),
            generation: Some(generation),
            ..Default::default()
        };
        self.call("get_range", key, || async {
            let stream = self
                .client
                .download_streamed_object(&req, &GcsRange(Some(range.start), Some(range.end - 1)))
                .await
                .map_err(classify)?;
            let stream: ByteStream = Box::pin(stream.map_err(classify));
            Ok(stream)
        })
        .await
    }

    async fn read_range_into(
        &self,
        key: &str,
        generation: i64,
        range: Range<u64>,
        crc: bool,
    ) -> StoreResult<Option<(Bytes, Option<u32>)>> {
        let Some(ranges) = self.ranges.as_ref().filter(|r| r.in_use()) else {
            return Ok(None);
        };
        let Ok(want) = usize::try_from(range.end.saturating_sub(range.start)) else {
            return Ok(None);
        };
        if want == 0 {
            return Ok(None);
        }
        self.call("get_range", key, || async {
            let mut buf = super::read_buffers().filling(want);
            if crc {
                buf = buf.with_crc32c();
            }
            Ok(
                match ranges.get(key, generation, range.clone(), buf).await? {
                    Got::Filled(buf) => {
                        let crc = buf.crc32c();
                        Some((buf.freeze(), crc))
                    }
                    Got::Unsupported => None,
                },
            )
        })
        .await
    }

    async fn put(
        &self,
        key: &str,
        data: Bytes,
        pre: Precondition,
        opts: &WriteOptions,
    ) -> StoreResult<ObjectMeta> {
        let req = self.upload_request(pre);
        let upload_type = UploadType::Multipart(Box::new(self.object_resource(key, opts)));
        self.call("put", key, || async {
            self.client
                .upload_object(&req, data.clone(), &upload_type)
                .await
                .map(to_meta)
                .map_err(classify)
        })
        .await
    }

    async fn start_resumable(
        &self,
        key: &str,
        pre: Precondition,
        opts: &WriteOptions,
    ) -> StoreResult<ResumableSession> {
        let req = self.upload_request(pre);
        let upload_type = UploadType::Multipart(Box::new(self.object_resource(key, opts)));
        self.call("start_resumable", key, || async {
            let client = self
                .client
                .prepare_resumable_upload(&req, &upload_type)
                .await
                .map_err(classify)?;
            Ok(ResumableSession {
                key: key.to_string(),
                url: client.url().to_string(),
            })
        })
        .await
    }

    async fn upload_chunk(
        &self,
        session: &ResumableSession,
        offset: u64,
        data: Bytes,
        total: Option<u64>,
    ) -> StoreResult<ChunkOutcome> {
        let up = self.client.get_resumable_upload(session.url.clone());
        self.call("upload_chunk", &session.key, || async {
            let len = data.len() as u64;
            let status = if len == 0 {
                up.status(total).await
            } else {
                up.upload_multiple_chunk(
                    data.clone(),
                    &ChunkSize::new(offset, offset + len - 1, total),
                )
                .await
            }
            .map_err(classify)?;
            Ok(match status {
                UploadStatus::Ok(o) => ChunkOutcome::Done(to_meta(o)),
                UploadStatus::NotStarted => ChunkOutcome::Incomplete { persisted: 0 },
                UploadStatus::ResumeIncomplete(r) => ChunkOutcome::Incomplete {
                    persisted: r.last_byte + 1,
                },
            })
        })
        .await
    }

    async fn compose(
        &self,
        sources: &[(String, i64)],
        dest: &str,
        pre: Precondition,
        opts: &WriteOptions,
    ) -> StoreResult<ObjectMeta> {
        let req = ComposeObjectRequest {
            bucket: self.bucket.clone(),
            destination_object: dest.to_string(),
            if_generation_match: pre.if_generation_match(),
            composing_targets: ComposingTargets {
                destination: Some(self.object_resource(
                    dest,
                    &WriteOptions {
                        crc32c: None,
                        ..opts.clone()
                    },
                )),
                source_objects: sources
                    .iter()
                    .map(|(name, generation)| SourceObjects {
                        name: name.clone(),
                        generation: Some(*generation),
                        ..Default::default()
                    })
                    .collect(),
            },
            ..Default::default()
        };
        self.call("compose", dest, || async {
            self.client
                .compose_object(&req)
                .await
                .map(to_meta)
                .map_err(classify)
        })
        .await
    }

    async fn copy(
        &self,
        src: &str,
        src_generation: i64,
        dest: &str,
        pre: Precondition,
        mark: Option<&str>,
    ) -> StoreResult<ObjectMeta> {
        let mut tries = 0;
        loop {
            tries += 1;
            let marked = match mark {
                None => None,
                Some(token) => self.marked_resource(src, src_generation, token).await?,
            };
            // The body was read from one metageneration of the source: a metadata change
            // landing before the copy must not be undone by it.
            let read_at = marked.as_ref().map(|(_, mg)| *mg);
            let req = CopyObjectRequest {
                source_bucket: self.bucket.clone(),
                source_object: src.to_string(),
                destination_bucket: self.bucket.clone(),
                destination_object: dest.to_string(),
                if_generation_match: pre.if_generation_match(),
                if_source_generation_match: Some(src_generation),
                if_source_metageneration_match: read_at,
                metadata: marked.map(|(body, _)| body),
                ..Default::default()
            };
            let result = self
                .call("copy", dest, || async {
                    self.client
                        .copy_object(&req)
                        .await
                        .map(to_meta)
                        .map_err(classify)
                })
                .await;
            let e = match result {
                Err(e) if e.kind == StoreErrorKind::PreconditionFailed => e,
                other => return other,
            };
            // A 412 answers for the source's preconditions as well as the destination's; only
            // the destination's may reach the caller as one (it means another writer's object
            // is there). The source is asked which it was.
            let now = match self.head(src).await {
                Ok(now) => now,
                Err(h) if h.kind == StoreErrorKind::NotFound => {
                    return Err(StoreError::not_found(src));
                }
                Err(h) => return Err(h),
            };
            if now.generation != src_generation {
                // Replaced since it was listed: the generation to copy is gone, as GCS answers
                // a read of it.
                return Err(StoreError::not_found(src));
            }
            match read_at {
                // Its metadata changed between our read and the copy: read it again.
                Some(mg) if now.metageneration != mg && tries < 3 => continue,
                Some(mg) if now.metageneration != mg => {
                    return Err(StoreError::new(
                        StoreErrorKind::Transient,
                        format!("the metadata of {src} kept changing during a copy"),
                    ));
                }
                _ => return Err(e),
            }
        }
    }

    async fn update_metadata(
        &self,
        key: &str,
        generation: i64,
        metadata: &std::collections::HashMap<String, String>,
    ) -> StoreResult<ObjectMeta> {
        let req = PatchObjectRequest {
            bucket: self.bucket.clone(),
            object: key.to_string(),
            if_generation_match: Some(generation),
            metadata: Some(Object {
                metadata: Some(metadata.clone()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let patched = self
            .call("patch", key, || async {
                match self.client.patch_object(&req).await {
                    Ok(o) => Ok(Some(to_meta(o))),
                    // The request succeeded but its answer is not an object the client can
                    // read (fake-gcs-server answers PATCH in its own shape): read it back.
                    Err(GcsError::HttpClient(e)) if e.is_decode() => Ok(None),
                    Err(e) => Err(classify(e)),
                }
            })
            .await?;
        match patched {
            Some(meta) => Ok(meta),
            None => {
                let meta = self.head(key).await?;
                if meta.generation != generation
                    || metadata
                        .iter()
                        .any(|(k, v)| meta.metadata.get(k) != Some(v))
                {
                    return Err(StoreError::new(
                        StoreErrorKind::PreconditionFailed,
                        format!("{key} changed while its metadata was updated"),
                    ));
                }
                Ok(meta)
            }
        }
    }

    async fn delete(&self, key: &str, pre: Precondition) -> StoreResult<()> {
        let req = DeleteObjectRequest {
            bucket: self.bucket.clone(),
            object: key.to_string(),
            if_generation_match: pre.if_generation_match(),
            ..Default::default()
        };
        self.call("delete", key, || async {
            self.client.delete_object(&req).await.map_err(classify)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// On GCS a copy with a body takes every editable field from the body alone (the emulator
    /// fills in what the body leaves out, so only this test can tell): the body carries each
    /// one of the source's, and the mark beside its custom metadata.
    #[test]
    fn a_marked_copy_body_keeps_every_editable_field() {
        let at = time::OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap();
        let src = Object {
            name: "d/x".into(),
            generation: 7,
            metageneration: 3,
            size: 10,
            content_type: Some("text/html".into()),
            content_encoding: Some("gzip".into()),
            content_disposition: Some("attachment".into()),
            content_language: Some("fr".into()),
            cache_control: Some("no-cache".into()),
            custom_time: Some(at),
            temporary_hold: Some(true),
            event_based_hold: Some(false),
            metadata: Some(HashMap::from([("origin".into(), "gsutil".into())])),
            ..Default::default()
        };
        let body = marked_body(src.clone(), "tok").unwrap();
        assert_eq!(body.content_type, src.content_type);
        assert_eq!(body.content_encoding, src.content_encoding);
        assert_eq!(body.content_disposition, src.content_disposition);
        assert_eq!(body.content_language, src.content_language);
        assert_eq!(body.cache_control, src.cache_control);
        assert_eq!(body.custom_time, src.custom_time);
        assert_eq!(body.temporary_hold, src.temporary_hold);
        assert_eq!(body.event_based_hold, src.event_based_hold);
        let meta = body.metadata.unwrap();
        assert_eq!(meta.get("origin").map(String::as_str), Some("gsutil"));
        assert_eq!(
            meta.get(super::super::RENAME_KEY).map(String::as_str),
            Some("tok")
        );
        assert_eq!(meta.len(), 2);
        // Nothing but editable fields: the name, generation and size come from the request.
        assert!(body.name.is_empty() && body.generation == 0 && body.size == 0);
        // No room for the mark: no body, the copy keeps the source's metadata as it is.
        let full = Object {
            metadata: Some(HashMap::from([("big".into(), "v".repeat(8 * 1024 - 10))])),
            ..Default::default()
        };
        assert!(marked_body(full, "tok").is_none());
    }

    fn resolve(
        endpoint: Option<&str>,
        key: Option<&str>,
        anonymous: bool,
        insecure: bool,
        var: Option<&str>,
    ) -> Result<GcsOptions, String> {
        GcsOptions::resolve_with(
            endpoint.map(String::from),
            key.map(PathBuf::from),
            anonymous,
            insecure,
            var.map(String::from),
        )
    }

    #[test]
    fn endpoint_resolution() {
        let o = resolve(Some("http://127.0.0.1:9/"), None, true, false, None).unwrap();
        assert_eq!(o.endpoint, "http://127.0.0.1:9");
        assert_eq!(o.credentials, Credentials::Anonymous);
        let o = resolve(Some("https://x"), Some("/k.json"), false, false, None).unwrap();
        assert_eq!(o.credentials, Credentials::KeyFile("/k.json".into()));
        let o = resolve(None, None, false, false, None).unwrap();
        assert_eq!(o.endpoint, GcsOptions::DEFAULT_ENDPOINT);
        assert_eq!(o.credentials, Credentials::ApplicationDefault);
        assert!(o.notes.is_empty());
    }

    /// Credentials never go over plain HTTP to another machine, unless asked for.
    #[test]
    fn credentials_go_in_clear_text_only_to_this_machine_or_when_asked() {
        for local in [
            "http://127.0.0.1:9",
            "http://localhost:9",
            "http://[::1]:9",
            "http://127.8.0.1",
        ] {
            assert!(
                resolve(Some(local), Some("/k"), false, false, None).is_ok(),
                "{local}"
            );
            assert!(
                resolve(Some(local), None, false, false, None).is_ok(),
                "{local}: ADC"
            );
        }
        for remote in [
            "http://10.1.2.3:4443",
            "http://storage.example.com",
            "http://[2001:db8::1]",
        ] {
            let e = resolve(Some(remote), Some("/k"), false, false, None).unwrap_err();
            assert!(e.contains("clear text"), "{remote}: {e}");
            assert!(
                resolve(Some(remote), None, false, false, None).is_err(),
                "{remote}: ADC"
            );
            // Anonymous access sends nothing to protect.
            assert!(
                resolve(Some(remote), None, true, false, None).is_ok(),
                "{remote}"
            );
            let o = resolve(Some(remote), Some("/k"), false, true, None).unwrap();
            assert!(
                o.notes.iter().any(|n| n.contains("clear text")),
                "{remote}: {:?}",
                o.notes
            );
        }
        assert!(resolve(Some("https://10.1.2.3"), Some("/k"), false, false, None).is_ok());
    }

    #[test]
    fn an_endpoint_needs_a_scheme() {
        let e = resolve(Some("127.0.0.1:4443"), None, true, false, None).unwrap_err();
        assert!(e.contains("needs a scheme"), "{e}");
    }

    /// `STORAGE_EMULATOR_HOST` keeps its meaning (a plain-HTTP emulator, anonymous), says so,
    /// and is refused with a key file rather than sending the key's tokens there.
    #[test]
    fn the_emulator_variable_is_anonymous_and_refused_with_a_key_file() {
        let o = resolve(None, None, false, false, Some("10.0.0.7:4443")).unwrap();
        assert_eq!(o.endpoint, "http://10.0.0.7:4443");
        assert_eq!(o.credentials, Credentials::Anonymous);
        assert!(
            o.notes.iter().any(|n| n.contains(EMULATOR_VAR)),
            "{:?}",
            o.notes
        );
        let e = resolve(None, Some("/k.json"), false, false, Some("10.0.0.7:4443")).unwrap_err();
        assert!(e.contains(EMULATOR_VAR) && e.contains("--key-file"), "{e}");
        // An explicit endpoint wins over the variable, with the credentials asked for.
        let o = resolve(Some("https://x"), Some("/k"), false, false, Some("h:1")).unwrap();
        assert_eq!((o.endpoint.as_str(), o.notes.len()), ("https://x", 0));
        assert_eq!(o.credentials, Credentials::KeyFile("/k".into()));
    }

    /// The key's own token endpoint receives its signed assertion (or a refresh token): the
    /// same rule holds for it.
    #[test]
    fn a_key_whose_token_uri_is_plain_http_elsewhere_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key.json");
        for (uri, ok) in [
            ("http://10.0.0.1/token", false),
            ("http://127.0.0.1:9/token", true),
            ("https://oauth2.googleapis.com/token", true),
        ] {
            std::fs::write(&key, format!("{{\"token_uri\": \"{uri}\"}}")).unwrap();
            let r = resolve(Some("https://x"), key.to_str(), false, false, None);
            assert_eq!(r.is_ok(), ok, "{uri}: {:?}", r.err());
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_key_file_others_can_read_is_warned_about() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key.json");
        std::fs::write(&key, "{}").unwrap();
        let path = key.to_str().unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let o = resolve(Some("https://x"), Some(path), false, false, None).unwrap();
        assert!(
            o.notes.iter().any(|n| n.contains("mode 644")),
            "{:?}",
            o.notes
        );
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let o = resolve(Some("https://x"), Some(path), false, false, None).unwrap();
        assert!(o.notes.is_empty(), "{:?}", o.notes);
    }

    #[test]
    fn secrets_are_scrubbed_from_messages() {
        let m = "error sending request for url (http://h/upload/storage/v1/b/b/o?uploadType=resumable&name=a&upload_id=ABC-123_x)";
        let s = scrub(m);
        assert!(!s.contains("ABC-123_x"), "{s}");
        assert!(s.contains("upload_id=<redacted>)"), "{s}");
        assert!(s.contains("name=a&"), "{s}");
        let s = scrub("Upload_ID=zz&access_token=ya29.tok more; my_upload_id=kept");
        assert_eq!(
            s,
            "Upload_ID=<redacted>&access_token=<redacted> more; my_upload_id=kept"
        );
        assert_eq!(scrub("héllo wörld"), "héllo wörld");
    }

    #[tokio::test]
    async fn http_errors_lose_their_query() {
        // A request to a closed port fails with the URL in its message.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("http://u:pw@127.0.0.1:{port}/upload/o?upload_id=SECRET&name=n");
        crate::store::tls::install_crypto_provider();
        let e = reqwest::Client::new().get(&url).send().await.unwrap_err();
        assert!(
            e.to_string().contains("SECRET"),
            "the leak this guards against: {e}"
        );
        let err = classify(GcsError::HttpClient(e));
        assert!(!err.message.contains("SECRET"), "{}", err.message);
        assert!(!err.message.contains("pw"), "{}", err.message);
        assert!(err.message.contains("/upload/o"), "{}", err.message);
    }
}
