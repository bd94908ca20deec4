//! The control pipe: how `bucketdrive.exe status` and `unmount` talk to a running mount.
//!
//! The mount listens on the named pipe `\\.\pipe\bucketdrive-<tag>`, where the tag is a
//! checksum of the mountpoint, so the CLI finds it from the mountpoint alone. Remote clients
//! are refused; the pipe has an explicit DACL (the user who mounted, SYSTEM, Administrators:
//! [`crate::security::pipe_sddl`]) rather than the default one, which also lets Everyone read,
//! and at most [`MAX_PIPE_INSTANCES`] instances, so no one can exhaust them. One request word, one JSON status line back, as on Linux:
//! `status`, `drain` (start every pending upload now), `skip-drain` (leave pending uploads
//! staged at unmount) and `unmount`.

use std::time::Duration;

use fs_core::cli::progress;
use fs_core::write::writeback::Status;
#[cfg(feature = "winfsp")]
use {
    fs_core::cli::lifecycle, fs_core::store::ObjectStore, fs_core::Filesystem, std::sync::Arc,
    tokio::net::windows::named_pipe::ServerOptions,
};

/// The pipe of the mount at `mountpoint`.
pub fn pipe_name(mountpoint: &str) -> String {
    let key = fs_core::windows::mountpoint_key(mountpoint);
    format!(r"\\.\pipe\bucketdrive-{key:08x}")
}

/// Most instances of the pipe at once: one listening, the rest busy answering.
#[cfg(feature = "winfsp")]
pub const MAX_PIPE_INSTANCES: usize = 8;

/// Creates one instance of `pipe` with `security`'s DACL.
#[cfg(feature = "winfsp")]
fn instance(
    pipe: &str,
    security: &crate::security::Descriptor,
    first: bool,
) -> std::io::Result<tokio::net::windows::named_pipe::NamedPipeServer> {
    let mut attrs = windows::Win32::Security::SECURITY_ATTRIBUTES {
        nLength: std::mem::size_of::<windows::Win32::Security::SECURITY_ATTRIBUTES>() as u32,
        lpSecurityDescriptor: security.as_ptr() as *mut _,
        bInheritHandle: false.into(),
    };
    // SAFETY: `attrs` points at a valid self-relative descriptor that outlives the call.
    unsafe {
        ServerOptions::new()
            .first_pipe_instance(first)
            .reject_remote_clients(true)
            .max_instances(MAX_PIPE_INSTANCES)
            .create_with_security_attributes_raw(
                pipe,
                (&mut attrs as *mut windows::Win32::Security::SECURITY_ATTRIBUTES).cast(),
            )
    }
}

/// Starts answering requests on `pipe`. `unmount` is signalled when a client asks for it.
#[cfg(feature = "winfsp")]
pub fn serve<S: ObjectStore>(
    rt: &tokio::runtime::Runtime,
    fs: Arc<Filesystem<S>>,
    pipe: String,
    security: crate::security::Descriptor,
    control: Arc<lifecycle::Control>,
    unmount: tokio::sync::mpsc::UnboundedSender<()>,
) -> std::io::Result<()> {
    let first = {
        let _guard = rt.enter();
        instance(&pipe, &security, true)?
    };
    rt.spawn(async move {
        let mut server = first;
        loop {
            if server.connect().await.is_err() {
                return;
            }
            let stream = server;
            server = loop {
                match instance(&pipe, &security, false) {
                    Ok(s) => break s,
                    Err(e) => {
                        // All instances busy, say: try again shortly rather than stop
                        // answering for good.
                        tracing::warn!("control pipe: {e}");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            };
            let (fs, control, unmount) = (fs.clone(), control.clone(), unmount.clone());
            tokio::spawn(async move {
                // The status reply goes out first; the unmount follows.
                if control.converse(&fs, stream).await.as_deref() == Some("unmount") {
                    let _ = unmount.send(());
                }
            });
        }
    });
    Ok(())
}

/// Sends one request to the mount behind `pipe`.
pub fn request(pipe: &str, what: &str) -> Result<Status, String> {
    let pipe_end = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(pipe)
        .map_err(|e| format!("no bucketdrive mount answers on {pipe} ({e}); is it mounted?"))?;
    progress::exchange(pipe_end, what)
}

/// `bucketdrive.exe unmount MOUNTPOINT [--no-wait]`: the same waiting as on Linux, then the
/// mount is asked to unmount itself.
pub fn unmount_command(mountpoint: &str, no_wait: bool) -> Result<(), String> {
    let pipe = pipe_name(mountpoint);
    let ask = |what: &str| request(&pipe, what);
    let last = progress::before_unmount(&ask, no_wait)?;
    ask("unmount")?;
    progress::wait_for_exit(&|| {
        std::thread::sleep(Duration::from_millis(50));
        request(&pipe, "status").is_ok()
    });
    progress::after_unmount(last, no_wait)
}
