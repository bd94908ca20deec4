//! The few local-file calls that differ between Unix and Windows, so the rest of the core is
//! written once.
//!
//! The mount's own directories are private to its user (0700 and 0600 files on Unix; a
//! protected DACL admitting the user, SYSTEM and Administrators on Windows), held open, and the
//! files in them are reached only through that hold ([`Dir`], [`At`]), never by a path looked
//! up again. Positional reads and writes never move a shared cursor, so concurrent handles of
//! one staged file need no lock: `pread`/`pwrite` on Unix, `ReadFile`/`WriteFile` with an
//! offset on Windows.

use std::fs::{DirBuilder, File};
use std::io;
use std::path::Path;

mod dir;
#[cfg(windows)]
mod windows_acl;

pub use dir::{At, Dir, FreeLook, Open, Stat};
#[cfg(windows)]
pub use windows_acl::{current_user_sid, private_dacl_sddl};

/// Windows: the share mode of every file the mount opens. With `FILE_SHARE_DELETE` a staging
/// file another handle holds open can still be renamed (the staging pool's recycling) or
/// removed (an upload's cleanup), as on Unix; without it, both fail with a sharing violation.
#[cfg(windows)]
pub const SHARE_ALL: u32 = windows_sys::Win32::Storage::FileSystem::FILE_SHARE_READ
    | windows_sys::Win32::Storage::FileSystem::FILE_SHARE_WRITE
    | windows_sys::Win32::Storage::FileSystem::FILE_SHARE_DELETE;

/// Creates `path` and whatever of its parents is missing; directories it creates are readable
/// only by the user (0700 on Unix). Directories that already exist are left exactly as they
/// are: a parent may be one the user named, such as `/tmp`, whose mode is not ours to change.
pub fn create_dirs(path: &Path) -> io::Result<()> {
    let mut builder = DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(path)
}

/// Refuses a directory the mount keeps its files under when another user could swap what is
/// there: `path` and every directory above it must belong to us or to root and be writable by
/// nobody else, unless sticky (as `/tmp`, where only an entry's owner may rename or remove it).
/// Checked once, on the real path; below it, bucketdrive's own directories are 0700.
#[cfg(unix)]
pub fn check_ancestry(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let real = path.canonicalize()?;
    // SAFETY: geteuid and getegid cannot fail.
    let (me, my_group) = unsafe { (libc::geteuid(), libc::getegid()) };
    // The path as given (a symbolic link in it is swapped by whoever can write the directory
    // holding it, which is checked too) and the real one it leads to.
    let given = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    for dir in given.ancestors().chain(real.ancestors()) {
        let meta = std::fs::symlink_metadata(dir)?;
        let (mode, owner) = (meta.mode(), meta.uid());
        let sticky = mode & 0o1000 != 0;
        // Group-writable is fine for the user's own group (a private group, as umask 002
        // systems make for every user).
        let group_writes = mode & 0o020 != 0 && meta.gid() != my_group;
        let why = if meta.file_type().is_symlink() {
            // Where it points is checked with the real path; the link itself can only be
            // changed through its directory, which is checked too.
            None
        } else if owner != me && owner != 0 {
            Some(format!("it belongs to user {owner}"))
        } else if (mode & 0o002 != 0 || group_writes) && !sticky {
            Some(format!(
                "other users can write to it (mode {:o}) and it is not sticky",
                mode & 0o7777
            ))
        } else {
            None
        };
        if let Some(why) = why {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{} is not safe to keep staged files under: {why}, so another user could \
                     swap what bucketdrive opens there; use a directory only you (or root) can \
                     write to, or make it sticky (chmod +t)",
                    dir.display()
                ),
            ));
        }
    }
    Ok(())
}

/// Windows: the cache directory lives in the user's profile, whose ACL admits only the user,
/// SYSTEM and Administrators (see `docs/windows.md`).
#[cfg(not(unix))]
pub fn check_ancestry(_path: &Path) -> io::Result<()> {
    Ok(())
}

/// Makes files opened with `options` readable only by the user (the log file, which the user
/// names and so is not in a [`Dir`] of ours).
pub fn private_file(options: &mut std::fs::OpenOptions) -> &mut std::fs::OpenOptions {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600)
    }
    #[cfg(not(unix))]
    options
}

/// Windows: `path` in the `\\?\` form, absolute, so calls made with it are not limited to
/// `MAX_PATH` (260 characters): a default cache directory under a long profile path, for a
/// bucket name of up to 222 characters, passes it. std does the same for its own calls;
/// this is for the ones made directly.
#[cfg(windows)]
pub(crate) fn verbatim(path: &Path) -> std::path::PathBuf {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let text = abs.as_os_str().to_string_lossy();
    if text.starts_with(r"\\?\") || text.starts_with(r"\\.\") {
        abs
    } else if let Some(unc) = text.strip_prefix(r"\\") {
        std::path::PathBuf::from(format!(r"\\?\UNC\{unc}"))
    } else {
        std::path::PathBuf::from(format!(r"\\?\{text}"))
    }
}

/// Makes `file` sparse where the platform needs telling, so a staging or read-cache file of a
/// large object takes disk only for the bytes written into it. Linux files are sparse already;
/// NTFS files only after `FSCTL_SET_SPARSE` (without it, a write at 10 GiB allocates and
/// zeroes the 10 GiB before it). Best effort: FAT has no sparse files.
pub fn make_sparse(file: &File) {
    #[cfg(windows)]
    {
        use std::os::windows::io::AsRawHandle;
        use windows_sys::Win32::System::Ioctl::FSCTL_SET_SPARSE;
        use windows_sys::Win32::System::IO::DeviceIoControl;
        let mut returned = 0u32;
        // SAFETY: a control code that takes and returns no buffer, on a handle we own.
        let ok = unsafe {
            DeviceIoControl(
                file.as_raw_handle(),
                FSCTL_SET_SPARSE,
                std::ptr::null(),
                0,
                std::ptr::null_mut(),
                0,
                &mut returned,
                std::ptr::null_mut(),
            )
        };
        if ok == 0 {
            tracing::debug!(error = %io::Error::last_os_error(), "cannot make a file sparse");
        }
    }
    #[cfg(not(windows))]
    let _ = file;
}

/// Reads exactly `buf.len()` bytes at `offset`.
#[cfg(unix)]
pub fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

/// Writes all of `buf` at `offset`.
#[cfg(unix)]
pub fn write_all_at(file: &File, buf: &[u8], offset: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(file, buf, offset)
}

/// Reads exactly `buf.len()` bytes at `offset`.
#[cfg(windows)]
pub fn read_exact_at(file: &File, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !buf.is_empty() {
        match file.seek_read(buf, offset) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes all of `buf` at `offset`.
#[cfg(windows)]
pub fn write_all_at(file: &File, mut buf: &[u8], mut offset: u64) -> io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !buf.is_empty() {
        match file.seek_write(buf, offset) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                buf = &buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Starts writing the file's dirty pages to disk without waiting, so a later `fsync` has
/// little left to do. Only Linux has a call for this; elsewhere it is a no-op.
pub fn start_writeback(file: &File) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: a plain syscall on a descriptor we own; failure only loses the hint.
        let rc =
            unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
        if rc != 0 {
            tracing::debug!(error = %io::Error::last_os_error(), "sync_file_range failed");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = file;
}

/// Reports a failed write-back of the file's pages that this descriptor (its open file
/// description) has not yet been told of, without waiting for or starting any. Linux tells
/// each open file description of such a failure once (and the first `fsync` of a description
/// opened after it), so the engine asks through one opened before the writes it cares about.
/// A page whose write-back failed is reported before it can leave the page cache, so a check
/// after reading a file says whether what was read is what was written. Elsewhere: nothing to
/// report.
pub fn writeback_error(file: &File) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // Waits for the write-back of one byte far past any file's end (none), then reports
        // the error the file's mapping recorded since this description last asked.
        const NOWHERE: i64 = 1 << 62;
        // SAFETY: a plain syscall on a descriptor we own.
        let rc = unsafe {
            libc::sync_file_range(
                file.as_raw_fd(),
                NOWHERE,
                1,
                libc::SYNC_FILE_RANGE_WAIT_BEFORE,
            )
        };
        if rc != 0 {
            let e = io::Error::last_os_error();
            // A file or file system the call does not apply to has nothing to report.
            let unsupported = [libc::EINVAL, libc::ESPIPE, libc::ENOSYS, libc::EOPNOTSUPP];
            if e.raw_os_error().is_some_and(|n| unsupported.contains(&n)) {
                return Ok(());
            }
            return Err(e);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = file;
    Ok(())
}

/// Why the kernel would refuse every backing file of a FUSE passthrough mount made by this
/// process, if it would, for the start-up decision
/// ([`crate::filesystem::PassthroughMode::decide`]): asking for passthrough costs the mount
/// the kernel's write-back cache, which must not be given up for nothing. Registering a
/// backing file needs `CAP_SYS_ADMIN` in the initial user namespace, which no root of a user
/// namespace (a rootless container) has, nor a root whose capabilities were dropped (a
/// container's default).
pub fn passthrough_refusal() -> Option<String> {
    #[cfg(target_os = "linux")]
    {
        if let Ok(map) = std::fs::read_to_string("/proc/self/uid_map") {
            if !initial_namespace(&map) {
                return Some(
                    "the mount runs in a user namespace, where no one may register backing \
                     files"
                        .into(),
                );
            }
        }
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        (!sys_admin(&status)).then(|| {
            "the process lacks CAP_SYS_ADMIN, which registering backing files needs".into()
        })
    }
    #[cfg(not(target_os = "linux"))]
    {
        Some("FUSE passthrough is Linux's".into())
    }
}

/// Whether `uid_map` (as `/proc/self/uid_map` shows it) is the initial user namespace's,
/// which maps every id to itself.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn initial_namespace(uid_map: &str) -> bool {
    uid_map.split_whitespace().eq(["0", "0", "4294967295"])
}

/// The name of the stacked file system `dir` is on (overlayfs, eCryptfs), if it is: the
/// kernel takes no backing file from one while the mount allows a stacking depth of one
/// (`ELOOP`), so files there cannot pass through.
pub fn stacked_fs(dir: &Path) -> Option<&'static str> {
    #[cfg(target_os = "linux")]
    {
        let st = rustix::fs::statfs(dir).ok()?;
        // f_type is a signed word on some targets, unsigned on others.
        #[allow(clippy::unnecessary_cast)]
        stacked_magic(st.f_type as i64)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = dir;
        None
    }
}

/// Whether `status` (as `/proc/self/status` shows it) has `CAP_SYS_ADMIN` (bit 21) among the
/// effective capabilities; `true` where that cannot be told (the kernel refuses later).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn sys_admin(status: &str) -> bool {
    const CAP_SYS_ADMIN: u32 = 21;
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|caps| u64::from_str_radix(caps.trim(), 16).ok())
        .is_none_or(|caps| caps & (1 << CAP_SYS_ADMIN) != 0)
}

#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn stacked_magic(f_type: i64) -> Option<&'static str> {
    match f_type {
        0x794c_7630 => Some("overlayfs"),
        0xf15f => Some("eCryptfs"),
        _ => None,
    }
}

/// Whether an I/O error means the local disk is full (or over quota).
pub fn is_disk_full(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
    )
}

/// How `/proc/<pid>/maps` names the device `major:minor`.
pub fn maps_device(major: u64, minor: u64) -> String {
    format!("{major:02x}:{minor:02x}")
}

/// How `/proc/<pid>/maps` names `file` (its device and inode), where that can be told.
pub fn maps_id(file: &std::fs::File) -> Option<(String, u64)> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let m = file.metadata().ok()?;
        // The kernel's encoding of a device number (glibc's major() and minor()).
        let dev = m.dev();
        let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
        let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
        Some((maps_device(major, minor), m.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = file;
        None
    }
}

/// Whether one of processes `pids` maps one of the files `ids` shared (a mapping lives on
/// after its descriptor is closed, and a shared one writes to the file), each named as in
/// `/proc/<pid>/maps` (device, inode); `false` where that cannot be told.
pub fn mapped_by(ids: &[(String, u64)], pids: &[u32]) -> bool {
    if !cfg!(target_os = "linux") || ids.is_empty() {
        return false;
    }
    let ids: Vec<(&str, String)> = ids
        .iter()
        .map(|(d, i)| (d.as_str(), i.to_string()))
        .collect();
    pids.iter().any(|pid| {
        std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|maps| {
            maps.lines().any(|line| {
                let mut f = line.split_ascii_whitespace().skip(1);
                // Only shared mappings write to the file (`rw-s`, `r--s`).
                let shared = f.next().is_some_and(|perms| perms.ends_with('s'));
                let (dev, ino) = (f.nth(1), f.next());
                shared
                    && ids
                        .iter()
                        .any(|(d, i)| dev == Some(*d) && ino == Some(i.as_str()))
            })
        })
    })
}

/// Whether the file that `file` opens is also open any other way: by another descriptor not
/// duplicated from it, or by a mapping made through one, of any process (a mapping keeps the
/// open it was made through). `None` where that cannot be told.
///
/// Told by asking for a write lease, which the kernel grants only to the file's one open
/// (`fs/locks.c`, `check_conflicting_open`), and giving it back at once. Unlike
/// `/proc/<pid>/maps`, this needs no list of processes to look in: a mapping inherited by a
/// child, whose parent has since exited, is counted too. Another open of the file in the
/// moment the lease is held waits for its return; the signal that tells the holder so is
/// ignored (nothing else here uses it). `None`: no leases on this file system, or no right
/// to them (the file's owner, or `CAP_LEASE`).
pub fn opened_elsewhere(file: &std::fs::File) -> Option<bool> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        static QUIET: std::sync::Once = std::sync::Once::new();
        // SAFETY: setting a signal's disposition to "ignore" touches no memory of ours.
        QUIET.call_once(|| unsafe {
            libc::signal(libc::SIGIO, libc::SIG_IGN);
        });
        let fd = file.as_raw_fd();
        // SAFETY: fcntl on a descriptor `file` holds open; no pointers.
        if unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_WRLCK) } == 0 {
            // SAFETY: as above.
            if unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_UNLCK) } != 0 {
                // Every other open of the file would wait out the lease-break time.
                tracing::error!(error = %io::Error::last_os_error(), "could not give back a lease on a staging file");
            }
            return Some(false);
        }
        match io::Error::last_os_error().raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EBUSY) => Some(true),
            _ => None,
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = file;
        None
    }
}

/// Where per-user caches live: `$XDG_CACHE_HOME` or `~/.cache` on Unix, `%LOCALAPPDATA%` on
/// Windows.
pub fn user_cache_base() -> std::path::PathBuf {
    use std::path::PathBuf;
    #[cfg(windows)]
    if let Some(local) = std::env::var_os("LOCALAPPDATA") {
        return PathBuf::from(local);
    }
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/var/cache"))
}

/// Raises the soft limit on open descriptors to the hard limit. Each concurrent upload, open
/// file and HTTP connection holds one, and the default soft limit (often 1,024) is far below
/// what a busy mount needs. A no-op where there is no such limit.
pub fn raise_fd_limit() {
    #[cfg(unix)]
    {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: plain syscalls on a struct we own.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
                let old = lim.rlim_cur;
                lim.rlim_cur = lim.rlim_max;
                if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
                    tracing::debug!(from = old, to = lim.rlim_max, "raised the open-file limit");
                }
            }
        }
    }
}

thread_local! {
    /// Set by the deterministic simulation: blocking calls run inline on the calling thread, so
    /// one seed always gives one schedule.
    static INLINE_BLOCKING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The boot this process runs in: a replay in the same boot knows the kernel kept every page
/// written before a crash (no power cut came between), so a file the kernel wrote itself is
/// taken as it is ([`crate::write::passthrough`]). Linux's `boot_id`; elsewhere none (no
/// passthrough there). The simulation stands in a boot of its own for each power cut.
pub fn boot_id() -> Option<String> {
    static REAL: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    if let Some(b) = BOOT_OVERRIDE.with(|b| b.borrow().clone()) {
        return Some(b);
    }
    REAL.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    })
    .clone()
}

thread_local! {
    /// Set by the simulation (one thread per seed): the boot [`boot_id`] reports.
    static BOOT_OVERRIDE: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Stands `boot` in for the machine's boot on this thread (the simulation's power cut), or the
/// real one again.
pub fn set_boot_id(boot: Option<String>) {
    BOOT_OVERRIDE.with(|b| *b.borrow_mut() = boot);
}

/// Makes [`blocking`] run its work inline on this thread (`true`) or on tokio's blocking pool
/// (`false`, the default). Only the deterministic simulation turns it on: it runs everything
/// on one thread with a paused clock, and a pool thread would make the schedule depend on
/// timing.
pub fn set_inline_blocking(on: bool) {
    INLINE_BLOCKING.with(|c| c.set(on));
}

/// Whether [`blocking`] runs its work inline on this thread (see [`set_inline_blocking`]).
pub fn inline_blocking() -> bool {
    INLINE_BLOCKING.with(|c| c.get())
}

/// Runs blocking file work (fsync, whole-file passes, copies) off the async workers, so a slow
/// disk never stalls requests that do not touch it.
pub async fn blocking<T, F>(f: F) -> io::Result<T>
where
    F: FnOnce() -> io::Result<T> + Send + 'static,
    T: Send + 'static,
{
    if INLINE_BLOCKING.with(|c| c.get()) {
        return f();
    }
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| io::Error::other(format!("blocking task failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rootless container's map, or any but the identity over every id, is a user namespace;
    /// overlayfs and eCryptfs are stacked, ext4 (0xef53) and tmpfs (0x01021994) are not.
    #[test]
    fn what_the_kernel_refuses_backing_files_for() {
        assert!(initial_namespace("         0          0 4294967295\n"));
        assert!(!initial_namespace("         0     100000      65536\n"));
        assert!(!initial_namespace(""));
        assert!(sys_admin("Name:\tx\nCapEff:\t000001ffffffffff\n"));
        assert!(
            !sys_admin("CapEff:\t00000000a80425fb\n"),
            "docker's default set"
        );
        assert!(sys_admin("Name:\tx\n"), "not told: the kernel decides");
        assert_eq!(stacked_magic(0x794c_7630), Some("overlayfs"));
        assert_eq!(stacked_magic(0xf15f), Some("eCryptfs"));
        assert_eq!(stacked_magic(0xef53), None);
        assert_eq!(stacked_magic(0x0102_1994), None);
    }
}
