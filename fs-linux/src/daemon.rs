//! Detaching from the terminal, the readiness handshake, and signals.
//!
//! `bucketdrive mount` forks before any thread exists. The parent waits on a pipe until the
//! child reports that the mount is ready, or why it failed, and exits accordingly, so the user
//! sees start-up errors as one line on their own terminal with a non-zero status. The child
//! starts a new session and serves the mount.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};

/// How the mount reports that it is ready, or why it failed: to the waiting parent through
/// the pipe when detached, to systemd when supervised, else to standard error. Shared between
/// the thread that probes the new mount and the one that runs it; the first report wins.
pub struct Readiness {
    pipe: parking_lot::Mutex<Option<File>>,
    failed: std::sync::atomic::AtomicBool,
}

impl Readiness {
    pub fn foreground() -> Self {
        Readiness {
            pipe: parking_lot::Mutex::new(None),
            failed: Default::default(),
        }
    }

    /// Reports a mount that answers requests: the parent exits 0, systemd gets `READY=1`.
    pub fn ready(&self) {
        if let Some(mut p) = self.pipe.lock().take() {
            let _ = p.write_all(b"ok\n");
        }
        crate::notify::ready();
    }

    /// Reports a start-up failure; the parent prints it and exits non-zero. Only the first
    /// failure is reported.
    pub fn failed(&self, message: &str) {
        if self.failed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        match self.pipe.lock().take() {
            Some(mut p) => {
                let _ = p.write_all(format!("error: {message}\n").as_bytes());
            }
            None => eprintln!("bucketdrive: {message}"),
        }
    }
}

impl Readiness {
    /// Whether a failure was reported (the process must then exit non-zero).
    pub fn has_failed(&self) -> bool {
        self.failed.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// What the parent learned from its child.
pub enum Outcome {
    Ready,
    Failed(String),
}

/// Where `detach` returned: the parent gets the child's outcome, the child gets its
/// readiness handle.
pub enum Forked {
    Parent(Outcome),
    Child(Readiness),
}

/// Detaches into a daemon. Must run before any thread is started.
pub fn detach() -> std::io::Result<Forked> {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created by pipe2 and are owned here alone.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: no other threads exist yet, so the child may keep running Rust code after fork.
    match unsafe { libc::fork() } {
        -1 => Err(std::io::Error::last_os_error()),
        0 => {
            drop(read_end);
            // SAFETY: plain syscalls on our own process.
            unsafe {
                libc::setsid();
                redirect_stdio();
            }
            Ok(Forked::Child(Readiness {
                pipe: parking_lot::Mutex::new(Some(File::from(write_end))),
                failed: Default::default(),
            }))
        }
        _child => {
            drop(write_end);
            let mut msg = String::new();
            let _ = File::from(read_end).read_to_string(&mut msg);
            let outcome = match msg.lines().next() {
                Some("ok") => Outcome::Ready,
                Some(line) => {
                    Outcome::Failed(line.strip_prefix("error: ").unwrap_or(line).to_string())
                }
                None => {
                    Outcome::Failed("the mount process exited before the mount was ready".into())
                }
            };
            Ok(Forked::Parent(outcome))
        }
    }
}

/// Points stdin, stdout and stderr at /dev/null so the daemon holds no terminal.
unsafe fn redirect_stdio() {
    let fd = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
    if fd >= 0 {
        libc::dup2(fd, 0);
        libc::dup2(fd, 1);
        libc::dup2(fd, 2);
        if fd > 2 {
            libc::close(fd);
        }
    }
}
