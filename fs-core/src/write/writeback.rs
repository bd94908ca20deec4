//! The write-back engine: one item per file being written, and its path to the bucket.
//!
//! Each item owns a staging file and three version counters, in the spirit of rclone's
//! `vfscache` items: `version` counts changes, `durable` is the version whose journal record is
//! on disk (set by a close or an fsync), and `uploaded` is the version in the bucket. An item is
//! dirty while `version > uploaded`.
//!
//! - A commit (close, fsync) completes the staging file (fetching the ranges it never had),
//!   fsyncs it, writes the journal record, and schedules the upload `write_back_delay` later.
//!   Commits before the upload starts only move its start, so a file rewritten several times is
//!   uploaded once.
//! - Uploads run at most `files_concurrency` at a time. A failed upload stays staged and is
//!   retried with backoff; it is reported, never dropped. A conflict saves our copy beside the
//!   bucket's (see [`super::upload`]).
//! - When the last handle is released and the item is in the bucket, its staging file goes.
//! - At start-up, [`WriteBack::replay`] turns every journal record back into an item and uploads
//!   it, so nothing acknowledged before a crash is lost.
//! - With a `cache_size`, every item is charged the size its staging file will reach. A write
//!   that would go over the limit makes the closed files upload now and waits for their space;
//!   it fails with `ENOSPC` only when the files still open could not fit even if everything else
//!   were uploaded (or when uploads make no progress for [`SPACE_WAIT_LIMIT`]).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{watch, Semaphore};

use super::cache_dir::CacheDir;
use super::journal::{Journal, Record, UploadState};
use super::ranges::RangeSet;
use super::staging::StagingFile;
use super::upload::{upload, Outcome, UploadConfig, UploadJob, UploadSource};
use crate::error::{FsError, FsResult};
use crate::namespace::SettleHook;
use crate::store::{
    read_range, ObjectMeta, ObjectStore, Posix, Precondition, WriteOptions, MTIME_KEY,
};

/// Write-path settings.
#[derive(Debug, Clone)]
pub struct WriteConfig {
    pub cache_dir: PathBuf,
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

/// How long a write waits for uploads to free staging space without any being freed before it
/// gives up with `ENOSPC`.
pub const SPACE_WAIT_LIMIT: Duration = Duration::from_secs(120);

impl WriteConfig {
    pub fn new(cache_dir: PathBuf) -> Self {
        WriteConfig {
            cache_dir,
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

/// Counters for `bucketdrive status`.
#[derive(Debug, Default)]
pub struct Counters {
    pub uploaded_files: AtomicU64,
    pub uploaded_bytes: AtomicU64,
    pub uploading_files: AtomicU64,
    pub conflicts: AtomicU64,
    pub failures: AtomicU64,
    /// (when, bytes) of the uploads finished in the last [`RATE_WINDOW`].
    recent: parking_lot::Mutex<std::collections::VecDeque<(Instant, u64)>>,
}

/// The window the current upload throughput is measured over.
const RATE_WINDOW: Duration = Duration::from_secs(10);

impl Counters {
    fn record_upload(&self, size: u64) {
        self.uploaded_bytes.fetch_add(size, Ordering::Relaxed);
        self.uploaded_files.fetch_add(1, Ordering::Relaxed);
        let mut recent = self.recent.lock();
        recent.push_back((Instant::now(), size));
        Self::prune(&mut recent);
    }

    fn prune(recent: &mut std::collections::VecDeque<(Instant, u64)>) {
        while recent
            .front()
            .is_some_and(|(t, _)| t.elapsed() > RATE_WINDOW)
        {
            recent.pop_front();
        }
    }

    /// Bytes per second of uploads finished over the last [`RATE_WINDOW`].
    fn rate(&self) -> u64 {
        let mut recent = self.recent.lock();
        Self::prune(&mut recent);
        recent.iter().map(|(_, b)| b).sum::<u64>() / RATE_WINDOW.as_secs()
    }
}

/// A snapshot of the engine for `status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Status {
    /// Files changed and not yet in the bucket, and their bytes.
    pub pending_files: u64,
    pub pending_bytes: u64,
    pub uploading_files: u64,
    pub uploaded_files: u64,
    pub uploaded_bytes: u64,
    pub conflicts: u64,
    pub failures: u64,
    /// Pending files whose latest upload attempt failed (retried with backoff).
    #[serde(default)]
    pub failed_files: u64,
    /// Pending files with changes not yet closed or fsync'd (still being written).
    #[serde(default)]
    pub unsaved_files: u64,
    /// Bytes per second of uploads that finished in the last ten seconds.
    #[serde(default)]
    pub upload_rate: u64,
}

/// Size and modification time of a file being written, which override the bucket's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalAttr {
    pub size: u64,
    pub mtime: SystemTime,
    pub posix: Posix,
}

struct Item {
    id: u64,
    key: String,
    /// The bucket object this file started from: (key, generation).
    base: Option<(String, i64)>,
    staging: StagingFile,
    mtime: SystemTime,
    /// Custom metadata for the upload besides the mtime: carried over from the object it was
    /// opened from (so a modified file keeps its mode and the like), plus changes made here.
    metadata: HashMap<String, String>,
    crc32c: u32,
    version: u64,
    durable: u64,
    uploaded: u64,
    handles: u32,
    unlinked: bool,
    /// Dropped from the engine (in the bucket, no handles): never reused.
    retired: bool,
    due: Option<Instant>,
    scheduled: bool,
    /// An upload attempt is in flight (it holds no lock while it runs).
    uploading: bool,
    /// Namespace changes in progress on this file; no upload attempt starts meanwhile.
    paused: u32,
    failures: u32,
    /// The state last written to the journal, reused by resumed uploads.
    state: UploadState,
}

/// Result of the latest upload attempt, for waiters.
#[derive(Debug, Clone, Default)]
struct Progress {
    uploaded: u64,
    error: Option<String>,
    /// Bumped at the end of every attempt, so waiters wake even when nothing else changed.
    attempts: u64,
    /// The version the failed attempt was uploading; older failures do not concern a waiter
    /// for a newer version.
    failed_version: u64,
}

struct Shared {
    item: tokio::sync::Mutex<Item>,
    progress: watch::Sender<Progress>,
    /// Wakes the item's upload task when its due time moves earlier (fsync, drain).
    wake: tokio::sync::Notify,
    /// Staging bytes charged to this item against the cache size.
    charged: AtomicU64,
    /// Mirrors `Item::handles`, readable without the item's lock.
    open: AtomicU32,
}

impl Shared {
    fn new(item: Item) -> Arc<Self> {
        let open = item.handles;
        Arc::new(Shared {
            item: tokio::sync::Mutex::new(item),
            progress: watch::channel(Progress::default()).0,
            wake: tokio::sync::Notify::new(),
            charged: AtomicU64::new(0),
            open: AtomicU32::new(open),
        })
    }
}

/// Staging space in use, against `WriteConfig::cache_size`.
#[derive(Default)]
struct Space {
    used: AtomicU64,
    /// Signalled whenever charged space is given back.
    freed: tokio::sync::Notify,
}

/// A handle on one item, held by open files.
#[derive(Clone)]
pub struct ItemRef(Arc<Shared>);

/// The write-back engine of one mount.
pub struct WriteBack<S: ObjectStore> {
    store: Arc<S>,
    cfg: WriteConfig,
    dir: CacheDir,
    journal: Journal,
    by_key: parking_lot::Mutex<HashMap<String, Arc<Shared>>>,
    next_id: AtomicU64,
    slots: Arc<Semaphore>,
    pub counters: Counters,
    on_settled: SettleHook,
    space: Space,
}

impl<S: ObjectStore> WriteBack<S> {
    /// Opens the cache directory (locking it) and the journal. `on_settled` is told when a key's
    /// content in the bucket changed (with the new object) or may have (with `None`).
    pub fn new(
        store: Arc<S>,
        cfg: WriteConfig,
        on_settled: SettleHook,
    ) -> Result<Arc<Self>, String> {
        let dir = CacheDir::open(&cfg.cache_dir)?;
        let journal = Journal::open(&dir.journal_dir())
            .map_err(|e| format!("cannot open the journal: {e}"))?;
        let next = journal
            .next_id()
            .map_err(|e| format!("cannot read the journal: {e}"))?;
        Ok(Arc::new(WriteBack {
            slots: Arc::new(Semaphore::new(cfg.files_concurrency.max(1))),
            store,
            cfg,
            dir,
            journal,
            by_key: parking_lot::Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(next),
            counters: Counters::default(),
            on_settled,
            space: Space::default(),
        }))
    }

    pub fn config(&self) -> &WriteConfig {
        &self.cfg
    }

    /// Re-creates an item for every journal record and schedules its upload. Returns how many.
    pub async fn replay(self: &Arc<Self>) -> Result<usize, String> {
        let (records, corrupt) = self
            .journal
            .load_all()
            .map_err(|e| format!("cannot read the journal: {e}"))?;
        if !corrupt.is_empty() {
            tracing::error!(
                count = corrupt.len(),
                "journal records could not be read and were set aside"
            );
        }
        let mut n = 0;
        for rec in records {
            if matches!(
                rec.state,
                UploadState::Done { .. } | UploadState::Conflict { .. }
            ) {
                let _ = self.journal.remove(rec.id);
                let _ = std::fs::remove_file(self.dir.staging_path(rec.id));
                continue;
            }
            let staging = match StagingFile::open_complete(&self.dir.staging_path(rec.id)) {
                Ok(s) if s.size() == rec.size => s,
                other => {
                    tracing::error!(key = %rec.key, id = rec.id, "staged data missing or of the wrong size for a journal record: {:?}", other.err());
                    continue;
                }
            };
            let item = Item {
                id: rec.id,
                key: rec.key.clone(),
                base: rec.base_generation.map(|g| (rec.key.clone(), g)),
                staging,
                mtime: SystemTime::UNIX_EPOCH + Duration::from_secs(rec.mtime.max(0) as u64),
                metadata: rec.metadata.clone(),
                crc32c: rec.crc32c,
                version: 1,
                durable: 1,
                uploaded: 0,
                handles: 0,
                unlinked: false,
                retired: false,
                due: Some(Instant::now()),
                scheduled: false,
                uploading: false,
                paused: 0,
                failures: 0,
                state: rec.state.clone(),
            };
            let shared = Shared::new(item);
            // Already on disk, so charged even past the limit; new writes wait for it.
            shared.charged.store(rec.size, Ordering::SeqCst);
            self.space.used.fetch_add(rec.size, Ordering::SeqCst);
            self.by_key.lock().insert(rec.key.clone(), shared.clone());
            tracing::info!(key = %rec.key, size = rec.size, "replaying a staged file from the journal");
            self.schedule(shared, true).await;
            n += 1;
        }
        Ok(n)
    }

    /// Opens `key` for writing. `base` is the bucket object it starts from (None for a new
    /// file); with `truncate` its old bytes are not needed.
    pub async fn open(
        &self,
        key: &str,
        base: Option<&ObjectMeta>,
        truncate: bool,
    ) -> FsResult<ItemRef> {
        if let Some(item) = self.open_existing(key).await {
            if truncate {
                // The handle just taken keeps the item from retiring.
                let mut it = item.0.item.lock().await;
                if it.staging.size() > 0 {
                    it.staging.truncate(0)?;
                    it.version += 1;
                    self.recharge(&item.0, 0);
                }
            }
            return Ok(item);
        }
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let (size, present) = match (base, truncate) {
            (Some(m), false) => (m.size, RangeSet::new()),
            _ => (0, RangeSet::new()),
        };
        let staging = StagingFile::create(&self.dir.staging_path(id), size, present)?;
        let new_or_truncated = base.is_none() || (truncate && base.is_some_and(|m| m.size > 0));
        let item = Item {
            id,
            key: key.to_string(),
            base: base.map(|m| (m.key.clone(), m.generation)),
            staging,
            mtime: base.map(ObjectMeta::mtime).unwrap_or_else(SystemTime::now),
            metadata: base
                .map(|m| {
                    let mut md = m.metadata.clone();
                    md.remove(MTIME_KEY);
                    md
                })
                .unwrap_or_default(),
            crc32c: 0,
            // A new or truncated file is a change even if nothing is written to it.
            version: u64::from(new_or_truncated),
            durable: 0,
            uploaded: 0,
            handles: 1,
            unlinked: false,
            retired: false,
            due: None,
            scheduled: false,
            uploading: false,
            paused: 0,
            failures: 0,
            state: UploadState::Staged,
        };
        let shared = Shared::new(item);
        self.by_key.lock().insert(key.to_string(), shared.clone());
        Ok(ItemRef(shared))
    }

    /// The item for `key`, if one is live.
    /// Takes a handle on the live item of `key`, if there is one. An item that retired (its
    /// upload finished and nobody held it) is not revived: the file is then what the bucket
    /// has, and must be opened from there.
    pub async fn open_existing(&self, key: &str) -> Option<ItemRef> {
        let shared = self.by_key.lock().get(key).cloned()?;
        let mut it = shared.item.lock().await;
        if it.unlinked || it.retired {
            return None;
        }
        it.handles += 1;
        shared.open.store(it.handles, Ordering::SeqCst);
        drop(it);
        Some(ItemRef(shared))
    }

    pub fn item(&self, key: &str) -> Option<ItemRef> {
        self.by_key.lock().get(key).cloned().map(ItemRef)
    }

    /// Size and mtime of `key` if it is being written.
    pub async fn local_attr(&self, key: &str) -> Option<LocalAttr> {
        let shared = self.by_key.lock().get(key).cloned()?;
        let it = shared.item.lock().await;
        Some(LocalAttr {
            size: it.staging.size(),
            mtime: it.mtime,
            posix: Posix::from_metadata(&it.metadata),
        })
    }

    /// Keys being written directly under `prefix` (a directory), as names with their
    /// attributes.
    pub async fn local_children(&self, prefix: &str) -> Vec<(String, LocalAttr)> {
        self.local_under(prefix)
            .await
            .into_iter()
            .filter_map(|(k, a)| {
                let name = &k[prefix.len()..];
                (!name.is_empty() && !name.contains('/')).then(|| (name.to_string(), a))
            })
            .collect()
    }

    /// Keys being written at any depth under `prefix`.
    pub async fn local_under(&self, prefix: &str) -> Vec<(String, LocalAttr)> {
        let items: Vec<(String, Arc<Shared>)> = self
            .by_key
            .lock()
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut out = Vec::with_capacity(items.len());
        for (k, shared) in items {
            let it = shared.item.lock().await;
            out.push((
                k,
                LocalAttr {
                    size: it.staging.size(),
                    mtime: it.mtime,
                    posix: Posix::from_metadata(&it.metadata),
                },
            ));
        }
        out
    }

    /// Deletes temporary part objects that no journaled upload still needs (left by uploads
    /// that were interrupted and will start again, or that finished but could not clean up).
    pub async fn remove_orphan_parts(&self) {
        let mut keep = std::collections::HashSet::new();
        let items: Vec<Arc<Shared>> = self.by_key.lock().values().cloned().collect();
        for shared in items {
            if let UploadState::Uploading { parts, .. } = &shared.item.lock().await.state {
                keep.extend(parts.iter().map(|p| p.key.clone()));
            }
        }
        let mut token = None;
        loop {
            let req = crate::store::ListRequest {
                prefix: self.cfg.upload.temp_prefix.clone(),
                delimiter: None,
                page_token: token,
                max_results: Some(1000),
            };
            let page = match self.store.list(&req).await {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(error = %e, "could not list temporary parts to clean up");
                    return;
                }
            };
            for o in page.objects.iter().filter(|o| !keep.contains(&o.key)) {
                if let Err(e) = self
                    .store
                    .delete(&o.key, Precondition::GenerationMatch(o.generation))
                    .await
                {
                    tracing::warn!(key = %o.key, error = %e, "could not delete an orphaned temporary part");
                } else {
                    tracing::info!(key = %o.key, "removed an orphaned temporary part");
                }
            }
            token = page.next_page_token;
            if token.is_none() {
                return;
            }
        }
    }

    /// Whether any key under `prefix` is being written.
    pub fn has_local_under(&self, prefix: &str) -> bool {
        self.by_key.lock().keys().any(|k| k.starts_with(prefix))
    }

    /// Reads from the staging file, fetching from the bucket the bytes it does not have yet.
    pub async fn read(&self, item: &ItemRef, offset: u64, len: u32) -> FsResult<Vec<u8>> {
        let mut it = item.0.item.lock().await;
        let missing = it.staging.missing(offset..offset + u64::from(len));
        self.fetch(&mut it, missing).await?;
        Ok(it.staging.read_at(offset, len as usize)?)
    }

    pub async fn write(&self, item: &ItemRef, offset: u64, data: &[u8]) -> FsResult<()> {
        let mut it = item.0.item.lock().await;
        let end = it.staging.size().max(offset + data.len() as u64);
        self.reserve(&item.0, end).await?;
        it.staging.write_at(offset, data)?;
        it.version += 1;
        it.mtime = SystemTime::now();
        Ok(())
    }

    pub async fn truncate(&self, item: &ItemRef, len: u64) -> FsResult<()> {
        let mut it = item.0.item.lock().await;
        self.reserve(&item.0, len).await?;
        it.staging.truncate(len)?;
        self.recharge(&item.0, len);
        it.version += 1;
        it.mtime = SystemTime::now();
        Ok(())
    }

    pub async fn set_mtime(&self, item: &ItemRef, mtime: SystemTime) {
        let mut it = item.0.item.lock().await;
        it.mtime = mtime;
        it.version += 1;
    }

    /// Sets owner, group or mode, stored with the upload. With `changed: false` the bucket has
    /// them already (patched in place) and only a later upload must keep them.
    pub async fn set_posix(&self, item: &ItemRef, posix: Posix, changed: bool) {
        let mut it = item.0.item.lock().await;
        posix.to_metadata(&mut it.metadata);
        if changed {
            it.version += 1;
        }
    }

    /// Whether nothing was changed through `item` yet: it still equals the object it was
    /// opened from, so a time or mode change can patch that object instead.
    pub async fn is_unchanged(&self, item: &ItemRef) -> bool {
        let it = item.0.item.lock().await;
        it.version == 0 && it.base.as_ref().is_some_and(|(k, _)| *k == it.key)
    }

    /// Whether `key` is not being written, or only opened for writing and unchanged so far.
    pub async fn key_unchanged(&self, key: &str) -> bool {
        let shared = self.by_key.lock().get(key).cloned();
        match shared {
            Some(s) => self.is_unchanged(&ItemRef(s)).await,
            None => true,
        }
    }

    /// Records metadata the bucket's object was given in place, for `key`'s item if one is
    /// open, so that a later upload keeps it.
    pub async fn note_patched(&self, key: &str, posix: Posix) {
        let shared = self.by_key.lock().get(key).cloned();
        if let Some(s) = shared {
            self.set_posix(&ItemRef(s), posix, false).await;
        }
    }

    pub async fn size(&self, item: &ItemRef) -> u64 {
        item.0.item.lock().await.staging.size()
    }

    async fn fetch(&self, it: &mut Item, missing: Vec<std::ops::Range<u64>>) -> FsResult<()> {
        if missing.is_empty() {
            return Ok(());
        }
        let Some((base_key, generation)) = it.base.clone() else {
            return Err(FsError::Io(
                "staging file has holes but no base object".into(),
            ));
        };
        for gap in missing {
            let mut pos = gap.start;
            while pos < gap.end {
                let end = (pos + (8 << 20)).min(gap.end);
                let data = read_range(self.store.as_ref(), &base_key, generation, pos..end)
                    .await
                    .map_err(FsError::from_pinned_read)?;
                it.staging.fill(pos, &data)?;
                pos = end;
            }
        }
        Ok(())
    }

    /// Makes the item's current content durable (staging fsync'd, journal record written) and
    /// schedules its upload. Called on close and fsync.
    pub async fn commit(&self, item: &ItemRef) -> FsResult<()> {
        let mut it = item.0.item.lock().await;
        if it.unlinked || it.version == it.durable {
            return Ok(());
        }
        let size = it.staging.size();
        self.reserve(&item.0, size).await?;
        let missing = it.staging.missing(0..size);
        self.fetch(&mut it, missing).await?;
        it.staging.sync()?;
        if it.durable == 0 {
            self.dir.sync_staging_names()?;
        }
        it.crc32c = it.staging.crc32c()?;
        let rec = Self::record(&it);
        self.journal.put(&rec)?;
        it.durable = it.version;
        it.due = Some(Instant::now() + self.cfg.write_back_delay);
        Ok(())
    }

    fn record(it: &Item) -> Record {
        Record {
            id: it.id,
            key: it.key.clone(),
            base_generation: it
                .base
                .as_ref()
                .filter(|(k, _)| *k == it.key)
                .map(|(_, g)| *g),
            size: it.staging.size(),
            crc32c: it.crc32c,
            mtime: it
                .mtime
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0),
            metadata: it.metadata.clone(),
            state: it.state.clone(),
        }
    }

    /// Close of one handle: commit, then either wait for the upload (`upload_on_close`) or let
    /// it run in the background.
    pub async fn close(self: &Arc<Self>, item: &ItemRef) -> FsResult<()> {
        self.commit(item).await?;
        if self.cfg.upload_on_close {
            self.flush_to_bucket(item).await
        } else {
            self.schedule(item.0.clone(), false).await;
            Ok(())
        }
    }

    /// Commits and waits until the item is in the bucket: fsync.
    pub async fn flush_to_bucket(self: &Arc<Self>, item: &ItemRef) -> FsResult<()> {
        self.commit(item).await?;
        let target = {
            let mut it = item.0.item.lock().await;
            if it.unlinked || it.uploaded >= it.durable {
                return Ok(());
            }
            it.due = Some(Instant::now());
            it.durable
        };
        self.schedule(item.0.clone(), true).await;
        let mut rx = item.0.progress.subscribe();
        loop {
            {
                let p = rx.borrow_and_update();
                if p.uploaded >= target {
                    return Ok(());
                }
                if let Some(e) = p.error.as_ref().filter(|_| p.failed_version >= target) {
                    return Err(FsError::Io(format!("upload failed, file kept staged: {e}")));
                }
            }
            if rx.changed().await.is_err() {
                return Err(FsError::Io("upload engine stopped".into()));
            }
        }
    }

    /// The last handle on `item` closed.
    pub async fn release(&self, item: &ItemRef) {
        let mut it = item.0.item.lock().await;
        it.handles = it.handles.saturating_sub(1);
        item.0.open.store(it.handles, Ordering::SeqCst);
        self.retire_if_settled(&item.0, &mut it);
    }

    /// Drops an item nobody needs any more: no handles, and in the bucket (or unlinked).
    fn retire_if_settled(&self, shared: &Arc<Shared>, it: &mut Item) {
        let settled = it.unlinked || (it.version == it.uploaded && it.durable == it.uploaded);
        if it.handles == 0 && settled && !it.scheduled {
            it.retired = true;
            let mut map = self.by_key.lock();
            // Only this item's entry: a newer item may already have taken the name.
            if map.get(&it.key).is_some_and(|s| Arc::ptr_eq(s, shared)) {
                map.remove(&it.key);
            }
            drop(map);
            let _ = std::fs::remove_file(it.staging.path());
            self.recharge(shared, 0);
            if !it.unlinked {
                let _ = self.journal.remove(it.id);
            }
        }
    }

    /// Waits until no upload attempt of `shared` is in flight. Namespace changes call this
    /// first, so an upload that started before them cannot land after them.
    async fn wait_idle(shared: &Arc<Shared>) {
        let mut rx = shared.progress.subscribe();
        loop {
            if !shared.item.lock().await.uploading {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// Stops new upload attempts of `key` and waits for any in flight to end, so a namespace
    /// change sees the bucket as the uploads left it and no upload lands after it under the old
    /// name. Must be followed by [`Self::resume`].
    pub async fn pause(&self, key: &str) -> Option<ItemRef> {
        let shared = self.by_key.lock().get(key).cloned()?;
        shared.item.lock().await.paused += 1;
        Self::wait_idle(&shared).await;
        Some(ItemRef(shared))
    }

    /// Ends a [`Self::pause`].
    pub async fn resume(&self, item: Option<ItemRef>) {
        if let Some(item) = item {
            let mut it = item.0.item.lock().await;
            it.paused = it.paused.saturating_sub(1);
            drop(it);
            item.0.wake.notify_one();
        }
    }

    /// The file was deleted: forget its pending upload and staged data. Returns once no upload
    /// of it is in flight, so the caller can delete what is in the bucket.
    pub async fn unlink(&self, key: &str) -> bool {
        let Some(shared) = self.by_key.lock().remove(key) else {
            return false;
        };
        {
            let mut it = shared.item.lock().await;
            it.unlinked = true;
            let _ = self.journal.remove(it.id);
        }
        Self::wait_idle(&shared).await;
        let it = shared.item.lock().await;
        if it.handles == 0 {
            let _ = std::fs::remove_file(it.staging.path());
            self.recharge(&shared, 0);
        }
        true
    }

    /// Makes sure `shared` is charged at least `size` bytes of staging space, waiting for
    /// uploads to free space when the cache is full. The caller holds the item's lock.
    async fn reserve(&self, shared: &Shared, size: u64) -> FsResult<()> {
        let Some(limit) = self.cfg.cache_size else {
            return Ok(());
        };
        let mut waited_since = Instant::now();
        loop {
            let charged = shared.charged.load(Ordering::SeqCst);
            if size <= charged {
                return Ok(());
            }
            let delta = size - charged;
            let freed = self.space.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let used = self.space.used.load(Ordering::SeqCst);
            if used + delta <= limit {
                if self
                    .space
                    .used
                    .compare_exchange(used, used + delta, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
                {
                    shared.charged.store(size, Ordering::SeqCst);
                    return Ok(());
                }
                continue;
            }
            // Space held by open files cannot be freed by uploading; this file is open too.
            let open: u64 = self
                .by_key
                .lock()
                .values()
                .filter(|s| s.open.load(Ordering::SeqCst) > 0)
                .map(|s| s.charged.load(Ordering::SeqCst))
                .sum();
            let own = if shared.open.load(Ordering::SeqCst) > 0 {
                0
            } else {
                charged
            };
            if open + own + delta > limit {
                tracing::warn!(
                    limit,
                    open_bytes = open,
                    "cache size reached by files still open"
                );
                return Err(FsError::NoSpace);
            }
            if waited_since.elapsed() > SPACE_WAIT_LIMIT {
                tracing::error!(
                    limit,
                    "cache full and no upload has freed space for {:?}",
                    SPACE_WAIT_LIMIT
                );
                return Err(FsError::NoSpace);
            }
            self.upload_closed_now();
            if tokio::time::timeout(Duration::from_secs(1), freed)
                .await
                .is_ok()
            {
                waited_since = Instant::now();
            }
        }
    }

    /// Sets the charge of `shared` to `size` when that is lower, giving the rest back.
    fn recharge(&self, shared: &Shared, size: u64) {
        let old = shared.charged.load(Ordering::SeqCst);
        if size < old {
            shared.charged.store(size, Ordering::SeqCst);
            self.space.used.fetch_sub(old - size, Ordering::SeqCst);
            self.space.freed.notify_waiters();
        }
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
                if it.durable > it.uploaded && it.due.is_some_and(|d| d > Instant::now()) {
                    it.due = Some(Instant::now());
                    shared.wake.notify_one();
                }
            }
        }
    }

    /// The file was renamed: its pending upload follows the new name. `new_base` is the bucket
    /// object now at `to` (after a server-side copy), if any.
    pub async fn rename(
        &self,
        from: &str,
        to: &str,
        new_base: Option<&ObjectMeta>,
    ) -> FsResult<()> {
        let Some(shared) = self.by_key.lock().remove(from) else {
            return Ok(());
        };
        let replaced = self.by_key.lock().insert(to.to_string(), shared.clone());
        if let Some(old) = replaced {
            // Renaming over a file being written replaces it.
            let mut o = old.item.lock().await;
            o.unlinked = true;
            let _ = self.journal.remove(o.id);
        }
        let mut it = shared.item.lock().await;
        it.key = to.to_string();
        it.base = new_base
            .map(|m| (m.key.clone(), m.generation))
            .or(it.base.take());
        it.state = UploadState::Staged;
        if it.durable > 0 {
            self.journal.put(&Self::record(&it))?;
        }
        // The content at the new name must be uploaded even if it was already in the bucket
        // under the old one (unless a server-side copy already put it there).
        if new_base.is_none() && it.uploaded > 0 {
            it.uploaded = 0;
        }
        Ok(())
    }

    async fn schedule(self: &Arc<Self>, shared: Arc<Shared>, now: bool) {
        {
            let mut it = shared.item.lock().await;
            if now {
                it.due = Some(Instant::now());
            }
            if it.scheduled {
                if now {
                    shared.wake.notify_one();
                }
                return;
            }
            it.scheduled = true;
        }
        let me = self.clone();
        tokio::spawn(async move { me.run_uploads(shared).await });
    }

    /// The upload loop of one item: waits for its due time, uploads, retries on failure, and
    /// ends when the item is in the bucket (or gone).
    async fn run_uploads(self: Arc<Self>, shared: Arc<Shared>) {
        loop {
            let (job, src, version, resume, size) = {
                let mut it = shared.item.lock().await;
                if it.unlinked || it.uploaded >= it.durable {
                    it.scheduled = false;
                    self.retire_if_settled(&shared, &mut it);
                    return;
                }
                if it.paused > 0 {
                    let resumed = shared.wake.notified();
                    drop(it);
                    resumed.await;
                    continue;
                }
                if let Some(due) = it.due {
                    let now = Instant::now();
                    if due > now {
                        drop(it);
                        tokio::select! {
                            _ = tokio::time::sleep(due - now) => {}
                            _ = shared.wake.notified() => {}
                        }
                        continue;
                    }
                }
                if it.version != it.durable && it.handles > 0 {
                    // Being written right now: an upload would race the writer and fail its
                    // checksum. The next close commits and moves the due time.
                    it.due = Some(
                        Instant::now() + self.cfg.write_back_delay.max(Duration::from_millis(10)),
                    );
                    continue;
                }
                let file = match it.staging.clone_file() {
                    Ok(f) => f,
                    Err(e) => {
                        tracing::error!(key = %it.key, error = %e, "staged data unreadable; upload paused");
                        // Counted as a failure, so a drain at unmount does not wait for it.
                        it.failures += 1;
                        self.counters.failures.fetch_add(1, Ordering::Relaxed);
                        it.scheduled = false;
                        return;
                    }
                };
                let mut opts = WriteOptions {
                    content_type: Some(content_type(&it.key)),
                    metadata: it.metadata.clone(),
                    ..Default::default()
                };
                let secs = it
                    .mtime
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                opts.metadata.insert(MTIME_KEY.into(), secs.to_string());
                let precondition = match &it.base {
                    Some((k, g)) if *k == it.key => Precondition::GenerationMatch(*g),
                    _ => Precondition::DoesNotExist,
                };
                let job = UploadJob {
                    id: it.id,
                    key: it.key.clone(),
                    precondition,
                    opts,
                    crc32c: it.crc32c,
                };
                it.uploading = true;
                (
                    job,
                    UploadSource::new(file, it.staging.size()),
                    it.durable,
                    it.state.clone(),
                    it.staging.size(),
                )
            };
            let Ok(_slot) = self.slots.clone().acquire_owned().await else {
                return;
            };
            self.counters
                .uploading_files
                .fetch_add(1, Ordering::Relaxed);
            let record = parking_lot::Mutex::new(None::<UploadState>);
            let result = upload(
                self.store.as_ref(),
                &src,
                &job,
                &self.cfg.upload,
                &resume,
                &|state| {
                    *record.lock() = Some(state);
                },
            )
            .await;
            self.counters
                .uploading_files
                .fetch_sub(1, Ordering::Relaxed);
            let mut it = shared.item.lock().await;
            it.uploading = false;
            match result {
                Ok(outcome) => {
                    let meta = match outcome {
                        Outcome::Uploaded(meta) => {
                            it.base = Some((meta.key.clone(), meta.generation));
                            Some(meta)
                        }
                        Outcome::Conflict(saved) => {
                            self.counters.conflicts.fetch_add(1, Ordering::Relaxed);
                            tracing::error!(key = %it.key, saved_as = %saved.key, "conflict: our version was saved beside the bucket's");
                            // Later changes to this file start from whatever is now in the bucket.
                            it.base = None;
                            None
                        }
                    };
                    it.uploaded = version;
                    it.failures = 0;
                    it.state = UploadState::Staged;
                    self.counters.record_upload(size);
                    if it.durable == version {
                        let _ = self.journal.remove(it.id);
                    }
                    (self.on_settled)(&it.key, meta.as_ref());
                    shared.progress.send_modify(|p| {
                        p.uploaded = version;
                        p.error = None;
                        p.attempts += 1;
                    });
                }
                Err(e) => {
                    self.counters.failures.fetch_add(1, Ordering::Relaxed);
                    it.failures += 1;
                    if let Some(state) = record.into_inner() {
                        it.state = state;
                        let _ = self.journal.put(&Self::record(&it));
                    }
                    let backoff = self
                        .cfg
                        .retry_initial
                        .saturating_mul(1 << it.failures.min(9))
                        .min(self.cfg.retry_max);
                    tracing::warn!(key = %it.key, error = %e, retry_in = ?backoff, "upload failed; the file stays staged and will be retried");
                    it.due = Some(Instant::now() + backoff);
                    shared.progress.send_modify(|p| {
                        p.error = Some(e.to_string());
                        p.failed_version = version;
                        p.attempts += 1;
                    });
                }
            }
        }
    }

    /// Waits until every committed change is in the bucket (or has failed at least once, with
    /// `give_up_on_failure`). Returns the number of files still pending.
    pub async fn drain(self: &Arc<Self>, give_up_on_failure: bool) -> usize {
        loop {
            let items: Vec<Arc<Shared>> = self.by_key.lock().values().cloned().collect();
            let mut pending = 0;
            let mut failed = 0;
            for shared in &items {
                let it = shared.item.lock().await;
                if !it.unlinked && it.durable > it.uploaded {
                    pending += 1;
                    if it.failures > 0 {
                        failed += 1;
                    }
                }
            }
            if pending == 0 || (give_up_on_failure && failed == pending) {
                return pending;
            }
            for shared in items {
                self.schedule(shared, true).await;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Counters and pending work, for `status`.
    pub async fn status(&self) -> Status {
        let items: Vec<Arc<Shared>> = self.by_key.lock().values().cloned().collect();
        let mut s = Status {
            uploading_files: self.counters.uploading_files.load(Ordering::Relaxed),
            uploaded_files: self.counters.uploaded_files.load(Ordering::Relaxed),
            uploaded_bytes: self.counters.uploaded_bytes.load(Ordering::Relaxed),
            conflicts: self.counters.conflicts.load(Ordering::Relaxed),
            failures: self.counters.failures.load(Ordering::Relaxed),
            upload_rate: self.counters.rate(),
            ..Default::default()
        };
        for shared in items {
            let it = shared.item.lock().await;
            if !it.unlinked && it.version > it.uploaded {
                s.pending_files += 1;
                s.pending_bytes += it.staging.size();
                if it.version > it.durable {
                    s.unsaved_files += 1;
                } else if it.failures > 0 {
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
