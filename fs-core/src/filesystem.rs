//! The facade the adapters call: one method per kernel operation, in platform-neutral terms.
//!
//! It owns the open-handle tables and wires the namespace to the read path. Adapters translate
//! kernel requests into these calls and errors into errno or NTSTATUS through
//! [`FsError`](crate::error::FsError); they make no decisions of their own.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::config::MountConfig;
use crate::error::{FsError, FsResult};
use crate::namespace::{Attr, DirEntry, DirStream, Ino, Namespace};
use crate::read::{PrefetchConfig, ReadBudget, Reader};
use crate::store::ObjectStore;

/// The result of opening a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    pub fh: u64,
    /// The kernel may keep page-cache contents from earlier opens: the generation is unchanged.
    pub keep_cache: bool,
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

struct OpenFile<S: ObjectStore> {
    ino: Ino,
    reader: tokio::sync::Mutex<Reader<S>>,
}

/// One mounted bucket.
pub struct Filesystem<S: ObjectStore> {
    cfg: Arc<MountConfig>,
    ns: Namespace<S>,
    budget: ReadBudget,
    prefetch: PrefetchConfig,
    files: Mutex<HashMap<u64, Arc<OpenFile<S>>>>,
    dirs: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<DirStream>>>>,
    next_fh: AtomicU64,
}

impl<S: ObjectStore> Filesystem<S> {
    pub fn new(store: Arc<S>, cfg: MountConfig) -> Self {
        let cfg = Arc::new(cfg);
        Filesystem {
            budget: ReadBudget::new(cfg.max_read_memory),
            prefetch: PrefetchConfig::new(cfg.read_part_size, cfg.read_concurrency),
            ns: Namespace::new(store, cfg.clone()),
            cfg,
            files: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
        }
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

    pub async fn lookup(&self, parent: Ino, name: &str) -> FsResult<Attr> {
        self.ns.lookup(parent, name).await
    }

    pub async fn getattr(&self, ino: Ino) -> FsResult<Attr> {
        self.ns.getattr(ino).await
    }

    pub fn forget(&self, ino: Ino, n: u64) {
        self.ns.forget(ino, n);
    }

    /// Opens a file for reading. Writing is refused until the write path exists.
    pub async fn open(&self, ino: Ino, write: bool) -> FsResult<Opened> {
        if write {
            return Err(FsError::ReadOnly);
        }
        let (meta, keep_cache) = self.ns.open_file(ino).await?;
        let reader = Reader::new(
            self.ns.store().clone(),
            &meta,
            self.budget.clone(),
            self.prefetch,
        );
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.files.lock().insert(
            fh,
            Arc::new(OpenFile {
                ino,
                reader: tokio::sync::Mutex::new(reader),
            }),
        );
        Ok(Opened { fh, keep_cache })
    }

    pub async fn read(&self, fh: u64, offset: u64, size: u32) -> FsResult<Bytes> {
        let file = self
            .files
            .lock()
            .get(&fh)
            .cloned()
            .ok_or(FsError::BadHandle)?;
        let result = file.reader.lock().await.read(offset, size).await;
        if matches!(result, Err(FsError::Stale)) {
            self.ns.invalidate(file.ino);
        }
        result
    }

    pub fn release(&self, fh: u64) {
        self.files.lock().remove(&fh);
    }

    pub fn opendir(&self, ino: Ino) -> FsResult<u64> {
        let stream = self.ns.open_dir(ino)?;
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
        self.ns.read_dir(&mut stream, offset).await
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

    /// Every namespace or data change, until the write path lands: the mount is read-only.
    pub fn modify(&self) -> FsResult<()> {
        Err(FsError::ReadOnly)
    }

    /// Number of open file handles.
    pub fn open_files(&self) -> usize {
        self.files.lock().len()
    }
}
