//! Writes the cache disk failed after they were acknowledged: what the engine does when the
//! disk says it could not write a staged file back.
//!
//! A `write()` into the page cache succeeds; the disk's own failure (`EIO` from the device,
//! `ENOSPC` from a thin or full device under it) comes later, when the kernel writes the pages
//! back, and reaches nobody who does not ask. Linux tells it once to each open file description
//! that was open when it happened, and once to the first `fsync` of a description opened after
//! it (its *errseq*). So a second `fdatasync`, on a new descriptor, succeeds: a commit that
//! simply tried again would count bytes the disk lost as durable. The pages themselves stay in
//! the page cache, clean, with what was written, until memory is needed; after that a read
//! returns what the disk holds. A page can leave the page cache only once its write-back has
//! failed, so a check made after reading a file tells whether what was read is what was
//! written ([`crate::platform::writeback_error`], which waits for nothing).
//!
//! The engine acts on the first report, wherever it comes:
//!
//! - **A sync that fails** (a commit's `fdatasync`, a rename's, a seal's, a copy's or a CRC32C
//!   pass's check) marks that staging file as failed here, and in the journal for a live
//!   record (so a replay knows it too); the commit or rename goes on with the rest and never
//!   calls the file durable, nor after a later sync of it, which succeeds.
//! - **A file the kernel writes itself** (passthrough) is asked at every close, fsync and
//!   last release, through the engine's own descriptor, opened before the kernel's writes: a
//!   failure holds it as a failed write through the daemon does (I10): the close fails with
//!   `EIO`, and nothing of it is uploaded.
//! - **A CRC32C computed by reading a file** (a seal whose CRC32C the writes did not give, a
//!   reseal, a replay taking a file the kernel wrote as it is) is followed by a check: if a
//!   write-back failed meanwhile, the CRC32C may be of what the disk holds, and the seal
//!   fails (the file is held) or the file is not taken.
//! - **A version is uploaded only as it was sealed.** The upload checks what it reads against
//!   the version's CRC32C: a version whose file failed still reaches the bucket while the page
//!   cache keeps its bytes. When they changed, a live version's change is normally a store
//!   through a mapping, taken as a newer version; in a failed file it is what the disk lost,
//!   and any version there is kept as not saved instead, held (I10): the bucket keeps its last
//!   whole version, and a write over the whole file saves it.
//! - **A copy of a failed file's bytes** (an edit of a version waiting for the bucket) is kept
//!   only if the file still reads as that version after the copy; otherwise the edit fails
//!   with `EIO` until the file is written over whole.
//! - **`--sync-on-close`**: a close whose commit failed to sync the file fails with `EIO`, as
//!   it did before (the upload goes on as above).
//! - **The journal**: a failed sync of the log poisons it, and it is written anew, whole, into
//!   a new file before anything more counts as durable; syncs of one log file run one at a
//!   time, and none succeeds after one failed ([`super::journal`]).
//!
//! A failed staging file is deleted rather than reused once nothing needs it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};

use parking_lot::Mutex;

use super::item::{Item, Shared};
use super::journal::Change;
use super::writeback::WriteBack;
use crate::error::{FsError, FsResult};
use crate::store::ObjectStore;

/// Staging files whose write-back the disk failed, and the tests' injected failures.
#[derive(Default)]
pub(super) struct DiskErrors {
    failed: Mutex<HashMap<u64, String>>,
    inject_syncs: AtomicU32,
    inject_looks: AtomicU32,
    /// Staging files whose next sync by a commit fails (tests).
    inject_files: Mutex<std::collections::HashSet<u64>>,
}

/// Takes one injected failure from `count`, if any is left.
fn take(count: &AtomicU32) -> bool {
    count
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

impl DiskErrors {
    /// The disk failed to write back staging file `id`: a sync or a look was told `e`.
    pub fn note(&self, id: u64, e: &dyn std::fmt::Display) {
        tracing::error!(id, error = %e, "the cache disk could not write a staged file back; it is uploaded only while it reads as it was written");
        self.failed.lock().insert(id, e.to_string());
    }

    /// Staging file `id`'s write-back failed before the mount stopped (its journal record says
    /// so): noted again, without a new report in the log.
    pub fn note_again(&self, id: u64, why: &str) {
        self.failed.lock().insert(id, why.to_string());
    }

    /// Why staging file `id`'s write-back failed, if it did.
    pub fn failed(&self, id: u64) -> Option<String> {
        self.failed.lock().get(&id).cloned()
    }

    /// Staging file `id` is let go of: whether its write-back had failed (it is then deleted,
    /// not reused).
    pub fn forget(&self, id: u64) -> bool {
        self.failed.lock().remove(&id).is_some()
    }

    /// A commit's sync result for staging file `id`, with an injected failure in its place if
    /// a test asked for one.
    pub fn synced(&self, id: u64, result: std::io::Result<()>) -> std::io::Result<()> {
        if self.inject_files.lock().remove(&id) || take(&self.inject_syncs) {
            return Err(std::io::Error::from_raw_os_error(5));
        }
        result
    }

    /// A commit's syncs are done: failures injected for files it did not sync lapse.
    pub fn end_of_commit(&self) {
        self.inject_files.lock().clear();
    }

    /// Whether a test injected a failure for the next look at a passthrough file.
    fn injected_look(&self) -> bool {
        take(&self.inject_looks)
    }
}

impl<S: ObjectStore> WriteBack<S> {
    /// A sync or read of staging file `id` failed with `e` outside a commit: noted as the
    /// disk's failure (unless it was already), as a commit's sync would not be told again.
    pub(super) fn note_disk_error(&self, id: u64, e: &dyn std::fmt::Display) {
        if self.disk_errors.failed(id).is_none() {
            self.disk_errors.note(id, e);
        }
    }

    /// Makes the next `n` syncs of staging files by a commit fail as a disk would (tests).
    #[doc(hidden)]
    pub fn fail_data_syncs(&self, n: u32) {
        self.disk_errors.inject_syncs.store(n, Ordering::SeqCst);
    }

    /// Makes the next commit's sync of the staging file at `path` fail (tests).
    #[doc(hidden)]
    pub fn fail_data_sync_of(&self, path: &std::path::Path) {
        let id = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".data"))
            .and_then(|n| u64::from_str_radix(n, 16).ok());
        if let Some(id) = id {
            self.disk_errors.inject_files.lock().insert(id);
        }
    }

    /// Makes the next `n` looks for write-back failures of files the kernel writes find one
    /// (tests).
    #[doc(hidden)]
    pub fn fail_writeback_looks(&self, n: u32) {
        self.disk_errors.inject_looks.store(n, Ordering::SeqCst);
    }

    /// Asks whether the disk failed to write back the file the kernel wrote for `it` (at a
    /// close, fsync or last release; see the module doc): a failure, or one a commit saw,
    /// holds it (I10).
    pub(super) fn look_for_disk_errors(&self, it: &mut Item) {
        if !it.work_live {
            return;
        }
        // The engine's own descriptor of the file, open since before the kernel's writes (its
        // open file description is told of any failure since, whoever else was told). The look
        // waits for nothing: made here, under the item's lock.
        let looked = match (self.disk_errors.injected_look(), it.through.as_ref()) {
            (true, _) => Err(std::io::Error::from_raw_os_error(5)),
            (false, Some(t)) => crate::platform::writeback_error(&t.file),
            (false, None) => match it.work.clone_file() {
                Ok(f) => crate::platform::writeback_error(&f),
                Err(_) => return,
            },
        };
        let reason = match looked {
            Err(e) => {
                // For the commit, which may not be told again, and the journal.
                self.disk_errors.note(it.work_id, &e);
                Some(e.to_string())
            }
            Ok(()) => self.disk_errors.failed(it.work_id),
        };
        if let Some(reason) = reason {
            self.hold_on_failure(it, &Err(disk_failed(&reason)));
        }
    }

    /// Keeps `it`'s pending version, whose file's write-back failed and whose bytes no longer
    /// read as sealed, from the bucket, which keeps its last whole version. In the working
    /// copy's file, it is kept as not saved with the working copy, held; in another (the
    /// working copy moved off it since), it is dropped, and the working copy goes on.
    pub(super) async fn keep_failed_write(&self, shared: &Shared, it: &mut Item, reason: &str) {
        let Some(v) = it.pending.clone() else {
            return;
        };
        if v.id == it.work_id {
            self.hold_on_failure(it, &Err(disk_failed(reason)));
            // The working copy's descriptor may not have been told yet (the commit's was):
            // told now, so that keeping the file as not saved does not fail on the same report.
            if let Ok(file) = it.work.clone_file() {
                let _ = crate::platform::blocking(move || file.sync_data()).await;
            }
            // A live version goes with the working copy, in the same journal line.
            self.keep_unsaved_as(shared, it, true).await;
            if it.unsaved_record.is_none() {
                // Not journaled (the disk fails that too): the version's record stays, so a
                // restart still finds the file; its upload keeps failing its check meanwhile.
                return;
            }
        }
        let Some(v) = it.pending.take_if(|p| p.seq == v.seq) else {
            return;
        };
        if let Err(e) = self.journal.apply(Change::Del(v.id)).await {
            tracing::error!(key = %it.key, error = %e, "cannot drop the record of a version the disk failed to keep");
            it.pending = Some(v);
            return;
        }
        tracing::error!(key = %it.key, "the cache disk lost bytes of the file before its upload; they are not uploaded");
        shared.progress.send_modify(|p| {
            p.error = Some("the cache disk could not keep the file's changes".into());
            p.failed_seq = p.failed_seq.max(v.seq);
        });
        if v.id != it.work_id && it.unsaved_file != Some(v.id) {
            self.recycle(v.id);
        }
    }

    /// The working copy is written over whole (a truncate to nothing cleared its hold): what
    /// the disk failed to write of its file is gone with it.
    pub(super) fn rewritten_whole(&self, it: &Item) {
        let pending_here = it.pending.as_ref().is_some_and(|p| p.id == it.work_id);
        if !pending_here {
            self.disk_errors.forget(it.work_id);
        }
    }

    /// After a copy of `it`'s working copy was made (an edit of a version waiting for the
    /// bucket), when the working copy's file is one whose write-back failed: its bytes may have
    /// been what the disk holds, not what was written, and the copy would carry no mark of it.
    /// The copy is kept only when the file still holds the pending version's bytes exactly (its
    /// CRC32C), read after the copy: a page the disk lost never reads right again once gone
    /// from the page cache, so the copy read it intact too. Otherwise the edit fails until the
    /// file is written over whole.
    pub(super) async fn check_copy(&self, it: &Item) -> FsResult<()> {
        let Some(reason) = self.disk_errors.failed(it.work_id) else {
            return Ok(());
        };
        let version = it
            .pending
            .as_ref()
            .filter(|p| p.id == it.work_id && !p.crc_pending);
        let Some((size, want)) = version.map(|p| (p.size, p.crc32c)) else {
            return Err(disk_failed(&reason));
        };
        let at = it.work.at().clone();
        let got = crate::platform::blocking(move || {
            let file = at.open(crate::platform::Open::new().read(true))?;
            super::staging::crc32c_of_file(&file, size)
        })
        .await?;
        match got == want {
            true => Ok(()),
            false => Err(disk_failed(&reason)),
        }
    }

    /// Refuses a CRC32C computed by reading `it`'s working copy when its file's write-back
    /// failed: it may be of what the disk holds. The seal fails, and the file is held until
    /// written over whole.
    pub(super) fn may_read_crc_of(&self, it: &Item) -> FsResult<()> {
        match self.disk_errors.failed(it.work_id) {
            Some(reason) if it.work.known_crc32c().is_none() => Err(disk_failed(&reason)),
            _ => Ok(()),
        }
    }

    /// Whether `it`'s pending version is in a staging file whose write-back failed: a close
    /// with `--sync-on-close` then fails, the disk having failed the sync it waited for (the
    /// version is uploaded all the same while it reads as it was written).
    pub(super) fn close_sync_failed(&self, it: &Item) -> Option<FsError> {
        let v = it.pending.as_ref()?;
        let reason = self.disk_errors.failed(v.id)?;
        Some(disk_failed(&reason))
    }
}

/// The error a write the disk failed gives.
fn disk_failed(reason: &str) -> FsError {
    FsError::Io(format!("the cache disk could not write the file: {reason}"))
}
