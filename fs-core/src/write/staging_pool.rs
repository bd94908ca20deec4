//! Staging files made ahead of need, and reused.
//!
//! A new file's staging file must have a durable name before its first version is
//! acknowledged, or a crash could leave a journal record whose file vanished with its
//! directory entry. Creating the file and syncing the directory on the `close()` path costs a
//! sync per new file. And on a cache disk where thousands of files are created and deleted a
//! minute, creating gets dearer as it goes: ext4 without a journal skips every inode freed in
//! the last minute or more, with an inode-table lookup for each, so a copy of 10,000 small
//! files spent a good part of its time in the kernel's inode allocator.
//!
//! So the pool keeps empty staging files whose names are already durable, made in batches
//! with one directory sync per batch, and mostly recycled: the staging file of an item that
//! retires (its last version is in the bucket, nobody has it open) is emptied and renamed to
//! a fresh id instead of deleted. A file taken from the pool needs no directory sync at
//! commit. Ids are never reused, so the temporary parts of an upload, named by id, never meet
//! another file's. When the pool is empty, the caller creates a file as before.
//!
//! The pool starts empty and is only filled once [`StagingPool::start`] is called, after
//! start-up recovery has removed the staging files no journal record names: the pool's own
//! files from an earlier mount are among those.
//!
//! A recycled file may have been named by a journal record forgotten without a sync
//! ([`Journal::forget`](super::journal::Journal::forget)): each batch of recycled files first
//! makes the journal durable (the pool's barrier), so no record outlives its file.
//!
//! All the file work runs on one background thread: neither `open()` nor a retiring item
//! waits for it. (In the deterministic simulation, which runs blocking work inline, so does
//! the pool: a thread would make its schedule depend on timing.)

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use parking_lot::Mutex;

use super::cache_dir::staging_file_name;
use crate::platform::{self, At, Dir, Open};

/// Refill when fewer free files than this are left.
const LOW: usize = 16;
/// A refill tops the pool up to this many.
const TARGET: usize = 64;
/// Files kept at most; beyond this, retired files are deleted.
const MAX_FREE: usize = 256;
/// Files made ready per directory sync at most.
const BATCH: usize = 64;

enum Job {
    /// Top the pool up with new files.
    Refill,
    /// Empty staging file `id` and add it to the pool under a fresh id.
    Recycle(u64),
    /// Delete staging file `id` (never reused).
    Remove(u64),
}

/// Run before recycled files (by id) are emptied or deleted: says for each whether a live
/// record still names it (such a file is left where it is, for the next mount to sort out: a
/// record whose removal failed, or one whose removal is not yet appended), then makes the
/// journal durable, so every removal that was appended is.
pub type Barrier = Box<dyn Fn(&[u64]) -> io::Result<Vec<bool>> + Send + Sync>;

/// Empty staging files with durable names, ready for new items.
pub struct StagingPool {
    shared: Arc<Shared>,
    jobs: Mutex<Option<Sink>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// Where jobs go once the pool has started.
enum Sink {
    Thread(mpsc::Sender<Job>),
    /// Done at once by the caller ([`platform::inline_blocking`]).
    Inline,
}

struct Shared {
    dir: Arc<Dir>,
    barrier: Barrier,
    /// The write engine's id counter: every file of the pool gets an id never used before.
    ids: Arc<AtomicU64>,
    /// Ids whose file exists, is empty, and whose name is durable.
    free: Mutex<Vec<u64>>,
    started: AtomicBool,
    /// The pool is being dropped: no more refills.
    stopping: AtomicBool,
}

impl std::fmt::Debug for StagingPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagingPool")
            .field("dir", &self.shared.dir)
            .field("free", &self.free_len())
            .finish()
    }
}

impl StagingPool {
    /// A pool of files in the staging directory `dir`, taking ids from `ids`; `barrier` runs
    /// before recycled files are touched.
    pub fn new(dir: Arc<Dir>, ids: Arc<AtomicU64>, barrier: Barrier) -> Self {
        StagingPool {
            shared: Arc::new(Shared {
                dir,
                barrier,
                ids,
                free: Mutex::new(Vec::new()),
                started: AtomicBool::new(false),
                stopping: AtomicBool::new(false),
            }),
            jobs: Mutex::new(None),
            thread: Mutex::new(None),
        }
    }

    /// Starts the background thread and the first refill. Until then [`take`](Self::take)
    /// finds nothing and [`recycle`](Self::recycle) deletes.
    pub fn start(&self) {
        if self.shared.started.swap(true, Ordering::SeqCst) {
            return;
        }
        if platform::inline_blocking() {
            *self.jobs.lock() = Some(Sink::Inline);
            self.send(Job::Refill);
            return;
        }
        let (tx, rx) = mpsc::channel();
        let shared = self.shared.clone();
        let spawned = std::thread::Builder::new()
            .name("staging-pool".into())
            .spawn(move || shared.run(rx));
        match spawned {
            Ok(handle) => {
                *self.thread.lock() = Some(handle);
                let _ = tx.send(Job::Refill);
                *self.jobs.lock() = Some(Sink::Thread(tx));
            }
            Err(e) => tracing::warn!(error = %e, "no staging pool: files are created as needed"),
        }
    }

    /// An id whose staging file exists, empty, with a durable name; `None` when the pool is
    /// empty.
    pub fn take(&self) -> Option<u64> {
        let (id, left) = {
            let mut free = self.shared.free.lock();
            (free.pop(), free.len())
        };
        if left < LOW {
            self.send(Job::Refill);
        }
        id
    }

    /// Hands back staging file `id`, which no item uses any more (no descriptor reads it): it
    /// is reused, or deleted, once the barrier says no durable record names it.
    pub fn recycle(&self, id: u64) {
        self.hand_back(Job::Recycle(id), id)
    }

    /// Like [`Self::recycle`], but the file is deleted, never reused: the kernel may still
    /// write it through a mapping (a file it wrote itself, FUSE passthrough), which must not
    /// land in another file's bytes.
    pub fn remove(&self, id: u64) {
        self.hand_back(Job::Remove(id), id)
    }

    fn hand_back(&self, job: Job, id: u64) {
        if self.send(job) {
            return;
        }
        match (self.shared.barrier)(&[id]) {
            Ok(named) if named.first() == Some(&false) => {
                let _ = self.shared.at(id).remove();
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, id, "journal not durable: a staging file is left for the next mount")
            }
        }
    }

    /// Free files now (for tests and status).
    pub fn free_len(&self) -> usize {
        self.shared.free.lock().len()
    }

    /// Whether the job was taken (the pool has started).
    fn send(&self, job: Job) -> bool {
        match &*self.jobs.lock() {
            Some(Sink::Thread(tx)) => tx.send(job).is_ok(),
            Some(Sink::Inline) => {
                self.shared.handle(vec![job]);
                true
            }
            None => false,
        }
    }
}

impl Drop for StagingPool {
    /// Stops the thread and waits for its batch: a pool of an earlier mount of the same cache
    /// directory in this process must not rename files into ids the next one hands out.
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.jobs.lock().take();
        if let Some(handle) = self.thread.lock().take() {
            let _ = handle.join();
        }
    }
}

impl Shared {
    /// The background thread: makes files ready in batches, one directory sync each, until
    /// the pool is dropped.
    fn run(&self, rx: mpsc::Receiver<Job>) {
        while let Ok(first) = rx.recv() {
            let mut jobs = vec![first];
            while jobs.len() < BATCH {
                match rx.try_recv() {
                    Ok(job) => jobs.push(job),
                    Err(_) => break,
                }
            }
            self.handle(jobs);
        }
    }

    /// Does a batch of jobs, with one barrier and one directory sync.
    fn handle(&self, jobs: Vec<Job>) {
        let recycled: Vec<u64> = jobs
            .iter()
            .filter_map(|j| match j {
                Job::Recycle(id) | Job::Remove(id) => Some(*id),
                Job::Refill => None,
            })
            .collect();
        // Files a record still names, or all of them when the barrier failed, are left where
        // they are: the next mount sorts them out (it removes a file no record names, and
        // uploads one a record still names).
        let keep: std::collections::HashSet<u64> = if recycled.is_empty() {
            Default::default()
        } else {
            match (self.barrier)(&recycled) {
                Ok(named) => recycled
                    .iter()
                    .zip(named)
                    .filter(|(_, named)| *named)
                    .map(|(id, _)| *id)
                    .collect(),
                Err(e) => {
                    tracing::warn!(error = %e, "journal not durable: retired staging files are left for the next mount");
                    recycled.iter().copied().collect()
                }
            }
        };
        let mut ready = Vec::new();
        for job in jobs {
            let room = MAX_FREE.saturating_sub(self.free.lock().len() + ready.len());
            match job {
                Job::Refill if self.stopping.load(Ordering::SeqCst) => {}
                Job::Refill => {
                    let want = TARGET.saturating_sub(self.free.lock().len() + ready.len());
                    for _ in 0..want.min(BATCH) {
                        match self.make() {
                            Ok(id) => ready.push(id),
                            Err(e) => {
                                tracing::debug!(error = %e, "could not make a staging file ahead");
                                break;
                            }
                        }
                    }
                }
                Job::Recycle(id) | Job::Remove(id) if keep.contains(&id) => {
                    tracing::debug!(id, "a retired staging file is still named by the journal; left for the next mount");
                }
                Job::Recycle(id) if room > 0 => match self.reuse(&self.at(id)) {
                    Ok(id) => ready.push(id),
                    Err(e) => {
                        tracing::debug!(error = %e, id, "could not reuse a staging file");
                        let _ = self.at(id).remove();
                    }
                },
                Job::Recycle(id) | Job::Remove(id) => {
                    let _ = self.at(id).remove();
                }
            }
        }
        if ready.is_empty() {
            return;
        }
        // Only files whose names are durable may be handed out.
        match self.dir.sync() {
            Ok(()) => self.free.lock().extend(ready),
            Err(e) => {
                tracing::warn!(error = %e, "could not sync the staging directory");
                for id in ready {
                    let _ = self.at(id).remove();
                }
            }
        }
    }

    fn at(&self, id: u64) -> At {
        self.dir.at(staging_file_name(id))
    }

    fn fresh_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::SeqCst)
    }

    /// A new empty file under a fresh id.
    fn make(&self) -> io::Result<u64> {
        let id = self.fresh_id();
        self.at(id).open(Open::new().write(true).create_new(true))?;
        Ok(id)
    }

    /// Empties the file `at` and moves it to a fresh id.
    fn reuse(&self, at: &At) -> io::Result<u64> {
        // Emptied at its open, which looks at the disk first ([`At::freeing`]).
        at.open(Open::new().write(true).truncate(true))?;
        let id = self.fresh_id();
        at.rename_to(&self.at(id))?;
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::time::{Duration, Instant};

    fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
        let end = Instant::now() + Duration::from_secs(10);
        while !ok() {
            assert!(Instant::now() < end, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn pool(dir: &Path, first_id: u64) -> (StagingPool, Arc<AtomicU64>) {
        let ids = Arc::new(AtomicU64::new(first_id));
        let pool = StagingPool::new(
            Dir::private(dir).unwrap(),
            ids.clone(),
            Box::new(|ids: &[u64]| Ok(vec![false; ids.len()])),
        );
        (pool, ids)
    }

    #[test]
    fn nothing_before_start_and_recycle_then_deletes() {
        let dir = tempfile::tempdir().unwrap();
        let (p, _) = pool(dir.path(), 1);
        assert_eq!(p.take(), None);
        let f = dir.path().join(staging_file_name(99));
        std::fs::write(&f, b"old").unwrap();
        p.recycle(99);
        assert!(!f.exists(), "deleted, not kept");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn taken_files_exist_are_empty_and_have_fresh_ids() {
        let dir = tempfile::tempdir().unwrap();
        let (p, ids) = pool(dir.path(), 10);
        p.start();
        wait_for("the first refill", || p.free_len() >= TARGET);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let id = match p.take() {
                Some(id) => id,
                None => {
                    wait_for("a refill", || p.free_len() > 0);
                    continue;
                }
            };
            assert!(id >= 10 && id < ids.load(Ordering::SeqCst));
            assert!(seen.insert(id), "id {id} handed out twice");
            let meta = std::fs::metadata(dir.path().join(staging_file_name(id))).unwrap();
            assert_eq!(meta.len(), 0);
        }
    }

    #[test]
    fn a_recycled_file_is_emptied_and_moved_to_a_fresh_id() {
        let dir = tempfile::tempdir().unwrap();
        let (p, ids) = pool(dir.path(), 1);
        p.start();
        wait_for("the first refill", || p.free_len() >= TARGET);
        let used = p.take().unwrap();
        let old = dir.path().join(staging_file_name(used));
        std::fs::write(&old, vec![7u8; 100_000]).unwrap();
        let before: std::collections::HashSet<u64> = p.shared.free.lock().iter().copied().collect();
        let next = ids.load(Ordering::SeqCst);
        p.recycle(used);
        wait_for("the recycled file", || p.free_len() > before.len());
        assert!(!old.exists(), "moved away from its old id");
        let free = p.shared.free.lock().clone();
        let new: Vec<u64> = free.into_iter().filter(|id| !before.contains(id)).collect();
        assert_eq!(new.len(), 1);
        assert!(new[0] >= next, "a fresh id, never used before");
        let meta = std::fs::metadata(dir.path().join(staging_file_name(new[0]))).unwrap();
        assert_eq!(meta.len(), 0, "emptied");
    }

    #[test]
    fn a_file_that_cannot_be_reused_is_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let (p, _) = pool(dir.path(), 1);
        p.start();
        wait_for("the first refill", || p.free_len() >= TARGET);
        let before = p.free_len();
        // A file that is not there: it cannot be emptied.
        let gone = dir.path().join(staging_file_name(4_999));
        p.recycle(4_999);
        let old = dir.path().join(staging_file_name(5_000));
        std::fs::write(&old, b"x").unwrap();
        p.recycle(5_000);
        wait_for("the good one", || p.free_len() > before);
        assert_eq!(p.free_len(), before + 1);
        assert!(!gone.exists());
    }

    /// The barrier (the journal's sync) runs before a retired file is touched; when it fails,
    /// or says a record still names the file, the file stays where it is, bytes and all.
    #[test]
    fn recycling_waits_for_the_barrier_and_leaves_named_files() {
        use std::sync::atomic::AtomicUsize;
        let dir = tempfile::tempdir().unwrap();
        let ids = Arc::new(AtomicU64::new(1));
        let calls = Arc::new(AtomicUsize::new(0));
        // 0: the barrier fails; 1: the record still names the file; 2: it does not.
        let mode = Arc::new(AtomicUsize::new(0));
        let watched = dir.path().join(staging_file_name(1_000));
        let (c, m, w) = (calls.clone(), mode.clone(), watched.clone());
        let barrier: Barrier = Box::new(move |ids: &[u64]| {
            assert_eq!(ids, [1_000]);
            // Called while the file is still whole.
            assert_eq!(std::fs::read(&w).unwrap(), b"acknowledged once");
            c.fetch_add(1, Ordering::SeqCst);
            match m.load(Ordering::SeqCst) {
                0 => Err(io::Error::other("disk gone")),
                1 => Ok(vec![true]),
                _ => Ok(vec![false]),
            }
        });
        let p = StagingPool::new(Dir::private(dir.path()).unwrap(), ids, barrier);
        p.start();
        wait_for("the first refill", || p.free_len() >= TARGET);
        let before = p.free_len();
        std::fs::write(&watched, b"acknowledged once").unwrap();
        for (m, calls_after) in [(0, 1), (1, 2)] {
            mode.store(m, Ordering::SeqCst);
            p.recycle(1_000);
            wait_for("the barrier", || {
                calls.load(Ordering::SeqCst) == calls_after
            });
            // Give the thread time to (wrongly) touch the file.
            std::thread::sleep(Duration::from_millis(50));
            assert_eq!(std::fs::read(&watched).unwrap(), b"acknowledged once");
            assert_eq!(p.free_len(), before);
        }
        mode.store(2, Ordering::SeqCst);
        p.recycle(1_000);
        wait_for("the recycled file", || p.free_len() > before);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        assert!(!watched.exists());
    }
}
