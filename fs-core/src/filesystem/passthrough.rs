//! Which open handles the kernel serves itself from a local file (FUSE passthrough), and what
//! every other open of the same file gets meanwhile.
//!
//! A file whose current generation is wholly in the disk read cache, and was checked whole by
//! this mount ([`crate::read::cache::ReadCache::passthrough_file`]), is opened for reading
//! with the cache's data file as its *backing file*: the kernel reads it, and maps it, without
//! waking the daemon, at the local disk's speed. Everything else goes through the daemon as
//! before. The kernel's rules (`fs/fuse/iomode.c`) shape the decision, made here per inode:
//!
//! - All passthrough handles of an inode share one backing file, and while one is open every
//!   open of the inode must pass through to it (anything else fails with `EIO`); nor may a
//!   passthrough handle join handles cached in the page cache. So passthrough is chosen only
//!   at an open when no other handle of the inode is open, and the backing file is let go at
//!   the last release.
//! - While the inode's readers pass through: another reader joins them, and reads the
//!   generation they read, even if the bucket holds a newer one by now (it shows at the first
//!   open after they all closed, as a file replaced by a rename shows on a local disk). An
//!   open that cannot read the cache file (a writer, or the file being written by this mount),
//!   a truncating create and a truncate are refused with `ETXTBSY`, "text file busy", as Linux
//!   refuses to change a program being run: never `EIO`, and nothing is ever written into a
//!   cache file.
//! - A passthrough open never carries `FOPEN_KEEP_CACHE`.
//!
//! Whether the mount uses passthrough at all is the adapter's to find out (the kernel offers
//! it at `init` only without the write-back cache, and registering a backing file needs
//! `CAP_SYS_ADMIN`); [`PassthroughMode::decide`] says when it is wanted, and
//! [`Filesystem::enable_passthrough`](super::Filesystem::enable_passthrough) turns it on.

use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{FsError, FsResult};
use crate::namespace::Ino;

/// `--passthrough`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PassthroughMode {
    /// Where the kernel and the mount's privileges allow it, and the mount does not lose by
    /// it ([`Self::decide`]).
    #[default]
    Auto,
    /// Wherever the kernel and privileges allow it, writable mounts too (their writes then go
    /// without the kernel's write-back cache).
    On,
    Off,
}

impl PassthroughMode {
    /// Whether a mount should ask the kernel for passthrough, and if not why not (one line,
    /// for the start-up log). `root`: the mount may register backing files (`CAP_SYS_ADMIN`).
    /// `read_only`: no writes through the mount, so nothing loses the kernel's write-back
    /// cache, which passthrough turns off for the whole mount. `read_cache`: there are local
    /// files to pass through to.
    pub fn decide(self, root: bool, read_only: bool, read_cache: bool) -> Result<(), String> {
        match self {
            PassthroughMode::Off => Err("--passthrough off".into()),
            _ if !root => Err("it needs root (CAP_SYS_ADMIN) to register backing files".into()),
            _ if !read_cache => {
                Err("no --read-cache-dir: no local file to pass reads through to".into())
            }
            PassthroughMode::On => Ok(()),
            PassthroughMode::Auto if !read_only => Err(
                "the mount is writable, and passthrough would turn the kernel's write-back cache \
                 off for all its writes (docs/semantics.md); --read-only mounts use it"
                    .into(),
            ),
            PassthroughMode::Auto => Ok(()),
        }
    }
}

impl std::str::FromStr for PassthroughMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(PassthroughMode::Auto),
            "on" => Ok(PassthroughMode::On),
            "off" => Ok(PassthroughMode::Off),
            _ => Err(format!("--passthrough {s}: auto, on or off")),
        }
    }
}

/// How the kernel does one handle's I/O.
#[derive(Debug, Clone)]
pub enum KernelIo {
    /// Through the daemon, cached in the page cache: as always.
    Daemon,
    /// The kernel reads the backing file itself. Every passthrough handle of an inode gets
    /// the same file; the adapter registers it once and reuses it while any is open.
    Passthrough(Arc<File>),
}

/// The passthrough state of a mount: on or off, and per inode who has it open how.
#[derive(Default)]
pub(super) struct Passthrough {
    enabled: AtomicBool,
    /// Held across one read open's decision, which may wait for the read cache, so two opens
    /// of one inode cannot both decide to be its first.
    gate: tokio::sync::Mutex<()>,
    inodes: Mutex<HashMap<Ino, InodeIo>>,
}

#[derive(Default)]
struct InodeIo {
    /// Handles passing through to `backing`.
    through: usize,
    /// Every other handle (through the daemon).
    other: usize,
    /// The backing file, while `through` > 0.
    backing: Option<Arc<File>>,
    /// The object key of the inode, while `through` > 0.
    key: String,
}

/// How an open handle was counted, for its release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Counted {
    Through,
    Other,
}

impl Passthrough {
    pub fn enable(&self) {
        self.enabled.store(true, Ordering::SeqCst);
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::SeqCst)
    }

    /// `FileBusy` while readers of the file at `key` pass through: a change to its bytes
    /// (opening it for writing, a truncating create, a truncate) is refused before anything
    /// is changed.
    pub fn check_key(&self, key: &str) -> FsResult<()> {
        if !self.enabled() {
            return Ok(());
        }
        let busy = self
            .inodes
            .lock()
            .values()
            .any(|st| st.through > 0 && st.key == key);
        match busy {
            true => Err(FsError::FileBusy),
            false => Ok(()),
        }
    }

    /// An open that cannot pass through (a writer, a file being written, a file not in the
    /// read cache): through the daemon, or `FileBusy` while the inode's readers pass through.
    pub fn other_open(&self, ino: Ino) -> FsResult<(KernelIo, Counted)> {
        if !self.enabled() {
            return Ok((KernelIo::Daemon, Counted::Other));
        }
        let mut inodes = self.inodes.lock();
        let st = inodes.entry(ino).or_default();
        if st.through > 0 {
            return Err(FsError::FileBusy);
        }
        st.other += 1;
        Ok((KernelIo::Daemon, Counted::Other))
    }

    /// A read open of the file at `key`: it joins the inode's passthrough readers if there are
    /// any; passes through when it is the inode's only handle and `backing` (asked only then)
    /// gives the file; otherwise goes through the daemon.
    pub async fn read_open<F, Fut>(&self, ino: Ino, key: &str, backing: F) -> (KernelIo, Counted)
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Option<File>>,
    {
        if !self.enabled() {
            return (KernelIo::Daemon, Counted::Other);
        }
        let _gate = self.gate.lock().await;
        {
            let mut inodes = self.inodes.lock();
            let st = inodes.entry(ino).or_default();
            if let (Some(file), true) = (&st.backing, st.through > 0) {
                crate::metrics::passthrough_open();
                st.through += 1;
                return (KernelIo::Passthrough(file.clone()), Counted::Through);
            }
            if st.other > 0 {
                st.other += 1;
                return (KernelIo::Daemon, Counted::Other);
            }
        }
        let file = backing().await;
        let mut inodes = self.inodes.lock();
        let st = inodes.entry(ino).or_default();
        match file {
            // Nobody opened the inode meanwhile (a writer does not wait for the gate).
            Some(f) if st.other == 0 && st.through == 0 => {
                let f = Arc::new(f);
                crate::metrics::passthrough_open();
                st.through = 1;
                st.backing = Some(f.clone());
                st.key = key.to_string();
                (KernelIo::Passthrough(f), Counted::Through)
            }
            _ => {
                st.other += 1;
                (KernelIo::Daemon, Counted::Other)
            }
        }
    }

    /// A handle counted `how` is released; the backing file goes with the last passthrough
    /// handle.
    pub fn release(&self, ino: Ino, how: Counted) {
        if !self.enabled() {
            return;
        }
        let mut inodes = self.inodes.lock();
        let Some(st) = inodes.get_mut(&ino) else {
            return;
        };
        match how {
            Counted::Through => {
                st.through = st.through.saturating_sub(1);
                if st.through == 0 {
                    st.backing = None;
                }
            }
            Counted::Other => st.other = st.other.saturating_sub(1),
        }
        if st.through == 0 && st.other == 0 {
            inodes.remove(&ino);
        }
    }

    /// A handle the adapter could not pass through after all (the kernel refused the backing
    /// file): counted as any other from now on.
    pub fn refused(&self, ino: Ino) {
        let mut inodes = self.inodes.lock();
        if let Some(st) = inodes.get_mut(&ino) {
            st.through = st.through.saturating_sub(1);
            st.other += 1;
            if st.through == 0 {
                st.backing = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> File {
        tempfile::tempfile().unwrap()
    }

    fn through(io: &KernelIo) -> bool {
        matches!(io, KernelIo::Passthrough(_))
    }

    #[tokio::test]
    async fn one_backing_file_per_inode_and_no_other_open_beside_it() {
        let p = Passthrough::default();
        let off = p.read_open(1, "k", || async { Some(file()) }).await;
        assert!(!through(&off.0), "off");
        assert!(p.other_open(1).is_ok(), "off: anything goes");
        p.enable();
        let (a, ca) = p.read_open(1, "k", || async { Some(file()) }).await;
        let (b, cb) = p
            .read_open(1, "k", || async { panic!("asked twice") })
            .await;
        match (&a, &b) {
            (KernelIo::Passthrough(x), KernelIo::Passthrough(y)) => assert!(Arc::ptr_eq(x, y)),
            _ => panic!("{a:?} {b:?}"),
        }
        // A writer cannot join them: busy, not EIO; nor may the file be changed by name.
        assert_eq!(p.other_open(1).unwrap_err(), FsError::FileBusy);
        assert_eq!(p.check_key("k"), Err(FsError::FileBusy));
        assert_eq!(p.check_key("j"), Ok(()));
        for c in [ca, cb] {
            assert_eq!(c, Counted::Through);
            p.release(1, c);
        }
        // All closed: a writer opens, and then a reader cannot pass through beside it.
        let (w, cw) = p.other_open(1).unwrap();
        assert!(!through(&w));
        let (r, cr) = p.read_open(1, "k", || async { Some(file()) }).await;
        assert!(!through(&r));
        p.release(1, cw);
        p.release(1, cr);
        assert!(p.inodes.lock().is_empty());
        // Not in the cache: as always.
        assert!(!through(&p.read_open(2, "j", || async { None }).await.0));
    }
}
