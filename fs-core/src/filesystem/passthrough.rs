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
//!   at an open when no other handle of the inode is open, nor any change of the file under
//!   way, and the backing file is let go at the last release.
//! - While the inode's readers pass through: another reader joins them, and reads the
//!   generation they read, even if the bucket holds a newer one by now (it shows at the first
//!   open after they all closed, as a file replaced by a rename shows on a local disk). A change
//!   of the file (an open for writing, a truncating create, a truncate) is refused with
//!   `ETXTBSY`, "text file busy", as Linux refuses to change a program being run: never `EIO`,
//!   nothing changed first, and nothing ever written into a cache file.
//! - The kernel lets go of a handle before it tells the daemon (`RELEASE` comes in the
//!   background after `close()` returned), so a change that meets readers waits a moment for
//!   their releases before it is refused, and `cat f; echo x > f` works.
//! - A passthrough open never carries `FOPEN_KEEP_CACHE`.
//!
//! Whether the mount uses passthrough at all is the adapter's to find out (the kernel offers
//! it at `init` only without the write-back cache, and registering a backing file needs
//! `CAP_SYS_ADMIN`); [`PassthroughMode::decide`] says when it is wanted,
//! [`Filesystem::enable_passthrough`](super::Filesystem::enable_passthrough) turns it on, and a
//! backing file the kernel refuses turns it off for new opens.

use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::error::{FsError, FsResult};
use crate::namespace::Ino;

/// How long a change that meets passthrough readers waits for their releases to arrive.
const RELEASE_GRACE: Duration = Duration::from_millis(250);

/// `--passthrough`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PassthroughMode {
    /// Where the kernel and the mount's privileges allow it, in the way the mount gains by
    /// ([`Self::decide`]): reads of cached files on `--read-only` mounts, files being written
    /// on writable ones.
    #[default]
    Auto,
    /// Reads of cached files wherever the kernel and privileges allow it, writable mounts too
    /// (their writes then go without the kernel's write-back cache, and a writer meeting such
    /// readers gets `ETXTBSY`).
    On,
    /// As `On`, and files being written pass through to their staged copies too
    /// ([`crate::write::passthrough`]).
    Writes,
    Off,
}

/// What passes through on a mount that asks the kernel for passthrough.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Through {
    /// Reads of files wholly in the read cache, from their cache files.
    pub reads: bool,
    /// Files being written whose bytes are all local, to their staged copies.
    pub writes: bool,
}

/// What [`PassthroughMode::decide`] goes by.
#[derive(Debug, Clone, Default)]
pub struct MountFacts {
    /// The mount may register backing files (`CAP_SYS_ADMIN`).
    pub root: bool,
    /// No writes through the mount.
    pub read_only: bool,
    /// There is a `--read-cache-dir`, whose files reads can pass through to.
    pub read_cache: bool,
    /// Files being written may pass through: no `--cache-size`, whose accounting cannot see
    /// the kernel's writes as they happen.
    pub writes_allowed: bool,
    /// Why the kernel would refuse every backing file here, if it would: the mount's user
    /// namespace ([`crate::platform::passthrough_refusal`]).
    pub refusal: Option<String>,
    /// Why it would refuse the read cache's files (its file system,
    /// [`crate::platform::stacked_fs`]), if it would.
    pub read_refusal: Option<String>,
    /// Why it would refuse the staged copies, if it would.
    pub write_refusal: Option<String>,
    /// The cache disk has room for the kernel's writes now
    /// ([`crate::write::passthrough::PASSTHROUGH_ROOM`]).
    pub room: bool,
}

impl PassthroughMode {
    /// Whether a mount should ask the kernel for passthrough, and if not why not (one line,
    /// for the start-up log).
    ///
    /// Asking costs the mount the kernel's write-back cache (the kernel offers passthrough only
    /// without it): every write through the daemon then arrives as the program makes it, 4 KiB
    /// at a time for `dd bs=4k`, instead of in batches. `auto` weighs that by what the mount
    /// does (docs/benchmarks.md, "The default on a root mount"): a `--read-only` mount loses nothing, so its
    /// cached files are read by the kernel; a writable mount gains most from the files it
    /// writes whole (copies, saves: 3.3 times faster until `close()` returns), so those pass
    /// through, and cached reads do not, so that a writer never meets readers passing
    /// through as a busy file. It asks only where the kernel would grant something: not when
    /// every backing file would be refused, nor for writes when `--cache-size` keeps them off
    /// or the cache disk has no room for them now (a mount that would pass nothing through
    /// must keep its write-back cache).
    pub fn decide(self, f: &MountFacts) -> Result<Through, String> {
        let writable = !f.read_only;
        let through = match self {
            PassthroughMode::Off => return Err("--passthrough off".into()),
            PassthroughMode::Auto if writable => Through {
                reads: false,
                writes: true,
            },
            PassthroughMode::Auto | PassthroughMode::On => Through {
                reads: true,
                writes: false,
            },
            PassthroughMode::Writes => Through {
                reads: true,
                writes: writable,
            },
        };
        if !f.root {
            return Err("it needs root (CAP_SYS_ADMIN) to register backing files".into());
        }
        if let Some(why) = &f.refusal {
            return Err(why.clone());
        }
        let reads = through.reads && f.read_cache && f.read_refusal.is_none();
        let writes = through.writes
            && f.writes_allowed
            && f.write_refusal.is_none()
            && (f.room || self != PassthroughMode::Auto);
        if reads || writes {
            return Ok(Through { reads, writes });
        }
        Err(if through.writes && !f.writes_allowed {
            "--cache-size: its accounting cannot see the kernel's writes, so files being \
             written go through bucketdrive"
                .into()
        } else if let (true, Some(why)) = (through.writes, &f.write_refusal) {
            why.clone()
        } else if through.writes {
            "the cache disk has less than 1 GiB free for files the kernel would write".into()
        } else if let (true, Some(why)) = (f.read_cache, &f.read_refusal) {
            why.clone()
        } else {
            "no --read-cache-dir: no local file to pass reads through to".into()
        })
    }
}

impl std::str::FromStr for PassthroughMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(PassthroughMode::Auto),
            "on" => Ok(PassthroughMode::On),
            "writes" => Ok(PassthroughMode::Writes),
            "off" => Ok(PassthroughMode::Off),
            _ => Err(format!("--passthrough {s}: auto, on, writes or off")),
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

/// The passthrough state of a mount: whether it is on, and per inode who has it open how.
#[derive(Default)]
pub(super) struct Passthrough {
    /// Handles are counted (the kernel was asked for passthrough).
    enabled: AtomicBool,
    /// New opens may pass through (off again once the kernel refused a backing file).
    offering: AtomicBool,
    /// Files wholly in the read cache may pass through to their cache files.
    reads: AtomicBool,
    /// Files being written may pass through to their working copies (a writable mount).
    writes: AtomicBool,
    inodes: Mutex<HashMap<Ino, InodeIo>>,
    /// Keys of files a change is under way on: none of them may start passing through.
    changing: Mutex<HashMap<String, usize>>,
    /// Told at every release, for changes waiting on readers.
    released: tokio::sync::Notify,
    /// Told when an inode's first open has decided, for opens of it that came meanwhile.
    decided: tokio::sync::Notify,
}

#[derive(Default)]
struct InodeIo {
    /// Handles passing through to `backing`.
    through: usize,
    /// Every other handle (through the daemon).
    other: usize,
    /// An open is finding out whether it can be the inode's first passthrough handle.
    deciding: bool,
    /// The backing file, while `through` > 0.
    backing: Option<Arc<File>>,
    /// The backing file is a working copy (the file is being written), not a read cache
    /// file: writers join its handles, and changes are made to it in place.
    staged: bool,
}

impl InodeIo {
    fn idle(&self) -> bool {
        self.through == 0 && self.other == 0 && !self.deciding
    }
}

/// How an open handle was counted, for its release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Counted {
    Through,
    Other,
}

/// A change of the file at a key is under way ([`Passthrough::begin_change`]): no open of it
/// starts passing through until this is dropped.
pub(super) struct Change<'a> {
    pt: &'a Passthrough,
    key: Option<String>,
}

impl Drop for Change<'_> {
    fn drop(&mut self) {
        if let Some(key) = &self.key {
            let mut changing = self.pt.changing.lock();
            if let Some(n) = changing.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    changing.remove(key);
                }
            }
        }
    }
}

impl Passthrough {
    /// `through`: which files pass through.
    pub fn enable(&self, through: Through) {
        self.enabled.store(true, Ordering::SeqCst);
        self.offering.store(true, Ordering::SeqCst);
        self.reads.store(through.reads, Ordering::SeqCst);
        self.writes.store(through.writes, Ordering::SeqCst);
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::SeqCst)
    }

    /// The kernel refused a backing file: no new open passes through (handles that do keep
    /// being counted until they are released).
    pub fn stop_offering(&self) {
        self.offering.store(false, Ordering::SeqCst);
    }

    /// Starts a change of the bytes of the file at `key`, whose inode (if the kernel knows
    /// one there) is `ino`: refused with `FileBusy` while readers pass through that inode
    /// (after waiting a moment for releases on their way), and until it ends no open of `key`
    /// starts passing through. Taken before anything is changed.
    pub async fn begin_change(&self, key: &str, ino: Option<Ino>) -> FsResult<Change<'_>> {
        if !self.enabled() {
            return Ok(Change {
                pt: self,
                key: None,
            });
        }
        *self.changing.lock().entry(key.to_string()).or_default() += 1;
        let change = Change {
            pt: self,
            key: Some(key.to_string()),
        };
        let Some(ino) = ino else {
            return Ok(change);
        };
        let deadline = tokio::time::Instant::now() + RELEASE_GRACE;
        loop {
            // Registered before the check, so a release between the two is not missed.
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            // A working copy passing through is changed in place: no reader of a cache file.
            let readers = self
                .inodes
                .lock()
                .get(&ino)
                .is_some_and(|st| st.through > 0 && !st.staged);
            if !readers {
                return Ok(change);
            }
            if tokio::time::timeout_at(deadline, released).await.is_err() {
                return Err(FsError::FileBusy);
            }
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
    /// any; passes through when it is the inode's only handle, no change of the file is under
    /// way, and `backing` gives the file; otherwise goes through the daemon. Opens of an inode
    /// that come while its first open decides wait for that decision and follow it.
    pub async fn read_open<F, Fut>(&self, ino: Ino, key: &str, backing: F) -> (KernelIo, Counted)
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Option<File>>,
    {
        if !self.enabled() {
            return (KernelIo::Daemon, Counted::Other);
        }
        loop {
            // Registered before the look, so a decision made between the two is not missed.
            let decided = self.decided.notified();
            tokio::pin!(decided);
            decided.as_mut().enable();
            {
                let mut inodes = self.inodes.lock();
                let st = inodes.entry(ino).or_default();
                if let (Some(file), true) = (&st.backing, st.through > 0) {
                    st.through += 1;
                    return (KernelIo::Passthrough(file.clone()), Counted::Through);
                }
                let offered = self.offering.load(Ordering::SeqCst)
                    && self.reads.load(Ordering::SeqCst)
                    && !self.changing.lock().contains_key(key);
                if st.through > 0 || st.other > 0 || !offered {
                    st.other += 1;
                    return (KernelIo::Daemon, Counted::Other);
                }
                if !st.deciding {
                    st.deciding = true;
                    break;
                }
            }
            // Another open of the inode is deciding (four readers starting at once): its
            // answer is this one's too.
            decided.await;
        }
        let file = backing().await;
        let result = self.decide(ino, key, file);
        self.decided.notify_waiters();
        result
    }

    /// An open of a file being written (its item's working copy): it joins the inode's
    /// passthrough handles if they pass through to a working copy; is refused with `FileBusy`
    /// while they pass through to a read cache file; passes through when it is the inode's
    /// only handle and `backing` gives the working copy's file (which counts the item's
    /// passthrough handle); otherwise goes through the daemon. `joined` counts a handle that
    /// joins at the item.
    pub async fn staged_open<F, Fut, J, JFut>(
        &self,
        ino: Ino,
        backing: F,
        joined: J,
    ) -> FsResult<(KernelIo, Counted)>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Option<File>>,
        J: FnOnce(Arc<File>) -> JFut,
        JFut: std::future::Future<Output = ()>,
    {
        if !self.writes.load(Ordering::SeqCst) {
            return self.other_open(ino);
        }
        loop {
            let decided = self.decided.notified();
            tokio::pin!(decided);
            decided.as_mut().enable();
            let joining = {
                let mut inodes = self.inodes.lock();
                let st = inodes.entry(ino).or_default();
                match (&st.backing, st.through > 0, st.staged) {
                    (Some(file), true, true) => {
                        st.through += 1;
                        Some(file.clone())
                    }
                    (_, true, false) => return Err(FsError::FileBusy),
                    _ if st.other > 0 || !self.offering.load(Ordering::SeqCst) => {
                        st.other += 1;
                        return Ok((KernelIo::Daemon, Counted::Other));
                    }
                    _ if !st.deciding => {
                        st.deciding = true;
                        break;
                    }
                    _ => None,
                }
            };
            if let Some(file) = joining {
                joined(file.clone()).await;
                return Ok((KernelIo::Passthrough(file), Counted::Through));
            }
            decided.await;
        }
        let file = backing().await;
        let result = {
            let mut inodes = self.inodes.lock();
            let st = inodes.entry(ino).or_default();
            st.deciding = false;
            match file {
                Some(f) => {
                    let f = Arc::new(f);
                    st.through = 1;
                    st.staged = true;
                    st.backing = Some(f.clone());
                    (KernelIo::Passthrough(f), Counted::Through)
                }
                None => {
                    st.other += 1;
                    (KernelIo::Daemon, Counted::Other)
                }
            }
        };
        self.decided.notify_waiters();
        Ok(result)
    }

    /// The end of an inode's first open's decision (see [`Self::read_open`]).
    fn decide(&self, ino: Ino, key: &str, file: Option<File>) -> (KernelIo, Counted) {
        let mut inodes = self.inodes.lock();
        let st = inodes.entry(ino).or_default();
        st.deciding = false;
        match file {
            Some(f)
                if st.other == 0 && st.through == 0 && !self.changing.lock().contains_key(key) =>
            {
                let f = Arc::new(f);
                st.through = 1;
                st.staged = false;
                st.backing = Some(f.clone());
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
        {
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
            if st.idle() {
                inodes.remove(&ino);
            }
        }
        self.released.notify_waiters();
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

    /// Whether handles of `ino` pass through now, counted here: an open that joins them may
    /// not have reached the item yet ([`crate::write::WriteBack::leave_passthrough`]).
    pub fn passing_through(&self, ino: Ino) -> bool {
        self.inodes
            .lock()
            .get(&ino)
            .is_some_and(|st| st.through > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const READS: Through = Through {
        reads: true,
        writes: false,
    };

    fn file() -> File {
        tempfile::tempfile().unwrap()
    }

    fn through(io: &KernelIo) -> bool {
        matches!(io, KernelIo::Passthrough(_))
    }

    /// What each mode asks for: `auto` reads on read-only mounts and writes on writable
    /// ones, and nothing where nothing would pass (the write-back cache is kept).
    #[test]
    fn each_mode_asks_for_what_the_mount_gains_by() {
        use PassthroughMode::*;
        let facts = |read_only, read_cache| MountFacts {
            root: true,
            read_only,
            read_cache,
            writes_allowed: true,
            refusal: None,
            read_refusal: None,
            write_refusal: None,
            room: true,
        };
        let t = |reads, writes| Ok(Through { reads, writes });
        assert_eq!(Auto.decide(&facts(true, true)), t(true, false));
        assert_eq!(Auto.decide(&facts(false, true)), t(false, true));
        assert_eq!(Auto.decide(&facts(false, false)), t(false, true));
        assert_eq!(On.decide(&facts(false, true)), t(true, false));
        assert_eq!(Writes.decide(&facts(false, true)), t(true, true));
        assert_eq!(Writes.decide(&facts(true, true)), t(true, false));
        assert!(
            Auto.decide(&facts(true, false)).is_err(),
            "read-only, no cache"
        );
        assert!(On.decide(&facts(false, false)).is_err());
        assert!(Off.decide(&facts(false, true)).is_err());
        let no = |f: MountFacts| Auto.decide(&f).unwrap_err();
        assert!(no(MountFacts {
            root: false,
            ..facts(false, true)
        })
        .contains("root"));
        assert!(no(MountFacts {
            refusal: Some("overlayfs".into()),
            ..facts(false, true)
        })
        .contains("overlayfs"));
        // A stacked file system under one kind of file leaves the other passing through.
        let staged_on_overlay = MountFacts {
            write_refusal: Some("staging on overlayfs".into()),
            ..facts(false, true)
        };
        assert!(no(staged_on_overlay.clone()).contains("overlayfs"));
        assert_eq!(Writes.decide(&staged_on_overlay), t(true, false));
        let cache_on_overlay = MountFacts {
            read_refusal: Some("read cache on overlayfs".into()),
            ..facts(false, true)
        };
        assert_eq!(Auto.decide(&cache_on_overlay), t(false, true));
        assert_eq!(Writes.decide(&cache_on_overlay), t(false, true));
        assert!(On
            .decide(&cache_on_overlay)
            .unwrap_err()
            .contains("overlayfs"));
        assert!(no(MountFacts {
            writes_allowed: false,
            ..facts(false, true)
        })
        .contains("--cache-size"));
        assert!(no(MountFacts {
            room: false,
            ..facts(false, true)
        })
        .contains("1 GiB free"));
        // Asked for by name, writes pass through once the disk has room again.
        let low = MountFacts {
            room: false,
            ..facts(false, false)
        };
        assert_eq!(Writes.decide(&low), t(false, true));
    }

    /// With reads not passing through (a writable mount under `auto`), a reader of a cached
    /// file goes through the daemon, and a writer beside it is never told the file is busy.
    #[tokio::test]
    async fn without_reads_a_cached_file_is_read_through_the_daemon() {
        let p = Passthrough::default();
        p.enable(Through {
            reads: false,
            writes: true,
        });
        let (r, cr) = p.read_open(1, "k", || async { panic!("not asked") }).await;
        assert!(!through(&r));
        assert!(p.begin_change("k", Some(1)).await.is_ok());
        p.release(1, cr);
    }

    #[tokio::test]
    async fn one_backing_file_per_inode_and_no_change_beside_it() {
        let p = Passthrough::default();
        let off = p.read_open(1, "k", || async { Some(file()) }).await;
        assert!(!through(&off.0), "off");
        assert!(p.other_open(1).is_ok(), "off: anything goes");
        p.enable(READS);
        let (a, ca) = p.read_open(1, "k", || async { Some(file()) }).await;
        let (b, cb) = p
            .read_open(1, "k", || async { panic!("asked twice") })
            .await;
        match (&a, &b) {
            (KernelIo::Passthrough(x), KernelIo::Passthrough(y)) => assert!(Arc::ptr_eq(x, y)),
            _ => panic!("{a:?} {b:?}"),
        }
        // A writer cannot join them: busy, not EIO; nor may the file be changed.
        assert_eq!(p.other_open(1).unwrap_err(), FsError::FileBusy);
        assert_eq!(
            p.begin_change("k", Some(1)).await.err(),
            Some(FsError::FileBusy)
        );
        // Another file, or a new one at the name (no inode there yet): fine.
        assert!(p.begin_change("j", Some(2)).await.is_ok());
        assert!(p.begin_change("k", None).await.is_ok());
        // A change waits for releases on their way.
        let released = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            p.release(1, ca);
            p.release(1, cb);
        };
        let (change, ()) = tokio::join!(p.begin_change("k", Some(1)), released);
        let change = change.expect("the readers let go meanwhile");
        // While it is under way, the file does not start passing through.
        let (r, cr) = p.read_open(1, "k", || async { Some(file()) }).await;
        assert!(!through(&r));
        drop(change);
        p.release(1, cr);
        assert!(p.inodes.lock().is_empty());
        // A writer opens, and then a reader cannot pass through beside it.
        let (w, cw) = p.other_open(1).unwrap();
        assert!(!through(&w));
        let (r, cr) = p.read_open(1, "k", || async { Some(file()) }).await;
        assert!(!through(&r));
        p.release(1, cw);
        p.release(1, cr);
        // Four readers starting at once all pass through, to one file.
        let slow = || async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Some(file())
        };
        let opens = tokio::join!(
            p.read_open(5, "m", slow),
            p.read_open(5, "m", slow),
            p.read_open(5, "m", slow),
            p.read_open(5, "m", slow)
        );
        for (io, c) in [opens.0, opens.1, opens.2, opens.3] {
            assert!(through(&io));
            p.release(5, c);
        }
        // Not in the cache: as always. Refused by the kernel once: no more offers.
        assert!(!through(&p.read_open(2, "j", || async { None }).await.0));
        p.stop_offering();
        assert!(!through(
            &p.read_open(3, "i", || async { Some(file()) }).await.0
        ));
    }
}
