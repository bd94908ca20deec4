//! Filling the cache off the read path: a bounded queue and one writer thread.
//!
//! A reader that fetched bytes from the bucket hands them over with [`Queue::offer`], which
//! never blocks and copies nothing (`Bytes` are shared). The queue holds at most its limit in
//! bytes (`ReadCacheConfig::fill_queue`, a quarter of `--max-read-memory`): enough to absorb
//! the bursts of a window of parts arriving together, and a disk somewhat slower than the
//! link for the length of a large file. Past it, the offer is dropped and counted: a slow or
//! busy disk never slows a read, it only means those blocks come from the bucket again next
//! time.
//!
//! One thread does every write, at a lower priority than the read path, so cache files are
//! created, filled and completed in one order, and the index only ever has one reservation outstanding. Each job reserves its
//! blocks in the index (evicting other files to make room), deletes the evicted files, writes
//! the blocks and their records, and then marks them present, unless the entry was evicted or
//! removed meanwhile, in which case what was written is simply gone with its file.
//!
//! A write that fails discards the whole entry. A full disk also pauses filling for a minute
//! (with one warning per mount): reads never fail because of the cache.
//!
//! At unmount [`Queue::flush`] waits for the queue to empty, so what a mount read is on disk
//! for the next one.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Condvar, Mutex};

use super::file::{self, Identity, BLOCK};
use super::Shared;

/// Whole blocks of one object, starting at block `first`.
pub struct Job {
    pub id: Arc<Identity>,
    pub first: u64,
    pub data: Bytes,
}

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    bytes: u64,
    busy: bool,
    closed: bool,
}

pub struct Queue {
    state: Mutex<State>,
    changed: Condvar,
    /// Most bytes waiting.
    limit: u64,
}

impl Queue {
    pub fn new(limit: u64) -> Queue {
        Queue {
            state: Mutex::default(),
            changed: Condvar::new(),
            limit,
        }
    }

    /// Queues `job` unless the queue is full or closed; never waits.
    pub fn offer(&self, job: Job) -> bool {
        let mut s = self.state.lock();
        let len = job.data.len() as u64;
        if s.closed || s.bytes + len > self.limit {
            return false;
        }
        s.bytes += len;
        s.jobs.push_back(job);
        self.changed.notify_all();
        true
    }

    /// Waits until every queued job is written, for at most `timeout`. True if it was.
    pub fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut s = self.state.lock();
        while !s.jobs.is_empty() || s.busy {
            if self.changed.wait_until(&mut s, deadline).timed_out() {
                return false;
            }
        }
        true
    }

    fn close(&self) {
        self.state.lock().closed = true;
        self.changed.notify_all();
    }

    /// The next job; `None` once closed and empty.
    fn next(&self) -> Option<Job> {
        let mut s = self.state.lock();
        s.busy = false;
        self.changed.notify_all();
        loop {
            if let Some(job) = s.jobs.pop_front() {
                s.bytes -= job.data.len() as u64;
                s.busy = true;
                return Some(job);
            }
            if s.closed {
                return None;
            }
            self.changed.wait(&mut s);
        }
    }
}

/// The writer thread; dropping it writes what is queued, then stops the thread.
pub struct Filler {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Filler {
    pub fn start(shared: Arc<Shared>) -> std::io::Result<Filler> {
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("bucketdrive-read-cache".into())
            .spawn(move || {
                lower_priority();
                while let Some(job) = s.queue.next() {
                    #[cfg(test)]
                    let _gate = s.gate.lock();
                    write(&s, job);
                }
            })?;
        Ok(Filler {
            shared,
            thread: Some(thread),
        })
    }
}

impl Drop for Filler {
    fn drop(&mut self) {
        self.shared.queue.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Makes the calling thread yield the CPU to the read path when both want it (nice 10 on
/// Linux, where a thread id names one thread): on a busy machine the cache fills more slowly,
/// or skips, rather than slowing the read that feeds it.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: plain syscalls on this thread's own id.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10);
    }
}

/// Ascending block numbers as runs of consecutive ones.
fn runs(blocks: &[u64]) -> Vec<Range<u64>> {
    let mut out: Vec<Range<u64>> = Vec::new();
    for &b in blocks {
        match out.last_mut() {
            Some(r) if r.end == b => r.end += 1,
            _ => out.push(b..b + 1),
        }
    }
    out
}

/// Writes one job (see the module comment).
fn write(shared: &Shared, job: Job) {
    let id = &job.id;
    let name = id.name();
    let len = job.data.len() as u64;
    if shared.fills_paused() {
        shared.skipped(len);
        return;
    }
    let blocks = job.first..job.first + len.div_ceil(BLOCK);
    let (reserved, doomed, redundant) = {
        let mut ix = shared.index.lock();
        // Another handle's fill may have written these blocks since they were offered.
        let redundant = !ix.wants(name, blocks.clone());
        let r = ix.reserve(id, blocks);
        let doomed: Vec<_> = r
            .iter()
            .flat_map(|r| r.evicted.iter())
            .filter_map(|(n, e)| shared.retire(n, *e))
            .collect();
        shared.publish(&ix);
        (r, doomed, redundant)
    };
    if let Some(r) = &reserved {
        shared.evicted(r.evicted.len() as u64);
    }
    for p in doomed {
        p.remove();
    }
    let Some(r) = reserved else {
        if !redundant {
            shared.skipped(len);
        }
        return;
    };
    let path = shared.path(name);
    let mut bytes = 0u64;
    let result = (|| -> std::io::Result<()> {
        let f = if r.create {
            path.create(id)?
        } else {
            path.open_write()?
        };
        for run in runs(&r.blocks) {
            let from = ((run.start - job.first) * BLOCK) as usize;
            let to = (((run.end - job.first) * BLOCK) as usize).min(job.data.len());
            file::write_blocks(&f, id, run.start, &job.data[from..to])?;
            bytes += (to - from) as u64;
        }
        Ok(())
    })();
    let mut doomed = None;
    {
        let mut ix = shared.index.lock();
        let ours = ix.entry(name).is_some_and(|e| e.epoch == r.epoch);
        match &result {
            Ok(()) if ours => {
                ix.complete(name, r.epoch, &r.blocks, true);
            }
            Err(_) if ours => {
                // What the file holds is unknown now: discard the whole entry.
                ix.remove(name);
                doomed = shared.retire(name, r.epoch);
            }
            _ if r.create && ix.entry(name).is_none() => {
                // Removed while we wrote: the file we created belongs to no entry. Only this
                // thread creates entries, so no newer file has this name.
                path.remove();
            }
            _ => {}
        }
        shared.publish(&ix);
    }
    if let Some(p) = doomed {
        p.remove();
    }
    match result {
        Ok(()) => shared.written(bytes),
        Err(e) => {
            shared.skipped(len);
            shared.write_failed(&e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_group_consecutive_blocks() {
        assert_eq!(runs(&[1, 2, 3, 5, 7, 8]), vec![1..4, 5..6, 7..9]);
        assert!(runs(&[]).is_empty());
    }
}
