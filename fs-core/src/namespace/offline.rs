//! What the namespace answers when the bucket cannot be reached: the last known state.
//!
//! The stat, negative and listed-directory caches expire within seconds, as they must for
//! other clients' changes to show. When the link is down that leaves nothing to answer `ls`
//! with, although the mount saw the directory a moment ago and the user just saved files into
//! it. So every directory listed whole is also kept here, with the entries it showed, for as
//! long as memory allows (a byte bound, least recently used first out, no time limit), and kept
//! current by the same calls that keep the listed-directory cache current: this mount's own
//! creates, deletes and renames, and every fresh answer from the bucket about a name in it.
//!
//! It is read only when a request for a lookup or a listing fails with a transient error (the
//! bucket did not answer, or answered 5xx/429). Those requests run in
//! [`with_fallback`](crate::store::retry::with_fallback) when this holds the directory, so the
//! user waits for one retry, not for the whole retry budget. A directory it never had still
//! fails as before.
//!
//! [`Reachability`] is the mount's offline flag: set when such a fallback answers, cleared by
//! the next request that the bucket answers, each change logged once (`warn` going offline,
//! `info` back), and shown by `bucketdrive status`.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use moka::ops::compute::Op;
use moka::policy::EvictionPolicy;
use moka::sync::Cache;
use parking_lot::Mutex;

use super::cache::Entry;
use crate::store::StoreError;

/// Bytes charged for one entry beyond its strings: the map slot, the `Arc`, the fixed part of
/// an object's metadata.
const ENTRY_OVERHEAD: u64 = 160;

/// What one entry costs in memory, roughly: its name, and for a file its key and metadata.
fn entry_bytes(name: &str, entry: &Entry) -> u64 {
    let extra = match entry {
        Entry::Dir => 0,
        Entry::File(m) => {
            m.key.len()
                + m.content_type.as_ref().map_or(0, String::len)
                + m.metadata
                    .iter()
                    .map(|(k, v)| k.len() + v.len() + 48)
                    .sum::<usize>()
        }
    };
    (name.len() + extra) as u64 + ENTRY_OVERHEAD
}

/// The entries of one directory as last seen, and what they cost.
#[derive(Debug, Default)]
struct KnownDir {
    entries: HashMap<String, Entry>,
    bytes: u64,
    /// `bytes` when the cache last weighed this directory.
    weighed: u64,
    /// Names whose state is not known: changed by a request whose outcome is unsure (a
    /// rename that failed half way), or replaced by something this mount has not seen whole.
    /// The directory cannot vouch for them either way until they are seen again, and cannot
    /// be listed whole from here while any is left.
    unsure: HashSet<String>,
}

impl KnownDir {
    fn set(&mut self, name: &str, entry: Entry) {
        self.unsure.remove(name);
        let add = entry_bytes(name, &entry);
        if let Some(old) = self.entries.insert(name.to_string(), entry) {
            self.bytes = self.bytes.saturating_sub(entry_bytes(name, &old));
        }
        self.bytes += add;
    }

    fn remove(&mut self, name: &str) {
        self.unsure.remove(name);
        if let Some(old) = self.entries.remove(name) {
            self.bytes = self.bytes.saturating_sub(entry_bytes(name, &old));
        }
    }

    /// Whether it grew enough since it was weighed that the cache should weigh it again.
    fn outgrew_weight(&self) -> bool {
        self.bytes > self.weighed + self.weighed / 8 + 4096
    }
}

type Shared = Arc<Mutex<KnownDir>>;

/// Splits a path into its directory and its last component.
fn split(path: &str) -> (&str, &str) {
    match path.rfind('/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => ("", path),
    }
}

/// The last whole listing of each directory this mount listed, with our changes since,
/// bounded in bytes.
pub struct LastKnown {
    dirs: Cache<String, Shared>,
    /// Every key of `dirs`, and maybe some it evicted since, in order: a forgotten tree's
    /// listings are one range of it. Kept under this lock together with each insertion into
    /// `dirs`, and rebuilt from `dirs` when it holds twice as many keys, so it never lacks one.
    keys: Mutex<BTreeSet<String>>,
}

impl LastKnown {
    /// Keeps at most about `max_bytes` of entries.
    pub fn new(max_bytes: u64) -> Self {
        LastKnown {
            dirs: Cache::builder()
                .max_capacity(max_bytes)
                .weigher(|dir: &String, known: &Shared| {
                    let mut k = known.lock();
                    k.weighed = k.bytes;
                    u32::try_from(k.bytes + dir.len() as u64 + ENTRY_OVERHEAD).unwrap_or(u32::MAX)
                })
                .eviction_policy(EvictionPolicy::lru())
                .build(),
            keys: Mutex::new(BTreeSet::new()),
        }
    }

    /// Records `entries` as the whole of directory `dir`, replacing what was known of it.
    pub fn insert_listing(&self, dir: &str, entries: impl IntoIterator<Item = (String, Entry)>) {
        let mut known = KnownDir::default();
        for (name, entry) in entries {
            known.set(&name, entry);
        }
        let mut keys = self.keys.lock();
        if keys.insert(dir.to_string()) && keys.len() > 2 * self.dirs.entry_count() as usize + 1024
        {
            self.dirs.run_pending_tasks();
            *keys = self.dirs.iter().map(|(k, _)| k.to_string()).collect();
            keys.insert(dir.to_string());
        }
        self.dirs
            .insert(dir.to_string(), Arc::new(Mutex::new(known)));
    }

    /// What was last known at `path`: `Some(Some(e))` it was there, `Some(None)` its directory
    /// was known whole without it, `None` its directory is not known (or this name in it is
    /// not).
    pub fn get(&self, path: &str) -> Option<Option<Entry>> {
        let (dir, name) = split(path);
        let known = self.dirs.get(dir)?;
        let k = known.lock();
        if k.unsure.contains(name) {
            return None;
        }
        Some(k.entries.get(name).cloned())
    }

    /// Whether directory `dir` is known whole.
    pub fn knows(&self, dir: &str) -> bool {
        self.dirs
            .get(dir)
            .is_some_and(|known| known.lock().unsure.is_empty())
    }

    /// The entries of directory `dir` as last known, in name order; `None` when it is not
    /// known whole.
    pub fn listing(&self, dir: &str) -> Option<Vec<(String, Entry)>> {
        let known = self.dirs.get(dir)?;
        let k = known.lock();
        if !k.unsure.is_empty() {
            return None;
        }
        let mut entries: Vec<_> = k
            .entries
            .iter()
            .map(|(n, e)| (n.clone(), e.clone()))
            .collect();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        Some(entries)
    }

    /// Has the cache weigh `known` (still the entry of `dir`) again after it grew.
    fn reweigh(&self, dir: &str, known: &Shared) {
        // Under the index's lock: a `forget_tree` between this look and the put would take the
        // key out of the index while the put brings the entry back.
        let _keys = self.keys.lock();
        self.dirs
            .entry_by_ref(dir)
            .and_compute_with(|current| match current {
                Some(e) if Arc::ptr_eq(e.value(), known) => Op::Put(known.clone()),
                _ => Op::Nop,
            });
    }

    /// `path` now holds `entry`, when its directory is known.
    pub fn set(&self, path: &str, entry: Entry) {
        let (dir, name) = split(path);
        let Some(known) = self.dirs.get(dir) else {
            return;
        };
        let grew = {
            let mut k = known.lock();
            k.set(name, entry);
            k.outgrew_weight()
        };
        if grew {
            self.reweigh(dir, &known);
        }
    }

    /// Nothing is at `path` any more.
    pub fn remove(&self, path: &str) {
        let (dir, name) = split(path);
        if let Some(known) = self.dirs.get(dir) {
            known.lock().remove(name);
        }
    }

    /// What is at `path` and under it is no longer known: its name leaves its directory (this
    /// mount's own change put it there or took it away, and what is local answers for it), and
    /// the listings of it and of every directory under it are dropped.
    pub fn forget_tree(&self, path: &str) {
        self.remove(path);
        let under = format!("{path}/");
        let mut keys = self.keys.lock();
        let below: Vec<String> = keys
            .range(under.clone()..)
            .take_while(|k| k.starts_with(&under))
            .cloned()
            .collect();
        for k in below.into_iter().chain([path.to_string()]) {
            self.dirs.invalidate(&k);
            keys.remove(&k);
        }
    }

    /// After [`Self::forget_tree`], when the change's outcome is not known (it failed part
    /// way, or another writer's object is at the name): the directory can no longer vouch for
    /// the name either way, and cannot be listed whole from here, until the name is seen again
    /// ([`Self::set`], [`Self::remove`]) or the directory is listed.
    pub fn mark_unsure(&self, path: &str) {
        let (dir, name) = split(path);
        if let Some(known) = self.dirs.get(dir) {
            known.lock().unsure.insert(name.to_string());
        }
    }

    /// Bytes held, as the cache weighs them (after its pending maintenance).
    #[cfg(test)]
    pub fn weighed_bytes(&self) -> u64 {
        self.dirs.run_pending_tasks();
        self.dirs.weighted_size()
    }
}

/// Whether the mount is answering from its last known state because the bucket is unreachable.
#[derive(Debug, Default)]
pub struct Reachability {
    offline: AtomicBool,
}

impl Reachability {
    /// A fallback answered for `path` because the bucket failed with `error`.
    pub fn fell_back(&self, path: &str, error: &StoreError) {
        if !self.offline.swap(true, Ordering::SeqCst) {
            tracing::warn!(
                path,
                %error,
                "the bucket cannot be reached: the mount is offline; listings and lookups answer \
                 from the last state it saw, and writes are kept to upload later"
            );
        }
    }

    /// The bucket answered a request.
    pub fn reached(&self) {
        if self.offline.swap(false, Ordering::SeqCst) {
            tracing::info!("the bucket answers again: the mount is back online");
        }
    }

    pub fn is_offline(&self) -> bool {
        self.offline.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ObjectMeta;

    fn file(key: &str) -> Entry {
        Entry::File(Arc::new(ObjectMeta {
            metadata_trimmed: false,
            key: key.into(),
            generation: 1,
            metageneration: 1,
            size: 1,
            crc32c: None,
            updated: std::time::SystemTime::UNIX_EPOCH,
            content_type: None,
            metadata: Default::default(),
        }))
    }

    /// `n` file entries of directory `dir`.
    fn listing(dir: &str, n: usize) -> Vec<(String, Entry)> {
        (0..n)
            .map(|i| {
                let name = format!("file-{i:04}");
                let entry = file(&format!("{dir}/{name}"));
                (name, entry)
            })
            .collect()
    }

    fn bytes_of(entries: &[(String, Entry)]) -> u64 {
        entries.iter().map(|(n, e)| entry_bytes(n, e)).sum()
    }

    /// The bound holds: listings past it push out the least recently used ones, and what is
    /// kept never weighs more than the bound.
    #[test]
    fn the_byte_bound_evicts_the_least_recently_used_listing() {
        let one = bytes_of(&listing("d0", 100));
        let bound = one * 5 / 2;
        let known = LastKnown::new(bound);
        for d in ["d0", "d1"] {
            known.insert_listing(d, listing(d, 100));
        }
        known.dirs.run_pending_tasks();
        assert!(known.knows("d0") && known.knows("d1"));
        // d0 is used, so d1 is the least recently used when d2 comes.
        assert!(matches!(known.get("d0/file-0001"), Some(Some(_))));
        known.dirs.run_pending_tasks();
        known.insert_listing("d2", listing("d2", 100));
        assert!(known.weighed_bytes() <= bound);
        assert!(known.knows("d0"), "recently used");
        assert!(!known.knows("d1"), "least recently used: evicted");
        assert!(known.knows("d2"), "just listed");
        assert!(known.get("d1/file-0001").is_none());
    }

    /// A listing that grows by our own creates is weighed again, so growth counts against
    /// the bound too.
    #[test]
    fn growth_by_our_own_creates_counts_against_the_bound() {
        let one = bytes_of(&listing("d0", 100));
        let known = LastKnown::new(one * 3);
        known.insert_listing("d0", listing("d0", 100));
        known.insert_listing("grow", Vec::new());
        known.dirs.run_pending_tasks();
        let before = known.weighed_bytes();
        for (name, entry) in listing("grow", 250) {
            known.set(&format!("grow/{name}"), entry);
        }
        let after = known.weighed_bytes();
        assert!(after > before + one, "{before} -> {after}");
        assert!(after <= one * 3);
        assert!(known.knows("grow"));
        assert!(!known.knows("d0"), "pushed out by the growth");
    }

    /// Our own changes edit a known directory; a changed tree is forgotten below its root.
    #[test]
    fn our_changes_edit_the_last_known_state() {
        let known = LastKnown::new(1 << 20);
        known.insert_listing(
            "d",
            vec![("a".into(), file("d/a")), ("sub".into(), Entry::Dir)],
        );
        known.insert_listing("d/sub", vec![("x".into(), file("d/sub/x"))]);
        known.set("d/b", file("d/b"));
        known.remove("d/a");
        assert!(matches!(known.get("d/a"), Some(None)));
        assert!(matches!(known.get("d/b"), Some(Some(Entry::File(_)))));
        let names: Vec<String> = known
            .listing("d")
            .unwrap()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(names, ["b", "sub"]);
        known.set("elsewhere/z", file("elsewhere/z"));
        assert!(
            known.get("elsewhere/z").is_none(),
            "an unknown directory stays unknown"
        );
        known.forget_tree("d/sub");
        known.dirs.run_pending_tasks();
        assert!(!known.knows("d/sub"));
        assert!(
            matches!(known.get("d/sub"), Some(None)),
            "its name left its directory"
        );
        assert!(known.knows("d"));
        known.forget_tree("d/sub");
        known.mark_unsure("d/sub");
        assert!(
            known.get("d/sub").is_none(),
            "its directory no longer vouches for it"
        );
        assert!(!known.knows("d"), "nor can it be listed whole");
        assert!(known.listing("d").is_none());
        known.set("d/sub", Entry::Dir);
        assert!(matches!(known.get("d/sub"), Some(Some(Entry::Dir))));
        assert!(known.knows("d"), "the outcome is known again");
        known.forget_tree("d/sub");
        known.mark_unsure("d/sub");
        known.remove("d/sub");
        assert!(matches!(known.get("d/sub"), Some(None)));
        assert!(known.knows("d"));
    }

    /// A forgotten tree takes its own listing and every listing below it, and no sibling whose
    /// name only starts the same; the index of keys stays whole across evictions and rebuilds.
    #[test]
    fn a_forgotten_tree_takes_exactly_its_listings() {
        let known = LastKnown::new(1 << 30);
        for dir in ["d", "d/a", "d/a/b", "d-x", "d-x/a", "d0", "dd", "e/d"] {
            known.insert_listing(dir, Vec::new());
        }
        known.forget_tree("d");
        known.dirs.run_pending_tasks();
        for gone in ["d", "d/a", "d/a/b"] {
            assert!(!known.knows(gone), "{gone}");
        }
        for kept in ["d-x", "d-x/a", "d0", "dd", "e/d"] {
            assert!(known.knows(kept), "{kept}");
        }
        // Many listings come and go: the index is rebuilt, and still finds every key.
        for i in 0..3000 {
            known.insert_listing(&format!("t/{i}"), Vec::new());
            known.forget_tree(&format!("t/{i}"));
        }
        assert!(known.keys.lock().len() < 3000, "rebuilt or trimmed");
        known.insert_listing("t/x/y", Vec::new());
        known.forget_tree("t");
        known.dirs.run_pending_tasks();
        assert!(!known.knows("t/x/y"));
        assert!(known.knows("dd"));
    }

    #[test]
    fn the_flag_changes_once_per_transition() {
        let r = Reachability::default();
        let e = StoreError::new(crate::store::StoreErrorKind::Transient, "reset");
        assert!(!r.is_offline());
        r.reached();
        r.fell_back("d", &e);
        r.fell_back("d", &e);
        assert!(r.is_offline());
        r.reached();
        assert!(!r.is_offline());
    }
}
