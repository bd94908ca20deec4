//! One item per file being written: its working copy, the acknowledged version waiting for
//! the bucket, and where its upload stands (rclone's `vfscache` item is the model).
//!
//! An item moves through these states; every arrow is taken under the item's lock:
//!
//! ```text
//!            write/truncate              close/fsync (commit)             upload lands
//!   clean ───────────────► dirty ─────────────────────────► pending ───────────────────► clean
//!     ▲                      ▲                                │   │
//!     │                      └──── write (copy-on-write) ─────┘   └─ unlink ─► unlinked
//!     └── last handle released and clean: retired (never reused)
//! ```
//!
//! - The **working copy** (`work`) is what reads and writes see. It is a sparse staging file
//!   until a commit completes it.
//! - A commit turns the working copy into a **version**: its bytes are fsync'd, its CRC32C
//!   computed, and its journal record made durable before `close()` or `fsync()` returns. A
//!   newer commit supersedes the older version (the journal swaps the records in one line).
//! - A version's bytes never change. Until it is in the bucket, a change to the working copy
//!   that would alter them first copies the file (copy-on-write) and edits the copy; appends
//!   and rewrites of bytes with the same content (the kernel writing back a whole page) need
//!   no copy, because the version is only the first `size` bytes of the file.
//! - Uploads read only the version, so a writer never waits for an upload and an upload never
//!   sees a half-written file.
//! - **Held** (I10): once a write, a truncate or the fsync of a commit fails (a full cache, a
//!   disk error), the working copy may be missing something the user wrote, and no commit is
//!   made of it any more: nothing of it is uploaded, so the object keeps its last whole version
//!   (an earlier acknowledged version still uploads). It stays staged and is reported as not
//!   saved, until the whole file is rewritten (truncated to nothing, as `cp` and editors do),
//!   deleted or renamed over. A commit that fails for another reason (bytes of the base that
//!   could not be fetched) holds nothing, but is never retried in the background either: the
//!   user was told the close failed, so only a later close or fsync may save those changes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use super::journal::{Record, UploadState};
use super::scheduler::Sched;
use super::staging::StagingFile;
use crate::error::FsError;
use crate::store::Posix;

/// Size and modification time of a file being written, which override the bucket's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalAttr {
    pub size: u64,
    pub mtime: SystemTime,
    pub posix: Posix,
}

/// An acknowledged version of a file, not yet known to be in the bucket.
#[derive(Debug, Clone)]
pub(super) struct Version {
    /// Counts the item's versions; a newer one supersedes an older one.
    pub seq: u64,
    /// Its journal record, and the staging file whose first `size` bytes it is.
    pub id: u64,
    pub size: u64,
    pub crc32c: u32,
    pub mtime: SystemTime,
    pub metadata: HashMap<String, String>,
    /// What earlier attempts left that a retry can reuse (checked before it is).
    pub progress: UploadState,
    /// The commit generation that makes it durable ([`super::commit`]); 0: durable already.
    pub commit_gen: u64,
    /// (size, CRC32C) of the last durable version this one was appended to in place: what a
    /// replay falls back to should this one's bytes not have reached the disk (a power cut
    /// before its commit). Carried over appends that are not yet committed themselves.
    pub fallback: Option<(u64, u32)>,
    /// The kernel wrote its file itself (FUSE passthrough): a mapping may still change the
    /// bytes, so an upload that finds them changed takes them as they are now, and so does a
    /// replay ([`super::passthrough`]).
    pub live: bool,
    /// Its CRC32C is not computed yet (closed while passthrough handles stay open): not
    /// uploaded until the last of them is released, or an fsync, computes it.
    pub crc_pending: bool,
    /// Sealed while the kernel still had the file open: its bytes may change after the seal.
    pub open: bool,
}

/// Where an item is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Life {
    Live,
    /// The user deleted the name (or renamed another file over it): nothing of it is
    /// uploaded any more; open handles still read and write the working copy.
    Unlinked,
    /// Dropped from the engine: in the bucket and unused. Never revived.
    Retired,
}

pub(super) struct Item {
    pub key: String,
    /// The bucket object the next upload replaces: (key, generation). An upload to another
    /// key, or with none, must find no object there.
    pub base: Option<(String, i64)>,
    pub work_id: u64,
    pub work: StagingFile,
    /// Whether the working copy's name has been made durable in the staging directory.
    pub work_named: bool,
    /// The working copy's file is that of a version whose journal record was forgotten without
    /// a sync ([`Journal::forget`](super::journal::Journal::forget)): the journal must be durable
    /// before its bytes change, or a crash would replay the stale record against changed bytes.
    pub forgotten_unsynced: bool,
    pub mtime: SystemTime,
    /// Custom metadata for the upload besides the mtime: carried over from the object it was
    /// opened from (so a modified file keeps its mode and the like), plus changes made here.
    pub metadata: HashMap<String, String>,
    /// Changes made, and the count at the last commit: dirty while they differ.
    pub edits: u64,
    pub committed: u64,
    pub pending: Option<Version>,
    pub next_seq: u64,
    /// (CRC32C, size) of versions whose upload may have landed without our hearing of it.
    pub maybe_landed: Vec<(u32, u64)>,
    pub handles: u32,
    pub life: Life,
    pub sched: Sched,
    /// Why the working copy is held: a change to it failed since the last commit (see the
    /// module doc). Its changes are never committed while this is set.
    pub held: Option<FsError>,
    /// The last close or fsync of the working copy failed (not a write): a release must not
    /// commit it behind the user's back (I10); the next close or fsync that succeeds may.
    pub close_failed: bool,
    /// The journal record keeping changes that were not saved (held, or whose last close
    /// failed) across an unmount or a crash; removed once a commit saves them or the name goes.
    pub unsaved_record: Option<u64>,
    /// The staging file that record names. While it is the working copy's own, a change to
    /// the working copy first moves the working copy to a copy of it: the record's bytes are
    /// never changed under it, so a crash finds the unsaved changes whole, not mixed with
    /// later writes nobody saved (I2, I10).
    pub unsaved_file: Option<u64>,
    /// Staging files of versions superseded by one not yet committed: kept, record and file,
    /// until the commit ([`super::commit`]), so an upload that ends meanwhile leaves them.
    pub superseded_uncommitted: Vec<u64>,
    /// Handles the kernel writes through itself (FUSE passthrough) to the working copy's file,
    /// while any is open ([`super::passthrough`]).
    pub through: Option<Through>,
    /// The working copy's file was written by the kernel itself: its versions are live.
    pub work_live: bool,
    /// Processes that opened the file passing through (thread group ids): a mapping one of
    /// them made can outlive every handle ([`super::passthrough`]).
    pub kernel_openers: Vec<u32>,
    /// The file's inode number on the mount when it was last opened passing through: a
    /// mapping of it names that inode, not the staging file's.
    pub kernel_ino: Option<u64>,
    /// A mapping of the working copy's file outlived its handles: a watch uploads what is
    /// stored through it, and the item stays until it is gone.
    pub mapped: bool,
    /// A look at a mapped file found it changed, and no save of that change has begun yet
    /// (the watch takes the lock again to save it; an unmount's drain saves it meanwhile).
    pub look_unsaved: bool,
    /// Length and modification time of the working copy's file at the engine's last look,
    /// when the kernel wrote it itself: a store through a mapping after that moves them.
    pub kernel_seen: Option<(u64, std::time::SystemTime)>,
    /// The version last uploaded, when its file is the working copy's and the kernel writes it
    /// in place: its journal record stays after the upload ([`super::passthrough`]), so that a
    /// crash finds the staged copy, with what the kernel wrote since, instead of a file no
    /// record names. Gone with the next record of the file, a hold, the name, or the item.
    pub kept_landed: Option<Version>,
    /// Staging files a version of this file was uploaded from in parts: their temporary parts
    /// may be left until a version from the same file lands or the file goes, whatever that
    /// version's size (a file cut shorter since goes up in one request, and sweeps nothing of
    /// its own).
    pub parts_files: Vec<u64>,
}

/// An item's passthrough handles: the kernel reads and writes the working copy's file
/// itself, and the engine learns what changed only when asked (flush, fsync, getattr).
pub(super) struct Through {
    pub handles: u32,
    /// The working copy's file, for `fstat`.
    pub file: Arc<std::fs::File>,
    /// Length and modification time at the last look: a change shows as a difference.
    pub seen: (u64, SystemTime),
    /// Whether the cache disk was found nearly full while the kernel wrote the file.
    pub space: super::space_watch::Watched,
}

/// How many possibly-landed versions an item remembers.
const MAYBE_LANDED: usize = 8;

/// Adds (CRC32C, size) of a version that may have landed unseen to `list`, which keeps the
/// last [`MAYBE_LANDED`].
pub(super) fn note_maybe_landed(list: &mut Vec<(u32, u64)>, entry: (u32, u64)) {
    if !list.contains(&entry) {
        if list.len() == MAYBE_LANDED {
            list.remove(0);
        }
        list.push(entry);
    }
}

impl Item {
    /// Takes staging file `id` off [`Item::parts_files`], its sweep being due: whether it was
    /// listed (a version of it was uploaded in parts).
    pub fn unlist_parts_file(&mut self, id: u64) -> bool {
        let listed = self.parts_files.contains(&id);
        self.parts_files.retain(|&f| f != id);
        listed
    }

    /// Whether the working copy's file is the one the unsaved record vouches for.
    pub fn work_is_unsaved_record(&self) -> bool {
        self.unsaved_record.is_some() && self.unsaved_file == Some(self.work_id)
    }

    pub fn dirty(&self) -> bool {
        self.edits != self.committed
    }

    /// Changed, and nothing will save it: a write failed, or the last close did and no handle
    /// is left to try again.
    pub fn not_saved(&self) -> bool {
        self.held.is_some() || (self.dirty() && self.handles == 0)
    }

    /// Kept as not saved for good: only its user saving it again moves it, so no upload frees
    /// its space. Unlike [`Self::not_saved`], not a moment between a last release (a rename,
    /// a mapping's look) and the commit that saves it.
    pub fn kept_unsaved(&self) -> bool {
        self.held.is_some() || self.close_failed || self.unsaved_record.is_some()
    }

    /// Whether the item's task has work: a version to upload.
    pub fn has_work(&self) -> bool {
        self.life == Life::Live && self.pending.is_some()
    }

    /// Bytes this item keeps on the cache disk.
    pub fn staged_bytes(&self, work_size: u64) -> u64 {
        match &self.pending {
            Some(p) if p.id != self.work_id => work_size + p.size,
            _ => work_size,
        }
    }

    pub fn attr(&self) -> LocalAttr {
        LocalAttr {
            size: self.work.size(),
            mtime: self.mtime,
            posix: Posix::from_metadata(&self.metadata),
        }
    }

    /// Nothing left to do and nobody holding it: it can retire.
    pub fn settled(&self) -> bool {
        let idle = !self.sched.task && !self.sched.uploading && self.sched.paused == 0;
        let done = self.life == Life::Unlinked
            || (self.pending.is_none() && !self.dirty() && self.held.is_none());
        self.handles == 0 && idle && done
    }

    /// Whether the object `m` is a version of this file: the one it was opened from or last
    /// uploaded, or one of its uploads whose answer was lost.
    pub fn owns(&self, m: &crate::store::ObjectMeta) -> bool {
        let same = |crc: u32, size: u64| m.crc32c == Some(crc) && m.size == size;
        self.base.as_ref() == Some(&(m.key.clone(), m.generation))
            || self.maybe_landed.iter().any(|&(c, s)| same(c, s))
            || self
                .pending
                .as_ref()
                .is_some_and(|p| same(p.crc32c, p.size))
    }

    pub fn note_maybe_landed(&mut self, v: &Version) {
        note_maybe_landed(&mut self.maybe_landed, (v.crc32c, v.size));
    }

    /// The journal record of the working copy's changes that were not saved, as record `id`.
    pub fn unsaved(&self, id: u64) -> Record {
        let mut rec = self.record(&Version {
            seq: 0,
            id,
            size: self.work.size(),
            crc32c: 0,
            mtime: self.mtime,
            metadata: self.metadata.clone(),
            progress: UploadState::Staged,
            commit_gen: 0,
            fallback: None,
            live: false,
            crc_pending: false,
            open: false,
        });
        rec.state = UploadState::NotSaved {
            file: self.work_id,
            held: self.held.is_some(),
            present: self
                .work
                .present()
                .ranges()
                .iter()
                .map(|r| (r.start, r.end))
                .collect(),
            reason: self
                .held
                .as_ref()
                .map_or_else(|| "the last close failed".to_string(), |e| e.to_string()),
        };
        rec
    }

    /// The ids of this file's journal records: its pending version's, the one keeping
    /// changes not saved, and a landed version's kept for the kernel's writes.
    pub fn record_ids(&self) -> Vec<u64> {
        let pending = self.pending.as_ref().map(|p| p.id);
        let landed = self.kept_landed.as_ref().map(|v| v.id);
        self.unsaved_record
            .into_iter()
            .chain(pending)
            .chain(landed)
            .chain(self.superseded_uncommitted.iter().copied())
            .collect()
    }

    /// The journal record of version `v` of this file.
    pub fn record(&self, v: &Version) -> Record {
        // A time before 1970 is kept as 1970, as the upload stores it.
        let since_epoch = v
            .mtime
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        Record {
            id: v.id,
            key: self.key.clone(),
            base_generation: self
                .base
                .as_ref()
                .filter(|(k, _)| *k == self.key)
                .map(|(_, g)| *g),
            size: v.size,
            crc32c: v.crc32c,
            mtime: i64::try_from(since_epoch.as_secs()).unwrap_or(i64::MAX),
            mtime_nanos: since_epoch.subsec_nanos(),
            metadata: v.metadata.clone(),
            maybe_landed: self.maybe_landed.clone(),
            seq: v.seq,
            prefix: v.fallback,
            live: v.live,
            unsealed: v.crc_pending || v.open,
            durable: false,
            disk_failed: false,
            boot: v.live.then(crate::platform::boot_id).flatten(),
            state: v.progress.clone(),
        }
    }
}

/// Result of the latest upload attempt, for waiters.
#[derive(Debug, Clone, Default)]
pub(super) struct Progress {
    /// The newest version seq known to be in the bucket.
    pub uploaded: u64,
    pub error: Option<String>,
    /// Bumped at the end of every attempt, so waiters wake even when nothing else changed.
    pub attempts: u64,
    /// The version the failed attempt was uploading; older failures do not concern a waiter
    /// for a newer version.
    pub failed_seq: u64,
}

/// An item and what can be read of it without its lock.
pub(super) struct Shared {
    pub item: tokio::sync::Mutex<Item>,
    /// Size and times, kept current by every change, so `ls` never waits on a file's lock.
    pub attr: parking_lot::Mutex<LocalAttr>,
    pub progress: watch::Sender<Progress>,
    /// Wakes the item's upload task when its due time moves earlier or a pause ends.
    pub wake: tokio::sync::Notify,
    /// Staging bytes charged to this item against the cache size.
    pub charged: AtomicU64,
    /// Mirrors `Item::handles`, readable without the item's lock.
    pub open: AtomicU32,
    /// The working copy's file while the kernel writes it itself: size and times are read
    /// from it, not from `attr`.
    pub backing: parking_lot::Mutex<Option<Arc<std::fs::File>>>,
}

impl Shared {
    pub fn new(item: Item) -> Arc<Self> {
        Arc::new(Shared {
            attr: parking_lot::Mutex::new(item.attr()),
            open: AtomicU32::new(item.handles),
            item: tokio::sync::Mutex::new(item),
            progress: watch::channel(Progress::default()).0,
            wake: tokio::sync::Notify::new(),
            charged: AtomicU64::new(0),
            backing: parking_lot::Mutex::new(None),
        })
    }

    /// Size and times as they are now: of the file itself while the kernel writes it
    /// ([`super::passthrough`]), which no change through the engine would show.
    pub fn current_attr(&self) -> LocalAttr {
        let mut attr = *self.attr.lock();
        if let Some(file) = self.backing.lock().as_ref() {
            if let Ok(m) = file.metadata() {
                attr.size = m.len();
                if let Ok(t) = m.modified() {
                    attr.mtime = t;
                }
            }
        }
        attr
    }

    /// Publishes the item's size and times after a change.
    pub fn publish(&self, it: &Item) {
        *self.attr.lock() = it.attr();
    }
}

/// A handle on one item, held by open files.
#[derive(Clone)]
pub struct ItemRef(pub(super) Arc<Shared>);

/// The backoff before retry `failures` (counting from 1): `initial` doubling up to `max`.
pub(super) fn backoff(initial: Duration, max: Duration, failures: u32) -> Duration {
    initial
        .saturating_mul(1u32 << failures.saturating_sub(1).min(16))
        .min(max)
}
