//! `fuser::Filesystem` over the fs-core facade: translation only.
//!
//! Each kernel request becomes one facade call; the reply object moves into the call's task
//! and is answered from there. Most requests run on the session thread as far as they get
//! without waiting ([`run_now_or_spawn`]): a write into a staging file, a lookup or `getattr`
//! from the caches, a read of bytes already fetched. Whatever waits (the bucket, a lock, a
//! blocking job) finishes on the core's tokio runtime, so a slow bucket request never blocks
//! the session loop or other requests. A few always go to the runtime (see
//! [`run_now_or_spawn`]). Errors are mapped by `FsError::errno`, never here.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use crate::processes::Openers;
use fs_core::filesystem::{CreateFlags, KernelIo, OpenMode, Opened};
use fs_core::store::{ObjectStore, Posix};
use fs_core::{Attr, FsError, Kind};
use fuser::{
    BackingId, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

/// Kernel tuning applied at `init`.
pub const MAX_BACKGROUND: u16 = 64;
pub const CONGESTION_THRESHOLD: u16 = 48;
pub const MAX_WRITE: u32 = 1024 * 1024;
pub const MAX_READAHEAD: u32 = 1024 * 1024;

/// Runs `task` on the calling thread (the session loop) as far as it goes without waiting,
/// and hands what is left of it, if anything, to the runtime.
///
/// Most requests never wait: a write into a local staging file takes an uncontended lock and
/// copies into the page cache. Handing one to a runtime worker anyway costs two thread
/// wake-ups per request, which on a small VM is most of its cost: a profile of 4 KiB writes
/// through the daemon had two thirds of its CPU in the scheduler and wake-ups and under a
/// tenth in the write itself. Run here, those writes cost the daemon 0.56× the CPU, and a
/// `cp -r` of small files returns in 0.78× the time on 0.72× the CPU (`docs/benchmarks.md`).
/// Whatever does wait (a contended lock, space, the bucket, a copy
/// made off the thread) returns pending at its first wait and finishes on the runtime, so the
/// session loop is held no longer than the part that runs at once.
///
/// Nothing run here may read another process's `/proc/<pid>/...`: such a read takes a hold on
/// the process's memory map (for `maps`, its lock), which one of its threads may hold while it
/// waits for this very loop (a page fault on another file of the mount); a process killed
/// meanwhile could even leave its last teardown, and the final close of its files of this
/// mount, to this thread. So the last release, unlink, rmdir and rename (which can retire a
/// file the kernel wrote itself, after a look at whether it is still mapped: a lease asked of
/// the kernel, or where leases cannot be had, `/proc/<pid>/maps`) are spawned, as is `fsync`
/// (which waits for the bucket anyway), and the thread-to-process lookups of [`Openers`] go off
/// the thread when `/proc` must be read.
///
/// One path is left: an open that fails after taking a file being written gives it back at
/// once, and with `--passthrough writes`, if that file's upload ended just then, the give-back
/// can retire it after that look here; it reads `/proc/<pid>/maps` only on a cache disk
/// without leases.
///
/// A panic in the part run here is caught, as the runtime catches one in a task: the request's
/// reply, dropped unanswered, fails it with `EIO`, and the session goes on.
fn run_now_or_spawn(rt: &tokio::runtime::Handle, task: impl Future<Output = ()> + Send + 'static) {
    let _runtime = rt.enter();
    let mut task = Box::pin(task);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    // The runtime polls it again with a waker of its own, which replaces the no-op one
    // wherever the first poll left it.
    let polled =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task.as_mut().poll(&mut cx)));
    match polled {
        Ok(std::task::Poll::Pending) => {
            rt.spawn(task);
        }
        Ok(std::task::Poll::Ready(())) => {}
        Err(_) => tracing::error!("a request panicked; it fails with EIO"),
    }
}

/// The FUSE side of one mount.
pub struct FuseAdapter<S: ObjectStore> {
    fs: Arc<fs_core::Filesystem<S>>,
    rt: tokio::runtime::Handle,
    /// Whether to ask the kernel for passthrough, or why not (the core's decision).
    passthrough: Result<fs_core::filesystem::Through, String>,
    backings: Arc<Backings>,
    /// The process that opened each write handle, for its closes.
    openers: Arc<Openers>,
}

impl<S: ObjectStore> FuseAdapter<S> {
    pub fn new(
        fs: Arc<fs_core::Filesystem<S>>,
        rt: tokio::runtime::Handle,
        passthrough: Result<fs_core::filesystem::Through, String>,
    ) -> Self {
        FuseAdapter {
            fs,
            rt,
            passthrough,
            backings: Arc::default(),
            openers: Arc::default(),
        }
    }
}

/// The kernel's registrations of backing files for passthrough handles. The kernel wants one
/// backing file per inode, the same id for every passthrough handle of it, so a registration
/// lives while any such handle is open; the core hands every one of them the same file.
#[derive(Default)]
struct Backings(parking_lot::Mutex<BackingTable>);

#[derive(Default)]
struct BackingTable {
    by_ino: HashMap<u64, (Arc<BackingId>, usize)>,
    by_fh: HashMap<u64, u64>,
    /// Inodes whose backing file the kernel refused: the rest of their passthrough opens
    /// (joined before the core heard of it) are refused too.
    refused: std::collections::HashSet<u64>,
}

impl Backings {
    /// The registration for handle `fh` of `ino`: the inode's own if it has one, else `file`
    /// registered through `reply`.
    fn register(
        &self,
        ino: u64,
        fh: u64,
        file: &std::fs::File,
        register: impl FnOnce(&std::fs::File) -> std::io::Result<BackingId>,
    ) -> std::io::Result<Arc<BackingId>> {
        let mut t = self.0.lock();
        if t.refused.contains(&ino) {
            // Its first handle was answered without passthrough: so are those that joined
            // it (the kernel admits no passthrough handle beside a cached one).
            return Err(std::io::Error::other(
                "the inode's backing file was refused",
            ));
        }
        let id = match t.by_ino.get_mut(&ino) {
            Some((id, n)) => {
                *n += 1;
                id.clone()
            }
            None => match register(file) {
                Ok(id) => {
                    let id = Arc::new(id);
                    t.by_ino.insert(ino, (id.clone(), 1));
                    id
                }
                Err(e) => {
                    t.refused.insert(ino);
                    return Err(e);
                }
            },
        };
        t.by_fh.insert(fh, ino);
        Ok(id)
    }

    /// Handle `fh` is released: its inode's registration goes with the last of them.
    fn release(&self, fh: u64) {
        let mut t = self.0.lock();
        let Some(ino) = t.by_fh.remove(&fh) else {
            return;
        };
        if let Some((_, n)) = t.by_ino.get_mut(&ino) {
            *n -= 1;
            if *n == 0 {
                t.by_ino.remove(&ino);
            }
        }
    }
}

/// The two answers that open a handle: `open` and `create`.
trait OpenReply {
    fn open_backing(&self, file: &std::fs::File) -> std::io::Result<BackingId>;
    fn opened(self, fh: FileHandle, flags: FopenFlags);
    fn opened_passthrough(self, fh: FileHandle, id: &BackingId);
}

impl OpenReply for ReplyOpen {
    fn open_backing(&self, file: &std::fs::File) -> std::io::Result<BackingId> {
        ReplyOpen::open_backing(self, file)
    }
    fn opened(self, fh: FileHandle, flags: FopenFlags) {
        ReplyOpen::opened(self, fh, flags)
    }
    fn opened_passthrough(self, fh: FileHandle, id: &BackingId) {
        ReplyOpen::opened_passthrough(self, fh, FopenFlags::empty(), id)
    }
}

/// A create's answer, with the new file's attributes.
struct Created(ReplyCreate, Attr);

impl OpenReply for Created {
    fn open_backing(&self, file: &std::fs::File) -> std::io::Result<BackingId> {
        self.0.open_backing(file)
    }
    fn opened(self, fh: FileHandle, flags: FopenFlags) {
        let a = &self.1;
        self.0.created(&a.ttl, &file_attr(a), GENERATION, fh, flags)
    }
    fn opened_passthrough(self, fh: FileHandle, id: &BackingId) {
        let a = &self.1;
        self.0.created_passthrough(
            &a.ttl,
            &file_attr(a),
            GENERATION,
            fh,
            FopenFlags::empty(),
            id,
        )
    }
}

/// Answers an open the way the core decided: through the daemon, or passing through to a
/// backing file. A backing file the kernel refuses makes the handle an ordinary one.
async fn reply_open<S: ObjectStore>(
    fs: &fs_core::Filesystem<S>,
    backings: &Backings,
    ino: u64,
    o: Opened,
    reply: impl OpenReply,
) {
    let fh = FileHandle(o.fh);
    match &o.io {
        KernelIo::Passthrough(file) => {
            match backings.register(ino, o.fh, file, |f| reply.open_backing(f)) {
                Ok(id) => {
                    fs.passthrough_opened();
                    reply.opened_passthrough(fh, &id)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the kernel refused a passthrough file (a cache directory on overlayfs, or a mount without CAP_SYS_ADMIN in its namespace); through the daemon from now on");
                    fs.passthrough_refused(o.fh).await;
                    reply.opened(fh, FopenFlags::empty());
                }
            }
        }
        KernelIo::Daemon if o.keep_cache => reply.opened(fh, FopenFlags::FOPEN_KEEP_CACHE),
        KernelIo::Daemon => reply.opened(fh, FopenFlags::empty()),
    }
}

fn errno(e: &FsError) -> fuser::Errno {
    fuser::Errno::from_i32(e.errno())
}

fn file_attr(a: &Attr) -> FileAttr {
    let (kind, nlink) = match a.kind {
        Kind::Dir => (FileType::Directory, 2),
        Kind::File => (FileType::RegularFile, 1),
        Kind::Symlink => (FileType::Symlink, 1),
    };
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: a.mtime,
        mtime: a.mtime,
        ctime: a.mtime,
        crtime: a.mtime,
        kind,
        perm: a.perm,
        nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: 1024 * 1024,
        flags: 0,
    }
}

/// Object names are UTF-8: a name that is not cannot exist in the bucket (`ENOENT` when it
/// must already exist) and cannot be created there (`EINVAL`).
fn utf8_name(name: &OsStr, creating: bool) -> Result<String, fuser::Errno> {
    name.to_str().map(str::to_owned).ok_or(if creating {
        fuser::Errno::EINVAL
    } else {
        fuser::Errno::ENOENT
    })
}

/// Inode numbers are never reused within a mount, so the FUSE generation can stay 0.
const GENERATION: Generation = Generation(0);

impl<S: ObjectStore> Filesystem for FuseAdapter<S> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_background(MAX_BACKGROUND);
        let _ = config.set_congestion_threshold(CONGESTION_THRESHOLD);
        let _ = config.set_max_write(MAX_WRITE);
        if let Err(max) = config.set_max_readahead(MAX_READAHEAD) {
            let _ = config.set_max_readahead(max);
        }
        // Passthrough (the kernel reading files wholly in the read cache itself) is offered
        // only without the write-back cache, and only with a stack depth for backing files.
        let passthrough = match &self.passthrough {
            Ok(wanted) => match config.add_capabilities(InitFlags::FUSE_PASSTHROUGH) {
                Ok(()) => {
                    let _ = config.set_max_stack_depth(1);
                    Ok(*wanted)
                }
                Err(_) => Err("the kernel does not offer it (Linux 6.9 or later)".to_string()),
            },
            Err(why) => Err(why.clone()),
        };
        // The write-back cache lets the kernel buffer writes in the page cache and send them in
        // batches; it flushes them to us before every FLUSH (close) and FSYNC, so what those
        // guarantee is unchanged. See docs/semantics.md for what it changes about sizes.
        let mut wanted = InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_ASYNC_READ
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_ATOMIC_O_TRUNC;
        if passthrough.is_err() {
            wanted |= InitFlags::FUSE_WRITEBACK_CACHE;
        }
        if let Err(missing) = config.add_capabilities(wanted) {
            let _ = config.add_capabilities(wanted & !missing);
        }
        match passthrough {
            Ok(wanted) => {
                let through = self.fs.enable_passthrough(wanted);
                let reads = "reads files wholly in the read cache, once checked";
                let writes = "reads and writes files being written whose bytes are all local";
                let what = match (through.reads, through.writes) {
                    (true, true) => format!("{reads}, and {writes}"),
                    (true, false) => reads.to_string(),
                    (false, true) => writes.to_string(),
                    (false, false) => "passes nothing: no file qualifies".to_string(),
                };
                tracing::info!("FUSE passthrough: on (the kernel itself {what})");
            }
            Err(why) => tracing::info!("FUSE passthrough: off ({why})"),
        }
        tracing::info!("FUSE session initialised");
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let name = match utf8_name(name, false) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let fs = self.fs.clone();
        run_now_or_spawn(&self.rt, async move {
            match fs.lookup(parent.0, &name).await {
                Ok(a) => reply.entry(&a.ttl, &file_attr(&a), GENERATION),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let fs = self.fs.clone();
        run_now_or_spawn(&self.rt, async move {
            match fs.getattr(ino.0).await {
                Ok(a) => reply.attr(&a.ttl, &file_attr(&a)),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // chmod and chown are stored only with --posix-metadata (the core decides).
        let posix = Posix {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
        };
        let mtime = mtime.map(|t| match t {
            TimeOrNow::SpecificTime(t) => t,
            TimeOrNow::Now => SystemTime::now(),
        });
        let fs = self.fs.clone();
        let fh = fh.map(|f| f.0);
        run_now_or_spawn(&self.rt, async move {
            let result = async {
                if !posix.is_empty() {
                    fs.set_posix(ino.0, posix, fh).await?;
                }
                fs.setattr(ino.0, size, mtime, fh).await
            }
            .await;
            match result {
                Ok(a) => reply.attr(&a.ttl, &file_attr(&a)),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let name = match utf8_name(name, true) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let fs = self.fs.clone();
        run_now_or_spawn(&self.rt, async move {
            match fs.mkdir(parent.0, &name).await {
                Ok(a) => reply.entry(&a.ttl, &file_attr(&a), GENERATION),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = match utf8_name(name, false) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let fs = self.fs.clone();
        // On the runtime, never the session loop: see `run_now_or_spawn`.
        self.rt.spawn(async move {
            match fs.unlink(parent.0, &name).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = match utf8_name(name, false) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let fs = self.fs.clone();
        // On the runtime, never the session loop: see `run_now_or_spawn`.
        self.rt.spawn(async move {
            match fs.rmdir(parent.0, &name).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        // RENAME_EXCHANGE and RENAME_NOREPLACE cannot be done atomically on a bucket.
        if !flags.is_empty() {
            return reply.error(fuser::Errno::EINVAL);
        }
        let (name, newname) = match (utf8_name(name, true), utf8_name(newname, true)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return reply.error(e),
        };
        let fs = self.fs.clone();
        // On the runtime, never the session loop: see `run_now_or_spawn`.
        self.rt.spawn(async move {
            match fs.rename(parent.0, &name, newparent.0, &newname).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn symlink(
        &self,
        _req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        let (name, target) = match (
            utf8_name(link_name, true),
            utf8_name(target.as_os_str(), true),
        ) {
            (Ok(n), Ok(t)) => (n, t),
            (Err(e), _) | (_, Err(e)) => return reply.error(e),
        };
        let fs = self.fs.clone();
        run_now_or_spawn(&self.rt, async move {
            match fs.symlink(parent.0, &name, &target).await {
                Ok(a) => reply.entry(&a.ttl, &file_attr(&a), GENERATION),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let fs = self.fs.clone();
        run_now_or_spawn(&self.rt, async move {
            match fs.readlink(ino.0).await {
                Ok(t) => reply.data(t.as_bytes()),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(errno(&self.fs.unsupported()));
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(errno(&self.fs.unsupported()));
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let write = !matches!(flags.acc_mode(), OpenAccMode::O_RDONLY);
        let thread = req.pid();
        let (fs, backings, openers) =
            (self.fs.clone(), self.backings.clone(), self.openers.clone());
        run_now_or_spawn(&self.rt, async move {
            // The calling thread waits for the reply, so its id still names it here.
            let mode = OpenMode {
                write,
                truncate: flags.0 & libc::O_TRUNC != 0,
                process: if write {
                    Openers::opening(thread).await
                } else {
                    None
                },
            };
            match fs.open(ino.0, mode).await {
                Ok(o) => {
                    openers.opened(o.fh, thread, mode.process);
                    reply_open(&fs, &backings, ino.0, o, reply).await
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let fs = self.fs.clone();
        run_now_or_spawn(&self.rt, async move {
            match fs.read(fh.0, offset, size).await {
                Ok(data) => reply.data(&data),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let fs = self.fs.clone();
        let data = fs.write_bytes(data);
        run_now_or_spawn(&self.rt, async move {
            match fs.write(fh.0, offset, &data).await {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn flush(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let (fs, openers, thread) = (self.fs.clone(), self.openers.clone(), req.pid());
        run_now_or_spawn(&self.rt, async move {
            // The closing thread waits for the reply, so its id still names it here.
            let process = openers.closing(fh.0, thread).await;
            match fs.flush_by(fh.0, process).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let fs = self.fs.clone();
        self.backings.release(fh.0);
        self.openers.released(fh.0);
        let under_way = fs.begin_release();
        // On the runtime, never the session loop: see `run_now_or_spawn`.
        self.rt.spawn(async move {
            fs.release(fh.0).await;
            drop(under_way);
            reply.ok();
        });
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let fs = self.fs.clone();
        // On the runtime, never the session loop: see `run_now_or_spawn`.
        self.rt.spawn(async move {
            match fs.fsync(fh.0).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let fs = self.fs.clone();
        run_now_or_spawn(&self.rt, async move {
            match fs.opendir(ino.0).await {
                Ok(o) => {
                    let mut f = FopenFlags::FOPEN_CACHE_DIR;
                    if o.keep_cache {
                        f |= FopenFlags::FOPEN_KEEP_CACHE;
                    }
                    reply.opened(FileHandle(o.fh), f)
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let fs = self.fs.clone();
        run_now_or_spawn(&self.rt, async move {
            match fs.readdir(fh.0, offset).await {
                Ok(entries) => {
                    for e in entries {
                        let kind = if e.attr.kind == Kind::Dir {
                            FileType::Directory
                        } else {
                            FileType::RegularFile
                        };
                        if reply.add(INodeNo(e.attr.ino), e.offset, kind, &e.name) {
                            break;
                        }
                    }
                    reply.ok()
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn readdirplus(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let fs = self.fs.clone();
        run_now_or_spawn(&self.rt, async move {
            match fs.readdir(fh.0, offset).await {
                Ok(entries) => {
                    for e in entries {
                        let attr = file_attr(&e.attr);
                        if reply.add(
                            INodeNo(e.attr.ino),
                            e.offset,
                            &e.name,
                            &e.attr.ttl,
                            &attr,
                            GENERATION,
                        ) {
                            break;
                        }
                        // The kernel holds a reference to every entry but `.` and `..`.
                        if e.name != "." && e.name != ".." {
                            fs.remember(e.attr.ino);
                        }
                    }
                    reply.ok()
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.fs.releasedir(fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = self.fs.statfs();
        reply.statfs(
            s.blocks,
            s.blocks_free,
            s.blocks_free,
            s.files,
            s.files_free,
            s.block_size,
            s.name_max,
            s.block_size,
        );
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let name = match utf8_name(name, true) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let exclusive = flags & libc::O_EXCL != 0;
        let (fs, openers, thread) = (self.fs.clone(), self.openers.clone(), req.pid());
        let backings = self.backings.clone();
        run_now_or_spawn(&self.rt, async move {
            let flags = CreateFlags {
                exclusive,
                // Already masked by the kernel with the caller's umask (no FUSE_DONT_MASK).
                mode: Some(mode & 0o7777),
                // The calling thread waits for the reply, so its id still names it here.
                process: Openers::opening(thread).await,
            };
            match fs.create_with(parent.0, &name, flags).await {
                Ok((a, o)) => {
                    openers.opened(o.fh, thread, flags.process);
                    let ino = a.ino;
                    reply_open(&fs, &backings, ino, o, Created(reply, a)).await
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::run_now_or_spawn;
    use std::sync::mpsc;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime")
    }

    #[test]
    fn a_request_that_does_not_wait_is_answered_on_the_calling_thread() {
        let rt = runtime();
        let (tx, rx) = mpsc::channel();
        run_now_or_spawn(rt.handle(), async move {
            let _ = tx.send(std::thread::current().id());
        });
        // Answered before run_now_or_spawn returned, by this thread.
        assert_eq!(rx.try_recv().ok(), Some(std::thread::current().id()));
    }

    #[test]
    fn a_request_that_waits_finishes_on_the_runtime() {
        let rt = runtime();
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<u32>();
        let (tx, rx) = mpsc::channel();
        run_now_or_spawn(rt.handle(), async move {
            let before = std::thread::current().id();
            // Waits: the no-op waker of the first poll must not lose this wake-up.
            let v = go_rx.await.unwrap_or(0);
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            let _ = tx.send((before, std::thread::current().id(), v));
        });
        assert!(rx.try_recv().is_err(), "not answered before it could go on");
        let _ = go_tx.send(7);
        let (before, after, v) = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the request finished on the runtime");
        assert_eq!(before, std::thread::current().id());
        assert_ne!(after, std::thread::current().id());
        assert_eq!(v, 7);
    }

    #[test]
    fn a_request_that_panics_does_not_take_the_session_down() {
        let rt = runtime();
        run_now_or_spawn(rt.handle(), async { panic!("a request panicked") });
        let (tx, rx) = mpsc::channel();
        run_now_or_spawn(rt.handle(), async move {
            let _ = tx.send(());
        });
        assert!(rx.try_recv().is_ok(), "the next request is answered");
    }
}
