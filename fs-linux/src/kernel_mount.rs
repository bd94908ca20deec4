//! Attaching the FUSE device to the mountpoint, and taking it off again.
//!
//! Root mounts directly: it opens `/dev/fuse` and calls `mount(2)` with type
//! `fuse.bucketdrive` and the bucket as the source. Anyone else goes through the setuid helper
//! `fusermount3` from the `fuse3` package, as libfuse does: the helper checks the caller may
//! mount there (it owns the mountpoint; `allow_other` needs `user_allow_other` in
//! `/etc/fuse.conf`), mounts, and sends the open `/dev/fuse` descriptor back over a socket
//! pair named in `_FUSE_COMMFD`. Either way the caller gets the device descriptor and the
//! session is the same.
//!
//! Who may use the mount is decided in two places that must agree: the kernel's `user_id`,
//! `group_id` and `allow_other` mount options, and the session's ACL in `fuser`. The mount's
//! owner is always the user running bucketdrive; `--uid`/`--gid` only change the owner that
//! files *show*, which with `default_permissions` is what the kernel checks when another user
//! is let in by `allow_other`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use fuser::SessionACL;

/// What the kernel is told about a new mount.
pub struct KernelOptions<'a> {
    /// Shown as the mount's source in `mount` and `/proc/self/mountinfo`.
    pub source: &'a str,
    /// Who besides the owner may use the mount.
    pub acl: SessionACL,
    pub read_only: bool,
    /// No execve of files on the mount.
    pub noexec: bool,
    /// Symbolic links on the mount are not followed in path resolution.
    pub nosymfollow: bool,
}

impl KernelOptions<'_> {
    /// The options every mount carries, in `-o` syntax: permission checks in the kernel
    /// (against the attributes we report), and no device files, set-uid bits or atime updates.
    fn common(&self) -> Vec<String> {
        let mut v = vec!["default_permissions".to_string()];
        if self.acl != SessionACL::Owner {
            // The kernel knows only allow_other; fuser enforces the narrower allow_root.
            v.push("allow_other".into());
        }
        v
    }
}

/// Mounts `/dev/fuse` on `mountpoint` and returns the FUSE device.
pub fn mount(mountpoint: &Path, opts: &KernelOptions) -> io::Result<OwnedFd> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        mount_directly(mountpoint, opts)
    } else {
        mount_with_helper(mountpoint, opts)
    }
}

fn invalid(_: std::ffi::NulError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, "path or name contains NUL")
}

/// `mount(2)` as root. (fuser's own mount path cannot set the subtype without fusermount.)
fn mount_directly(mountpoint: &Path, opts: &KernelOptions) -> io::Result<OwnedFd> {
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?;
    let fd = OwnedFd::from(dev);
    let target = CString::new(mountpoint.as_os_str().as_encoded_bytes()).map_err(invalid)?;
    let source = CString::new(opts.source).map_err(invalid)?;
    let fstype = c"fuse.bucketdrive";
    // SAFETY: geteuid and getegid cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let mut data = vec![
        format!("fd={}", fd.as_raw_fd()),
        "rootmode=40000".into(),
        format!("user_id={uid}"),
        format!("group_id={gid}"),
    ];
    data.extend(opts.common());
    let data = CString::new(data.join(",")).map_err(invalid)?;
    let mut flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOATIME;
    if opts.read_only {
        flags |= libc::MS_RDONLY;
    }
    if opts.noexec {
        flags |= libc::MS_NOEXEC;
    }
    if opts.nosymfollow {
        // Before Linux 5.10 the flag is unknown and silently ignored: refuse rather than give
        // a mount that follows links after one that does not was asked for.
        if !kernel_at_least(5, 10) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "nosymfollow needs Linux 5.10 or later",
            ));
        }
        flags |= libc::MS_NOSYMFOLLOW;
    }
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Whether the running kernel is at least `major.minor` (from `uname`; false if unknown).
fn kernel_at_least(major: u32, minor: u32) -> bool {
    let Ok(release) = std::fs::read_to_string("/proc/sys/kernel/osrelease") else {
        return false;
    };
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    let (Some(Ok(a)), Some(Ok(b))) = (
        parts.next().map(str::parse::<u32>),
        parts.next().map(str::parse::<u32>),
    ) else {
        return false;
    };
    (a, b) >= (major, minor)
}

/// The environment variable through which fusermount3 finds its socket.
const COMMFD_ENV: &str = "_FUSE_COMMFD";

/// `fusermount3`: from `PATH`, else where Debian installs it (a mount helper may run with a
/// minimal `PATH`).
fn helper() -> PathBuf {
    let in_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("fusermount3"))
            .find(|c| c.is_file())
    });
    in_path.unwrap_or_else(|| PathBuf::from("/usr/bin/fusermount3"))
}

/// Runs `fusermount3`, turning "not installed" into advice.
fn run_helper(cmd: &mut Command) -> io::Result<std::process::Child> {
    cmd.spawn().map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => io::Error::new(
            e.kind(),
            "fusermount3 is not installed (Debian package fuse3); without it only root can mount",
        ),
        _ => e,
    })
}

/// Mounts through `fusermount3` and receives the device from it.
fn mount_with_helper(mountpoint: &Path, opts: &KernelOptions) -> io::Result<OwnedFd> {
    if opts.nosymfollow {
        // fusermount3 (3.14) knows no such option; dropping it would give the user a mount
        // that follows links after asking for one that does not.
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "nosymfollow needs a mount made as root: fusermount3 cannot set it",
        ));
    }
    let (ours, theirs) = UnixStream::pair()?;
    let mut options = vec![
        format!("fsname={}", opts.source),
        "subtype=bucketdrive".to_string(),
        "nosuid".into(),
        "nodev".into(),
        "noatime".into(),
    ];
    options.extend(opts.common());
    if opts.read_only {
        options.push("ro".into());
    }
    if opts.noexec {
        options.push("noexec".into());
    }
    let mut cmd = Command::new(helper());
    cmd.arg("-o")
        .arg(options.join(","))
        .arg("--")
        .arg(mountpoint)
        .env(COMMFD_ENV, theirs.as_raw_fd().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let raw = theirs.as_raw_fd();
    // SAFETY: the closure only calls fcntl, which is async-signal-safe, on a descriptor that
    // stays open until after spawn returns. It lets the helper inherit its end of the pair.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            if libc::fcntl(raw, libc::F_SETFD, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = run_helper(&mut cmd)?;
    drop(theirs);
    // The helper closes its end when it exits, so this returns either way (or times out).
    let received = receive_fd(&ours);
    drop(ours);
    if matches!(&received, Err(e) if e.kind() == io::ErrorKind::TimedOut) {
        let _ = child.kill();
    }
    let out = child.wait_with_output()?;
    if let Err(e) = &received {
        if e.kind() == io::ErrorKind::TimedOut {
            return Err(io::Error::new(e.kind(), e.to_string()));
        }
    }
    match received {
        Ok(Some(fd)) => Ok(fd),
        Ok(None) | Err(_) => {
            let mut msg = String::from_utf8_lossy(&out.stderr).trim().to_string();
            if msg.contains("/dev/fuse") && msg.contains("ermission denied") {
                msg.push_str(
                    " (fusermount3 opens /dev/fuse as the user: it must be mode 0666, as \
                     Debian's udev rules make it)",
                );
            }
            let kind = if msg.contains("user_allow_other") || msg.contains("ermission denied") {
                io::ErrorKind::PermissionDenied
            } else {
                io::ErrorKind::Other
            };
            Err(io::Error::new(
                kind,
                if msg.is_empty() {
                    format!("fusermount3 failed ({})", out.status)
                } else {
                    msg
                },
            ))
        }
    }
}

/// How long fusermount3 may take to mount and answer. It only checks and mounts; a helper
/// that takes longer is stuck, and `mount -a` or boot must not hang with it.
const HELPER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Reads one message from the helper and takes the descriptor it carries, if any. The
/// descriptor is close-on-exec from the start (later children, such as `fusermount3 -u`, must
/// not inherit the device); any extra ones are closed.
fn receive_fd(sock: &UnixStream) -> io::Result<Option<OwnedFd>> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    use std::os::fd::FromRawFd;
    sock.set_read_timeout(Some(HELPER_TIMEOUT))?;
    let mut byte = [0u8; 1];
    let mut iov = [io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 4]);
    let msg = loop {
        match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(nix::errno::Errno::EAGAIN) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("fusermount3 did not answer within {HELPER_TIMEOUT:?}"),
                ))
            }
            other => break other.map_err(io::Error::from)?,
        }
    };
    let mut received = None;
    for cmsg in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            for fd in fds.into_iter().filter(|&fd| fd >= 0) {
                // SAFETY: SCM_RIGHTS installed these descriptors in our table just now, and
                // nothing else refers to them; the first is kept, any other is closed.
                let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                if received.is_none() {
                    received = Some(owned);
                }
            }
        }
    }
    Ok(received)
}

/// Whether `/etc/fuse.conf` lets ordinary users pass `allow_other`.
pub fn users_may_allow_other() -> bool {
    std::fs::read_to_string("/etc/fuse.conf")
        .map(|t| t.lines().any(|l| l.trim() == "user_allow_other"))
        .unwrap_or(false)
}

/// Unmounts `mountpoint`: `umount2` as root, `fusermount3 -u` otherwise. `lazy` detaches a
/// busy mount instead of failing.
pub fn unmount(mountpoint: &Path, lazy: bool) -> io::Result<()> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        let mut cmd = Command::new(helper());
        cmd.arg("-u").arg("-q");
        if lazy {
            cmd.arg("-z");
        }
        cmd.arg("--")
            .arg(mountpoint)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let out = run_helper(&mut cmd)?.wait_with_output()?;
        if out.status.success() {
            return Ok(());
        }
        let msg = String::from_utf8_lossy(&out.stderr).trim().to_string();
        let kind = if msg.contains("busy") {
            io::ErrorKind::ResourceBusy
        } else {
            io::ErrorKind::Other
        };
        return Err(io::Error::new(kind, msg));
    }
    let c = CString::new(mountpoint.as_os_str().as_encoded_bytes()).map_err(invalid)?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: `c` is a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), flags) } != 0 {
        let e = io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EBUSY) => io::Error::new(io::ErrorKind::ResourceBusy, e),
            _ => e,
        });
    }
    Ok(())
}

/// The `major:minor` device of the mount at `p`, from /proc/self/mountinfo. Reading it there
/// sends no request to the mount, which matters before the session loop runs.
pub fn mount_device(p: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = p.to_string_lossy();
    info.lines().rev().find_map(|l| {
        let mut f = l.split(' ');
        let dev = f.nth(2)?;
        let mp = f.nth(1)?;
        (unescape_mount_path(mp) == want).then(|| dev.to_string())
    })
}

pub fn is_mounted(p: &Path) -> bool {
    mount_device(p).is_some()
}

/// The filesystem type of the topmost mount at `p` (`fuse.bucketdrive`, `nfs4`, `ext4`…),
/// from /proc/self/mountinfo: the field after the ` - ` separator.
pub fn mount_type(p: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = p.to_string_lossy();
    info.lines().rev().find_map(|l| {
        let mp = l.split(' ').nth(4)?;
        if unescape_mount_path(mp) != want {
            return None;
        }
        let (_, after) = l.split_once(" - ")?;
        after.split(' ').next().map(str::to_string)
    })
}

/// Mount paths in /proc escape space, tab, newline and backslash as octal.
fn unescape_mount_path(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// Dirty bytes the kernel holds for this mount (its bdi's `min_bytes` and `max_bytes`, with
/// `strict_limit`): the size of the window its write-back cache buffers before it starts
/// handing pages to us. Above three quarters of it (the kernel's free-run ceiling) writeback
/// starts and the writer is paced to our rate, so a big sequential file streams into its
/// staging file while it is written and `close()` flushes only the tail; below it a random
/// writer runs at page-cache speed (the `fio` job of the benchmark, 256 MiB, fits).
const DIRTY_WINDOW: u64 = 384 << 20;

/// The window as a share of memory, at most: the window is also a minimum the kernel keeps for
/// this mount out of the system's dirty-page allowance (about a fifth of memory), so on a small
/// machine a fixed 384 MiB would leave other disks, the cache disk among them, too little.
const DIRTY_WINDOW_MEMORY_SHARE: u64 = 16;

/// [`DIRTY_WINDOW`], or a sixteenth of memory if that is less.
fn dirty_window() -> u64 {
    // SAFETY: sysinfo only fills the struct it is given.
    let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
    if unsafe { libc::sysinfo(&mut info) } != 0 {
        return DIRTY_WINDOW;
    }
    #[allow(clippy::useless_conversion)] // c_ulong is 32 bits on some targets
    let total = u64::from(info.totalram).saturating_mul(u64::from(info.mem_unit));
    DIRTY_WINDOW.min(total / DIRTY_WINDOW_MEMORY_SHARE)
}

/// Share of the system's dirty-page allowance the kernel may hold for this mount where the
/// fixed window cannot be set (a kernel before 6.2, or too little memory for it).
const DIRTY_MAX_RATIO: u32 = 40;

/// Tunes the mount's backing device (`/sys/class/bdi/MAJ:MIN`):
/// - read-ahead, so sequential reads reach us as 1 MiB requests instead of 128 KiB ones;
/// - the dirty-page limits. The kernel's write-back cache buffers writes in the page cache and
///   sends them to us in batches, but for FUSE it defaults to a strict limit of 1% of the dirty
///   allowance, so a random writer is throttled to one small request at a time long before the
///   disk is busy. The limit is set to a fixed window of [`DIRTY_WINDOW`] instead (strict, so
///   writeback starts when this mount's own dirty pages pass it, not only the whole system's).
///   Where that is refused, the limit is lifted as before (`strict_limit` 0, `max_ratio` 40),
///   which keeps random writes fast but holds a big file's pages until `close()`.
///   `close()` and `fsync()` write every dirty page back to us before they return either way.
///
/// Only root may write these files; other users' mounts keep the kernel's defaults.
pub fn tune_backing_device(mountpoint: &Path, read_ahead: u64) -> io::Result<()> {
    let dev = mount_device(mountpoint)
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "mount not found in mountinfo"))?;
    let bdi = format!("/sys/class/bdi/{dev}");
    std::fs::write(
        format!("{bdi}/read_ahead_kb"),
        format!("{}\n", read_ahead / 1024),
    )?;
    let set = |knob: &str, value: u64| {
        std::fs::write(format!("{bdi}/{knob}"), format!("{value}\n")).map_err(|e| {
            tracing::debug!(bdi, knob, "cannot set: {e}");
            e
        })
    };
    // max before min: the kernel refuses a minimum above the maximum (FUSE's is 1%).
    let bytes = dirty_window();
    let window = set("max_bytes", bytes)
        .and_then(|_| set("min_bytes", bytes))
        .and_then(|_| set("strict_limit", 1));
    if window.is_err() {
        // Older kernels have no strict_limit or *_bytes knobs; the ratio alone still helps.
        let _ = set("min_bytes", 0);
        let _ = set("strict_limit", 0);
        let _ = set("max_ratio", u64::from(DIRTY_MAX_RATIO));
    }
    tracing::debug!(
        bdi,
        read_ahead_kb = read_ahead / 1024,
        dirty_window = window.is_ok(),
        "backing device tuned"
    );
    Ok(())
}
