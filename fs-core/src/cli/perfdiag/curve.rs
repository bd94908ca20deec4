//! A throughput curve over rising concurrency: when to stop raising the concurrency, and where
//! the curve flattens (its knee).
//!
//! Kept apart from the runner because both rules are pure arithmetic on the figures, tested
//! here on made-up curves, and because the recommendations rest on the knee.
//!
//! - **Stop:** once two steps in a row gain less than [`FLAT_GAIN`] over the best figure before
//!   them (a drop counts as no gain). Doubling the concurrency again after that only costs time.
//! - **Knee:** the lowest concurrency that reaches [`KNEE_SHARE`] of the best figure measured:
//!   more than that buys at most a tenth more, for twice the connections and memory.

use serde::Serialize;

/// A step gaining less than this (relative) counts as flat.
pub const FLAT_GAIN: f64 = 0.10;
/// The knee is the first concurrency reaching this share of the best figure.
pub const KNEE_SHARE: f64 = 0.90;

/// One measured step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Point {
    pub concurrency: usize,
    /// MB/s (10^6 bytes) for transfers, objects per second for small objects.
    pub rate: f64,
}

/// Why the ladder ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// It flattened: two steps in a row gained less than 10%.
    Flattened,
    /// It reached `--max-concurrency` while still rising.
    #[default]
    MaxConcurrency,
    /// The run's time ran out first.
    TimeLimit,
}

/// The steps of one ladder, in the order they ran (rising concurrency).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Curve {
    pub points: Vec<Point>,
    pub stop: Stop,
}

impl Curve {
    pub fn push(&mut self, concurrency: usize, rate: f64) {
        self.points.push(Point { concurrency, rate });
    }

    /// Whether the last two steps each gained less than [`FLAT_GAIN`] over the best before
    /// them.
    pub fn flattened(&self) -> bool {
        let n = self.points.len();
        n >= 3 && self.is_flat(n - 1) && self.is_flat(n - 2)
    }

    /// Whether step `i` gained less than [`FLAT_GAIN`] over the best step before it.
    fn is_flat(&self, i: usize) -> bool {
        let best_before = self.points[..i].iter().map(|p| p.rate).fold(0.0, f64::max);
        let rate = self.points[i].rate;
        if best_before <= 0.0 {
            return rate <= 0.0;
        }
        rate < best_before * (1.0 + FLAT_GAIN)
    }

    /// The best figure measured (0 for an empty curve).
    pub fn peak(&self) -> f64 {
        self.points.iter().map(|p| p.rate).fold(0.0, f64::max)
    }

    /// The lowest concurrency reaching [`KNEE_SHARE`] of the peak; `None` when nothing moved.
    pub fn knee(&self) -> Option<Point> {
        let peak = self.peak();
        if peak <= 0.0 {
            return None;
        }
        self.points
            .iter()
            .find(|p| p.rate >= peak * KNEE_SHARE)
            .copied()
    }

    /// The figure at concurrency `c`, if that step ran.
    pub fn at(&self, c: usize) -> Option<f64> {
        self.points
            .iter()
            .find(|p| p.concurrency == c)
            .map(|p| p.rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn curve(rates: &[f64]) -> Curve {
        let mut c = Curve::default();
        for (i, r) in rates.iter().enumerate() {
            c.push(1 << i, *r);
        }
        c
    }

    #[test]
    fn a_link_capped_per_connection_flattens_where_the_total_cap_is_reached() {
        // 40 MB/s per connection, 300 MB/s in all.
        let c = curve(&[40.0, 80.0, 160.0, 283.0, 300.0, 305.0]);
        assert!(c.flattened());
        assert_eq!(c.peak(), 305.0);
        assert_eq!(
            c.knee(),
            Some(Point {
                concurrency: 8,
                rate: 283.0
            })
        );
        assert_eq!(c.at(16), Some(300.0));
        assert_eq!(c.at(64), None);
    }

    #[test]
    fn one_flat_step_is_not_enough_to_stop() {
        let c = curve(&[40.0, 80.0, 84.0]);
        assert!(!c.flattened(), "one step without gain may be noise");
        let c = curve(&[40.0, 80.0, 84.0, 170.0]);
        assert!(!c.flattened(), "the gain came back");
        let c = curve(&[40.0, 80.0, 84.0, 170.0, 175.0, 160.0]);
        assert!(c.flattened(), "a drop counts as no gain");
        assert_eq!(c.knee().map(|p| p.concurrency), Some(8));
    }

    #[test]
    fn gains_are_measured_against_the_best_so_far() {
        // A dip, then a recovery to the old level: no real gain.
        let c = curve(&[100.0, 200.0, 150.0, 205.0]);
        assert!(c.flattened());
        assert_eq!(c.knee().map(|p| p.concurrency), Some(2));
    }

    #[test]
    fn a_curve_that_never_moved_has_no_knee() {
        assert_eq!(curve(&[]).knee(), None);
        assert_eq!(curve(&[0.0, 0.0]).knee(), None);
        assert!(curve(&[0.0, 0.0, 0.0]).flattened());
        assert!(!curve(&[1.0, 2.0]).flattened());
        let c = curve(&[10.0]);
        assert_eq!(c.knee().map(|p| p.concurrency), Some(1));
    }
}
