//! The facade the adapters call: one method per kernel operation, in platform-neutral terms.
//!
//! It owns the open-handle tables and wires the namespace to the read path and the write path.
//! Adapters translate kernel requests into these calls and errors into errno or NTSTATUS through
//! [`FsError`](crate::error::FsError); they make no decisions of their own.
//!
//! A file being written (it has a write-back item) is served from its staging file for every
//! handle, readers included, so readers see their own writes; its size and mtime override the
//! bucket's until it is uploaded and closed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::config::MountConfig;
use crate::error::{FsError, FsResult};
use crate::namespace::{names, Attr, DirEntry, DirStream, Entry, Ino, Kind, Namespace};
use crate::read::{PrefetchConfig, ReadBudget, Reader};
use crate::store::{
    ListRequest, ObjectMeta, ObjectStore, Posix, Precondition, StoreErrorKind, WriteOptions,
    MTIME_KEY, SYMLINK_KEY,
};
use crate::write::writeback::{ItemRef, LocalAttr, Status, WriteBack, WriteConfig};

/// The result of opening a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    pub fh: u64,
    /// The kernel may keep page-cache contents from earlier opens: the generation is unchanged.
    pub keep_cache: bool,
}

/// How a file is opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenMode {
    pub write: bool,
    pub truncate: bool,
}

/// Numbers for `statfs`.
#[derive(Debug, Clone, Copy)]
pub struct StatFs {
    pub block_size: u32,
    pub blocks: u64,
    pub blocks_free: u64,
    pub files: u64,
    pub files_free: u64,
    pub name_max: u32,
}

enum FileIo<S: ObjectStore> {
    Read(Box<tokio::sync::Mutex<Reader<S>>>),
    Staged { item: ItemRef, writable: bool },
}

struct OpenFile<S: ObjectStore> {
    ino: Ino,
    io: FileIo<S>,
}

/// Reserved key prefix (under the mount prefix) for temporary upload parts; hidden from listings.
pub const TEMP_DIR: &str = ".bucketdrive-parts";

/// One mounted bucket.
pub struct Filesystem<S: ObjectStore> {
    cfg: Arc<MountConfig>,
    ns: Namespace<S>,
    budget: ReadBudget,
    prefetch: PrefetchConfig,
    write: Option<Arc<WriteBack<S>>>,
    files: Mutex<HashMap<u64, Arc<OpenFile<S>>>>,
    dirs: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<DirStream>>>>,
    next_fh: AtomicU64,
}

fn local_entry(key: &str, la: LocalAttr) -> Entry {
    let mut metadata = HashMap::new();
    la.posix.to_metadata(&mut metadata);
    Entry::File(Arc::new(ObjectMeta {
        key: key.to_string(),
        generation: 0,
        metageneration: 0,
        size: la.size,
        crc32c: None,
        updated: la.mtime,
        content_type: None,
        metadata,
    }))
}

impl<S: ObjectStore> Filesystem<S> {
    /// A read-only filesystem: every change fails with `EROFS`.
    pub fn new(store: Arc<S>, cfg: MountConfig) -> Self {
        let cfg = Arc::new(cfg);
        Filesystem {
            budget: ReadBudget::new(cfg.max_read_memory),
            prefetch: PrefetchConfig::new(cfg.read_part_size, cfg.read_concurrency),
            ns: Namespace::new(store, cfg.clone()),
            cfg,
            write: None,
            files: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
        }
    }

    /// A writable filesystem staging writes in `wcfg.cache_dir`. Fails if the cache directory
    /// cannot be used (for example, another mount holds it).
    pub fn with_write(
        store: Arc<S>,
        cfg: MountConfig,
        mut wcfg: WriteConfig,
    ) -> Result<Self, String> {
        let mut fs = Self::new(store.clone(), cfg);
        wcfg.upload.temp_prefix = format!("{}{TEMP_DIR}/", fs.cfg.prefix);
        fs.write = Some(WriteBack::new(store, wcfg, fs.ns.settle_hook())?);
        Ok(fs)
    }

    /// Replays the journal (uploading what a crash left staged) and removes temporary parts of
    /// earlier runs. Returns how many staged files were replayed.
    pub async fn start(&self) -> Result<usize, String> {
        let Some(w) = &self.write else { return Ok(0) };
        let n = w.replay().await?;
        w.remove_orphan_parts().await;
        Ok(n)
    }

    pub fn config(&self) -> &MountConfig {
        &self.cfg
    }

    pub fn budget(&self) -> &ReadBudget {
        &self.budget
    }

    pub fn namespace(&self) -> &Namespace<S> {
        &self.ns
    }

    pub fn is_read_only(&self) -> bool {
        self.write.is_none()
    }

    fn writer(&self) -> FsResult<&Arc<WriteBack<S>>> {
        self.write.as_ref().ok_or(FsError::ReadOnly)
    }

    fn child_path(&self, parent: Ino, name: &str) -> FsResult<String> {
        let (dir, kind) = self.ns.inode_path(parent)?;
        if kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        names::check_component(name).map_err(|_| FsError::InvalidName(name.to_string()))?;
        Ok(names::join(&dir, name))
    }

    async fn local_attr(&self, key: &str) -> Option<LocalAttr> {
        match &self.write {
            Some(w) => w.local_attr(key).await,
            None => None,
        }
    }

    /// What is at `path`: a file being written, or what the namespace says.
    async fn entry_at(&self, path: &str) -> FsResult<Entry> {
        let key = self.ns.key_of(path);
        if let Some(la) = self.local_attr(&key).await {
            return Ok(local_entry(&key, la));
        }
        self.ns.resolve(path).await
    }

    pub async fn lookup(&self, parent: Ino, name: &str) -> FsResult<Attr> {
        if names::check_component(name).is_err() {
            return Err(FsError::NotFound);
        }
        let path = self.child_path(parent, name)?;
        let key = self.ns.key_of(&path);
        if let Some(la) = self.local_attr(&key).await {
            return Ok(self.ns.register(&path, &local_entry(&key, la), 1));
        }
        self.ns.lookup(parent, name).await
    }

    pub async fn getattr(&self, ino: Ino) -> FsResult<Attr> {
        let (path, kind) = match self.ns.inode_path(ino) {
            Ok(found) => found,
            Err(e) => return self.ns.detached_attr(ino).ok_or(e),
        };
        if kind == Kind::File {
            let key = self.ns.key_of(&path);
            if let Some(la) = self.local_attr(&key).await {
                return Ok(self.ns.register(&path, &local_entry(&key, la), 0));
            }
        }
        self.ns.getattr(ino).await
    }

    pub fn forget(&self, ino: Ino, n: u64) {
        self.ns.forget(ino, n);
    }

    fn add_handle(&self, ino: Ino, io: FileIo<S>) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.files.lock().insert(fh, Arc::new(OpenFile { ino, io }));
        fh
    }

    fn handle(&self, fh: u64) -> FsResult<Arc<OpenFile<S>>> {
        self.files
            .lock()
            .get(&fh)
            .cloned()
            .ok_or(FsError::BadHandle)
    }

    /// Opens a file. Writing or truncating needs a writable mount.
    pub async fn open(&self, ino: Ino, mode: OpenMode) -> FsResult<Opened> {
        let (path, kind) = self.ns.inode_path(ino)?;
        if kind == Kind::Dir {
            return Err(FsError::IsDir);
        }
        let key = self.ns.key_of(&path);
        if mode.write || mode.truncate {
            let w = self.writer()?;
            // Resolved even when an item exists: it may retire before `open` takes it, and a
            // new item must then start from what is in the bucket.
            let base = match self.ns.resolve(&path).await {
                Ok(Entry::File(m)) => Some(m),
                Ok(Entry::Dir) => return Err(FsError::IsDir),
                Err(FsError::NotFound) => None,
                Err(e) => return Err(e),
            };
            let item = w.open(&key, base.as_deref(), mode.truncate).await?;
            let fh = self.add_handle(
                ino,
                FileIo::Staged {
                    item,
                    writable: mode.write,
                },
            );
            return Ok(Opened {
                fh,
                keep_cache: false,
            });
        }
        if let Some(w) = &self.write {
            // Only a live item: one retiring between a check and `open` would otherwise be
            // replaced by a new, empty one, and the reader would see an empty file.
            if let Some(item) = w.open_existing(&key).await {
                let fh = self.add_handle(
                    ino,
                    FileIo::Staged {
                        item,
                        writable: false,
                    },
                );
                return Ok(Opened {
                    fh,
                    keep_cache: false,
                });
            }
        }
        let (meta, keep_cache) = self.ns.open_file(ino).await?;
        let reader = Reader::new(
            self.ns.store().clone(),
            &meta,
            self.budget.clone(),
            self.prefetch,
        );
        let fh = self.add_handle(ino, FileIo::Read(Box::new(tokio::sync::Mutex::new(reader))));
        Ok(Opened { fh, keep_cache })
    }

    /// Creates and opens a new, empty file.
    pub async fn create(&self, parent: Ino, name: &str) -> FsResult<(Attr, Opened)> {
        let w = self.writer()?;
        let path = self.child_path(parent, name)?;
        if let Ok(Entry::Dir) = self.entry_at(&path).await {
            return Err(FsError::IsDir);
        }
        let key = self.ns.key_of(&path);
        let base = match self.ns.resolve(&path).await {
            Ok(Entry::File(m)) => Some(m),
            _ => None,
        };
        let item = w.open(&key, base.as_deref(), true).await?;
        self.ns.forget_tree(&path);
        let la = LocalAttr {
            size: 0,
            mtime: SystemTime::now(),
            posix: Posix::default(),
        };
        let attr = self.ns.register(&path, &local_entry(&key, la), 1);
        let fh = self.add_handle(
            attr.ino,
            FileIo::Staged {
                item,
                writable: true,
            },
        );
        Ok((
            attr,
            Opened {
                fh,
                keep_cache: false,
            },
        ))
    }

    pub async fn read(&self, fh: u64, offset: u64, size: u32) -> FsResult<Bytes> {
        let file = self.handle(fh)?;
        match &file.io {
            FileIo::Read(reader) => {
                let result = reader.lock().await.read(offset, size).await;
                if matches!(result, Err(FsError::Stale)) {
                    self.ns.invalidate(file.ino);
                }
                result
            }
            FileIo::Staged { item, .. } => {
                Ok(Bytes::from(self.writer()?.read(item, offset, size).await?))
            }
        }
    }

    pub async fn write(&self, fh: u64, offset: u64, data: &[u8]) -> FsResult<u32> {
        let file = self.handle(fh)?;
        match &file.io {
            FileIo::Staged {
                item,
                writable: true,
            } => {
                self.writer()?.write(item, offset, data).await?;
                Ok(data.len() as u32)
            }
            _ => Err(FsError::BadHandle),
        }
    }

    /// A `close()` of one descriptor: written data becomes durable and its upload is scheduled
    /// (or done, with upload-on-close).
    pub async fn flush(&self, fh: u64) -> FsResult<()> {
        let file = self.handle(fh)?;
        match &file.io {
            FileIo::Staged {
                item,
                writable: true,
            } => self.writer()?.close(item).await,
            _ => Ok(()),
        }
    }

    /// Returns once the file's data is in the bucket.
    pub async fn fsync(&self, fh: u64) -> FsResult<()> {
        let file = self.handle(fh)?;
        match &file.io {
            FileIo::Staged { item, .. } => self.writer()?.flush_to_bucket(item).await,
            FileIo::Read(_) => Ok(()),
        }
    }

    pub async fn release(&self, fh: u64) {
        let Some(file) = self.files.lock().remove(&fh) else {
            return;
        };
        if let (FileIo::Staged { item, .. }, Some(w)) = (&file.io, &self.write) {
            w.release(item).await;
        }
    }

    /// Changes size and/or modification time. chmod and chown are accepted and ignored by the
    /// adapters (see docs/semantics.md).
    pub async fn setattr(
        &self,
        ino: Ino,
        size: Option<u64>,
        mtime: Option<SystemTime>,
        fh: Option<u64>,
    ) -> FsResult<Attr> {
        tracing::debug!(ino, ?size, ?mtime, ?fh, "setattr");
        let (path, kind) = self.ns.inode_path(ino)?;
        if kind == Kind::Dir {
            if size.is_some() {
                return Err(FsError::IsDir);
            }
            return self.getattr(ino).await;
        }
        if kind == Kind::Symlink {
            // A link's own times and owner are accepted and ignored, like a directory's.
            return self.getattr(ino).await;
        }
        let current = self.getattr(ino).await?;
        // The kernel's write-back cache flushes an inode's times after writes and renames; a
        // time the file already has (to the second, as stored) changes nothing.
        let same_time = mtime.is_none_or(|t| same_second(t, current.mtime));
        if size.is_none() && same_time {
            return Ok(current);
        }
        let w = self.writer()?;
        let key = self.ns.key_of(&path);
        let (held, unchanged) = self.held_item(fh, &key).await?;
        if size.is_none() && unchanged {
            // Only the time of a file as it is in the bucket (`touch` opens it first): patch
            // its metadata, no upload.
            if let (Some(t), Ok(Entry::File(m))) = (mtime, self.ns.resolve(&path).await) {
                let mut md = HashMap::new();
                md.insert(MTIME_KEY.to_string(), unix_secs(t).to_string());
                return self.patch_metadata(ino, &path, &key, &m, &md).await;
            }
        }
        let (item, temporary) = match held {
            Some(item) => (item, false),
            None => {
                let base = match self.ns.resolve(&path).await {
                    Ok(Entry::File(m)) => Some(m),
                    Ok(Entry::Dir) => return Err(FsError::IsDir),
                    // Staged but not yet in the bucket (`getattr` above found it).
                    Err(FsError::NotFound) => None,
                    Err(e) => return Err(e),
                };
                (w.open(&key, base.as_deref(), size == Some(0)).await?, true)
            }
        };
        let result = async {
            if let Some(len) = size {
                w.truncate(&item, len).await?;
            }
            if let Some(t) = mtime {
                w.set_mtime(&item, t).await;
            }
            if temporary {
                w.close(&item).await?;
            }
            Ok::<(), FsError>(())
        }
        .await;
        if temporary {
            w.release(&item).await;
        }
        result?;
        self.getattr(ino).await
    }

    /// The writable item `fh` holds, if any, and whether the file is still as it is in the
    /// bucket (nothing changed through that item, or through any item of `key` without one).
    async fn held_item(&self, fh: Option<u64>, key: &str) -> FsResult<(Option<ItemRef>, bool)> {
        let w = self.writer()?;
        let held = fh
            .and_then(|fh| self.handle(fh).ok())
            .and_then(|f| match &f.io {
                FileIo::Staged {
                    item,
                    writable: true,
                } => Some(item.clone()),
                _ => None,
            });
        let unchanged = match &held {
            Some(item) => w.is_unchanged(item).await,
            None => w.key_unchanged(key).await,
        };
        Ok((held, unchanged))
    }

    /// chmod and chown. With `--posix-metadata` they are stored in `goog-reserved-posix-*`
    /// metadata (a metadata patch for a file in the bucket, or with the pending upload);
    /// otherwise, and for directories and links, they are accepted and ignored.
    pub async fn set_posix(&self, ino: Ino, posix: Posix, fh: Option<u64>) -> FsResult<Attr> {
        let (path, kind) = self.ns.inode_path(ino)?;
        if !self.cfg.posix_metadata || kind != Kind::File || posix.is_empty() {
            return self.getattr(ino).await;
        }
        let w = self.writer()?;
        let key = self.ns.key_of(&path);
        let (held, unchanged) = self.held_item(fh, &key).await?;
        if unchanged {
            if let Entry::File(m) = self.ns.resolve(&path).await? {
                let mut md = HashMap::new();
                posix.to_metadata(&mut md);
                let attr = self.patch_metadata(ino, &path, &key, &m, &md).await?;
                w.note_patched(&key, posix).await;
                return Ok(attr);
            }
        }
        if let Some(item) = held {
            w.set_posix(&item, posix, true).await;
            return self.getattr(ino).await;
        }
        // Staged and not in the bucket yet: the change goes up with the file.
        let item = w.open(&key, None, false).await?;
        w.set_posix(&item, posix, true).await;
        let closed = w.close(&item).await;
        w.release(&item).await;
        closed?;
        self.getattr(ino).await
    }

    /// Sets metadata of the object `m` at `path` in place.
    async fn patch_metadata(
        &self,
        ino: Ino,
        path: &str,
        key: &str,
        m: &ObjectMeta,
        md: &HashMap<String, String>,
    ) -> FsResult<Attr> {
        match self.ns.store().update_metadata(key, m.generation, md).await {
            Ok(new) => self.ns.note(path, Entry::File(Arc::new(new))),
            Err(e) if e.kind == StoreErrorKind::PreconditionFailed => {
                self.ns.forget_tree(path);
                return Err(FsError::Stale);
            }
            Err(e) => return Err(e.into()),
        }
        self.getattr(ino).await
    }

    /// `Exists` if anything (in the bucket or being written) has the name `path`.
    async fn ensure_absent(&self, path: &str) -> FsResult<()> {
        match self.entry_at(path).await {
            Ok(_) => Err(FsError::Exists),
            Err(FsError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Creates a directory: a marker object `dir/`.
    pub async fn mkdir(&self, parent: Ino, name: &str) -> FsResult<Attr> {
        self.writer()?;
        let path = self.child_path(parent, name)?;
        self.ensure_absent(&path).await?;
        let marker = format!("{}/", self.ns.key_of(&path));
        match self
            .ns
            .store()
            .put(
                &marker,
                Bytes::new(),
                Precondition::DoesNotExist,
                &WriteOptions::default(),
            )
            .await
        {
            Ok(_) => {}
            Err(e) if e.kind == StoreErrorKind::PreconditionFailed => return Err(FsError::Exists),
            Err(e) => return Err(e.into()),
        }
        self.ns.note(&path, Entry::Dir);
        self.ns.note_empty_dir(&path);
        Ok(self.ns.register(&path, &Entry::Dir, 1))
    }

    /// Whether the directory at `path` has anything in it, in the bucket or being written.
    async fn dir_has_children(&self, path: &str) -> FsResult<bool> {
        let prefix = format!("{}/", self.ns.key_of(path));
        if self
            .write
            .as_ref()
            .is_some_and(|w| w.has_local_under(&prefix))
        {
            return Ok(true);
        }
        let req = ListRequest {
            prefix: prefix.clone(),
            delimiter: Some("/".into()),
            max_results: Some(2),
            page_token: None,
        };
        let page = self.ns.store().list(&req).await?;
        Ok(!page.prefixes.is_empty() || page.objects.iter().any(|o| o.key != prefix))
    }

    pub async fn rmdir(&self, parent: Ino, name: &str) -> FsResult<()> {
        self.writer()?;
        let path = self.child_path(parent, name)?;
        match self.entry_at(&path).await? {
            Entry::File(_) => return Err(FsError::NotDir),
            Entry::Dir => {}
        }
        if self.dir_has_children(&path).await? {
            return Err(FsError::NotEmpty);
        }
        let marker = format!("{}/", self.ns.key_of(&path));
        match self.ns.store().delete(&marker, Precondition::None).await {
            Ok(()) => {}
            Err(e) if e.kind == StoreErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        self.ns.note_missing(&path);
        self.ns.detach(&path);
        Ok(())
    }

    /// Deletes a file, with a generation precondition: a newer object written by someone else
    /// is not deleted (`ESTALE`).
    pub async fn unlink(&self, parent: Ino, name: &str) -> FsResult<()> {
        let w = self.writer()?;
        let path = self.child_path(parent, name)?;
        let key = self.ns.key_of(&path);
        let had_local = w.unlink(&key).await;
        match self.ns.resolve(&path).await {
            Ok(Entry::Dir) => return Err(FsError::IsDir),
            Ok(Entry::File(m)) => match self
                .ns
                .store()
                .delete(&key, Precondition::GenerationMatch(m.generation))
                .await
            {
                Ok(()) => {}
                Err(e) if e.kind == StoreErrorKind::NotFound => {}
                Err(e) if e.kind == StoreErrorKind::PreconditionFailed => {
                    self.ns.forget_tree(&path);
                    return Err(FsError::Stale);
                }
                Err(e) => return Err(e.into()),
            },
            Err(FsError::NotFound) if had_local => {}
            Err(e) => return Err(e),
        }
        self.ns.note_missing(&path);
        self.ns.detach(&path);
        Ok(())
    }

    /// Renames a file (server-side copy, then delete of the source) or a directory (object by
    /// object, not atomic, up to the configured limit; beyond it `EXDEV`).
    pub async fn rename(
        &self,
        parent: Ino,
        name: &str,
        new_parent: Ino,
        new_name: &str,
    ) -> FsResult<()> {
        self.writer()?;
        let from = self.child_path(parent, name)?;
        let to = self.child_path(new_parent, new_name)?;
        if from == to {
            return Ok(());
        }
        match self.entry_at(&from).await? {
            Entry::Dir => self.rename_dir(&from, &to).await?,
            Entry::File(_) => self.rename_file(&from, &to).await?,
        }
        self.ns.rename_inode(&from, &to);
        Ok(())
    }

    async fn rename_file(&self, from: &str, to: &str) -> FsResult<()> {
        let w = self.writer()?;
        let (src_key, dst_key) = (self.ns.key_of(from), self.ns.key_of(to));
        // No upload of either name may start or land while the rename runs.
        let paused = (w.pause(&src_key).await, w.pause(&dst_key).await);
        let result = self.rename_file_paused(from, to, &src_key, &dst_key).await;
        w.resume(paused.0).await;
        w.resume(paused.1).await;
        result
    }

    async fn rename_file_paused(
        &self,
        from: &str,
        to: &str,
        src_key: &str,
        dst_key: &str,
    ) -> FsResult<()> {
        let w = self.writer()?;
        let (src_key, dst_key) = (src_key.to_string(), dst_key.to_string());
        let src_meta = match self.ns.resolve(from).await {
            Ok(Entry::File(m)) => Some(m),
            Ok(Entry::Dir) => return Err(FsError::IsDir),
            Err(FsError::NotFound) => None,
            Err(e) => return Err(e),
        };
        let dst_meta = match self.entry_at(to).await {
            Ok(Entry::Dir) => return Err(FsError::IsDir),
            Ok(Entry::File(_)) => match self.ns.resolve(to).await {
                Ok(Entry::File(m)) => Some(m),
                _ => None,
            },
            Err(FsError::NotFound) => None,
            Err(e) => return Err(e),
        };
        let src_local = w.item(&src_key).is_some();
        if src_meta.is_none() && !src_local {
            return Err(FsError::NotFound);
        }
        match &src_meta {
            Some(m) => {
                let pre = dst_meta.as_ref().map_or(Precondition::DoesNotExist, |d| {
                    Precondition::GenerationMatch(d.generation)
                });
                let copied = self
                    .ns
                    .store()
                    .copy(&src_key, m.generation, &dst_key, pre)
                    .await
                    .map_err(|e| {
                        if e.kind == StoreErrorKind::PreconditionFailed {
                            FsError::Stale
                        } else {
                            e.into()
                        }
                    })?;
                match self
                    .ns
                    .store()
                    .delete(&src_key, Precondition::GenerationMatch(m.generation))
                    .await
                {
                    Ok(()) => {}
                    Err(e) if e.kind == StoreErrorKind::NotFound => {}
                    Err(e) => return Err(e.into()),
                }
                if src_local {
                    w.rename(&src_key, &dst_key, Some(&copied)).await?;
                } else {
                    w.unlink(&dst_key).await;
                }
                self.ns.note(to, Entry::File(Arc::new(copied)));
            }
            None => {
                // Only staged so far: the pending upload follows the new name, replacing what
                // is there now.
                w.rename(&src_key, &dst_key, dst_meta.as_deref()).await?;
                self.ns.forget_tree(to);
            }
        }
        self.ns.note_missing(from);
        Ok(())
    }

    async fn rename_dir(&self, from: &str, to: &str) -> FsResult<()> {
        let w = self.writer()?;
        match self.entry_at(to).await {
            Ok(Entry::File(_)) => return Err(FsError::NotDir),
            Ok(Entry::Dir) if self.dir_has_children(to).await? => return Err(FsError::NotEmpty),
            Ok(Entry::Dir) | Err(FsError::NotFound) => {}
            Err(e) => return Err(e),
        }
        let src_prefix = format!("{}/", self.ns.key_of(from));
        let dst_prefix = format!("{}/", self.ns.key_of(to));
        // Everything under the directory, at any depth; refuse before copying anything if it
        // is over the limit.
        let mut objects = Vec::new();
        let mut token = None;
        loop {
            let req = ListRequest {
                prefix: src_prefix.clone(),
                delimiter: None,
                page_token: token,
                max_results: Some(1000),
            };
            let page = self.ns.store().list(&req).await?;
            objects.extend(page.objects);
            if objects.len() > self.cfg.rename_dir_limit {
                return Err(FsError::CrossDevice);
            }
            token = page.next_page_token;
            if token.is_none() {
                break;
            }
        }
        let mut copied = HashMap::new();
        for o in &objects {
            let dest = format!("{dst_prefix}{}", &o.key[src_prefix.len()..]);
            let meta = self
                .ns
                .store()
                .copy(&o.key, o.generation, &dest, Precondition::None)
                .await?;
            copied.insert(o.key.clone(), meta);
        }
        for o in &objects {
            match self
                .ns
                .store()
                .delete(&o.key, Precondition::GenerationMatch(o.generation))
                .await
            {
                Ok(()) => {}
                Err(e) if e.kind == StoreErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
        for (key, _) in w.local_under(&src_prefix).await {
            let dest = format!("{dst_prefix}{}", &key[src_prefix.len()..]);
            w.rename(&key, &dest, copied.get(&key)).await?;
        }
        if !copied.contains_key(&src_prefix) {
            // Keep the new directory visible even if nothing of it is in the bucket yet.
            let _ = self
                .ns
                .store()
                .put(
                    &dst_prefix,
                    Bytes::new(),
                    Precondition::None,
                    &WriteOptions::default(),
                )
                .await;
        }
        self.ns.forget_tree(from);
        self.ns.forget_tree(to);
        Ok(())
    }

    pub async fn opendir(&self, ino: Ino) -> FsResult<u64> {
        let (path, _) = self.ns.inode_path(ino)?;
        let mut local = Vec::new();
        if let Some(w) = &self.write {
            let prefix = self.ns.dir_key_prefix(&path);
            for (name, la) in w.local_children(&prefix).await {
                local.push((name.clone(), local_entry(&format!("{prefix}{name}"), la)));
            }
        }
        let stream = self.ns.open_dir(ino, local)?;
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.dirs
            .lock()
            .insert(fh, Arc::new(tokio::sync::Mutex::new(stream)));
        Ok(fh)
    }

    /// Entries after `offset`. With `plus`, the caller must call [`Self::remember`] for each
    /// entry it hands to the kernel (other than `.` and `..`).
    pub async fn readdir(&self, fh: u64, offset: u64) -> FsResult<Vec<DirEntry>> {
        let stream = self
            .dirs
            .lock()
            .get(&fh)
            .cloned()
            .ok_or(FsError::BadHandle)?;
        let mut stream = stream.lock().await;
        let mut entries = self.ns.read_dir(&mut stream, offset).await?;
        // Temporary upload parts live under the mount root's TEMP_DIR: not the user's files.
        entries.retain(|e| {
            e.name != TEMP_DIR
                || self
                    .ns
                    .inode_path(e.attr.ino)
                    .map_or(true, |(p, _)| p != TEMP_DIR)
        });
        Ok(entries)
    }

    /// The kernel took a reference to `ino` through `readdirplus`.
    pub fn remember(&self, ino: Ino) {
        self.ns.add_lookup(ino);
    }

    pub fn releasedir(&self, fh: u64) {
        self.dirs.lock().remove(&fh);
    }

    pub fn statfs(&self) -> StatFs {
        let block_size = 4096u32;
        let free_blocks = self.cfg.reported_free_bytes / u64::from(block_size);
        StatFs {
            block_size,
            blocks: free_blocks,
            blocks_free: free_blocks,
            files: 1 << 32,
            files_free: 1 << 32,
            name_max: crate::namespace::names::NAME_MAX as u32,
        }
    }

    /// Creates a symbolic link: an empty object whose metadata holds the target (the format is
    /// gcsfuse's, see [`SYMLINK_KEY`] and docs/semantics.md).
    pub async fn symlink(&self, parent: Ino, name: &str, target: &str) -> FsResult<Attr> {
        self.writer()?;
        let path = self.child_path(parent, name)?;
        self.ensure_absent(&path).await?;
        let now = SystemTime::now();
        let secs = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let opts = WriteOptions {
            metadata: [
                (SYMLINK_KEY.to_string(), target.to_string()),
                (MTIME_KEY.to_string(), secs.to_string()),
            ]
            .into(),
            ..WriteOptions::default()
        };
        let key = self.ns.key_of(&path);
        let meta = match self
            .ns
            .store()
            .put(&key, Bytes::new(), Precondition::DoesNotExist, &opts)
            .await
        {
            Ok(m) => m,
            Err(e) if e.kind == StoreErrorKind::PreconditionFailed => return Err(FsError::Exists),
            Err(e) => return Err(e.into()),
        };
        let entry = Entry::File(Arc::new(meta));
        self.ns.note(&path, entry.clone());
        Ok(self.ns.register(&path, &entry, 1))
    }

    /// The target of the symbolic link `ino`.
    pub async fn readlink(&self, ino: Ino) -> FsResult<String> {
        let (path, kind) = self.ns.inode_path(ino)?;
        if kind != Kind::Symlink {
            return Err(FsError::NotSymlink);
        }
        match self.ns.resolve(&path).await? {
            Entry::File(m) => m
                .metadata
                .get(SYMLINK_KEY)
                .cloned()
                .ok_or(FsError::NotSymlink),
            Entry::Dir => Err(FsError::NotSymlink),
        }
    }

    /// Operations the filesystem does not support: hard links and special files.
    pub fn unsupported(&self) -> FsError {
        if self.write.is_none() {
            FsError::ReadOnly
        } else {
            FsError::Unsupported
        }
    }

    /// Waits until every committed change is in the bucket. Returns files still pending (only
    /// non-zero with `give_up_on_failure`, when all that remains has failed at least once).
    pub async fn drain(&self, give_up_on_failure: bool) -> usize {
        match &self.write {
            Some(w) => w.drain(give_up_on_failure).await,
            None => 0,
        }
    }

    pub async fn write_status(&self) -> Status {
        match &self.write {
            Some(w) => w.status().await,
            None => Status::default(),
        }
    }

    /// Number of open file handles.
    pub fn open_files(&self) -> usize {
        self.files.lock().len()
    }
}

#[cfg(test)]
mod tests;

/// Whether two times fall in the same whole second (object metadata keeps mtimes to the second).
fn same_second(a: SystemTime, b: SystemTime) -> bool {
    let secs = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .ok()
    };
    secs(a) == secs(b)
}

/// Whole seconds since the epoch, as object metadata stores times.
fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
