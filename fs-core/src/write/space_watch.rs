//! The cache disk's free space while the kernel writes files itself.
//!
//! A write the kernel makes to a passthrough file can fail for space, and only the writer is
//! told ([`super::passthrough`]). The engine looks at the disk's free space at every close,
//! fsync, stat, truncate and last release of such a file, and holds the file (I10) when the
//! disk is nearly full then ([`HOLD_ROOM`]). A disk that filled (so that a write failed) and
//! was freed again between two of those looks would go unseen: another program's file that
//! came and went, a download removed. So while any file passes through, a watch also looks at
//! the disk, and counts the looks that found a *dip*. Each passthrough file starts from a look
//! of its own and remembers the count then; when the count has moved at its next look, the
//! file is held as if that look had found the disk full.
//!
//! A look finds a dip when the disk is nearly full then, or when it comes too late after the
//! one before: to fill a disk that had `f` bytes free, another program must write about
//! `f - HOLD_ROOM` bytes, which takes at least that over [`FILL_RATE`], a rate past what a
//! disk or `write()`s into the page cache sustain. A look that comes later than that after the
//! last (the watch stalled) cannot rule a dip out, and counts one. So the watch, on a thread
//! of its own (the runtime's tasks may block on the disk), looks again within a quarter of
//! that time, every [`POLL_MIN`] to [`POLL_MAX`]: within about 144 MiB of full every look
//! counts a dip. Every look chains onto the one before: its time is taken before it reads the
//! disk, and a look that cannot read the disk leaves the chain to the last that could.
//!
//! The mount frees space itself (an upload done, a file deleted or cut, a read-cache file
//! dropped), most often just when the disk is full: writes fail then, uploads go on and
//! finish. So the watch also looks before every such free ([`SpaceWatch::look_now`], run by
//! [`crate::platform::Dir::before_freeing`]), and a dip the mount ends itself is seen by the
//! files passing through then.
//!
//! Not seen: a dip made faster than [`FILL_RATE`] (a file `fallocate`d over the disk's free
//! space, or a sudden drop that way followed by writing) and undone before the next look, one
//! on a file system that fails writes for space with more shown free (btrfs out of metadata
//! space, a project quota), and one while no handle of the file is open (a store through a
//! mapping after the last release: the mapping's watch looks at the disk every 2 s).
//!
//! The watch costs one `fstatvfs` per look, 10 to 100 a second, and runs only while a file
//! passes through.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
// Real time: the watch runs on a thread of its own, and a dip happens in the world's time.
use std::time::Instant;

use parking_lot::Mutex;

/// Free space on the cache disk below which a write the kernel made may have failed unseen:
/// the file is held. Writes fail for space with about none left.
pub const HOLD_ROOM: u64 = 64 << 20;

/// The fastest another program is taken to fill the disk by writing: 8 GiB/s, past what a
/// disk or a `write()` into the page cache sustains.
pub const FILL_RATE: u64 = 8 << 30;

/// The watch looks at most this often...
pub const POLL_MIN: Duration = Duration::from_millis(10);

/// ...and at least this often.
pub const POLL_MAX: Duration = Duration::from_millis(100);

/// What reads the disk's free space (`None`: cannot tell).
pub type FreeBytes = Arc<dyn Fn() -> Option<u64> + Send + Sync>;

/// How long another program needs, at least, to take a disk with `free` bytes free down to
/// [`HOLD_ROOM`].
fn fill_time(free: u64) -> Duration {
    Duration::from_secs_f64(free.saturating_sub(HOLD_ROOM) as f64 / FILL_RATE as f64)
}

/// The watch of one cache disk.
#[derive(Default, Clone)]
pub struct SpaceWatch {
    state: Arc<State>,
}

#[derive(Default)]
struct State {
    /// Looks that found a dip.
    dips: AtomicU64,
    /// The last look that read the disk: when it began, and the free bytes it found.
    last: Mutex<Option<(Instant, u64)>>,
    /// Files passing through now ([`Watched`] alive).
    files: AtomicUsize,
    /// The watch's thread runs.
    running: AtomicBool,
}

impl State {
    /// One look at the disk through `free`; returns how soon the next must come.
    fn look(&self, free: impl FnOnce() -> Option<u64>) -> Duration {
        let began = Instant::now();
        let found = free();
        self.look_at(began, Instant::now(), found)
    }

    /// A look that began at `began` (before it read the disk), ended at `ended`, and found
    /// `free` bytes free.
    fn look_at(&self, began: Instant, ended: Instant, free: Option<u64>) -> Duration {
        let mut last = self.last.lock();
        let Some(free) = free else {
            // The chain goes on from the last look that read the disk.
            return POLL_MIN;
        };
        let late = last.is_some_and(|(at, before)| ended.duration_since(at) > fill_time(before));
        if free < HOLD_ROOM || late {
            self.dips.fetch_add(1, SeqCst);
        }
        // A look that began before the one recorded (two at once) leaves that one.
        if last.is_none_or(|(at, _)| began >= at) {
            *last = Some((began, free));
        }
        (fill_time(free) / 4).clamp(POLL_MIN, POLL_MAX)
    }
}

/// A file passing through, counted while this lives.
pub struct Watched {
    state: Arc<State>,
    from: u64,
}

impl Watched {
    /// Whether the watch found a dip since the file began passing through or since the last
    /// call: a dip is acted on once (the file is held), and a file written over whole after
    /// that starts clean.
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
    /// `free` reads the disk's free space.
    pub fn watch(&self, free: FreeBytes) -> Watched {
        self.state.files.fetch_add(1, SeqCst);
        // The file starts from a look of its own: a dip before it is not its (a late one
        // after the watch was idle counts for no file begun since).
        self.state.look(|| free());
        let watched = Watched {
            state: self.state.clone(),
            from: self.state.dips.load(SeqCst),
        };
        if !self.state.running.swap(true, SeqCst) {
            let state = self.state.clone();
            let started = std::thread::Builder::new()
                .name("space-watch".into())
                .spawn(move || run(&state, &free));
            if let Err(e) = started {
                tracing::warn!(error = %e, "cannot start the watch of the cache disk's free space");
                self.state.running.store(false, SeqCst);
            }
        }
        watched
    }

    /// Looks at the disk now, while any file passes through (space is about to be freed, or
    /// a file's close, fsync or release looks).
    pub fn look_now(&self, free: impl FnOnce() -> Option<u64>) {
        if self.state.files.load(SeqCst) > 0 {
            self.state.look(free);
        }
    }

    /// Looks that found a dip so far.
    pub fn dips(&self) -> u64 {
        self.state.dips.load(SeqCst)
    }
}

/// Looks while a file passes through, as often as [`State::look`] says; ends when none does.
fn run(state: &State, free: &FreeBytes) {
    let mut next = POLL_MIN;
    loop {
        std::thread::sleep(next);
        if state.files.load(SeqCst) == 0 {
            state.running.store(false, SeqCst);
            // A file counted just before found the watch still running and started none: it
            // is taken on here, unless another watch has started since.
            if state.files.load(SeqCst) == 0 || state.running.swap(true, SeqCst) {
                return;
            }
            continue;
        }
        next = state.look(|| free());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    const ROOMY: u64 = 10 << 30;

    /// A dip while a file is watched is seen by it, and only by the files watched then; the
    /// watch stops when no file is left and starts again with the next.
    #[test]
    fn a_dip_is_seen_by_the_files_watched_through_it() {
        let watch = SpaceWatch::default();
        let full = Arc::new(AtomicBool::new(false));
        let probe = |full: &Arc<AtomicBool>| -> FreeBytes {
            let full = full.clone();
            Arc::new(move || Some(if full.load(SeqCst) { 0 } else { ROOMY }))
        };
        let sleep = |n: u32| std::thread::sleep(POLL_MAX * n);
        let mut a = watch.watch(probe(&full));
        sleep(3);
        assert!(!a.take_dip(), "a roomy disk looked at in time");
        full.store(true, SeqCst);
        sleep(2);
        full.store(false, SeqCst);
        assert!(a.take_dip(), "a file written through the dip");
        assert!(!a.take_dip(), "acted on once");
        let mut b = watch.watch(probe(&full));
        sleep(3);
        assert!(!b.take_dip(), "a file begun after it");
        drop((a, b));
        sleep(3);
        assert!(!watch.state.running.load(SeqCst), "no file: no watch");
        let seen = watch.dips();
        full.store(true, SeqCst);
        sleep(3);
        assert_eq!(
            watch.dips(),
            seen,
            "nothing looks while no file passes through"
        );
        full.store(false, SeqCst);
        let mut c = watch.watch(probe(&full));
        assert!(!c.take_dip(), "the time without a file is no dip");
        full.store(true, SeqCst);
        sleep(2);
        assert!(c.take_dip(), "the watch runs again");
    }

    /// A look that comes later than the disk could have been filled since the last one counts
    /// a dip; one in time does not; the watch looks the more often the less room is left.
    #[test]
    fn a_look_too_late_to_rule_a_dip_out_counts_one() {
        let state = State::default();
        let gib = 1 << 30;
        let dips = || state.dips.load(SeqCst);
        let mut t = Instant::now();
        let mut look = |ms: u64, free: Option<u64>| {
            t += Duration::from_millis(ms);
            state.look_at(t, t, free)
        };
        let next = look(0, Some(gib));
        // 960 MiB take 117 ms at 8 GiB/s: looked at again within a quarter of that.
        assert!(next > Duration::from_millis(28) && next < Duration::from_millis(30));
        look(100, Some(gib));
        assert_eq!(dips(), 0, "in time");
        look(130, Some(gib));
        assert_eq!(dips(), 1, "too late: a dip could have come and gone");
        assert_eq!(look(0, Some(100 << 30)), POLL_MAX);
        assert_eq!(look(0, Some(HOLD_ROOM + (50 << 20))), POLL_MIN);
        look(10, Some(HOLD_ROOM + (50 << 20)));
        assert_eq!(
            dips(),
            2,
            "within about 144 MiB of full, every look 10 ms apart counts a dip"
        );
        look(0, Some(HOLD_ROOM - 1));
        assert_eq!(dips(), 3, "nearly full");
        // A look that cannot read the disk leaves the chain to the last one that could.
        look(0, Some(gib));
        look(100, None);
        look(50, Some(gib));
        assert_eq!(dips(), 4, "150 ms after the last look that read the disk");
    }
}
