//! The control socket: how `bucketdrive status` and `unmount` talk to a running mount.
//!
//! The daemon listens on `<registry>/<tag>.sock`, where the tag is a hash of the mountpoint,
//! so the CLI finds it from the mountpoint alone. The registry is a per-user
//! directory of ours (0700, so only the mount's owner can ask; the socket is 0600 too):
//! `/run/bucketdrive` for root; for anyone else the first usable of
//! `$XDG_RUNTIME_DIR/bucketdrive`, `/run/user/UID/bucketdrive` and
//! `<user cache directory>/bucketdrive/run`. The daemon
//! listens in the first it can make its own; the CLI looks in all of them, so a mount started
//! without a login session (cron, `su`, fstab) is still found from a login shell. Never a fixed
//! path in a shared directory such as /tmp, where another user could create it first. Socket
//! paths are short this way (a Unix socket path has at most 107 bytes), whatever the cache
//! directory.
//!
//! One request, one JSON line back: `status` answers with the upload status; `drain` also
//! starts every pending upload now, whatever its write-back delay (`unmount` waits on it before
//! unmounting); `skip-drain` tells the daemon to leave pending uploads journaled when it is
//! unmounted (`unmount --no-wait`).

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fs_core::cli::{lifecycle, progress};
use fs_core::store::ObjectStore;
use fs_core::write::writeback::Status;
use fs_core::Filesystem;

/// The registry directories for this user, in order of preference (see the module doc).
fn registry_dirs() -> Vec<PathBuf> {
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        return vec![PathBuf::from("/run/bucketdrive")];
    }
    let mut dirs = Vec::new();
    if let Some(run) = std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        dirs.push(PathBuf::from(run));
    }
    let run_user = PathBuf::from(format!("/run/user/{uid}"));
    if run_user.is_dir() {
        dirs.push(run_user);
    }
    let mut out: Vec<PathBuf> = Vec::new();
    for d in dirs {
        let d = d.join("bucketdrive");
        if !out.contains(&d) {
            out.push(d);
        }
    }
    // Beside the default cache directories, in a directory of its own.
    let cache = fs_core::platform::user_cache_base();
    if cache.is_absolute() {
        out.push(cache.join("bucketdrive").join("run"));
    }
    out
}

/// Creates the registry directory `dir` if needed and makes sure it is ours: a real directory
/// (a symbolic link is refused, not followed), owned by us, mode 0700 (fixed through a
/// descriptor opened without following links).
fn prepare_registry(dir: &Path) -> std::io::Result<()> {
    fs_core::platform::Dir::private(dir)
        .map(drop)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", dir.display())))
}

/// The socket's name in a registry directory: 128 bits of the mountpoint's SHA-256, so two
/// mounts never share one (a 32-bit checksum let two mountpoints collide, and the second
/// mount's start replaced the first one's socket).
fn socket_name(mountpoint: &Path) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(mountpoint.as_os_str().as_encoded_bytes());
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("{hex}.sock")
}

/// A listening control socket; removed on drop.
pub struct ControlSocket {
    socket: PathBuf,
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Starts answering control requests for `fs` in the first registry directory we can use.
pub fn serve<S: ObjectStore>(
    rt: &tokio::runtime::Runtime,
    fs: Arc<Filesystem<S>>,
    mountpoint: &Path,
    control: Arc<lifecycle::Control>,
) -> std::io::Result<ControlSocket> {
    let mut refused = Vec::new();
    let dir = registry_dirs()
        .into_iter()
        .find(|d| match prepare_registry(d) {
            Ok(()) => true,
            Err(e) => {
                refused.push(e.to_string());
                false
            }
        })
        .ok_or_else(|| {
            std::io::Error::other(format!(
                "no usable registry directory ({})",
                refused.join("; ")
            ))
        })?;
    let socket = dir.join(socket_name(mountpoint));
    let _ = std::fs::remove_file(&socket);
    let listener = {
        let _guard = rt.enter();
        tokio::net::UnixListener::bind(&socket)?
    };
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))?;
    rt.spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors, say: back off and keep answering later, or status
                    // and the drain before an unmount would be gone for good.
                    tracing::warn!(error = %e, "control socket: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (fs, control) = (fs.clone(), control.clone());
            tokio::spawn(async move {
                control.converse(&fs, stream).await;
            });
        }
    });
    Ok(ControlSocket { socket })
}

/// Asks the mount at `mountpoint` for its status.
pub fn query(mountpoint: &Path) -> Result<Status, String> {
    request(mountpoint, "status")
}

fn request(mountpoint: &Path, what: &str) -> Result<Status, String> {
    let abs = mountpoint
        .canonicalize()
        .map_err(|e| format!("{}: {e}", mountpoint.display()))?;
    let name = socket_name(&abs);
    let mut last = None;
    let stream = registry_dirs()
        .iter()
        .find_map(|d| match UnixStream::connect(d.join(&name)) {
            Ok(s) => Some(s),
            Err(e) => {
                last = Some(e);
                None
            }
        })
        .ok_or_else(|| {
            let why = last.map(|e| e.to_string()).unwrap_or_default();
            format!(
                "no bucketdrive mount with a status socket at {} ({why}); is it mounted writable, \
                 and by you?",
                abs.display()
            )
        })?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    progress::exchange(stream, what)
}

/// `bucketdrive status MOUNTPOINT [--wait]`.
pub fn status_command(mountpoint: &Path, wait: bool) -> Result<(), String> {
    progress::status_command(&|what| request(mountpoint, what), wait)
}

/// `bucketdrive unmount MOUNTPOINT [--no-wait]`. By default every pending upload is started
/// now and waited for, with progress, before the unmount; the daemon then finishes anything
/// written in between and exits. With `no_wait` the daemon leaves pending uploads journaled for
/// the next mount.
pub fn unmount_command(mountpoint: &Path, no_wait: bool) -> Result<(), String> {
    let last = progress::before_unmount(&|what| request(mountpoint, what), no_wait)?;
    crate::mount::unmount(mountpoint)?;
    if last.is_some() {
        // The daemon exits once it has finished; its socket goes with it.
        progress::wait_for_exit(&|| query(mountpoint).is_ok());
    }
    progress::after_unmount(last, no_wait)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn the_registry_is_private_and_refuses_links() {
        let tmp = std::env::temp_dir().join(format!("bd-registry-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir(&tmp).unwrap();
        let dir = tmp.join("run").join("bucketdrive");
        prepare_registry(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        // A wider mode left by someone is narrowed.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        prepare_registry(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);

        // A link planted where the registry goes is refused, and its target left alone.
        let target = tmp.join("target");
        std::fs::create_dir(&target).unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o777)).unwrap();
        let planted = tmp.join("planted");
        std::os::unix::fs::symlink(&target, &planted).unwrap();
        let err = prepare_registry(&planted).unwrap_err().to_string();
        assert!(err.contains("symbolic link"), "{err}");
        assert_eq!(mode(&target), 0o777);

        // So is a plain file.
        let file = tmp.join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(prepare_registry(&file).is_err());
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn the_registry_is_never_a_fixed_name_in_tmp() {
        let dirs = registry_dirs();
        // SAFETY: geteuid cannot fail.
        let uid = unsafe { libc::geteuid() };
        assert!(!dirs.is_empty());
        for dir in &dirs {
            assert!(!dir.starts_with(std::env::temp_dir()), "{}", dir.display());
        }
        if uid == 0 {
            assert_eq!(dirs, [PathBuf::from("/run/bucketdrive")]);
        }
    }

    #[test]
    fn socket_paths_fit_a_unix_socket_address() {
        // The longest name the daemon can bind: sun_path holds 107 bytes and a NUL.
        for dir in registry_dirs() {
            let p = dir.join(socket_name(Path::new("/some/mount")));
            assert!(
                p.as_os_str().len() < 108 || !dir.starts_with("/run"),
                "{}",
                p.display()
            );
        }
    }
}
