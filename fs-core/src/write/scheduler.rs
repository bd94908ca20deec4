//! When an item's upload may start: the one place that owns delays and backoff.
//!
//! Two clocks gate an attempt, and both must have passed:
//! - `ready_at`, the write-back delay after the last commit. It batches a file rewritten in
//!   quick succession into one upload, and may be moved *earlier* by anyone who needs the data
//!   in the bucket now: `fsync`, a drain at unmount, a full cache.
//! - `retry_at`, the backoff after a failed attempt (doubling up to `--upload-retry-max`).
//!   Nothing moves it earlier: a drain that keeps asking cannot turn backoff into a busy loop
//!   against a bucket that is down.
//!
//! A failing item sleeps without holding an upload slot, so it never blocks others.

use std::time::Duration;

use tokio::time::Instant;

use super::item::backoff;

#[derive(Debug, Default)]
pub(super) struct Sched {
    pub ready_at: Option<Instant>,
    pub retry_at: Option<Instant>,
    /// Failed attempts in a row.
    pub failures: u32,
    /// An upload task runs for the item.
    pub task: bool,
    /// An attempt is in flight (it holds no lock while it runs).
    pub uploading: bool,
    /// Namespace changes in progress on this file; no attempt starts meanwhile.
    pub paused: u32,
}

impl Sched {
    /// When the next attempt may start (`None`: nothing is due).
    pub fn start_at(&self) -> Option<Instant> {
        let ready = self.ready_at?;
        Some(self.retry_at.map_or(ready, |r| r.max(ready)))
    }

    /// The upload is due `delay` from now (after a commit).
    pub fn due_in(&mut self, delay: Duration) {
        self.ready_at = Some(Instant::now() + delay);
    }

    /// The data is wanted in the bucket now: the write-back delay is skipped, backoff is not.
    pub fn expedite(&mut self) -> bool {
        let now = Instant::now();
        match self.ready_at {
            Some(t) if t <= now => false,
            _ => {
                self.ready_at = Some(now);
                true
            }
        }
    }

    /// An attempt failed: back off. Returns the wait.
    pub fn failed(&mut self, initial: Duration, max: Duration) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let wait = backoff(initial, max, self.failures);
        self.retry_at = Some(Instant::now() + wait);
        wait
    }

    pub fn succeeded(&mut self) {
        self.failures = 0;
        self.retry_at = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expediting_never_skips_backoff() {
        let mut s = Sched::default();
        s.due_in(Duration::from_secs(60));
        let wait = s.failed(Duration::from_secs(1), Duration::from_secs(60));
        assert_eq!(wait, Duration::from_secs(1));
        assert_eq!(
            s.failed(Duration::from_secs(1), Duration::from_secs(60)),
            Duration::from_secs(2)
        );
        assert!(s.expedite());
        let start = s.start_at().unwrap();
        assert!(start >= s.retry_at.unwrap(), "backoff still holds");
        for _ in 0..40 {
            s.failed(Duration::from_secs(1), Duration::from_secs(60));
        }
        assert!(s.retry_at.unwrap() <= Instant::now() + Duration::from_secs(60));
        s.succeeded();
        assert!(s.start_at().unwrap() <= Instant::now());
    }
}
