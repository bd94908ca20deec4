//! A file's working copy: reads (fetching the bytes it lacks from its base object, with the
//! file's lock released), writes and truncates, and the staged-space charge for them.
//!
//! The working copy is the one staging file of an item that changes. Bytes another record
//! names (the pending version's, or changes kept as not saved) are never changed in place: a
//! change that would touch them goes to a copy first (copy-on-write), so what the journal
//! vouches for stays exactly what it was. A change that fails holds the item (I10): what the
//! user wrote may be missing from it, so it is never committed until rewritten whole.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

use super::item::{Item, ItemRef, Life, Shared};
use super::ranges::RangeSet;
use super::staging;
use super::writeback::WriteBack;
use crate::error::{FsError, FsResult};
use crate::store::{read_range, ObjectStore, Posix};

/// Bytes fetched from the bucket per step when completing a file (the file's lock is released
/// between steps).
const FETCH_STEP: u64 = 8 << 20;

impl<S: ObjectStore> WriteBack<S> {
    /// Reads from the working copy, fetching from the bucket the bytes it does not have yet
    /// (with the file's lock released while they come).
    pub async fn read(&self, item: &ItemRef, offset: u64, len: u32) -> FsResult<Vec<u8>> {
        let want = offset..offset + u64::from(len);
        loop {
            let mut it = item.0.item.lock().await;
            let missing = it.work.missing(want.clone());
            if missing.is_empty() {
                return Ok(it.work.read_at(offset, len as usize)?);
            }
            self.fill_holes(&item.0, it, missing).await?;
        }
    }

    /// Fetches `missing` ranges (at most [`FETCH_STEP`] bytes of them) without holding the
    /// file's lock, then stores them where the file still has holes.
    pub(super) async fn fill_holes(
        &self,
        shared: &Shared,
        it: tokio::sync::MutexGuard<'_, Item>,
        missing: Vec<std::ops::Range<u64>>,
    ) -> FsResult<()> {
        let Some((base_key, generation)) = it.base.clone() else {
            return Err(FsError::Io(
                "staging file has holes but no base object".into(),
            ));
        };
        let work_id = it.work_id;
        drop(it);
        let mut fetched = Vec::new();
        let mut budget = FETCH_STEP;
        for gap in missing {
            let end = gap.end.min(gap.start + budget);
            let data = read_range(self.store.as_ref(), &base_key, generation, gap.start..end)
                .await
                .map_err(FsError::from_pinned_read)?;
            budget -= end - gap.start;
            fetched.push((gap.start, data));
            if budget == 0 {
                break;
            }
        }
        let mut it = shared.item.lock().await;
        if it.work_id == work_id {
            for (offset, data) in fetched {
                it.work.fill(offset, &data)?;
            }
        }
        Ok(())
    }

    /// Charges the item for `work_size` bytes of working copy (plus a version kept apart).
    pub(super) async fn reserve(&self, shared: &Shared, it: &Item, work_size: u64) -> FsResult<()> {
        self.reserve_bytes(shared, it.staged_bytes(work_size)).await
    }

    /// Charges the item for `size` staged bytes in all, waiting for space if need be.
    pub(super) async fn reserve_bytes(&self, shared: &Shared, size: u64) -> FsResult<()> {
        // What no upload can free: files still open, and the working copies of files kept as
        // not saved (those wait for their user, not for the bucket; a version of theirs being
        // uploaded still frees its own file). An item another task holds locked just now
        // counts as freeable; the next look (a second later) sees it.
        let open_bytes = || {
            let items: Vec<Arc<Shared>> = self.by_key.lock().values().cloned().collect();
            let held = |s: &Shared| {
                let charged = s.charged.load(Ordering::SeqCst);
                if s.open.load(Ordering::SeqCst) > 0 {
                    return charged;
                }
                match s.item.try_lock() {
                    Ok(it) if it.kept_unsaved() => it.work.size().min(charged),
                    _ => 0,
                }
            };
            items.iter().map(|s| held(s)).sum::<u64>()
        };
        self.space
            .reserve(
                &shared.charged,
                shared.open.load(Ordering::SeqCst) > 0,
                size,
                open_bytes,
                || self.upload_closed_now(),
            )
            .await
    }

    /// Gives back the space the item no longer uses.
    pub(super) fn recharge(&self, shared: &Shared, it: &Item) {
        let size = if it.life == Life::Retired {
            0
        } else {
            it.staged_bytes(it.work.size())
        };
        self.space.recharge(&shared.charged, size);
    }

    /// The working copy is about to change while the unsaved record vouches for its file:
    /// the change goes to a copy of its first `len` bytes (what is present stays present), and
    /// the record's file is left as it is until a save or a newer record replaces it. Space
    /// for the copy is charged by the caller's reservation of the working copy only: the
    /// record's file is the bytes the user already had.
    pub(super) async fn detach_from_unsaved(&self, it: &mut Item, len: u64) -> FsResult<()> {
        if !it.work_is_unsaved_record() {
            return Ok(());
        }
        let len = len.min(it.work.size());
        self.copy_on_write(it, len).await
    }

    /// The working copy is about to change in a way that would alter bytes another record
    /// names (the pending version's, or the changes kept as not saved): edit a copy of its
    /// first `len` bytes instead, where what was present stays present and nothing else is.
    pub(super) async fn copy_on_write(&self, it: &mut Item, len: u64) -> FsResult<()> {
        if it.through.is_some() {
            // The kernel writes this very file: it is edited in place, and what records name
            // in it is live ([`super::passthrough`]).
            return Ok(());
        }
        let (id, copy, named) = if len == 0 {
            self.new_staging(0, RangeSet::new()).await?
        } else {
            let id = self.new_id();
            let to = self.dir.staging(id);
            let present = it.work.present().clone();
            let copy = match staging::copy_prefix(it.work.at(), &to, len).await {
                Ok(copy) => copy,
                Err(e) => {
                    let e = FsError::from(e);
                    // Not for want of room for the copy: a read of the file, or the check
                    // after it, failed.
                    if !matches!(e, FsError::NoSpace) {
                        self.note_disk_error(it.work_id, &e);
                    }
                    let _ = to.remove();
                    return Err(e);
                }
            };
            if let Err(e) = self.check_copy(it).await {
                let _ = to.remove();
                return Err(e);
            }
            (id, copy.with_present(present), false)
        };
        tracing::debug!(key = %it.key, from = it.work_id, to = id, len, "copy-on-write of the working copy");
        it.work.close_fd();
        it.work = copy;
        it.work_id = id;
        it.work_named = named;
        // A file of ours alone: the kernel never wrote this one itself, and what it was seen
        // to have written in the old one is no measure of this one.
        it.work_live = false;
        it.kernel_seen = None;
        Ok(())
    }

    /// Before the working copy's bytes change: see [`Item::forgotten_unsynced`]. A record a
    /// landed version kept for the kernel's writes ([`Item::kept_landed`]) goes first, for
    /// good, unless the kernel writes the file now: replayed, it would take the file as it is,
    /// with changes made through the engine that no close acknowledged.
    pub(super) async fn settle_forgotten(&self, it: &mut Item) -> FsResult<()> {
        if it.through.is_none() {
            if let Some(v) = it.kept_landed.as_ref() {
                self.journal.remove(v.id).await?;
                it.kept_landed = None;
            }
        }
        if it.forgotten_unsynced {
            // The journal alone: a commit would take item locks, this one's among them.
            self.journal.flush().await?;
            it.forgotten_unsynced = false;
        }
        Ok(())
    }

    pub async fn write(&self, item: &ItemRef, offset: u64, data: &[u8]) -> FsResult<()> {
        let mut it = item.0.item.lock().await;
        let result = self.write_locked(&item.0, &mut it, offset, data).await;
        self.hold_on_failure(&mut it, &result);
        result
    }

    /// A change to the working copy failed (a write, a truncate, the fsync of a commit): what
    /// the user wrote may be missing from it, so it must never be committed (I10). It stays
    /// staged, reported as not saved, until it is rewritten whole.
    ///
    /// The record a landed version kept for the kernel's writes goes at once (in the journal's
    /// kernel buffers, which a crash of the daemon keeps): replayed, it would upload the file
    /// as it is, the failed change included.
    pub(super) fn hold_on_failure(&self, it: &mut Item, result: &FsResult<()>) {
        if let Err(e) = result {
            if it.held.is_none() && it.life == Life::Live {
                tracing::error!(key = %it.key, error = %e, "a change to the file failed: its changes since the last good save are kept staged and will not be uploaded; the bucket keeps its last whole version");
            }
            it.held.get_or_insert_with(|| e.clone());
            self.drop_kept_landed(it);
            // Part of it may have reached the working copy: the file is changed, not saved.
            it.edits += 1;
        }
    }

    /// Whether the item's working copy is held (see [`Self::hold_on_failure`]).
    pub async fn is_held(&self, item: &ItemRef) -> bool {
        item.0.item.lock().await.held.is_some()
    }

    pub(super) async fn write_locked(
        &self,
        shared: &Shared,
        it: &mut Item,
        offset: u64,
        data: &[u8],
    ) -> FsResult<()> {
        self.settle_forgotten(it).await?;
        self.detach_from_unsaved(it, u64::MAX).await?;
        let end = it.work.size().max(offset + data.len() as u64);
        // Would this change bytes of the pending version, kept in the same file? Then the
        // version stays as it is and the write goes to a copy (charged for up front). A live
        // version (the kernel wrote its file) is its whole file as it is, so any change would.
        let copy = match it.pending.as_ref() {
            Some(p) if p.id == it.work_id && p.live => true,
            Some(p) if p.id == it.work_id && offset < p.size => {
                let overlap = ((p.size - offset) as usize).min(data.len());
                !it.work.holds(offset, &data[..overlap])?
            }
            _ => false,
        };
        let kept_apart = if copy {
            it.pending.as_ref().map_or(0, |p| p.size)
        } else {
            0
        };
        self.reserve_bytes(shared, it.staged_bytes(end) + kept_apart)
            .await?;
        if copy {
            let size = it.work.size();
            self.copy_on_write(it, size).await?;
        }
        it.work.write_at(offset, data)?;
        it.edits += 1;
        it.mtime = crate::clock::now();
        shared.publish(it);
        Ok(())
    }

    pub async fn truncate(&self, item: &ItemRef, len: u64) -> FsResult<()> {
        let mut it = item.0.item.lock().await;
        self.truncate_locked(&item.0, &mut it, len).await
    }

    pub(super) async fn truncate_locked(
        &self,
        shared: &Shared,
        it: &mut Item,
        len: u64,
    ) -> FsResult<()> {
        let result = self.truncate_held(shared, it, len).await;
        self.hold_on_failure(it, &result);
        if result.is_ok() && len == 0 && it.held.take().is_some() {
            // Rewritten from nothing: no byte of the failed change is left.
            tracing::info!(key = %it.key, "a file whose changes were held is being rewritten whole");
            self.rewritten_whole(it);
        }
        result
    }

    pub(super) async fn truncate_held(
        &self,
        shared: &Shared,
        it: &mut Item,
        len: u64,
    ) -> FsResult<()> {
        self.settle_forgotten(it).await?;
        self.refresh(shared, it);
        self.detach_from_unsaved(it, len).await?;
        match it.pending.as_ref().map(|p| (p.id, p.size, p.live)) {
            // A cut into the pending version kept in the same file, or any change to a live
            // one (its whole file is the version), goes to a copy. While the kernel writes the
            // file itself it is changed in place: its version is live.
            Some((id, size, live))
                if id == it.work_id && (len < size || live) && it.through.is_none() =>
            {
                self.reserve_bytes(shared, len + size).await?;
                let kept = len.min(it.work.size());
                self.copy_on_write(it, kept).await?;
                if len > kept {
                    it.work.truncate(len)?;
                }
            }
            _ => {
                self.reserve(shared, it, len).await?;
                it.work.truncate(len)?;
            }
        }
        it.edits += 1;
        it.mtime = crate::clock::now();
        shared.publish(it);
        self.recharge(shared, it);
        Ok(())
    }

    pub async fn set_mtime(&self, item: &ItemRef, mtime: SystemTime) {
        let mut it = item.0.item.lock().await;
        self.refresh(&item.0, &mut it);
        it.mtime = mtime;
        Self::set_through_mtime(&mut it, mtime);
        it.edits += 1;
        item.0.publish(&it);
    }

    /// Sets owner, group or mode, stored with the upload. With `changed: false` the bucket has
    /// them already (patched in place) and only a later upload must keep them.
    pub async fn set_posix(&self, item: &ItemRef, posix: Posix, changed: bool) {
        let mut it = item.0.item.lock().await;
        posix.to_metadata(&mut it.metadata);
        if changed {
            it.edits += 1;
        }
        item.0.publish(&it);
    }

    /// Whether nothing was changed through `item` yet: it still equals the object it was
    /// opened from, so a time or mode change can patch that object instead.
    pub async fn is_unchanged(&self, item: &ItemRef) -> bool {
        let mut it = item.0.item.lock().await;
        self.refresh(&item.0, &mut it);
        it.edits == 0 && it.pending.is_none() && it.base.as_ref().is_some_and(|(k, _)| *k == it.key)
    }

    /// Whether `key` is not being written, or only opened for writing and unchanged so far.
    pub async fn key_unchanged(&self, key: &str) -> bool {
        match self.live(key) {
            Some(s) => self.is_unchanged(&ItemRef(s)).await,
            None => true,
        }
    }

    /// Records metadata the bucket's object was given in place, for `key`'s item if one is
    /// open, so that a later upload keeps it.
    pub async fn note_patched(&self, key: &str, posix: Posix) {
        if let Some(s) = self.live(key) {
            self.set_posix(&ItemRef(s), posix, false).await;
        }
    }

    pub fn size(&self, item: &ItemRef) -> u64 {
        item.0.current_attr().size
    }
}
