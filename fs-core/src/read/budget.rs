//! The global read-ahead memory budget, shared by every open file of a mount.
//!
//! Each prefetch part reserves its size before its GET is sent and releases it when the part is
//! dropped. A reservation that does not fit is refused rather than awaited: the reader then
//! fetches only what it was asked for. Many readers therefore slow down to demand reads instead
//! of running the process out of memory, and no reader can wait forever on memory that another,
//! idle handle holds.
//!
//! Readers also get a fair share: a reader streaming ahead ([`ReadBudget::join`]) holds at most
//! the budget divided by the readers streaming at that moment ([`ReadBudget::fair_share`]). The
//! first reader of a quiet mount may use the whole budget for many streams; when others start,
//! each keeps its window within its share, so a new reader finds room instead of falling back
//! to demand reads while one early reader holds everything.
//!
//! The bytes in use are mirrored in `bucketdrive_read_budget_bytes_in_use` ([`crate::metrics`])
//! at the two places they change: a reservation made, a reservation dropped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Debug)]
struct Inner {
    total: u64,
    used: AtomicU64,
    peak: AtomicU64,
    /// Readers streaming ahead now.
    streaming: AtomicU64,
}

/// A byte budget with non-blocking reservations.
#[derive(Debug, Clone)]
pub struct ReadBudget {
    inner: Arc<Inner>,
}

/// Bytes held against the budget until dropped.
#[derive(Debug)]
pub struct Reservation {
    inner: Arc<Inner>,
    bytes: u64,
}

impl ReadBudget {
    pub fn new(total: u64) -> Self {
        crate::metrics::read_budget_limit(total);
        ReadBudget {
            inner: Arc::new(Inner {
                total,
                used: AtomicU64::new(0),
                peak: AtomicU64::new(0),
                streaming: AtomicU64::new(0),
            }),
        }
    }

    /// Reserves `bytes` if they fit now.
    pub fn try_reserve(&self, bytes: u64) -> Option<Reservation> {
        let total = self.inner.total;
        let prev = self
            .inner
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(bytes).filter(|n| *n <= total)
            })
            .ok()?;
        self.inner.peak.fetch_max(prev + bytes, Ordering::AcqRel);
        crate::metrics::read_budget_reserved(bytes);
        Some(Reservation {
            inner: self.inner.clone(),
            bytes,
        })
    }

    /// Counts a reader as streaming ahead until the token is dropped.
    pub fn join(&self) -> Streaming {
        self.inner.streaming.fetch_add(1, Ordering::AcqRel);
        Streaming {
            inner: self.inner.clone(),
        }
    }

    /// The most one streaming reader should hold: the budget split evenly between the readers
    /// streaming now.
    pub fn fair_share(&self) -> u64 {
        self.inner.total / self.inner.streaming.load(Ordering::Acquire).max(1)
    }

    /// Readers streaming ahead now.
    pub fn streaming_readers(&self) -> u64 {
        self.inner.streaming.load(Ordering::Acquire)
    }

    pub fn total(&self) -> u64 {
        self.inner.total
    }

    pub fn in_use(&self) -> u64 {
        self.inner.used.load(Ordering::Acquire)
    }

    /// Highest `in_use` ever seen.
    pub fn peak(&self) -> u64 {
        self.inner.peak.load(Ordering::Acquire)
    }
}

/// A reader's place among the streaming readers; see [`ReadBudget::join`].
#[derive(Debug)]
pub struct Streaming {
    inner: Arc<Inner>,
}

impl Drop for Streaming {
    fn drop(&mut self) {
        self.inner.streaming.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.inner.used.fetch_sub(self.bytes, Ordering::AcqRel);
        crate::metrics::read_budget_released(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_fit_and_release() {
        let b = ReadBudget::new(10);
        let r1 = b.try_reserve(6).unwrap();
        assert!(b.try_reserve(5).is_none());
        let r2 = b.try_reserve(4).unwrap();
        assert_eq!(b.in_use(), 10);
        drop(r1);
        assert_eq!(b.in_use(), 4);
        drop(r2);
        assert_eq!(b.in_use(), 0);
        assert_eq!(b.peak(), 10);
    }

    #[test]
    fn fair_share_splits_between_streaming_readers() {
        let b = ReadBudget::new(1000);
        assert_eq!(b.fair_share(), 1000);
        let one = b.join();
        assert_eq!(b.fair_share(), 1000);
        let two = b.join();
        let three = b.join();
        assert_eq!(b.fair_share(), 333);
        drop(two);
        assert_eq!(b.fair_share(), 500);
        drop((one, three));
        assert_eq!(b.fair_share(), 1000);
    }
}
