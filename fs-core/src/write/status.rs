//! What `bucketdrive status` reports about the write path: counters kept as uploads happen,
//! and a snapshot of the work still pending.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Counters for `bucketdrive status`.
#[derive(Debug, Default)]
pub struct Counters {
    pub uploaded_files: AtomicU64,
    pub uploaded_bytes: AtomicU64,
    pub uploading_files: AtomicU64,
    pub conflicts: AtomicU64,
    pub failures: AtomicU64,
    /// Versions whose staged bytes vanished from the cache directory (never uploadable).
    pub lost_files: AtomicU64,
    /// (when, bytes) of the uploads finished in the last [`RATE_WINDOW`].
    recent: parking_lot::Mutex<VecDeque<(Instant, u64)>>,
}

/// The window the current upload throughput is measured over.
const RATE_WINDOW: Duration = Duration::from_secs(10);

/// Each outcome is recorded once, here: in the status counters and in the metrics.
impl Counters {
    pub(super) fn record_upload(&self, size: u64) {
        crate::metrics::uploaded(size);
        self.uploaded_bytes.fetch_add(size, Ordering::Relaxed);
        self.uploaded_files.fetch_add(1, Ordering::Relaxed);
        let mut recent = self.recent.lock();
        recent.push_back((Instant::now(), size));
        Self::prune(&mut recent);
    }

    pub(super) fn record_failure(&self) {
        crate::metrics::upload_failed();
        self.failures.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn record_conflict(&self) {
        crate::metrics::conflict();
        self.conflicts.fetch_add(1, Ordering::Relaxed);
    }

    fn prune(recent: &mut VecDeque<(Instant, u64)>) {
        while recent
            .front()
            .is_some_and(|(t, _)| t.elapsed() > RATE_WINDOW)
        {
            recent.pop_front();
        }
    }

    /// Bytes per second of uploads finished over the last [`RATE_WINDOW`].
    pub(super) fn rate(&self) -> u64 {
        let mut recent = self.recent.lock();
        Self::prune(&mut recent);
        recent.iter().map(|(_, b)| b).sum::<u64>() / RATE_WINDOW.as_secs()
    }

    /// The counters part of a [`Status`].
    pub(super) fn status(&self) -> Status {
        Status {
            uploading_files: self.uploading_files.load(Ordering::Relaxed),
            uploaded_files: self.uploaded_files.load(Ordering::Relaxed),
            uploaded_bytes: self.uploaded_bytes.load(Ordering::Relaxed),
            conflicts: self.conflicts.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            lost_files: self.lost_files.load(Ordering::Relaxed),
            upload_rate: self.rate(),
            ..Default::default()
        }
    }
}

/// A snapshot of the engine for `status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Status {
    /// Files changed and not yet in the bucket, and their bytes.
    pub pending_files: u64,
    pub pending_bytes: u64,
    pub uploading_files: u64,
    pub uploaded_files: u64,
    pub uploaded_bytes: u64,
    pub conflicts: u64,
    pub failures: u64,
    /// Pending files whose latest upload attempt failed (retried with backoff).
    #[serde(default)]
    pub failed_files: u64,
    /// Pending files with changes not yet closed or fsync'd (still being written).
    #[serde(default)]
    pub unsaved_files: u64,
    /// Bytes per second of uploads that finished in the last ten seconds.
    #[serde(default)]
    pub upload_rate: u64,
    /// Versions whose staged bytes vanished from the cache directory.
    #[serde(default)]
    pub lost_files: u64,
    /// Files with changes that nothing will upload: a write to them failed (they stay so until
    /// rewritten whole), or their last close failed and no handle is left. The bucket keeps
    /// their last whole version; the changes stay staged.
    #[serde(default)]
    pub held_files: u64,
    #[serde(default)]
    pub held_bytes: u64,
    /// The bucket cannot be reached: lookups and listings answer from the last state the mount
    /// saw, plus its own staged changes (filled in by the facade, not by the write path).
    #[serde(default)]
    pub offline: bool,
}
