//! Stat and negative-lookup caches, both `moka` caches bounded in entries and expiring by TTL.
//!
//! The stat cache answers "what is at this path" for `--stat-ttl` (default 60 s, as gcsfuse);
//! the negative cache answers "nothing is at this path" for `--negative-ttl` (default 5 s), which
//! absorbs the storms of failed lookups that shells, editors and Explorer make. Keys are paths
//! relative to the mount. A fresh answer from the bucket always replaces what is cached, so a
//! new generation drops everything known about the old one.

use std::sync::Arc;
use std::time::Duration;

use moka::sync::Cache;

use crate::store::ObjectMeta;

/// What a path was last seen to be.
#[derive(Debug, Clone)]
pub enum Entry {
    Dir,
    File(Arc<ObjectMeta>),
}

/// The two metadata caches of one mount.
pub struct MetaCache {
    stat: Cache<String, Entry>,
    negative: Cache<String, ()>,
}

impl MetaCache {
    pub fn new(capacity: u64, stat_ttl: Duration, negative_ttl: Duration) -> Self {
        MetaCache {
            stat: Cache::builder()
                .max_capacity(capacity)
                .time_to_live(stat_ttl.max(Duration::from_nanos(1)))
                .build(),
            negative: Cache::builder()
                .max_capacity(capacity)
                .time_to_live(negative_ttl.max(Duration::from_nanos(1)))
                .support_invalidation_closures()
                .build(),
        }
    }

    /// `Some(Some(e))`: known to exist; `Some(None)`: known not to exist; `None`: ask the bucket.
    pub fn get(&self, path: &str) -> Option<Option<Entry>> {
        if let Some(e) = self.stat.get(path) {
            return Some(Some(e));
        }
        if self.negative.contains_key(path) {
            return Some(None);
        }
        None
    }

    pub fn insert(&self, path: &str, entry: Entry) {
        self.negative.invalidate(path);
        self.stat.insert(path.to_string(), entry);
    }

    pub fn insert_missing(&self, path: &str) {
        self.stat.invalidate(path);
        self.negative.insert(path.to_string(), ());
    }

    pub fn invalidate(&self, path: &str) {
        self.stat.invalidate(path);
        self.negative.invalidate(path);
    }

    /// Forgets everything at or under the directory `path` (after a directory rename).
    pub fn invalidate_tree(&self, path: &str) {
        let dir = format!("{path}/");
        let p = path.to_string();
        let pred = move |k: &String| *k == p || k.starts_with(&dir);
        let pred2 = pred.clone();
        let _ = self.stat.invalidate_entries_if(move |k, _| pred(k));
        let _ = self.negative.invalidate_entries_if(move |k, _| pred2(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positive_and_negative_replace_each_other() {
        let c = MetaCache::new(10, Duration::from_secs(60), Duration::from_secs(60));
        assert!(c.get("a").is_none());
        c.insert_missing("a");
        assert!(matches!(c.get("a"), Some(None)));
        c.insert("a", Entry::Dir);
        assert!(matches!(c.get("a"), Some(Some(Entry::Dir))));
        c.insert_missing("a");
        assert!(matches!(c.get("a"), Some(None)));
        c.invalidate("a");
        assert!(c.get("a").is_none());
    }

    #[test]
    fn entries_expire() {
        let c = MetaCache::new(10, Duration::from_millis(20), Duration::from_millis(20));
        c.insert("a", Entry::Dir);
        c.insert_missing("b");
        std::thread::sleep(Duration::from_millis(50));
        assert!(c.get("a").is_none());
        assert!(c.get("b").is_none());
    }
}
