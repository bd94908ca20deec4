//! The commit: what makes closed versions durable against a power cut, and when.
//!
//! A `close()` is acknowledged once the version's bytes and its journal line are written, in
//! the kernel but not yet synced. That already survives a crash or a kill of the daemon: the
//! kernel holds the pages and writes them back on its own. What it does not yet survive is a
//! power cut or a kernel crash. The commit closes that gap, for every version closed since the
//! last one at once: an `fdatasync` of each of their staging files (and of the staging
//! directory when a new name was made), then one sync of the journal. It runs
//! `--commit-interval` after the first close it covers (default 1 s; ext4's own commit is 5 s),
//! and sooner whenever something needs it: an `fsync()`, the start of an upload, a namespace
//! change, a drain at unmount. So a serial `cp -r` of small files pays no sync per file, and
//! everything closed more than one interval ago is durable.
//!
//! Why per-file `fdatasync` rather than one `syncfs` of the cache disk: the disk read cache
//! lives on the same file system and may hold gigabytes of dirty pages of its own, which a
//! `syncfs` would wait for too; the staging files closed in one interval are few and already
//! being written back (see [`super::staging`]).
//!
//! Three rules keep a power cut from losing more than the last interval's closes:
//!
//! - **Uploads wait for the commit.** A version is uploaded only once it is durable: a power
//!   cut could otherwise bring back an older record after a newer version reached the bucket,
//!   and the replay would upload the older one over it.
//! - **A superseded version stays until the newer one commits.** Its record and staging file
//!   are kept until then, so the replay can fall back to it (records of one name are ordered
//!   by [`Record::seq`](super::journal::Record)). An append
//!   to a version in the same staging file keeps the older size and CRC32C instead
//!   ([`Record::prefix`](super::journal::Record)): its bytes are a prefix of the file that the
//!   append never changes.
//! - **The replay checks every version's bytes** against its CRC32C, as it always has: a
//!   version whose line reached the disk before its bytes did (the kernel writes pages back
//!   in any order) fails the check and gives way to the version it replaced.
//!
//! With `--sync-on-close` every `close()` waits for a commit, as every close did before.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::item::{Shared, Version};

/// What the next commit must make durable.
#[derive(Default, Clone)]
pub(super) struct Uncommitted {
    /// Staging files closed since the last commit, and the offset from which their bytes are
    /// new (an append to a committed version leaves the bytes before it alone), each with
    /// the generation it was added in.
    pub files: Vec<(u64, u64, u64)>,
    /// Staging files that got a name whose directory entry is not yet durable (in a snapshot:
    /// how many the commit covers).
    pub dir: u64,
    /// Versions superseded since the last commit: their records and files go after it.
    pub superseded: Vec<(u64, Arc<Shared>, Version)>,
    /// The last generation handed out: a version sealed with generation `g` is durable once
    /// a commit covering `g` ends.
    pub gen: u64,
}

/// The commit's bookkeeping, shared with its background task.
pub(super) struct Commits {
    pub interval: Duration,
    pub pending: Mutex<Uncommitted>,
    /// Serializes commits.
    pub running: tokio::sync::Mutex<()>,
    /// The generation the last successful commit covered.
    pub done: AtomicU64,
    /// Woken by the first close after a commit.
    pub wake: tokio::sync::Notify,
    pub task_started: AtomicBool,
    /// Superseded versions whose records are gone but whose staging files a commit could not
    /// let go of yet (their item was busy): the next commit tries again.
    pub leftover: Mutex<Vec<(Arc<Shared>, Version)>>,
}

impl Commits {
    pub fn new(interval: Duration) -> Arc<Self> {
        Arc::new(Commits {
            interval,
            pending: Mutex::new(Uncommitted::default()),
            running: tokio::sync::Mutex::new(()),
            done: AtomicU64::new(0),
            wake: tokio::sync::Notify::new(),
            task_started: AtomicBool::new(false),
            leftover: Mutex::new(Vec::new()),
        })
    }

    /// Notes a version sealed without a sync: staging file `id`, new from byte `from`, and
    /// what it superseded. Returns the generation a commit must cover for it to be durable.
    pub fn add(
        &self,
        id: u64,
        from: u64,
        new_name: bool,
        superseded: Option<(Arc<Shared>, Version)>,
    ) -> u64 {
        let mut p = self.pending.lock();
        let first = p.files.is_empty() && p.superseded.is_empty();
        p.gen += 1;
        let gen = p.gen;
        p.files.push((gen, id, from));
        p.dir += u64::from(new_name);
        p.superseded
            .extend(superseded.map(|(shared, v)| (gen, shared, v)));
        drop(p);
        if first {
            self.wake.notify_one();
        }
        gen
    }

    /// Whether a new staging file name awaits the commit.
    pub fn dir_pending(&self) -> bool {
        self.pending.lock().dir > 0
    }

    /// Whether generation `gen` is durable.
    pub fn covers(&self, gen: u64) -> bool {
        self.done.load(Ordering::SeqCst) >= gen
    }

    /// What a commit starting now covers. It stays listed (a power cut may still lose it)
    /// until [`Self::finish`] drops it.
    pub fn snapshot(&self) -> Uncommitted {
        let p = self.pending.lock();
        Uncommitted {
            files: p.files.clone(),
            dir: p.dir,
            superseded: p.superseded.clone(),
            gen: p.gen,
        }
    }

    /// The commit of `done` succeeded: what it covered is durable (later additions stay).
    pub fn finish(&self, done: &Uncommitted) {
        let mut p = self.pending.lock();
        p.files.retain(|f| f.0 > done.gen);
        // Names made since the snapshot stay pending (its count only covered those before).
        p.dir = p.dir.saturating_sub(done.dir);
        p.superseded.retain(|s| s.0 > done.gen);
        self.done.fetch_max(done.gen, Ordering::SeqCst);
        // Closes that came during the commit: the next one is theirs.
        if !p.files.is_empty() || !p.superseded.is_empty() {
            self.wake.notify_one();
        }
    }

    /// Staging file `id` was made durable outside a commit: a power cut can no longer touch
    /// it (though the records it supersedes wait for the commit as ever).
    pub fn synced(&self, id: u64) {
        self.pending.lock().files.retain(|f| f.1 != id);
    }
}

/// What a power cut now may lose: the model the simulation damages the cache directory by.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct Exposure {
    /// The journal, and how many of its first bytes are durable.
    pub journal: (std::path::PathBuf, u64),
    /// Staging files closed since the last commit, and the offset from which their bytes may
    /// be lost (what comes before it was durable already).
    pub files: Vec<(std::path::PathBuf, u64)>,
}

impl<S: crate::store::ObjectStore> super::writeback::WriteBack<S> {
    /// Makes every version closed so far durable, and the journal with it; then lets go of
    /// the versions they superseded. Commits run one at a time; one that fails keeps its work
    /// for the next.
    pub(super) async fn commit_now(&self) -> std::io::Result<()> {
        let _running = self.commits.running.lock().await;
        let batch = self.commits.snapshot();
        let files: Vec<_> = batch
            .files
            .iter()
            .map(|(_, id, _)| (*id, self.dir.staging(*id)))
            .collect();
        let dir = (batch.dir > 0).then(|| self.dir.staging_dir().clone());
        // Every file's result is kept, whatever fails after it: a failed sync is told once.
        let (results, rest) = crate::platform::blocking(move || {
            let mut results = Vec::new();
            for (id, at) in files {
                // Write access: Windows flushes only through a handle that may write.
                match at.open(crate::platform::Open::new().read(true).write(true)) {
                    Ok(f) => results.push((id, f.sync_data())),
                    // Removed since (its name deleted, or superseded and uploaded): nothing
                    // of it is needed any more.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Ok((results, Err(e))),
                }
            }
            Ok((results, dir.map_or(Ok(()), |d| d.sync())))
        })
        .await?;
        self.disk_errors.end_of_commit();
        // A file the disk failed to write back is told once ([`super::disk_errors`]): noted
        // now, never tried again, and left out of what the journal calls durable.
        let (mut ids, mut failed) = (Vec::new(), Vec::new());
        for (id, result) in results {
            match self.disk_errors.synced(id, result) {
                // Failed at an earlier commit, or told elsewhere: this sync is a later one,
                // which Linux lets succeed.
                Ok(()) if self.disk_errors.failed(id).is_some() => failed.push(id),
                Ok(()) => ids.push(id),
                Err(e) => {
                    self.disk_errors.note(id, &e);
                    failed.push(id);
                }
            }
        }
        // Files the kernel writes in place say so in their records once synced (see
        // [`Record::durable`](super::journal::Record)), or that the disk failed them, in the
        // journal sync that follows.
        self.journal.mark_disk_failed(&failed)?;
        rest?;
        self.journal.mark_durable(&ids)?;
        self.journal.flush().await?;
        // The superseded versions' records go (without a sync: a replay that still finds one
        // prefers the newer version, whose bytes check), before the newer versions count as
        // committed: none of those is uploaded, and its own record dropped, while an older
        // record of its name is still live.
        // One that cannot be forgotten (a full cache disk) fails the commit, which is tried
        // again, rather than let the newer version go to the bucket and its record go while
        // the older record lives on.
        let mut retiring = Vec::new();
        for (_, shared, old) in batch.superseded.iter() {
            self.journal.forget(old.id)?;
            retiring.push((shared.clone(), old.clone()));
        }
        if !batch.superseded.is_empty() {
            self.flush_forgotten_soon();
        }
        self.commits.finish(&batch);
        // Their staging files go too, once no upload reads them. Never waited for: an item's
        // lock may be held for long (a close waiting for cache space), and no commit waits
        // behind it; one that is busy is tried again at the next commit.
        let mut leftover = std::mem::take(&mut *self.commits.leftover.lock());
        leftover.extend(retiring);
        for (shared, old) in leftover {
            let done = match shared.item.try_lock() {
                Ok(mut it) => self.let_go(&mut it, &old),
                Err(_) => false,
            };
            if !done {
                self.commits.leftover.lock().push((shared, old));
            }
        }
        if !self.commits.leftover.lock().is_empty() {
            self.commits.wake.notify_one();
        }
        Ok(())
    }

    /// What a power cut now may lose (for the simulation).
    #[doc(hidden)]
    pub fn exposure(&self) -> Exposure {
        let files = self.commits.pending.lock().files.clone();
        Exposure {
            journal: self.journal.durable_len(),
            files: files
                .into_iter()
                .map(|(_, id, from)| (self.dir.staging(id).path(), from))
                .collect(),
        }
    }

    /// Returns once generation `gen` is durable, committing now if it is not yet.
    pub(super) async fn committed(&self, gen: u64) -> std::io::Result<()> {
        if self.commits.covers(gen) {
            return Ok(());
        }
        self.commit_now().await
    }

    /// A version superseded by a newer one that is now durable, its record forgotten: its
    /// staging file goes. Not while an upload is in flight (it may read it): then it stays
    /// listed, so that the attempt's end leaves it alone, and `false` says to try again.
    fn let_go(&self, it: &mut super::item::Item, old: &Version) -> bool {
        if it.sched.uploading {
            return false;
        }
        it.superseded_uncommitted.retain(|id| *id != old.id);
        let in_use = it.work_id == old.id
            || it.pending.as_ref().is_some_and(|p| p.id == old.id)
            || it.unsaved_file == Some(old.id);
        if !in_use {
            self.discard(old);
        }
        true
    }

    /// Starts the background commit, once: it sleeps until a close leaves something
    /// uncommitted, waits one interval, and commits.
    pub(super) fn ensure_commit_task(self: &Arc<Self>) {
        if self.commits.task_started.swap(true, Ordering::SeqCst) {
            return;
        }
        let commits = self.commits.clone();
        let engine = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                commits.wake.notified().await;
                tokio::time::sleep(commits.interval).await;
                let Some(engine) = engine.upgrade() else {
                    return;
                };
                if let Err(e) = engine.commit_now().await {
                    tracing::error!(error = %e, "could not make closed files durable on the cache disk; trying again, and their uploads wait for it");
                    commits.wake.notify_one();
                }
            }
        });
    }
}
