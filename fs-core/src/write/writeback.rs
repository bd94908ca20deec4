//! The write-back engine of one mount: the items of the files being written, and the calls
//! the facade makes on them.
//!
//! - [`super::item`] holds one file's state machine (working copy, pending version, life).
//! - [`super::working_copy`] is a file's I/O: reads, writes, truncates, copy-on-write, and
//!   the space they are charged; [`super::seal`] turns a working copy into an acknowledged
//!   version at close, fsync and the last release.
//! - [`super::scheduler`] decides when an upload may start; [`super::uploader`] runs them.
//! - [`super::space`] holds staged bytes under `--cache-size`; [`super::status`] counts.
//! - [`super::replay`] rebuilds items from the journal at start-up and clears leftovers.
//! - [`super::name_changes`] is what deletes and renames do to items, and the pause that keeps
//!   uploads out of their way (I3, I8).
//!
//! Locks: `by_key` (a short synchronous lock on the name → item map, never held across an
//! await) and one async lock per item, held while its files change and across local disk
//! work, never across a bucket request. Bytes a file lacks are fetched with its lock released
//! and stored only where the file still has holes, so a fetch never undoes a write.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::cache_dir::CacheDir;
use super::commit::Commits;
use super::item::{Item, Life, Shared, Version};
use super::journal::Journal;
use super::ranges::RangeSet;
use super::scheduler::Sched;
use super::space::Space;
use super::staging::StagingFile;
use super::staging_pool::StagingPool;
use super::upload::UploadConfig;
use crate::buffer_pool::BufferPool;
use crate::error::FsResult;
use crate::namespace::SettleHook;
use crate::store::{ObjectMeta, ObjectStore, MTIME_KEY, MTIME_PRECISE_KEY};

pub use super::item::{ItemRef, LocalAttr};
pub use super::space::SPACE_WAIT_LIMIT;
pub use super::status::{Counters, Status};

/// Write-path settings.
#[derive(Debug, Clone)]
pub struct WriteConfig {
    pub cache_dir: PathBuf,
    /// `cache_dir` is a directory the user named that holds an earlier version's layout: it
    /// is used as it is and its mode left alone (see [`super::cache_dir`]).
    pub legacy_cache_dir: bool,
    pub write_back_delay: Duration,
    pub upload_on_close: bool,
    pub upload: UploadConfig,
    /// Files uploading at once.
    pub files_concurrency: usize,
    /// First retry delay after a failed upload; it doubles up to `retry_max`.
    pub retry_initial: Duration,
    pub retry_max: Duration,
    /// Bound on staged bytes (`--cache-size`); None: only the disk bounds it.
    pub cache_size: Option<u64>,
    /// How long a closed version may wait for its commit (`--commit-interval`, see
    /// [`super::commit`]).
    pub commit_interval: Duration,
    /// Every `close()` waits for the commit (`--sync-on-close`).
    pub sync_on_close: bool,
}

impl WriteConfig {
    pub fn new(cache_dir: PathBuf) -> Self {
        WriteConfig {
            cache_dir,
            legacy_cache_dir: false,
            write_back_delay: Duration::from_secs(1),
            upload_on_close: false,
            upload: UploadConfig::default(),
            files_concurrency: 32,
            retry_initial: Duration::from_secs(1),
            retry_max: Duration::from_secs(60),
            cache_size: None,
            commit_interval: Duration::from_secs(1),
            sync_on_close: false,
        }
    }
}

/// How long an unmount waits for the removal of temporary parts once everything is uploaded.
const CLEANUP_PATIENCE: Duration = Duration::from_secs(10);

/// Listing rounds a sweep of temporary parts makes before it leaves them to the next mount.
const SWEEP_ROUNDS: u32 = 12;
/// At most this long between a finished upload forgetting its record and that being durable.
const FORGET_FLUSH_DELAY: Duration = Duration::from_secs(1);

/// The write-back engine of one mount.
pub struct WriteBack<S: ObjectStore> {
    pub(super) store: Arc<S>,
    pub(super) cfg: WriteConfig,
    pub(super) dir: CacheDir,
    pub(super) journal: Arc<Journal>,
    /// Live items by object key (ordered, so prefix scans and iteration are deterministic).
    pub(super) by_key: parking_lot::Mutex<BTreeMap<String, Arc<Shared>>>,
    next_id: Arc<AtomicU64>,
    /// Empty staging files with durable names, for new items and copies.
    pool: StagingPool,
    /// A journal sync for forgotten records is due ([`Self::flush_forgotten_soon`]).
    flush_scheduled: Arc<std::sync::atomic::AtomicBool>,
    pub(super) slots: Arc<Semaphore>,
    pub counters: Counters,
    pub(super) on_settled: SettleHook,
    pub(super) space: Space,
    /// Signalled at the end of every upload attempt and cleanup, for drains.
    pub(super) settled: Arc<tokio::sync::Notify>,
    /// Deletions of superseded parts still running; a drain waits for them.
    pub(super) cleanups: Arc<AtomicU64>,
    /// Names (and directory prefixes) a namespace change is working on: no upload under them
    /// starts, whichever item holds them, including one made after the pause began.
    pub(super) paused_keys: parking_lot::Mutex<Vec<(String, bool)>>,
    /// Closed versions not yet durable against a power cut ([`super::commit`]).
    pub(super) commits: Arc<Commits>,
    /// Staging files the kernel wrote itself ([`super::passthrough`]): deleted when let go,
    /// never reused, as a mapping of one may still be written.
    pub(super) in_place: parking_lot::Mutex<std::collections::HashSet<u64>>,
    /// Staging files whose write-back the disk failed ([`super::disk_errors`]).
    pub(super) disk_errors: super::disk_errors::DiskErrors,
    /// The cache disk's free space as the kernel's writes meet it ([`super::passthrough`]).
    pub(super) kernel_room: Arc<super::passthrough::KernelRoom>,
    /// The cache disk's free space while files pass through ([`super::space_watch`]).
    pub(super) space_watch: super::space_watch::SpaceWatch,
    /// The watch's look before the mount frees space on the cache disk, registered while
    /// this lives.
    _free_look: Arc<crate::platform::FreeLook>,
    /// The mount's device as `/proc/<pid>/maps` names it, once the adapter told it: how a
    /// mapping of a file the kernel writes itself is recognised.
    pub(super) kernel_dev: parking_lot::Mutex<Option<String>>,
    /// What uploads read their parts into, kept from one part to the next.
    pub(super) part_buffers: Arc<BufferPool>,
    /// What big write requests are copied into out of the adapter's buffer.
    pub(super) request_buffers: Arc<BufferPool>,
    /// Tests: where a mapping's watch waits between finding a change and saving it.
    #[cfg(test)]
    pub(crate) mapped_save_gate: parking_lot::Mutex<Option<Arc<tokio::sync::Barrier>>>,
    /// Tests: the kernel is not asked for a lease (as on a file system without leases), so a
    /// mapping is looked for in `/proc/<pid>/maps`.
    #[cfg(test)]
    pub(crate) no_leases: std::sync::atomic::AtomicBool,
}

/// Free memory kept for write requests: half of what the kernel may have in flight (64
/// background requests of up to 1 MiB).
const REQUEST_BUFFERS: usize = 32 << 20;

/// Requests shorter than this are copied into fresh memory: small allocations come from the
/// allocator's free lists without a fault, and would crowd the pool's list.
pub const POOLED_REQUEST: usize = 64 << 10;

impl<S: ObjectStore> WriteBack<S> {
    /// Opens the cache directory (locking it) and the journal. `on_settled` is told when a key's
    /// content in the bucket changed (with the new object) or may have (with `None`).
    pub fn new(
        store: Arc<S>,
        cfg: WriteConfig,
        on_settled: SettleHook,
    ) -> Result<Arc<Self>, String> {
        let dir = CacheDir::open_at(&cfg.cache_dir, cfg.legacy_cache_dir)?;
        let cfg_commit_interval = cfg.commit_interval;
        let journal = Journal::open_in(dir.journal_dir().clone())
            .map_err(|e| format!("cannot open the journal: {e}"))?;
        let staged = dir
            .staging_ids()
            .map_err(|e| format!("cannot read the staging directory: {e}"))?
            .0;
        let next = journal
            .next_id()
            .map_err(|e| format!("cannot read the journal: {e}"))?
            .max(staged.last().map_or(1, |id| id + 1));
        let next_id = Arc::new(AtomicU64::new(next));
        let journal = Arc::new(journal);
        let barrier = journal.clone();
        let pool = StagingPool::new(
            dir.staging_dir().clone(),
            next_id.clone(),
            Box::new(move |ids: &[u64]| {
                // Asked before the sync: a retired id is never named again, so one not named
                // now had its removal appended already, and the sync makes that durable.
                // (Asked after, a removal appended during the sync would pass unsynced.)
                let named = ids.iter().map(|id| barrier.names(*id)).collect();
                barrier.sync_now()?;
                Ok(named)
            }),
        );
        // One upload's parts in flight: what an upload holds anyway while it runs.
        let up = &cfg.upload;
        let buffers =
            (up.concurrency.max(1) as u64).saturating_mul(up.part_size.max(up.chunk_size));
        let part_buffers = BufferPool::new(buffers.min(512 << 20) as usize);
        let space_watch = super::space_watch::SpaceWatch::default();
        let kernel_room = super::passthrough::KernelRoom::new(dir.staging_dir());
        let free_look = super::passthrough::look_before_freeing(&kernel_room, &space_watch);
        Ok(Arc::new(WriteBack {
            part_buffers,
            request_buffers: BufferPool::new(REQUEST_BUFFERS),
            slots: Arc::new(Semaphore::new(cfg.files_concurrency.max(1))),
            space: Space::new(cfg.cache_size),
            store,
            cfg,
            dir,
            journal,
            by_key: parking_lot::Mutex::new(BTreeMap::new()),
            next_id,
            pool,
            flush_scheduled: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            counters: Counters::default(),
            on_settled,
            settled: Arc::new(tokio::sync::Notify::new()),
            cleanups: Arc::new(AtomicU64::new(0)),
            paused_keys: parking_lot::Mutex::new(Vec::new()),
            commits: Commits::new(cfg_commit_interval),
            in_place: parking_lot::Mutex::new(std::collections::HashSet::new()),
            disk_errors: Default::default(),
            kernel_room,
            space_watch,
            _free_look: free_look,
            kernel_dev: parking_lot::Mutex::new(None),
            #[cfg(test)]
            mapped_save_gate: parking_lot::Mutex::new(None),
            #[cfg(test)]
            no_leases: Default::default(),
        }))
    }

    /// The bytes of a write request, copied out of a buffer the caller reuses so that the
    /// write can run later; big ones into memory used again ([`BufferPool`]).
    pub fn request_bytes(&self, data: &[u8]) -> bytes::Bytes {
        if data.len() >= POOLED_REQUEST {
            self.request_buffers.copy_of(data)
        } else {
            bytes::Bytes::copy_from_slice(data)
        }
    }

    pub fn config(&self) -> &WriteConfig {
        &self.cfg
    }

    /// The cache directory's tag: the same across restarts, so what this mount wrote is still
    /// recognised as its own after a crash.
    pub fn tag(&self) -> &str {
        self.dir.tag()
    }

    pub(super) fn new_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::SeqCst)
    }

    pub(super) fn bump_next_id(&self, past: u64) {
        self.next_id.fetch_max(past + 1, Ordering::SeqCst);
    }

    /// Starts making staging files ahead of need; called once start-up recovery has removed
    /// the files no record names.
    pub fn start_pool(&self) {
        self.pool.start();
    }

    /// A staging file for a new working copy: `(id, file, whether its name is durable)`. One
    /// from the pool if there is one (its name already durable), else a new one.
    pub(super) async fn new_staging(
        &self,
        size: u64,
        present: RangeSet,
    ) -> FsResult<(u64, StagingFile, bool)> {
        if let Some(id) = self.pool.take() {
            let at = self.dir.staging(id);
            let p = present.clone();
            match crate::platform::blocking(move || StagingFile::open_pooled(&at, size, p)).await {
                Ok(work) => return Ok((id, work, true)),
                Err(e) => {
                    tracing::debug!(id, error = %e, "a pooled staging file could not be opened")
                }
            }
        }
        let id = self.new_id();
        let work = platform_create(self.dir.staging(id), size, present).await?;
        Ok((id, work, false))
    }

    pub(super) fn live(&self, key: &str) -> Option<Arc<Shared>> {
        self.by_key.lock().get(key).cloned()
    }

    /// Opens `key` for writing. `base` is the bucket object it starts from (None for a new
    /// file); with `truncate` its old bytes are not needed. A live item of `key` is used if
    /// there is one (then `base` is not consulted).
    pub async fn open(
        self: &Arc<Self>,
        key: &str,
        base: Option<&ObjectMeta>,
        truncate: bool,
    ) -> FsResult<ItemRef> {
        loop {
            if let Some(item) = self.open_existing(key).await {
                if truncate {
                    let mut it = item.0.item.lock().await;
                    if it.work.size() > 0 || it.held.is_some() {
                        if let Err(e) = self.truncate_locked(&item.0, &mut it, 0).await {
                            drop(it);
                            self.release(&item).await;
                            return Err(e);
                        }
                    }
                }
                return Ok(item);
            }
            let (size, present) = match (base, truncate) {
                (Some(m), false) => (m.size, RangeSet::new()),
                _ => (0, RangeSet::new()),
            };
            let (id, work, named) = self.new_staging(size, present).await?;
            let new_or_truncated = base.is_none() || (truncate && base.is_some_and(|m| m.size > 0));
            let item = Item {
                key: key.to_string(),
                base: base.map(|m| (m.key.clone(), m.generation)),
                work_id: id,
                work,
                work_named: named,
                forgotten_unsynced: false,
                mtime: base
                    .map(ObjectMeta::mtime)
                    .unwrap_or_else(crate::clock::now),
                metadata: base
                    .map(|m| {
                        let mut md = m.metadata.clone();
                        // The upload writes the item's own time.
                        md.remove(MTIME_KEY);
                        md.remove(MTIME_PRECISE_KEY);
                        md
                    })
                    .unwrap_or_default(),
                // A new or truncated file is a change even if nothing is written to it.
                edits: u64::from(new_or_truncated),
                committed: 0,
                pending: None,
                next_seq: 1,
                maybe_landed: Vec::new(),
                handles: 1,
                life: Life::Live,
                sched: Sched::default(),
                held: None,
                close_failed: false,
                unsaved_record: None,
                unsaved_file: None,
                superseded_uncommitted: Vec::new(),
                through: None,
                work_live: false,
                kernel_openers: Vec::new(),
                kernel_ino: None,
                mapped: false,
                look_unsaved: false,
                kernel_seen: None,
                kept_landed: None,
                parts_files: Vec::new(),
            };
            let shared = Shared::new(item);
            {
                let mut map = self.by_key.lock();
                if !map.contains_key(key) {
                    map.insert(key.to_string(), shared.clone());
                    return Ok(ItemRef(shared));
                }
            }
            // Another open made an item for this name meanwhile (or a rename is swapping the
            // name's item): use that one once it is in place.
            self.recycle(id);
            tokio::task::yield_now().await;
        }
    }

    /// Takes a handle on the live item of `key`, if there is one. An item that retired (its
    /// upload finished and nobody held it) is not revived: the file is then what the bucket
    /// has, and must be opened from there. Costs no bucket request.
    pub async fn open_existing(&self, key: &str) -> Option<ItemRef> {
        let shared = self.live(key)?;
        let mut it = shared.item.lock().await;
        if it.life != Life::Live {
            return None;
        }
        it.handles += 1;
        shared.open.store(it.handles, Ordering::SeqCst);
        drop(it);
        Some(ItemRef(shared))
    }

    pub fn item(&self, key: &str) -> Option<ItemRef> {
        self.live(key).map(ItemRef)
    }

    /// Size and mtime of `key` if it is being written. Takes no file lock.
    pub fn local_attr(&self, key: &str) -> Option<LocalAttr> {
        self.live(key).map(|s| s.current_attr())
    }

    /// Keys being written directly under `prefix` (a directory), as names with their
    /// attributes.
    pub fn local_children(&self, prefix: &str) -> Vec<(String, LocalAttr)> {
        self.local_under(prefix)
            .into_iter()
            .filter_map(|(k, a)| {
                let name = &k[prefix.len()..];
                (!name.is_empty() && !name.contains('/')).then(|| (name.to_string(), a))
            })
            .collect()
    }

    /// Keys being written at any depth under `prefix`. Takes no file lock.
    pub fn local_under(&self, prefix: &str) -> Vec<(String, LocalAttr)> {
        self.by_key
            .lock()
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, s)| (k.clone(), s.current_attr()))
            .collect()
    }

    /// Whether any key under `prefix` is being written.
    pub fn has_local_under(&self, prefix: &str) -> bool {
        self.by_key
            .lock()
            .range(prefix.to_string()..)
            .next()
            .is_some_and(|(k, _)| k.starts_with(prefix))
    }

    /// Makes the next `n` journal appends fail as on a full disk (tests only).
    #[cfg(test)]
    pub fn fail_journal_appends(&self, n: u32) {
        self.journal.fail_appends(n);
    }

    /// The mount's device (`major`, `minor`): the adapter tells it once mounted.
    pub fn set_kernel_device(&self, major: u64, minor: u64) {
        *self.kernel_dev.lock() = Some(crate::platform::maps_device(major, minor));
    }

    /// Makes the cache disk look as if it had `free` bytes left (`None`: as it has), for what
    /// the kernel writes itself ([`super::passthrough`]) (tests only).
    #[cfg(test)]
    pub fn pretend_free_bytes(&self, free: Option<u64>) {
        self.kernel_room.pretend(free);
    }

    /// The held staging directory (tests only).
    #[cfg(test)]
    pub fn staging_dir(&self) -> &Arc<crate::platform::Dir> {
        self.dir.staging_dir()
    }

    /// Makes the next `n` journal syncs fail (tests only).
    #[cfg(test)]
    pub fn fail_journal_syncs(&self, n: u32) {
        self.journal.fail_syncs(n);
    }

    /// Hands staging file `id`, which no item uses any more, to the pool: reused (or deleted)
    /// once no durable journal record names it.
    pub(super) fn recycle(&self, id: u64) {
        let failed = self.disk_errors.forget(id);
        if self.in_place.lock().remove(&id) || failed {
            self.pool.remove(id);
        } else {
            self.pool.recycle(id);
        }
    }

    /// Makes every journal change so far durable. A namespace change calls it before it
    /// touches the bucket: a record forgotten without a sync
    /// ([`Journal::forget`](super::journal::Journal::forget)) must not come back after a power
    /// loss and upload the file again under a name just deleted or renamed away.
    ///
    /// It commits (see [`super::commit`]): a name changed in the journal must not come back
    /// after a power cut pointing at a version whose bytes were lost, with the version it
    /// replaced still under the old name.
    pub async fn settle_journal(&self) -> FsResult<()> {
        Ok(self.commit_now().await?)
    }

    /// Makes a forgotten record durable within a second, so its window stays short even when
    /// nothing else syncs the journal (another client may change the object meanwhile, and a
    /// replayed record would then make a needless conflict copy). One timer at a time.
    pub(super) fn flush_forgotten_soon(&self) {
        if self.flush_scheduled.swap(true, Ordering::SeqCst) {
            return;
        }
        let (journal, scheduled) = (self.journal.clone(), self.flush_scheduled.clone());
        tokio::spawn(async move {
            tokio::time::sleep(FORGET_FLUSH_DELAY).await;
            scheduled.store(false, Ordering::SeqCst);
            if let Err(e) = journal.flush().await {
                tracing::warn!(error = %e, "could not sync the journal");
            }
        });
    }

    /// Drops a version that will never be uploaded: its staging file (callers make sure it is
    /// not the working copy's) and its temporary parts.
    pub(super) fn discard(&self, v: &Version) {
        if v.size >= self.cfg.upload.single_shot_threshold {
            // The file is done with: the parts of every version it held go.
            self.sweep_parts(v.id, None);
        }
        let _ = self.dir.staging(v.id).remove();
        self.disk_errors.forget(v.id);
    }

    /// Where version `id`'s temporary parts go: under this cache directory's tag, so no other
    /// mount mistakes them for its own leftovers, and under the version, so one listing finds
    /// them all (parts whose answer was lost included).
    ///
    /// With `seq`, one version's parts (`<tag>/<id>/<seq>/`); without, every version's that
    /// shared the staging file `id`.
    pub(super) fn parts_prefix(&self, id: u64, seq: Option<u64>) -> String {
        let file = format!(
            "{}{}/{id:016x}/",
            self.cfg.upload.temp_prefix,
            self.dir.tag()
        );
        match seq {
            Some(seq) => format!("{file}{seq}/"),
            None => file,
        }
    }

    /// Staging file `id` of `it` is done with: the parts of every version it held are swept,
    /// if any may be left (a version of `size` goes up in parts; a smaller one may follow one
    /// that did, [`Item::parts_files`]).
    pub(super) fn sweep_file_parts(&self, it: &mut Item, id: u64, size: u64) {
        if it.unlist_parts_file(id) || size >= self.cfg.upload.single_shot_threshold {
            self.sweep_parts(id, None);
        }
    }

    /// Sweeps every staging file `it` uploaded from in parts (it goes).
    pub(super) fn sweep_listed_parts(&self, it: &mut Item) {
        for f in std::mem::take(&mut it.parts_files) {
            self.sweep_parts(f, None);
        }
    }

    /// Deletes every temporary object of version `id`, in the background, listing its prefix
    /// again until it is empty (a delete can fail too). A drain waits for it; what still fails
    /// after a few rounds is removed at the next mount.
    pub(super) fn sweep_parts(&self, id: u64, seq: Option<u64>) {
        self.cleanups.fetch_add(1, Ordering::SeqCst);
        let (store, cleanups, settled) = (
            self.store.clone(),
            self.cleanups.clone(),
            self.settled.clone(),
        );
        let prefix = self.parts_prefix(id, seq);
        let concurrency = self.cfg.upload.concurrency;
        tokio::spawn(async move {
            let mut wait = Duration::from_millis(100);
            for round in 0..SWEEP_ROUNDS {
                let req = crate::store::ListRequest {
                    prefix: prefix.clone(),
                    delimiter: None,
                    page_token: None,
                    max_results: Some(1000),
                };
                match store.list(&req).await {
                    Ok(page) if page.objects.is_empty() => break,
                    Ok(page) => {
                        let keys = page.objects.into_iter().map(|o| o.key).collect();
                        super::upload::delete_all(store.as_ref(), keys, concurrency).await;
                        continue;
                    }
                    Err(e) if round + 1 == SWEEP_ROUNDS => {
                        tracing::warn!(prefix, error = %e, "could not clean up temporary parts; they will be removed at the next mount");
                    }
                    Err(_) => {}
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(10));
            }
            cleanups.fetch_sub(1, Ordering::SeqCst);
            settled.notify_waiters();
        });
    }

    /// The cache is full: files already closed upload now, whatever their write-back delay.
    pub(super) fn upload_closed_now(&self) {
        let items: Vec<Arc<Shared>> = self.by_key.lock().values().cloned().collect();
        for shared in items {
            if shared.open.load(Ordering::SeqCst) > 0 {
                continue;
            }
            // A busy item is being uploaded or changed already; never wait for it here.
            if let Ok(mut it) = shared.item.try_lock() {
                if it.pending.is_some() && it.sched.expedite() {
                    shared.wake.notify_one();
                }
            }
        }
    }

    /// Waits until every acknowledged version is in the bucket (or, with
    /// `give_up_on_failure`, until everything left has failed at least once). Write-back
    /// delays are skipped; backoff is not. Returns the number of files still pending.
    pub async fn drain(self: &Arc<Self>, give_up_on_failure: bool) -> usize {
        let started = tokio::time::Instant::now();
        loop {
            let settled = self.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            let items: Vec<Arc<Shared>> = self.by_key.lock().values().cloned().collect();
            let mut pending = 0;
            let mut failed = 0;
            for shared in &items {
                // A file still mapped may have changed since its watch last looked, which
                // may not look again before the mount goes.
                if shared.item.lock().await.mapped {
                    self.look_at_mapped(shared).await;
                }
                let mut it = shared.item.lock().await;
                if it.life == Life::Live && it.pending.is_some() {
                    pending += 1;
                    // A version without its CRC32C and no handle left to seal it cannot be
                    // uploaded (its keeping as not saved failed too): as good as failed.
                    let unsealed = it.handles == 0
                        && it.through.is_none()
                        && it.pending.as_ref().is_some_and(|p| p.crc_pending);
                    if it.sched.failures > 0 || unsealed {
                        failed += 1;
                    }
                    if it.sched.expedite() {
                        shared.wake.notify_one();
                    }
                    self.ensure_task(shared, &mut it);
                }
            }
            // Leftover parts are waited for; an unmount that gives up on failures waits for
            // them only a little (a cleanup backing off from a dead bucket could take minutes,
            // and the next mount removes what is left).
            let cleaning = self.cleanups.load(Ordering::SeqCst) > 0
                && !(give_up_on_failure && started.elapsed() > CLEANUP_PATIENCE);
            if (pending == 0 && !cleaning)
                || (give_up_on_failure && failed == pending && pending > 0)
            {
                // Records forgotten without a sync, and closes not yet committed: durable
                // before the mount goes.
                if let Err(e) = self.commit_now().await {
                    tracing::warn!(error = %e, "could not sync the journal; finished uploads may be retried at the next mount");
                }
                // The commit let go of superseded versions: their parts' cleanup is waited
                // for like any other.
                let cleaning = (self.cleanups.load(Ordering::SeqCst) > 0
                    || !self.commits.leftover.lock().is_empty())
                    && !(give_up_on_failure && started.elapsed() > CLEANUP_PATIENCE);
                if !cleaning {
                    return pending;
                }
            }
            let _ = tokio::time::timeout(Duration::from_secs(1), settled).await;
        }
    }

    /// Counters and pending work, for `status`.
    pub async fn status(&self) -> Status {
        let items: Vec<Arc<Shared>> = self.by_key.lock().values().cloned().collect();
        let mut s = self.counters.status();
        for shared in items {
            let it = shared.item.lock().await;
            if it.life != Life::Live {
                continue;
            }
            let not_saved = it.not_saved();
            if not_saved {
                s.held_files += 1;
                s.held_bytes += it.work.size();
            }
            if it.pending.is_some() || (it.dirty() && !not_saved) {
                s.pending_files += 1;
                s.pending_bytes += it.work.size();
                if it.dirty() && !not_saved {
                    s.unsaved_files += 1;
                } else if it.sched.failures > 0 {
                    s.failed_files += 1;
                }
            }
        }
        s
    }
}

/// A content type guessed from the key's extension.
pub fn content_type(key: &str) -> String {
    mime_guess::from_path(key)
        .first_or_octet_stream()
        .essence_str()
        .to_string()
}

/// Creates a staging file on the blocking pool.
async fn platform_create(
    at: crate::platform::At,
    size: u64,
    present: RangeSet,
) -> std::io::Result<StagingFile> {
    crate::platform::blocking(move || StagingFile::create(&at, size, present)).await
}
