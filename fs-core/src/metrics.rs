//! The mount's metrics: every name, what it counts, and the one place each is counted.
//!
//! Counting goes through the [`metrics`](::metrics) facade. Until a recorder is installed (the
//! binaries install the Prometheus exporter for `--metrics-addr`, see `cli::metrics`), every
//! call here is a no-op, so unit tests, the simulation and a mount without the flag pay nothing.
//! Each metric is counted where the decision it reports is made, not derived later from logs
//! or status, so its meaning stays the code's meaning: a retry is counted by the loop that
//! decides to retry, a prefetch hit by the reader that decides it had the bytes coming.
//!
//! Labels are bounded: an operation name, an error class. Never a key, a path or a size.
//!
//! | metric | type | labels | counted in |
//! |---|---|---|---|
//! | `bucketdrive_read_bytes_total` | counter | | `Filesystem::read`: bytes returned to a reader, from the bucket or a staged file |
//! | `bucketdrive_written_bytes_total` | counter | | `Filesystem::write`: bytes written through the daemon into files being written |
//! | `bucketdrive_fetched_bytes_total` | counter | | `store::read_range`: bytes downloaded from the bucket (read-ahead parts, demand reads, fills of staged files) |
//! | `bucketdrive_prefetch_hits_total` | counter | | `read::prefetch::Reader`: a read whose bytes were already requested or held (window, or the last demand block) |
//! | `bucketdrive_prefetch_misses_total` | counter | | `read::prefetch::Reader`: a read that had to start a GET for its own bytes |
//! | `bucketdrive_read_budget_bytes_in_use` | gauge | | `read::budget`: bytes reserved by read-ahead parts, added on reserve, removed on release |
//! | `bucketdrive_read_budget_bytes_limit` | gauge | | `read::budget`: `--max-read-memory` |
//! | `bucketdrive_read_cache_hit_bytes_total` | counter | | `read::cache::ObjectCache::read`: bytes served from the disk read cache, every block checked |
//! | `bucketdrive_read_cache_miss_bytes_total` | counter | | `read::cache::ObjectCache::read`: bytes the read cache did not have, fetched from the bucket |
//! | `bucketdrive_read_cache_skipped_bytes_total` | counter | | `read::cache`: fetched bytes not written to the cache (writer behind, disk full, no room) |
//! | `bucketdrive_read_cache_corrupt_blocks_total` | counter | | `read::cache`: cache blocks that failed their CRC32C on read-back, dropped and fetched again |
//! | `bucketdrive_read_cache_evictions_total` | counter | | `read::cache::fill`: cache files evicted to stay under `--read-cache-size` |
//! | `bucketdrive_read_cache_bytes_used` | gauge | | `read::cache`: disk bytes the read cache holds, as charged against `--read-cache-size` |
//! | `bucketdrive_read_cache_bytes_limit` | gauge | | `read::cache`: `--read-cache-size` (0 without a read cache) |
//! | `bucketdrive_store_requests_total` | counter | `op` | `store::gcs`: every HTTP request sent, retries included |
//! | `bucketdrive_store_errors_total` | counter | `op`, `kind` | `store::gcs`: requests that failed, by error class (404 on `head` is a normal lookup miss) |
//! | `bucketdrive_store_retries_total` | counter | `op` | `store::retry`: a failed attempt that is tried again |
//! | `bucketdrive_store_request_duration_seconds` | histogram | `op` | `store::gcs`: one request, until its answer's headers (a download's body streams after) |
//! | `bucketdrive_uploads_pending` | gauge | | `write::uploader`: files with a saved version (or orphaned changes) waiting for or in upload |
//! | `bucketdrive_uploads_total` | counter | | `write::uploader`: versions now in the bucket (conflict copies included) |
//! | `bucketdrive_upload_bytes_total` | counter | | `write::uploader`: the bytes of those versions |
//! | `bucketdrive_upload_failures_total` | counter | | `write::uploader`: upload attempts that failed and will be retried |
//! | `bucketdrive_conflicts_total` | counter | | `write::uploader`: versions saved as `NAME.conflict-…` because someone else changed the object |
//! | `bucketdrive_staged_bytes` | gauge | | `write::space`: bytes staged in the cache directory, as charged against `--cache-size` |
//!
//! `op` is one of [`STORE_OPS`]; for retries it may also be `read_range`, a download whose body
//! broke off and is fetched again. `kind` is one of [`ERROR_KINDS`].

use std::time::Duration;

use ::metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};

use crate::store::StoreErrorKind;

pub const READ_BYTES: &str = "bucketdrive_read_bytes_total";
pub const WRITTEN_BYTES: &str = "bucketdrive_written_bytes_total";
pub const FETCHED_BYTES: &str = "bucketdrive_fetched_bytes_total";
pub const PASSTHROUGH_OPENS: &str = "bucketdrive_passthrough_opens_total";
pub const PREFETCH_HITS: &str = "bucketdrive_prefetch_hits_total";
pub const PREFETCH_MISSES: &str = "bucketdrive_prefetch_misses_total";
pub const READ_BUDGET_IN_USE: &str = "bucketdrive_read_budget_bytes_in_use";
pub const READ_BUDGET_LIMIT: &str = "bucketdrive_read_budget_bytes_limit";
pub const READ_CACHE_HIT_BYTES: &str = "bucketdrive_read_cache_hit_bytes_total";
pub const READ_CACHE_MISS_BYTES: &str = "bucketdrive_read_cache_miss_bytes_total";
pub const READ_CACHE_SKIPPED_BYTES: &str = "bucketdrive_read_cache_skipped_bytes_total";
pub const READ_CACHE_CORRUPT_BLOCKS: &str = "bucketdrive_read_cache_corrupt_blocks_total";
pub const READ_CACHE_EVICTIONS: &str = "bucketdrive_read_cache_evictions_total";
pub const READ_CACHE_USED: &str = "bucketdrive_read_cache_bytes_used";
pub const READ_CACHE_LIMIT: &str = "bucketdrive_read_cache_bytes_limit";
pub const STORE_REQUESTS: &str = "bucketdrive_store_requests_total";
pub const STORE_ERRORS: &str = "bucketdrive_store_errors_total";
pub const STORE_RETRIES: &str = "bucketdrive_store_retries_total";
pub const STORE_REQUEST_DURATION: &str = "bucketdrive_store_request_duration_seconds";
pub const UPLOADS_PENDING: &str = "bucketdrive_uploads_pending";
pub const UPLOADS: &str = "bucketdrive_uploads_total";
pub const UPLOAD_BYTES: &str = "bucketdrive_upload_bytes_total";
pub const UPLOAD_FAILURES: &str = "bucketdrive_upload_failures_total";
pub const CONFLICTS: &str = "bucketdrive_conflicts_total";
pub const STAGED_BYTES: &str = "bucketdrive_staged_bytes";

/// The `op` label values of the store's requests (the names `store::gcs` passes).
pub const STORE_OPS: &[&str] = &[
    "head",
    "list",
    "get_range",
    "put",
    "start_resumable",
    "upload_chunk",
    "compose",
    "copy",
    "patch",
    "delete",
];

/// The `kind` label values of store errors, one per [`StoreErrorKind`].
pub const ERROR_KINDS: &[&str] = &[
    "not_found",
    "precondition_failed",
    "throttled",
    "transient",
    "permission_denied",
    "invalid_argument",
    "other",
];

/// Upper bounds (seconds) of the request-duration histogram's buckets: from a fast metadata
/// call on the same continent (a few ms) to a chunk upload near the 60 s read timeout.
pub const DURATION_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

fn kind_label(kind: StoreErrorKind) -> &'static str {
    match kind {
        StoreErrorKind::NotFound => "not_found",
        StoreErrorKind::PreconditionFailed => "precondition_failed",
        StoreErrorKind::Throttled => "throttled",
        StoreErrorKind::Transient => "transient",
        StoreErrorKind::PermissionDenied => "permission_denied",
        StoreErrorKind::InvalidArgument => "invalid_argument",
        StoreErrorKind::Other => "other",
    }
}

/// `n` bytes returned to a reader.
pub fn read_bytes(n: u64) {
    counter!(READ_BYTES).increment(n);
}

/// `n` bytes written through the daemon.
pub fn written_bytes(n: u64) {
    counter!(WRITTEN_BYTES).increment(n);
}

/// A file opened for the kernel to read (and write) itself (FUSE passthrough).
pub fn passthrough_open() {
    counter!(PASSTHROUGH_OPENS).increment(1);
}

/// `n` bytes downloaded from the bucket.
pub fn fetched_bytes(n: u64) {
    counter!(FETCHED_BYTES).increment(n);
}

/// A read the prefetcher had coming (`hit`) or had to fetch for (`!hit`).
pub fn prefetch(hit: bool) {
    if hit {
        counter!(PREFETCH_HITS).increment(1);
    } else {
        counter!(PREFETCH_MISSES).increment(1);
    }
}

/// The read-ahead budget's size.
pub fn read_budget_limit(bytes: u64) {
    gauge!(READ_BUDGET_LIMIT).set(bytes as f64);
}

/// `bytes` reserved from the read-ahead budget.
pub fn read_budget_reserved(bytes: u64) {
    gauge!(READ_BUDGET_IN_USE).increment(bytes as f64);
}

/// `bytes` given back to the read-ahead budget.
pub fn read_budget_released(bytes: u64) {
    gauge!(READ_BUDGET_IN_USE).decrement(bytes as f64);
}

/// `n` bytes served from the disk read cache.
pub fn read_cache_hit(n: u64) {
    counter!(READ_CACHE_HIT_BYTES).increment(n);
}

/// `n` bytes the read cache did not have, fetched from the bucket.
pub fn read_cache_miss(n: u64) {
    counter!(READ_CACHE_MISS_BYTES).increment(n);
}

/// `n` fetched bytes not written to the read cache.
pub fn read_cache_skipped(n: u64) {
    counter!(READ_CACHE_SKIPPED_BYTES).increment(n);
}

/// `n` read cache blocks failed their check on read-back.
pub fn read_cache_corrupt(n: u64) {
    counter!(READ_CACHE_CORRUPT_BLOCKS).increment(n);
}

/// `n` read cache files evicted.
pub fn read_cache_evicted(n: u64) {
    counter!(READ_CACHE_EVICTIONS).increment(n);
}

/// The read cache now holds `bytes` (as charged against its cap).
pub fn read_cache_used(bytes: u64) {
    gauge!(READ_CACHE_USED).set(bytes as f64);
}

/// The read cache's cap.
pub fn read_cache_limit(bytes: u64) {
    gauge!(READ_CACHE_LIMIT).set(bytes as f64);
}

/// One HTTP request to the bucket, how long it took, and the class of its failure if it failed.
pub fn store_request(op: &'static str, elapsed: Duration, error: Option<StoreErrorKind>) {
    counter!(STORE_REQUESTS, "op" => op).increment(1);
    histogram!(STORE_REQUEST_DURATION, "op" => op).record(elapsed.as_secs_f64());
    if let Some(kind) = error {
        counter!(STORE_ERRORS, "op" => op, "kind" => kind_label(kind)).increment(1);
    }
}

/// A failed attempt of `op` that will be tried again.
pub fn store_retry(op: &'static str) {
    counter!(STORE_RETRIES, "op" => op).increment(1);
}

/// A version of `bytes` bytes is in the bucket.
pub fn uploaded(bytes: u64) {
    counter!(UPLOADS).increment(1);
    counter!(UPLOAD_BYTES).increment(bytes);
}

/// An upload attempt failed; it will be retried.
pub fn upload_failed() {
    counter!(UPLOAD_FAILURES).increment(1);
}

/// A version was saved as a conflict copy.
pub fn conflict() {
    counter!(CONFLICTS).increment(1);
}

/// `bytes` more staged in the cache directory.
pub fn staged_added(bytes: u64) {
    gauge!(STAGED_BYTES).increment(bytes as f64);
}

/// `bytes` fewer staged in the cache directory.
pub fn staged_removed(bytes: u64) {
    gauge!(STAGED_BYTES).decrement(bytes as f64);
}

/// One file in [`UPLOADS_PENDING`] for as long as this lives: the uploader holds one per item
/// task, from the moment the task is started (under the item's lock, so the gauge already
/// counts the file when `close` returns) until the task finds nothing left to upload. A guard
/// rather than paired calls, so no early return can leave the gauge high.
#[derive(Debug)]
pub struct PendingUpload(());

impl PendingUpload {
    pub fn new() -> Self {
        gauge!(UPLOADS_PENDING).increment(1.0);
        PendingUpload(())
    }
}

impl Default for PendingUpload {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for PendingUpload {
    fn drop(&mut self) {
        gauge!(UPLOADS_PENDING).decrement(1.0);
    }
}

/// Gives every metric its help text and makes the unlabelled ones, and the per-operation
/// request and retry counters, appear at zero, so the first scrape already shows them (a
/// series that appears only on its first event makes `rate()` miss that event). Called once,
/// after the recorder is installed.
pub fn describe() {
    use ::metrics::Unit;
    let counters: &[(&'static str, Unit, &'static str)] = &[
        (
            READ_BYTES,
            Unit::Bytes,
            "Bytes returned to readers, from the bucket or from files being written.",
        ),
        (
            WRITTEN_BYTES,
            Unit::Bytes,
            "Bytes written through the daemon into files being written (not those the kernel writes itself, FUSE passthrough).",
        ),
        (
            FETCHED_BYTES,
            Unit::Bytes,
            "Bytes downloaded from the bucket: read-ahead parts, demand reads, fills of staged files.",
        ),
        (
            PASSTHROUGH_OPENS,
            Unit::Count,
            "Opens the kernel serves itself from a local file, a read-cache file or a file being written (FUSE passthrough); their reads and writes reach none of the byte counters.",
        ),
        (
            PREFETCH_HITS,
            Unit::Count,
            "Reads whose bytes the reader had already requested or held.",
        ),
        (
            PREFETCH_MISSES,
            Unit::Count,
            "Reads that had to start a GET for their own bytes.",
        ),
        (
            READ_CACHE_HIT_BYTES,
            Unit::Bytes,
            "Bytes served from the disk read cache (--read-cache-dir).",
        ),
        (
            READ_CACHE_MISS_BYTES,
            Unit::Bytes,
            "Bytes the disk read cache did not have, fetched from the bucket.",
        ),
        (
            READ_CACHE_SKIPPED_BYTES,
            Unit::Bytes,
            "Fetched bytes not written to the read cache: writer behind, disk full or no room.",
        ),
        (
            READ_CACHE_CORRUPT_BLOCKS,
            Unit::Count,
            "Read cache blocks that failed their CRC32C check and were fetched again.",
        ),
        (
            READ_CACHE_EVICTIONS,
            Unit::Count,
            "Read cache files evicted to stay under --read-cache-size.",
        ),
        (
            UPLOADS,
            Unit::Count,
            "File versions now in the bucket (conflict copies included).",
        ),
        (
            UPLOAD_BYTES,
            Unit::Bytes,
            "Bytes of the file versions now in the bucket.",
        ),
        (
            UPLOAD_FAILURES,
            Unit::Count,
            "Upload attempts that failed and will be retried.",
        ),
        (
            CONFLICTS,
            Unit::Count,
            "Versions saved as NAME.conflict-TIMESTAMP because the object changed in the bucket.",
        ),
    ];
    for &(name, unit, help) in counters {
        describe_counter!(name, unit, help);
        counter!(name).increment(0);
    }
    let gauges: &[(&'static str, Unit, &'static str)] = &[
        (
            READ_BUDGET_IN_USE,
            Unit::Bytes,
            "Bytes of read-ahead memory reserved by open files.",
        ),
        (
            READ_BUDGET_LIMIT,
            Unit::Bytes,
            "The read-ahead memory budget (--max-read-memory).",
        ),
        (
            READ_CACHE_USED,
            Unit::Bytes,
            "Disk bytes the read cache holds, as charged against --read-cache-size.",
        ),
        (
            READ_CACHE_LIMIT,
            Unit::Bytes,
            "The read cache's size (--read-cache-size); 0 without a read cache.",
        ),
        (
            UPLOADS_PENDING,
            Unit::Count,
            "Files with a saved version waiting for upload or uploading.",
        ),
        (
            STAGED_BYTES,
            Unit::Bytes,
            "Bytes staged in the cache directory, as charged against --cache-size.",
        ),
    ];
    for &(name, unit, help) in gauges {
        describe_gauge!(name, unit, help);
        gauge!(name).increment(0.0);
    }
    describe_counter!(
        STORE_REQUESTS,
        Unit::Count,
        "HTTP requests sent to the bucket, retries included."
    );
    describe_counter!(
        STORE_ERRORS,
        Unit::Count,
        "Bucket requests that failed, by error class."
    );
    describe_counter!(
        STORE_RETRIES,
        Unit::Count,
        "Failed bucket requests that are tried again."
    );
    describe_histogram!(
        STORE_REQUEST_DURATION,
        Unit::Seconds,
        "Duration of one bucket request, until its answer's headers."
    );
    for &op in STORE_OPS {
        counter!(STORE_REQUESTS, "op" => op).increment(0);
        counter!(STORE_RETRIES, "op" => op).increment(0);
    }
}

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
