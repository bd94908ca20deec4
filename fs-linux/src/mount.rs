//! `bucketdrive mount` and `unmount`: checks, logging, the runtime, and the FUSE session.
//!
//! Everything a user can get wrong is checked before detaching or while the parent still
//! waits, so each mistake is one clear line on the caller's terminal and a non-zero exit.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use fs_core::cli::{lifecycle, logging};
use std::os::fd::OwnedFd;

use fuser::{Config, Session, SessionACL};

use crate::daemon::{self, Forked, Outcome, Readiness};
use crate::fuse::FuseAdapter;
use crate::MountArgs;

pub fn run(args: MountArgs) -> ExitCode {
    let fail = |msg: String| {
        eprintln!("bucketdrive: {msg}");
        ExitCode::FAILURE
    };
    let (bucket, prefix) = match fs_core::config::parse_bucket_spec(&args.bucket) {
        Ok(v) => v,
        Err(e) => return fail(e),
    };
    let mountpoint = match check_mountpoint(&args.mountpoint) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    if !Path::new("/dev/fuse").exists() {
        return fail("/dev/fuse is missing: load the fuse kernel module (modprobe fuse)".into());
    }
    let mut readiness = if args.foreground {
        Readiness::foreground()
    } else {
        match daemon::detach() {
            Ok(Forked::Parent(Outcome::Ready)) => return ExitCode::SUCCESS,
            Ok(Forked::Parent(Outcome::Failed(msg))) => return fail(msg),
            Ok(Forked::Child(r)) => r,
            Err(e) => return fail(format!("cannot detach: {e}")),
        }
    };
    match serve(&args, bucket, prefix, &mountpoint, &mut readiness) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            tracing::error!("{msg}");
            readiness.failed(&msg);
            ExitCode::FAILURE
        }
    }
}

/// The mountpoint must exist, be a directory, and not already be a mount.
fn check_mountpoint(p: &Path) -> Result<PathBuf, String> {
    let abs = p
        .canonicalize()
        .map_err(|e| format!("mountpoint {} does not exist: {e}", p.display()))?;
    if !abs.is_dir() {
        return Err(format!("mountpoint {} is not a directory", abs.display()));
    }
    if is_mounted(&abs) {
        return Err(format!(
            "mountpoint {} is busy: something is already mounted there",
            abs.display()
        ));
    }
    Ok(abs)
}

fn is_mounted(p: &Path) -> bool {
    mount_device(p).is_some()
}

/// The `major:minor` device of the mount at `p`, from /proc/self/mountinfo. Reading it there
/// sends no request to the mount, which matters before the session loop runs.
fn mount_device(p: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = p.to_string_lossy();
    info.lines().rev().find_map(|l| {
        let mut f = l.split(' ');
        let dev = f.nth(2)?;
        let mp = f.nth(1)?;
        (unescape_mount_path(mp) == want).then(|| dev.to_string())
    })
}

/// Mount paths in /proc escape space, tab, newline and backslash as octal.
fn unescape_mount_path(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

fn serve(
    args: &MountArgs,
    bucket: String,
    prefix: String,
    mountpoint: &Path,
    readiness: &mut Readiness,
) -> Result<(), String> {
    // fuser logs every unimplemented request (xattrs, say) as a warning: keep it to errors.
    // Detached, standard error is /dev/null: the log goes to syslog or the cache directory.
    let destination = if args.foreground {
        logging::Destination::Attached
    } else {
        logging::Destination::Detached {
            cache_dir: args.common.cache_dir(&bucket, &prefix, mountpoint),
        }
    };
    logging::init(&args.common, &["fuser"], destination)?;
    let rt = lifecycle::runtime()?;
    // SAFETY: geteuid and getegid cannot fail.
    let uid = args.uid.unwrap_or_else(|| unsafe { libc::geteuid() });
    let gid = args.gid.unwrap_or_else(|| unsafe { libc::getegid() });
    let fs = lifecycle::open_filesystem(&rt, &args.common, &bucket, &prefix, mountpoint, |cfg| {
        cfg.uid = uid;
        cfg.gid = gid;
        cfg.file_mode = args.file_mode;
        cfg.dir_mode = args.dir_mode;
        cfg.posix_metadata = args.posix_metadata;
    })?;
    let cache_dir = args.common.cache_dir(&bucket, &prefix, mountpoint);
    let adapter = FuseAdapter::new(fs.clone(), rt.handle().clone());
    let fd = kernel_mount(mountpoint, &bucket, uid, gid)
        .map_err(|e| format!("cannot mount on {}: {e}", mountpoint.display()))?;
    let session = match Session::from_fd(adapter, fd, SessionACL::Owner, Config::default()) {
        Ok(s) => s,
        Err(e) => {
            let _ = detach_mount(mountpoint);
            return Err(format!(
                "FUSE handshake failed on {}: {e}",
                mountpoint.display()
            ));
        }
    };
    if let Err(e) = tune_backing_device(mountpoint, args.kernel_read_ahead) {
        tracing::warn!("could not tune the mount's backing device: {e}");
    }

    let mp = mountpoint.to_path_buf();
    rt.spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut int), Ok(mut term)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) else {
            tracing::error!("cannot install signal handlers");
            return;
        };
        tokio::select! {
            _ = int.recv() => {},
            _ = term.recv() => {},
        }
        tracing::info!(mountpoint = %mp.display(), "signal received, unmounting");
        if let Err(e) = unmount(&mp) {
            tracing::warn!("{e}; detaching the mount lazily");
            if let Err(e) = detach_mount(&mp) {
                tracing::error!("lazy unmount failed: {e}");
            }
        }
    });

    let control = Arc::new(lifecycle::Control::default());
    let _control = if fs.is_read_only() {
        None
    } else {
        match crate::control::serve(&rt, fs.clone(), &cache_dir, mountpoint, control.clone()) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!("no status socket: {e}");
                None
            }
        }
    };
    tracing::info!(mountpoint = %mountpoint.display(), bucket = %bucket, "mounted");
    readiness.ready();
    let result = session.run();
    tracing::info!("session ended");
    lifecycle::finish(rt, &fs, control.skip_drain());
    result.map_err(|e| format!("FUSE session failed: {e}"))
}

/// Mounts `/dev/fuse` on `mountpoint` as type `fuse.bucketdrive` with the bucket as its source,
/// and returns the FUSE device. (fuser's own mount path cannot set the subtype without
/// fusermount.)
fn kernel_mount(mountpoint: &Path, bucket: &str, uid: u32, gid: u32) -> std::io::Result<OwnedFd> {
    use std::ffi::CString;
    use std::os::fd::AsRawFd;
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?;
    let fd = OwnedFd::from(dev);
    let invalid = |_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "path or name contains NUL",
        )
    };
    let target = CString::new(mountpoint.as_os_str().as_encoded_bytes()).map_err(invalid)?;
    let source = CString::new(bucket).map_err(invalid)?;
    let fstype = c"fuse.bucketdrive";
    let data = CString::new(format!(
        "fd={},rootmode=40000,user_id={uid},group_id={gid},default_permissions",
        fd.as_raw_fd()
    ))
    .map_err(invalid)?;
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOATIME;
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
        let e = std::io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EPERM) => std::io::Error::new(
                e.kind(),
                "permission denied: mounting needs root (or CAP_SYS_ADMIN)",
            ),
            _ => e,
        });
    }
    Ok(fd)
}

/// Lazily detaches a mount that cannot be unmounted cleanly, so no dead mount is left behind.
fn detach_mount(mountpoint: &Path) -> std::io::Result<()> {
    let c = std::ffi::CString::new(mountpoint.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "path contains NUL"))?;
    // SAFETY: `c` is a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Share of the system's dirty-page allowance the kernel may hold for this mount.
const DIRTY_MAX_RATIO: u32 = 40;

/// Tunes the mount's backing device (`/sys/class/bdi/MAJ:MIN`):
/// - read-ahead, so sequential reads reach us as 1 MiB requests instead of 128 KiB ones;
/// - the dirty-page limits. The kernel's write-back cache buffers writes in the page cache and
///   sends them to us in batches, but for FUSE it defaults to a strict limit of 1% of the dirty
///   allowance, so a random writer is throttled to one small request at a time long before the
///   disk is busy. Lifting it lets 4 KiB random writes run at page-cache speed; `close()` and
///   `fsync()` still write every dirty page back to us before they return.
fn tune_backing_device(mountpoint: &Path, read_ahead: u64) -> std::io::Result<()> {
    let dev = mount_device(mountpoint).ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::NotFound, "mount not found in mountinfo")
    })?;
    let bdi = format!("/sys/class/bdi/{dev}");
    std::fs::write(
        format!("{bdi}/read_ahead_kb"),
        format!("{}\n", read_ahead / 1024),
    )?;
    // Older kernels have no strict_limit knob; the ratio alone still helps there.
    for (knob, value) in [("strict_limit", 0), ("max_ratio", DIRTY_MAX_RATIO)] {
        if let Err(e) = std::fs::write(format!("{bdi}/{knob}"), format!("{value}\n")) {
            tracing::debug!(bdi, knob, "cannot set: {e}");
        }
    }
    tracing::debug!(
        bdi,
        read_ahead_kb = read_ahead / 1024,
        "backing device tuned"
    );
    Ok(())
}

/// Unmounts `mountpoint`, with a clear reason when it cannot.
pub fn unmount(mountpoint: &Path) -> Result<(), String> {
    let abs = mountpoint
        .canonicalize()
        .unwrap_or_else(|_| mountpoint.to_path_buf());
    if !is_mounted(&abs) {
        return Err(format!("{} is not mounted", abs.display()));
    }
    let c = std::ffi::CString::new(abs.as_os_str().as_encoded_bytes())
        .map_err(|_| "mountpoint path contains NUL".to_string())?;
    // SAFETY: `c` is a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), 0) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EBUSY) => format!(
                "{} is busy: close the files and shells using it",
                abs.display()
            ),
            Some(libc::EPERM) => format!("not permitted to unmount {}", abs.display()),
            _ => format!("cannot unmount {}: {e}", abs.display()),
        });
    }
    Ok(())
}
