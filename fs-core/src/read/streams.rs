//! How many ranged GETs one sequential reader keeps in flight: fixed, or found by probing.
//!
//! One stream to GCS is capped well below what the host can take, and the cap differs by
//! link, region and object, so no fixed number of streams is right everywhere: 8 streams waste
//! half of a link that 16 would fill, and 64 on a slow link only hold memory and sockets. A
//! reader therefore starts at a few streams and *probes*: after enough parts at the current
//! level, it estimates the throughput that level gives, doubles the level if the estimate
//! grew, and settles (going back one step if the last step did not pay) once it stops
//! growing, never above the cap.
//!
//! The estimate is `level × median per-part rate`, measured only on parts started while the
//! pipe held `level` requests. Rates are per part, not per interval, so a slow consumer or a
//! pause between reads does not read as a slow link. More streams are tried only while the
//! reader had to wait for a part still in flight: a reader that finds its data already there
//! is not limited by the link, and more streams would only hold more memory.
//!
//! The reader passes a *ceiling* with each sample: its fair share of the read budget
//! ([`super::budget::ReadBudget::fair_share`]) and of the stream cap among the readers streaming
//! at that moment. No rise passes it; probing waits, unsettled, until it lifts.

use std::time::Duration;

/// A rise must improve the estimate by this factor to count as growth.
const GROWTH: f64 = 1.15;

/// The stream-count policy of one reader.
#[derive(Debug, Clone)]
pub struct Streams {
    level: usize,
    cap: usize,
    /// No probing: the level was given, or probing has ended.
    settled: bool,
    /// Set by a rise, until the next decision: the level before it and its estimate (bytes
    /// per second).
    previous: Option<(usize, f64)>,
    /// Per-part rates (bytes per second) of parts started at `level` with the pipe full.
    rates: Vec<f64>,
    /// Whether the reader waited for an in-flight part since the last decision.
    starved: bool,
}

impl Streams {
    /// Always `level` streams.
    pub fn fixed(level: usize) -> Self {
        let level = level.max(1);
        Streams {
            level,
            cap: level,
            settled: true,
            previous: None,
            rates: Vec::new(),
            starved: false,
        }
    }

    /// Starts at `start` streams and probes up to `cap`.
    pub fn adaptive(start: usize, cap: usize) -> Self {
        let cap = cap.max(1);
        Streams {
            level: start.clamp(1, cap),
            cap,
            settled: start >= cap,
            previous: None,
            rates: Vec::new(),
            starved: false,
        }
    }

    /// Streams to keep in flight now.
    pub fn level(&self) -> usize {
        self.level
    }

    /// The most streams this reader may reach.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Parts needed at one level before deciding: enough for a stable median (every one
    /// started with the pipe full, so each saw the level's contention), and no more. Each part
    /// waited for is read below the level that may fill the link: at 16 streams, 16 parts of
    /// 8 MiB were an eighth of a GiB (`benchmarks.md`, "The ramp when the reader is not the
    /// bound").
    fn samples_needed(&self) -> usize {
        self.level.clamp(4, 8)
    }

    /// The reader had to wait for a part still in flight.
    pub fn note_starved(&mut self) {
        self.starved = true;
    }

    /// A part started at `level` streams (`full`: the pipe held that many) delivered `bytes`
    /// in `elapsed`. `ceiling`: the most streams the reader may use now (its shares of memory
    /// and of the cap); no rise passes it, but probing resumes if it lifts. Returns the new
    /// level if it changed.
    pub fn record(
        &mut self,
        level: usize,
        full: bool,
        bytes: u64,
        elapsed: Duration,
        ceiling: usize,
    ) -> Option<usize> {
        if self.settled || level != self.level || !full || bytes == 0 {
            return None;
        }
        let secs = elapsed.as_secs_f64().max(1e-6);
        self.rates.push(bytes as f64 / secs);
        if self.rates.len() < self.samples_needed() {
            return None;
        }
        self.rates.sort_by(f64::total_cmp);
        let estimate = self.level as f64 * self.rates[self.rates.len() / 2];
        self.rates.clear();
        let starved = std::mem::take(&mut self.starved);
        let before = self.level;
        if let Some((prev_level, prev)) = self.previous.take() {
            // Just rose from `prev_level`.
            if estimate < prev * GROWTH {
                // The rise did not pay: keep the smaller level if it did no better.
                if estimate <= prev {
                    self.level = prev_level;
                }
                self.settled = true;
                return (self.level != before).then_some(self.level);
            }
        }
        if !starved || self.level >= ceiling {
            // The reader keeps up without waiting (the link is not what limits it), or may not
            // have more now. Keep measuring at this level; it rises once the reader waits and
            // there is room.
        } else if self.level >= self.cap {
            self.settled = true;
        } else {
            self.previous = Some((self.level, estimate));
            self.level = (self.level * 2).min(self.cap);
        }
        (self.level != before).then_some(self.level)
    }

    /// Whether probing has ended.
    pub fn settled(&self) -> bool {
        self.settled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `n` parts at the current level at `rate_at(level)` bytes per second per part.
    fn feed(s: &mut Streams, starved: bool, rate_at: impl Fn(usize) -> f64) -> Option<usize> {
        let mut changed = None;
        for _ in 0..s.samples_needed() {
            if starved {
                s.note_starved();
            }
            let level = s.level();
            let secs = 8e6 / rate_at(level);
            if let Some(l) = s.record(level, true, 8_000_000, Duration::from_secs_f64(secs), 64) {
                changed = Some(l);
            }
        }
        changed
    }

    #[test]
    fn fixed_never_moves() {
        let mut s = Streams::fixed(8);
        for _ in 0..10 {
            assert_eq!(feed(&mut s, true, |_| 40e6), None);
        }
        assert_eq!(s.level(), 8);
    }

    #[test]
    fn rises_while_throughput_grows_then_settles() {
        // Each stream gets 40 MB/s until the link's 600 MB/s is shared out.
        let link = |level: usize| (600e6 / level as f64).min(40e6);
        let mut s = Streams::adaptive(4, 64);
        let mut levels = vec![s.level()];
        while !s.settled() {
            feed(&mut s, true, link);
            levels.push(s.level());
        }
        // 4 → 8 → 16 pays (160, 320, 600 MB/s); 32 gives no more: back to 16.
        assert_eq!(levels, vec![4, 8, 16, 32, 16]);
    }

    #[test]
    fn keeps_a_rise_that_helped_a_little() {
        // 32 streams give 5% more than 16: kept, but probing ends.
        let link = |level: usize| if level >= 32 { 21e6 } else { 40e6 };
        let mut s = Streams::adaptive(16, 64);
        while !s.settled() {
            feed(&mut s, true, link);
        }
        assert_eq!(s.level(), 32);
    }

    #[test]
    fn never_passes_the_cap() {
        let mut s = Streams::adaptive(8, 24);
        for _ in 0..10 {
            feed(&mut s, true, |_| 40e6);
        }
        assert_eq!(s.level(), 24);
        assert!(s.settled());
    }

    #[test]
    fn a_reader_that_never_waits_adds_no_streams() {
        let mut s = Streams::adaptive(8, 64);
        for _ in 0..10 {
            assert_eq!(feed(&mut s, false, |_| 40e6), None);
        }
        assert_eq!(s.level(), 8);
        // Once it starts to wait, it rises.
        assert_eq!(feed(&mut s, true, |_| 40e6), Some(16));
    }

    #[test]
    fn parts_from_another_level_or_a_partial_pipe_are_ignored() {
        let mut s = Streams::adaptive(8, 64);
        for _ in 0..100 {
            s.note_starved();
            assert_eq!(s.record(4, true, 1, Duration::from_secs(1), 64), None);
            assert_eq!(s.record(8, false, 1, Duration::from_secs(1), 64), None);
        }
        assert_eq!(s.level(), 8);
    }

    #[test]
    fn no_rise_past_the_ceiling_until_it_lifts() {
        let mut s = Streams::adaptive(8, 64);
        for _ in 0..5 {
            for _ in 0..s.samples_needed() {
                s.note_starved();
                assert_eq!(
                    s.record(8, true, 8_000_000, Duration::from_millis(200), 8),
                    None
                );
            }
        }
        assert!(!s.settled(), "held by the ceiling, not settled");
        assert_eq!(feed(&mut s, true, |_| 40e6), Some(16));
    }
}
