//! Files the kernel writes itself (FUSE passthrough): when a working copy may be handed to the
//! kernel, how the engine learns what the kernel wrote, and what a version made that way is.
//!
//! A passthrough handle reads and writes the working copy's staging file without a request to
//! the daemon. The engine hears of the file only at `flush` (every `close()`), `fsync`,
//! `getattr`, a truncate and the last release; each time it looks at the file (`fstat`) and,
//! when its length or modification time moved, takes it as changed ([`WriteBack::refresh`]).
//!
//! - **Who passes through.** A working copy that holds every byte of the file (a new file, an
//!   `O_TRUNC` open, a file staged whole) with no version of it pending, nothing kept as not
//!   saved and nothing held, opened when no other handle of it is: then no journal record
//!   vouches for bytes the kernel could change. Not on a mount with `--cache-size`, whose
//!   accounting cannot see the kernel's writes as they happen.
//! - **A live version.** A `close()` while passthrough handles stay open journals the file as
//!   it is, without its CRC32C (computing it would read the whole file before `close()`
//!   returns): such a version is never uploaded until the last handle's release, an
//!   `fsync`, or the engine once the upload is due (`seals_when_due`: a handle
//!   left open must not hold a closed file out of the bucket) seals it with its CRC32C (the
//!   release comes after `close()` returned). Its
//!   record is *live*: the staging file, as it is, is the version, because the kernel may
//!   still write it (handles open, or a shared mapping, whose stores can land after the
//!   release). So a replay takes the file as it finds it (`replay`), and an upload that finds
//!   the bytes changed since the seal takes them as they are now, as the newest version, and
//!   starts again (I2: what is uploaded is always one state of the file the user wrote, never
//!   a mix of two uploads).
//! - **I1.** The staging file is written in place, so a crash loses nothing written before it:
//!   the kernel holds the pages. A power cut leaves each block of it as the disk had it: like
//!   a local file edited in place, and unlike a file written through the daemon, whose last
//!   acknowledged version is kept whole. For that, a journal record names the file for as
//!   long as the kernel may write it, past an upload too: a version that lands while its file
//!   is still the working copy keeps its record (`Item::kept_landed`) until the file's next
//!   record replaces it, a hold or the name's removal drops it, the engine writes the file
//!   itself, or the item retires (no handle, no mapping). A replay then uploads the file as it
//!   finds it, over that upload, which it recognises as its own (an unchanged file is found
//!   already there).
//! - **I10, with writes it does not see.** A write the kernel makes can fail (`ENOSPC`) and
//!   only the writer learns of it; the file then lacks bytes the user meant to write. That
//!   happens on a disk (nearly) full (a file system that fails writes for space while it
//!   shows more free, btrfs out of metadata space or a project quota, is not covered). So a
//!   file passes through only while the cache disk has [`PASSTHROUGH_ROOM`] free (below it,
//!   writes go through the daemon, which sees every failure), and every close, fsync,
//!   truncate and last release checks it again: with
//!   less than [`HOLD_ROOM`] free (`KernelRoom`), a write may have failed unseen, so the
//!   file is held as if one had (never uploaded, kept staged as not saved, its close failing
//!   with `ENOSPC`).
//!   Nor is a pending version of the same file, changed in place since its seal, uploaded
//!   then, live or after a crash (`replay`). A disk that fills and is freed again between two
//!   looks is seen by the watch of the disk's free space ([`super::space_watch`]) while a
//!   handle is open: it looks again before the disk could have been filled by writing, and
//!   before each of the mount's own frees, and counts a look that came too late as a dip;
//!   only a dip made faster than writing (`fallocate`) and undone between two looks goes
//!   unseen. A store through a mapping after the last release is looked at with the mapping
//!   (every [`MAPPING_POLL`]); `EIO` from the disk is not seen.
//! - **A mapping outlives its handles.** The kernel maps the staging file itself, so stores
//!   can land after the last release, and after the upload. The engine remembers the file's
//!   length and modification time at its last look (a seal, the last release); when the item
//!   could retire, it stays if they moved since (a store while the upload ran), or if the
//!   file is still open anywhere but in the engine: the kernel keeps the open a mapping was
//!   made through for as long as the mapping lives, in whichever process holds it (a child it
//!   was handed to included), and grants a write lease only to a file's one open
//!   ([`crate::platform::opened_elsewhere`]; where leases cannot be had, the processes that
//!   opened the file passing through are looked up in `/proc/<pid>/maps` instead). A watch
//!   then looks at once and every [`MAPPING_POLL`]: a change is sealed as a new version and
//!   uploaded as any; once nothing holds the file, the item retires. Any mapping counts, a
//!   reader's private one too: so the staging file is never recycled for another file while
//!   anything still maps it. A file the kernel wrote that a replay finds (the daemon died) is
//!   looked at the same way before it retires: a mapping can outlive the daemon. An
//!   unmount's drain looks once more. Not seen: a store into a page still dirty since the
//!   engine's last look, once the upload has read it (the file's time moves only when a
//!   clean page is first stored into; seals are written back before an upload, and a reseal
//!   writes the file back first, so such pages are rare). A failed close is never saved by
//!   the watch (I10).
//! - **Bytes no longer change in place** once the last passthrough handle is gone: a later
//!   writer through the daemon edits a copy, as for any pending version.

use std::fs::File;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use std::sync::atomic::{AtomicU64, Ordering};

use super::item::{Item, ItemRef, Life, Shared, Through, Version};
use super::space_watch::SpaceWatch;
use super::writeback::WriteBack;
use crate::error::FsResult;
use crate::platform::{Dir, FreeLook};
use crate::store::ObjectStore;

/// Free space on the cache disk a file needs to be handed to the kernel: well above
/// [`HOLD_ROOM`], so that a file is held only when the disk filled up while it was written.
pub const PASSTHROUGH_ROOM: u64 = 1 << 30;

pub use super::space_watch::HOLD_ROOM;

/// How often a file still mapped after its last release is looked at.
pub const MAPPING_POLL: Duration = Duration::from_secs(2);

/// Processes remembered per item as having opened it passing through.
const KERNEL_OPENERS: usize = 16;

/// Notes that process `pid` opened `it`, inode `ino` on the mount, passing through (see
/// [`Item::kernel_openers`]).
fn note_opener(it: &mut Item, ino: u64, pid: Option<u32>) {
    it.kernel_ino = Some(ino);
    if let Some(pid) = pid.filter(|p| !it.kernel_openers.contains(p)) {
        if it.kernel_openers.len() == KERNEL_OPENERS {
            it.kernel_openers.remove(0);
        }
        it.kernel_openers.push(pid);
    }
}

/// The cache disk's free space as the kernel's writes to a passthrough file meet it. Counted as
/// for an unprivileged writer: a `write()` the kernel makes for a passthrough handle runs with
/// the daemon's rights (which may reach ext4's reserve for root), but a store through a
/// mapping of the file allocates with the rights of the process that stores, whoever it is.
pub(super) struct KernelRoom {
    staging: Arc<Dir>,
    /// Free bytes tests set in place of asking the disk (`u64::MAX`: ask it).
    pretend: AtomicU64,
}

impl KernelRoom {
    pub(super) fn new(staging: &Arc<Dir>) -> Arc<Self> {
        Arc::new(KernelRoom {
            staging: staging.clone(),
            pretend: AtomicU64::new(u64::MAX),
        })
    }

    /// Makes the disk look as if it had `free` bytes left (`None`: as it has; tests only).
    #[cfg(test)]
    pub(super) fn pretend(&self, free: Option<u64>) {
        self.pretend
            .store(free.unwrap_or(u64::MAX), Ordering::SeqCst);
    }

    /// The bytes free on the disk for the kernel's writes; `None` where that cannot be told.
    fn free(&self) -> Option<u64> {
        match self.pretend.load(Ordering::SeqCst) {
            u64::MAX => self.staging.free_bytes(),
            n => Some(n),
        }
    }

    /// Whether the disk has `room` bytes free for the kernel's writes.
    fn has(&self, room: u64) -> bool {
        self.free().is_none_or(|f| f >= room)
    }
}

/// The look the cache disk's file system runs before the mount frees space on it
/// ([`Dir::before_freeing`]): while files pass through, a disk nearly full then is a dip
/// ([`super::space_watch`]). Registered for as long as the returned look is kept.
pub(super) fn look_before_freeing(room: &Arc<KernelRoom>, watch: &SpaceWatch) -> Arc<FreeLook> {
    let (ours, watch) = (room.clone(), watch.clone());
    let look: Arc<FreeLook> = Arc::new(move || watch.look_now(|| ours.free()));
    room.staging.before_freeing(&look);
    look
}

/// Length and modification time of a file, as the engine compares them.
pub(super) fn stat(file: &File) -> std::io::Result<(u64, SystemTime)> {
    let m = file.metadata()?;
    Ok((m.len(), m.modified()?))
}

impl<S: ObjectStore> WriteBack<S> {
    /// Whether files being written may pass through on this mount: not with `--cache-size`,
    /// whose accounting cannot see the kernel's writes as they happen.
    pub fn passthrough_allowed(&self) -> bool {
        self.cfg.cache_size.is_none()
    }

    /// Whether the cache disk has room for a file to be handed to the kernel now
    /// ([`PASSTHROUGH_ROOM`]).
    pub fn passthrough_room(&self) -> bool {
        self.kernel_room.has(PASSTHROUGH_ROOM)
    }

    /// The directory of the staged copies, which files being written pass through to.
    pub fn staging_path(&self) -> &std::path::Path {
        self.kernel_room.staging.path()
    }

    /// The working copy's file for the kernel to read and write itself, if `item` may pass
    /// through now (see the module doc); its first passthrough handle is counted. `ino` and
    /// `opener`: its inode on the mount, and the process that opens it.
    pub async fn passthrough_file(
        &self,
        item: &ItemRef,
        ino: u64,
        opener: Option<u32>,
    ) -> Option<File> {
        if self.cfg.cache_size.is_some() {
            return None;
        }
        let mut it = item.0.item.lock().await;
        let eligible = it.life == Life::Live
            && it.handles == 1
            && it.through.is_none()
            && it.pending.is_none()
            && it.held.is_none()
            && it.unsaved_record.is_none()
            && !it.forgotten_unsynced
            && it.work.is_complete();
        if !eligible {
            return None;
        }
        let opened = (|| {
            // Bytes past the end (never acknowledged) must not show through the kernel.
            it.work.cut_tail()?;
            let file = it.work.clone_file()?;
            if !self.room_for_kernel(PASSTHROUGH_ROOM) {
                return Err(std::io::Error::other("the cache disk is nearly full"));
            }
            let seen = stat(&file)?;
            Ok::<_, std::io::Error>((file, seen))
        })();
        let (file, seen) = match opened {
            Ok(x) => x,
            Err(e) => {
                tracing::debug!(key = %it.key, error = %e, "no passthrough for the file");
                return None;
            }
        };
        // Stores through a mapping since the engine's last look are changes, not the start.
        if it.kernel_seen.is_some_and(|k| k != seen) {
            it.work.adopt(seen.0);
            it.mtime = seen.1;
            it.edits += 1;
        }
        let for_kernel = file.try_clone().ok()?;
        self.begin_through(item, &mut it, Arc::new(file), seen);
        it.work_live = true;
        note_opener(&mut it, ino, opener);
        self.in_place.lock().insert(it.work_id);
        Some(for_kernel)
    }

    /// Another handle of `item` joins its passthrough handles, on `file` (the kernel gives
    /// every handle of an inode the same backing file). Should the last of them have let go
    /// of the item meanwhile, this one takes it up again: the file is the same working copy,
    /// and a version sealed since is live.
    pub async fn join_passthrough(
        &self,
        item: &ItemRef,
        file: Arc<File>,
        ino: u64,
        opener: Option<u32>,
    ) {
        let mut it = item.0.item.lock().await;
        note_opener(&mut it, ino, opener);
        match it.through.as_mut() {
            Some(t) => t.handles += 1,
            None => {
                // From the engine's last look, so that stores through a mapping since are seen.
                let seen = it.kernel_seen.unwrap_or((u64::MAX, SystemTime::UNIX_EPOCH));
                self.begin_through(item, &mut it, file, seen);
            }
        }
    }

    /// One passthrough handle of `item` is gone (released, or refused by the kernel): with
    /// the last, the engine takes the file's final state and goes back to doing its I/O.
    /// `others` says, asked under the item's lock, whether handles of the inode still pass
    /// through: one counted there may not have joined the item yet ([`Self::join_passthrough`]),
    /// and the item keeps passing through, with no handle of its own, until it does (a
    /// truncate meanwhile must cut the file that handle writes, not a copy).
    pub async fn leave_passthrough(&self, item: &ItemRef, others: impl FnOnce() -> bool) {
        let mut it = item.0.item.lock().await;
        self.refresh(&item.0, &mut it);
        let last = match it.through.as_mut() {
            Some(t) => {
                t.handles = t.handles.saturating_sub(1);
                t.handles == 0
            }
            None => false,
        };
        if last && !others() {
            if let Some(t) = it.through.take() {
                it.kernel_seen = Some(t.seen);
            }
            *item.0.backing.lock() = None;
        }
    }

    /// Takes what the kernel wrote to a passthrough file since the last look: when its length
    /// or modification time moved, the working copy is that file as it is (its CRC32C unknown
    /// until a seal computes it), changed, with the file's modification time.
    ///
    /// With the cache disk within [`HOLD_ROOM`] of full, a write the kernel made may
    /// have failed unseen: the file is held (I10), whether or not it looks changed.
    pub(super) fn refresh(&self, shared: &Shared, it: &mut Item) {
        let Some(t) = it.through.as_mut() else {
            return;
        };
        // A look of the watch's own, so that a late one counts (`space_watch`).
        self.space_watch.look_now(|| self.kernel_room.free());
        let full = t.space.take_dip();
        if full && it.held.is_none() {
            self.hold_on_failure(it, &Err(crate::error::FsError::NoSpace));
        }
        let Some(t) = it.through.as_mut() else {
            return;
        };
        let now = match stat(&t.file) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(key = %it.key, error = %e, "cannot look at a file the kernel writes");
                return;
            }
        };
        if now == t.seen {
            return;
        }
        t.seen = now;
        it.work.adopt(now.0);
        it.mtime = now.1;
        it.edits += 1;
        shared.publish(it);
        self.recharge(shared, it);
    }

    /// Whether `it`'s pending version, closed while the kernel still writes its file (its
    /// CRC32C to come), is sealed by the engine once due, as an fsync would seal it: not for
    /// a file held or not saved (I10: only its user's save may save it), nor once the kernel
    /// let go of it (its last release seals it).
    pub(super) fn seals_when_due(it: &Item) -> bool {
        it.life == Life::Live
            && it.through.is_some()
            && it.held.is_none()
            && !it.close_failed
            && it.unsaved_record.is_none()
            && it
                .pending
                .as_ref()
                .is_some_and(|p| p.crc_pending && p.id == it.work_id)
    }

    /// Lets go of the record a landed version kept for the kernel's writes (see
    /// [`Item::kept_landed`]), without waiting for that to be durable: a crash of the daemon
    /// keeps the journal's line (the kernel holds it), and the file's staging file goes
    /// through the pool, which makes the journal durable before reusing it.
    pub(super) fn drop_kept_landed(&self, it: &mut Item) {
        if let Some(v) = it.kept_landed.take() {
            self.forget_landed(&v);
            // Not durable yet: the journal is, before the engine changes the file's bytes.
            it.forgotten_unsynced |= v.id == it.work_id;
        }
    }

    /// Forgets landed version `v`'s record (see [`Self::drop_kept_landed`]), durable within a
    /// second.
    pub(super) fn forget_landed(&self, v: &Version) {
        match self.journal.forget(v.id) {
            Ok(()) => self.flush_forgotten_soon(),
            Err(e) => {
                tracing::warn!(error = %e, "could not remove a journal record; the file will be uploaded again at the next mount")
            }
        }
    }

    /// Whether `it`, which could retire now, stays because the kernel may still change its
    /// file (see the module doc): a process that opened it passing through still maps it, or
    /// it changed since the engine last looked (a store while its upload ran). A watch then
    /// uploads what is stored and retires the item once nothing maps it.
    pub(super) fn stays_for_mapping(self: &Arc<Self>, shared: &Arc<Shared>, it: &mut Item) -> bool {
        if it.life != Life::Live {
            return false;
        }
        if it.mapped {
            return true;
        }
        let Some(seen) = it.kernel_seen else {
            return false;
        };
        if !self.in_place.lock().contains(&it.work_id) {
            return false;
        }
        let Ok(file) = it.work.clone_file() else {
            return false;
        };
        let changed = stat(&file).is_ok_and(|now| now != seen);
        if !changed && !self.may_be_mapped(it, &file) {
            return false;
        }
        tracing::debug!(key = %it.key, changed, "the file may still be changed through a mapping: it stays, and what is stored is uploaded");
        it.mapped = true;
        let (me, shared, id) = (self.clone(), shared.clone(), it.work_id);
        tokio::spawn(async move { me.watch_mapping(shared, id).await });
        true
    }

    /// Whether anything may still store into `it`'s file `file` (one open of the working copy):
    /// any other open of it, by any process, or a mapping made through one, is told by the
    /// kernel ([`crate::platform::opened_elsewhere`]), a mapping inherited by a child too. Where
    /// the kernel cannot tell, the processes that opened it passing through are asked whether
    /// they still map it shared (`/proc/<pid>/maps`).
    fn may_be_mapped(&self, it: &Item, file: &File) -> bool {
        #[cfg(test)]
        if self.no_leases.load(Ordering::SeqCst) {
            return crate::platform::mapped_by(&self.mapping_ids(it, file), &it.kernel_openers);
        }
        crate::platform::opened_elsewhere(file).unwrap_or_else(|| {
            crate::platform::mapped_by(&self.mapping_ids(it, file), &it.kernel_openers)
        })
    }

    /// How `/proc/<pid>/maps` names a mapping of `it`'s file `file`: the inode on the mount
    /// (a mapping through a passthrough handle shows the file the user mapped), and the
    /// staging file itself.
    fn mapping_ids(&self, it: &Item, file: &File) -> Vec<(String, u64)> {
        let mount = self.kernel_dev.lock().clone().zip(it.kernel_ino);
        mount
            .into_iter()
            .chain(crate::platform::maps_id(file))
            .collect()
    }

    /// Notes the state of the working copy's file as the version just sealed has it, when
    /// the kernel may change it behind the engine's back (see [`Item::kernel_seen`]).
    pub(super) fn note_kernel_seen(it: &mut Item) {
        if it.work_live {
            // On an error the last look stands: a mapping must not go unseen for it.
            if let Some(now) = it.work.clone_file().ok().and_then(|f| stat(&f).ok()) {
                it.kernel_seen = Some(now);
            }
        }
    }

    /// One look at a file the kernel may have changed with no handle open (a mapping): when it
    /// moved since the engine's last look, the working copy is the file as it is, changed.
    /// With the cache disk nearly full the store may have failed (SIGBUS for the writer): the
    /// file is held (I10). Returns whether it changed.
    fn look_after_kernel(&self, shared: &Shared, it: &mut Item, file: &File) -> bool {
        let Ok(now) = stat(file) else {
            return false;
        };
        if it.kernel_seen == Some(now) {
            return false;
        }
        it.kernel_seen = Some(now);
        it.work.adopt(now.0);
        it.mtime = now.1;
        it.edits += 1;
        it.look_unsaved = true;
        shared.publish(it);
        self.recharge(shared, it);
        if !self.room_for_kernel(HOLD_ROOM) && it.held.is_none() {
            self.hold_on_failure(it, &Err(crate::error::FsError::NoSpace));
        }
        true
    }

    /// Saves what a look found changed: a new version, uploaded as any; or, held, kept as not
    /// saved.
    async fn save_kernel_change(self: &Arc<Self>, shared: &Arc<Shared>) {
        let item = ItemRef(shared.clone());
        let key = {
            let mut it = shared.item.lock().await;
            it.look_unsaved = false;
            if it.handles > 0 || it.through.is_some() {
                // A handle opened since the look: its close saves the change with its own
                // (and until then, nothing of a writer's not yet closed is uploaded).
                return;
            }
            if it.close_failed {
                // The file's last close failed (I10): what it holds now is not saved, and
                // nothing in the background saves it.
                self.keep_unsaved(shared, &mut it).await;
                return;
            }
            it.key.clone()
        };
        tracing::info!(key = %key, "a store through a mapping changed the file after its last release; it is uploaded again");
        if let Err(e) = self.commit(&item).await {
            let mut it = shared.item.lock().await;
            tracing::error!(key = %it.key, error = %e, "a change made through a mapping could not be saved; it stays staged and is not uploaded");
            self.keep_unsaved(shared, &mut it).await;
        }
    }

    /// A look at a watched file now (an unmount's drain: the watch may not come again), its
    /// change saved.
    pub(super) async fn look_at_mapped(self: &Arc<Self>, shared: &Arc<Shared>) {
        let changed = {
            let mut it = shared.item.lock().await;
            if !it.mapped || it.life != Life::Live || it.handles > 0 || it.through.is_some() {
                return;
            }
            let looked = match it.work.clone_file() {
                Ok(file) => self.look_after_kernel(shared, &mut it, &file),
                Err(_) => false,
            };
            // A change the watch found but has not yet begun to save (it takes the lock
            // again to commit): saved here, as the watch may not get to it before the mount
            // goes. Only that: a change whose save began and failed is kept as not saved by
            // that save (I10), not tried again here. A save under way that finds it done
            // commits nothing twice ([`WriteBack::commit`] looks at `dirty` under the lock).
            looked || it.look_unsaved
        };
        if changed {
            self.save_kernel_change(shared).await;
        }
    }

    /// The watch of a file the kernel may still change (see [`Self::stays_for_mapping`]): at
    /// once and then every [`MAPPING_POLL`], first whether a mapping is left, then whether
    /// the file changed (so a store made before the mapping went is seen); a change is saved
    /// as a new version. Handles open meanwhile take the changes at their own looks.
    async fn watch_mapping(self: Arc<Self>, shared: Arc<Shared>, id: u64) {
        loop {
            let (changed, gone) = {
                let mut it = shared.item.lock().await;
                if it.life != Life::Live || it.work_id != id {
                    // Removed, or written over through a copy: nothing more to follow.
                    it.mapped = false;
                    if it.handles == 0 {
                        self.retire_if_settled(&shared, &mut it);
                    }
                    return;
                }
                // The working copy's own open, looked at through each time: a second open of
                // it held here would itself count as another open of the file.
                let file = match it.work.clone_file() {
                    Ok(f) => f,
                    Err(e) => {
                        drop(it);
                        tracing::warn!(error = %e, "cannot look at a file still mapped; looking again later");
                        tokio::time::sleep(MAPPING_POLL).await;
                        continue;
                    }
                };
                // Not asked while a handle is open: its answer would not be used, and the lease
                // it takes must not meet the kernel opening a new handle's backing file.
                let busy = it.handles > 0 || it.through.is_some();
                let gone = !busy && !self.may_be_mapped(&it, &file);
                let changed = !busy && self.look_after_kernel(&shared, &mut it, &file);
                (changed, gone)
            };
            if changed {
                #[cfg(test)]
                self.pause_before_mapped_save().await;
                self.save_kernel_change(&shared).await;
            }
            if gone {
                let mut it = shared.item.lock().await;
                it.mapped = false;
                if it.handles == 0 {
                    self.retire_if_settled(&shared, &mut it);
                }
                return;
            }
            tokio::time::sleep(MAPPING_POLL).await;
        }
    }

    /// Tests: holds the watch between a look that found a change and its save, while a
    /// gate is set (two meetings: one to say it is there, one to let it go).
    #[cfg(test)]
    async fn pause_before_mapped_save(&self) {
        let gate = self.mapped_save_gate.lock().clone();
        if let Some(gate) = gate {
            gate.wait().await;
            gate.wait().await;
        }
    }

    /// Whether the cache disk has `room` bytes free.
    fn room_for_kernel(&self, room: u64) -> bool {
        self.kernel_room.has(room)
    }

    /// The first passthrough handle of `it`, on `file` (the backing file the kernel shares
    /// among the handles that join it), as a look found it (`seen`); counted by the watch of
    /// the cache disk's free space.
    fn begin_through(
        &self,
        item: &ItemRef,
        it: &mut Item,
        file: Arc<File>,
        seen: (u64, SystemTime),
    ) {
        let room = self.kernel_room.clone();
        let space = self.space_watch.watch(Arc::new(move || room.free()));
        *item.0.backing.lock() = Some(file.clone());
        it.through = Some(Through {
            handles: 1,
            file,
            seen,
            space,
        });
    }

    /// Sets a passthrough file's modification time on the file itself, where `getattr` reads
    /// it, and takes that as seen (a time set is not a change of the bytes).
    pub(super) fn set_through_mtime(it: &mut Item, mtime: SystemTime) {
        if let Some(t) = it.through.as_mut() {
            if let Err(e) = t.file.set_modified(mtime) {
                tracing::warn!(key = %it.key, error = %e, "cannot set the time of a file the kernel writes");
            }
            if let Ok(s) = stat(&t.file) {
                t.seen = s;
            }
        }
    }

    /// An upload found the bytes of a live version changed since its seal (a mapping stored
    /// into them after the release): the file as it is now is the version, sealed again in
    /// place, and the upload starts over. Its record follows.
    pub(super) async fn reseal_live(&self, shared: &Shared, it: &mut Item) -> FsResult<()> {
        let Some(v) = it.pending.as_ref().filter(|v| v.live) else {
            return Ok(());
        };
        let (id, at) = (v.id, self.dir.staging(v.id));
        // Ok(Err(e)): the disk failed to write the file back.
        let measured = crate::platform::blocking(move || {
            let file = at.open(crate::platform::Open::new().read(true))?;
            // Written back first: its pages are write-protected again, so a later store
            // through a mapping moves the file's time, where the engine looks.
            #[cfg(target_os = "linux")]
            if let Err(e) = file.sync_data() {
                return Ok(Err(e));
            }
            let len = file.metadata()?.len();
            let crc = super::staging::crc32c_of_file(&file, len)?;
            Ok(crate::platform::writeback_error(&file).map(|()| (len, crc)))
        })
        .await?;
        let (size, crc) = match measured {
            Ok(m) => m,
            Err(e) => {
                // Told once ([`super::disk_errors`]): the next attempt must not take the file
                // as it then reads.
                self.disk_errors.note(id, &e);
                return Err(e.into());
            }
        };
        tracing::info!(key = %it.key, size, "a file the kernel wrote changed after it was sealed; it is uploaded as it is now");
        if it.work_id == id && it.through.is_none() {
            it.work.adopt(size);
            shared.publish(it);
        }
        let Some(mut v) = it.pending.take() else {
            return Ok(());
        };
        // Shrunk below the size uploaded in parts: the next attempt sends one request and never
        // sweeps the parts the last one may have left (a larger one sweeps them when it is done).
        let threshold = self.cfg.upload.single_shot_threshold;
        if v.size >= threshold && size < threshold {
            self.sweep_parts(v.id, Some(v.seq));
        }
        (v.size, v.crc32c, v.fallback) = (size, crc, None);
        v.progress = super::journal::UploadState::Staged;
        let rec = it.record(&v);
        it.pending = Some(v);
        Self::note_kernel_seen(it);
        self.journal.put(&rec).await?;
        Ok(())
    }
}
