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
//! The first doubling does not wait for the first level's measurement: a reader that waits for
//! a part while all of that level is in flight is bound by the link there, and timing the level
//! first kept a reader alone at 16 streams for a part's time and more (`benchmarks.md`, "The
//! read ramp when the reader is not the bound"). What the doubling must beat is then estimated
//! from the latest full-size parts the first level finished, most of them while its pipe was
//! still filling. Since that is only an estimate, the doubling is timed after a round of the
//! pipe at the new level, and kept only if it gained what a measured one must gain and the
//! reader still waited for parts (a reader that stops waiting was bound by itself, and the
//! doubled streams would only hold memory).
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

use std::collections::VecDeque;
use std::time::Duration;

/// A rise must improve the estimate by this factor to count as growth.
const GROWTH: f64 = 1.15;

/// Rates of the first level's latest full-size parts kept for its estimate.
const EARLY_KEPT: usize = 16;

/// The stream-count policy of one reader.
#[derive(Debug, Clone)]
pub struct Streams {
    level: usize,
    cap: usize,
    /// No probing: the level was given, or probing has ended.
    settled: bool,
    /// Set by a rise, until the next decision: the level before it, its estimate (bytes per
    /// second), and whether that estimate came from the first level's pipe-filling parts
    /// rather than from a measurement of the level.
    previous: Option<(usize, f64, bool)>,
    /// Per-part rates (bytes per second) of parts started at `level` with the pipe full.
    rates: Vec<f64>,
    /// Whether the reader waited for an in-flight part since the last decision.
    starved: bool,
    /// Still at the level probing started at, with no decision made: the next wait on a full
    /// pipe doubles the level at once.
    first: bool,
    /// Per-part rates of the first level's latest [`EARLY_KEPT`] parts of `early_bytes`, the
    /// pipe full or not. Smaller parts (the window's first, and an object's last) are left out:
    /// latency is most of their time.
    early: VecDeque<f64>,
    /// The largest part the first level has finished.
    early_bytes: u64,
    /// Full-pipe parts still to pass over before measuring: a round of the pipe after a rise
    /// that came before any measurement, whose first parts ran while it was still filling.
    skip: usize,
}

impl Streams {
    /// Always `level` streams: probing that starts at its cap is settled from the start.
    pub fn fixed(level: usize) -> Self {
        let level = level.max(1);
        Self::adaptive(level, level)
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
            first: true,
            early: VecDeque::new(),
            early_bytes: 0,
            skip: 0,
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

    /// Parts needed at one level before deciding: enough for a stable median, and at least a
    /// full round of the pipe so the new streams have all been measured.
    fn samples_needed(&self) -> usize {
        self.level.clamp(4, 16)
    }

    /// The reader had to wait for a part still in flight (in the reader, through
    /// [`Self::waited_while_full`]).
    #[cfg(test)]
    fn note_starved(&mut self) {
        self.starved = true;
    }

    /// The reader had to wait for a part while `in_flight` parts were in flight. At the level
    /// probing started at, with that many in flight and before any decision, once one of its
    /// parts has finished, that doubles the level now (within `ceiling` and the cap), to be
    /// judged against the estimate of the parts the first level finished. Returns the new
    /// level if it changed.
    pub fn waited_while_full(&mut self, in_flight: usize, ceiling: usize) -> Option<usize> {
        self.starved = true;
        if !self.first || self.settled || in_flight < self.level || self.level >= ceiling {
            return None;
        }
        let rate = median(&mut self.early.iter().copied().collect::<Vec<_>>())?;
        self.first = false;
        self.rates.clear();
        self.starved = false;
        self.previous = Some((self.level, self.level as f64 * rate, true));
        self.level = (self.level * 2).min(self.cap).min(ceiling);
        self.skip = self.level;
        Some(self.level)
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
        if self.settled || level != self.level || bytes == 0 {
            return None;
        }
        let rate = bytes as f64 / elapsed.as_secs_f64().max(1e-6);
        if self.first {
            if bytes > self.early_bytes {
                self.early_bytes = bytes;
                self.early.clear();
            }
            if bytes == self.early_bytes {
                if self.early.len() == EARLY_KEPT {
                    self.early.pop_front();
                }
                self.early.push_back(rate);
            }
        }
        if !full {
            return None;
        }
        if self.skip > 0 {
            self.skip -= 1;
            return None;
        }
        self.rates.push(rate);
        if self.rates.len() < self.samples_needed() {
            return None;
        }
        let estimate = self.level as f64 * median(&mut self.rates).unwrap_or(0.0);
        self.rates.clear();
        self.first = false;
        let starved = std::mem::take(&mut self.starved);
        let before = self.level;
        if let Some((prev_level, prev, unmeasured)) = self.previous.take() {
            // Just rose from `prev_level`. A rise judged against an unmeasured estimate must
            // also have left the reader waiting for parts: one that kept up at the new level
            // may have waited at the old one only while its pipe first filled.
            if estimate < prev * GROWTH || (unmeasured && !starved) {
                // The rise did not pay: keep the smaller level if it did no better, or if the
                // level before was never measured (its estimate is only a guess, so only a
                // clear gain keeps the rise).
                if estimate <= prev || unmeasured {
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
            self.previous = Some((self.level, estimate, false));
            self.level = (self.level * 2).min(self.cap).min(ceiling);
        }
        (self.level != before).then_some(self.level)
    }

    /// Whether probing has ended.
    pub fn settled(&self) -> bool {
        self.settled
    }
}

/// The median of `rates` (sorted in place), if there are any.
fn median(rates: &mut [f64]) -> Option<f64> {
    rates.sort_by(f64::total_cmp);
    rates.get(rates.len() / 2).copied()
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

    /// A part of the first level finished while the pipe was still filling.
    fn early_part(s: &mut Streams, rate: f64) {
        let level = s.level();
        assert_eq!(
            s.record(
                level,
                false,
                8_000_000,
                Duration::from_secs_f64(8e6 / rate),
                64
            ),
            None
        );
    }

    #[test]
    fn the_first_wait_on_a_full_pipe_doubles_at_once() {
        let mut s = Streams::adaptive(16, 64);
        // Before any part of the first level has finished, there is nothing to judge a
        // doubling by.
        assert_eq!(s.waited_while_full(16, 64), None);
        early_part(&mut s, 40e6);
        // A wait with fewer in flight than the level, or at the ceiling, changes nothing.
        assert_eq!(s.waited_while_full(15, 64), None);
        assert_eq!(s.waited_while_full(16, 16), None);
        assert_eq!(s.waited_while_full(16, 64), Some(32));
        assert_eq!(s.level(), 32);
        // Only the first level rises at once; the doubling paid (40 MB/s a stream still), so
        // probing goes on, measured.
        assert_eq!(s.waited_while_full(32, 64), None);
        // A round of the pipe passes before the doubled level is measured.
        skip_round(&mut s);
        assert_eq!(feed(&mut s, true, |_| 40e6), Some(64));
        // 64 streams give no more than 32: back to 32.
        assert_eq!(feed(&mut s, true, |l| 1280e6 / l as f64), Some(32));
        assert!(s.settled());
    }

    /// Passes over the round of the pipe that follows an unmeasured rise.
    fn skip_round(s: &mut Streams) {
        for _ in 0..s.level() {
            let level = s.level();
            assert_eq!(s.record(level, true, 1, Duration::from_secs(1), 64), None);
        }
    }

    #[test]
    fn an_unmeasured_rise_is_kept_only_for_a_clear_gain() {
        // 16 streams give 340 MB/s, 6% more than the 320 the first 8 were estimated at.
        let mut s = Streams::adaptive(8, 64);
        early_part(&mut s, 40e6);
        assert_eq!(s.waited_while_full(8, 64), Some(16));
        skip_round(&mut s);
        assert_eq!(feed(&mut s, true, |_| 21.25e6), Some(8));
        assert!(s.settled());
        // The same gain after a measured rise keeps the rise.
        let mut s = Streams::adaptive(8, 64);
        assert_eq!(feed(&mut s, false, |_| 40e6), None);
        assert_eq!(feed(&mut s, true, |_| 40e6), Some(16));
        assert_eq!(feed(&mut s, true, |_| 21.25e6), None);
        assert!(s.settled());
        assert_eq!(s.level(), 16);
    }

    #[test]
    fn an_unmeasured_rise_the_reader_stopped_waiting_for_is_undone() {
        // Twice the streams give twice the rate, but the reader never waited at 32: it was
        // bound by itself, and had waited at 16 only while the pipe first filled.
        let mut s = Streams::adaptive(16, 32);
        early_part(&mut s, 40e6);
        assert_eq!(s.waited_while_full(16, 32), Some(32));
        skip_round(&mut s);
        assert_eq!(feed(&mut s, false, |_| 40e6), Some(16));
        assert!(s.settled());
    }

    #[test]
    fn an_unmeasured_rise_stays_within_the_ceiling_and_is_judged() {
        let mut s = Streams::adaptive(16, 32);
        early_part(&mut s, 40e6);
        assert_eq!(s.waited_while_full(16, 20), Some(20));
        // Every part at 20 has the pipe full, so the rise is judged: it paid, and with the
        // ceiling lifted (feed passes 64) probing goes on.
        skip_round(&mut s);
        assert_eq!(feed(&mut s, true, |_| 40e6), Some(32));
    }

    #[test]
    fn the_first_estimate_takes_only_full_size_parts() {
        // The window's first small parts are mostly latency: 5 MB/s. Counted, they would make
        // 8 streams look like 40 MB/s in all, and 16 at 352 MB/s a clear gain; the full-size
        // parts say 320, which 352 does not clearly beat.
        let mut s = Streams::adaptive(8, 64);
        for _ in 0..3 {
            assert_eq!(
                s.record(8, false, 1_000_000, Duration::from_millis(200), 64),
                None
            );
        }
        early_part(&mut s, 40e6);
        early_part(&mut s, 40e6);
        assert_eq!(s.waited_while_full(8, 64), Some(16));
        skip_round(&mut s);
        assert_eq!(feed(&mut s, true, |_| 22e6), Some(8));
    }

    #[test]
    fn a_first_doubling_on_a_link_the_first_level_fills_is_undone() {
        // 8 streams share 320 MB/s; a part finished while the pipe filled ran at 40 MB/s.
        let link = |level: usize| 320e6 / level as f64;
        let mut s = Streams::adaptive(8, 64);
        early_part(&mut s, 40e6);
        assert_eq!(s.waited_while_full(8, 64), Some(16));
        for _ in 0..16 {
            assert_eq!(s.record(16, true, 1, Duration::from_secs(1), 64), None);
        }
        assert_eq!(feed(&mut s, true, link), Some(8));
        assert!(s.settled());
    }

    #[test]
    fn after_a_measured_decision_a_wait_rises_no_faster() {
        let mut s = Streams::adaptive(8, 64);
        // The reader kept up: measured, held at 8.
        assert_eq!(feed(&mut s, false, |_| 40e6), None);
        assert_eq!(s.waited_while_full(8, 64), None);
        assert_eq!(s.level(), 8);
        // A fixed level never moves.
        let mut f = Streams::fixed(8);
        assert_eq!(f.waited_while_full(8, 64), None);
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
