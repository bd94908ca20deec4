//! Names and inodes: what exists at a path, and what the kernel calls it.
//!
//! GCS has no directories, only keys. A directory exists here if a marker object `dir/` exists,
//! if any object has the prefix `dir/`, or if the user made it (the write path adds those). A
//! lookup asks both questions at once (a `HEAD` of `dir` and a one-item listing of `dir/`), and
//! the directory wins when both answer. Results go to the stat or negative cache, and a
//! `readdirplus` fills the stat cache with every entry, so `ls -l` costs one listing per page.
//!
//! When the bucket cannot be reached, lookups and listings in a directory this mount listed
//! whole answer from its last known state instead ([`offline`]), and the mount is offline
//! until the bucket answers again.
//!
//! This layer knows nothing of FUSE or WinFsp: it speaks paths, inode numbers and [`Attr`].

pub mod cache;
pub mod forgotten;
pub mod inode;
pub mod names;
pub mod offline;
pub mod readdir;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use moka::sync::Cache;
use parking_lot::Mutex;

use crate::config::MountConfig;
use crate::error::{FsError, FsResult};
use crate::store::retry::with_fallback;
use crate::store::{
    ListRequest, ObjectMeta, ObjectStore, Posix, StoreErrorKind, StoreResult, SYMLINK_KEY,
};
pub use cache::Entry;
use cache::MetaCache;
use inode::InodeTable;
pub use inode::{Ino, Kind, ROOT_INO};
use offline::Reachability;
use readdir::{Listed, Listing};

/// Told when a key's content in the bucket changed (with the new object) or may have (`None`).
pub type SettleHook = Arc<dyn Fn(&str, Option<&ObjectMeta>) + Send + Sync>;

/// Attributes of a file or directory, platform-neutral.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    pub kind: Kind,
    pub size: u64,
    pub mtime: SystemTime,
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    /// Object generation for files; 0 for directories.
    pub generation: i64,
    /// How long the kernel may keep this answer: what is left of the stat TTL of what it
    /// was made from, so a change in the bucket shows within `--stat-ttl` however the answer
    /// was asked for (a fresh TTL on a cached answer would let the kernel keep it for up to
    /// twice that).
    pub ttl: Duration,
}

/// One directory entry, with attributes for `readdirplus`.
#[derive(Debug, Clone)]
pub struct DirEntry {
    /// Position of the entry; the kernel resumes a listing after it.
    pub offset: u64,
    pub name: String,
    pub attr: Attr,
}

/// The namespace of one mount.
pub struct Namespace<S: ObjectStore> {
    store: Arc<S>,
    cfg: Arc<MountConfig>,
    inodes: Arc<Mutex<InodeTable>>,
    cache: Arc<MetaCache>,
    /// Keys already reported as hidden by a directory, so each is logged once.
    shadow_logged: Cache<String, ()>,
    /// Directories being listed again to refresh their names; one listing at a time each.
    relisting: Mutex<std::collections::HashSet<String>>,
    /// Whether answers come from the last known state because the bucket cannot be reached.
    link: Arc<Reachability>,
    /// The last generation this mount itself put at each path (uploads, rename copies): seen
    /// by definition (I8), whichever inode the kernel holds for the name.
    own: Cache<String, i64>,
    mount_time: SystemTime,
}

/// A directory with more names than this is never held whole in the listed-directory cache.
const MAX_LISTED_NAMES: usize = 20_000;

impl<S: ObjectStore> Namespace<S> {
    pub fn new(store: Arc<S>, cfg: Arc<MountConfig>) -> Self {
        Namespace {
            cache: Arc::new(MetaCache::new(
                cfg.cache_entries,
                cfg.stat_ttl,
                cfg.negative_ttl,
                cfg.last_known_bytes,
            )),
            link: Arc::new(Reachability::default()),
            shadow_logged: Cache::builder().max_capacity(10_000).build(),
            own: Cache::builder().max_capacity(100_000).build(),
            relisting: Mutex::new(Default::default()),
            store,
            cfg,
            inodes: Arc::new(Mutex::new(InodeTable::new())),
            mount_time: SystemTime::now(),
        }
    }

    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    /// The object key of a file at `path`.
    pub fn key_of(&self, path: &str) -> String {
        format!("{}{}", self.cfg.prefix, path)
    }

    /// The listing prefix of the directory at `path`.
    fn dir_prefix(&self, path: &str) -> String {
        if path.is_empty() {
            self.cfg.prefix.clone()
        } else {
            format!("{}{}/", self.cfg.prefix, path)
        }
    }

    fn note_shadowed(&self, key: &str) {
        if !self.shadow_logged.contains_key(key) {
            self.shadow_logged.insert(key.to_string(), ());
            tracing::warn!(
                key,
                "object is hidden by a directory of the same name; the directory wins"
            );
        }
    }

    /// Path and kind of an inode.
    pub fn inode_path(&self, ino: Ino) -> FsResult<(String, Kind)> {
        let t = self.inodes.lock();
        match t.get(ino) {
            Some(i) if !i.detached => Ok((i.path.clone(), i.kind)),
            _ => Err(FsError::NotFound),
        }
    }

    fn attr_for(&self, ino: Ino, entry: &Entry) -> Attr {
        match entry {
            Entry::Dir => Attr {
                ino,
                kind: Kind::Dir,
                size: 0,
                mtime: self.mount_time,
                perm: self.cfg.dir_mode,
                uid: self.cfg.uid,
                gid: self.cfg.gid,
                generation: 0,
                ttl: self.cfg.stat_ttl,
            },
            Entry::File(m) if entry.kind() == Kind::Symlink => Attr {
                ino,
                kind: Kind::Symlink,
                size: m.metadata.get(SYMLINK_KEY).map_or(0, |t| t.len() as u64),
                mtime: m.mtime(),
                perm: 0o777,
                uid: self.cfg.uid,
                gid: self.cfg.gid,
                generation: m.generation,
                ttl: self.cfg.stat_ttl,
            },
            Entry::File(m) => {
                let posix = if self.cfg.posix_metadata {
                    self.cfg.trusted_posix(Posix::from_metadata(&m.metadata))
                } else {
                    Posix::default()
                };
                Attr {
                    ino,
                    kind: Kind::File,
                    size: m.size,
                    mtime: m.mtime(),
                    perm: posix.mode.map_or(self.cfg.file_mode, |p| p as u16),
                    uid: posix.uid.unwrap_or(self.cfg.uid),
                    gid: posix.gid.unwrap_or(self.cfg.gid),
                    generation: m.generation,
                    ttl: self.cfg.stat_ttl,
                }
            }
        }
    }

    /// Asks the bucket what is at `path`: a directory (marker or implied by any key under it),
    /// a file, or nothing. Both questions go out at once.
    async fn probe(&self, path: &str) -> StoreResult<Option<Entry>> {
        let key = self.key_of(path);
        let list_req = ListRequest {
            prefix: format!("{key}/"),
            delimiter: Some("/".into()),
            max_results: Some(1),
            page_token: None,
        };
        let (head, listing) = tokio::join!(self.store.head(&key), self.store.list(&list_req));
        let listing = listing?;
        let is_dir = !listing.objects.is_empty() || !listing.prefixes.is_empty();
        let file = match head {
            Ok(m) => Some(m),
            Err(e) if e.kind == StoreErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        Ok(match (is_dir, file) {
            (true, Some(_)) => {
                self.note_shadowed(&key);
                Some(Entry::Dir)
            }
            (true, None) => Some(Entry::Dir),
            (false, Some(m)) => Some(Entry::File(Arc::new(m.trimmed()))),
            (false, None) => None,
        })
    }

    /// What is at `path`, from the caches or the bucket; when the bucket cannot be reached,
    /// from the last known state of its directory, if the mount has one.
    pub async fn resolve(&self, path: &str) -> FsResult<Entry> {
        self.resolve_timed(path).await.map(|(e, _)| e)
    }

    /// Like [`Self::resolve`], with how long the answer holds (see [`Attr::ttl`]). An answer
    /// from the bucket holds the full stat TTL; so does one from the last known state, which
    /// the kernel need not ask about again while the bucket cannot be reached.
    pub async fn resolve_timed(&self, path: &str) -> FsResult<(Entry, Duration)> {
        let full = self.cfg.stat_ttl;
        if let Some((answer, left)) = self.cache.get_timed(path) {
            return answer.map(|e| (e, left)).ok_or(FsError::NotFound);
        }
        // With a fallback, a bucket that fails twice in a row is not waited for any longer.
        let known = self.cache.last_known().get(path);
        let asked = if known.is_some() {
            with_fallback(self.ask(path)).await
        } else {
            self.ask(path).await
        };
        match (asked, known) {
            (Ok(found), _) => {
                self.link.reached();
                found.map(|e| (e, full)).ok_or(FsError::NotFound)
            }
            (Err(e), Some(known)) if e.is_retryable() => {
                self.link.fell_back(path, &e);
                known.map(|e| (e, full)).ok_or(FsError::NotFound)
            }
            (Err(e), _) => Err(e.into()),
        }
    }

    /// Asks the bucket what is at `path`, and caches the answer.
    async fn ask(&self, path: &str) -> StoreResult<Option<Entry>> {
        // In a directory that is being worked in, one listing answers for every name.
        let dir = path.rfind('/').map_or("", |i| &path[..i]);
        if self.cache.wants_relisting(dir) {
            match self.relist(dir).await {
                Ok(true) => {
                    if let Some(answer) = self.cache.get(path) {
                        return Ok(answer);
                    }
                }
                Ok(false) => {}
                // The bucket did not answer: a probe now would only wait as long again.
                Err(e) if e.is_retryable() => return Err(e),
                Err(_) => {}
            }
        }
        let found = self.probe(path).await?;
        match &found {
            Some(e) => self.cache.insert(path, e.clone()),
            None => self.cache.insert_missing(path),
        }
        Ok(found)
    }

    /// Lists the directory at `dir` whole, refreshing the stat cache, its listed names and its
    /// last known state. `Ok(false)` when it did not (another task is at it, too many names).
    async fn relist(&self, dir: &str) -> StoreResult<bool> {
        if !self.relisting.lock().insert(dir.to_string()) {
            return Ok(false);
        }
        let mut listing = Listing::new(self.dir_prefix(dir));
        let mut entries = Vec::new();
        let mut result = Ok(false);
        while entries.len() <= MAX_LISTED_NAMES {
            let children = match listing
                .next_page(self.store.as_ref(), &|k| self.note_shadowed(k))
                .await
            {
                Ok(children) => children,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            for child in children {
                let (name, entry) = match child {
                    Listed::Dir(n) => (n, Entry::Dir),
                    Listed::File(n, m) => (n, Entry::File(Arc::new(m))),
                };
                self.cache
                    .insert_listed(&names::join(dir, &name), entry.clone());
                entries.push((name, entry));
            }
            if listing.is_done() {
                result = Ok(true);
                break;
            }
        }
        if let Ok(true) = result {
            self.record_listing(dir, entries);
        }
        self.relisting.lock().remove(dir);
        result
    }

    /// `entries` are the whole of directory `dir`, as the bucket just listed it.
    fn record_listing(&self, dir: &str, entries: Vec<(String, Entry)>) {
        let names = entries.iter().map(|(n, _)| n.clone()).collect();
        self.cache.insert_listing(dir, names);
        self.cache.last_known().insert_listing(dir, entries);
    }

    /// A directory we just created: nothing is in it.
    pub fn note_empty_dir(&self, path: &str) {
        self.record_listing(path, Vec::new());
    }

    /// Whether the mount is offline: the bucket could not be reached, and lookups and listings
    /// answer from the last state it saw, until a request reaches it again.
    pub fn is_offline(&self) -> bool {
        self.link.is_offline()
    }

    /// Registers `path` as `entry` (adding `add_lookups` kernel references) and returns its
    /// attributes.
    pub fn register(&self, path: &str, entry: &Entry, add_lookups: u64) -> Attr {
        let kind = entry.kind();
        let meta = match entry {
            Entry::Dir => None,
            Entry::File(m) => Some(m.clone()),
        };
        let ino = self.inodes.lock().upsert(path, kind, meta, add_lookups);
        self.attr_for(ino, entry)
    }

    /// Looks up `name` in directory `parent`; the kernel now holds one more reference.
    pub async fn lookup(&self, parent: Ino, name: &str) -> FsResult<Attr> {
        let (dir, kind) = self.inode_path(parent)?;
        if kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        if names::check_component(name).is_err() {
            return Err(FsError::NotFound);
        }
        let path = names::join(&dir, name);
        let (entry, ttl) = self.resolve_timed(&path).await?;
        Ok(Attr {
            ttl,
            ..self.register(&path, &entry, 1)
        })
    }

    /// Current attributes of `ino`, refreshed from the bucket once the stat TTL has passed.
    pub async fn getattr(&self, ino: Ino) -> FsResult<Attr> {
        let (path, kind) = self.inode_path(ino)?;
        if kind == Kind::Dir {
            return Ok(self.attr_for(ino, &Entry::Dir));
        }
        match self.resolve_timed(&path).await? {
            (Entry::File(m), ttl) => {
                if let Some(i) = self.inodes.lock().get_mut(ino) {
                    i.observe(&m, false);
                }
                Ok(Attr {
                    ttl,
                    ..self.attr_for(ino, &Entry::File(m))
                })
            }
            // The file became a directory: this inode no longer names anything.
            (Entry::Dir, _) => Err(FsError::NotFound),
        }
    }

    /// Metadata of the file `ino` for opening it, and whether the kernel may keep pages it
    /// cached from an earlier open (only while the generation is unchanged).
    pub async fn open_file(&self, ino: Ino) -> FsResult<(Arc<ObjectMeta>, bool)> {
        let (path, kind) = self.inode_path(ino)?;
        if kind == Kind::Dir {
            return Err(FsError::IsDir);
        }
        let Entry::File(meta) = self.resolve(&path).await? else {
            return Err(FsError::IsDir);
        };
        let mut t = self.inodes.lock();
        let inode = t.get_mut(ino).ok_or(FsError::NotFound)?;
        if inode.replaced_by_others(&meta) {
            // The kernel would keep the old size and times (and clip reads at the old size).
            // ESTALE makes it look the name up again (LOOKUP_REVAL), which finds a new inode
            // with the new attributes, and retry.
            t.detach(&path);
            return Err(FsError::Stale);
        }
        let keep_cache = inode.last_open_generation == Some(meta.generation);
        inode.last_open_generation = Some(meta.generation);
        inode.observe(&meta, false);
        Ok((meta, keep_cache))
    }

    /// Whether the object `m` at `path` is one this mount's user saw there: one of this
    /// mount's own uploads or copies, or the generation the kernel's inode for the name rests
    /// on (I8). A view of a file written here that never reached the bucket under the name saw
    /// no object there; with no view to go by (no inode, or its basis unknown), the object found
    /// is taken for what the user sees.
    pub fn saw(&self, path: &str, m: &ObjectMeta) -> bool {
        if self.own.get(path) == Some(m.generation) {
            return true;
        }
        match self.inodes.lock().view_at(path) {
            Some(Some(g)) => g == m.generation,
            // The view is of a file written here that never reached the bucket under this
            // name: an object there is someone else's, never seen here (the sim's shared seed
            // 491 deleted another writer's object after our upload went to a conflict copy).
            Some(None) => false,
            // No view to go by.
            None => true,
        }
    }

    /// The generation the kernel's view of the file at `path` rests on, if it has one.
    pub fn basis_at(&self, path: &str) -> Option<i64> {
        self.inodes.lock().basis_at(path)
    }

    /// The inode the kernel knows at `path`, if any (no bucket request).
    pub fn ino_at(&self, path: &str) -> Option<Ino> {
        self.inodes.lock().ino_at(path)
    }

    /// The generation the user saw at `path` for a rename over it, given `m` found there: `m`
    /// if it is this mount's own or there is no view to go by, else the view's (`None` when the
    /// view rests on no bucket object: the user saw none there).
    pub fn seen_at(&self, path: &str, m: &ObjectMeta) -> Option<i64> {
        if self.saw(path, m) {
            Some(m.generation)
        } else {
            self.basis_at(path)
        }
    }

    /// The object the kernel's view of file `ino` rests on, when `ino` still names it: the
    /// generation it was opened or looked up at, or one of this mount's own uploads since (never
    /// someone else's replacement, which gets a new inode).
    pub fn current_meta(&self, ino: Ino) -> Option<Arc<ObjectMeta>> {
        let t = self.inodes.lock();
        let inode = t.get(ino).filter(|i| !i.detached)?;
        let meta = inode.meta.clone()?;
        (inode.basis.map(|(g, _)| g) == Some(meta.generation)).then_some(meta)
    }

    /// Forgets a generation that turned out to be gone (the object was replaced or deleted).
    pub fn invalidate(&self, ino: Ino) {
        if let Ok((path, _)) = self.inode_path(ino) {
            self.cache.invalidate(&path);
        }
    }

    pub fn forget(&self, ino: Ino, n: u64) {
        self.inodes.lock().forget(ino, n);
    }

    /// Counts one more kernel reference, for entries returned by `readdirplus`.
    pub fn add_lookup(&self, ino: Ino) {
        self.inodes.lock().add_lookup(ino);
    }

    /// Starts a pass over directory `ino`. `local` are files being written in it, which the
    /// listing may not show yet (or shows with old attributes); they override what it says.
    pub fn open_dir(&self, ino: Ino, local: Vec<(String, Entry)>) -> FsResult<DirStream> {
        let (path, kind) = self.inode_path(ino)?;
        if kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        let mut s = DirStream::new(ino, path.clone(), self.dir_prefix(&path));
        s.set_local(local);
        Ok(s)
    }

    /// Whether the kernel may keep serving `ino`'s listing from its own cache: see
    /// [`cache::MetaCache::kernel_listing_fresh`].
    pub fn kernel_listing_fresh(&self, ino: Ino) -> bool {
        self.inode_path(ino)
            .is_ok_and(|(path, _)| self.cache.kernel_listing_fresh(&path))
    }

    /// The listing prefix of the directory at `path`, as an object-key prefix.
    pub fn dir_key_prefix(&self, path: &str) -> String {
        self.dir_prefix(path)
    }

    /// Records in the caches that `path` now holds `entry`.
    pub fn note(&self, path: &str, entry: Entry) {
        self.cache.insert(path, entry);
    }

    /// Records in the caches that nothing is at `path` any more.
    pub fn note_missing(&self, path: &str) {
        self.cache.insert_missing(path);
    }

    /// Forgets what the caches know of `path` and, for a directory, everything under it.
    pub fn forget_tree(&self, path: &str) {
        self.cache.invalidate_tree(path);
    }

    /// Like [`Self::forget_tree`], after a change to `path` that failed part way or left
    /// another writer's object there: not even the last known state vouches for it any more.
    pub fn forget_outcome(&self, path: &str) {
        self.cache.invalidate_outcome(path);
    }

    /// Attributes of an inode whose name went away (unlinked or replaced), from what was last
    /// seen of it: a descriptor still open on it can `fstat`, as on a local disk.
    pub fn detached_attr(&self, ino: Ino) -> Option<Attr> {
        let t = self.inodes.lock();
        let i = t.get(ino).filter(|i| i.detached)?;
        let entry = match (&i.meta, i.kind) {
            (_, Kind::Dir) => Entry::Dir,
            (Some(m), _) => Entry::File(m.clone()),
            (None, _) => return None,
        };
        drop(t);
        Some(self.attr_for(ino, &entry))
    }

    /// Nothing is at `path` any more (unlinked or removed): its inode stops answering to it.
    pub fn detach(&self, path: &str) {
        self.inodes.lock().detach(path);
    }

    /// The object `m` (at its key) is this mount's own making: a copy of a directory rename.
    /// It counts as seen at its path, as an upload of ours does.
    pub fn note_own(&self, m: &ObjectMeta) {
        if let Some(path) = m.key.strip_prefix(&self.cfg.prefix) {
            self.own.insert(path.to_string(), m.generation);
        }
    }

    /// The inode at `from` is now at `to`.
    pub fn rename_inode(&self, from: &str, to: &str, copied: Option<&Arc<ObjectMeta>>) {
        if let Some(m) = copied {
            self.own.insert(to.to_string(), m.generation);
        }
        self.inodes.lock().rename(from, to, copied);
    }

    /// A callback for the write path: a key's content in the bucket changed (with the new
    /// object) or may have (with `None`).
    pub fn settle_hook(&self) -> SettleHook {
        let cache = self.cache.clone();
        let inodes = self.inodes.clone();
        let own = self.own.clone();
        let prefix = self.cfg.prefix.clone();
        let link = self.link.clone();
        Arc::new(move |key: &str, meta: Option<&ObjectMeta>| {
            let Some(path) = key.strip_prefix(&prefix) else {
                return;
            };
            match meta {
                Some(m) => {
                    // An upload landed: the bucket is reachable again.
                    link.reached();
                    own.insert(path.to_string(), m.generation);
                    let m = Arc::new(m.clone());
                    inodes.lock().settled(path, &m);
                    cache.insert(path, Entry::File(m));
                }
                None => cache.invalidate(path),
            }
        })
    }

    /// Entries of `stream` after position `offset`, fetching pages as needed. Returns an empty
    /// list at the end. An `offset` before what the stream still holds restarts the listing.
    pub async fn read_dir(&self, stream: &mut DirStream, offset: u64) -> FsResult<Vec<DirEntry>> {
        if offset < stream.consumed {
            stream.restart();
        }
        stream.buffer.retain(|e| e.offset > offset);
        stream.consumed = stream.consumed.max(offset);
        while stream.buffer.is_empty() && !stream.finished() {
            self.fill(stream).await?;
            stream.buffer.retain(|e| e.offset > offset);
        }
        Ok(stream
            .buffer
            .iter()
            .take(MAX_ENTRIES_PER_CALL)
            .cloned()
            .collect())
    }

    async fn fill(&self, stream: &mut DirStream) -> FsResult<()> {
        if !stream.dots_done {
            stream.dots_done = true;
            let parent = self.parent_ino(&stream.path);
            let dot = self.attr_for(stream.ino, &Entry::Dir);
            let dotdot = self.attr_for(parent, &Entry::Dir);
            stream.push(".".into(), dot);
            stream.push("..".into(), dotdot);
            return Ok(());
        }
        if stream.listing.is_done() {
            if let Some(seen) = stream.seen.take() {
                let names = seen.iter().map(|(n, _)| n.clone()).collect();
                self.cache
                    .note_kernel_listing(&stream.path, Arc::new(names));
                self.record_listing(&stream.path, seen);
            }
            // Files being written that the bucket does not list yet.
            for (name, entry) in std::mem::take(&mut stream.local) {
                let path = names::join(&stream.path, &name);
                let attr = self.register(&path, &entry, 0);
                stream.push(name, attr);
            }
            stream.local_done = true;
            return Ok(());
        }
        // Before the first page, the last known state can still answer for the whole pass;
        // after it, the pass is the bucket's to finish (or to fail), never a mix of both.
        let fallback = stream.pages == 0 && self.cache.last_known().knows(&stream.path);
        let on_shadowed = |k: &str| self.note_shadowed(k);
        let page = stream.listing.next_page(self.store.as_ref(), &on_shadowed);
        let page = if fallback {
            with_fallback(page).await
        } else {
            page.await
        };
        let children = match page {
            Ok(children) => children,
            Err(e) if fallback && e.is_retryable() => {
                let Some(known) = self.cache.last_known().listing(&stream.path) else {
                    return Err(e.into());
                };
                self.link.fell_back(&stream.path, &e);
                self.fill_from_known(stream, known);
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
        self.link.reached();
        stream.pages += 1;
        for child in children {
            let (name, listed) = match child {
                Listed::Dir(n) => (n, Entry::Dir),
                Listed::File(n, m) => (n, Entry::File(Arc::new(m))),
            };
            let path = names::join(&stream.path, &name);
            if let Some(seen) = stream.seen.as_mut() {
                seen.push((name.clone(), listed.clone()));
                if seen.len() > MAX_LISTED_NAMES {
                    stream.seen = None;
                }
            }
            let entry = match (stream.local.remove(&name), listed) {
                // A file being written: its local size and mtime are the truth.
                (Some(local), Entry::File(_)) => local,
                (_, listed) => {
                    self.cache.insert_listed(&path, listed.clone());
                    listed
                }
            };
            let attr = self.register(&path, &entry, 0);
            stream.push(name, attr);
        }
        Ok(())
    }

    /// Answers the whole pass of `stream` from `known`, the directory's last known entries
    /// (files being written override them, as they do a listing). Nothing of it goes into the
    /// caches, and the kernel may not keep it past this pass: the next `ls` asks the bucket.
    fn fill_from_known(&self, stream: &mut DirStream, known: Vec<(String, Entry)>) {
        self.cache.forget_kernel_listing(&stream.path);
        stream.seen = None;
        stream.listing.finish();
        for (name, known) in known {
            let entry = match (stream.local.remove(&name), known) {
                (Some(local), Entry::File(_)) => local,
                (_, known) => known,
            };
            let attr = self.register(&names::join(&stream.path, &name), &entry, 0);
            stream.push(name, attr);
        }
        // The files being written that it lacks follow, as after a listing.
    }

    fn parent_ino(&self, path: &str) -> Ino {
        let parent = match path.rfind('/') {
            Some(i) => &path[..i],
            None => "",
        };
        self.inodes.lock().upsert(parent, Kind::Dir, None, 0)
    }

    /// Number of live inodes; for tests and status.
    pub fn inode_count(&self) -> usize {
        self.inodes.lock().len()
    }
}

/// Entries handed out per `read_dir` call; the kernel's buffer takes far fewer.
const MAX_ENTRIES_PER_CALL: usize = 256;

/// One open directory handle.
pub struct DirStream {
    ino: Ino,
    path: String,
    prefix: String,
    listing: Listing,
    dots_done: bool,
    next_offset: u64,
    consumed: u64,
    buffer: std::collections::VecDeque<DirEntry>,
    /// Files being written in this directory, as given at open, for restarts.
    local_all: Vec<(String, Entry)>,
    /// Those not yet matched against the listing.
    local: std::collections::HashMap<String, Entry>,
    local_done: bool,
    /// Every entry the listing gave, for the listed-directory cache and the last known state
    /// (None once too many, or when the pass is answered from the last known state).
    seen: Option<Vec<(String, Entry)>>,
    /// Listing pages the bucket has answered in this pass.
    pages: u64,
}

impl DirStream {
    fn new(ino: Ino, path: String, prefix: String) -> Self {
        DirStream {
            listing: Listing::new(prefix.clone()),
            ino,
            path,
            prefix,
            dots_done: false,
            next_offset: 1,
            consumed: 0,
            buffer: Default::default(),
            local_all: Vec::new(),
            local: Default::default(),
            local_done: false,
            seen: Some(Default::default()),
            pages: 0,
        }
    }

    fn set_local(&mut self, local: Vec<(String, Entry)>) {
        self.local = local.iter().cloned().collect();
        self.local_all = local;
    }

    fn restart(&mut self) {
        let local = std::mem::take(&mut self.local_all);
        *self = DirStream::new(
            self.ino,
            std::mem::take(&mut self.path),
            std::mem::take(&mut self.prefix),
        );
        self.set_local(local);
    }

    fn finished(&self) -> bool {
        self.dots_done && self.listing.is_done() && self.local_done
    }

    fn push(&mut self, name: String, attr: Attr) {
        self.buffer.push_back(DirEntry {
            offset: self.next_offset,
            name,
            attr,
        });
        self.next_offset += 1;
    }
}

#[cfg(test)]
mod tests;
