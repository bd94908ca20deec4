//! The control socket: how `bucketdrive status` talks to a running mount.
//!
//! The daemon listens on `<cache-dir>/control.sock` (mode 0600, in a 0700 directory, so only
//! the mount's owner can ask), and links it from a per-user registry named after the
//! mountpoint, so the CLI finds it from the mountpoint alone. One request, one JSON line back:
//! `status` answers with the upload status; `drain` also starts every pending upload now,
//! whatever its write-back delay (`unmount` waits on it before unmounting); `skip-drain` tells
//! the daemon to leave pending uploads journaled when it is unmounted (`unmount --no-wait`).

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fs_core::cli::{lifecycle, progress};
use fs_core::store::ObjectStore;
use fs_core::write::writeback::Status;
use fs_core::Filesystem;

/// Where links to the control sockets of this user's mounts live.
fn registry_dir() -> PathBuf {
    std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::temp_dir().join(format!("bucketdrive-{}", unsafe { libc::geteuid() }))
        })
        .join("bucketdrive")
}

fn registry_link(mountpoint: &Path) -> PathBuf {
    let tag = crc32c::crc32c(mountpoint.as_os_str().as_encoded_bytes());
    registry_dir().join(format!("{tag:08x}.sock"))
}

/// A listening control socket; removed with its registry link on drop.
pub struct ControlSocket {
    socket: PathBuf,
    link: PathBuf,
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.link);
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Starts answering status requests for `fs` on `<cache_dir>/control.sock`.
pub fn serve<S: ObjectStore>(
    rt: &tokio::runtime::Runtime,
    fs: Arc<Filesystem<S>>,
    cache_dir: &Path,
    mountpoint: &Path,
    control: Arc<lifecycle::Control>,
) -> std::io::Result<ControlSocket> {
    let socket = cache_dir.join("control.sock");
    let _ = std::fs::remove_file(&socket);
    let listener = {
        let _guard = rt.enter();
        tokio::net::UnixListener::bind(&socket)?
    };
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))?;
    let dir = registry_dir();
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    let link = registry_link(mountpoint);
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&socket, &link)?;
    rt.spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (fs, control) = (fs.clone(), control.clone());
            tokio::spawn(async move {
                control.converse(&fs, stream).await;
            });
        }
    });
    Ok(ControlSocket { socket, link })
}

/// Asks the mount at `mountpoint` for its status.
pub fn query(mountpoint: &Path) -> Result<Status, String> {
    request(mountpoint, "status")
}

fn request(mountpoint: &Path, what: &str) -> Result<Status, String> {
    let abs = mountpoint
        .canonicalize()
        .map_err(|e| format!("{}: {e}", mountpoint.display()))?;
    let link = registry_link(&abs);
    let stream = UnixStream::connect(&link).map_err(|e| {
        format!(
            "no bucketdrive mount with a status socket at {} ({e}); is it mounted writable?",
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
