//! Open files: the handle table, and open, create, read, write, flush (close), fsync and
//! release.
//!
//! A handle reads the bucket through a read-ahead [`Reader`] pinned to one generation (and
//! through the disk read cache, if the mount has one), or, for a file being written, the
//! item's staged copy (so readers see their own writes).
//!
//! An exclusive create (`O_EXCL`, `CREATE_NEW`) never empties a name that exists. It is
//! decided here, on this mount, without a bucket request, unless the mount claims names in the
//! bucket (`--exclusive-create`): then the claim, an empty object made only if the name is
//! free, is what makes one name created on two machines go to exactly one of them (I12).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;

use super::passthrough::Counted;
use super::{local_entry, CreateFlags, FileIo, Filesystem, KernelIo, OpenFile, OpenMode, Opened};
use crate::error::{FsError, FsResult};
use crate::namespace::{Attr, Entry, Ino, Kind};
use crate::read::Reader;
use crate::store::{ObjectMeta, ObjectStore, Posix, Precondition, StoreErrorKind, WRITER_KEY};
use crate::write::writeback::{ItemRef, LocalAttr, WriteBack};

impl<S: ObjectStore> Filesystem<S> {
    fn add_handle(&self, ino: Ino, io: FileIo<S>, counted: Counted, opener: Option<u32>) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let through = std::sync::atomic::AtomicBool::new(counted == Counted::Through);
        let file = OpenFile {
            ino,
            io,
            through,
            opener,
            opener_closed: std::sync::atomic::AtomicBool::new(false),
        };
        self.files.lock().insert(fh, Arc::new(file));
        fh
    }

    pub(super) fn handle(&self, fh: u64) -> FsResult<Arc<OpenFile<S>>> {
        self.files
            .lock()
            .get(&fh)
            .cloned()
            .ok_or(FsError::BadHandle)
    }

    /// Opens a file. Writing or truncating needs a writable mount. A file being written is
    /// opened from its staged copy without a bucket request, so it opens even while the bucket
    /// is unreachable.
    pub async fn open(&self, ino: Ino, mode: OpenMode) -> FsResult<Opened> {
        let (path, kind) = self.ns.inode_path(ino)?;
        if kind == Kind::Dir {
            return Err(FsError::IsDir);
        }
        let key = self.ns.key_of(&path);
        if mode.write || mode.truncate {
            // Refused before anything changes while readers pass through the file.
            let _change = self.pt.begin_change(&key, Some(ino)).await?;
            let item = self.open_item(&path, &key, mode.truncate).await?;
            return self
                .staged_handle(ino, item, mode.write, mode.process)
                .await;
        }
        if let Some(w) = &self.write {
            // Only a live item: one retiring meanwhile would otherwise be replaced by a new,
            // empty one, and the reader would see an empty file.
            if let Some(item) = w.open_existing(&key).await {
                return self.staged_handle(ino, item, false, None).await;
            }
        }
        let (meta, keep_cache) = self.ns.open_file(ino).await?;
        // The disk cache is keyed by the generation just opened, so it serves exactly what
        // this handle may read, and a new generation is never served an old one's bytes.
        let cache = match &self.read_cache {
            Some(c) => c.object(&self.cfg.bucket, &meta).await,
            None => None,
        };
        let reader = Reader::new(
            self.ns.store().clone(),
            &meta,
            self.budget.clone(),
            self.prefetch,
        )
        .with_cache(cache);
        // A generation wholly in the read cache, checked: the kernel may read it itself.
        let (io, counted) = match &self.read_cache {
            Some(rc) => {
                let bucket = &self.cfg.bucket;
                self.pt
                    .read_open(ino, &key, || rc.passthrough_file(bucket, &meta))
                    .await
            }
            None => self.pt.read_open(ino, &key, || async { None }).await,
        };
        let keep_cache = keep_cache && matches!(io, KernelIo::Daemon);
        let reader = FileIo::Read(Box::new(tokio::sync::Mutex::new(reader)));
        let fh = self.add_handle(ino, reader, counted, None);
        Ok(Opened { fh, keep_cache, io })
    }

    /// Takes a write handle on the file at `path`: its live item (no bucket request), or a new
    /// one starting from the object the bucket has. Only "no such object" means a new file: a
    /// transient failure must not turn an existing object into a "new file" whose upload would
    /// then fail its precondition.
    pub(super) async fn open_item(
        &self,
        path: &str,
        key: &str,
        truncate: bool,
    ) -> FsResult<ItemRef> {
        Self::not_reserved(path)?;
        let w = self.writer()?;
        if let Some(item) = w.open_existing(key).await {
            // A held file (a write to it failed) is emptied too: rewriting it whole is what
            // releases it.
            if truncate && (w.size(&item) > 0 || w.is_held(&item).await) {
                if let Err(e) = w.truncate(&item, 0).await {
                    w.release(&item).await;
                    return Err(e);
                }
            }
            return Ok(item);
        }
        let base = match self.ns.resolve(path).await {
            // The kernel's view of the name rests on another generation: someone else replaced
            // it since. Writing over (or into) theirs would replace or mix in bytes the user
            // never saw (I8, I2); ESTALE makes the kernel look the name up again.
            Ok(Entry::File(m)) if !self.ns.saw(path, &m) => {
                self.ns.detach(path);
                return Err(FsError::Stale);
            }
            Ok(Entry::File(m)) if m.metadata_trimmed => Some(self.whole_meta(path, key, &m).await?),
            Ok(Entry::File(m)) => Some(m),
            Ok(Entry::Dir) => return Err(FsError::IsDir),
            Err(FsError::NotFound) => None,
            Err(e) => return Err(e),
        };
        w.open(key, base.as_deref(), truncate).await
    }

    /// The object `m` at `path` with all its custom metadata, which the caches trimmed: its
    /// upload keeps what other tools attached to it (one request, only for objects that carry
    /// metadata we do not read). Another generation there now is someone else's replacement.
    async fn whole_meta(&self, path: &str, key: &str, m: &ObjectMeta) -> FsResult<Arc<ObjectMeta>> {
        let whole = match self.ns.store().head(key).await {
            Ok(whole) if whole.generation == m.generation => whole,
            // Replaced or deleted by someone else since the mount saw it: as for any other
            // writer's change, the kernel looks the name up again.
            Ok(_) => return Err(self.stale(path)),
            Err(e) if e.kind == StoreErrorKind::NotFound => return Err(self.stale(path)),
            Err(e) => return Err(e.into()),
        };
        Ok(Arc::new(whole))
    }

    /// Forgets what the mount knew of `path`, whose object changed under it: `Stale`.
    fn stale(&self, path: &str) -> FsError {
        self.ns.forget_tree(path);
        self.ns.detach(path);
        FsError::Stale
    }

    /// A handle on `item`, opened by `opener`. While readers of the inode pass through it is
    /// refused (and the item released).
    async fn staged_handle(
        &self,
        ino: Ino,
        item: ItemRef,
        writable: bool,
        opener: Option<u32>,
    ) -> FsResult<Opened> {
        let w = self.writer()?;
        let opened = self
            .pt
            .staged_open(
                ino,
                || w.passthrough_file(&item, ino, opener),
                |file| w.join_passthrough(&item, file, ino, opener),
            )
            .await;
        let (io, counted) = match opened {
            Ok(x) => x,
            Err(e) => {
                w.release(&item).await;
                return Err(e);
            }
        };
        Ok(Opened {
            fh: self.add_handle(ino, FileIo::Staged { item, writable }, counted, opener),
            keep_cache: false,
            io,
        })
    }

    /// Creates and opens a new, empty file (or empties the file of that name).
    pub async fn create(&self, parent: Ino, name: &str) -> FsResult<(Attr, Opened)> {
        self.create_with(parent, name, CreateFlags::default()).await
    }

    /// Creates and opens a new, empty file as `flags` ask. A plain create empties a file of
    /// that name; an exclusive one refuses a name that exists (see [`Self::create_exclusive`]).
    pub async fn create_with(
        &self,
        parent: Ino,
        name: &str,
        flags: CreateFlags,
    ) -> FsResult<(Attr, Opened)> {
        self.writer()?;
        let path = self.new_child_path(parent, name)?;
        let key = self.ns.key_of(&path);
        // A create empties a file of that name: not while readers pass through it.
        let _change = self.pt.begin_change(&key, self.ns.ino_at(&path)).await?;
        let item = if flags.exclusive {
            self.create_exclusive(&path, &key).await?
        } else {
            self.open_item(&path, &key, true).await?
        };
        self.ns.forget_tree(&path);
        // The caller's mode, when modes are stored: shown now, uploaded with the file.
        let posix = match flags.mode {
            Some(m) if self.cfg.posix_metadata => Posix {
                mode: Some(m & self.cfg.posix_mode_mask()),
                ..Posix::default()
            },
            _ => Posix::default(),
        };
        if !posix.is_empty() {
            self.writer()?.set_posix(&item, posix, true).await;
        }
        let la = LocalAttr {
            size: 0,
            mtime: crate::clock::now(),
            posix,
        };
        let attr = self.ns.register(&path, &local_entry(&key, la), 1);
        let opened = self
            .staged_handle(attr.ino, item, true, flags.process)
            .await?;
        Ok((attr, opened))
    }

    /// A write handle on a new file at `path`, or `Exists` (I12). A name this mount knows of
    /// (being written, in the bucket as the caches or a lookup say, or being created by another
    /// call now) exists. By default that is all: the create stays local and works offline, and
    /// a collision with another machine ends as the object and a conflict copy. With
    /// `--exclusive-create` the name is then claimed in the bucket (an empty object, made only
    /// if none is there) before the create returns, so of two machines exactly one wins; the
    /// file's upload replaces the claim, its precondition the claim's generation. Without the
    /// bucket there is no claim, and the create fails.
    async fn create_exclusive(&self, path: &str, key: &str) -> FsResult<ItemRef> {
        let w = self.writer()?;
        let _creating = self.claiming.take(path).ok_or(FsError::Exists)?;
        if w.local_attr(key).is_some() {
            return Err(FsError::Exists);
        }
        match self.ns.resolve(path).await {
            Ok(_) => return Err(FsError::Exists),
            Err(FsError::NotFound) => {}
            Err(e) => return Err(e),
        }
        if !self.cfg.exclusive_create {
            return w.open(key, None, true).await;
        }
        let claim = self.put_marked(path, false).await?;
        // The claim's token is the claim's, not the file's.
        let mut base = claim.clone();
        base.metadata.remove(WRITER_KEY);
        match w.open(key, Some(&base), true).await {
            Ok(item) => {
                // A change even if nothing is written: the empty file's upload replaces the
                // claim, as any file's does.
                w.set_mtime(&item, crate::clock::now()).await;
                Ok(item)
            }
            Err(e) => {
                // Nothing will be uploaded over the claim: give the name back.
                let pre = Precondition::GenerationMatch(claim.generation);
                if let Err(d) = self.ns.store().delete(key, pre).await {
                    tracing::warn!(key, error = %d, "could not remove the claim of a create that failed; an empty file stays");
                }
                self.ns.forget_tree(path);
                Err(e)
            }
        }
    }

    /// Reads from the bucket or the staged copy; the bytes returned are counted here, the one
    /// place every reader's bytes pass (`bucketdrive_read_bytes_total`).
    pub async fn read(&self, fh: u64, offset: u64, size: u32) -> FsResult<Bytes> {
        let file = self.handle(fh)?;
        let data = match &file.io {
            FileIo::Read(reader) => match self.written_here(file.ino) {
                // A writer on this mount opened the file after this reader did: like every
                // descriptor of a local file, this one reads the latest bytes written.
                Some((w, item)) => Bytes::from(w.read(&item, offset, size).await?),
                None => self.read_bucket(file.ino, reader, offset, size).await?,
            },
            FileIo::Staged { item, .. } => {
                Bytes::from(self.writer()?.read(item, offset, size).await?)
            }
        };
        crate::metrics::read_bytes(data.len() as u64);
        Ok(data)
    }

    /// The item of the file `ino` names, if this mount is writing it and `ino` still names it
    /// (not unlinked or replaced since).
    fn written_here(&self, ino: Ino) -> Option<(&Arc<WriteBack<S>>, ItemRef)> {
        let w = self.write.as_ref()?;
        let (path, _) = self.ns.inode_path(ino).ok()?;
        w.item(&self.ns.key_of(&path)).map(|item| (w, item))
    }

    /// Reads the generation the handle opened, or the one this mount uploaded since: when its
    /// own upload replaced that generation (the inode's view moved along to it), the handle
    /// moves to the new one, so what it reads is what was written here (a later size
    /// included). Someone else's replacement gives the name a new inode instead, and this
    /// handle keeps its generation (`ESTALE` once that is gone).
    async fn read_bucket(
        &self,
        ino: Ino,
        reader: &tokio::sync::Mutex<Reader<S>>,
        offset: u64,
        size: u32,
    ) -> FsResult<Bytes> {
        let mut reader = reader.lock().await;
        if let Some(meta) = self
            .ns
            .current_meta(ino)
            .filter(|m| (m.generation, m.size) != (reader.generation(), reader.object_size()))
        {
            tracing::debug!(key = %meta.key, generation = meta.generation, "a reader moves to the generation this mount uploaded");
            let cache = match &self.read_cache {
                Some(c) => c.object(&self.cfg.bucket, &meta).await,
                None => None,
            };
            *reader = Reader::new(
                self.ns.store().clone(),
                &meta,
                self.budget.clone(),
                self.prefetch,
            )
            .with_cache(cache);
        }
        let result = reader.read(offset, size).await;
        if matches!(result, Err(FsError::Stale)) {
            self.ns.invalidate(ino);
        }
        result
    }

    /// A write request's bytes, copied out of the adapter's buffer (which the kernel fills
    /// again with the next request) for a [`Self::write`] that runs later.
    pub fn write_bytes(&self, data: &[u8]) -> bytes::Bytes {
        match &self.write {
            Some(w) => w.request_bytes(data),
            None => bytes::Bytes::copy_from_slice(data),
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
                crate::metrics::written_bytes(data.len() as u64);
                Ok(data.len() as u32)
            }
            _ => Err(FsError::BadHandle),
        }
    }

    /// A `close()` of one descriptor by the process that opened it: written data becomes
    /// durable and its upload is scheduled (or done, with upload-on-close).
    pub async fn flush(&self, fh: u64) -> FsResult<()> {
        self.flush_by(fh, None).await
    }

    /// A `close()` of one descriptor by `process` (`None`: not known). The kernel reports the
    /// close of every copy of a descriptor: a child started while the file is being written
    /// closes its copy at `exec` or exit. Such a close, before the opener's own, says nothing
    /// about the file being finished, and saving there would upload it half written (and
    /// leave that version to be uploaded even when the writer's later writes fail, I10): it
    /// saves nothing. Every other close saves as always: the opener's; any close once the
    /// opener closed its copy (the child it handed the file to is the writer now, and its
    /// close is the one that reports errors and waits with upload-on-close); and any close of
    /// a file whose write or last save failed (it reports that, or saves the file if it can
    /// now, as a later close does).
    pub async fn flush_by(&self, fh: u64, process: Option<u32>) -> FsResult<()> {
        let file = self.handle(fh)?;
        let FileIo::Staged {
            item,
            writable: true,
        } = &file.io
        else {
            return Ok(());
        };
        let w = self.writer()?;
        match (file.opener, process) {
            (Some(opener), Some(closer)) if opener == closer => {
                file.opener_closed.store(true, Ordering::SeqCst);
            }
            (Some(opener), Some(closer))
                if !file.opener_closed.load(Ordering::SeqCst) && !w.save_failed(item).await =>
            {
                tracing::debug!(
                    fh,
                    opener,
                    closer,
                    "a close by another process before the opener's: not a save"
                );
                return Ok(());
            }
            _ => {}
        }
        w.close(item).await
    }

    /// Returns once the file's data is in the bucket.
    pub async fn fsync(&self, fh: u64) -> FsResult<()> {
        let file = self.handle(fh)?;
        match &file.io {
            FileIo::Staged { item, .. } => self.writer()?.flush_to_bucket(item).await,
            FileIo::Read(_) => Ok(()),
        }
    }

    /// Counts a release the adapter has received as under way, before the task that runs it
    /// ([`Filesystem::release`]) is spawned, until the returned value drops: an unmount's drain
    /// waits for it (`releasing`).
    pub fn begin_release(&self) -> super::releasing::ReleaseUnderWay {
        self.releasing.enter()
    }

    pub async fn release(&self, fh: u64) {
        let _under_way = self.releasing.enter();
        let Some(file) = self.files.lock().remove(&fh) else {
            return;
        };
        let counted = match file.through.load(Ordering::SeqCst) {
            true => Counted::Through,
            false => Counted::Other,
        };
        self.pt.release(file.ino, counted);
        if let (FileIo::Staged { item, .. }, Some(w)) = (&file.io, &self.write) {
            if counted == Counted::Through {
                w.leave_passthrough(item, || self.pt.passing_through(file.ino))
                    .await;
            }
            w.release(item).await;
        }
    }
}
