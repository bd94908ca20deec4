//! A set of byte ranges, kept merged and sorted.
//!
//! A staging file uses it to remember which bytes are really present locally (written by the
//! user or fetched from the bucket), so the rest can be fetched on demand and a sparse hole is
//! never mistaken for zeros.

use std::ops::Range;

/// Disjoint, non-adjacent, sorted ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSet {
    ranges: Vec<Range<u64>>,
}

impl RangeSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// The set covering `r`.
    pub fn full(r: Range<u64>) -> Self {
        let mut s = Self::new();
        s.insert(r);
        s
    }

    pub fn ranges(&self) -> &[Range<u64>] {
        &self.ranges
    }

    /// Adds `r`, merging with anything it touches.
    pub fn insert(&mut self, r: Range<u64>) {
        if r.start >= r.end {
            return;
        }
        let (mut start, mut end) = (r.start, r.end);
        let first = self.ranges.partition_point(|x| x.end < start);
        let mut last = first;
        while last < self.ranges.len() && self.ranges[last].start <= end {
            start = start.min(self.ranges[last].start);
            end = end.max(self.ranges[last].end);
            last += 1;
        }
        self.ranges.splice(first..last, std::iter::once(start..end));
    }

    /// Removes everything at or past `len` (a truncate).
    pub fn truncate(&mut self, len: u64) {
        self.ranges.retain(|r| r.start < len);
        if let Some(last) = self.ranges.last_mut() {
            last.end = last.end.min(len);
        }
    }

    /// Whether every byte of `r` is in the set.
    pub fn contains(&self, r: &Range<u64>) -> bool {
        if r.start >= r.end {
            return true;
        }
        let i = self.ranges.partition_point(|x| x.end <= r.start);
        self.ranges
            .get(i)
            .is_some_and(|x| x.start <= r.start && x.end >= r.end)
    }

    /// The parts of `r` not in the set, in order.
    pub fn missing(&self, r: Range<u64>) -> Vec<Range<u64>> {
        let mut out = Vec::new();
        let mut pos = r.start;
        for x in &self.ranges {
            if x.end <= pos {
                continue;
            }
            if x.start >= r.end {
                break;
            }
            if x.start > pos {
                out.push(pos..x.start.min(r.end));
            }
            pos = pos.max(x.end);
            if pos >= r.end {
                break;
            }
        }
        if pos < r.end {
            out.push(pos..r.end);
        }
        out
    }

    /// Total bytes in the set.
    pub fn len(&self) -> u64 {
        self.ranges.iter().map(|r| r.end - r.start).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn merges_and_reports_missing() {
        let mut s = RangeSet::new();
        s.insert(10..20);
        s.insert(30..40);
        s.insert(20..25); // adjacent: merges
        assert_eq!(s.ranges(), &[10..25, 30..40]);
        assert!(s.contains(&(12..25)));
        assert!(!s.contains(&(24..31)));
        assert_eq!(s.missing(0..50), vec![0..10, 25..30, 40..50]);
        s.insert(5..35);
        assert_eq!(s.ranges(), std::slice::from_ref(&(5..40)));
        s.truncate(12);
        assert_eq!(s.ranges(), std::slice::from_ref(&(5..12)));
        assert_eq!(s.len(), 7);
    }

    proptest! {
        /// The set agrees with a plain bitmap under any inserts and truncates.
        #[test]
        fn matches_a_bitmap(ops in proptest::collection::vec((0u64..200, 0u64..60, any::<bool>()), 1..40)) {
            let mut s = RangeSet::new();
            let mut bits = vec![false; 300];
            for (start, len, truncate) in ops {
                if truncate {
                    s.truncate(start);
                    for b in bits.iter_mut().skip(start as usize) { *b = false; }
                } else {
                    s.insert(start..start + len);
                    for b in bits.iter_mut().skip(start as usize).take(len as usize) { *b = true; }
                }
                for w in s.ranges().windows(2) {
                    prop_assert!(w[0].end < w[1].start, "ranges stay disjoint and non-adjacent");
                }
                let missing = s.missing(0..300);
                for (i, b) in bits.iter().enumerate() {
                    let i = i as u64;
                    let in_missing = missing.iter().any(|r| r.contains(&i));
                    prop_assert_eq!(*b, !in_missing);
                    prop_assert_eq!(*b, s.contains(&(i..i + 1)));
                }
            }
        }
    }
}
