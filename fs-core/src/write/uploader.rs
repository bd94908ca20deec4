//! Runs uploads: one task per item with a pending version, which waits for the scheduler's
//! go, takes an upload slot, uploads the version (see [`super::upload`]), and files the
//! outcome back into the item.
//!
//! The version uploaded is fixed when the attempt starts; its bytes cannot change while it
//! runs (the item copies a version before editing it). When a newer version was committed
//! meanwhile, the older one's result only moves the base generation along: the task goes
//! round again for the newer one. Outcomes:
//! - in the bucket (or saved as a conflict copy): the version's journal record goes (kept
//!   while the kernel may still write its file in place, see [`super::passthrough`]), and the
//!   key's cached metadata is updated;
//! - our own earlier write found in the bucket (its answer was lost): rebased, retried at once;
//! - failed: the item backs off (the scheduler owns the wait), its upload progress and the fact
//!   that this version may have landed are journaled, and it is retried. Nothing is dropped.
//!
//! The outcomes are counted here as they are filed (the status counters, which also feed
//! [`crate::metrics`]: uploads and their bytes, failures, conflicts), and a file counts as a
//! pending upload while its task lives.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::item::{Life, Shared, Version};
use super::journal::UploadState;
use super::upload::{upload, Outcome, UploadJob, UploadSource};
use super::writeback::{content_type, WriteBack};
use crate::store::{
    mtime_metadata, ObjectStore, Precondition, StoreErrorKind, WriteOptions, RENAME_KEY, WRITER_KEY,
};

/// What one pass of the loop decided.
enum Step {
    /// Nothing left to upload: the task ends.
    Done,
    /// Not yet time (or paused): wait to be woken, or until this instant.
    Wait(Option<tokio::time::Instant>),
    Upload(Box<Prepared>),
    /// A version closed while the kernel still writes its file is due, without its CRC32C:
    /// seal it now, as an fsync would ([`super::passthrough`]).
    Seal,
}

struct Prepared {
    version: Version,
    job: UploadJob,
    file: crate::platform::At,
}

impl<S: ObjectStore> WriteBack<S> {
    /// Starts the item's upload task unless one runs. The caller holds the item's lock.
    pub(super) fn ensure_task(self: &Arc<Self>, shared: &Arc<Shared>, it: &mut super::item::Item) {
        if it.sched.task || !it.has_work() {
            return;
        }
        it.sched.task = true;
        let (me, shared) = (self.clone(), shared.clone());
        // Counted as pending from now until the task ends, which is when nothing is left.
        let pending = crate::metrics::PendingUpload::new();
        tokio::spawn(async move {
            me.run(shared).await;
            drop(pending);
        });
    }

    async fn run(self: Arc<Self>, shared: Arc<Shared>) {
        loop {
            let woken = shared.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            match self.next_step(&shared).await {
                Step::Done => return,
                Step::Wait(until) => match until {
                    Some(t) => {
                        tokio::select! {
                            _ = tokio::time::sleep_until(t) => {}
                            _ = woken => {}
                        }
                    }
                    None => woken.await,
                },
                Step::Seal => {
                    let item = super::item::ItemRef(shared.clone());
                    let sealed = self
                        .commit_when(&item, true, Self::seals_when_due, false)
                        .await;
                    let mut it = shared.item.lock().await;
                    match sealed {
                        // It was due already: uploaded now.
                        Ok(()) => it.sched.due_in(std::time::Duration::ZERO),
                        // Held meanwhile (its close reports it), or the journal failed: tried
                        // again after a backoff, never in a loop.
                        Err(e) => {
                            let wait = it.sched.failed(self.cfg.retry_initial, self.cfg.retry_max);
                            tracing::warn!(key = %it.key, error = %e, retry_in = ?wait, "cannot seal a file the kernel writes for its upload");
                            // Held: kept as not saved now, as its last release would (a crash
                            // must not replay its live record as it is, I10).
                            if it.held.is_some() {
                                self.keep_unsaved(&shared, &mut it).await;
                            }
                        }
                    }
                }
                Step::Upload(p) => {
                    // The slot first: a task waiting for one holds no descriptor, and is not
                    // "uploading" (a rename or unlink need not wait for the queue).
                    let Ok(slot) = self.slots.clone().acquire_owned().await else {
                        return;
                    };
                    self.attempt(&shared, *p, slot).await
                }
            }
        }
    }

    async fn next_step(self: &Arc<Self>, shared: &Arc<Shared>) -> Step {
        let mut it = shared.item.lock().await;
        if !it.has_work() {
            it.sched.task = false;
            self.retire_if_settled(shared, &mut it);
            return Step::Done;
        }
        if it.sched.paused > 0 || self.key_paused(&it.key) {
            return Step::Wait(None);
        }
        match it.sched.start_at() {
            Some(t) if t > tokio::time::Instant::now() => return Step::Wait(Some(t)),
            None => return Step::Wait(None),
            Some(_) => {}
        }
        // A version whose CRC32C is still to come (the kernel writes its file) is sealed now
        // that it is due, unless something keeps it from the bucket; then it waits for the
        // seal that saves it (a close, an fsync, the last release), which wakes the task.
        let Some(v) = it.pending.clone().filter(|v| !v.crc_pending) else {
            return match Self::seals_when_due(&it) {
                true => Step::Seal,
                false => Step::Wait(None),
            };
        };
        let mut opts = WriteOptions {
            content_type: Some(content_type(&it.key)),
            metadata: v.metadata.clone(),
            ..Default::default()
        };
        opts.metadata.extend(mtime_metadata(v.mtime));
        // An empty file names the mount that wrote it: every empty object has its CRC32C and
        // size, so only this tells our own landed write from another machine's (I4, I12).
        opts.metadata.remove(WRITER_KEY);
        // A directory rename's token proved one copy ours; a new version is not that copy.
        opts.metadata.remove(RENAME_KEY);
        if v.size == 0 {
            opts.metadata
                .insert(WRITER_KEY.to_string(), self.dir.tag().to_string());
        }
        let precondition = match &it.base {
            Some((k, g)) if *k == it.key => Precondition::GenerationMatch(*g),
            _ => Precondition::DoesNotExist,
        };
        let job = UploadJob {
            parts_prefix: self.parts_prefix(v.id, Some(v.seq)),
            key: it.key.clone(),
            precondition,
            opts,
            crc32c: v.crc32c,
            maybe_landed: it.maybe_landed.clone(),
            conflict_tag: self.dir.tag().to_string(),
        };
        Step::Upload(Box::new(Prepared {
            file: self.dir.staging(v.id),
            version: v,
            job,
        }))
    }

    async fn attempt(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        p: Prepared,
        _slot: tokio::sync::OwnedSemaphorePermit,
    ) {
        let Prepared {
            version: v,
            job,
            file,
        } = p;
        // Only a durable version is uploaded ([`super::commit`]): a power cut must not bring
        // back an older record of a file whose newer version is already in the bucket.
        let durable = self.committed(v.commit_gen).await;
        {
            // Anything may have changed while the slot (or the commit) was awaited: a rename,
            // a pause, a newer version. Then the loop decides again.
            let mut it = shared.item.lock().await;
            let still = it.life == Life::Live
                && it.key == job.key
                && it.sched.paused == 0
                && !self.key_paused(&it.key)
                && it.pending.as_ref().is_some_and(|q| q.seq == v.seq);
            if !still {
                return;
            }
            it.sched.uploading = true;
            if v.size >= self.cfg.upload.single_shot_threshold && !it.parts_files.contains(&v.id) {
                it.parts_files.push(v.id);
            }
        }
        let opened = match durable {
            Ok(()) => {
                crate::platform::blocking(move || {
                    file.open(crate::platform::Open::new().read(true))
                })
                .await
            }
            Err(e) => Err(std::io::Error::other(format!(
                "cannot make the staged data durable: {e}"
            ))),
        };
        let record = parking_lot::Mutex::new(None::<UploadState>);
        let result = match opened {
            Ok(file) => {
                self.counters
                    .uploading_files
                    .fetch_add(1, Ordering::Relaxed);
                let result = upload(
                    self.store.as_ref(),
                    &UploadSource::new(file, v.size, self.part_buffers.clone()),
                    &job,
                    &self.cfg.upload,
                    &v.progress,
                    &|state| *record.lock() = Some(state),
                )
                .await;
                self.counters
                    .uploading_files
                    .fetch_sub(1, Ordering::Relaxed);
                result
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.lost(shared, &v, &e).await;
                return;
            }
            // Out of descriptors, a disk error: a failure like any other, retried with backoff.
            Err(e) => Err(crate::store::StoreError::new(
                StoreErrorKind::Other,
                format!("cannot open the staged data: {e}"),
            )),
        };
        let progress = record.into_inner();
        let mut it = shared.item.lock().await;
        it.sched.uploading = false;
        let current = it.pending.as_ref().is_some_and(|p| p.seq == v.seq);
        // A version superseded by one not yet committed is let go by the commit instead.
        let superseded = |it: &super::item::Item| {
            it.work_id != v.id
                && it.pending.as_ref().is_none_or(|p| p.id != v.id)
                && !it.superseded_uncommitted.contains(&v.id)
        };
        match result {
            Ok(Outcome::Uploaded(meta)) | Ok(Outcome::Conflict(meta)) => {
                let conflict = meta.key != it.key;
                if conflict {
                    self.counters.record_conflict();
                    tracing::error!(key = %it.key, saved_as = %meta.key, "conflict: our version was saved beside the bucket's");
                    // Later changes to this file start from whatever is now in the bucket.
                    it.base = None;
                } else {
                    it.base = Some((meta.key.clone(), meta.generation));
                }
                it.maybe_landed.clear();
                it.sched.succeeded();
                // The kernel may still write the version's file in place (handles open, a
                // mapping): its record stays until the item retires or the file's next record
                // replaces it, so a crash meanwhile finds the file and uploads it as it is then
                // (over this upload, which a replay recognises as ours). See passthrough.rs.
                // Not for a file held or not saved since it was sealed (I10): as it is now, it
                // is never to be uploaded. A dip in the cache disk's free space the watch saw
                // meanwhile holds it now.
                if current && v.live && v.id == it.work_id {
                    self.refresh(shared, &mut it);
                }
                let keep = current
                    && !conflict
                    && v.live
                    && v.id == it.work_id
                    && it.held.is_none()
                    && !it.close_failed
                    && it.unsaved_record.is_none();
                // Held just now (the look above): what the kernel wrote since is kept as not
                // saved, under a record of its own, once the version's record goes below.
                let keep_unsaved = current && v.live && v.id == it.work_id && it.held.is_some();
                if keep {
                    it.pending = None;
                    // Its upload is done: a rename must not carry its session to a new name.
                    let mut landed = v.clone();
                    landed.progress = UploadState::Staged;
                    it.kept_landed = Some(landed);
                } else if current {
                    it.pending = None;
                    // Not waited for: its staging file goes through the pool, which makes the
                    // journal durable before touching it. A conflict's is: replayed, it would
                    // make a second conflict copy.
                    let forgotten = if conflict {
                        self.journal.remove(v.id).await
                    } else {
                        self.journal.forget(v.id)
                    };
                    match forgotten {
                        Ok(()) => {
                            it.forgotten_unsynced = it.work_id == v.id;
                            self.flush_forgotten_soon();
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "could not remove a journal record; the file will be uploaded again at the next mount")
                        }
                    }
                } else if let Some(newer) = it.pending.as_mut().filter(|p| p.id == v.id) {
                    // The parts it listed were the ones just used and deleted.
                    newer.progress = UploadState::Staged;
                }
                if keep_unsaved {
                    self.keep_unsaved(shared, &mut it).await;
                }
                if superseded(&it) {
                    self.recycle(v.id);
                }
                // Parts whose answer was lost are listed nowhere: sweep the version's prefix (all
                // of the file's, unless a newer version of the same file may still use some).
                // A version in parts earlier from the same file counts too, however small this
                // one is (a file cut shorter since).
                let shared_file = it.pending.as_ref().is_some_and(|p| p.id == v.id);
                if v.size >= self.cfg.upload.single_shot_threshold
                    || (it.parts_files.contains(&v.id) && !shared_file)
                {
                    if !shared_file {
                        it.unlist_parts_file(v.id);
                    }
                    self.sweep_parts(v.id, shared_file.then_some(v.seq));
                }
                // A version kept apart for this upload no longer takes space.
                self.recharge(shared, &it);
                self.counters.record_upload(v.size);
                (self.on_settled)(&it.key, (!conflict).then_some(&meta));
                shared.progress.send_modify(|p| {
                    p.uploaded = p.uploaded.max(v.seq);
                    p.error = None;
                    p.attempts += 1;
                });
            }
            Ok(Outcome::Rebased(meta)) => {
                it.base = Some((meta.key.clone(), meta.generation));
                if let Some(p) = it.pending.as_mut() {
                    p.progress = UploadState::Staged;
                }
                if superseded(&it) {
                    let _ = self.dir.staging(v.id).remove();
                    self.sweep_file_parts(&mut it, v.id, v.size);
                }
                (self.on_settled)(&it.key, Some(&meta));
                shared.progress.send_modify(|p| p.attempts += 1);
            }
            Err(e) => {
                // Set when a live version was sealed again as it is now: not a failure a
                // waiter is told of (the next attempt uploads the newer bytes).
                let mut resealed = false;
                self.counters.record_failure();
                let wait = it.sched.failed(self.cfg.retry_initial, self.cfg.retry_max);
                it.note_maybe_landed(&v);
                if current && it.life == Life::Live {
                    // The kernel still writes the file: a dip in the disk's free space the
                    // watch saw holds it before its changed bytes are taken as a new version.
                    if v.id == it.work_id {
                        self.refresh(shared, &mut it);
                    }
                    if let Some(p) = it.pending.as_mut() {
                        if let Some(state) = progress {
                            p.progress = state;
                        }
                        if e.kind == StoreErrorKind::Other && e.message.contains("staged bytes") {
                            p.progress = UploadState::Staged;
                        }
                    }
                    let changed = e.kind == StoreErrorKind::Other
                        && e.message.contains("staged bytes")
                        && it.pending.as_ref().is_some_and(|p| p.live);
                    // Changes not saved (a failed write or close, I10) are in the same file:
                    // what it holds now is not to be uploaded, and the sealed bytes are gone.
                    let unsaved_here = it.pending.as_ref().is_some_and(|p| {
                        p.id == it.work_id && (it.held.is_some() || it.unsaved_file == Some(p.id))
                    });
                    // Its file's write-back failed: what changed is what the disk lost, not a
                    // store through a mapping ([`super::disk_errors`]).
                    let mismatch =
                        e.kind == StoreErrorKind::Other && e.message.contains("staged bytes");
                    let lost = mismatch.then(|| self.disk_errors.failed(v.id)).flatten();
                    if let Some(reason) = lost {
                        self.keep_failed_write(shared, &mut it, &reason).await;
                    } else if changed && unsaved_here {
                        self.keep_unsaved_as(shared, &mut it, true).await;
                    } else if changed {
                        match self.reseal_live(shared, &mut it).await {
                            Ok(()) => resealed = true,
                            Err(re) => {
                                tracing::warn!(key = %it.key, error = %re, "cannot seal again a file the kernel changed")
                            }
                        }
                    }
                    if let Some(p) = it.pending.clone() {
                        if let Err(je) = self.journal.put(&it.record(&p)).await {
                            tracing::warn!(error = %je, "could not journal upload progress");
                        }
                    }
                } else if let Some(newer) = it.pending.as_mut().filter(|p| p.id == v.id) {
                    // Appended to meanwhile: the newer version starts with the same bytes, so
                    // the parts may serve it (each is checked before it is reused).
                    if let Some(state) = progress {
                        newer.progress = state;
                    }
                } else {
                    // The version was superseded by one in another file, or deleted meanwhile:
                    // the parts of every version its file held are garbage.
                    self.sweep_file_parts(&mut it, v.id, v.size);
                }
                if superseded(&it) {
                    let _ = self.dir.staging(v.id).remove();
                }
                tracing::warn!(key = %it.key, error = %e, retry_in = ?wait, "upload failed; the file stays staged and will be retried");
                shared.progress.send_modify(|p| {
                    if resealed {
                        p.attempts += 1;
                        return;
                    }
                    p.error = Some(e.to_string());
                    p.failed_seq = v.seq;
                    p.attempts += 1;
                });
            }
        }
        self.retire_if_settled(shared, &mut it);
        drop(it);
        self.finish_attempt(shared);
    }

    /// The version's bytes are gone from the cache directory (removed by hand): it can never be
    /// uploaded. Say so loudly and stop trying, rather than loop forever; an fsync waiting for
    /// it gets the error.
    async fn lost(&self, shared: &Arc<Shared>, v: &Version, e: &std::io::Error) {
        let mut it = shared.item.lock().await;
        it.sched.uploading = false;
        let current = it.pending.as_ref().is_some_and(|p| p.seq == v.seq);
        if current && it.life == Life::Live {
            tracing::error!(key = %it.key, id = v.id, error = %e, "the staged data of a saved file is missing from the cache directory; it cannot be uploaded");
            self.counters.lost_files.fetch_add(1, Ordering::Relaxed);
            it.pending = None;
            let _ = self.journal.remove(v.id).await;
            let message = format!("the staged data is missing from the cache directory: {e}");
            shared.progress.send_modify(|p| {
                p.error = Some(message);
                p.failed_seq = v.seq;
            });
        }
        drop(it);
        self.finish_attempt(shared);
    }

    fn finish_attempt(&self, shared: &Arc<Shared>) {
        shared.progress.send_modify(|p| p.attempts += 1);
        self.settled.notify_waiters();
    }
}
