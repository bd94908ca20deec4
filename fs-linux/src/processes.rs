//! Which process a FUSE request came from: translation of the kernel's thread ids.
//!
//! A FUSE request carries the id of the calling *thread*. The core wants the *process* that
//! opened a file for writing and the one closing a descriptor of it, so that a close by a
//! child holding an inherited copy of the descriptor (closed at its `exec` or exit) is not
//! taken for the writer's own close. A thread's process is the `Tgid` in
//! `/proc/<thread>/status`. Only write handles are tracked, so reads and read-only closes
//! cost nothing; a write handle's close costs a lookup only when another thread closes it.
//!
//! Most callers are a process's first thread, whose id is the process's: `pidfd_open` accepts
//! only those, and takes no hold on the process's memory, so the answer costs one system call
//! on whatever thread asks. Any other thread is looked up in `/proc` on the runtime's blocking
//! pool, never on the FUSE session thread: reading `/proc/<thread>/status` holds the process's
//! memory map for a moment, and a process torn down meanwhile could leave its last teardown,
//! with the final close of its files of this mount, to the reader (see `fuse.rs`).
//!
//! Where a process cannot be told, `None` says so and the core saves at every close, as it
//! did before processes were told apart: a request from outside the mount's pid namespace
//! (the kernel gives 0), a thread `/proc` does not show (`hidepid`), or a `/proc` of another
//! pid namespace than the daemon's (its numbers would name other processes).

use std::collections::HashMap;
use std::sync::OnceLock;

/// Whether `/proc` numbers processes as the kernel numbers them for this daemon: its own
/// entry is its own pid.
fn proc_is_ours() -> bool {
    static OURS: OnceLock<bool> = OnceLock::new();
    *OURS.get_or_init(|| {
        let ours = std::fs::read_link("/proc/self")
            .ok()
            .and_then(|p| p.to_str().and_then(|s| s.parse::<u32>().ok()))
            == Some(std::process::id());
        if !ours {
            tracing::info!("/proc is not this daemon's pid namespace: every close of a file saves it, a child's too");
        }
        ours
    })
}

/// The process of thread `thread`, or `None` if it cannot be told (see the module
/// documentation): at once when the thread is its process's first, else from `/proc` off the
/// calling thread.
pub async fn process_of_thread(thread: u32) -> Option<u32> {
    if thread == 0 || !proc_is_ours() {
        return None;
    }
    if leads_its_process(thread) {
        return Some(thread);
    }
    tokio::task::spawn_blocking(move || process_of(thread))
        .await
        .ok()
        .flatten()
}

/// Whether `thread` is its process's first thread (its id is the process's).
fn leads_its_process(thread: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(thread) else {
        return false;
    };
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; it fails
    // for a thread that does not lead its process.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return false;
    }
    // SAFETY: fd was just returned to us and is closed once.
    unsafe { libc::close(fd as libc::c_int) };
    true
}

/// The process of thread `thread` from `/proc`, or `None` if it cannot be told (see the
/// module documentation). Blocking; see the module documentation for where it may run.
pub fn process_of(thread: u32) -> Option<u32> {
    if thread == 0 || !proc_is_ours() {
        return None;
    }
    let status = std::fs::read_to_string(format!("/proc/{thread}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The opener of each open write handle: its thread and that thread's process.
#[derive(Default)]
pub struct Openers(parking_lot::Mutex<HashMap<u64, (u32, u32)>>);

impl Openers {
    /// The process of `thread`, which is opening a file for writing (`None`: not known).
    pub async fn opening(thread: u32) -> Option<u32> {
        process_of_thread(thread).await
    }

    /// Handle `fh` was opened for writing by `thread` of `process`.
    pub fn opened(&self, fh: u64, thread: u32, process: Option<u32>) {
        if let Some(p) = process {
            self.0.lock().insert(fh, (thread, p));
        }
    }

    /// The process of `thread`, which is closing a descriptor of `fh`. `None` for handles not
    /// tracked (read handles), so the core treats every such close alike.
    pub async fn closing(&self, fh: u64, thread: u32) -> Option<u32> {
        let (opener_thread, opener) = *self.0.lock().get(&fh)?;
        if thread == opener_thread {
            return Some(opener);
        }
        process_of_thread(thread).await
    }

    /// Handle `fh` is released.
    pub fn released(&self, fh: u64) {
        self.0.lock().remove(&fh);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
            .block_on(f)
    }

    #[test]
    fn a_thread_belongs_to_its_process() {
        let me = std::process::id();
        assert!(leads_its_process(me), "the first thread leads its process");
        assert_eq!(process_of(me), Some(me));
        assert_eq!(block_on(process_of_thread(me)), Some(me));
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            let _ = tx.send(unsafe { libc::gettid() } as u32);
            let _ = done_rx.recv();
        });
        let tid = rx.recv().unwrap_or(0);
        assert_ne!(tid, me, "a second thread has its own id");
        assert!(!leads_its_process(tid), "and does not lead its process");
        assert_eq!(process_of(tid), Some(me), "but belongs to it");
        assert_eq!(
            block_on(process_of_thread(tid)),
            Some(me),
            "told from /proc"
        );
        let _ = done_tx.send(());
        let _ = t.join();
        assert_eq!(process_of(0), None);
        assert_eq!(block_on(process_of_thread(0)), None);
    }

    #[test]
    fn a_close_by_a_child_is_told_from_the_openers() {
        let me = std::process::id();
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("sleep starts");
        let openers = Openers::default();
        block_on(async {
            openers.opened(7, me, Openers::opening(me).await);
            assert_eq!(openers.closing(7, me).await, Some(me));
            assert_eq!(openers.closing(7, child.id()).await, Some(child.id()));
            assert_eq!(
                openers.closing(8, child.id()).await,
                None,
                "not a write handle"
            );
            openers.released(7);
            assert_eq!(openers.closing(7, me).await, None);
        });
        let _ = child.kill();
        let _ = child.wait();
    }
}
