//! The upload journal: a durable record of every acknowledged file until it is in the bucket.
//!
//! Each staged file has one record, written before `close()` or `fsync()` returns and updated as
//! its upload moves on (staged, uploading with the resumable session or the parts already
//! uploaded, done, conflict).
//!
//! The journal is one append-only log, `journal.log`. A change is one line (a record put, an id
//! deleted, or a batch of both that must happen together, such as a rename replacing another
//! file's record), each line carrying its own CRC32C. The last put of an id wins. When most
//! lines are dead the log is compacted: the live records are written to a new file, fsync'd and
//! renamed over the log, so a crash leaves the old log or the new one.
//!
//! **Group commit.** A change is appended under a short lock (a page-cache write), then made
//! durable by an `fdatasync` that runs on the blocking pool with no lock held. Changes that
//! arrive while one sync runs are covered together by the next: a hundred concurrent `close()`s
//! cost a couple of syncs, not a hundred, and no close waits behind another file's lock.
//!
//! **Short writes.** If an append fails part-way (a full disk), the log is cut back to its last
//! whole line before the error is returned, so a torn line can never glue itself to the next
//! record and take it down with it.
//!
//! On start-up the mount replays every live record, so a file acknowledged before a crash or a
//! SIGKILL is uploaded on the next mount. A torn last line (a crash mid-append) was never
//! acknowledged and is dropped. A damaged line elsewhere is reported, and the log is copied
//! aside before anything is rewritten, never deleted. Records in the older one-file-per-record
//! form (`*.json`) are read too, and folded into the log.

use crate::platform::{self, At, Dir, Open};
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// One uploaded part of a parallel composite upload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartRecord {
    pub index: u32,
    /// Temporary object holding the part.
    pub key: String,
    pub generation: i64,
    /// CRC32C of the part's bytes; a part is reused only if the local bytes of the version
    /// being uploaded still have this CRC at this range.
    pub crc32c: u32,
    /// The bytes of the file the part holds (records written before this field: unknown, so
    /// such a part is never reused).
    #[serde(default)]
    pub offset: u64,
    #[serde(default)]
    pub len: u64,
}

/// Where a staged file's upload stands. Its `Debug` hides the session URL (a credential for
/// the upload), so a record can be logged or shown in a failed assertion without leaking it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum UploadState {
    /// Durable locally, not yet uploaded.
    Staged,
    /// An upload has started; what it has done so far can be reused.
    Uploading {
        #[serde(default)]
        session_url: Option<String>,
        #[serde(default)]
        parts: Vec<PartRecord>,
    },
    /// In the bucket as this generation; the record is about to be removed.
    Done { generation: i64 },
    /// The bucket's object changed since it was opened: the local version was saved beside it.
    Conflict { saved_as: String },
    /// Changes that were not saved (I10): a write to the file failed (`held`), or its last
    /// close did. They are never uploaded; the record keeps them staged across an unmount or a
    /// crash, in staging file `file` (whose first bytes may also be a pending version's, in
    /// that version's own record), with the byte ranges of it that are really present.
    NotSaved {
        file: u64,
        held: bool,
        #[serde(default)]
        present: Vec<(u64, u64)>,
        #[serde(default)]
        reason: String,
    },
}

impl std::fmt::Debug for UploadState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UploadState::Staged => f.write_str("Staged"),
            UploadState::Uploading { session_url, parts } => f
                .debug_struct("Uploading")
                .field("session_url", &session_url.as_ref().map(|_| "<redacted>"))
                .field("parts", parts)
                .finish(),
            UploadState::Done { generation } => f
                .debug_struct("Done")
                .field("generation", generation)
                .finish(),
            UploadState::Conflict { saved_as } => f
                .debug_struct("Conflict")
                .field("saved_as", saved_as)
                .finish(),
            UploadState::NotSaved {
                file,
                held,
                present,
                reason,
            } => f
                .debug_struct("NotSaved")
                .field("file", file)
                .field("held", held)
                .field("present", present)
                .field("reason", reason)
                .finish(),
        }
    }
}

/// The journal record of one staged file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub id: u64,
    /// Object key the file is to be uploaded to.
    pub key: String,
    /// Generation the file was opened from; `None` for a new file (uploaded with
    /// `ifGenerationMatch=0`).
    pub base_generation: Option<i64>,
    pub size: u64,
    pub crc32c: u32,
    /// Modification time, seconds since the epoch, stored as `goog-reserved-file-mtime`.
    pub mtime: i64,
    /// The nanoseconds of the modification time (uploaded in the `mtime` metadata beside the
    /// seconds): kept here so a crash before the upload does not round the time to the second.
    /// Records of earlier versions have none (0), and a whole second writes none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub mtime_nanos: u32,
    /// Custom metadata to upload with the file besides the mtime.
    #[serde(default, skip_serializing_if = "std::collections::HashMap::is_empty")]
    pub metadata: HashMap<String, String>,
    /// (CRC32C, size) of versions of this file whose upload may have landed although its answer
    /// was lost. A precondition failure against an object that is one of these is our own
    /// write, not someone else's: no conflict copy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub maybe_landed: Vec<(u32, u64)>,
    /// The version's place among the file's versions: of two records of one name, the higher
    /// is newer. The older one is kept until the newer one's commit ([`super::commit`]), and
    /// a replay that finds the newer one's bytes damaged (a power cut before that commit)
    /// falls back to it. Records of earlier versions have none (0).
    #[serde(default, skip_serializing_if = "is_zero64")]
    pub seq: u64,
    /// (size, CRC32C) of the version this one appended to in the same staging file: the
    /// fallback when this version's bytes fail their check after a power cut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<(u64, u32)>,
    /// The kernel wrote the staging file itself (FUSE passthrough): the file as it is holds
    /// the version, whose size and CRC32C here may be stale or not yet computed (0). A replay
    /// takes its bytes as they are ([`super::passthrough`]).
    #[serde(default, skip_serializing_if = "is_false")]
    pub live: bool,
    /// Of a live record: the kernel still had the file open, so its bytes may have changed
    /// after the record (and its CRC32C may not be computed yet): a replay takes the file as
    /// it is, in any boot.
    #[serde(default, skip_serializing_if = "is_false")]
    pub unsealed: bool,
    /// Of a live record: a commit synced the file since the kernel started writing it, so
    /// its bytes on the disk are a state the user wrote, edited in place since at most. Set by
    /// [`Journal::mark_durable`], and kept by every later record of the same file while it is
    /// live. A replay after a power cut takes such a file as it is; an unsealed one that never
    /// reached a commit is not trusted (it may be cut short or hold blocks never written).
    #[serde(default, skip_serializing_if = "is_false")]
    pub durable: bool,
    /// Of a live record: the cache disk failed to write the file back since it was sealed
    /// ([`super::disk_errors`]), so what a replay finds in it may not be what was written. Its
    /// bytes are uploaded only while they still check against its CRC32C; set by
    /// [`Journal::mark_disk_failed`] and kept by later records of the same file.
    #[serde(default, skip_serializing_if = "is_false")]
    pub disk_failed: bool,
    /// Of a live record: the boot it was written in. A replay in another boot (a power cut
    /// came between) checks a sealed live file against its CRC32C like any other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot: Option<String>,
    #[serde(flatten)]
    pub state: UploadState,
}

/// Marks every live record `change` puts as durable when the record it replaces was.
fn keep_durable(change: &mut Change, live: &HashMap<u64, Record>) {
    match change {
        Change::Put(rec) if rec.live => {
            if let Some(r) = live.get(&rec.id).filter(|r| r.live) {
                rec.durable |= r.durable;
                rec.disk_failed |= r.disk_failed;
            }
        }
        Change::Batch(changes) => {
            for c in changes {
                keep_durable(c, live);
            }
        }
        _ => {}
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_zero64(n: &u64) -> bool {
    *n == 0
}

/// One change to the journal. (Short-lived, one per line: a boxed record would buy nothing.)
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    Put(Record),
    Del(u64),
    /// Changes applied together or not at all (one line).
    Batch(Vec<Change>),
}

impl Change {
    fn apply(self, live: &mut HashMap<u64, Record>) {
        match self {
            Change::Put(rec) => {
                live.insert(rec.id, rec);
            }
            Change::Del(id) => {
                live.remove(&id);
            }
            Change::Batch(all) => all.into_iter().for_each(|c| c.apply(live)),
        }
    }
}

const LOG: &str = "journal.log";
/// A compacted log being written, renamed over [`LOG`] once whole.
const NEW_LOG: &str = "journal.log.tmp";
/// Compact when the log holds this many more lines than live records.
const COMPACT_SLACK: usize = 4096;

/// The journal of one cache directory.
#[derive(Debug)]
pub struct Journal {
    dir: Arc<Dir>,
    log: Mutex<Log>,
    /// Serializes syncs; the sequence number each one covered.
    sync: tokio::sync::Mutex<u64>,
    /// The log file a sync failed on, if any: syncs of a file run one at a time, and none of
    /// one that failed succeeds after it (Linux tells a failed write-back once, so a sync
    /// racing the failing one could succeed without the lost lines).
    failed_sync: FailedSync,
    /// Appends still to fail as on a full disk (tests only: [`Self::fail_appends`]).
    #[cfg(test)]
    failing: std::sync::atomic::AtomicU32,
    /// Syncs still to fail (tests only: [`Self::fail_syncs`]).
    #[cfg(test)]
    failing_syncs: std::sync::atomic::AtomicU32,
    /// Compactions still to fail after writing the new log, both at the rename and at the
    /// reopen of the old log (tests only: [`Self::fail_compactions`]).
    #[cfg(test)]
    failing_compactions: std::sync::atomic::AtomicU32,
    /// Damaged logs or records set aside at open.
    corrupt: Vec<PathBuf>,
}

#[derive(Debug)]
struct Log {
    /// The log appends go to; `None` only while poisoned by a compaction that could neither
    /// rename the new log into place nor reopen the old one.
    file: Option<Arc<File>>,
    live: HashMap<u64, Record>,
    lines: usize,
    /// Bytes of whole lines in the file; an append that fails is cut back to this.
    len: u64,
    /// Sequence number of the last change appended.
    appended: u64,
    /// A failed append could not be cut back, a compaction renamed a new log into place
    /// that could not be opened, or a sync failed: rewrite the log before the next append or
    /// sync.
    poisoned: bool,
    /// A compaction's rename is not yet known durable: the next sync syncs the directory.
    dir_unsynced: bool,
    /// No compaction before the log has this many lines (after one failed).
    compact_at: usize,
    /// Bytes of the log known durable (the last sync's, or a compaction's new log).
    synced_len: u64,
}

impl Journal {
    /// Opens the journal in the private directory at `path` (made if missing).
    pub fn open(path: &Path) -> io::Result<Self> {
        Self::open_in(Dir::private(path)?)
    }

    /// Opens the journal in the held directory `dir`, reading what is there and rewriting it
    /// compactly.
    pub fn open_in(dir: Arc<Dir>) -> io::Result<Self> {
        let mut corrupt = Vec::new();
        let mut live = read_log(&dir.at(LOG), &mut corrupt)?;
        let legacy = read_legacy(&dir, &mut live, &mut corrupt)?;
        let (file, len) = rewrite(&dir, &live)?;
        for at in legacy {
            at.remove()?;
        }
        Ok(Journal {
            dir,
            log: Mutex::new(Log {
                file: Some(Arc::new(file)),
                lines: live.len(),
                live,
                len,
                appended: 0,
                poisoned: false,
                dir_unsynced: false,
                compact_at: 0,
                synced_len: len,
            }),
            sync: tokio::sync::Mutex::new(0),
            failed_sync: FailedSync::default(),
            corrupt,
            #[cfg(test)]
            failing: std::sync::atomic::AtomicU32::new(0),
            #[cfg(test)]
            failing_syncs: std::sync::atomic::AtomicU32::new(0),
            #[cfg(test)]
            failing_compactions: std::sync::atomic::AtomicU32::new(0),
        })
    }

    /// Writes `rec` durably, replacing any earlier version.
    pub async fn put(&self, rec: &Record) -> io::Result<()> {
        self.apply(Change::Put(rec.clone())).await
    }

    /// Forgets a record once its file is safely in the bucket (or was deleted).
    pub async fn remove(&self, id: u64) -> io::Result<()> {
        if !self.log.lock().live.contains_key(&id) {
            return Ok(());
        }
        self.apply(Change::Del(id)).await
    }

    /// Forgets a record whose version is in the bucket, without waiting for that to be
    /// durable: it becomes so with the next sync, whoever asks for it.
    ///
    /// Losing it to a crash costs nothing but work: the record is replayed, and the upload
    /// finds its own object already there (recognised by CRC32C and size, invariant I4). But
    /// the record must not outlive its staging file, or the replay would report the file's
    /// data lost: whoever removes or reuses the file calls [`sync_now`](Self::sync_now) first.
    /// This keeps one sync per upload off the log, where every `close()` waits for its own.
    pub fn forget(&self, id: u64) -> io::Result<()> {
        if !self.log.lock().live.contains_key(&id) {
            return Ok(());
        }
        self.append(Change::Del(id)).map(|_| ())
    }

    /// Whether a live record names staging file `id` (it is still needed): its own, or one
    /// that keeps changes not saved in it.
    pub fn names(&self, id: u64) -> bool {
        let log = self.log.lock();
        log.live.contains_key(&id)
            || log
                .live
                .values()
                .any(|r| matches!(r.state, UploadState::NotSaved { file, .. } if file == id))
    }

    /// Makes every change appended so far durable, on the calling thread (a background
    /// thread's: it blocks).
    pub fn sync_now(&self) -> io::Result<()> {
        let point = self.sync_point()?;
        if let Err(e) = point.sync() {
            self.sync_failed(&point.file);
            return Err(e);
        }
        self.synced(&point);
        Ok(())
    }

    /// Makes every change appended so far durable.
    pub async fn flush(&self) -> io::Result<()> {
        let seq = self.log.lock().appended;
        self.sync_to(seq).await
    }

    /// Applies `change` (all of it or, after a crash, none of it) and returns once it is
    /// durable.
    pub async fn apply(&self, change: Change) -> io::Result<()> {
        let seq = self.append(change)?;
        self.sync_to(seq).await
    }

    /// Appends `change` without waiting for it to be durable: a later sync makes it so. A
    /// power cut may lose it, or keep it without the bytes it names (see [`super::commit`]).
    pub fn apply_unsynced(&self, change: Change) -> io::Result<()> {
        self.append(change).map(|_| ())
    }

    /// The live records of staging files `ids` are durable (a commit just synced those
    /// files): each unsealed one not yet marked gets a line saying so (not synced: the
    /// commit syncs the journal next).
    pub fn mark_durable(&self, ids: &[u64]) -> io::Result<()> {
        self.mark_live(ids, |r| &mut r.durable)
    }

    /// The cache disk failed to write back staging files `ids` (a commit's sync of them
    /// failed): each live record of them not yet marked gets a line saying so (not synced:
    /// the commit syncs the journal next).
    pub fn mark_disk_failed(&self, ids: &[u64]) -> io::Result<()> {
        self.mark_live(ids, |r| &mut r.disk_failed)
    }

    /// Sets the flag `flag` picks in the live records of `ids` that lack it, a line each.
    fn mark_live(&self, ids: &[u64], flag: fn(&mut Record) -> &mut bool) -> io::Result<()> {
        for &id in ids {
            // Looked up and appended under one lock: a change of the record in between (its
            // removal, a rename) must not be undone by a stale copy.
            self.append_with(|live| {
                let mut r = live.get(&id).filter(|r| r.live)?.clone();
                let f = flag(&mut r);
                if *f {
                    return None;
                }
                *f = true;
                Some(Change::Put(r))
            })?;
        }
        Ok(())
    }

    /// Appends one line (not yet durable); returns its sequence number.
    ///
    /// The change reaches the in-memory records only once its line is whole in the log, so a
    /// failed append leaves both as they were, and the caller's error is the whole truth.
    fn append(&self, change: Change) -> io::Result<u64> {
        self.append_with(|_| Some(change))
    }

    /// [`Self::append`] of the change `make` builds from the records, under the same lock;
    /// none: nothing is appended.
    fn append_with(
        &self,
        make: impl FnOnce(&HashMap<u64, Record>) -> Option<Change>,
    ) -> io::Result<u64> {
        #[cfg(test)]
        if take_one(&self.failing) {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "disk full (injected)",
            ));
        }
        let mut log = self.log.lock();
        if log.poisoned {
            self.compact(&mut log)?;
        }
        let Some(mut change) = make(&log.live) else {
            return Ok(log.appended);
        };
        // A live file a commit made durable stays so for its later records (see
        // [`Record::durable`]), in a batch too (a rename).
        keep_durable(&mut change, &log.live);
        let json = serde_json::to_string(&change).map_err(io::Error::other)?;
        let text = format!("{:08x} {json}\n", crc32c::crc32c(json.as_bytes()));
        {
            // Scoped: a compaction below must find no handle of ours on the old log.
            let file = log.file.as_ref().ok_or_else(poisoned)?;
            if let Err(e) = (&**file).write_all(text.as_bytes()) {
                // Cut the torn line off, so the next append starts on a line of its own.
                if file.set_len(log.len).is_err() {
                    log.poisoned = true;
                }
                return Err(e);
            }
        }
        log.len += text.len() as u64;
        change.apply(&mut log.live);
        log.lines += 1;
        log.appended += 1;
        if log.lines > log.live.len() * 2 + COMPACT_SLACK && log.lines >= log.compact_at {
            // Rare (every few thousand lines) and small: done in place. The line above is
            // already in the log either way, so a compaction that fails (a full disk) fails
            // nothing: it is tried again a few thousand lines later, and the log stays long
            // meanwhile.
            if let Err(e) = self.compact(&mut log) {
                tracing::warn!(error = %e, "could not compact the journal; will try again");
                log.compact_at = log.lines + COMPACT_SLACK;
            }
        }
        Ok(log.appended)
    }

    /// Returns once every change up to `seq` is durable. One sync covers every change
    /// appended before it starts (group commit).
    async fn sync_to(&self, seq: u64) -> io::Result<()> {
        let mut synced = self.sync.lock().await;
        if *synced >= seq {
            return Ok(());
        }
        let point = self.sync_point()?;
        let file = point.file.clone();
        #[cfg(test)]
        let injected = take_one(&self.failing_syncs);
        #[cfg(not(test))]
        let injected = false;
        let point = match injected {
            true => Err(io::Error::other("sync failed (injected)")),
            false => platform::blocking(move || point.sync().map(|()| point)).await,
        };
        let point = match point {
            Ok(point) => point,
            Err(e) => {
                self.sync_failed(&file);
                return Err(e);
            }
        };
        self.synced(&point);
        *synced = point.upto;
        Ok(())
    }

    /// A sync of the log `file` failed: the disk may have lost lines written to it, and Linux
    /// tells a failed write-back only once, so a second sync of the same file would succeed
    /// without them. The log is poisoned instead: the next sync or append first rewrites it
    /// whole from the records ([`Self::compact`]), into a new file synced on its own.
    fn sync_failed(&self, file: &Arc<File>) {
        let mut log = self.log.lock();
        if log.file.as_ref().is_some_and(|f| Arc::ptr_eq(f, file)) {
            log.poisoned = true;
        }
    }

    /// What a sync started now must cover, the log rewritten first when poisoned. An error
    /// while poisoned without a log: lines were appended to a log no handle reaches any
    /// more, so nothing can be said durable.
    fn sync_point(&self) -> io::Result<SyncPoint> {
        let mut log = self.log.lock();
        if log.poisoned {
            self.compact(&mut log)?;
        }
        Ok(SyncPoint {
            file: log.file.clone().ok_or_else(poisoned)?,
            failed: self.failed_sync.clone(),
            dir: log.dir_unsynced.then(|| self.dir.clone()),
            upto: log.appended,
            len: log.len,
        })
    }

    /// Notes that `point` was synced: a compaction's rename it covered is durable, unless yet
    /// another compaction renamed a newer log in meanwhile.
    fn synced(&self, point: &SyncPoint) {
        let mut log = self.log.lock();
        if log
            .file
            .as_ref()
            .is_some_and(|f| Arc::ptr_eq(f, &point.file))
        {
            if point.dir.is_some() {
                log.dir_unsynced = false;
            }
            log.synced_len = log.synced_len.max(point.len);
        }
    }

    /// The log's path and how many of its bytes are known durable: a power cut may lose any
    /// of the lines after them (for the simulation's model of one).
    pub fn durable_len(&self) -> (PathBuf, u64) {
        (self.dir.at(LOG).path(), self.log.lock().synced_len)
    }

    /// Rewrites the log with only the live records, then appends go to the new log.
    ///
    /// Until the new log is renamed into place a failure changes nothing: the old log is whole
    /// and still appended to. Once it is, appends must go to it whatever fails next: if it
    /// cannot be opened the journal is poisoned (every append tries the rewrite again first, and
    /// fails while it cannot), and if the rename cannot be made durable the next sync tries
    /// again ([`Log::dir_unsynced`]).
    fn compact(&self, log: &mut Log) -> io::Result<()> {
        let (file, len) = write_new_log(&self.dir, &log.live)?;
        // Our handle on the old log is closed before the rename, and appends then go to the
        // new log's handle (a handle follows its file across a rename): Windows without POSIX
        // rename semantics (before Windows 10 1809, FAT, Wine) refuses to rename over a file
        // that has open handles. A sync running meanwhile may still hold one; then this
        // compaction fails, and is tried again later.
        log.file = None;
        #[cfg(test)]
        let injected = take_one(&self.failing_compactions);
        #[cfg(not(test))]
        let injected = false;
        let renamed = match injected {
            true => Err(io::Error::other("rename failed (injected)")),
            false => self.dir.at(NEW_LOG).rename_to(&self.dir.at(LOG)),
        };
        if let Err(e) = renamed {
            // Nothing changed on disk: appends go on to the old log, reopened. The new log's
            // handle closes here, so the next attempt can remove it at once (Windows keeps a
            // removed file that is still open under its name until it closes).
            drop(file);
            match open_for_append(&self.dir).and_then(|f| match injected {
                true => Err(io::Error::other("reopen failed (injected)")),
                false => Ok(f),
            }) {
                Ok(old) => log.file = Some(Arc::new(old)),
                Err(_) => log.poisoned = true,
            }
            return Err(e);
        }
        log.file = Some(Arc::new(file));
        log.dir_unsynced = true;
        log.len = len;
        log.synced_len = len;
        log.lines = log.live.len();
        log.poisoned = false;
        self.dir.sync()?;
        log.dir_unsynced = false;
        Ok(())
    }

    /// The live records among `ids`, to put back with [`Self::undo`] if a change to them
    /// fails.
    pub fn records(&self, ids: &[u64]) -> Vec<Record> {
        let log = self.log.lock();
        ids.iter()
            .filter_map(|id| log.live.get(id).cloned())
            .collect()
    }

    /// After a change to `ids` failed: makes the records what they were, `before` (from
    /// [`Self::records`]). An append that failed changed nothing, but one whose sync failed
    /// is in the records already, and the next sync would make durable a change that did not
    /// happen. On a disk that takes no line at all there is nothing to undo.
    pub async fn undo(&self, before: Vec<Record>, ids: &[u64]) -> io::Result<()> {
        if self.records(ids) == before {
            // The failed change never reached the records (its append failed).
            return Ok(());
        }
        let was: Vec<u64> = before.iter().map(|r| r.id).collect();
        let mut changes: Vec<Change> = ids
            .iter()
            .filter(|id| !was.contains(id))
            .map(|&id| Change::Del(id))
            .collect();
        changes.extend(before.into_iter().map(Change::Put));
        if changes.is_empty() {
            return Ok(());
        }
        self.apply(Change::Batch(changes)).await
    }

    /// Makes the next `n` appends fail as on a full disk, leaving the log as it was.
    #[cfg(test)]
    pub fn fail_appends(&self, n: u32) {
        self.failing.store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Makes the next `n` compactions fail after writing the new log: its rename, and the
    /// reopen of the old log after it.
    #[cfg(test)]
    pub fn fail_compactions(&self, n: u32) {
        self.failing_compactions
            .store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Makes the next `n` syncs fail (after their lines were appended).
    #[cfg(test)]
    pub fn fail_syncs(&self, n: u32) {
        self.failing_syncs
            .store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Every live record, in id order, and the damaged logs or records set aside at open.
    pub fn load_all(&self) -> io::Result<(Vec<Record>, Vec<PathBuf>)> {
        let mut records: Vec<Record> = self.log.lock().live.values().cloned().collect();
        records.sort_by_key(|r| r.id);
        Ok((records, self.corrupt.clone()))
    }

    /// One past the highest record id in use.
    pub fn next_id(&self) -> io::Result<u64> {
        Ok(self.log.lock().live.keys().max().map_or(1, |id| id + 1))
    }
}

/// The error of a journal that has no log to append to or sync (see [`Log::file`]).
fn poisoned() -> io::Error {
    io::Error::other("the journal has no log to write to; it is rewritten at the next change")
}

/// Takes one of the injected failures left in `n` (tests only).
#[cfg(test)]
fn take_one(n: &std::sync::atomic::AtomicU32) -> bool {
    use std::sync::atomic::Ordering::SeqCst;
    n.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)).is_ok()
}

/// The log as one sync finds it: the file, the directory when a compaction's rename is not yet
/// known durable, and the last change appended.
struct SyncPoint {
    file: Arc<File>,
    failed: FailedSync,
    dir: Option<Arc<Dir>>,
    upto: u64,
    /// The log's length when the sync started.
    len: u64,
}

/// See [`Journal::failed_sync`]. A weak reference: the file's address is never reused while
/// it is held.
type FailedSync = Arc<Mutex<Option<std::sync::Weak<File>>>>;

impl SyncPoint {
    fn sync(&self) -> io::Result<()> {
        let mut failed = self.failed.lock();
        let this = Arc::downgrade(&self.file);
        if failed.as_ref().is_some_and(|f| f.ptr_eq(&this)) {
            return Err(io::Error::other(
                "an earlier sync of the journal failed; it is written anew first",
            ));
        }
        if let Err(e) = self.file.sync_data() {
            *failed = Some(this);
            return Err(e);
        }
        drop(failed);
        // A compaction renamed a new log into place, but could not make the rename durable:
        // until it is, a crash would bring back the old log without the lines since.
        match &self.dir {
            Some(dir) => dir.sync(),
            None => Ok(()),
        }
    }
}

/// Parses one line: `None` when it is damaged.
fn parse(line: &str) -> Option<Change> {
    let (crc, json) = line.split_once(' ')?;
    if u32::from_str_radix(crc, 16).ok()? != crc32c::crc32c(json.as_bytes()) {
        return None;
    }
    serde_json::from_str(json).ok()
}

/// Whether the journal in `dir` holds anything to upload: a live record, a damaged line (it
/// may have been one) or a record of the older one-file-per-record form. Only reads: a mount
/// asks this of a journal it will not open, to refuse rather than ignore it
/// ([`super::cache_dir`]), and must change nothing there.
pub fn holds_records(dir: &Path) -> io::Result<bool> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    for entry in entries {
        if entry?.file_name().to_string_lossy().ends_with(".json") {
            return Ok(true);
        }
    }
    let read = std::fs::symlink_metadata(dir.join(LOG)).and_then(|m| {
        if m.file_type().is_symlink() {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{} is a symbolic link", dir.join(LOG).display()),
            ));
        }
        std::fs::read(dir.join(LOG))
    });
    log_holds_records(read)
}

/// [`holds_records`] of the held journal directory `dir`.
pub fn holds_records_in(dir: &Arc<Dir>) -> io::Result<bool> {
    if dir
        .names()?
        .iter()
        .any(|n| n.to_string_lossy().ends_with(".json"))
    {
        return Ok(true);
    }
    log_holds_records(dir.at(LOG).read())
}

/// Whether a log's bytes (or the failure to read them) hold anything to upload.
fn log_holds_records(read: io::Result<Vec<u8>>) -> io::Result<bool> {
    let (live, damaged) = match read {
        Ok(bytes) => replay(&bytes),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    Ok(!live.is_empty() || damaged > 0)
}

/// The live records of a log's bytes, and how many of its lines are damaged.
fn replay(bytes: &[u8]) -> (HashMap<u64, Record>, usize) {
    let mut live = HashMap::new();
    let text = String::from_utf8_lossy(bytes);
    let complete = text.ends_with('\n');
    let lines: Vec<&str> = text.lines().collect();
    let mut damaged = 0;
    for (i, line) in lines.iter().enumerate() {
        match parse(line) {
            Some(change) => change.apply(&mut live),
            // A torn last line was never acknowledged.
            None if i + 1 == lines.len() && !complete => {}
            None => damaged += 1,
        }
    }
    (live, damaged)
}

/// Replays the log `at` into live records.
fn read_log(at: &At, corrupt: &mut Vec<PathBuf>) -> io::Result<HashMap<u64, Record>> {
    let bytes = match at.read() {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(HashMap::new()),
        Err(e) => return Err(e),
    };
    let (live, damaged) = replay(&bytes);
    if damaged > 0 {
        let aside = at.sibling(format!(
            "{LOG}.corrupt-{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0)
        ));
        aside.replace_with(&bytes)?;
        tracing::error!(lines = damaged, copy = %aside, "damaged journal lines skipped; the log was copied aside and the staged data is kept");
        corrupt.push(aside.path());
    }
    Ok(live)
}

/// Folds records of the one-file-per-record form into `live`; returns the files read.
fn read_legacy(
    dir: &Arc<Dir>,
    live: &mut HashMap<u64, Record>,
    corrupt: &mut Vec<PathBuf>,
) -> io::Result<Vec<At>> {
    let mut read = Vec::new();
    for name in dir.names()? {
        let Some(name) = name.to_str() else { continue };
        let at = dir.at(name);
        if name.ends_with(".json.tmp") {
            at.remove()?;
            continue;
        }
        let Some(stem) = name.strip_suffix(".json") else {
            continue;
        };
        match at.read().map(|b| serde_json::from_slice::<Record>(&b)) {
            Ok(Ok(rec)) => {
                live.entry(rec.id).or_insert(rec);
                read.push(at);
            }
            _ => {
                let aside = dir.at(format!("{stem}.json.corrupt"));
                at.rename_to(&aside)?;
                tracing::error!(record = %aside, "unreadable journal record set aside; its staged data is kept");
                corrupt.push(aside.path());
            }
        }
    }
    Ok(read)
}

/// Writes `live` as a new log beside the old one (not yet in place), durable; returns it open
/// for appends, and its length.
fn write_new_log(dir: &Arc<Dir>, live: &HashMap<u64, Record>) -> io::Result<(File, u64)> {
    let at = dir.at(NEW_LOG);
    match at.remove() {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut f = at.open(Open::new().append(true).create_new(true))?;
    let mut ids: Vec<&u64> = live.keys().collect();
    ids.sort();
    let mut text = String::new();
    for id in ids {
        let json =
            serde_json::to_string(&Change::Put(live[id].clone())).map_err(io::Error::other)?;
        text.push_str(&format!("{:08x} {json}\n", crc32c::crc32c(json.as_bytes())));
    }
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    Ok((f, text.len() as u64))
}

fn open_for_append(dir: &Arc<Dir>) -> io::Result<File> {
    dir.at(LOG).open(Open::new().append(true))
}

/// Writes `live` as a new log, atomically and durably replacing the old one; returns it open
/// for appends, and its length.
fn rewrite(dir: &Arc<Dir>, live: &HashMap<u64, Record>) -> io::Result<(File, u64)> {
    let (file, len) = write_new_log(dir, live)?;
    dir.at(NEW_LOG).rename_to(&dir.at(LOG))?;
    dir.sync()?;
    Ok((file, len))
}

/// The live records of the journal in `dir`, read without changing anything there (a
/// journal another mount holds open is never rewritten under it).
#[cfg(test)]
pub(crate) fn read_records(dir: &Path) -> io::Result<Vec<Record>> {
    let bytes = match std::fs::read(dir.join(LOG)) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut records: Vec<Record> = replay(&bytes).0.into_values().collect();
    records.sort_by_key(|r| r.id);
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: u64, state: UploadState) -> Record {
        Record {
            id,
            key: format!("dir/file{id}"),
            base_generation: Some(7),
            size: 10,
            crc32c: 99,
            mtime: 1_700_000_000,
            mtime_nanos: 0,
            metadata: HashMap::new(),
            maybe_landed: Vec::new(),
            seq: 0,
            prefix: None,
            live: false,
            unsealed: false,
            durable: false,
            disk_failed: false,
            boot: None,
            state,
        }
    }

    /// A failed sync of the log (the disk could not write it back) is never taken back by a
    /// second sync of the same file, which Linux would let succeed: the next sync writes the
    /// log anew from the records, into another file, and only that counts as durable.
    #[cfg(unix)]
    #[tokio::test]
    async fn a_failed_sync_writes_the_log_anew_before_anything_counts_as_durable() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path()).unwrap();
        j.put(&rec(1, UploadState::Staged)).await.unwrap();
        let inode = || std::fs::metadata(dir.path().join(LOG)).unwrap().ino();
        let before = inode();
        j.apply_unsynced(Change::Put(rec(2, UploadState::Staged)))
            .unwrap();
        j.fail_syncs(1);
        assert!(j.flush().await.is_err());
        assert_eq!(inode(), before, "nothing rewritten yet");
        j.flush().await.unwrap();
        assert_ne!(inode(), before, "the log was written anew");
        let len = std::fs::metadata(dir.path().join(LOG)).unwrap().len();
        assert_eq!(j.durable_len().1, len, "all of the new log is durable");
        drop(j);
        let (all, _) = Journal::open(dir.path()).unwrap().load_all().unwrap();
        assert_eq!(all.iter().map(|r| r.id).collect::<Vec<_>>(), vec![1, 2]);
    }

    #[tokio::test]
    async fn records_survive_reopen_and_updates_replace() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path()).unwrap();
        j.put(&rec(2, UploadState::Staged)).await.unwrap();
        j.put(&rec(1, UploadState::Staged)).await.unwrap();
        let parts = vec![PartRecord {
            index: 0,
            key: "tmp/0".into(),
            generation: 5,
            crc32c: 1,
            offset: 0,
            len: 10,
        }];
        j.put(&rec(
            2,
            UploadState::Uploading {
                session_url: None,
                parts: parts.clone(),
            },
        ))
        .await
        .unwrap();
        drop(j);
        let j = Journal::open(dir.path()).unwrap();
        let (all, corrupt) = j.load_all().unwrap();
        assert!(corrupt.is_empty());
        assert_eq!(all.len(), 2);
        assert_eq!(all[0], rec(1, UploadState::Staged));
        assert_eq!(
            all[1].state,
            UploadState::Uploading {
                session_url: None,
                parts
            }
        );
        assert_eq!(j.next_id().unwrap(), 3);
        j.remove(1).await.unwrap();
        j.remove(1).await.unwrap();
        assert_eq!(j.load_all().unwrap().0.len(), 1);
        // A batch applies together: a rename replacing another file's record.
        j.apply(Change::Batch(vec![
            Change::Del(2),
            Change::Put(Record {
                key: "dir/file2-renamed".into(),
                ..rec(3, UploadState::Staged)
            }),
        ]))
        .await
        .unwrap();
        drop(j);
        let (all, _) = Journal::open(dir.path()).unwrap().load_all().unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].key, "dir/file2-renamed");
    }

    #[tokio::test]
    async fn torn_and_damaged_lines_lose_nothing_acknowledged() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path()).unwrap();
        j.put(&rec(1, UploadState::Staged)).await.unwrap();
        j.put(&rec(2, UploadState::Staged)).await.unwrap();
        drop(j);
        let log = dir.path().join(LOG);
        let mut text = std::fs::read_to_string(&log).unwrap();
        // A damaged line in the middle, and a torn append at the end.
        text.push_str("0badc0de {\"put\":{\"id\":5}}\n");
        j_append(&log, &format!("{text}0000 {{\"put\": {{\"id\": 3, \"ke"));
        let j = Journal::open(dir.path()).unwrap();
        let (all, corrupt) = j.load_all().unwrap();
        assert_eq!(
            all,
            vec![rec(1, UploadState::Staged), rec(2, UploadState::Staged)]
        );
        assert_eq!(corrupt.len(), 1);
        assert!(corrupt[0].exists(), "the damaged log is copied aside");
    }

    #[test]
    fn debug_output_hides_session_urls() {
        let state = UploadState::Uploading {
            session_url: Some("http://h/o?upload_id=SECRET".into()),
            parts: Vec::new(),
        };
        let text = format!("{:?}", rec(1, state));
        assert!(!text.contains("SECRET"), "{text}");
        assert!(text.contains("<redacted>"), "{text}");
        let s = crate::store::ResumableSession {
            key: "k".into(),
            url: "http://h/o?upload_id=SECRET".into(),
        };
        assert!(!format!("{s:?}").contains("SECRET"));
    }

    fn j_append(path: &Path, text: &str) {
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn old_one_file_records_are_folded_in() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(format!("{:016x}.json", 4)),
            serde_json::to_vec(&rec(4, UploadState::Staged)).unwrap(),
        )
        .unwrap();
        std::fs::write(dir.path().join(format!("{:016x}.json", 9)), b"not json").unwrap();
        let j = Journal::open(dir.path()).unwrap();
        let (all, corrupt) = j.load_all().unwrap();
        assert_eq!(all, vec![rec(4, UploadState::Staged)]);
        assert_eq!(corrupt.len(), 1);
        drop(j);
        let (all, _) = Journal::open(dir.path()).unwrap().load_all().unwrap();
        assert_eq!(all, vec![rec(4, UploadState::Staged)], "now in the log");
    }

    /// Records keep the nanoseconds of the mtime. A line written before the field existed reads
    /// as whole seconds, and a record of a whole second is written as before.
    #[tokio::test]
    async fn mtime_nanos_are_kept_and_old_lines_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let old = r#"{"put":{"id":3,"key":"dir/file3","base_generation":7,"size":10,"crc32c":99,"mtime":1700000000,"state":"staged"}}"#;
        j_append(
            &dir.path().join(LOG),
            &format!("{:08x} {old}\n", crc32c::crc32c(old.as_bytes())),
        );
        let j = Journal::open(dir.path()).unwrap();
        let fine = Record {
            mtime_nanos: 123_456_700,
            ..rec(1, UploadState::Staged)
        };
        j.put(&fine).await.unwrap();
        j.put(&rec(2, UploadState::Staged)).await.unwrap();
        drop(j);
        let text = std::fs::read_to_string(dir.path().join(LOG)).unwrap();
        assert!(text.contains("\"mtime_nanos\":123456700"), "{text}");
        assert_eq!(text.matches("mtime_nanos").count(), 1, "{text}");
        let (all, corrupt) = Journal::open(dir.path()).unwrap().load_all().unwrap();
        assert!(corrupt.is_empty());
        assert_eq!(
            all,
            vec![
                fine,
                rec(2, UploadState::Staged),
                rec(3, UploadState::Staged)
            ]
        );
    }

    /// A compaction that can neither rename its new log into place nor reopen the old one
    /// leaves lines appended to a log nothing holds: no sync may then call them durable (the
    /// journal had gone on syncing the new log's handle and said so). The next change rewrites
    /// the log whole, and then every record is there.
    #[tokio::test]
    async fn a_compaction_that_loses_its_log_is_written_anew_before_its_sync() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path()).unwrap();
        j.fail_compactions(1);
        // The change whose append met the failed compaction (its line reached a log no handle
        // reaches any more) is made durable by its own sync, which writes the log anew from
        // the records first: no change fails, and none is called durable unwritten.
        let last = 4 * COMPACT_SLACK as u64;
        for id in 1..=last {
            j.put(&rec(id, UploadState::Staged)).await.unwrap();
            if id % 10 != 0 {
                j.remove(id).await.unwrap();
            }
        }
        assert_eq!(
            j.failing_compactions
                .load(std::sync::atomic::Ordering::SeqCst),
            0,
            "the compaction failed"
        );
        drop(j);
        let (all, corrupt) = Journal::open(dir.path()).unwrap().load_all().unwrap();
        assert!(corrupt.is_empty());
        let ids: Vec<u64> = all.iter().map(|r| r.id).collect();
        let want: Vec<u64> = (1..=last).filter(|i| i % 10 == 0).collect();
        assert_eq!(ids, want);
    }

    #[tokio::test]
    async fn compaction_keeps_exactly_the_live_records() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path()).unwrap();
        for id in 1..=(COMPACT_SLACK as u64 + 100) {
            j.put(&rec(id, UploadState::Staged)).await.unwrap();
            if id % 10 != 0 {
                j.remove(id).await.unwrap();
            }
        }
        let lines = std::fs::read_to_string(dir.path().join(LOG))
            .unwrap()
            .lines()
            .count();
        assert!(lines < COMPACT_SLACK, "compacted: {lines} lines");
        drop(j);
        let (all, _) = Journal::open(dir.path()).unwrap().load_all().unwrap();
        let ids: Vec<u64> = all.iter().map(|r| r.id).collect();
        let want: Vec<u64> = (1..=(COMPACT_SLACK as u64 + 100))
            .filter(|i| i % 10 == 0)
            .collect();
        assert_eq!(ids, want);
    }

    /// A compaction that fails (here: its new log cannot be created) fails no append, and
    /// changes nothing: every record put is there after a reopen, and none removed comes back.
    /// It is tried again a while later, and then works.
    #[tokio::test]
    async fn a_failed_compaction_fails_no_append() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path()).unwrap();
        std::fs::create_dir(dir.path().join(NEW_LOG)).unwrap();
        let n = COMPACT_SLACK as u64 + 100;
        for id in 1..=n {
            j.put(&rec(id, UploadState::Staged)).await.unwrap();
            if id % 10 != 0 {
                j.remove(id).await.unwrap();
            }
        }
        let lines = || {
            std::fs::read_to_string(dir.path().join(LOG))
                .unwrap()
                .lines()
                .count()
        };
        assert!(
            lines() > COMPACT_SLACK,
            "could not compact: {} lines",
            lines()
        );
        std::fs::remove_dir(dir.path().join(NEW_LOG)).unwrap();
        // Tried again some lines later (not at every append), and then it works.
        let mut compacted = false;
        let mut id = n + 1;
        while !compacted && id < n + 4 * COMPACT_SLACK as u64 {
            id += 1;
            let before = j.log.lock().lines;
            j.put(&rec(id, UploadState::Staged)).await.unwrap();
            j.remove(id).await.unwrap();
            compacted = j.log.lock().lines < before;
        }
        assert!(compacted, "compacted once it could");
        j.put(&rec(n + 1, UploadState::Staged)).await.unwrap();
        drop(j);
        let (all, corrupt) = Journal::open(dir.path()).unwrap().load_all().unwrap();
        assert!(corrupt.is_empty());
        let ids: Vec<u64> = all.iter().map(|r| r.id).collect();
        let want: Vec<u64> = (1..=n).filter(|i| i % 10 == 0).chain([n + 1]).collect();
        assert_eq!(ids, want);
    }

    /// A failed append (a full disk) is cut back, so the next record is whole and readable.
    #[tokio::test]
    async fn a_short_write_does_not_corrupt_the_next_record() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path()).unwrap();
        j.put(&rec(1, UploadState::Staged)).await.unwrap();
        // Simulate a torn append: bytes of a line that never completed, as a failing
        // write_all leaves them, then the cut-back the journal does on failure.
        {
            let log = j.log.lock();
            let file = log.file.as_ref().unwrap();
            (&**file)
                .write_all(b"0000abcd {\"put\":{\"id\":9,")
                .unwrap();
            file.set_len(log.len).unwrap();
        }
        j.put(&rec(2, UploadState::Staged)).await.unwrap();
        drop(j);
        let (all, corrupt) = Journal::open(dir.path()).unwrap().load_all().unwrap();
        assert!(corrupt.is_empty(), "no damaged line: {corrupt:?}");
        assert_eq!(
            all,
            vec![rec(1, UploadState::Staged), rec(2, UploadState::Staged)]
        );
    }

    #[tokio::test]
    async fn holds_records_only_reads_and_counts_live_records() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none");
        assert!(!holds_records(&missing).unwrap());
        assert!(!missing.exists(), "nothing is created");
        let j = Journal::open(dir.path()).unwrap();
        assert!(!holds_records(dir.path()).unwrap(), "an empty log");
        j.put(&rec(1, UploadState::Staged)).await.unwrap();
        assert!(holds_records(dir.path()).unwrap());
        j.remove(1).await.unwrap();
        let len = std::fs::metadata(dir.path().join(LOG)).unwrap().len();
        assert!(len > 0);
        assert!(
            !holds_records(dir.path()).unwrap(),
            "lines, but no live record: nothing to upload"
        );
        drop(j);
        // A damaged line may have been a record; a record of the older form is one.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join(LOG))
            .unwrap();
        f.write_all(b"00000000 {\"put\":{}}\nnext\n").unwrap();
        assert!(holds_records(dir.path()).unwrap());
        let before = std::fs::read_dir(dir.path()).unwrap().count();
        let other = dir.path().join("old");
        std::fs::create_dir(&other).unwrap();
        std::fs::write(other.join(format!("{:016x}.json", 3)), b"{}").unwrap();
        assert!(holds_records(&other).unwrap());
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            before + 1,
            "no copy set aside"
        );
    }

    /// Many concurrent puts share syncs and all end durable.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn group_commit_makes_every_concurrent_put_durable() {
        let dir = tempfile::tempdir().unwrap();
        let j = Arc::new(Journal::open(dir.path()).unwrap());
        let tasks: Vec<_> = (1..=200u64)
            .map(|id| {
                let j = j.clone();
                tokio::spawn(async move { j.put(&rec(id, UploadState::Staged)).await })
            })
            .collect();
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        drop(j);
        let (all, _) = Journal::open(dir.path()).unwrap().load_all().unwrap();
        assert_eq!(all.len(), 200);
    }
}
