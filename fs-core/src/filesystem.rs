//! The facade the adapters call: one method per kernel operation, in platform-neutral terms.
//!
//! It owns the open-handle tables and wires the namespace to the read path and the write path.
//! Adapters translate kernel requests into these calls and errors into errno or NTSTATUS through
//! [`FsError`](crate::error::FsError); they make no decisions of their own.
//!
//! A file being written (it has a write-back item) is served from its staging file for every
//! handle, readers included, so readers see their own writes; its size and mtime override the
//! bucket's until it is uploaded and closed.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::config::MountConfig;
use crate::error::{FsError, FsResult};
use crate::namespace::{names, Attr, DirEntry, DirStream, Entry, Ino, Kind, Namespace};
use crate::read::{PrefetchConfig, ReadBudget, ReadCache, Reader};
use crate::store::{ObjectMeta, ObjectStore};
use crate::write::writeback::{ItemRef, LocalAttr, Status, WriteBack, WriteConfig};

pub use passthrough::{KernelIo, MountFacts, PassthroughMode, Through};

/// The result of opening a file.
#[derive(Debug, Clone)]
pub struct Opened {
    pub fh: u64,
    /// The kernel may keep page-cache contents from earlier opens: the generation is unchanged.
    pub keep_cache: bool,
    /// How the kernel does this handle's I/O ([`passthrough`]).
    pub io: KernelIo,
}

/// How a file is opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenMode {
    pub write: bool,
    pub truncate: bool,
    /// The process opening the file (its process id, not a thread's), where the kernel says:
    /// a close by another process (a child holding a copy of the descriptor) does not save
    /// the file ([`Filesystem::flush_by`]). `None`: every close saves it.
    pub process: Option<u32>,
}

/// How a file is created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CreateFlags {
    /// The name must be new (`O_EXCL`, Windows' `CREATE_NEW`): an existing name is `Exists`,
    /// never emptied. On this mount only, unless the mount claims names in the bucket
    /// (`MountConfig::exclusive_create`).
    pub exclusive: bool,
    /// The mode the caller asked for (the kernel has applied its umask): with
    /// `--posix-metadata` the file shows it and stores it with its upload.
    pub mode: Option<u32>,
    /// The process creating the file, as [`OpenMode::process`].
    pub process: Option<u32>,
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
    /// Whether [`passthrough`] counted it as passing through, for its release.
    through: std::sync::atomic::AtomicBool,
    /// The process that opened it for writing, where known ([`OpenMode::process`]).
    opener: Option<u32>,
    /// Whether the opener closed a descriptor of it: from then on every close saves.
    opener_closed: std::sync::atomic::AtomicBool,
}

/// Reserved key prefix (under the mount prefix) for temporary upload parts; hidden from listings.
pub const TEMP_DIR: &str = ".bucketdrive-parts";

/// One mounted bucket.
pub struct Filesystem<S: ObjectStore> {
    cfg: Arc<MountConfig>,
    ns: Namespace<S>,
    budget: ReadBudget,
    prefetch: PrefetchConfig,
    read_cache: Option<ReadCache>,
    write: Option<Arc<WriteBack<S>>>,
    files: Mutex<HashMap<u64, Arc<OpenFile<S>>>>,
    dirs: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<DirStream>>>>,
    next_fh: AtomicU64,
    claiming: Claiming,
    pt: passthrough::Passthrough,
    releasing: releasing::Releasing,
}

/// Names this mount is creating exclusively, or making directories of, right now. A second
/// such call for one of them is refused at once (`Exists`), as the Linux kernel's directory lock
/// refuses it there; Windows does not serialise them.
#[derive(Default)]
struct Claiming(Mutex<HashSet<String>>);

impl Claiming {
    /// Takes `path` until the guard drops; `None` if another call holds it.
    fn take(&self, path: &str) -> Option<ClaimGuard<'_>> {
        self.0.lock().insert(path.to_string()).then(|| ClaimGuard {
            claiming: self,
            path: path.to_string(),
        })
    }
}

struct ClaimGuard<'a> {
    claiming: &'a Claiming,
    path: String,
}

impl Drop for ClaimGuard<'_> {
    fn drop(&mut self) {
        self.claiming.0.lock().remove(&self.path);
    }
}

fn local_entry(key: &str, la: LocalAttr) -> Entry {
    let mut metadata = HashMap::new();
    la.posix.to_metadata(&mut metadata);
    Entry::File(Arc::new(ObjectMeta {
        metadata_trimmed: false,
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
    /// Turns passthrough on: the adapter found the kernel offering it and may register backing
    /// files. From now on, as `wanted` says ([`PassthroughMode::decide`]), read opens of files
    /// wholly in the read cache may pass through ([`passthrough`]), and, on a writable mount
    /// without `--cache-size`, so may opens of files being written whose bytes are all local
    /// ([`crate::write::passthrough`]); returns what does. Call before the first open.
    pub fn enable_passthrough(&self, wanted: Through) -> Through {
        let through = Through {
            reads: wanted.reads && self.read_cache.is_some(),
            writes: wanted.writes && self.write.as_ref().is_some_and(|w| w.passthrough_allowed()),
        };
        self.pt.enable(through);
        through
    }

    /// What [`PassthroughMode::decide`] goes by for this mount; `root`: the process may
    /// register backing files (`CAP_SYS_ADMIN`).
    pub fn passthrough_facts(&self, root: bool) -> MountFacts {
        let stacked = |dir: &std::path::Path| {
            crate::platform::stacked_fs(dir).map(|fs| {
                format!(
                    "{} is on {fs}, a stacked file system the kernel takes no backing file from",
                    dir.display()
                )
            })
        };
        MountFacts {
            root,
            read_only: self.is_read_only(),
            read_cache: self.read_cache.is_some(),
            writes_allowed: self.write.as_ref().is_some_and(|w| w.passthrough_allowed()),
            refusal: crate::platform::passthrough_refusal(),
            read_refusal: self.read_cache.as_ref().and_then(|rc| stacked(rc.root())),
            write_refusal: self.write.as_ref().and_then(|w| stacked(w.staging_path())),
            room: self.write.as_ref().is_some_and(|w| w.passthrough_room()),
        }
    }

    /// Whether [`Self::enable_passthrough`] was called.
    pub fn passthrough_enabled(&self) -> bool {
        self.pt.enabled()
    }

    /// The adapter could not pass handle `fh` through after all (the kernel refused its
    /// backing file): it is answered as a handle through the daemon, and counted so.
    pub async fn passthrough_refused(&self, fh: u64) {
        // What the kernel refuses once (a read cache on overlayfs, a mount in a user
        // namespace) it refuses every time: no more offers.
        self.pt.stop_offering();
        if let Ok(f) = self.handle(fh) {
            if f.through.swap(false, Ordering::SeqCst) {
                self.pt.refused(f.ino);
                if let (FileIo::Staged { item, .. }, Some(w)) = (&f.io, &self.write) {
                    w.leave_passthrough(item, || self.pt.passing_through(f.ino))
                        .await;
                }
            }
        }
    }

    /// The mount's device (`major`, `minor`), which the adapter learns once mounted: how a
    /// mapping of a file the kernel writes itself is recognised (`write/passthrough.rs`).
    pub fn set_kernel_device(&self, major: u64, minor: u64) {
        if let Some(w) = &self.write {
            w.set_kernel_device(major, minor);
        }
    }

    /// The adapter opened handle `fh` passing through: counted in the metrics.
    pub fn passthrough_opened(&self) {
        crate::metrics::passthrough_open();
    }

    /// A read-only filesystem: every change fails with `EROFS`.
    pub fn new(store: Arc<S>, cfg: MountConfig) -> Self {
        let cfg = Arc::new(cfg);
        Filesystem {
            budget: ReadBudget::new(cfg.max_read_memory),
            prefetch: PrefetchConfig::adaptive(
                cfg.read_part_size,
                cfg.read_concurrency,
                cfg.read_concurrency_max,
            ),
            ns: Namespace::new(store, cfg.clone()),
            cfg,
            read_cache: None,
            write: None,
            files: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            claiming: Claiming::default(),
            releasing: releasing::Releasing::default(),
            pt: passthrough::Passthrough::default(),
        }
    }

    /// A writable filesystem staging writes in `wcfg.cache_dir`. Fails if the cache directory
    /// cannot be used (for example, another mount holds it, or it belongs to another bucket or
    /// prefix: see [`Self::with_write_adopting`]).
    pub fn with_write(store: Arc<S>, cfg: MountConfig, wcfg: WriteConfig) -> Result<Self, String> {
        Self::with_write_adopting(store, cfg, wcfg, false)
    }

    /// Like [`Self::with_write`]; the cache directory is first tied to this mount's bucket and
    /// prefix (I11), before anything is staged or replayed, and refused when its records may
    /// belong elsewhere. `adopt` takes records without a known owner as this mount's.
    pub fn with_write_adopting(
        store: Arc<S>,
        cfg: MountConfig,
        mut wcfg: WriteConfig,
        adopt: bool,
    ) -> Result<Self, String> {
        let mut fs = Self::new(store.clone(), cfg);
        wcfg.upload.temp_prefix = format!("{}{TEMP_DIR}/", fs.cfg.prefix);
        let w = WriteBack::new(store, wcfg, fs.ns.settle_hook())?;
        let owner = crate::write::cache_dir::Owner::new(&fs.cfg.bucket, &fs.cfg.prefix);
        w.claim_cache_dir(&owner, adopt)
            .map_err(|e| e.to_string())?;
        fs.write = Some(w);
        Ok(fs)
    }

    /// Replays the journal (uploading what a crash left staged) and removes temporary parts of
    /// earlier runs. Returns how many staged files were replayed.
    pub async fn start(&self) -> Result<usize, String> {
        let Some(w) = &self.write else { return Ok(0) };
        let n = w.replay().await?;
        w.start_orphan_cleanup();
        w.start_pool();
        Ok(n)
    }

    /// Keeps what readers fetch in `cache` on the local disk, and serves it from there.
    pub fn set_read_cache(&mut self, cache: ReadCache) {
        self.read_cache = Some(cache);
    }

    pub fn read_cache(&self) -> Option<&ReadCache> {
        self.read_cache.as_ref()
    }

    /// Waits, at most `timeout`, until what readers fetched is written to the read cache, so
    /// the next mount finds it. True when it was (or there is no read cache).
    pub fn flush_read_cache(&self, timeout: std::time::Duration) -> bool {
        self.read_cache.as_ref().is_none_or(|c| c.flush(timeout))
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

    /// The path of a name being made (created, a directory, a link, a rename's target).
    /// Nothing is made in the mount root's parts folder: temporary upload parts live there,
    /// hidden from listings, and start-up cleanup deletes what it holds of ours, so a user's
    /// file there would vanish from view and could be taken for a leftover.
    fn new_child_path(&self, parent: Ino, name: &str) -> FsResult<String> {
        let path = self.child_path(parent, name)?;
        Self::not_reserved(&path)?;
        Ok(path)
    }

    /// `EACCES` for a path in a parts folder: the mount root's, or (seen from a mount of the
    /// whole bucket) that of a mount of a prefix, `PREFIX/.bucketdrive-parts`. Nothing there
    /// may be made, changed, renamed or removed through the mount: those objects are other
    /// uploads' temporary parts, in flight.
    fn not_reserved(path: &str) -> FsResult<()> {
        if path.split('/').any(|c| c == TEMP_DIR) {
            return Err(FsError::PermissionDenied(format!(
                "{TEMP_DIR} is reserved for bucketdrive's temporary upload parts"
            )));
        }
        Ok(())
    }

    fn local_attr(&self, key: &str) -> Option<LocalAttr> {
        self.write.as_ref().and_then(|w| w.local_attr(key))
    }

    /// What is at `path`: a file being written, or what the namespace says.
    async fn entry_at(&self, path: &str) -> FsResult<Entry> {
        let key = self.ns.key_of(path);
        if let Some(la) = self.local_attr(&key) {
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
        if let Some(la) = self.local_attr(&key) {
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
            if let Some(la) = self.local_attr(&key) {
                return Ok(self.ns.register(&path, &local_entry(&key, la), 0));
            }
        }
        self.ns.getattr(ino).await
    }

    pub fn forget(&self, ino: Ino, n: u64) {
        self.ns.forget(ino, n);
    }

    /// Opens a directory for listing. `keep_cache`: the kernel's cached listing of it, from an
    /// earlier whole pass, is still good (see `MetaCache::kernel_listing_fresh`); the kernel
    /// may answer `readdir` from it without asking us.
    pub async fn opendir(&self, ino: Ino) -> FsResult<Opened> {
        let (path, _) = self.ns.inode_path(ino)?;
        let keep_cache = self.ns.kernel_listing_fresh(ino);
        let mut local = Vec::new();
        if let Some(w) = &self.write {
            let prefix = self.ns.dir_key_prefix(&path);
            for (name, la) in w.local_children(&prefix) {
                local.push((name.clone(), local_entry(&format!("{prefix}{name}"), la)));
            }
        }
        let stream = self.ns.open_dir(ino, local)?;
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.dirs
            .lock()
            .insert(fh, Arc::new(tokio::sync::Mutex::new(stream)));
        Ok(Opened {
            fh,
            keep_cache,
            io: KernelIo::Daemon,
        })
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
        let mut offset = offset;
        loop {
            let mut entries = self.ns.read_dir(&mut stream, offset).await?;
            let Some(last) = entries.last().map(|e| e.offset) else {
                return Ok(entries);
            };
            // Temporary upload parts live under the mount root's TEMP_DIR: not the user's files.
            entries.retain(|e| {
                e.name != TEMP_DIR
                    || self
                        .ns
                        .inode_path(e.attr.ino)
                        .map_or(true, |(p, _)| p != TEMP_DIR)
            });
            // An empty answer ends the directory for the kernel: a batch that held only the
            // parts folder goes on to the next one (files being written come after it).
            if !entries.is_empty() {
                return Ok(entries);
            }
            offset = last;
        }
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

    /// Waits until every release the adapter has received has run (see `releasing`): called
    /// once the session has ended, before the last drain, so that a file closed just before the
    /// unmount is drained as what its last release made it. `false` if some are still under
    /// way after [`releasing::RELEASE_PATIENCE`].
    pub async fn settle_releases(&self) -> bool {
        self.releasing.settled(releasing::RELEASE_PATIENCE).await
    }

    /// What `status` reports: the write path's snapshot, and whether the mount is offline.
    pub async fn write_status(&self) -> Status {
        let mut status = match &self.write {
            Some(w) => w.status().await,
            None => Status::default(),
        };
        status.offline = self.ns.is_offline();
        status
    }

    /// What a power cut now may lose on the cache disk (for the simulation's model of one);
    /// `None` for a read-only mount.
    #[doc(hidden)]
    pub fn power_cut_exposure(&self) -> Option<crate::write::commit::Exposure> {
        self.write.as_ref().map(|w| w.exposure())
    }

    /// Makes the next commit's sync of the staging file at `path` fail as a disk that could
    /// not write it back would (for the simulation).
    #[doc(hidden)]
    pub fn fail_data_sync_of(&self, path: &std::path::Path) {
        if let Some(w) = &self.write {
            w.fail_data_sync_of(path);
        }
    }

    /// Number of open file handles.
    pub fn open_files(&self) -> usize {
        self.files.lock().len()
    }
}

mod attrs;
mod changes;
#[cfg(test)]
mod commit_tests;
#[cfg(test)]
mod exclusive;
mod handles;
#[cfg(test)]
mod offline_tests;
pub mod passthrough;
#[cfg(all(test, target_os = "linux"))]
mod passthrough_write_tests;
#[cfg(test)]
mod regressions;
mod releasing;
#[cfg(test)]
mod review_tests;
#[cfg(test)]
mod shared_tests;
#[cfg(test)]
mod tests;
