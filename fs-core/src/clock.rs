//! Wall-clock time for the write path, replaceable per thread.
//!
//! Some of what the core writes depends on the wall clock: conflict copies are named after the
//! time they are made, new files get an mtime, and `MemoryStore` stamps objects with an update
//! time. [`now`] is `SystemTime::now()` unless a test thread installed its own source with
//! [`set_thread_source`]: the deterministic simulation runs every mount on one thread with a
//! paused tokio clock, and gives the core a wall clock that follows it, so a seed replays the
//! same names.
//!
//! The source is per thread, like `platform::set_inline_blocking`, so tests running in
//! parallel never see each other's clocks; production never installs one.

use std::cell::Cell;
use std::time::SystemTime;

thread_local! {
    static SOURCE: Cell<Option<fn() -> SystemTime>> = const { Cell::new(None) };
}

/// The current wall-clock time: the thread's source if one is installed, else the system's.
pub fn now() -> SystemTime {
    match SOURCE.with(Cell::get) {
        Some(source) => source(),
        None => SystemTime::now(),
    }
}

/// Makes [`now`] on this thread answer `source()` (`None`: the system clock, the default).
pub fn set_thread_source(source: Option<fn() -> SystemTime>) {
    SOURCE.with(|s| s.set(source));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn fixed() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_000_000)
    }

    #[test]
    fn a_thread_source_replaces_the_system_clock_on_that_thread_only() {
        set_thread_source(Some(fixed));
        assert_eq!(now(), fixed());
        let other = std::thread::spawn(now).join().expect("the thread runs");
        assert_ne!(other, fixed(), "another thread keeps the system clock");
        set_thread_source(None);
        assert_ne!(now(), fixed());
    }
}
