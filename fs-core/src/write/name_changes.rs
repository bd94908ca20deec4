//! The namespace side of the write path: what a delete or a rename does to the files being
//! written, and the pause that keeps uploads out of the way while it happens.
//!
//! A namespace change in the bucket (delete, copy then delete) and the uploads of the same
//! names must never interleave, and a mount must never act on an object it did not see:
//!
//! - **I3, removed names stay removed.** [`WriteBack::pause`] (or [`WriteBack::pause_under`]
//!   for a directory) stops every upload of the name, by any item, including one opened while
//!   the change runs, and waits for an attempt in flight to end. Only then does the change
//!   touch the bucket, and at the end it moves whichever item then holds the name: so no
//!   upload lands under a name that was deleted or renamed away. The journal follows a rename
//!   in the same line, so a replay uploads under the new name only, and an unlink drops the
//!   record only after the bucket's object is gone.
//! - **I8, nobody else's bytes are destroyed.** A mount deletes, replaces or renames over only
//!   a generation it saw: for a file being written, an object its item owns
//!   ([`WriteBack::owns`]: the one it was opened from, or one of its own uploads, including
//!   one whose answer was lost); otherwise the generation the mount's own lookup or listing
//!   found. A fresh look at the bucket past the caches only ever recognises our own uploads:
//!   it never turns another writer's object into something we may delete or replace.
//!   Everything else is left where it is, and our version goes beside it as a conflict copy
//!   (the upload's precondition, the generation seen, makes that happen). See
//!   [`crate::filesystem`]'s `changes` for the bucket side.

use std::sync::Arc;

use super::item::{Item, ItemRef, Life, Shared};
use super::journal::{Change, Record, UploadState};
use super::writeback::WriteBack;
use crate::error::FsResult;
use crate::store::{ObjectMeta, ObjectStore};

/// A namespace change's hold on a name or a directory, from [`WriteBack::pause`] or
/// [`WriteBack::pause_under`] to [`WriteBack::resume`].
pub struct Paused {
    key: String,
    prefix: bool,
    items: Vec<ItemRef>,
}

impl<S: ObjectStore> WriteBack<S> {
    /// Waits until no upload attempt of `shared` is in flight.
    pub(super) async fn wait_idle(shared: &Arc<Shared>) {
        let mut rx = shared.progress.subscribe();
        loop {
            if !shared.item.lock().await.sched.uploading {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// Whether a namespace change holds `key` (or a directory above it).
    pub(super) fn key_paused(&self, key: &str) -> bool {
        self.paused_keys.lock().iter().any(|(k, prefix)| {
            if *prefix {
                key.starts_with(k.as_str())
            } else {
                key == k
            }
        })
    }

    /// Stops new upload attempts of `key` (by any item, present or made meanwhile) and waits
    /// for any in flight to end, so a namespace change sees the bucket as the uploads left it
    /// and no upload lands after it under the old name. Must be followed by [`Self::resume`].
    pub async fn pause(&self, key: &str) -> Paused {
        self.hold(key, false).await
    }

    /// [`Self::pause`] for every name under `prefix` (a directory being renamed).
    pub async fn pause_under(&self, prefix: &str) -> Paused {
        self.hold(prefix, true).await
    }

    async fn hold(&self, key: &str, prefix: bool) -> Paused {
        self.paused_keys.lock().push((key.to_string(), prefix));
        let shared: Vec<Arc<Shared>> = if prefix {
            self.by_key
                .lock()
                .range(key.to_string()..)
                .take_while(|(k, _)| k.starts_with(key))
                .map(|(_, s)| s.clone())
                .collect()
        } else {
            self.live(key).into_iter().collect()
        };
        let mut items = Vec::new();
        for s in shared {
            s.item.lock().await.sched.paused += 1;
            Self::wait_idle(&s).await;
            items.push(ItemRef(s));
        }
        Paused {
            key: key.to_string(),
            prefix,
            items,
        }
    }

    /// Ends a [`Self::pause`] or [`Self::pause_under`], and wakes every item it held back.
    pub async fn resume(self: &Arc<Self>, paused: Paused) {
        {
            let mut keys = self.paused_keys.lock();
            if let Some(i) = keys
                .iter()
                .position(|(k, p)| *k == paused.key && *p == paused.prefix)
            {
                keys.remove(i);
            }
        }
        for item in &paused.items {
            let mut it = item.0.item.lock().await;
            it.sched.paused = it.sched.paused.saturating_sub(1);
            self.retire_if_settled(&item.0, &mut it);
        }
        let woken: Vec<Arc<Shared>> = if paused.prefix {
            self.by_key
                .lock()
                .range(paused.key.clone()..)
                .take_while(|(k, _)| k.starts_with(paused.key.as_str()))
                .map(|(_, s)| s.clone())
                .collect()
        } else {
            self.live(&paused.key).into_iter().collect()
        };
        for s in woken.iter().chain(paused.items.iter().map(|i| &i.0)) {
            s.wake.notify_one();
        }
    }

    /// Counts a conflict copy a namespace change made (in the status counters and metrics).
    pub fn note_conflict(&self) {
        self.counters.record_conflict();
    }

    /// Whether `m` is a version of the file being written at `key` (the object it was opened
    /// from, or one of its own uploads, including one whose answer was lost): the only objects
    /// at that name this mount has seen, since its user sees the item there, not the bucket.
    /// False when no file is being written there.
    pub async fn owns(&self, key: &str, m: &ObjectMeta) -> bool {
        match self.live(key) {
            Some(s) => {
                let it = s.item.lock().await;
                let base = it.base.as_ref() == Some(&(m.key.clone(), m.generation));
                // Every empty object has the same CRC32C and size: one is ours only if it
                // names this mount as its writer.
                it.owns(m) && (base || m.size > 0 || self.wrote(m))
            }
            None => false,
        }
    }

    /// Whether `m` carries this mount's writer tag.
    fn wrote(&self, m: &ObjectMeta) -> bool {
        m.metadata
            .get(crate::store::WRITER_KEY)
            .is_some_and(|w| w.split('.').next() == Some(self.tag()))
    }

    /// Whether the file being written at `key` has an acknowledged version still to upload (or
    /// a record kept for the kernel's writes after its upload, which a replay would upload
    /// again) and nothing it lacks (its working copy is whole): a rename moves its record
    /// before the old object goes, or a crash between the two would bring the old name back.
    pub async fn has_whole_pending(&self, key: &str) -> bool {
        match self.live(key) {
            Some(s) => {
                let it = s.item.lock().await;
                (it.pending.is_some() || it.kept_landed.is_some()) && it.work.is_complete()
            }
            None => false,
        }
    }

    /// Whether the file being written at `key` holds all its bytes locally (none are left to
    /// read from the object it was opened from).
    pub async fn is_whole(&self, key: &str) -> bool {
        match self.live(key) {
            Some(s) => s.item.lock().await.work.is_complete(),
            None => false,
        }
    }

    /// The generation this mount saw at `key`, where a file is being written: `fresh` (the
    /// bucket's object now) if the item owns it, else the object the item was opened from if
    /// it was opened at this name. None: it saw no object there.
    pub async fn seen_generation(&self, key: &str, fresh: Option<&ObjectMeta>) -> Option<i64> {
        let shared = self.live(key)?;
        let it = shared.item.lock().await;
        match fresh {
            Some(m) if it.owns(m) => Some(m.generation),
            _ => it.base.as_ref().filter(|(k, _)| k == key).map(|(_, g)| *g),
        }
    }

    /// The file was deleted (its object, if any, is already gone from the bucket): forget its
    /// pending version and staged data. The caller paused it first. Returns whether there was
    /// a live item.
    ///
    /// The journal goes first: if the removal of its records cannot be made durable (a full
    /// cache disk), nothing changes in memory either and the error is the caller's, so the
    /// file stays here as it stays for the next mount, which would otherwise replay it under
    /// a name removed here.
    pub async fn unlink(self: &Arc<Self>, key: &str) -> FsResult<bool> {
        let Some(shared) = self.live(key) else {
            return Ok(false);
        };
        let mut it = shared.item.lock().await;
        let ids = it.record_ids();
        if !ids.is_empty() {
            let before = self.journal.records(&ids);
            let gone = ids.iter().map(|&id| Change::Del(id)).collect();
            if let Err(e) = self.journal.apply(Change::Batch(gone)).await {
                self.undo_journal(&it.key, before, &ids).await;
                return Err(e.into());
            }
        }
        {
            let mut map = self.by_key.lock();
            if map.get(key).is_some_and(|s| Arc::ptr_eq(s, &shared)) {
                map.remove(key);
            }
        }
        it.life = Life::Unlinked;
        shared.publish(&it);
        self.drop_unlinked(&shared, &mut it);
        Ok(true)
    }

    /// The object `deleted` at `key`, the base of the file being written there, was deleted
    /// here by a change that then failed (the journal could not record it): the file no longer
    /// rests on it, so its next upload expects no object there instead of meeting its own
    /// delete as a conflict. A working copy still lacking bytes of it keeps it (they are gone,
    /// and it stays unsaved).
    pub async fn base_gone(&self, key: &str, deleted: &ObjectMeta) {
        let Some(shared) = self.live(key) else {
            return;
        };
        let mut it = shared.item.lock().await;
        // The object deleted may be its base, or one of its own uploads whose answer was lost
        // (the base then still names the older generation, gone too).
        let rested_on = it.owns(deleted)
            || it
                .base
                .as_ref()
                .is_some_and(|(k, g)| k == key && *g == deleted.generation);
        if it.work.is_complete() && rested_on {
            it.base = None;
        }
    }

    /// After a journal change to the records `ids` (of the file at `key`) failed: puts them
    /// back as they were, `before`. If even that fails the journal may lack a record memory
    /// still has, which only a crash before the next change to the file would lose: say so.
    async fn undo_journal(&self, key: &str, before: Vec<Record>, ids: &[u64]) {
        if let Err(e) = self.journal.undo(before, ids).await {
            tracing::error!(key = %key, error = %e, "the journal could not be put back after a failed change; if the mount stops before the file is written again, its staged changes may not be replayed");
        }
    }

    /// The file was renamed (the bucket's object, if any, already copied): its pending upload
    /// follows the new name. `new_base` is the generation at `to` that this mount saw (None: it
    /// saw no object there): the upload replaces only that one, so an object someone else put
    /// there unseen meets it as a conflict (I8). An item at `to` is replaced, in the same
    /// journal line.
    ///
    /// `copied_from` is the object the server-side copy was made from: the copy becomes the
    /// file's base only if that object is a version of this file (the one it was opened from,
    /// or one of our uploads). If someone else had replaced it, the copy is theirs, and the
    /// pending upload must find it as a conflict, not replace it.
    pub async fn rename(
        self: &Arc<Self>,
        from: &str,
        to: &str,
        new_base: Option<i64>,
        copied_from: Option<&ObjectMeta>,
    ) -> FsResult<()> {
        let Some(shared) = self.live(from) else {
            return Ok(());
        };
        let replaced = self.live(to).filter(|r| !Arc::ptr_eq(r, &shared));
        // Both files are held for the whole change: no close commits a version of the file at
        // `to` (its record would outlive the line below that removes its records), and no write
        // changes the working copy made durable for the unsaved record. Always taken in the same
        // order (by address), so two renames between the same names cannot deadlock; nothing
        // else holds two items at once.
        let (mut it, mut replaced_it) = match &replaced {
            Some(old) if Arc::as_ptr(old) < Arc::as_ptr(&shared) => {
                let o = old.item.lock().await;
                (shared.item.lock().await, Some(o))
            }
            Some(old) => {
                let it = shared.item.lock().await;
                (it, Some(old.item.lock().await))
            }
            None => (shared.item.lock().await, None),
        };
        // Changes kept as not saved follow the name. When the working copy moved off the
        // record's file since (it was written to), the record will name it as it is now, a
        // state the user had: made durable first, before anything here changes, so a failure
        // leaves the rename undone in memory as well.
        let moved_unsaved = it.unsaved_record.is_some() && !it.work_is_unsaved_record();
        if moved_unsaved {
            self.work_durable(&mut it).await?;
        }
        // The records of a file being written at `to` go with this change, in the same line.
        let replaced_ids = replaced_it
            .as_ref()
            .map(|o| o.record_ids())
            .unwrap_or_default();
        let mut changes: Vec<Change> = replaced_ids.iter().map(|&id| Change::Del(id)).collect();
        // The item takes its new name, base and upload state first, to write its records as
        // they will be; if the journal cannot take them (a full cache disk) it gets its old
        // ones back and nothing else has changed: the rename fails here as it would at the
        // next mount, which replays the journal.
        let before = (it.key.clone(), it.base.clone(), it.pending.clone());
        it.key = to.to_string();
        // The base is also where the working copy's missing bytes come from: one that still
        // lacks some keeps its base unless the copy holds the same bytes (it was made from an
        // object of its own), or they would be fetched from whatever is at `to`.
        let adopt = match copied_from {
            Some(src) => it.owns(src),
            None => it.work.is_complete(),
        };
        // Without a generation at `to`, the upload must find no object there. A whole working
        // copy needs its base for nothing else, so it drops it (a base left at the old name
        // would match again after a rename back); one that lacks bytes keeps it to fetch them.
        match new_base.filter(|_| adopt) {
            Some(g) => it.base = Some((to.to_string(), g)),
            None if adopt && it.work.is_complete() => it.base = None,
            None => {}
        }
        let uploaded_before = it.pending.is_none() && !it.dirty();
        if let Some(p) = it.pending.as_mut() {
            // A resumable session belongs to the old name; parts hold bytes, not names.
            if let UploadState::Uploading { session_url, .. } = &mut p.progress {
                *session_url = None;
            }
        }
        if let Some(p) = it.pending.clone() {
            // Versions it superseded, kept for its commit under the old name, must not come
            // back there after a power cut: its bytes (and its name, when a new one awaits
            // the commit) are made durable now, and their records go in this line.
            if !it.superseded_uncommitted.is_empty() || !self.commits.covers(p.commit_gen) {
                let at = self.dir.staging(p.id);
                let dir = self
                    .commits
                    .dir_pending()
                    .then(|| self.dir.staging_dir().clone());
                let id = p.id;
                // A file the disk failed to write back ([`super::disk_errors`]) is never made
                // durable: a sync of it now would succeed (Linux tells the failure once).
                let failed_before = self.disk_errors.failed(id).is_some();
                let synced = match failed_before {
                    true => None,
                    false => {
                        crate::platform::blocking(move || {
                            // Write access: Windows flushes only through a handle that may write.
                            let how = crate::platform::Open::new().read(true).write(true);
                            match at.open(how)?.sync_data() {
                                Ok(()) => dir.map_or(Ok(()), |d| d.sync()).map(|()| Some(Ok(()))),
                                Err(e) => Ok(Some(Err(e))),
                            }
                        })
                        .await?
                    }
                };
                match synced {
                    Some(Ok(())) => {
                        self.commits.synced(p.id);
                        // A file the kernel writes says so in its record (the line below
                        // keeps it).
                        self.journal.mark_durable(&[p.id])?;
                        // Durable now: an append to it falls back to it after a power cut.
                        if let Some(p) = it.pending.as_mut() {
                            p.commit_gen = 0;
                        }
                    }
                    // Not durable, and never will be: the rename goes on (the version is
                    // uploaded only as it was written) and its record says the disk failed
                    // it. The versions it superseded go all the same: under the old name they
                    // would come back after a power cut (I3).
                    failed => {
                        if let Some(Err(e)) = failed {
                            self.disk_errors.note(id, &e);
                        }
                        self.journal.mark_disk_failed(&[id])?;
                    }
                }
                changes.extend(it.superseded_uncommitted.iter().map(|&id| Change::Del(id)));
            }
            changes.push(Change::Put(it.record(&p)));
        }
        if let Some(u) = it.unsaved_record {
            changes.push(Change::Put(it.unsaved(u)));
        }
        // A landed version's record kept for the kernel's writes follows the name too: a
        // replay uploads the file there as it finds it, over the copy when that is ours.
        if let Some(k) = it.kept_landed.clone() {
            changes.push(Change::Put(it.record(&k)));
        }
        if !changes.is_empty() {
            let ids: Vec<u64> = replaced_ids
                .iter()
                .copied()
                .chain(it.record_ids())
                .collect();
            let records = self.journal.records(&ids);
            if let Err(e) = self.journal.apply(Change::Batch(changes)).await {
                (it.key, it.base, it.pending) = before;
                self.undo_journal(from, records, &ids).await;
                return Err(e.into());
            }
        }
        {
            let mut map = self.by_key.lock();
            if map.get(from).is_some_and(|s| Arc::ptr_eq(s, &shared)) {
                map.remove(from);
            }
            map.insert(to.to_string(), shared.clone());
        }
        if moved_unsaved && !it.work_is_unsaved_record() {
            self.drop_unsaved_file(&mut it);
            it.unsaved_file = Some(it.work_id);
        }
        shared.publish(&it);
        let reupload = uploaded_before && (copied_from.is_none() || !adopt);
        if reupload {
            it.edits += 1;
        }
        // A file the kernel still writes, in the bucket under the old name only (its record
        // moved here before the old object goes): sealed now, as an fsync would, so that it is
        // not out of the bucket until its last close.
        let in_bucket_before = it.kept_landed.is_some();
        let idle = it.handles == 0 || in_bucket_before;
        drop(it);
        if let (Some(old), Some(o)) = (&replaced, replaced_it.as_mut()) {
            self.drop_unlinked(old, o);
        }
        drop(replaced_it);
        if reupload && idle {
            // Its content was in the bucket under the old name only (no copy of it was made
            // here; a generation seen at `to` is only what the upload may replace): upload it
            // again here. The rename itself is made (journal and memory): a commit that fails
            // keeps the file as not saved, as a failed close does, and the rename stands.
            let item = ItemRef(shared.clone());
            let committed = self.commit(&item).await;
            let mut it = shared.item.lock().await;
            match committed {
                Err(e) => {
                    tracing::error!(key = %it.key, error = %e, "a renamed file could not be saved under its new name; it stays staged, not saved");
                    it.close_failed = true;
                    self.keep_unsaved(&shared, &mut it).await;
                }
                // It was in the bucket: it goes back there under its new name at once.
                Ok(()) if in_bucket_before => {
                    it.sched.expedite();
                    self.ensure_task(&shared, &mut it);
                    shared.wake.notify_one();
                }
                Ok(()) => {}
            }
        }
        Ok(())
    }

    /// The file being written in `shared` is gone (deleted, or replaced by a rename), and the
    /// journal line that removed its records is durable: it is dropped, with its staged files.
    fn drop_unlinked(self: &Arc<Self>, shared: &Arc<Shared>, it: &mut Item) {
        it.life = Life::Unlinked;
        // Wakes an fsync waiting for this file's upload: there will be none.
        shared.progress.send_modify(|p| p.attempts += 1);
        // Its records went in the line that removed the name.
        it.unsaved_record = None;
        it.kept_landed = None;
        self.drop_unsaved_file(it);
        if let Some(p) = it.pending.take() {
            if p.id != it.work_id {
                self.recycle(p.id);
            }
            self.sweep_file_parts(it, p.id, p.size);
        }
        self.sweep_listed_parts(it);
        self.retire_if_settled(shared, it);
    }
}
