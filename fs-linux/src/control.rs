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

/// Where links to the control sockets of this user's mounts live: `/run/bucketdrive` for
/// root; `$XDG_RUNTIME_DIR/bucketdrive` for other users; without a runtime directory,
/// `bucketdrive/run` under the user's cache directory. Never a fixed path in a shared directory
/// such as /tmp, where another user could create it first and read or redirect the links.
fn registry_dir() -> Result<PathBuf, String> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return Ok(PathBuf::from("/run/bucketdrive"));
    }
    if let Some(run) = std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(run).join("bucketdrive"));
    }
    let base = fs_core::platform::user_cache_base();
    if base.is_relative() {
        return Err("neither XDG_RUNTIME_DIR nor a home directory is set".into());
    }
    Ok(base.join("bucketdrive").join("run"))
}

/// Creates the registry directory `dir` if needed and makes sure it is ours: a real directory
/// (a symbolic link is refused, not followed), owned by us, mode 0700 (fixed through a
/// descriptor opened without following links).
fn prepare_registry(dir: &Path) -> std::io::Result<()> {
    fs_core::platform::create_dirs(dir)?;
    fs_core::platform::secure_own_dir(dir)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", dir.display())))
}

fn registry_link(mountpoint: &Path) -> Result<PathBuf, String> {
    let tag = crc32c::crc32c(mountpoint.as_os_str().as_encoded_bytes());
    Ok(registry_dir()?.join(format!("{tag:08x}.sock")))
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
    let no_registry = |e: String| {
        let _ = std::fs::remove_file(&socket);
        std::io::Error::other(format!("no registry for the control socket: {e}"))
    };
    let dir = registry_dir().map_err(no_registry)?;
    prepare_registry(&dir).map_err(|e| no_registry(e.to_string()))?;
    let link = registry_link(mountpoint).map_err(no_registry)?;
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
    let link = registry_link(&abs)?;
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
        let dir = registry_dir().unwrap();
        // SAFETY: geteuid cannot fail.
        let uid = unsafe { libc::geteuid() };
        assert!(!dir.starts_with(std::env::temp_dir().join(format!("bucketdrive-{uid}"))));
        if uid == 0 {
            assert_eq!(dir, Path::new("/run/bucketdrive"));
        }
    }
}
