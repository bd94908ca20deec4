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
pub mod range_get;
pub mod retry;
pub mod tls;
mod tls_records;

use std::collections::HashMap;
use std::ops::Range;
use std::pin::Pin;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use std::sync::Arc;

use crate::buffer_pool::BufferPool;
use futures::{Stream, StreamExt};
use time::format_description::well_known::{Iso8601, Rfc3339};
use time::OffsetDateTime;

/// Metadata key that gsutil and rclone use for a file's modification time (seconds since epoch).
pub const MTIME_KEY: &str = "goog-reserved-file-mtime";

/// Metadata key that rclone uses for the modification time to the nanosecond (RFC 3339). The
/// seconds of [`MTIME_KEY`] alone make robocopy and `rsync` see every file as changed.
pub const MTIME_PRECISE_KEY: &str = "mtime";

/// The metadata entries that store `t` as a file's modification time: [`MTIME_KEY`] with whole
/// seconds, for gsutil, and [`MTIME_PRECISE_KEY`] with nanoseconds, for rclone and us. The one
/// place that formats them, so every writer stores the same two values.
///
/// A time before 1970 is stored as 1970 (a negative `goog-reserved-file-mtime` is not read back
/// by anyone). A time whose year RFC 3339 cannot write (past 9999) gets the seconds key alone.
pub fn mtime_metadata(t: SystemTime) -> Vec<(String, String)> {
    let since_epoch = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let mut md = vec![(MTIME_KEY.to_string(), since_epoch.as_secs().to_string())];
    // ISO 8601's default form is RFC 3339 in UTC with all nine digits of the fraction
    // (`2020-01-02T05:06:07.123456700Z`); rclone trims trailing zeros, and reads either.
    let precise = i128::try_from(since_epoch.as_nanos())
        .ok()
        .and_then(|n| OffsetDateTime::from_unix_timestamp_nanos(n).ok())
        .and_then(|d| d.format(&Iso8601::DEFAULT).ok());
    if let Some(p) = precise {
        md.push((MTIME_PRECISE_KEY.to_string(), p));
    }
    md
}

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

/// Metadata key naming the mount that wrote an object it must later recognise as its own
/// when a retry finds it: an exclusive create's claim and a `mkdir` marker (the mount's cache
/// directory tag and a token of that one request), and an uploaded empty file (the tag
/// alone). Every empty object has the same CRC32C and size, so for those only this tells a
/// write of ours whose answer was lost from another machine's.
pub const WRITER_KEY: &str = "bucketdrive-writer";

/// Metadata key a directory rename's copies carry: a token of that one rename. Only a copy
/// holding it may be taken back when the rename fails; an identical object without it may be
/// another machine's rename of the same directory, which that machine may already count on.
pub const RENAME_KEY: &str = "bucketdrive-rename";

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
    /// Some of the object's custom metadata was dropped ([`ObjectMeta::trimmed`]): whoever
    /// needs all of it (an upload of a modified file keeps it) asks the bucket again.
    pub metadata_trimmed: bool,
}

/// The custom metadata keys the mount reads. A bucket's writers may attach up to 8 KiB of
/// metadata to every object; of an object with more than [`METADATA_KEPT_WHOLE`] bytes of it,
/// the caches and inodes keep only these, so a mount listing a hundred thousand such objects
/// pays by the name, not by what strangers attached to them.
pub const USED_METADATA: &[&str] = &[
    MTIME_KEY,
    MTIME_PRECISE_KEY,
    POSIX_MODE_KEY,
    POSIX_UID_KEY,
    POSIX_GID_KEY,
    SYMLINK_KEY,
    WRITER_KEY,
];

/// Metadata up to this many bytes (keys and values) is kept whole; beyond, only the used keys.
pub const METADATA_KEPT_WHOLE: usize = 512;

/// The longest value of a used key that is kept (a link's target: `PATH_MAX`).
pub const METADATA_VALUE_MAX: usize = 4096;

impl ObjectMeta {
    /// This object as the mount keeps it: only the [`USED_METADATA`] keys, each value at most
    /// [`METADATA_VALUE_MAX`] bytes; `metadata_trimmed` says whether anything was dropped.
    pub fn trimmed(mut self) -> Self {
        let total: usize = self.metadata.iter().map(|(k, v)| k.len() + v.len()).sum();
        if total <= METADATA_KEPT_WHOLE {
            // What tools commonly attach (gsutil -P's times and ids, a download token) is
            // kept whole: such an object needs no second request to be modified.
            return self;
        }
        let before = self.metadata.len();
        self.metadata
            .retain(|k, v| USED_METADATA.contains(&k.as_str()) && v.len() <= METADATA_VALUE_MAX);
        if self.metadata.len() != before {
            self.metadata.shrink_to_fit();
            self.metadata_trimmed = true;
        }
        self
    }

    /// The modification time users see: rclone's `mtime` (RFC 3339, to the nanosecond, any
    /// UTC offset) when present and valid, else `goog-reserved-file-mtime` (whole seconds, as
    /// gsutil writes it), else the object's update time.
    ///
    /// When both keys are there but `mtime` falls in another second than
    /// `goog-reserved-file-mtime`, the seconds key wins: a tool that knows only that one (gsutil
    /// `rsync`, for one) changed the time after the precise one was written.
    pub fn mtime(&self) -> SystemTime {
        let secs = self
            .metadata
            .get(MTIME_KEY)
            .and_then(|s| s.trim().parse::<i64>().ok())
            .filter(|s| *s >= 0);
        let precise = self
            .metadata
            .get(MTIME_PRECISE_KEY)
            .and_then(|s| OffsetDateTime::parse(s.trim(), &Rfc3339).ok())
            .filter(|d| d.unix_timestamp() >= 0);
        let epoch_secs = |s: i64| SystemTime::UNIX_EPOCH + Duration::from_secs(s as u64);
        match (precise, secs) {
            (Some(d), Some(s)) if d.unix_timestamp() != s => epoch_secs(s),
            (Some(d), _) => {
                epoch_secs(d.unix_timestamp()) + Duration::from_nanos(u64::from(d.nanosecond()))
            }
            (None, Some(s)) => epoch_secs(s),
            (None, None) => self.updated,
        }
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

    /// Bytes `range` of generation `generation` of `key`, read straight into a buffer of the
    /// read pool (with `crc`, also their CRC32C), retried as any request is; `None` if this
    /// store has no such path, or not for this range, and the caller is to stream it with
    /// [`ObjectStore::get_range`] instead.
    async fn read_range_into(
        &self,
        _key: &str,
        _generation: i64,
        _range: Range<u64>,
        _crc: bool,
    ) -> StoreResult<Option<(Bytes, Option<u32>)>> {
        Ok(None)
    }

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

    /// Server-side copy of generation `src_generation` of `src` to `dest`. With `mark`, the
    /// copy also carries [`RENAME_KEY`] with that value, set in the same request as its bytes
    /// (everything else of the source's is kept): a `HEAD` of `dest` after a lost answer then
    /// tells this request's copy from an identical one another writer made. A source whose
    /// custom metadata has no room left for it (GCS allows 8 KiB) is copied without it.
    /// `PreconditionFailed` is only ever `pre` failing at `dest`; a source generation that is
    /// gone is `NotFound`.
    async fn copy(
        &self,
        src: &str,
        src_generation: i64,
        dest: &str,
        pre: Precondition,
        mark: Option<&str>,
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

/// Free bytes kept for ranges read into memory: a few parts' worth. Parts are taken and let
/// go one after the other as readers move on, so a handful of free buffers is enough for the
/// next parts to reuse the memory of the last; the read budget, not this, bounds what is held
/// in flight.
const READ_BUFFERS: usize = 64 << 20;

/// The buffers ranges are read into (see [`crate::buffer_pool`]: a part in fresh memory cost a
/// fifth of the daemon's CPU per GiB read, in page faults and zeroing).
pub(crate) fn read_buffers() -> &'static Arc<BufferPool> {
    static POOL: std::sync::OnceLock<Arc<BufferPool>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| BufferPool::new(READ_BUFFERS))
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
    Ok(read_range_crc(store, key, generation, range, false)
        .await?
        .0)
}

/// [`read_range`], and with `crc` the CRC32C of the bytes, computed as they arrived (see
/// [`crate::buffer_pool::Filling::push`]) so that a whole-object check need not read them again.
pub async fn read_range_crc<S: ObjectStore + ?Sized>(
    store: &S,
    key: &str,
    generation: i64,
    range: Range<u64>,
    crc: bool,
) -> StoreResult<(Bytes, Option<u32>)> {
    if let Some(got) = store
        .read_range_into(key, generation, range.clone(), crc)
        .await?
    {
        crate::metrics::fetched_bytes(got.0.len() as u64);
        return Ok(got);
    }
    let want = range.end.saturating_sub(range.start);
    let want_len = usize::try_from(want)
        .map_err(|_| StoreError::new(StoreErrorKind::Other, "range too large for memory"))?;
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
            let mut buf = read_buffers().filling(want_len);
            if crc {
                buf = buf.with_crc32c();
            }
            while let Some(chunk) = stream.next().await {
                if !buf.push(&chunk?) {
                    return Err(StoreError::new(
                        StoreErrorKind::Transient,
                        format!("long read of {key}: wanted {want} bytes, got more"),
                    ));
                }
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
            let crc = buf.crc32c();
            Ok((buf.freeze(), crc))
        }
    })
    .await;
    match (result, request_failed.into_inner()) {
        (Err(_), Some(e)) => Err(e),
        (r, _) => {
            if let Ok((data, _)) = &r {
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
            metadata_trimmed: false,
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

    /// Small metadata, as tools commonly attach it, is kept whole (no second request to modify
    /// the object); beyond that only the keys the mount reads stay.
    #[test]
    fn only_large_metadata_is_trimmed() {
        let small = meta_with(&[
            (
                "firebaseStorageDownloadTokens",
                "3f9c2e7a-1b2c-4d5e-8f90-123456789abc",
            ),
            (MTIME_KEY, "1600000000"),
        ]);
        let kept = small.clone().trimmed();
        assert!(!kept.metadata_trimmed);
        assert_eq!(kept.metadata, small.metadata);
        let big = "n".repeat(METADATA_KEPT_WHOLE);
        let large = meta_with(&[("x-note", big.as_str()), (MTIME_KEY, "1600000000")]);
        let kept = large.trimmed();
        assert!(kept.metadata_trimmed);
        assert_eq!(kept.metadata.len(), 1);
        assert_eq!(kept.metadata[MTIME_KEY], "1600000000");
    }

    fn meta_with(md: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            metadata_trimmed: false,
            key: "k".into(),
            generation: 1,
            metageneration: 1,
            size: 0,
            crc32c: None,
            updated: SystemTime::UNIX_EPOCH + Duration::from_secs(2_000_000_000),
            content_type: None,
            metadata: md
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    /// 2020-01-02T05:06:07.123456700Z.
    fn precise_time() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::new(1_577_941_567, 123_456_700)
    }

    #[test]
    fn mtime_reads_the_precise_key_and_the_seconds_key() {
        let updated = meta_with(&[]).updated;
        let secs = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        // What the case shows, the object's metadata, the time it must give.
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], SystemTime);
        let cases: &[Case] = &[
            ("neither", &[], updated),
            (
                "seconds only",
                &[(MTIME_KEY, "1577941567")],
                secs(1_577_941_567),
            ),
            (
                "precise only",
                &[(MTIME_PRECISE_KEY, "2020-01-02T05:06:07.123456700Z")],
                precise_time(),
            ),
            (
                "both, same second: the precise one",
                &[
                    (MTIME_KEY, "1577941567"),
                    (MTIME_PRECISE_KEY, "2020-01-02T05:06:07.123456700Z"),
                ],
                precise_time(),
            ),
            (
                "both, other seconds: the seconds key was changed since",
                &[
                    (MTIME_KEY, "1600000000"),
                    (MTIME_PRECISE_KEY, "2020-01-02T05:06:07.123456700Z"),
                ],
                secs(1_600_000_000),
            ),
            (
                "rclone's trimmed fraction and an offset east",
                &[
                    (MTIME_KEY, "1577941567"),
                    (MTIME_PRECISE_KEY, "2020-01-02T06:06:07.1234567+01:00"),
                ],
                precise_time(),
            ),
            (
                "an offset west",
                &[(MTIME_PRECISE_KEY, "2020-01-01T23:36:07.1234567-05:30")],
                precise_time(),
            ),
            (
                "no fraction",
                &[(MTIME_PRECISE_KEY, "2020-01-02T05:06:07Z")],
                secs(1_577_941_567),
            ),
            (
                "garbage precise, valid seconds",
                &[(MTIME_KEY, "1577941567"), (MTIME_PRECISE_KEY, "yesterday")],
                secs(1_577_941_567),
            ),
            (
                "not RFC 3339 (no offset)",
                &[(MTIME_PRECISE_KEY, "2020-01-02T05:06:07.1234567")],
                updated,
            ),
            (
                "garbage in both",
                &[(MTIME_KEY, "garbage"), (MTIME_PRECISE_KEY, "garbage")],
                updated,
            ),
            (
                "before 1970",
                &[(MTIME_PRECISE_KEY, "1969-12-31T23:59:59.5Z")],
                updated,
            ),
            ("negative seconds", &[(MTIME_KEY, "-5")], updated),
        ];
        for (what, md, want) in cases {
            assert_eq!(meta_with(md).mtime(), *want, "{what}: {md:?}");
        }
    }

    #[test]
    fn mtime_metadata_writes_both_keys_and_reads_back_exactly() {
        let md: HashMap<String, String> = mtime_metadata(precise_time()).into_iter().collect();
        assert_eq!(md.len(), 2, "{md:?}");
        assert_eq!(md[MTIME_KEY], "1577941567");
        assert_eq!(md[MTIME_PRECISE_KEY], "2020-01-02T05:06:07.123456700Z");

        let whole = SystemTime::UNIX_EPOCH + Duration::from_secs(1_600_000_000);
        let md: HashMap<String, String> = mtime_metadata(whole).into_iter().collect();
        assert_eq!(md[MTIME_KEY], "1600000000");
        assert_eq!(md[MTIME_PRECISE_KEY], "2020-09-13T12:26:40.000000000Z");

        for t in [
            precise_time(),
            whole,
            whole + Duration::from_nanos(1),
            whole + Duration::from_nanos(999_999_999),
            SystemTime::UNIX_EPOCH,
        ] {
            let pairs = mtime_metadata(t);
            let md: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (&**k, &**v)).collect();
            assert_eq!(meta_with(&md).mtime(), t, "{md:?}");
        }

        let before_1970 = SystemTime::UNIX_EPOCH - Duration::from_millis(1500);
        let md: HashMap<String, String> = mtime_metadata(before_1970).into_iter().collect();
        assert_eq!(md[MTIME_KEY], "0");
        assert_eq!(md[MTIME_PRECISE_KEY], "1970-01-01T00:00:00.000000000Z");

        // Year 11476: RFC 3339 has four digits for the year.
        let far = SystemTime::UNIX_EPOCH + Duration::new(300_000_000_000, 5);
        let md: HashMap<String, String> = mtime_metadata(far).into_iter().collect();
        assert_eq!(md.len(), 1, "{md:?}");
        assert_eq!(md[MTIME_KEY], "300000000000");
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
