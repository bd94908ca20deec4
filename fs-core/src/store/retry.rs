//! Retrying throttled and transient bucket failures with exponential backoff and full jitter.
//!
//! GCS asks clients to back off exponentially on 408, 429 and 5xx. Retries are bounded both in
//! count and in total time, so a dead endpoint turns into an error instead of a hang, and each
//! retry is logged at `warn` so users can see why an operation is slow, and counted
//! (`bucketdrive_store_retries_total`, by operation) here, where the decision to retry is made.
//!
//! A caller that has an answer of its own to give when the bucket cannot be reached (the
//! namespace's last known state of a directory) runs its requests in [`with_fallback`]: each
//! of them then stops after its first retry instead of spending the whole budget, so the user
//! waits a fraction of a second for the fallback rather than the better part of a minute.
//! Everything else keeps the full budget.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use rand::{Rng, SeedableRng};

use super::StoreResult;

/// How hard to retry.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// No new attempt starts after this much time since the first.
    pub max_elapsed: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 8,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
            max_elapsed: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The upper bound of the sleep before attempt `attempt + 1` (attempt counts from 1).
    fn backoff_cap(&self, attempt: u32) -> Duration {
        let factor = 1u32
            .checked_shl(attempt.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.initial_backoff
            .saturating_mul(factor)
            .min(self.max_backoff)
    }
}

thread_local! {
    /// A seeded jitter source for the deterministic simulation; `None`: the thread's RNG.
    static JITTER: std::cell::RefCell<Option<rand::rngs::StdRng>> = const { std::cell::RefCell::new(None) };
}

/// Makes retry jitter on this thread come from `seed` (`None`: truly random, the default), so a
/// simulation seed replays the same sleeps.
pub fn seed_jitter(seed: Option<u64>) {
    JITTER.with(|j| *j.borrow_mut() = seed.map(rand::rngs::StdRng::seed_from_u64));
}

/// A sleep drawn uniformly from `0..=cap` (full jitter).
fn jitter(cap: Duration) -> Duration {
    JITTER.with(|j| match j.borrow_mut().as_mut() {
        Some(rng) => rng.gen_range(Duration::ZERO..=cap),
        None => rand::thread_rng().gen_range(Duration::ZERO..=cap),
    })
}

/// Attempts a request makes inside [`with_fallback`]: the first, and one retry.
pub const FALLBACK_ATTEMPTS: u32 = 2;

tokio::task_local! {
    /// Set while the caller has a fallback answer: the most attempts any request may make.
    static ATTEMPTS_CAP: u32;
}

/// Runs `fut` with every bucket request in it (on this task) retried at most once: the caller
/// has an answer to fall back on, so a bucket that fails twice in a row is taken as unreachable.
pub async fn with_fallback<F: Future>(fut: F) -> F::Output {
    ATTEMPTS_CAP.scope(FALLBACK_ATTEMPTS, fut).await
}

/// Runs `op` until it succeeds, fails permanently, or the policy is exhausted (within
/// [`with_fallback`], after its first retry).
pub async fn with_retry<T, F, Fut>(
    policy: RetryPolicy,
    what: &'static str,
    key: &str,
    mut op: F,
) -> StoreResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = StoreResult<T>>,
{
    let max_attempts = ATTEMPTS_CAP
        .try_with(|cap| policy.max_attempts.min(*cap))
        .unwrap_or(policy.max_attempts);
    let start = Instant::now();
    let mut attempt = 1;
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if e.is_retryable() && attempt < max_attempts => {
                let cap = policy.backoff_cap(attempt);
                let sleep = jitter(cap);
                if start.elapsed() + sleep > policy.max_elapsed {
                    tracing::warn!(op = what, key, attempt, error = %e, "giving up: retry time exhausted");
                    return Err(e);
                }
                tracing::warn!(op = what, key, attempt, backoff_ms = sleep.as_millis() as u64, error = %e, "retrying");
                crate::metrics::store_retry(what);
                tokio::time::sleep(sleep).await;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{StoreError, StoreErrorKind};
    use std::sync::atomic::{AtomicU32, Ordering};

    fn fast() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(2),
            max_elapsed: Duration::from_secs(5),
        }
    }

    #[tokio::test]
    async fn retries_transient_then_succeeds() {
        let calls = AtomicU32::new(0);
        let r = with_retry(fast(), "t", "k", || async {
            if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                Err(StoreError::new(StoreErrorKind::Throttled, "429"))
            } else {
                Ok(7)
            }
        })
        .await;
        assert_eq!(r.unwrap(), 7);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn bounded_attempts_and_no_retry_of_permanent() {
        let calls = AtomicU32::new(0);
        let r: StoreResult<()> = with_retry(fast(), "t", "k", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(StoreError::new(StoreErrorKind::Transient, "503"))
        })
        .await;
        assert!(r.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 4);

        let calls = AtomicU32::new(0);
        let r: StoreResult<()> = with_retry(fast(), "t", "k", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(StoreError::new(StoreErrorKind::NotFound, "404"))
        })
        .await;
        assert!(r.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    /// With a fallback, a request that keeps failing stops after its first retry; the same
    /// request without one spends the policy's attempts. Permanent failures are not retried.
    #[tokio::test(start_paused = true)]
    async fn a_fallback_stops_after_the_first_retry() {
        let failing = |calls: &AtomicU32| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err::<(), _>(StoreError::new(StoreErrorKind::Transient, "reset")) }
        };
        let calls = AtomicU32::new(0);
        let r = with_fallback(with_retry(RetryPolicy::default(), "t", "k", || {
            failing(&calls)
        }))
        .await;
        assert!(r.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), FALLBACK_ATTEMPTS);

        let calls = AtomicU32::new(0);
        let r = with_retry(RetryPolicy::default(), "t", "k", || failing(&calls)).await;
        assert!(r.is_err());
        assert_eq!(
            calls.load(Ordering::SeqCst),
            8,
            "no fallback: the whole budget"
        );

        let calls = AtomicU32::new(0);
        let r = with_fallback(with_retry(fast(), "t", "k", || async {
            if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                Err(StoreError::new(StoreErrorKind::Throttled, "429"))
            } else {
                Ok(3)
            }
        }))
        .await;
        assert_eq!(r.unwrap(), 3, "one retry is still made");
    }

    #[test]
    fn backoff_grows_and_caps() {
        let p = RetryPolicy::default();
        assert_eq!(p.backoff_cap(1), Duration::from_millis(100));
        assert_eq!(p.backoff_cap(3), Duration::from_millis(400));
        assert_eq!(p.backoff_cap(40), Duration::from_secs(10));
    }
}
