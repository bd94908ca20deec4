//! The write-back engine of one mount: the items of the files being written, and the calls
//! the facade makes on them.
//!
//! - [`super::item`] holds one file's state machine (working copy, pending version, life).
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
use std::time::{Duration, SystemTime};

use tokio::sync::Semaphore;

use super::cache_dir::CacheDir;
use super::item::{Item, Life, Shared, Version};
use super::journal::{Change, Journal, UploadState};
use super::ranges::RangeSet;
use super::scheduler::Sched;
use super::space::Space;
use super::staging::{self, StagingFile};
use super::staging_pool::StagingPool;
use super::upload::UploadConfig;
use crate::error::{FsError, FsResult};
use crate::namespace::SettleHook;
use crate::store::{read_range, ObjectMeta, ObjectStore, Posix, MTIME_KEY, MTIME_PRECISE_KEY};

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
        }
    }
}

/// How long an unmount waits for the removal of temporary parts once everything is uploaded.
const CLEANUP_PATIENCE: Duration = Duration::from_secs(10);

/// Listing rounds a sweep of temporary parts makes before it leaves them to the next mount.
const SWEEP_ROUNDS: u32 = 12;
/// At most this long between a finished upload forgetting its record and that being durable.
const FORGET_FLUSH_DELAY: Duration = Duration::from_secs(1);

/// Bytes fetched from the bucket per step when completing a file (the file's lock is released
/// between steps).
const FETCH_STEP: u64 = 8 << 20;

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
}

impl<S: ObjectStore> WriteBack<S> {
    /// Opens the cache directory (locking it) and the journal. `on_settled` is told when a key's
    /// content in the bucket changed (with the new object) or may have (with `None`).
    pub fn new(
        store: Arc<S>,
        cfg: WriteConfig,
        on_settled: SettleHook,
    ) -> Result<Arc<Self>, String> {
        let dir = CacheDir::open_at(&cfg.cache_dir, cfg.legacy_cache_dir)?;
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
        Ok(Arc::new(WriteBack {
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
        }))
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

    pub(super) fn peek_next_id(&self) -> u64 {
        self.next_id.load(Ordering::SeqCst)
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
    async fn new_staging(
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
        self.live(key).map(|s| *s.attr.lock())
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
            .map(|(k, s)| (k.clone(), *s.attr.lock()))
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

    /// Reads from the working copy, fetching from the bucket the bytes it does not have yet
    /// (with the file's lock released while they come).
    pub async fn read(&self, item: &ItemRef, offset: u64, len: u32) -> FsResult<Vec<u8>> {
        let want = offset..offset + u64::from(len);
        loop {
            let mut it = item.0.item.lock().await;
            let missing = it.work.missing(want.clone());
            if missing.is_empty() {
                return Ok(it.work.read_at(offset, len as usize)?);
            }
            self.fill_holes(&item.0, it, missing).await?;
        }
    }

    /// Fetches `missing` ranges (at most [`FETCH_STEP`] bytes of them) without holding the
    /// file's lock, then stores them where the file still has holes.
    async fn fill_holes(
        &self,
        shared: &Shared,
        it: tokio::sync::MutexGuard<'_, Item>,
        missing: Vec<std::ops::Range<u64>>,
    ) -> FsResult<()> {
        let Some((base_key, generation)) = it.base.clone() else {
            return Err(FsError::Io(
                "staging file has holes but no base object".into(),
            ));
        };
        let work_id = it.work_id;
        drop(it);
        let mut fetched = Vec::new();
        let mut budget = FETCH_STEP;
        for gap in missing {
            let end = gap.end.min(gap.start + budget);
            let data = read_range(self.store.as_ref(), &base_key, generation, gap.start..end)
                .await
                .map_err(FsError::from_pinned_read)?;
            budget -= end - gap.start;
            fetched.push((gap.start, data));
            if budget == 0 {
                break;
            }
        }
        let mut it = shared.item.lock().await;
        if it.work_id == work_id {
            for (offset, data) in fetched {
                it.work.fill(offset, &data)?;
            }
        }
        Ok(())
    }

    /// Charges the item for `work_size` bytes of working copy (plus a version kept apart).
    async fn reserve(&self, shared: &Shared, it: &Item, work_size: u64) -> FsResult<()> {
        self.reserve_bytes(shared, it.staged_bytes(work_size)).await
    }

    /// Charges the item for `size` staged bytes in all, waiting for space if need be.
    async fn reserve_bytes(&self, shared: &Shared, size: u64) -> FsResult<()> {
        let open_bytes = || {
            self.by_key
                .lock()
                .values()
                .filter(|s| s.open.load(Ordering::SeqCst) > 0)
                .map(|s| s.charged.load(Ordering::SeqCst))
                .sum::<u64>()
        };
        self.space
            .reserve(
                &shared.charged,
                shared.open.load(Ordering::SeqCst) > 0,
                size,
                open_bytes,
                || self.upload_closed_now(),
            )
            .await
    }

    /// Gives back the space the item no longer uses.
    pub(super) fn recharge(&self, shared: &Shared, it: &Item) {
        let size = if it.life == Life::Retired {
            0
        } else {
            it.staged_bytes(it.work.size())
        };
        self.space.recharge(&shared.charged, size);
    }

    /// Lets go of the staging file an unsaved record named, once no record names it (through
    /// the pool: it stays until the record's removal is durable). The working copy's own file
    /// is kept.
    pub(super) fn drop_unsaved_file(&self, it: &mut Item) {
        if let Some(f) = it.unsaved_file.take() {
            if f != it.work_id && it.pending.as_ref().is_none_or(|p| p.id != f) {
                self.recycle(f);
            }
        }
    }

    /// The working copy is about to change while the unsaved record vouches for its file:
    /// the change goes to a copy of its first `len` bytes (what is present stays present), and
    /// the record's file is left as it is until a save or a newer record replaces it. Space
    /// for the copy is charged by the caller's reservation of the working copy only: the
    /// record's file is the bytes the user already had.
    async fn detach_from_unsaved(&self, it: &mut Item, len: u64) -> FsResult<()> {
        if !it.work_is_unsaved_record() {
            return Ok(());
        }
        let len = len.min(it.work.size());
        self.copy_on_write(it, len).await
    }

    /// The working copy is about to change in a way that would alter bytes another record
    /// names (the pending version's, or the changes kept as not saved): edit a copy of its
    /// first `len` bytes instead, where what was present stays present and nothing else is.
    async fn copy_on_write(&self, it: &mut Item, len: u64) -> FsResult<()> {
        let (id, copy, named) = if len == 0 {
            self.new_staging(0, RangeSet::new()).await?
        } else {
            let id = self.new_id();
            let to = self.dir.staging(id);
            let present = it.work.present().clone();
            let copy = staging::copy_prefix(it.work.at(), &to, len).await?;
            (id, copy.with_present(present), false)
        };
        tracing::debug!(key = %it.key, from = it.work_id, to = id, len, "copy-on-write of the working copy");
        it.work.close_fd();
        it.work = copy;
        it.work_id = id;
        it.work_named = named;
        Ok(())
    }

    /// Before the working copy's bytes change: see [`Item::forgotten_unsynced`].
    async fn settle_forgotten(&self, it: &mut Item) -> FsResult<()> {
        if it.forgotten_unsynced {
            self.settle_journal().await?;
            it.forgotten_unsynced = false;
        }
        Ok(())
    }

    pub async fn write(&self, item: &ItemRef, offset: u64, data: &[u8]) -> FsResult<()> {
        let mut it = item.0.item.lock().await;
        let result = self.write_locked(&item.0, &mut it, offset, data).await;
        Self::hold_on_failure(&mut it, &result);
        result
    }

    /// A change to the working copy failed (a write, a truncate, the fsync of a commit): what
    /// the user wrote may be missing from it, so it must never be committed (I10). It stays
    /// staged, reported as not saved, until it is rewritten whole.
    fn hold_on_failure(it: &mut Item, result: &FsResult<()>) {
        if let Err(e) = result {
            if it.held.is_none() && it.life == Life::Live {
                tracing::error!(key = %it.key, error = %e, "a change to the file failed: its changes since the last good save are kept staged and will not be uploaded; the bucket keeps its last whole version");
            }
            it.held.get_or_insert_with(|| e.clone());
            // Part of it may have reached the working copy: the file is changed, not saved.
            it.edits += 1;
        }
    }

    /// Whether the item's working copy is held (see [`Self::hold_on_failure`]).
    pub async fn is_held(&self, item: &ItemRef) -> bool {
        item.0.item.lock().await.held.is_some()
    }

    async fn write_locked(
        &self,
        shared: &Shared,
        it: &mut Item,
        offset: u64,
        data: &[u8],
    ) -> FsResult<()> {
        self.settle_forgotten(it).await?;
        self.detach_from_unsaved(it, u64::MAX).await?;
        let end = it.work.size().max(offset + data.len() as u64);
        // Would this change bytes of the pending version, kept in the same file? Then the
        // version stays as it is and the write goes to a copy (charged for up front).
        let copy = match it.pending.as_ref() {
            Some(p) if p.id == it.work_id && offset < p.size => {
                let overlap = ((p.size - offset) as usize).min(data.len());
                !it.work.holds(offset, &data[..overlap])?
            }
            _ => false,
        };
        let kept_apart = if copy {
            it.pending.as_ref().map_or(0, |p| p.size)
        } else {
            0
        };
        self.reserve_bytes(shared, it.staged_bytes(end) + kept_apart)
            .await?;
        if copy {
            let size = it.work.size();
            self.copy_on_write(it, size).await?;
        }
        it.work.write_at(offset, data)?;
        it.edits += 1;
        it.mtime = crate::clock::now();
        shared.publish(it);
        Ok(())
    }

    pub async fn truncate(&self, item: &ItemRef, len: u64) -> FsResult<()> {
        let mut it = item.0.item.lock().await;
        self.truncate_locked(&item.0, &mut it, len).await
    }

    async fn truncate_locked(&self, shared: &Shared, it: &mut Item, len: u64) -> FsResult<()> {
        let result = self.truncate_held(shared, it, len).await;
        Self::hold_on_failure(it, &result);
        if result.is_ok() && len == 0 && it.held.take().is_some() {
            // Rewritten from nothing: no byte of the failed change is left.
            tracing::info!(key = %it.key, "a file whose changes were held is being rewritten whole");
        }
        result
    }

    async fn truncate_held(&self, shared: &Shared, it: &mut Item, len: u64) -> FsResult<()> {
        self.settle_forgotten(it).await?;
        self.detach_from_unsaved(it, len).await?;
        match it.pending.as_ref().map(|p| (p.id, p.size)) {
            Some((id, size)) if id == it.work_id && len < size => {
                self.reserve_bytes(shared, len + size).await?;
                self.copy_on_write(it, len).await?;
            }
            _ => {
                self.reserve(shared, it, len).await?;
                it.work.truncate(len)?;
            }
        }
        it.edits += 1;
        it.mtime = crate::clock::now();
        shared.publish(it);
        self.recharge(shared, it);
        Ok(())
    }

    pub async fn set_mtime(&self, item: &ItemRef, mtime: SystemTime) {
        let mut it = item.0.item.lock().await;
        it.mtime = mtime;
        it.edits += 1;
        item.0.publish(&it);
    }

    /// Sets owner, group or mode, stored with the upload. With `changed: false` the bucket has
    /// them already (patched in place) and only a later upload must keep them.
    pub async fn set_posix(&self, item: &ItemRef, posix: Posix, changed: bool) {
        let mut it = item.0.item.lock().await;
        posix.to_metadata(&mut it.metadata);
        if changed {
            it.edits += 1;
        }
        item.0.publish(&it);
    }

    /// Whether nothing was changed through `item` yet: it still equals the object it was
    /// opened from, so a time or mode change can patch that object instead.
    pub async fn is_unchanged(&self, item: &ItemRef) -> bool {
        let it = item.0.item.lock().await;
        it.edits == 0 && it.pending.is_none() && it.base.as_ref().is_some_and(|(k, _)| *k == it.key)
    }

    /// Whether `key` is not being written, or only opened for writing and unchanged so far.
    pub async fn key_unchanged(&self, key: &str) -> bool {
        match self.live(key) {
            Some(s) => self.is_unchanged(&ItemRef(s)).await,
            None => true,
        }
    }

    /// Records metadata the bucket's object was given in place, for `key`'s item if one is
    /// open, so that a later upload keeps it.
    pub async fn note_patched(&self, key: &str, posix: Posix) {
        if let Some(s) = self.live(key) {
            self.set_posix(&ItemRef(s), posix, false).await;
        }
    }

    pub fn size(&self, item: &ItemRef) -> u64 {
        item.0.attr.lock().size
    }

    /// Makes the item's current content an acknowledged version: every byte present locally,
    /// fsync'd, its CRC32C known, and its journal record durable (replacing the record of the
    /// version it supersedes in the same line). Called on close, fsync and the last release.
    ///
    /// A held working copy (a change to it failed) is never committed: the error is returned
    /// again. A commit that fails otherwise (no room for the whole file, bytes of the object it
    /// was opened from that could not be fetched) is not tried again in the background (I10:
    /// the user was told it failed): the changes stay staged, not saved, until a later close or
    /// fsync succeeds.
    pub async fn commit(self: &Arc<Self>, item: &ItemRef) -> FsResult<()> {
        loop {
            let mut it = item.0.item.lock().await;
            if it.life != Life::Live {
                return Ok(());
            }
            if let Some(e) = &it.held {
                return Err(e.clone());
            }
            if !it.dirty() {
                return Ok(());
            }
            let size = it.work.size();
            self.reserve(&item.0, &it, size).await?;
            let missing = it.work.missing(0..size);
            if missing.is_empty() {
                return self.seal(&item.0, &mut it).await;
            }
            self.fill_holes(&item.0, it, missing).await?;
        }
    }

    async fn seal(self: &Arc<Self>, shared: &Arc<Shared>, it: &mut Item) -> FsResult<()> {
        // A failed fsync may have lost written pages: like a failed write.
        let sealed = it.work.seal().await.map_err(FsError::from);
        let crc = match sealed {
            Ok(crc) => crc,
            Err(e) => {
                Self::hold_on_failure(it, &Err(e.clone()));
                return Err(e);
            }
        };
        if !it.work_named {
            let dir = self.dir.staging_dir().clone();
            crate::platform::blocking(move || dir.sync()).await?;
            it.work_named = true;
        }
        let old = it.pending.take();
        if let Some(o) = &old {
            // An upload of the superseded version may have landed unseen (in flight now, or
            // its answer lost): the new record remembers it, so that finding it in the bucket
            // after a crash is not taken for someone else's write.
            it.note_maybe_landed(o);
        }
        let progress = match &old {
            // Appended to: parts of the older version may still hold this one's bytes (each is
            // checked before it is reused). A resumable session is the older version's alone.
            Some(p) if p.id == it.work_id => match &p.progress {
                UploadState::Uploading { parts, .. } if !parts.is_empty() => {
                    UploadState::Uploading {
                        session_url: None,
                        parts: parts.clone(),
                    }
                }
                _ => UploadState::Staged,
            },
            _ => UploadState::Staged,
        };
        let v = Version {
            seq: it.next_seq,
            id: it.work_id,
            size: it.work.size(),
            crc32c: crc,
            mtime: it.mtime,
            metadata: it.metadata.clone(),
            progress,
        };
        let mut changes = vec![Change::Put(it.record(&v))];
        if let Some(o) = old.as_ref().filter(|o| o.id != v.id) {
            changes.push(Change::Del(o.id));
        }
        // Changes kept as not saved are saved now: their record goes in the same line.
        if let Some(u) = it.unsaved_record {
            changes.push(Change::Del(u));
        }
        let change = match changes.len() {
            1 => changes.remove(0),
            _ => Change::Batch(changes),
        };
        if let Err(e) = self.journal.apply(change).await {
            it.pending = old;
            return Err(e.into());
        }
        it.unsaved_record = None;
        if old.as_ref().is_some_and(|o| Some(o.id) == it.unsaved_file) {
            // The superseded version's file: it goes as that version's does, below (not while
            // an attempt in flight still reads it).
            it.unsaved_file = None;
        }
        it.next_seq += 1;
        it.pending = Some(v);
        self.drop_unsaved_file(it);
        it.committed = it.edits;
        if let Some(o) = old.filter(|o| o.id != it.work_id) {
            // Superseded before it reached the bucket. An attempt in flight still reads it and
            // cleans up after itself when it ends.
            if !it.sched.uploading {
                self.discard(&o);
            }
        }
        self.recharge(shared, it);
        it.sched.due_in(self.cfg.write_back_delay);
        shared.wake.notify_one();
        self.ensure_task(shared, it);
        Ok(())
    }

    /// Makes the next `n` journal appends fail as on a full disk (tests only).
    #[cfg(test)]
    pub fn fail_journal_appends(&self, n: u32) {
        self.journal.fail_appends(n);
    }

    /// Makes the next `n` journal syncs fail (tests only).
    #[cfg(test)]
    pub fn fail_journal_syncs(&self, n: u32) {
        self.journal.fail_syncs(n);
    }

    /// Hands staging file `id`, which no item uses any more, to the pool: reused (or deleted)
    /// once no durable journal record names it.
    pub(super) fn recycle(&self, id: u64) {
        self.pool.recycle(id);
    }

    /// Makes every journal change so far durable. A namespace change calls it before it
    /// touches the bucket: a record forgotten without a sync
    /// ([`Journal::forget`](super::journal::Journal::forget)) must not come back after a power
    /// loss and upload the file again under a name just deleted or renamed away.
    pub async fn settle_journal(&self) -> FsResult<()> {
        Ok(self.journal.flush().await?)
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

    /// Makes the working copy's bytes and its name durable, before a record names them.
    pub(super) async fn work_durable(&self, it: &mut Item) -> std::io::Result<()> {
        let file = it.work.clone_file()?;
        crate::platform::blocking(move || file.sync_all()).await?;
        if !it.work_named {
            let dir = self.dir.staging_dir().clone();
            crate::platform::blocking(move || dir.sync()).await?;
            it.work_named = true;
        }
        Ok(())
    }

    /// Changes that were not saved (held, or the last close failed) stay staged: their bytes
    /// are made durable and a journal record keeps them across an unmount or a crash. They
    /// are never uploaded from it. Best effort: the disk that failed a write may fail this too.
    pub(super) async fn keep_unsaved(&self, it: &mut Item) {
        if it.life != Life::Live || !it.dirty() {
            return;
        }
        let id = it.unsaved_record.unwrap_or_else(|| self.new_id());
        let kept = match self.work_durable(it).await {
            Ok(()) => self.journal.put(&it.unsaved(id)).await,
            Err(e) => Err(e),
        };
        match kept {
            Ok(()) => {
                it.unsaved_record = Some(id);
                // The record now names the working copy's file; one it named before (the
                // working copy moved off it since) is no longer needed.
                self.drop_unsaved_file(it);
                it.unsaved_file = Some(it.work_id);
            }
            Err(e) => {
                tracing::error!(key = %it.key, error = %e, "could not keep the file's unsaved changes in the journal; they are lost if the mount stops")
            }
        }
    }

    /// Close of one handle: commit, then either wait for the upload (`upload_on_close`) or let
    /// it run in the background. A commit that fails keeps the changes staged (not saved).
    pub async fn close(self: &Arc<Self>, item: &ItemRef) -> FsResult<()> {
        if let Err(e) = self.commit(item).await {
            let mut it = item.0.item.lock().await;
            it.close_failed = true;
            self.keep_unsaved(&mut it).await;
            return Err(e);
        }
        item.0.item.lock().await.close_failed = false;
        if self.cfg.upload_on_close {
            self.flush_to_bucket(item).await
        } else {
            Ok(())
        }
    }

    /// Commits and waits until the item is in the bucket: fsync.
    pub async fn flush_to_bucket(self: &Arc<Self>, item: &ItemRef) -> FsResult<()> {
        if let Err(e) = self.commit(item).await {
            item.0.item.lock().await.close_failed = true;
            return Err(e);
        }
        item.0.item.lock().await.close_failed = false;
        let target = {
            let mut it = item.0.item.lock().await;
            let Some(p) = it.pending.as_ref().filter(|_| it.life == Life::Live) else {
                return Ok(());
            };
            let target = p.seq;
            it.sched.expedite();
            self.ensure_task(&item.0, &mut it);
            target
        };
        item.0.wake.notify_one();
        let mut rx = item.0.progress.subscribe();
        loop {
            {
                let p = rx.borrow_and_update();
                if p.uploaded >= target {
                    return Ok(());
                }
                if let Some(e) = p.error.as_ref().filter(|_| p.failed_seq >= target) {
                    return Err(FsError::Io(format!("upload failed, file kept staged: {e}")));
                }
            }
            if item.0.item.lock().await.life != Life::Live {
                // Deleted or renamed over meanwhile: nothing of it is to be uploaded.
                return Ok(());
            }
            if rx.changed().await.is_err() {
                return Err(FsError::Io("upload engine stopped".into()));
            }
        }
    }

    /// One handle on `item` closed. Writes that arrived after its last flush (a shared
    /// mapping, the kernel's write-back cache) are committed when the last handle goes.
    pub async fn release(self: &Arc<Self>, item: &ItemRef) {
        let last = {
            let mut it = item.0.item.lock().await;
            it.handles = it.handles.saturating_sub(1);
            item.0.open.store(it.handles, Ordering::SeqCst);
            it.handles == 0
        };
        let close_failed = item.0.item.lock().await.close_failed;
        let failed = if !last {
            None
        } else if close_failed {
            // The user was told the close failed: the release does not save it after all.
            Some(FsError::Io("the last close failed".into()))
        } else {
            self.commit(item).await.err()
        };
        let mut it = item.0.item.lock().await;
        if let Some(e) = failed {
            // Not tried again in the background (I10): nothing of it is uploaded unless a later
            // close saves it. Kept across an unmount or a crash all the same.
            tracing::error!(key = %it.key, error = %e, "the file's last changes could not be saved; they stay staged and are not uploaded; the bucket keeps its last whole version");
            self.keep_unsaved(&mut it).await;
        }
        if it.handles == 0 {
            it.work.close_fd();
        }
        self.retire_if_settled(&item.0, &mut it);
    }

    /// Drops an item nobody needs any more: no handles, nothing pending (or unlinked).
    pub(super) fn retire_if_settled(&self, shared: &Arc<Shared>, it: &mut Item) {
        if !it.settled() || it.life == Life::Retired {
            return;
        }
        it.life = Life::Retired;
        if let Some(u) = it.unsaved_record.take() {
            // Normally gone already (saved, or removed with the name).
            if let Err(e) = self.journal.forget(u) {
                tracing::warn!(error = %e, "could not remove a journal record");
            }
        }
        self.drop_unsaved_file(it);
        {
            let mut map = self.by_key.lock();
            // Only this item's entry: a newer item may already have taken the name.
            if map.get(&it.key).is_some_and(|s| Arc::ptr_eq(s, shared)) {
                map.remove(&it.key);
            }
        }
        it.work.close_fd();
        // Nothing needs the file any more: its version is in the bucket (or it was unlinked),
        // and no descriptor reads it (an upload attempt ends before its item can settle).
        self.recycle(it.work_id);
        self.recharge(shared, it);
    }

    /// The cache is full: files already closed upload now, whatever their write-back delay.
    fn upload_closed_now(&self) {
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
                let mut it = shared.item.lock().await;
                if it.life == Life::Live && it.pending.is_some() {
                    pending += 1;
                    if it.sched.failures > 0 {
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
                // Records forgotten without a sync: durable before the mount goes.
                if let Err(e) = self.journal.flush().await {
                    tracing::warn!(error = %e, "could not sync the journal; finished uploads may be retried at the next mount");
                }
                return pending;
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
            // Changed, and nothing will save it: a write failed, or the last close did and no
            // handle is left to try again.
            let not_saved = it.held.is_some() || (it.dirty() && it.handles == 0);
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
