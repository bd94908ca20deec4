//! Open files: the handle table, and open, create, read, write, flush (close), fsync and
//! release.
//!
//! A handle reads the bucket through a read-ahead [`Reader`] pinned to one generation (and
//! through the disk read cache, if the mount has one), or, for a file being written, the
//! item's staged copy (so readers see their own writes).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;

use super::{local_entry, FileIo, Filesystem, OpenFile, OpenMode, Opened};
use crate::error::{FsError, FsResult};
use crate::namespace::{Attr, Entry, Ino, Kind};
use crate::read::Reader;
use crate::store::{ObjectStore, Posix};
use crate::write::writeback::{ItemRef, LocalAttr};

impl<S: ObjectStore> Filesystem<S> {
    fn add_handle(&self, ino: Ino, io: FileIo<S>) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.files.lock().insert(fh, Arc::new(OpenFile { ino, io }));
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
            let item = self.open_item(&path, &key, mode.truncate).await?;
            return Ok(self.staged_handle(ino, item, mode.write));
        }
        if let Some(w) = &self.write {
            // Only a live item: one retiring meanwhile would otherwise be replaced by a new,
            // empty one, and the reader would see an empty file.
            if let Some(item) = w.open_existing(&key).await {
                return Ok(self.staged_handle(ino, item, false));
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
        let fh = self.add_handle(ino, FileIo::Read(Box::new(tokio::sync::Mutex::new(reader))));
        Ok(Opened { fh, keep_cache })
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
        let w = self.writer()?;
        if let Some(item) = w.open_existing(key).await {
            if truncate && w.size(&item) > 0 {
                if let Err(e) = w.truncate(&item, 0).await {
                    w.release(&item).await;
                    return Err(e);
                }
            }
            return Ok(item);
        }
        let base = match self.ns.resolve(path).await {
            Ok(Entry::File(m)) => Some(m),
            Ok(Entry::Dir) => return Err(FsError::IsDir),
            Err(FsError::NotFound) => None,
            Err(e) => return Err(e),
        };
        w.open(key, base.as_deref(), truncate).await
    }

    fn staged_handle(&self, ino: Ino, item: ItemRef, writable: bool) -> Opened {
        Opened {
            fh: self.add_handle(ino, FileIo::Staged { item, writable }),
            keep_cache: false,
        }
    }

    /// Creates and opens a new, empty file (or empties the file of that name).
    pub async fn create(&self, parent: Ino, name: &str) -> FsResult<(Attr, Opened)> {
        self.writer()?;
        let path = self.child_path(parent, name)?;
        let key = self.ns.key_of(&path);
        let item = self.open_item(&path, &key, true).await?;
        self.ns.forget_tree(&path);
        let la = LocalAttr {
            size: 0,
            mtime: crate::clock::now(),
            posix: Posix::default(),
        };
        let attr = self.ns.register(&path, &local_entry(&key, la), 1);
        let opened = self.staged_handle(attr.ino, item, true);
        Ok((attr, opened))
    }

    /// Reads from the bucket or the staged copy; the bytes returned are counted here, the one
    /// place every reader's bytes pass (`bucketdrive_read_bytes_total`).
    pub async fn read(&self, fh: u64, offset: u64, size: u32) -> FsResult<Bytes> {
        let file = self.handle(fh)?;
        let data = match &file.io {
            FileIo::Read(reader) => {
                let result = reader.lock().await.read(offset, size).await;
                if matches!(result, Err(FsError::Stale)) {
                    self.ns.invalidate(file.ino);
                }
                result?
            }
            FileIo::Staged { item, .. } => {
                Bytes::from(self.writer()?.read(item, offset, size).await?)
            }
        };
        crate::metrics::read_bytes(data.len() as u64);
        Ok(data)
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
}
