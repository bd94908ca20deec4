//! Releases under way, so that an unmount waits for them before it finishes the uploads.
//!
//! The kernel sends a file's release after `close()` has returned, and the adapter answers it
//! on the runtime, not on the session loop. When the mount goes away right after a close (a
//! `systemctl stop` just after a program saved a file), the session can end while that
//! release is still queued or running. Writes that came after the file's last flush (through a
//! shared mapping, or the kernel's write-back cache) become a version to upload only at the
//! last handle's release: a drain before it finds nothing pending, and the process would exit
//! with them only staged (kept, and uploaded by the next mount, but not in the bucket when the
//! service said it had stopped).
//!
//! On a mount whose files the kernel writes itself (passthrough), the release is also where
//! a closed file's version gets its CRC32C: between the last handle going and that seal, a
//! drain finds a version it cannot seal with no handle left to seal it, and an unmount gives it
//! up as failed.
//!
//! So a release counts as under way from the moment the adapter receives it
//! ([`super::Filesystem::begin_release`], called before the task that runs it is spawned) until
//! it has finished, and once the session has ended the unmount waits until none is
//! ([`super::Filesystem::settle_releases`], in `cli::lifecycle::finish`) before its last drain.
//! A drain asked for while the mount is live (`bucketdrive unmount`'s) does not wait: releases
//! keep coming there.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

/// How long an unmount waits for releases under way before it drains without them (their
/// files stay staged for the next mount). A release reads a file written through passthrough
/// once for its CRC32C and appends a journal line: seconds even for big files.
pub const RELEASE_PATIENCE: Duration = Duration::from_secs(60);

/// Counts releases under way.
#[derive(Debug, Default)]
pub struct Releasing {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    under_way: AtomicUsize,
    idle: Notify,
}

/// One release under way, until dropped.
#[derive(Debug)]
#[must_use = "the release counts as under way only while this lives"]
pub struct ReleaseUnderWay {
    inner: Arc<Inner>,
}

impl Releasing {
    /// Counts a release as under way until the returned value drops.
    pub fn enter(&self) -> ReleaseUnderWay {
        self.inner.under_way.fetch_add(1, Ordering::SeqCst);
        ReleaseUnderWay {
            inner: self.inner.clone(),
        }
    }

    /// Waits until no release is under way; `false` if some still are after `patience`.
    pub async fn settled(&self, patience: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let idle = self.inner.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.inner.under_way.load(Ordering::SeqCst) == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                return self.inner.under_way.load(Ordering::SeqCst) == 0;
            }
        }
    }
}

impl Drop for ReleaseUnderWay {
    fn drop(&mut self) {
        if self.inner.under_way.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.inner.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Settled at once with nothing under way; waits for the last of several; gives up after
    /// its patience while one stays.
    #[tokio::test]
    async fn waits_for_the_last_release() {
        let r = Releasing::default();
        assert!(r.settled(Duration::ZERO).await);
        let (a, b) = (r.enter(), r.enter());
        let waiting = tokio::spawn({
            let inner = r.inner.clone();
            async move { Releasing { inner }.settled(Duration::from_secs(30)).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(a);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "one release is still under way");
        drop(b);
        assert!(waiting.await.unwrap());
        let _c = r.enter();
        assert!(!r.settled(Duration::from_millis(20)).await);
    }
}
