//! The disk read cache (`--read-cache-dir`): what was read from the bucket, kept on the local
//! disk across mounts, so reading it again costs no download.
//!
//! It sits under the read-ahead: every ranged GET a [`Reader`](super::Reader) makes goes
//! through [`read_range`], which serves the range from disk when all its blocks are there and
//! otherwise fetches it from the bucket and offers the bytes to the cache. Like rclone's
//! `--vfs-cache-mode full` and gcsfuse's file cache, it is off unless a directory is given.
//!
//! What it promises, and how:
//!
//! - **Only the generation a handle opened is ever served.** A cache file belongs to one
//!   (bucket, key, generation, size, CRC32C), named by a hash of them ([`file`]), so a
//!   replaced object has a different file: it is read new as soon as `open` sees the new
//!   generation, exactly when the kernel drops its page cache too.
//! - **Never wrong bytes.** Every block read back is checked against the CRC32C recorded when
//!   it was written. A block that fails is logged, dropped, and fetched again from the bucket.
//!   A torn or foreign file only costs a refetch. When a whole sequential read finds that the
//!   object's CRC32C does not match, its cache file is discarded too.
//! - **Bounded by `--read-cache-size`**, counted in disk bytes actually written, index
//!   included ([`index`]); least recently used files are evicted whole.
//! - **Eviction is safe during a read.** Files are evicted by renaming them away and then
//!   deleting them: a reader that already opened the file reads the old inode, whose bytes are
//!   still right; one that opens it afterwards finds nothing and goes to the bucket; one that
//!   opens a file recreated under the same name checks every block and, finding the entry
//!   changed, quietly goes to the bucket.
//! - **Filling never makes a read wait.** Fetched bytes are queued for one writer thread
//!   ([`fill`]), up to a quarter of `--max-read-memory`, and dropped when the queue is full;
//!   the reader never waits for the disk, and the writer gives way to it for the CPU. Hits are
//!   read on the blocking pool.
//! - **Kept across remounts.** At start-up the directory is scanned (names and sizes only);
//!   a file's records are read when it is first opened. Recency survives through file times.
//!
//! Layout: `<dir>/bucketdrive-read-cache/` (0700) holds `lock` (held for the life of the
//! mount: two mounts never share a read cache) and, per object generation,
//! `objects/<hash>.data` and `objects/<hash>.index` (0600; [`file`]).

mod file;
mod fill;
mod index;
#[cfg(test)]
mod tests;

use std::fs::{File, TryLockError};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use parking_lot::Mutex;

pub use file::{Identity, BLOCK};
use index::{Index, Plan};

use crate::platform::{self, At, Dir, Open};
use crate::store::{ObjectMeta, ObjectStore, StoreResult};

/// Our sub-directory of the directory `--read-cache-dir` names.
pub const SUBDIR: &str = "bucketdrive-read-cache";

/// `--read-cache-size` when not given.
pub const DEFAULT_SIZE: u64 = 10 << 30;

/// How long filling stays paused after the cache disk was found full.
const PAUSE_WHEN_FULL: Duration = Duration::from_secs(60);

/// How long opening waits for another mount to let go of the directory: a mount that was
/// just unmounted may still be writing what it read (see [`ReadCache::flush`]).
pub const LOCK_WAIT: Duration = Duration::from_secs(15);

/// Where the read cache lives and how big it may grow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadCacheConfig {
    /// Our own directory (the named directory's [`SUBDIR`]).
    pub root: PathBuf,
    /// Most disk bytes kept.
    pub size: u64,
    /// How long to wait for the directory's lock ([`LOCK_WAIT`]).
    pub lock_wait: Duration,
    /// Most fetched bytes held in memory while they wait to be written ([`fill_queue_for`]).
    pub fill_queue: u64,
}

/// The fill queue of a mount whose read-ahead may use `max_read_memory`: a quarter of it, at
/// least 32 MiB, on top of it.
pub fn fill_queue_for(max_read_memory: u64) -> u64 {
    (max_read_memory / 4).max(32 << 20)
}

/// What the cache has done since it was opened; for tests, benchmarks and logs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReadCacheStats {
    /// Bytes served from disk.
    pub hit_bytes: u64,
    /// Bytes fetched from the bucket because the disk did not have them.
    pub miss_bytes: u64,
    /// Bytes written to cache files.
    pub written_bytes: u64,
    /// Fetched bytes not written: the writer was behind, filling was paused, or no room.
    pub skipped_bytes: u64,
    /// Blocks that failed their check on read-back.
    pub corrupt_blocks: u64,
    /// Cache files evicted to make room.
    pub evicted_files: u64,
    /// Disk bytes charged now.
    pub used: u64,
    /// Cache files known now.
    pub files: u64,
}

#[derive(Default)]
struct Counters {
    hit: AtomicU64,
    miss: AtomicU64,
    written: AtomicU64,
    skipped: AtomicU64,
    corrupt: AtomicU64,
    evicted: AtomicU64,
}

/// A test's hook into a disk read: called before the file is opened and after.
#[cfg(test)]
type Hook = Arc<dyn Fn(&Shared) + Send + Sync>;

/// State shared by the cache, its object handles and the writer thread.
pub(crate) struct Shared {
    /// The held `objects/` directory: every cache file is reached through it.
    objects: Arc<Dir>,
    index: Mutex<Index>,
    queue: fill::Queue,
    counters: Counters,
    paused_until: Mutex<Option<Instant>>,
    warned: AtomicBool,
    /// Held by a test to stall the writer.
    #[cfg(test)]
    gate: Mutex<()>,
    #[cfg(test)]
    hooks: Mutex<(Option<Hook>, Option<Hook>)>,
}

/// An open, locked read cache directory.
pub struct ReadCache {
    shared: Arc<Shared>,
    root: PathBuf,
    // Dropped in this order: the writer finishes before the lock is released.
    _filler: fill::Filler,
    _lock: File,
}

impl std::fmt::Debug for ReadCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadCache")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

fn is_cache_name(n: &str) -> bool {
    n.len() == 32 && n.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl ReadCache {
    /// Creates (if needed), locks and scans the cache at `cfg.root`. Fails with a one-line
    /// message when another mount holds it or it cannot be used.
    pub fn open(cfg: &ReadCacheConfig) -> Result<ReadCache, String> {
        let root = &cfg.root;
        let fail = |p: PathBuf, e: std::io::Error| {
            format!("cannot use read cache directory {}: {e}", p.display())
        };
        let dir = Dir::private(root).map_err(|e| fail(root.clone(), e))?;
        let objects = dir
            .child("objects")
            .map_err(|e| fail(root.join("objects"), e))?;
        let lock_at = dir.at("lock");
        let lock = lock_at
            .open(Open::new().read(true).write(true).create(true))
            .map_err(|e| format!("cannot open {lock_at}: {e}"))?;
        let deadline = Instant::now() + cfg.lock_wait;
        loop {
            match lock.try_lock() {
                Ok(()) => break,
                Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(TryLockError::WouldBlock) => {
                    return Err(format!(
                        "read cache directory {} is in use by another mount; give each mount \
                         its own --read-cache-dir",
                        root.display()
                    ))
                }
                Err(TryLockError::Error(e)) => {
                    return Err(format!(
                        "cannot lock read cache directory {}: {e}",
                        root.display()
                    ))
                }
            }
        }
        let mut index = Index::new(cfg.size);
        let doomed = scan(&objects, &mut index)
            .map_err(|e| format!("cannot read read cache directory {}: {e}", root.display()))?;
        let evicted = index.trim();
        let shared = Arc::new(Shared {
            objects,
            index: Mutex::new(index),
            queue: fill::Queue::new(cfg.fill_queue),
            counters: Counters::default(),
            paused_until: Mutex::new(None),
            warned: AtomicBool::new(false),
            #[cfg(test)]
            gate: Mutex::new(()),
            #[cfg(test)]
            hooks: Mutex::new((None, None)),
        });
        for at in doomed {
            let _ = at.remove();
        }
        for (name, _) in &evicted {
            shared.path(name).remove();
        }
        crate::metrics::read_cache_limit(cfg.size);
        {
            let ix = shared.index.lock();
            shared.publish(&ix);
            tracing::info!(
                dir = %root.display(),
                size = cfg.size,
                files = ix.len(),
                used = ix.used(),
                "read cache"
            );
        }
        let filler = fill::Filler::start(shared.clone())
            .map_err(|e| format!("cannot start the read cache writer: {e}"))?;
        Ok(ReadCache {
            shared,
            root: root.clone(),
            _filler: filler,
            _lock: lock,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The handle a reader of `meta` (in `bucket`) reads through; `None` for objects that are
    /// not cached (empty ones). The first open of an object cached by an earlier mount reads
    /// its file's records; a file that turns out not to be the object's is deleted.
    pub async fn object(&self, bucket: &str, meta: &ObjectMeta) -> Option<ObjectCache> {
        let id = Arc::new(Identity::new(bucket, meta)?);
        let handle = ObjectCache {
            shared: self.shared.clone(),
            id: id.clone(),
        };
        let epoch = {
            let mut ix = self.shared.index.lock();
            ix.touch(id.name());
            match ix.entry(id.name()) {
                Some(e) if e.blocks.is_none() => e.epoch,
                _ => return Some(handle),
            }
        };
        let path = self.shared.path(id.name());
        let for_load = id.clone();
        let loaded = platform::blocking(move || {
            let f = path.open_read()?;
            let present = file::load(&f.index, &for_load)?;
            if present.is_some() {
                // The data file's modification time is its last use, for the next mount's
                // LRU order.
                let _ = f.data.set_modified(SystemTime::now());
            }
            Ok(present)
        })
        .await;
        let doomed = {
            let mut ix = self.shared.index.lock();
            let doomed = match loaded {
                Ok(Some(present)) => {
                    ix.install(id.name(), epoch, &present, &id);
                    None
                }
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    self.shared.warn_io("cannot read a read cache file", &e);
                    None
                }
                _ if ix.entry(id.name()).is_some_and(|e| e.epoch == epoch) => {
                    tracing::debug!(key = %id.key, "discarding a read cache file that is not the object's");
                    ix.remove(id.name());
                    self.shared.retire(id.name(), epoch)
                }
                _ => None,
            };
            self.shared.publish(&ix);
            doomed
        };
        if let Some(p) = doomed {
            p.remove();
        }
        Some(handle)
    }

    /// The data file of `meta`'s generation for the kernel to read itself (FUSE passthrough),
    /// once this mount checked it whole: every block against its record and the file exactly
    /// the object's length. Until then `None`; and when every block is there but not checked
    /// yet, the check starts in the background (once per mount), so a later open passes
    /// through. A block that fails it is dropped and fetched again, as on any read.
    ///
    /// The file returned is the one the index describes: opened, then found still to be that
    /// entry (an eviction renames a file away before anything else could take its name).
    pub async fn passthrough_file(&self, bucket: &str, meta: &ObjectMeta) -> Option<File> {
        let id = Arc::new(Identity::new(bucket, meta)?);
        let name = id.name().to_string();
        let epoch = {
            let mut ix = self.shared.index.lock();
            match ix.whole(&name)? {
                (epoch, index::Verified::Yes) => epoch,
                (epoch, index::Verified::No) => {
                    ix.set_verified(&name, epoch, index::Verified::Running);
                    drop(ix);
                    self.shared.clone().verify_in_background(id, epoch);
                    return None;
                }
                (_, index::Verified::Running) => return None,
            }
        };
        let path = self.shared.path(&name).data;
        let file = platform::blocking(move || path.open(Open::new().read(true)))
            .await
            .ok()?;
        let ix = self.shared.index.lock();
        (ix.whole(&name) == Some((epoch, index::Verified::Yes))).then_some(file)
    }

    /// Waits for queued fills to be written, at most `timeout`; true if they were.
    pub fn flush(&self, timeout: Duration) -> bool {
        self.shared.queue.flush(timeout)
    }

    pub fn stats(&self) -> ReadCacheStats {
        let c = &self.shared.counters;
        let ix = self.shared.index.lock();
        ReadCacheStats {
            hit_bytes: c.hit.load(Ordering::Relaxed),
            miss_bytes: c.miss.load(Ordering::Relaxed),
            written_bytes: c.written.load(Ordering::Relaxed),
            skipped_bytes: c.skipped.load(Ordering::Relaxed),
            corrupt_blocks: c.corrupt.load(Ordering::Relaxed),
            evicted_files: c.evicted.load(Ordering::Relaxed),
            used: ix.used(),
            files: ix.len() as u64,
        }
    }
}

/// Finds the cached generations in `objects` (a data file and its index), adds them to
/// `index` oldest first, and returns anything else there: to delete. That is the files of
/// evictions cut short, temporary names, a data file or an index alone, and the one-file
/// `<hash>.cache` of earlier versions (its index followed its data, which the kernel must not
/// read as the object's).
fn scan(objects: &Arc<Dir>, index: &mut Index) -> std::io::Result<Vec<At>> {
    use std::collections::HashMap;
    let mut halves: HashMap<String, [Option<file::Stat>; 2]> = HashMap::new();
    let mut doomed = Vec::new();
    for name in objects.names()? {
        // A name that is not UTF-8 is none of ours, and none an `At` can hold: left alone.
        let Some(name) = name.to_str() else { continue };
        let at = objects.at(name);
        let Ok(meta) = at.stat() else {
            continue;
        };
        if meta.is_dir {
            continue;
        }
        let half = match name.rsplit_once('.') {
            Some((stem, "data")) if is_cache_name(stem) && meta.is_file => Some((stem, 0)),
            Some((stem, "index")) if is_cache_name(stem) && meta.is_file => Some((stem, 1)),
            _ => None,
        };
        match half {
            Some((stem, i)) => halves.entry(stem.to_string()).or_default()[i] = Some(meta),
            None => doomed.push(at),
        }
    }
    let mut found = Vec::new();
    for (name, [data, idx]) in halves {
        match (data, idx) {
            (Some(d), Some(i)) => found.push((d.modified, name, d.disk_bytes + i.disk_bytes)),
            (Some(_), None) => doomed.push(objects.at(format!("{name}.data"))),
            (None, Some(_)) => doomed.push(objects.at(format!("{name}.index"))),
            (None, None) => {}
        }
    }
    found.sort();
    for (_, name, bytes) in found {
        index.add_unloaded(name, bytes);
    }
    Ok(doomed)
}

impl Shared {
    fn path(&self, name: &str) -> file::Paths {
        file::Paths {
            data: self.objects.at(format!("{name}.data")),
            index: self.objects.at(format!("{name}.index")),
        }
    }

    /// Takes the files of an entry just removed from the index out of their names, so no one
    /// opens them any more; returns where they went, to be deleted once the index lock is
    /// released. Call with the index lock held.
    fn retire(&self, name: &str, epoch: u64) -> Option<file::Paths> {
        let from = self.path(name);
        let to = file::Paths {
            data: self.objects.at(format!("{name}.{epoch}.gone-data")),
            index: self.objects.at(format!("{name}.{epoch}.gone-index")),
        };
        match from.rename_to(&to) {
            Ok(()) => Some(to),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let _ = from.index.remove();
                None
            }
            Err(_) => {
                from.remove();
                None
            }
        }
    }

    /// Removes the entry `name` (whatever its epoch) and deletes its file.
    fn forget(&self, name: &str) {
        let doomed = {
            let mut ix = self.index.lock();
            let doomed = ix.remove(name).and_then(|e| self.retire(name, e.epoch));
            self.publish(&ix);
            doomed
        };
        if let Some(p) = doomed {
            p.remove();
        }
    }

    /// Checks the whole entry `epoch` of `id` on the blocking pool, then records the outcome:
    /// verified, or the blocks that failed dropped (and counted, as on a read).
    fn verify_in_background(self: Arc<Self>, id: Arc<Identity>, epoch: u64) {
        let path = self.path(id.name());
        let for_check = id.clone();
        let check = move || -> std::io::Result<Vec<u64>> {
            let files = path.open_read()?;
            file::verify(&files, &for_check)
        };
        let finish = move |result: std::io::Result<Vec<u64>>| {
            let name = id.name();
            match result {
                Ok(bad) if bad.is_empty() => {
                    self.index
                        .lock()
                        .set_verified(name, epoch, index::Verified::Yes);
                }
                Ok(bad) => {
                    // Counted before the check is seen to end.
                    let mut ix = self.index.lock();
                    let dropped = ix.drop_blocks(name, epoch, &bad);
                    if dropped > 0 {
                        self.counters
                            .corrupt
                            .fetch_add(dropped as u64, Ordering::Relaxed);
                        crate::metrics::read_cache_corrupt(dropped as u64);
                    }
                    ix.set_verified(name, epoch, index::Verified::No);
                    drop(ix);
                    if dropped > 0 {
                        tracing::warn!(key = %id.key, generation = id.generation, blocks = ?bad, "read cache blocks failed their CRC32C check; fetching them from the bucket");
                    }
                }
                Err(e) => {
                    self.index
                        .lock()
                        .set_verified(name, epoch, index::Verified::No);
                    if e.kind() != std::io::ErrorKind::NotFound {
                        self.warn_io("cannot check a read cache file", &e);
                    }
                }
            }
        };
        if platform::inline_blocking() {
            finish(check());
            return;
        }
        tokio::spawn(async move {
            let result = platform::blocking(check).await;
            finish(result);
        });
    }

    fn publish(&self, ix: &Index) {
        crate::metrics::read_cache_used(ix.used());
    }

    fn fills_paused(&self) -> bool {
        let mut p = self.paused_until.lock();
        match *p {
            Some(t) if Instant::now() < t => true,
            Some(_) => {
                *p = None;
                false
            }
            None => false,
        }
    }

    fn skipped(&self, bytes: u64) {
        self.counters.skipped.fetch_add(bytes, Ordering::Relaxed);
        crate::metrics::read_cache_skipped(bytes);
    }

    fn written(&self, bytes: u64) {
        self.counters.written.fetch_add(bytes, Ordering::Relaxed);
    }

    fn evicted(&self, files: u64) {
        if files > 0 {
            self.counters.evicted.fetch_add(files, Ordering::Relaxed);
            crate::metrics::read_cache_evicted(files);
        }
    }

    /// A local I/O problem: a warning the first time, then debug lines.
    fn warn_io(&self, what: &str, e: &std::io::Error) {
        if self.warned.swap(true, Ordering::Relaxed) {
            tracing::debug!(error = %e, "{what}");
        } else {
            tracing::warn!(error = %e, "{what}; reads go to the bucket when the cache cannot serve them (further cache errors are logged at debug level)");
        }
    }

    fn write_failed(&self, e: &std::io::Error) {
        if platform::is_disk_full(e) {
            *self.paused_until.lock() = Some(Instant::now() + PAUSE_WHEN_FULL);
            self.warn_io(
                "the read cache disk is full: caching paused for a minute",
                e,
            );
        } else {
            self.warn_io("cannot write the read cache", e);
        }
    }

    /// Queues the whole blocks inside `data` (object bytes from `start`) for writing, if any
    /// of them is missing; never waits.
    fn offer(&self, id: &Arc<Identity>, start: u64, data: &Bytes) {
        let range = start..start + data.len() as u64;
        let blocks = id.inside(&range);
        if blocks.is_empty() || !self.index.lock().wants(id.name(), blocks.clone()) {
            return;
        }
        let from = (id.block_range(blocks.start).start - start) as usize;
        let to = (id.block_range(blocks.end - 1).end - start) as usize;
        let len = (to - from) as u64;
        if self.fills_paused() {
            self.skipped(len);
            return;
        }
        let job = fill::Job {
            id: id.clone(),
            first: blocks.start,
            data: data.slice(from..to),
        };
        if !self.queue.offer(job) {
            self.skipped(len);
        }
    }

    /// `blocks` of `id` from disk, each checked; `None` when any is not there or fails.
    async fn read_disk(self: &Arc<Self>, id: &Arc<Identity>, blocks: Range<u64>) -> Option<Bytes> {
        let name = id.name();
        let epoch = match self.index.lock().plan(name, blocks.clone()) {
            Plan::Hit { epoch } => epoch,
            Plan::Miss => return None,
        };
        let path = self.path(name);
        let (for_read, wanted) = (id.clone(), blocks.clone());
        #[cfg(test)]
        let me = self.clone();
        let result = platform::blocking(move || {
            #[cfg(test)]
            me.hook(0);
            let f = path.open_read()?;
            #[cfg(test)]
            me.hook(1);
            file::read_blocks(&f, &for_read, wanted)
        })
        .await;
        match result {
            Ok(Ok(data)) => Some(data),
            Ok(Err(bad)) => {
                let dropped = self.index.lock().drop_blocks(name, epoch, &bad);
                if dropped > 0 {
                    // Still the entry that was checked: its bytes on disk are wrong.
                    tracing::warn!(
                        key = %id.key,
                        generation = id.generation,
                        blocks = ?bad,
                        "read cache block failed its CRC32C check; fetching it from the bucket"
                    );
                    self.counters
                        .corrupt
                        .fetch_add(dropped as u64, Ordering::Relaxed);
                    crate::metrics::read_cache_corrupt(dropped as u64);
                }
                None
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // Evicted since the plan, or one of its files deleted behind our back: the
                // other goes too (moved away first, so nothing recreates it under the kernel).
                let doomed = {
                    let mut ix = self.index.lock();
                    let doomed = match ix.entry(name).is_some_and(|e| e.epoch == epoch) {
                        true => {
                            ix.remove(name);
                            self.retire(name, epoch)
                        }
                        false => None,
                    };
                    self.publish(&ix);
                    doomed
                };
                if let Some(p) = doomed {
                    p.remove();
                }
                None
            }
            Err(e) => {
                self.warn_io("cannot read the read cache", &e);
                None
            }
        }
    }

    #[cfg(test)]
    fn hook(&self, which: usize) {
        let h = {
            let hooks = self.hooks.lock();
            if which == 0 {
                hooks.0.clone()
            } else {
                hooks.1.clone()
            }
        };
        if let Some(h) = h {
            h(self);
        }
    }
}

/// One object generation's view of the cache, held by the reader of an open handle.
#[derive(Clone)]
pub struct ObjectCache {
    shared: Arc<Shared>,
    id: Arc<Identity>,
}

impl std::fmt::Debug for ObjectCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectCache")
            .field("key", &self.id.key)
            .field("generation", &self.id.generation)
            .finish()
    }
}

impl ObjectCache {
    /// Bytes `range` of the object: from disk if every block is there and checks out, else
    /// from the bucket (and then offered to the cache).
    pub async fn read<S: ObjectStore + ?Sized>(
        &self,
        store: &S,
        range: Range<u64>,
        crc: bool,
    ) -> StoreResult<(Bytes, Option<u32>)> {
        let id = &self.id;
        let len = range.end.saturating_sub(range.start);
        if len > 0 && range.end <= id.size {
            let blocks = id.covering(&range);
            if let Some(data) = self.shared.read_disk(id, blocks.clone()).await {
                let base = id.block_range(blocks.start).start;
                self.shared.counters.hit.fetch_add(len, Ordering::Relaxed);
                crate::metrics::read_cache_hit(len);
                let data = data.slice((range.start - base) as usize..(range.end - base) as usize);
                return Ok((data, None));
            }
        }
        let (data, crc) =
            crate::store::read_range_crc(store, &id.key, id.generation, range.clone(), crc).await?;
        self.shared.counters.miss.fetch_add(len, Ordering::Relaxed);
        crate::metrics::read_cache_miss(len);
        if range.end <= id.size {
            self.shared.offer(id, range.start, &data);
        }
        Ok((data, crc))
    }

    /// Discards this object's cache file: a whole read of it did not match the object's
    /// CRC32C, so what the cache holds must not be trusted.
    pub fn forget(&self) {
        tracing::warn!(key = %self.id.key, generation = self.id.generation, "discarding the object's read cache file");
        self.shared.forget(self.id.name());
    }
}

/// The read path's one way to fetch a range: through the cache when there is one, else
/// straight from the bucket ([`crate::store::read_range_crc`]). With `crc`, the bytes come
/// with their CRC32C when it was computed as they arrived from the bucket; bytes read back
/// from the cache's disk come without it.
pub async fn read_range<S: ObjectStore + ?Sized>(
    store: &S,
    cache: Option<&ObjectCache>,
    key: &str,
    generation: i64,
    range: Range<u64>,
    crc: bool,
) -> StoreResult<(Bytes, Option<u32>)> {
    match cache {
        Some(c) => c.read(store, range, crc).await,
        None => crate::store::read_range_crc(store, key, generation, range, crc).await,
    }
}
