//! `bucketdrive mount` and `unmount`: checks, logging, the runtime, and the FUSE session.
//!
//! Everything a user can get wrong is checked before detaching or while the parent still
//! waits, so each mistake is one clear line on the caller's terminal and a non-zero exit. The
//! parent (or systemd) hears "ready" only once the mount answers a request.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use fs_core::cli::{lifecycle, logging};
use fs_core::write::cache_dir::CacheRoot;

use fuser::{Config, Session, SessionACL};

use crate::daemon::{self, Forked, Outcome, Readiness};
use crate::fuse::FuseAdapter;
use crate::kernel_mount::{self, is_mounted, KernelOptions};
use crate::notify;
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
    let acl = match access(&args) {
        Ok(acl) => acl,
        Err(e) => return fail(e),
    };
    // Decided once, before the log or anything else creates a directory in it; a directory
    // that cannot be used (staged files of an unknown bucket, an earlier version's layout
    // others may write to) is refused here, on the caller's terminal.
    let cache = match args.common.cache_root(&bucket, &prefix, &mountpoint) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    // Under systemd the process is the service: it stays attached and logs to standard error.
    // Detached, standard error is /dev/null: the log goes to syslog or the cache directory,
    // chosen (and its file opened) while a default log that cannot be opened can still be
    // reported here.
    let foreground = args.foreground || notify::supervised();
    // Where the bucket is and who asks, checked here, and said on the terminal before a
    // detached mount loses it (attached, the log says it).
    match args.common.store.gcs_options() {
        Ok(opts) if !foreground => {
            for note in &opts.notes {
                eprintln!("bucketdrive: warning: {note}");
            }
        }
        Ok(_) => {}
        Err(e) => return fail(e),
    }
    let destination = if foreground {
        logging::Destination::Attached
    } else {
        // Attached, these lines reach the terminal through the log.
        for note in &cache.notes {
            eprintln!("bucketdrive: warning: {note}");
        }
        let (destination, warning) = logging::detached(&args.common, &cache);
        if let Some(warning) = warning {
            eprintln!("bucketdrive: warning: {warning}");
        }
        destination
    };
    let readiness = if foreground {
        Readiness::foreground()
    } else {
        match daemon::detach() {
            Ok(Forked::Parent(Outcome::Ready)) => return ExitCode::SUCCESS,
            Ok(Forked::Parent(Outcome::Failed(msg))) => return fail(msg),
            Ok(Forked::Child(r)) => r,
            Err(e) => return fail(format!("cannot detach: {e}")),
        }
    };
    let readiness = Arc::new(readiness);
    let site = Site {
        bucket,
        prefix,
        mountpoint,
        cache,
    };
    match serve(&args, &site, acl, destination, &readiness) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            tracing::error!("{msg}");
            readiness.failed(&msg);
            ExitCode::FAILURE
        }
    }
}

/// Who besides the mount's owner may use it, from `--allow-other` and `--allow-root`, checked
/// before anything starts. For anyone but root both need `user_allow_other` in
/// `/etc/fuse.conf`.
fn access(args: &MountArgs) -> Result<SessionACL, String> {
    let acl = if args.allow_other {
        SessionACL::All
    } else if args.allow_root {
        SessionACL::RootAndOwner
    } else {
        SessionACL::Owner
    };
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if acl != SessionACL::Owner && !root && !kernel_mount::users_may_allow_other() {
        let flag = if args.allow_other {
            "--allow-other"
        } else {
            "--allow-root"
        };
        return Err(format!(
            "{flag} needs the line user_allow_other in /etc/fuse.conf when not run as root"
        ));
    }
    let other_owner = |given: Option<u32>, own: u32| given.is_some_and(|id| id != own);
    // SAFETY: geteuid and getegid cannot fail.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    if acl == SessionACL::Owner && (other_owner(args.uid, euid) || other_owner(args.gid, egid)) {
        eprintln!(
            "bucketdrive: warning: --uid/--gid only change the owner files show; without \
             --allow-other only uid {euid} can use this mount"
        );
    }
    Ok(acl)
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

/// What is mounted where, checked before the process detaches.
struct Site {
    bucket: String,
    prefix: String,
    mountpoint: PathBuf,
    cache: CacheRoot,
}

fn serve(
    args: &MountArgs,
    site: &Site,
    acl: SessionACL,
    destination: logging::Destination,
    readiness: &Arc<Readiness>,
) -> Result<(), String> {
    let (bucket, prefix, mountpoint) = (&site.bucket, &site.prefix, site.mountpoint.as_path());
    // fuser logs every unimplemented request (xattrs, say) as a warning: keep it to errors.
    logging::init(&args.common, &["fuser"], destination)?;
    let rt = lifecycle::runtime()?;
    fs_core::cli::metrics::serve(&rt, args.common.metrics_addr.as_deref())?;
    // SAFETY: geteuid and getegid cannot fail.
    let uid = args.uid.unwrap_or_else(|| unsafe { libc::geteuid() });
    let gid = args.gid.unwrap_or_else(|| unsafe { libc::getegid() });
    let fs = lifecycle::open_filesystem(&rt, &args.common, &site.cache, bucket, prefix, |cfg| {
        cfg.uid = uid;
        cfg.gid = gid;
        cfg.file_mode = args.file_mode;
        cfg.dir_mode = args.dir_mode;
        cfg.posix_metadata = args.posix_metadata;
        cfg.posix_special_modes = args.posix_special_modes;
        cfg.posix_uids = args.posix_uids.clone();
        cfg.posix_gids = args.posix_gids.clone();
    })?;
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let passthrough = args.passthrough.decide(&fs.passthrough_facts(root));
    let adapter = FuseAdapter::new(fs.clone(), rt.handle().clone(), passthrough);
    let kernel = KernelOptions {
        source: bucket,
        acl,
        read_only: args.common.read_only,
        noexec: args.noexec,
        nosymfollow: args.nosymfollow,
    };
    let fd = kernel_mount::mount(mountpoint, &kernel)
        .map_err(|e| format!("cannot mount on {}: {e}", mountpoint.display()))?;
    // How the kernel names the mount's files in /proc/<pid>/maps (the core looks for
    // mappings of files it passed through there).
    if let Some((major, minor)) = kernel_mount::mount_device(mountpoint)
        .as_deref()
        .and_then(|d| d.split_once(':'))
        .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
    {
        fs.set_kernel_device(major, minor);
    } else {
        tracing::warn!(
            "cannot tell the mount's device: mappings of files the kernel writes itself are not recognised after their close"
        );
    }
    let session = match Session::from_fd(adapter, fd, acl, Config::default()) {
        Ok(s) => s,
        Err(e) => {
            let _ = kernel_mount::unmount(mountpoint, true);
            return Err(format!(
                "FUSE handshake failed on {}: {e}",
                mountpoint.display()
            ));
        }
    };
    if let Err(e) = kernel_mount::tune_backing_device(mountpoint, args.kernel_read_ahead) {
        tracing::debug!("could not tune the mount's backing device: {e}");
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
        notify::stopping();
        let mp2 = mp.clone();
        let done = tokio::task::spawn_blocking(move || unmount(&mp2)).await;
        if let Ok(Err(e)) = done {
            tracing::warn!("{e}; detaching the mount lazily");
            if let Err(e) = kernel_mount::unmount(&mp, true) {
                tracing::error!("lazy unmount failed: {e}");
            }
        }
    });

    let control = Arc::new(lifecycle::Control::default());
    let _control = if fs.is_read_only() {
        None
    } else {
        match crate::control::serve(&rt, fs.clone(), mountpoint, control.clone()) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!("no status socket: {e}");
                None
            }
        }
    };
    announce_when_answering(mountpoint, bucket, readiness);
    let result = session.run();
    tracing::info!("session ended");
    notify::stopping();
    lifecycle::finish(rt, &fs, control.skip_drain());
    result.map_err(|e| format!("FUSE session failed: {e}"))?;
    if readiness.has_failed() {
        return Err("the mount never answered".into());
    }
    Ok(())
}

/// Reports readiness once the mount answers: a thread asks for the attributes of the mount's
/// root, which the kernel sends to the session loop that is about to start (a new mount's
/// root has no cached attributes). Until then neither the waiting parent (so neither
/// `mount -t fuse.bucketdrive` nor fstab) nor systemd goes on. A mount that fails this is taken
/// down again, so a reported failure never leaves a mount behind.
fn announce_when_answering(mountpoint: &Path, bucket: &str, readiness: &Arc<Readiness>) {
    let (mp, bucket, probe) = (
        mountpoint.to_path_buf(),
        bucket.to_string(),
        readiness.clone(),
    );
    let spawned = std::thread::Builder::new()
        .name("mount-probe".into())
        .spawn(move || match std::fs::metadata(&mp) {
            Ok(m) if m.is_dir() => {
                tracing::info!(mountpoint = %mp.display(), bucket = %bucket, "mounted");
                probe.ready();
            }
            other => {
                let why = match other {
                    Ok(_) => "its root is not a directory".to_string(),
                    Err(e) => e.to_string(),
                };
                probe.failed(&format!(
                    "the mount on {} does not answer: {why}",
                    mp.display()
                ));
                let _ = kernel_mount::unmount(&mp, true);
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the readiness probe ({e}); reporting ready now");
        readiness.ready();
    }
}

/// Unmounts `mountpoint`, with a clear reason when it cannot.
/// Detaches a bucketdrive mount at `mountpoint` whose daemon is gone (the kernel answers
/// `ENOTCONN`), as the systemd unit's stop hook does after a crash so that the restart does
/// not find the mountpoint busy. Anything else there is left alone, and said so: another
/// filesystem mounted at the same path (an NFS or ext4 mount the unit must never detach), a
/// live bucketdrive mount, or nothing at all.
pub fn unmount_stale(mountpoint: &Path) -> Result<String, String> {
    // A dead FUSE mount cannot be resolved through: resolve its parent, and add its name.
    let abs = mountpoint.canonicalize().unwrap_or_else(|_| {
        match (mountpoint.parent(), mountpoint.file_name()) {
            (Some(parent), Some(name)) => parent
                .canonicalize()
                .map(|p| p.join(name))
                .unwrap_or_else(|_| mountpoint.to_path_buf()),
            _ => mountpoint.to_path_buf(),
        }
    });
    let shown = abs.display();
    let Some(kind) = kernel_mount::mount_type(&abs) else {
        return Ok(format!("nothing is mounted at {shown}"));
    };
    if kind != "fuse.bucketdrive" {
        return Ok(format!(
            "{shown} holds a {kind} mount, not a bucketdrive one: left alone"
        ));
    }
    // statfs always reaches the daemon (a stat of the root may be answered from the
    // kernel's attribute cache): a dead connection answers ENOTCONN.
    let answers = || -> std::io::Result<()> {
        let path = std::ffi::CString::new(abs.as_os_str().as_encoded_bytes())
            .map_err(std::io::Error::other)?;
        let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
        // SAFETY: `path` is NUL-terminated and `st` is writable memory of the right size.
        match unsafe { libc::statvfs(path.as_ptr(), st.as_mut_ptr()) } {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    };
    match answers() {
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            kernel_mount::unmount(&abs, true)
                .map_err(|e| format!("cannot detach the dead mount at {shown}: {e}"))?;
            Ok(format!("detached the dead bucketdrive mount at {shown}"))
        }
        _ => Ok(format!(
            "{shown} holds a bucketdrive mount that still answers: left alone"
        )),
    }
}

pub fn unmount(mountpoint: &Path) -> Result<(), String> {
    let abs = mountpoint
        .canonicalize()
        .unwrap_or_else(|_| mountpoint.to_path_buf());
    if !is_mounted(&abs) {
        return Err(format!("{} is not mounted", abs.display()));
    }
    kernel_mount::unmount(&abs, false).map_err(|e| match e.kind() {
        std::io::ErrorKind::ResourceBusy => format!(
            "{} is busy: close the files and shells using it",
            abs.display()
        ),
        std::io::ErrorKind::PermissionDenied => {
            format!("not permitted to unmount {}", abs.display())
        }
        _ => format!("cannot unmount {}: {e}", abs.display()),
    })
}
