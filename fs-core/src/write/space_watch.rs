//! The cache disk's free space while the kernel writes files itself.
//!
//! A write the kernel makes to a passthrough file can fail for space, and only the writer is
//! told ([`super::passthrough`]). The engine looks at the disk's free space at every close,
//! fsync, stat, truncate and last release of such a file, and holds the file (I10) when the
//! disk is nearly full then. A disk that filled (so that a write failed) and was freed again
//! between two of those looks would go unseen: another program's file that came and went, a
//! download removed. So while any file passes through, a watch also looks at the disk every
//! [`POLL`] and counts the looks that found it nearly full. Each passthrough file remembers the
//! count it began with; when the count has moved at its next look, the file is held as if that
//! look had found the disk full.
//!
//! The mount frees space itself (an upload done, a file deleted or cut, a read-cache file
//! dropped), most often just when the disk is full: writes fail then, uploads go on and
//! finish. So the watch also looks before every such free ([`SpaceWatch::look_now`], run by
//! [`crate::platform::Dir::before_freeing`]), and a dip the mount ends itself is seen by the
//! files passing through then.
//!
//! A dip another program makes (or another mount on the same disk) is seen when it is made by
//! writing: the watch looks every [`POLL`], and a look counts the disk nearly full below
//! [`super::passthrough::HOLD_ROOM`] free, so a dip that began and ended between two looks
//! had to write that much (256 MiB) in under 10 ms, 25 GB/s, past what a disk or a `write()`
//! into the page cache reaches. One made in a single step and undone within 10 ms (a file
//! `fallocate`d over the disk's last free space, a reflink copy, then removed) goes unseen, and
//! so does one while no handle of the file is open (a store through a mapping after the last
//! release: the mapping's watch looks at the disk every 2 s).
//!
//! The watch costs one `fstatvfs` per poll and per free, and only while a file passes through.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

/// How often the watch looks at the disk.
pub const POLL: Duration = Duration::from_millis(10);

/// The watch of one cache disk.
#[derive(Default, Clone)]
pub struct SpaceWatch {
    state: Arc<State>,
}

#[derive(Default)]
struct State {
    /// Looks that found the disk nearly full.
    dips: AtomicU64,
    /// Files passing through now ([`Watched`] alive).
    files: AtomicUsize,
    /// The watch's task runs.
    running: AtomicBool,
}

/// A file passing through, counted while this lives.
pub struct Watched {
    state: Arc<State>,
    from: u64,
}

impl Watched {
    /// Whether the watch found the disk nearly full since the file began passing through or
    /// since the last call: a dip is acted on once (the file is held), and a file written
    /// over whole after that starts clean.
    pub fn take_dip(&mut self) -> bool {
        let now = self.state.dips.load(SeqCst);
        std::mem::replace(&mut self.from, now) != now
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.state.files.fetch_sub(1, SeqCst);
    }
}

impl SpaceWatch {
    /// Counts a file that begins passing through, and starts the watch if it is not running.
    /// `nearly_full` looks at the disk.
    pub fn watch(&self, nearly_full: impl Fn() -> bool + Send + 'static) -> Watched {
        self.state.files.fetch_add(1, SeqCst);
        let watched = Watched {
            state: self.state.clone(),
            from: self.state.dips.load(SeqCst),
        };
        if !self.state.running.swap(true, SeqCst) {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn(run(self.state.clone(), nearly_full));
                }
                Err(_) => self.state.running.store(false, SeqCst),
            }
        }
        watched
    }

    /// Looks at the disk now, while any file passes through: space is about to be freed.
    pub fn look_now(&self, nearly_full: impl FnOnce() -> bool) {
        if self.state.files.load(SeqCst) > 0 && nearly_full() {
            self.state.dips.fetch_add(1, SeqCst);
        }
    }

    /// Looks that found the disk nearly full so far.
    pub fn dips(&self) -> u64 {
        self.state.dips.load(SeqCst)
    }
}

/// Looks every [`POLL`] while a file passes through; ends when none does.
async fn run(state: Arc<State>, nearly_full: impl Fn() -> bool) {
    loop {
        tokio::time::sleep(POLL).await;
        if state.files.load(SeqCst) == 0 {
            state.running.store(false, SeqCst);
            // A file counted just before found the watch still running and started none: it
            // is taken on here, unless another watch has started since.
            if state.files.load(SeqCst) == 0 || state.running.swap(true, SeqCst) {
                return;
            }
            continue;
        }
        if nearly_full() {
            state.dips.fetch_add(1, SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// A dip while a file is watched is seen by it, and only by the files watched then; the
    /// watch stops when no file is left and starts again with the next.
    #[tokio::test(start_paused = true)]
    async fn a_dip_is_seen_by_the_files_watched_through_it() {
        let watch = SpaceWatch::default();
        let full = Arc::new(AtomicBool::new(false));
        let probe = |full: &Arc<AtomicBool>| {
            let full = full.clone();
            move || full.load(SeqCst)
        };
        let mut a = watch.watch(probe(&full));
        tokio::time::sleep(POLL * 3).await;
        assert!(!a.take_dip());
        full.store(true, SeqCst);
        tokio::time::sleep(POLL * 2).await;
        full.store(false, SeqCst);
        assert!(a.take_dip(), "a file written through the dip");
        assert!(!a.take_dip(), "acted on once");
        let mut b = watch.watch(probe(&full));
        tokio::time::sleep(POLL * 3).await;
        assert!(!b.take_dip(), "a file begun after it");
        drop((a, b));
        tokio::time::sleep(POLL * 3).await;
        assert!(!watch.state.running.load(SeqCst), "no file: no watch");
        let seen = watch.dips();
        full.store(true, SeqCst);
        tokio::time::sleep(POLL * 3).await;
        assert_eq!(
            watch.dips(),
            seen,
            "nothing looks while no file passes through"
        );
        let mut c = watch.watch(probe(&full));
        tokio::time::sleep(POLL * 2).await;
        assert!(c.take_dip(), "the watch runs again");
    }
}
