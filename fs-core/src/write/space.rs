//! Staging space: the bytes staged on the cache disk, held under `--cache-size`.
//!
//! Every item is charged the bytes its staging files will reach (its working copy, plus the
//! acknowledged version it keeps apart while that is uploading). A charge that does not fit
//! makes the closed files upload now and waits for their space to come back; it fails with
//! `ENOSPC` only when the files still open (and those kept as not saved, which no upload frees)
//! could not fit even if everything else were uploaded, or when uploads free nothing for
//! [`SPACE_WAIT_LIMIT`]. Reservations never block a file that fits, and nothing here holds a
//! lock while it waits. Times are tokio's, so a paused test clock drives them.
//!
//! Without `--cache-size` the bytes are still counted (against no limit), so the staged bytes
//! the metrics report (`bucketdrive_staged_bytes`, changed here with every charge and refund)
//! mean the same with or without a limit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{FsError, FsResult};

/// How long a write waits for uploads to free staging space without any being freed before it
/// gives up with `ENOSPC`.
pub const SPACE_WAIT_LIMIT: Duration = Duration::from_secs(120);

/// Staging space in use, against the limit.
pub(super) struct Space {
    limit: Option<u64>,
    used: AtomicU64,
    /// Signalled whenever charged space is given back.
    freed: tokio::sync::Notify,
}

impl Space {
    pub fn new(limit: Option<u64>) -> Self {
        Space {
            limit,
            used: AtomicU64::new(0),
            freed: tokio::sync::Notify::new(),
        }
    }

    /// Charges bytes already on disk (journal replay), even past the limit: new writes wait.
    /// `charge` becomes `size` (it may already hold part of it).
    pub fn charge_existing(&self, charge: &AtomicU64, size: u64) {
        let old = charge.swap(size, Ordering::SeqCst);
        if size > old {
            self.used.fetch_add(size - old, Ordering::SeqCst);
            crate::metrics::staged_added(size - old);
        } else if old > size {
            self.used.fetch_sub(old - size, Ordering::SeqCst);
            crate::metrics::staged_removed(old - size);
        }
    }

    /// Makes sure `charge` is at least `size`, waiting for uploads when the space is full.
    /// `open_bytes` tells how much open files, and files kept as not saved, hold (uploads
    /// cannot free that); `own_open` whether this item is open; `hurry` asks closed files to
    /// upload now.
    pub async fn reserve(
        &self,
        charge: &AtomicU64,
        own_open: bool,
        size: u64,
        open_bytes: impl Fn() -> u64,
        hurry: impl Fn(),
    ) -> FsResult<()> {
        // No limit: everything fits, but is still counted.
        let limit = self.limit.unwrap_or(u64::MAX);
        let mut waited_since = Instant::now();
        loop {
            let charged = charge.load(Ordering::SeqCst);
            if size <= charged {
                return Ok(());
            }
            let delta = size - charged;
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let used = self.used.load(Ordering::SeqCst);
            if let Some(now) = used.checked_add(delta).filter(|n| *n <= limit) {
                if self
                    .used
                    .compare_exchange(used, now, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
                {
                    charge.store(size, Ordering::SeqCst);
                    crate::metrics::staged_added(delta);
                    return Ok(());
                }
                continue;
            }
            let open = open_bytes();
            let own = if own_open { 0 } else { charged };
            if open + own + delta > limit {
                tracing::warn!(
                    limit,
                    open_bytes = open,
                    "cache size reached by files still open or kept as not saved"
                );
                return Err(FsError::NoSpace);
            }
            if waited_since.elapsed() > SPACE_WAIT_LIMIT {
                tracing::error!(
                    limit,
                    "cache full and no upload has freed space for {:?}",
                    SPACE_WAIT_LIMIT
                );
                return Err(FsError::NoSpace);
            }
            hurry();
            if tokio::time::timeout(Duration::from_secs(1), freed)
                .await
                .is_ok()
            {
                waited_since = Instant::now();
            }
        }
    }

    /// Lowers `charge` to `size` when that is lower, giving the rest back.
    pub fn recharge(&self, charge: &AtomicU64, size: u64) {
        let old = charge.load(Ordering::SeqCst);
        if size < old {
            charge.store(size, Ordering::SeqCst);
            self.used.fetch_sub(old - size, Ordering::SeqCst);
            crate::metrics::staged_removed(old - size);
            self.freed.notify_waiters();
        }
    }
}
