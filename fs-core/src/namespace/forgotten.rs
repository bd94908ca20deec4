//! Trees the metadata caches were told to forget, and when.
//!
//! Every create, unlink and rename forgets what the caches hold at its path and under it (a
//! name that was a directory may have cached children). Asking each cache to drop the entries
//! under a prefix costs a pass over the cache, so the caches do not do that: instead every
//! cached value carries the time it was cached, and this map keeps, for each forgotten tree,
//! the time it was forgotten. A value answers only if it was cached after every forgetting of
//! its path and of its path's ancestors, which a lookup checks in one probe per path component.
//!
//! Why not `moka`'s `invalidate_entries_if`: it keeps each predicate until a background pass
//! has visited every entry, and every `get` meanwhile tests the entry against all predicates
//! still pending. One predicate per created file made `cp -r` of 8,000 files into one
//! directory quadratic (363 s in a debug build, against 22 s for 6,000 before the predicates
//! piled up).
//!
//! A forgetting older than the longest TTL of the caches it guards can no longer matter (every
//! value cached before it has expired), so the map is pruned by age and stays as small as the
//! number of trees forgotten within one TTL.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::RwLock;

/// Forgotten trees: path -> when it was last forgotten.
pub struct Forgotten {
    trees: RwLock<Trees>,
    /// The longest TTL of the caches whose values are checked here.
    keep: Duration,
}

struct Trees {
    at: HashMap<String, Instant>,
    /// Size at which the next prune runs: twice the size the last one left, so pruning costs
    /// a constant per forgetting however long the TTL.
    prune_at: usize,
}

/// Fewest entries before a prune is worth its pass.
const PRUNE_MIN: usize = 1024;

impl Forgotten {
    pub fn new(keep: Duration) -> Self {
        Forgotten {
            trees: RwLock::new(Trees {
                at: HashMap::new(),
                prune_at: PRUNE_MIN,
            }),
            keep,
        }
    }

    /// Forgets what was cached at `path` and under it, before now.
    pub fn forget(&self, path: &str) {
        let mut t = self.trees.write();
        // Taken under the lock, so two forgettings of one path are stored in the order they
        // happen: an earlier one never overwrites a later one and lets a value cached between
        // them answer again.
        let now = Instant::now();
        t.at.insert(path.to_string(), now);
        if t.at.len() >= t.prune_at {
            let keep = self.keep;
            t.at.retain(|_, at| now.saturating_duration_since(*at) <= keep);
            t.prune_at = (t.at.len() * 2).max(PRUNE_MIN);
        }
    }

    /// Whether a value cached for `path` at `cached` was forgotten since: `path` or one of its
    /// ancestors (not the root, which is never forgotten as a tree) was forgotten at or after
    /// that time.
    pub fn covers(&self, path: &str, cached: Instant) -> bool {
        let t = self.trees.read();
        if t.at.is_empty() {
            return false;
        }
        let mut p = path;
        loop {
            if t.at.get(p).is_some_and(|at| cached <= *at) {
                return true;
            }
            match p.rfind('/') {
                Some(i) => p = &p[..i],
                None => return false,
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.trees.read().at.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forgetting_covers_the_tree_cached_before_it_and_nothing_after() {
        let f = Forgotten::new(Duration::from_secs(60));
        let before = Instant::now();
        f.forget("d");
        std::thread::sleep(Duration::from_millis(2));
        let after = Instant::now();
        assert!(f.covers("d", before));
        assert!(f.covers("d/x", before));
        assert!(f.covers("d/x/y", before));
        assert!(!f.covers("dd", before), "a sibling sharing the prefix");
        assert!(!f.covers("e/d", before), "another tree");
        assert!(!f.covers("d", after), "cached again since");
        assert!(!f.covers("d/x", after));
        f.forget("d/x");
        assert!(f.covers("d/x/y", after), "a later forgetting of a subtree");
        assert!(!f.covers("d/z", after));
    }

    #[test]
    fn forgettings_older_than_the_ttl_are_pruned() {
        let f = Forgotten::new(Duration::from_millis(200));
        let old = Instant::now();
        f.forget("old");
        std::thread::sleep(Duration::from_millis(300));
        for i in 0..PRUNE_MIN {
            f.forget(&format!("n{i}"));
        }
        // Without the prune it would hold PRUNE_MIN + 1.
        assert!(f.len() <= PRUNE_MIN, "the old one was pruned");
        assert!(
            !f.covers("old/x", old),
            "pruned: anything cached then expired"
        );
        let last = format!("n{}", PRUNE_MIN - 1);
        assert!(f.covers(&last, old));
    }
}
