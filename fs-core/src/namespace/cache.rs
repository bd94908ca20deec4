//! Stat and negative-lookup caches, both `moka` caches bounded in entries and expiring by TTL.
//!
//! The stat cache answers "what is at this path" for `--stat-ttl` (default 60 s, as gcsfuse);
//! the negative cache answers "nothing is at this path" for `--negative-ttl` (default 5 s), which
//! absorbs the storms of failed lookups that shells, editors and Explorer make. Keys are paths
//! relative to the mount. A fresh answer from the bucket always replaces what is cached, so a
//! new generation drops everything known about the old one.
//!
//! A third cache holds *listed directories*: every name a directory had when it was last listed
//! whole (or created empty by us), kept up to date with our own changes. For the negative TTL
//! it answers "not there" for any other name in it, with no bucket request. That is what keeps
//! `cp -r` or `tar x` of thousands of new files from paying a round trip per file just to learn
//! that the name is free. A name it does hold still goes to the stat cache or the bucket, so an
//! evicted stat entry can never turn into a wrong "not there".
//!
//! The same changes also keep the *last known state* current ([`super::offline::LastKnown`]):
//! each directory's last whole listing with its entries, kept far longer than these TTLs and
//! bounded in bytes, which answers only while the bucket cannot be reached.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use moka::sync::Cache;
use parking_lot::Mutex;

use super::forgotten::Forgotten;
use super::inode::Kind;
use super::offline::LastKnown;
use crate::store::{ObjectMeta, SYMLINK_KEY};

/// What a path was last seen to be.
#[derive(Debug, Clone)]
pub enum Entry {
    Dir,
    /// A file, or a symbolic link (an object marked with [`SYMLINK_KEY`]).
    File(Arc<ObjectMeta>),
}

impl Entry {
    pub fn kind(&self) -> Kind {
        match self {
            Entry::Dir => Kind::Dir,
            Entry::File(m) if m.metadata.contains_key(SYMLINK_KEY) => Kind::Symlink,
            Entry::File(_) => Kind::File,
        }
    }
}

/// The names of one listed directory, which our own changes keep current.
type Names = Arc<Mutex<HashSet<String>>>;

/// Bytes of name and metadata one unit of the stat cache's capacity stands for.
const STAT_ENTRY_BYTES: usize = 512;

/// The metadata caches of one mount.
pub struct MetaCache {
    /// Each entry with when it was learnt: the kernel is told how much of the TTL is left, so
    /// an answer cached here never lives past `--stat-ttl` in the kernel either.
    stat: Cache<String, (Entry, Instant)>,
    stat_ttl: Duration,
    /// Each name known missing, with when it was learnt.
    negative: Cache<String, Instant>,
    /// Directory path -> every name in it, with when it was listed.
    listed: Cache<String, (Names, Instant)>,
    /// Directories listed within the stat TTL: worth listing again when `listed` expires,
    /// rather than asking the bucket about each name.
    recent: Cache<String, Instant>,
    /// Directory path -> the names of its last whole listing, which the kernel holds in its
    /// own directory cache (`FOPEN_CACHE_DIR`). For the stat TTL the kernel may keep answering
    /// `readdir` from it, unless we learn that a name came or went (see
    /// [`Self::kernel_listing_fresh`]).
    kernel: Cache<String, (Arc<HashSet<String>>, Instant)>,
    /// Trees forgotten since values of the caches above were cached: such a value no longer
    /// answers (see [`Forgotten`] for why this is not `moka`'s own invalidation by predicate).
    forgotten: Forgotten,
    /// Every directory's last whole listing, for when the bucket cannot be reached.
    known: LastKnown,
}

/// Splits a path into its directory and its last component.
fn split(path: &str) -> (&str, &str) {
    match path.rfind('/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => ("", path),
    }
}

impl MetaCache {
    /// Caches of `capacity` entries each; the last known state takes at most about
    /// `last_known_bytes`.
    pub fn new(
        capacity: u64,
        stat_ttl: Duration,
        negative_ttl: Duration,
        last_known_bytes: u64,
    ) -> Self {
        MetaCache {
            stat_ttl,
            forgotten: Forgotten::new(stat_ttl.max(negative_ttl)),
            known: LastKnown::new(last_known_bytes),
            // Weighed by size, in units of an ordinary entry: a long name or a link's target
            // counts for more, so the cache is bounded in bytes as well as in names.
            stat: Cache::builder()
                .max_capacity(capacity)
                .weigher(|key: &String, (entry, _): &(Entry, Instant)| {
                    let meta = match entry {
                        Entry::Dir => 0,
                        Entry::File(m) => {
                            m.key.len()
                                + m.metadata
                                    .iter()
                                    .map(|(k, v)| k.len() + v.len())
                                    .sum::<usize>()
                        }
                    };
                    u32::try_from(1 + (key.len() + meta) / STAT_ENTRY_BYTES).unwrap_or(u32::MAX)
                })
                .time_to_live(stat_ttl.max(Duration::from_nanos(1)))
                .build(),
            negative: Cache::builder()
                .max_capacity(capacity)
                .time_to_live(negative_ttl.max(Duration::from_nanos(1)))
                .build(),
            listed: Cache::builder()
                .max_capacity(capacity)
                .weigher(|_, (names, _): &(Names, Instant)| {
                    u32::try_from(names.lock().len() + 1).unwrap_or(u32::MAX)
                })
                .time_to_live(negative_ttl.max(Duration::from_nanos(1)))
                .build(),
            recent: Cache::builder()
                .max_capacity(capacity)
                .time_to_live(stat_ttl.max(Duration::from_nanos(1)))
                .build(),
            kernel: Cache::builder()
                .max_capacity(capacity)
                .weigher(|_, (names, _): &(Arc<HashSet<String>>, Instant)| {
                    u32::try_from(names.len() + 1).unwrap_or(u32::MAX)
                })
                .time_to_live(stat_ttl.max(Duration::from_nanos(1)))
                .build(),
        }
    }

    /// The kernel now holds `names` as the whole listing of `dir`.
    pub fn note_kernel_listing(&self, dir: &str, names: Arc<HashSet<String>>) {
        self.kernel.insert(dir.to_string(), (names, Instant::now()));
    }

    /// Whether the kernel's copy of `dir`'s listing is still good: made within the stat TTL,
    /// and no name has come or gone since, as far as this mount has seen.
    pub fn kernel_listing_fresh(&self, dir: &str) -> bool {
        self.kernel_listing(dir).is_some()
    }

    /// The kernel's copy of `dir`'s listing, unless forgotten since.
    fn kernel_listing(&self, dir: &str) -> Option<Arc<HashSet<String>>> {
        let (names, at) = self.kernel.get(dir)?;
        (!self.forgotten.covers(dir, at)).then_some(names)
    }

    /// What the stat cache holds at `path`, with when it was learnt, unless forgotten since.
    fn stat_entry(&self, path: &str) -> Option<(Entry, Instant)> {
        let (e, at) = self.stat.get(path)?;
        (!self.forgotten.covers(path, at)).then_some((e, at))
    }

    /// Whether the negative cache holds `path`, and it was not forgotten since.
    fn known_missing(&self, path: &str) -> bool {
        self.negative
            .get(path)
            .is_some_and(|at| !self.forgotten.covers(path, at))
    }

    /// The kernel's copy of `dir`'s listing may not be kept past this pass (it was answered
    /// from the last known state).
    pub fn forget_kernel_listing(&self, dir: &str) {
        self.kernel.invalidate(dir);
    }

    /// The last known state, for answers while the bucket cannot be reached.
    pub fn last_known(&self) -> &LastKnown {
        &self.known
    }

    /// `path` exists (`present`) or not: the kernel's listing of its directory is stale if it
    /// says otherwise.
    fn check_kernel_listing(&self, path: &str, present: bool) {
        let (dir, name) = split(path);
        if let Some(names) = self.kernel_listing(dir) {
            if names.contains(name) != present {
                self.kernel.invalidate(dir);
            }
        }
    }

    /// Records every name of the directory `dir` (a whole listing, or empty after a mkdir).
    pub fn insert_listing(&self, dir: &str, names: HashSet<String>) {
        let now = Instant::now();
        self.listed
            .insert(dir.to_string(), (Arc::new(Mutex::new(names)), now));
        self.recent.insert(dir.to_string(), now);
    }

    /// Whether `dir` was listed recently but its listing has expired.
    pub fn wants_relisting(&self, dir: &str) -> bool {
        let recent = self
            .recent
            .get(dir)
            .is_some_and(|at| !self.forgotten.covers(dir, at));
        recent && self.listing(dir).is_none()
    }

    /// The names of `dir` as last listed, unless that listing expired or was forgotten.
    fn listing(&self, dir: &str) -> Option<Names> {
        let (names, at) = self.listed.get(dir)?;
        (!self.forgotten.covers(dir, at)).then_some(names)
    }

    fn listed_parent<'p>(&self, path: &'p str) -> Option<(Names, &'p str)> {
        let (dir, name) = split(path);
        self.listing(dir).map(|names| (names, name))
    }

    /// `Some(Some(e))`: known to exist; `Some(None)`: known not to exist; `None`: ask the bucket.
    pub fn get(&self, path: &str) -> Option<Option<Entry>> {
        self.get_timed(path).map(|(e, _)| e)
    }

    /// Like [`Self::get`], with how much longer the answer holds: what is left of the stat
    /// TTL for an entry (the full TTL for an answer made now).
    pub fn get_timed(&self, path: &str) -> Option<(Option<Entry>, Duration)> {
        if let Some((e, at)) = self.stat_entry(path) {
            return Some((Some(e), self.stat_ttl.saturating_sub(at.elapsed())));
        }
        if self.known_missing(path) {
            return Some((None, Duration::ZERO));
        }
        if let Some((names, name)) = self.listed_parent(path) {
            if !names.lock().contains(name) {
                return Some((None, Duration::ZERO));
            }
        }
        None
    }

    pub fn insert(&self, path: &str, entry: Entry) {
        self.check_kernel_listing(path, true);
        self.negative.invalidate(path);
        if let Some((names, name)) = self.listed_parent(path) {
            names.lock().insert(name.to_string());
        }
        self.known.set(path, entry.clone());
        self.stat.insert(path.to_string(), (entry, Instant::now()));
    }

    /// Like [`Self::insert`], for what a listing saw: a listing page can be older than an
    /// answer already cached (our own upload landing while the page was in flight), so it never
    /// replaces a newer generation of the same file.
    pub fn insert_listed(&self, path: &str, entry: Entry) {
        if let (Some((Entry::File(cached), _)), Entry::File(listed)) =
            (self.stat_entry(path), &entry)
        {
            if listed.generation < cached.generation {
                return;
            }
        }
        self.insert(path, entry);
    }

    pub fn insert_missing(&self, path: &str) {
        self.check_kernel_listing(path, false);
        self.stat.invalidate(path);
        if let Some((names, name)) = self.listed_parent(path) {
            names.lock().remove(name);
        }
        self.known.remove(path);
        self.negative.insert(path.to_string(), Instant::now());
    }

    /// Forgets what is known of `path`: it may have changed, so its directory's listing can no
    /// longer vouch for it either.
    pub fn invalidate(&self, path: &str) {
        self.stat.invalidate(path);
        self.negative.invalidate(path);
        self.listed.invalidate(split(path).0);
        self.kernel.invalidate(split(path).0);
    }

    /// Like [`Self::invalidate_tree`], after a change whose outcome is not known: the last
    /// known state can no longer vouch for the name either way.
    pub fn invalidate_outcome(&self, path: &str) {
        self.invalidate_tree(path);
        self.known.mark_unsure(path);
    }

    /// Forgets everything at or under `path` (a name created, removed or renamed, which may
    /// have been a directory with cached children).
    pub fn invalidate_tree(&self, path: &str) {
        self.forgotten.forget(path);
        // The name itself, most often the whole tree, leaves the caches at once rather than
        // taking their room until it expires.
        self.stat.invalidate(path);
        self.negative.invalidate(path);
        self.listed.invalidate(path);
        self.recent.invalidate(path);
        self.kernel.invalidate(path);
        // The parent's listing in the kernel still shows the tree, or not yet: ask again.
        self.kernel.invalidate(split(path).0);
        // The parent's listing keeps vouching for other names; this one is asked about again.
        if let Some((names, name)) = self.listed_parent(path) {
            names.lock().insert(name.to_string());
        }
        self.known.forget_tree(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A renamed or removed tree is forgotten at once by every cache: the directory itself
    /// and everything under it.
    #[test]
    fn a_forgotten_tree_is_gone_from_every_cache() {
        let c = MetaCache::new(
            100,
            Duration::from_secs(60),
            Duration::from_secs(60),
            1 << 20,
        );
        c.insert("d", Entry::Dir);
        c.insert("d/x", Entry::Dir);
        c.insert_missing("d/gone");
        c.insert("dd", Entry::Dir);
        c.invalidate_tree("d");
        assert!(c.get("d").is_none());
        assert!(c.get("d/x").is_none());
        assert!(c.get("d/gone").is_none());
        assert!(
            matches!(c.get("dd"), Some(Some(Entry::Dir))),
            "a sibling stays"
        );
    }

    #[test]
    fn positive_and_negative_replace_each_other() {
        let c = MetaCache::new(
            10,
            Duration::from_secs(60),
            Duration::from_secs(60),
            1 << 20,
        );
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
    fn a_listed_directory_answers_for_names_it_lacks() {
        let c = MetaCache::new(
            100,
            Duration::from_secs(60),
            Duration::from_secs(60),
            1 << 20,
        );
        c.insert_listing("d", ["a".to_string()].into());
        assert!(matches!(c.get("d/b"), Some(None)), "not in the listing");
        assert!(
            c.get("d/a").is_none(),
            "listed but not cached: ask the bucket"
        );
        assert!(c.get("e/b").is_none(), "another directory");
        c.insert("d/b", Entry::Dir);
        c.stat.invalidate("d/b");
        assert!(c.get("d/b").is_none(), "our own change joined the listing");
        c.insert_missing("d/a");
        c.negative.invalidate("d/a");
        assert!(matches!(c.get("d/a"), Some(None)), "our own delete left it");
        c.invalidate("d/x");
        assert!(
            c.get("d/zzz").is_none(),
            "a possible change drops the listing"
        );
        c.insert_listing("", HashSet::new());
        assert!(matches!(c.get("top"), Some(None)), "the root");
        c.insert_listing("d", HashSet::new());
        c.invalidate_tree("d/sub");
        assert!(
            c.get("d/sub").is_none(),
            "a changed subtree is asked about again"
        );
        assert!(matches!(c.get("d/other"), Some(None)));
        c.invalidate_tree("d");
        assert!(!c.wants_relisting("d"));
    }

    #[test]
    fn a_listing_never_replaces_a_newer_generation() {
        let c = MetaCache::new(
            10,
            Duration::from_secs(60),
            Duration::from_secs(60),
            1 << 20,
        );
        let file = |generation| {
            Entry::File(Arc::new(ObjectMeta {
                metadata_trimmed: false,
                key: "f".into(),
                generation,
                metageneration: 1,
                size: 1,
                crc32c: None,
                updated: std::time::SystemTime::UNIX_EPOCH,
                content_type: None,
                metadata: Default::default(),
            }))
        };
        c.insert("f", file(5));
        c.insert_listed("f", file(4));
        assert!(matches!(c.get("f"), Some(Some(Entry::File(m))) if m.generation == 5));
        c.insert_listed("f", file(6));
        assert!(matches!(c.get("f"), Some(Some(Entry::File(m))) if m.generation == 6));
    }

    #[test]
    fn entries_expire() {
        let c = MetaCache::new(
            10,
            Duration::from_millis(20),
            Duration::from_millis(20),
            1 << 20,
        );
        c.insert("a", Entry::Dir);
        c.insert_missing("b");
        std::thread::sleep(Duration::from_millis(50));
        assert!(c.get("a").is_none());
        assert!(c.get("b").is_none());
    }
}
