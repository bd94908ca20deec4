//! Sealing: how a working copy becomes an acknowledged version, and what a close, an fsync
//! and the last release of a file do.
//!
//! A commit completes the working copy (fetching the bytes the writer never touched), fsyncs
//! it, computes its CRC32C and appends its journal record, replacing the superseded
//! version's in the same line; only then is the close acknowledged. A commit that fails keeps
//! the changes staged and journaled as *not saved* (I10): never uploaded, never retried in the
//! background, kept across a crash.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::item::{Item, ItemRef, Life, Shared, Version};
use super::journal::{Change, UploadState};
use super::writeback::WriteBack;
use crate::error::{FsError, FsResult};
use crate::store::ObjectStore;

impl<S: ObjectStore> WriteBack<S> {
    /// Makes the item's current content an acknowledged version: every byte present locally,
    /// fsync'd, its CRC32C known, and its journal record durable (replacing the record of the
    /// version it supersedes in the same line). Called on close, fsync and the last release.
    ///
    /// A held working copy (a change to it failed) is never committed: the error is returned
    /// again. A commit that fails otherwise (no room for the whole file, bytes of the object it
    /// was opened from that could not be fetched) is not tried again in the background (I10:
    /// the user was told it failed): the changes stay staged, not saved, until a later close or
    /// fsync succeeds.
    pub async fn commit(self: &Arc<Self>, item: &ItemRef) -> FsResult<()> {
        self.commit_as(item, true).await
    }

    /// [`Self::commit`]; `crc: false` (a `close()`) lets a file the kernel writes itself be
    /// sealed without its CRC32C while its passthrough handles stay open, and the last
    /// release computes it ([`super::passthrough`]).
    pub(super) async fn commit_as(self: &Arc<Self>, item: &ItemRef, crc: bool) -> FsResult<()> {
        self.commit_when(item, crc, |_| true, false).await
    }

    /// [`Self::commit_as`], made only while `when` holds of the item (checked under its lock):
    /// the engine's own seals decide on the item as they find it. `user`: a close or fsync,
    /// whose failure marks the item ([`Item::close_failed`]) under the same lock, so that no
    /// seal of the engine's comes between the failure and its mark.
    pub(super) async fn commit_when(
        self: &Arc<Self>,
        item: &ItemRef,
        crc: bool,
        when: impl Fn(&Item) -> bool,
        user: bool,
    ) -> FsResult<()> {
        let failed = |it: &mut Item, e: FsError| {
            it.close_failed |= user;
            Err(e)
        };
        loop {
            let mut it = item.0.item.lock().await;
            if it.life != Life::Live || !when(&it) {
                return Ok(());
            }
            // First what the kernel wrote, which may hold the file too.
            self.refresh(&item.0, &mut it);
            self.look_for_disk_errors(&mut it);
            if let Some(e) = it.held.clone() {
                return failed(&mut it, e);
            }
            let crc_now = crc || it.through.is_none();
            let unsealed = it
                .pending
                .as_ref()
                .is_some_and(|p| p.crc_pending && p.id == it.work_id);
            let reseal = unsealed && crc_now;
            if !it.dirty() && !reseal {
                return Ok(());
            }
            let size = it.work.size();
            if let Err(e) = self.reserve(&item.0, &it, size).await {
                return failed(&mut it, e);
            }
            let missing = it.work.missing(0..size);
            if missing.is_empty() {
                return match self.seal(&item.0, &mut it, crc_now).await {
                    Err(e) => failed(&mut it, e),
                    ok => ok,
                };
            }
            self.fill_holes(&item.0, it, missing).await?;
        }
    }

    pub(super) async fn seal(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        it: &mut Item,
        crc_now: bool,
    ) -> FsResult<()> {
        // Sealed without a sync, for the commit to make durable ([`super::commit`]); but a
        // seal that also saves changes kept as not saved syncs at once, as its line must drop
        // their record in the same breath.
        let lazy = it.unsaved_record.is_none();
        // The kernel still writes the file itself: its CRC32C waits for the last release.
        let crc_pending = lazy && !crc_now && it.through.is_some();
        // A failed fsync may have lost written pages: like a failed write. So may a CRC32C
        // read from a file whose write-back failed ([`super::disk_errors`]).
        let sealed = match crc_pending {
            true => Ok(0),
            false => match self.may_read_crc_of(it) {
                Ok(()) => it.work.seal(!lazy).await.map_err(FsError::from),
                Err(e) => Err(e),
            },
        };
        let crc = match sealed {
            Ok(crc) => crc,
            Err(e) => {
                // The file is complete here: what failed is its sync or a read of it, and a
                // failed write-back is told once ([`super::disk_errors`]).
                self.note_disk_error(it.work_id, &e);
                self.hold_on_failure(it, &Err(e.clone()));
                return Err(e);
            }
        };
        let mut new_name = false;
        if !it.work_named {
            if lazy {
                new_name = true;
            } else {
                let dir = self.dir.staging_dir().clone();
                crate::platform::blocking(move || dir.sync()).await?;
            }
            it.work_named = true;
        }
        let old = it.pending.take();
        if let Some(o) = old.as_ref().filter(|o| !o.crc_pending) {
            // An upload of the superseded version may have landed unseen (in flight now, or
            // its answer lost): the new record remembers it, so that finding it in the bucket
            // after a crash is not taken for someone else's write.
            it.note_maybe_landed(o);
        }
        let progress = match &old {
            // Appended to: parts of the older version may still hold this one's bytes (each is
            // checked before it is reused). A resumable session is the older version's alone.
            Some(p) if p.id == it.work_id => match &p.progress {
                UploadState::Uploading { parts, .. } if !parts.is_empty() => {
                    UploadState::Uploading {
                        session_url: None,
                        parts: parts.clone(),
                    }
                }
                _ => UploadState::Staged,
            },
            _ => UploadState::Staged,
        };
        let mut v = Version {
            seq: it.next_seq,
            id: it.work_id,
            size: it.work.size(),
            crc32c: crc,
            mtime: it.mtime,
            metadata: it.metadata.clone(),
            progress,
            commit_gen: 0,
            fallback: None,
            live: it.work_live,
            crc_pending,
            open: it.through.is_some(),
        };
        // Appended to in place: the older version is the first bytes of the same file, and
        // the fallback after a power cut (or the one it fell back to, when it is not yet
        // durable itself).
        let appended = old.as_ref().filter(|o| o.id == v.id);
        if lazy && !v.live {
            v.fallback = appended.and_then(|o| match self.commits.covers(o.commit_gen) {
                true => Some((o.size, o.crc32c)),
                false => o.fallback,
            });
        }
        let superseded = old.as_ref().filter(|o| o.id != v.id);
        let mut rec = it.record(&v);
        // Synced at once: a file the kernel writes is durable as of now (see
        // [`super::journal::Record::durable`]).
        rec.durable = v.live && !lazy;
        let mut changes = vec![Change::Put(rec)];
        if !lazy {
            if let Some(o) = superseded {
                changes.push(Change::Del(o.id));
            }
        }
        // Changes kept as not saved are saved now: their record goes in the same line.
        if let Some(u) = it.unsaved_record {
            changes.push(Change::Del(u));
        }
        let change = match changes.len() {
            1 => changes.remove(0),
            _ => Change::Batch(changes),
        };
        let journaled = if lazy {
            self.journal.apply_unsynced(change)
        } else {
            self.journal.apply(change).await
        };
        if let Err(e) = journaled {
            it.pending = old;
            return Err(e.into());
        }
        if lazy {
            let from = appended.map_or(0, |o| o.size);
            let kept = superseded.map(|o| (shared.clone(), o.clone()));
            if let Some(o) = superseded {
                it.superseded_uncommitted.push(o.id);
            }
            v.commit_gen = self.commits.add(v.id, from, new_name, kept);
            self.ensure_commit_task();
        }
        it.unsaved_record = None;
        // A landed version's record kept for the kernel's writes: this one replaced it.
        if let Some(k) = it.kept_landed.take().filter(|k| k.id != v.id) {
            self.forget_landed(&k);
        }
        if old.as_ref().is_some_and(|o| Some(o.id) == it.unsaved_file) {
            // The superseded version's file: it goes as that version's does, below (not while
            // an attempt in flight still reads it).
            it.unsaved_file = None;
        }
        it.next_seq += 1;
        it.pending = Some(v);
        Self::note_kernel_seen(it);
        self.drop_unsaved_file(it);
        it.committed = it.edits;
        if let Some(o) = old.filter(|o| o.id != it.work_id) {
            // Superseded before it reached the bucket. Kept until the new version's commit
            // when that is still to come; an attempt in flight still reads it and cleans up
            // after itself when it ends.
            if !lazy && !it.sched.uploading {
                self.discard(&o);
            }
        }
        self.recharge(shared, it);
        it.sched.due_in(self.cfg.write_back_delay);
        shared.wake.notify_one();
        self.ensure_task(shared, it);
        Ok(())
    }

    /// Makes the working copy's bytes and its name durable, before a record names them.
    pub(super) async fn work_durable(&self, it: &mut Item) -> std::io::Result<()> {
        let file = it.work.clone_file()?;
        if let Err(e) = crate::platform::blocking(move || file.sync_all()).await {
            self.note_disk_error(it.work_id, &e);
            return Err(e);
        }
        if !it.work_named {
            let dir = self.dir.staging_dir().clone();
            crate::platform::blocking(move || dir.sync()).await?;
            it.work_named = true;
        }
        Ok(())
    }

    /// Changes that were not saved (held, or the last close failed) stay staged: their bytes
    /// are made durable and a journal record keeps them across an unmount or a crash. They
    /// are never uploaded from it. Best effort: the disk that failed a write may fail this too.
    ///
    /// A version the kernel wrote that is still without its CRC32C (a close sealed it while
    /// passthrough handles were open) is the working copy itself, changed since in place by
    /// the change that failed: the two cannot be told apart, so it is kept as not saved with
    /// them (I10), in the same journal line, instead of waiting for a seal that will not come.
    pub(super) async fn keep_unsaved(&self, shared: &Shared, it: &mut Item) {
        self.keep_unsaved_as(shared, it, false).await
    }

    /// [`Self::keep_unsaved`]; `live_too`: the pending version is the working copy's file,
    /// written in place by the kernel, and found changed since its seal (an upload saw it),
    /// so it goes with the changes not saved even though its CRC32C is known.
    pub(super) async fn keep_unsaved_as(&self, shared: &Shared, it: &mut Item, live_too: bool) {
        let unsealed = it
            .pending
            .as_ref()
            .filter(|v| v.id == it.work_id && (v.crc_pending || (live_too && v.live)))
            .map(|v| (v.id, v.seq));
        if it.life != Life::Live || (!it.dirty() && unsealed.is_none()) {
            return;
        }
        let id = it.unsaved_record.unwrap_or_else(|| self.new_id());
        // A landed version's record kept for the kernel's writes names the same file: replayed,
        // it would upload what is kept here as not saved.
        let landed = it.kept_landed.as_ref().map(|v| v.id);
        let kept = match self.work_durable(it).await {
            Ok(()) => {
                let put = Change::Put(it.unsaved(id));
                let dels: Vec<Change> = unsealed
                    .map(|(v, _)| v)
                    .into_iter()
                    .chain(landed)
                    .map(Change::Del)
                    .collect();
                let change = match dels.is_empty() {
                    true => put,
                    false => Change::Batch(std::iter::once(put).chain(dels).collect()),
                };
                self.journal.apply(change).await
            }
            Err(e) => Err(e),
        };
        match kept {
            Ok(()) => {
                if landed.is_some() {
                    it.kept_landed = None;
                }
                if let Some((_, seq)) = unsealed {
                    tracing::error!(key = %it.key, "a file the kernel wrote could not be saved; it stays staged, not saved, with its last changes");
                    it.pending = None;
                    if !it.dirty() {
                        it.edits += 1;
                    }
                    // Whoever waits for that version (an fsync) is told it will not come.
                    shared.progress.send_modify(|p| {
                        p.error = Some("the file's changes could not be saved".into());
                        p.failed_seq = p.failed_seq.max(seq);
                    });
                }
                it.unsaved_record = Some(id);
                // The record now names the working copy's file; one it named before (the
                // working copy moved off it since) is no longer needed.
                self.drop_unsaved_file(it);
                it.unsaved_file = Some(it.work_id);
            }
            Err(e) => {
                tracing::error!(key = %it.key, error = %e, "could not keep the file's unsaved changes in the journal; they are lost if the mount stops")
            }
        }
    }

    /// Lets go of the staging file an unsaved record named, once no record names it (through
    /// the pool: it stays until the record's removal is durable). The working copy's own file
    /// is kept.
    pub(super) fn drop_unsaved_file(&self, it: &mut Item) {
        if let Some(f) = it.unsaved_file.take() {
            if f != it.work_id && it.pending.as_ref().is_none_or(|p| p.id != f) {
                self.recycle(f);
            }
        }
    }

    /// Whether the file's last change or save failed: a write held it, or its last close
    /// could not commit it.
    pub async fn save_failed(&self, item: &ItemRef) -> bool {
        let it = item.0.item.lock().await;
        it.held.is_some() || it.close_failed
    }

    /// Close of one handle: commit, then either wait for the upload (`upload_on_close`) or let
    /// it run in the background. A commit that fails keeps the changes staged (not saved).
    pub async fn close(self: &Arc<Self>, item: &ItemRef) -> FsResult<()> {
        if let Err(e) = self.commit_when(item, false, |_| true, true).await {
            let mut it = item.0.item.lock().await;
            it.close_failed = true;
            self.keep_unsaved(&item.0, &mut it).await;
            return Err(e);
        }
        item.0.item.lock().await.close_failed = false;
        if self.cfg.sync_on_close {
            self.commit_now().await?;
            if let Some(e) = self.close_sync_failed(&*item.0.item.lock().await) {
                return Err(e);
            }
        }
        if self.cfg.upload_on_close {
            self.flush_to_bucket(item).await
        } else {
            Ok(())
        }
    }

    /// Commits and waits until the item is in the bucket: fsync.
    pub async fn flush_to_bucket(self: &Arc<Self>, item: &ItemRef) -> FsResult<()> {
        if let Err(e) = self.commit_when(item, true, |_| true, true).await {
            item.0.item.lock().await.close_failed = true;
            return Err(e);
        }
        item.0.item.lock().await.close_failed = false;
        let target = {
            let mut it = item.0.item.lock().await;
            let Some(p) = it.pending.as_ref().filter(|_| it.life == Life::Live) else {
                return Ok(());
            };
            let target = p.seq;
            it.sched.expedite();
            self.ensure_task(&item.0, &mut it);
            target
        };
        item.0.wake.notify_one();
        let mut rx = item.0.progress.subscribe();
        loop {
            {
                let p = rx.borrow_and_update();
                if p.uploaded >= target {
                    return Ok(());
                }
                if let Some(e) = p.error.as_ref().filter(|_| p.failed_seq >= target) {
                    return Err(FsError::Io(format!("upload failed, file kept staged: {e}")));
                }
            }
            if item.0.item.lock().await.life != Life::Live {
                // Deleted or renamed over meanwhile: nothing of it is to be uploaded.
                return Ok(());
            }
            if rx.changed().await.is_err() {
                return Err(FsError::Io("upload engine stopped".into()));
            }
        }
    }

    /// One handle on `item` closed. Writes that arrived after its last flush (a shared
    /// mapping, the kernel's write-back cache) are committed when the last handle goes.
    pub async fn release(self: &Arc<Self>, item: &ItemRef) {
        let last = {
            let mut it = item.0.item.lock().await;
            it.handles = it.handles.saturating_sub(1);
            item.0.open.store(it.handles, Ordering::SeqCst);
            it.handles == 0
        };
        let close_failed = item.0.item.lock().await.close_failed;
        let failed = if !last {
            None
        } else if close_failed {
            // The user was told the close failed: the release does not save it after all.
            Some(FsError::Io("the last close failed".into()))
        } else {
            self.commit(item).await.err()
        };
        let mut it = item.0.item.lock().await;
        if let Some(e) = failed {
            // Not tried again in the background (I10): nothing of it is uploaded unless a later
            // close saves it. Kept across an unmount or a crash all the same.
            tracing::error!(key = %it.key, error = %e, "the file's last changes could not be saved; they stay staged and are not uploaded; the bucket keeps its last whole version");
            self.keep_unsaved(&item.0, &mut it).await;
        }
        if it.handles == 0 {
            it.work.close_fd();
        }
        self.retire_if_settled(&item.0, &mut it);
    }

    /// Drops an item nobody needs any more: no handles, nothing pending (or unlinked).
    pub(super) fn retire_if_settled(self: &Arc<Self>, shared: &Arc<Shared>, it: &mut Item) {
        if !it.settled() || it.life == Life::Retired || self.stays_for_mapping(shared, it) {
            return;
        }
        it.life = Life::Retired;
        self.drop_kept_landed(it);
        // Parts a version in parts may have left, not swept by the landing of a smaller one.
        self.sweep_listed_parts(it);
        if let Some(u) = it.unsaved_record.take() {
            // Normally gone already (saved, or removed with the name).
            if let Err(e) = self.journal.forget(u) {
                tracing::warn!(error = %e, "could not remove a journal record");
            }
        }
        self.drop_unsaved_file(it);
        {
            let mut map = self.by_key.lock();
            // Only this item's entry: a newer item may already have taken the name.
            if map.get(&it.key).is_some_and(|s| Arc::ptr_eq(s, shared)) {
                map.remove(&it.key);
            }
        }
        it.work.close_fd();
        // Nothing needs the file any more: its version is in the bucket (or it was unlinked),
        // and no descriptor reads it (an upload attempt ends before its item can settle).
        self.recycle(it.work_id);
        self.recharge(shared, it);
    }
}
