//! The bucket: the only layer that talks to object storage.
//!
//! [`ObjectStore`] names the operations the filesystem needs from GCS and nothing more, so the
//! core can be driven by [`MemoryStore`](memory::MemoryStore) in unit tests and by
//! [`GcsStore`](gcs::GcsStore) in production. Keys here are full object names; this layer knows
//! nothing about inodes, handles or mount prefixes.
//!
//! Errors are classified once, into [`StoreErrorKind`], so retry policy ([`retry`]) and the
//! errno mapping ([`crate::error`]) never look at HTTP status codes.

pub mod gcs;
pub mod memory;
pub mod retry;
pub mod tls;

use std::collections::HashMap;
use std::ops::Range;
use std::pin::Pin;
use std::time::SystemTime;

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};

/// Metadata key that gsutil and rclone use for a file's modification time (seconds since epoch).
pub const MTIME_KEY: &str = "goog-reserved-file-mtime";

/// Owner, group and mode as gsutil (`cp -P`) and rclone store them, read and written with
/// `--posix-metadata`: decimal ids, and the mode as octal digits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Posix {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

pub const POSIX_MODE_KEY: &str = "goog-reserved-posix-mode";
pub const POSIX_UID_KEY: &str = "goog-reserved-posix-uid";
pub const POSIX_GID_KEY: &str = "goog-reserved-posix-gid";

impl Posix {
    pub fn from_metadata(md: &HashMap<String, String>) -> Posix {
        Posix {
            mode: md
                .get(POSIX_MODE_KEY)
                .and_then(|s| u32::from_str_radix(s, 8).ok())
                .map(|m| m & 0o7777),
            uid: md.get(POSIX_UID_KEY).and_then(|s| s.parse().ok()),
            gid: md.get(POSIX_GID_KEY).and_then(|s| s.parse().ok()),
        }
    }

    /// Writes the fields that are set into `md`.
    pub fn to_metadata(self, md: &mut HashMap<String, String>) {
        if let Some(m) = self.mode {
            md.insert(POSIX_MODE_KEY.into(), format!("{:o}", m & 0o7777));
        }
        if let Some(u) = self.uid {
            md.insert(POSIX_UID_KEY.into(), u.to_string());
        }
        if let Some(g) = self.gid {
            md.insert(POSIX_GID_KEY.into(), g.to_string());
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == Posix::default()
    }
}

/// Metadata key that makes an object a symbolic link, its value the link's target. The name is
/// gcsfuse's, so links made by either tool read the same in both. The object's content is empty.
pub const SYMLINK_KEY: &str = "gcsfuse_symlink_target";

/// What the filesystem needs to know about one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    pub key: String,
    pub generation: i64,
    pub metageneration: i64,
    pub size: u64,
    /// CRC32C of the whole object, if the store reported one.
    pub crc32c: Option<u32>,
    pub updated: SystemTime,
    pub content_type: Option<String>,
    pub metadata: HashMap<String, String>,
}

impl ObjectMeta {
    /// The modification time users see: `goog-reserved-file-mtime` when present and valid,
    /// otherwise the object's update time.
    pub fn mtime(&self) -> SystemTime {
        self.metadata
            .get(MTIME_KEY)
            .and_then(|s| s.trim().parse::<i64>().ok())
            .filter(|s| *s >= 0)
            .map(|s| SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(s as u64))
            .unwrap_or(self.updated)
    }
}

/// One page of a delimited listing.
#[derive(Debug, Clone, Default)]
pub struct ListPage {
    pub objects: Vec<ObjectMeta>,
    /// Common prefixes ("sub-directories"), each ending in the delimiter.
    pub prefixes: Vec<String>,
    pub next_page_token: Option<String>,
}

/// A listing request.
#[derive(Debug, Clone, Default)]
pub struct ListRequest {
    pub prefix: String,
    pub delimiter: Option<String>,
    pub page_token: Option<String>,
    pub max_results: Option<u32>,
}

/// A GCS generation precondition on a write or delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precondition {
    /// No precondition: last writer wins.
    None,
    /// `ifGenerationMatch=0`: only if no live object has this name.
    DoesNotExist,
    /// `ifGenerationMatch=G`: only if the live object is generation G.
    GenerationMatch(i64),
}

impl Precondition {
    pub fn if_generation_match(self) -> Option<i64> {
        match self {
            Precondition::None => None,
            Precondition::DoesNotExist => Some(0),
            Precondition::GenerationMatch(g) => Some(g),
        }
    }
}

/// Properties for a new object.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    pub content_type: Option<String>,
    pub metadata: HashMap<String, String>,
    /// CRC32C of the payload; the store rejects the write if the bytes do not match.
    pub crc32c: Option<u32>,
}

/// A resumable upload session.
#[derive(Clone, PartialEq, Eq)]
pub struct ResumableSession {
    pub key: String,
    /// The session URL: whoever holds it can write the upload, so it is kept out of logs
    /// (its `Debug` shows only the key).
    pub url: String,
}

impl std::fmt::Debug for ResumableSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResumableSession")
            .field("key", &self.key)
            .field("url", &"<redacted>")
            .finish()
    }
}

/// Result of sending one resumable chunk.
#[derive(Debug, Clone)]
pub enum ChunkOutcome {
    /// The store has persisted bytes `0..persisted`; send the rest.
    Incomplete { persisted: u64 },
    /// The upload finished and created this object.
    Done(ObjectMeta),
}

/// The classes every store error falls into. Retry and errno decisions use only these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreErrorKind {
    NotFound,
    PreconditionFailed,
    /// HTTP 429.
    Throttled,
    /// HTTP 408, 5xx, connection resets and timeouts.
    Transient,
    PermissionDenied,
    InvalidArgument,
    Other,
}

/// A classified store error with a human-readable message (never containing secrets).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct StoreError {
    pub kind: StoreErrorKind,
    pub message: String,
}

impl StoreError {
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        StoreError {
            kind,
            message: message.into(),
        }
    }

    pub fn not_found(key: &str) -> Self {
        Self::new(StoreErrorKind::NotFound, format!("no such object: {key}"))
    }

    /// Classifies an HTTP status code.
    pub fn from_status(status: u16, message: impl Into<String>) -> Self {
        let kind = match status {
            404 => StoreErrorKind::NotFound,
            412 => StoreErrorKind::PreconditionFailed,
            429 => StoreErrorKind::Throttled,
            408 | 500..=599 => StoreErrorKind::Transient,
            401 | 403 => StoreErrorKind::PermissionDenied,
            400 | 411 | 413 | 416 => StoreErrorKind::InvalidArgument,
            _ => StoreErrorKind::Other,
        };
        Self::new(kind, message)
    }

    /// Whether a retry can succeed where this attempt failed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind,
            StoreErrorKind::Throttled | StoreErrorKind::Transient
        )
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

/// A stream of object bytes.
pub type ByteStream = Pin<Box<dyn Stream<Item = StoreResult<Bytes>> + Send>>;

/// The bucket operations the filesystem is built on.
///
/// Implementations retry transient failures themselves (see [`retry`]); callers see only final
/// outcomes. Every generation-pinned call fails with `NotFound` once that generation is gone.
#[async_trait::async_trait]
pub trait ObjectStore: Send + Sync + 'static {
    /// Metadata of the live object `key`.
    async fn head(&self, key: &str) -> StoreResult<ObjectMeta>;

    /// One page of objects and prefixes under `req.prefix`.
    async fn list(&self, req: &ListRequest) -> StoreResult<ListPage>;

    /// Bytes `range` of generation `generation` of `key`, as a stream.
    async fn get_range(
        &self,
        key: &str,
        generation: i64,
        range: Range<u64>,
    ) -> StoreResult<ByteStream>;

    /// Writes a whole object in one request.
    async fn put(
        &self,
        key: &str,
        data: Bytes,
        pre: Precondition,
        opts: &WriteOptions,
    ) -> StoreResult<ObjectMeta>;

    /// Opens a resumable upload session for `key`.
    async fn start_resumable(
        &self,
        key: &str,
        pre: Precondition,
        opts: &WriteOptions,
    ) -> StoreResult<ResumableSession>;

    /// Sends bytes starting at `offset` of a resumable upload. All chunks but the last must be
    /// a multiple of 256 KiB; `total` is given with the last chunk.
    async fn upload_chunk(
        &self,
        session: &ResumableSession,
        offset: u64,
        data: Bytes,
        total: Option<u64>,
    ) -> StoreResult<ChunkOutcome>;

    /// Concatenates 1 to 32 `sources` (key, generation) into `dest`.
    async fn compose(
        &self,
        sources: &[(String, i64)],
        dest: &str,
        pre: Precondition,
        opts: &WriteOptions,
    ) -> StoreResult<ObjectMeta>;

    /// Server-side copy of generation `src_generation` of `src` to `dest`.
    async fn copy(
        &self,
        src: &str,
        src_generation: i64,
        dest: &str,
        pre: Precondition,
    ) -> StoreResult<ObjectMeta>;

    /// Deletes `key`, subject to `pre`.
    async fn delete(&self, key: &str, pre: Precondition) -> StoreResult<()>;

    /// Sets custom metadata entries of generation `generation` of `key` (others are kept), the
    /// content untouched: one request instead of an upload, for `touch` and `chmod`.
    async fn update_metadata(
        &self,
        key: &str,
        generation: i64,
        metadata: &HashMap<String, String>,
    ) -> StoreResult<ObjectMeta>;
}

/// Reads a whole range into memory. A stream that breaks half-way is retried from its start,
/// never stitched. A failure of the request itself is not retried here: the store already
/// retried it, and retrying around it again would multiply the attempts.
pub async fn read_range<S: ObjectStore + ?Sized>(
    store: &S,
    key: &str,
    generation: i64,
    range: Range<u64>,
) -> StoreResult<Bytes> {
    let want = range.end.saturating_sub(range.start);
    let request_failed = parking_lot::Mutex::new(None::<StoreError>);
    let result = retry::with_retry(retry::RetryPolicy::default(), "read_range", key, || {
        let range = range.clone();
        let request_failed = &request_failed;
        async move {
            let mut stream = match store.get_range(key, generation, range).await {
                Ok(s) => s,
                Err(e) => {
                    *request_failed.lock() = Some(e);
                    return Err(StoreError::new(StoreErrorKind::Other, "request failed"));
                }
            };
            let mut buf = BytesMut::with_capacity(want as usize);
            while let Some(chunk) = stream.next().await {
                buf.extend_from_slice(&chunk?);
            }
            if buf.len() as u64 != want {
                return Err(StoreError::new(
                    StoreErrorKind::Transient,
                    format!(
                        "short read of {key}: wanted {want} bytes, got {}",
                        buf.len()
                    ),
                ));
            }
            Ok(buf.freeze())
        }
    })
    .await;
    match (result, request_failed.into_inner()) {
        (Err(_), Some(e)) => Err(e),
        (r, _) => {
            if let Ok(data) = &r {
                crate::metrics::fetched_bytes(data.len() as u64);
            }
            r
        }
    }
}

/// Parses the base64 big-endian CRC32C that GCS reports.
pub fn decode_crc32c(b64: &str) -> Option<u32> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    let arr: [u8; 4] = bytes.as_slice().try_into().ok()?;
    Some(u32::from_be_bytes(arr))
}

/// Encodes a CRC32C the way GCS reports it.
pub fn encode_crc32c(crc: u32) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(crc.to_be_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_codec_matches_gcs() {
        // GCS reports "yZRlqg==" for the bytes "hello world".
        assert_eq!(
            decode_crc32c("yZRlqg=="),
            Some(crc32c::crc32c(b"hello world"))
        );
        assert_eq!(encode_crc32c(crc32c::crc32c(b"hello world")), "yZRlqg==");
        assert_eq!(decode_crc32c("!!"), None);
    }

    #[test]
    fn mtime_prefers_the_metadata_key() {
        let updated = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(2_000_000_000);
        let mut m = ObjectMeta {
            key: "k".into(),
            generation: 1,
            metageneration: 1,
            size: 0,
            crc32c: None,
            updated,
            content_type: None,
            metadata: HashMap::new(),
        };
        assert_eq!(m.mtime(), updated);
        m.metadata.insert(MTIME_KEY.into(), "1700000000".into());
        assert_eq!(
            m.mtime(),
            SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000)
        );
        m.metadata.insert(MTIME_KEY.into(), "garbage".into());
        assert_eq!(
            m.mtime(),
            updated,
            "an unparsable value falls back to the update time"
        );
    }

    #[test]
    fn status_classes() {
        assert_eq!(
            StoreError::from_status(404, "").kind,
            StoreErrorKind::NotFound
        );
        assert_eq!(
            StoreError::from_status(412, "").kind,
            StoreErrorKind::PreconditionFailed
        );
        assert!(StoreError::from_status(429, "").is_retryable());
        assert!(StoreError::from_status(503, "").is_retryable());
        assert!(StoreError::from_status(408, "").is_retryable());
        assert!(!StoreError::from_status(403, "").is_retryable());
    }
}
