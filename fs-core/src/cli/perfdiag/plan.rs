//! The measurement plan: what `perfdiag` measures, how big and how long each step may be, and
//! how the time budget is shared between the steps.
//!
//! Every step is bounded twice, by bytes (or objects) and by time, whichever comes first, and
//! the whole run by a time limit, so a run with the defaults ends in under three minutes on a
//! fast link and on a slow one alike. The defaults move up to about 4 GiB each way on a fast
//! link (typically 2 to 3, as the curves flatten); the flags that shrink them exist for tests
//! and quick checks.

use std::time::Duration;

/// The size of the objects of the small-object steps.
pub const SMALL_OBJECT_SIZE: u64 = 10 * 1024;
/// The first object of the single-stream write, whose rate sizes the second.
pub const PROBE_SIZE: u64 = 4 << 20;
/// The largest test object: it is held in memory.
pub const MAX_OBJECT_SIZE: u64 = 2 << 30;
/// Deletes in flight when temporary objects are removed.
pub const DELETE_CONCURRENCY: usize = 32;
/// GCS composes at most this many sources in one request.
pub const MAX_COMPOSE_SOURCES: usize = 32;

/// How much each step may do.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The object the single-stream write makes and every read reads (smaller if the link is
    /// too slow to write it in the step's time). Held in memory.
    pub object_size: u64,
    /// One ranged GET, and one part of a composite write.
    pub part_size: u64,
    /// The longest a concurrency step runs; the single-stream and latency steps get twice it.
    pub step_time: Duration,
    /// The most bytes a concurrency step starts to move.
    pub step_bytes: u64,
    /// The highest concurrency tried (the ladder doubles from 1 up to it).
    pub max_concurrency: usize,
    /// First-byte latency samples.
    pub latency_samples: usize,
    /// The most 10 KiB objects one small-object step uploads.
    pub small_objects: usize,
    /// Time for all the measurements together; deleting the objects comes after it.
    pub time_limit: Duration,
}

impl Default for Plan {
    fn default() -> Self {
        Plan {
            object_size: 128 << 20,
            part_size: 8 << 20,
            step_time: Duration::from_secs(4),
            step_bytes: 512 << 20,
            max_concurrency: 64,
            latency_samples: 100,
            small_objects: 1000,
            time_limit: Duration::from_secs(150),
        }
    }
}

impl Plan {
    /// Refuses a plan that cannot run, with a one-line reason naming the flag.
    pub fn check(&self) -> Result<(), String> {
        if self.object_size == 0 || self.object_size > MAX_OBJECT_SIZE {
            return Err(
                "--object-size must be more than 0 and at most 2GiB (it is held in memory)".into(),
            );
        }
        if self.part_size == 0 || self.part_size > self.object_size {
            return Err("--part-size must be more than 0 and at most --object-size".into());
        }
        if self.step_time.is_zero() || self.time_limit.is_zero() {
            return Err("--step-time and --time-limit must be more than 0".into());
        }
        if self.step_bytes < self.part_size {
            return Err("--step-bytes must be at least --part-size".into());
        }
        if !(1..=1024).contains(&self.max_concurrency) {
            return Err("--max-concurrency must be 1 to 1024".into());
        }
        if self.latency_samples == 0 || self.small_objects == 0 {
            return Err("--latency-samples and --small-objects must be more than 0".into());
        }
        Ok(())
    }

    /// The concurrencies tried, in order: 1, 2, 4, … doubling, and the maximum itself last
    /// when it is not a power of two.
    pub fn ladder(&self) -> Vec<usize> {
        let mut out = Vec::new();
        let mut c = 1;
        while c < self.max_concurrency {
            out.push(c);
            c *= 2;
        }
        out.push(self.max_concurrency.max(1));
        out
    }

    /// The time of the latency step and of each single-stream step.
    pub fn single_time(&self) -> Duration {
        self.step_time * 2
    }

    /// Parts one composite write step uploads at most: its byte bound in parts, and no more
    /// than two levels of composes can join.
    pub fn max_parts(&self) -> usize {
        let parts = (self.step_bytes / self.part_size).max(1);
        parts.min((MAX_COMPOSE_SOURCES * MAX_COMPOSE_SOURCES) as u64) as usize
    }

    /// Progress units of a whole run: latency, single-stream write and read, and one per step
    /// of the three ladders (ranged reads, composite writes, small objects).
    pub fn steps(&self) -> u64 {
        3 + 3 * self.ladder().len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ladder_doubles_up_to_the_maximum() {
        let mut p = Plan::default();
        assert_eq!(p.ladder(), vec![1, 2, 4, 8, 16, 32, 64]);
        p.max_concurrency = 6;
        assert_eq!(p.ladder(), vec![1, 2, 4, 6]);
        p.max_concurrency = 1;
        assert_eq!(p.ladder(), vec![1]);
        assert_eq!(p.steps(), 6);
    }

    #[test]
    fn parts_fit_two_compose_levels() {
        let mut p = Plan::default();
        assert_eq!(p.max_parts(), 64);
        p.part_size = 1;
        p.step_bytes = 1 << 30;
        assert_eq!(p.max_parts(), 1024);
    }

    #[test]
    fn impossible_plans_are_refused_with_the_flag() {
        assert!(Plan::default().check().is_ok());
        let p = Plan {
            part_size: 256 << 20,
            ..Plan::default()
        };
        assert!(p.check().unwrap_err().contains("--part-size"));
        let p = Plan {
            max_concurrency: 0,
            ..Plan::default()
        };
        assert!(p.check().unwrap_err().contains("--max-concurrency"));
        let p = Plan {
            step_bytes: 1,
            ..Plan::default()
        };
        assert!(p.check().unwrap_err().contains("--step-bytes"));
        let p = Plan {
            object_size: 3 << 30,
            ..Plan::default()
        };
        assert!(p.check().unwrap_err().contains("held in memory"));
    }
}
