//! The control socket: how `bucketdrive status` talks to a running mount.
//!
//! The daemon listens on `<cache-dir>/control.sock` (mode 0600, in a 0700 directory, so only
//! the mount's owner can ask), and links it from a per-user registry named after the
//! mountpoint, so the CLI finds it from the mountpoint alone. One request, one JSON line back:
//! `status` answers with the upload status; `drain` also starts every pending upload now,
//! whatever its write-back delay (`unmount` waits on it before unmounting); `skip-drain` tells
//! the daemon to leave pending uploads journaled when it is unmounted (`unmount --no-wait`).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fs_core::store::ObjectStore;
use fs_core::write::writeback::Status;
use fs_core::Filesystem;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

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
    skip_drain: Arc<AtomicBool>,
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
    let draining = Arc::new(AtomicBool::new(false));
    rt.spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let fs = fs.clone();
            let skip_drain = skip_drain.clone();
            let draining = draining.clone();
            tokio::spawn(async move {
                let (r, mut w) = stream.into_split();
                let mut line = String::new();
                if tokio::io::BufReader::new(r)
                    .read_line(&mut line)
                    .await
                    .is_err()
                {
                    return;
                }
                match line.trim() {
                    "skip-drain" => skip_drain.store(true, Ordering::SeqCst),
                    "drain" if !draining.swap(true, Ordering::SeqCst) => {
                        let (fs, draining) = (fs.clone(), draining.clone());
                        tokio::spawn(async move {
                            fs.drain(true).await;
                            draining.store(false, Ordering::SeqCst);
                        });
                    }
                    _ => {}
                }
                let status = fs.write_status().await;
                let mut out = serde_json::to_string(&status).unwrap_or_else(|_| "{}".into());
                out.push('\n');
                let _ = w.write_all(out.as_bytes()).await;
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
    let mut stream = UnixStream::connect(&link).map_err(|e| {
        format!(
            "no bucketdrive mount with a status socket at {} ({e}); is it mounted writable?",
            abs.display()
        )
    })?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(format!("{what}\n").as_bytes())
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(stream)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    serde_json::from_str(&line).map_err(|e| format!("bad status reply: {e}"))
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

/// `bucketdrive status MOUNTPOINT [--wait]`.
pub fn status_command(mountpoint: &Path, wait: bool) -> Result<(), String> {
    let first = query(mountpoint)?;
    if !wait {
        print_status(&first, None);
        return Ok(());
    }
    let last = wait_with_progress(mountpoint, first, false)?;
    print_status(&last.status, Some(last.rate));
    Ok(())
}

/// `bucketdrive unmount MOUNTPOINT [--no-wait]`. By default every pending upload is started
/// now and waited for, with progress, before the unmount; the daemon then finishes anything
/// written in between and exits. With `no_wait` the daemon leaves pending uploads journaled for
/// the next mount.
pub fn unmount_command(mountpoint: &Path, no_wait: bool) -> Result<(), String> {
    // A read-only mount has no socket and nothing to upload.
    let first = request(mountpoint, if no_wait { "skip-drain" } else { "drain" }).ok();
    let last = match (&first, no_wait) {
        (Some(first), false) => Some(wait_with_progress(mountpoint, first.clone(), true)?.status),
        _ => first,
    };
    crate::mount::unmount(mountpoint)?;
    let Some(s) = last else {
        return Ok(());
    };
    // The daemon exits once it has finished; its socket goes with it.
    let deadline = Instant::now() + Duration::from_secs(60);
    while query(mountpoint).is_ok() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    if no_wait && s.pending_files > 0 {
        println!(
            "{} files ({:.1} MiB) stay staged and upload at the next mount",
            s.pending_files,
            mib(s.pending_bytes)
        );
    }
    if !no_wait && s.failed_files > 0 {
        return Err(format!(
            "unmounted, but {} files ({:.1} MiB) could not be uploaded; they stay staged and \
             upload at the next mount",
            s.failed_files,
            mib(s.pending_bytes)
        ));
    }
    Ok(())
}

/// The status when a wait ended, and the upload rate while waiting.
struct Waited {
    status: Status,
    rate: f64,
}

/// Polls the mount until nothing is pending, with a progress bar on a terminal. With `drain`,
/// each poll keeps every pending upload going now, and the wait also ends when everything
/// still pending has failed (it is retried with backoff; waiting longer would not help).
fn wait_with_progress(mountpoint: &Path, first: Status, drain: bool) -> Result<Waited, String> {
    let started = Instant::now();
    let bar = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        let b = indicatif::ProgressBar::new(first.pending_bytes.max(1));
        b.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        Some(b)
    } else {
        None
    };
    let total = first.pending_bytes;
    loop {
        let s = request(mountpoint, if drain { "drain" } else { "status" })?;
        if let Some(b) = &bar {
            b.set_position(total.saturating_sub(s.pending_bytes));
            b.set_message(format!("{} files pending", s.pending_files));
        }
        // Failed uploads back off; files still being written wait for their close.
        let stuck =
            drain && s.uploading_files == 0 && s.failed_files + s.unsaved_files == s.pending_files;
        if (s.pending_files == 0 && s.uploading_files == 0) || stuck {
            if let Some(b) = bar {
                b.finish_and_clear();
            }
            let secs = started.elapsed().as_secs_f64();
            let rate =
                (s.uploaded_bytes.saturating_sub(first.uploaded_bytes)) as f64 / secs.max(0.001);
            return Ok(Waited { status: s, rate });
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn print_status(s: &Status, rate: Option<f64>) {
    println!(
        "pending:   {} files, {:.1} MiB",
        s.pending_files,
        mib(s.pending_bytes)
    );
    println!(
        "uploading: {} files, {:.1} MiB/s over the last 10 s",
        s.uploading_files,
        mib(s.upload_rate)
    );
    println!(
        "uploaded:  {} files, {:.1} MiB since mount",
        s.uploaded_files,
        mib(s.uploaded_bytes)
    );
    if let Some(r) = rate {
        println!(
            "throughput: {:.1} MiB/s while waiting",
            r / (1024.0 * 1024.0)
        );
    }
    println!("conflicts: {}", s.conflicts);
    println!("failures:  {}", s.failures);
}
