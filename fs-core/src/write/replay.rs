//! Start-up: every journaled version becomes an item again and is uploaded, and what earlier
//! runs left behind is cleared away.
//!
//! - Before anything, the cache directory is claimed for the mount's bucket and prefix (I11,
//!   [`super::cache_dir::CacheDir::claim`], when the filesystem is built): records carry only
//!   keys, so a directory whose marker names another owner, or whose records have none, is
//!   never replayed.
//! - A record's staging file holds the version in its first `size` bytes (later bytes are
//!   changes made after the last acknowledgement, never acknowledged). The version's CRC32C is
//!   checked before it is replayed, and the file cut back to the version, so the mount shows
//!   and uploads exactly what was last acknowledged. A file that is short or fails its check
//!   is set aside as `<id>.damaged`, never uploaded and never deleted.
//! - Staging files no record names (work never acknowledged) are removed.
//! - Temporary parts in the bucket are named `<parts prefix><tag>/<id>/…`, the tag being the
//!   cache directory's. Our own parts that no live version needs are removed. Another mount's
//!   parts are removed only once they are older than [`FOREIGN_PARTS_AGE`]: that mount may be
//!   uploading them right now.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, SystemTime};

use super::cache_dir::{ClaimError, Owner};
use super::item::{Item, Life, Shared, Version};
use super::journal::{Record, UploadState};
use super::ranges::RangeSet;
use super::scheduler::Sched;
use super::staging::{crc32c_of_file, StagingFile};
use super::writeback::WriteBack;
use crate::error::FsError;
use crate::store::{ListRequest, ObjectStore, Precondition};

/// Listing attempts of the start-up cleanup before it leaves the rest to the next mount.
const CLEANUP_ROUNDS: u32 = 12;

/// Age past which another mount's temporary parts are taken for abandoned.
pub const FOREIGN_PARTS_AGE: Duration = Duration::from_secs(2 * 24 * 3600);

/// The modification time a record keeps. Nanoseconds a record cannot have (from a damaged or
/// hand-edited journal) are ignored rather than carried into the next second.
fn rec_mtime(rec: &Record) -> SystemTime {
    let nanos = if rec.mtime_nanos < 1_000_000_000 {
        rec.mtime_nanos
    } else {
        0
    };
    SystemTime::UNIX_EPOCH + Duration::new(rec.mtime.max(0) as u64, nanos)
}

impl<S: ObjectStore> WriteBack<S> {
    /// Ties the cache directory to `owner` before replaying (I11: see
    /// [`super::cache_dir::CacheDir::claim`]).
    pub fn claim_cache_dir(&self, owner: &Owner, adopt: bool) -> Result<(), ClaimError> {
        self.dir.claim(owner, adopt)
    }

    /// Re-creates an item for every journal record and schedules its upload. Returns how many.
    pub async fn replay(self: &std::sync::Arc<Self>) -> Result<usize, String> {
        let (records, corrupt) = self
            .journal
            .load_all()
            .map_err(|e| format!("cannot read the journal: {e}"))?;
        if !corrupt.is_empty() {
            tracing::error!(
                count = corrupt.len(),
                "journal records could not be read and were set aside"
            );
        }
        // Records of one name, newest first: normally one, but a version superseded by one
        // not yet committed keeps its record until that commit, so a power cut may leave both.
        let mut by_key: BTreeMap<String, Vec<Record>> = BTreeMap::new();
        // Changes that were not saved: kept staged beside (or in) the file's pending version.
        let mut not_saved: BTreeMap<String, Record> = BTreeMap::new();
        for rec in records {
            if matches!(rec.state, UploadState::NotSaved { .. }) {
                if let Some(older) = not_saved.insert(rec.key.clone(), rec) {
                    self.forget_record(older.id, false).await;
                }
                continue;
            }
            if matches!(
                rec.state,
                UploadState::Done { .. } | UploadState::Conflict { .. }
            ) {
                self.forget_record(rec.id, true).await;
                continue;
            }
            by_key.entry(rec.key.clone()).or_default().push(rec);
        }
        let mut kept = HashSet::new();
        // Staging files whose bytes past a version are changes kept as not saved.
        let longer: HashSet<u64> = not_saved
            .values()
            .filter_map(|r| match r.state {
                UploadState::NotSaved { file, .. } => Some(file),
                _ => None,
            })
            .collect();
        for mut recs in by_key.into_values() {
            recs.sort_by_key(|r| std::cmp::Reverse((r.seq, r.id)));
            let Some(rec) = self.newest_whole(recs, &longer).await else {
                continue;
            };
            kept.insert(rec.id);
            self.bump_next_id(rec.id);
            let mtime = rec_mtime(&rec);
            let version = Version {
                seq: rec.seq.max(1),
                id: rec.id,
                size: rec.size,
                crc32c: rec.crc32c,
                mtime,
                metadata: rec.metadata.clone(),
                progress: rec.state.clone(),
                commit_gen: 0,
                fallback: rec.prefix,
                live: rec.live,
                crc_pending: false,
                open: false,
            };
            let mut item = Item {
                key: rec.key.clone(),
                base: rec.base_generation.map(|g| (rec.key.clone(), g)),
                work_id: rec.id,
                work: StagingFile::open_complete(&self.dir.staging(rec.id), rec.size),
                work_named: true,
                forgotten_unsynced: false,
                mtime,
                metadata: rec.metadata.clone(),
                edits: 1,
                committed: 1,
                pending: Some(version),
                next_seq: rec.seq.max(1) + 1,
                maybe_landed: rec.maybe_landed.clone(),
                handles: 0,
                life: Life::Live,
                sched: Sched::default(),
                held: None,
                close_failed: false,
                unsaved_record: None,
                unsaved_file: None,
                superseded_uncommitted: Vec::new(),
                through: None,
                work_live: rec.live,
                kernel_openers: Vec::new(),
                kernel_ino: None,
                mapped: false,
                look_unsaved: false,
                kernel_seen: None,
                kept_landed: None,
                // Parts an attempt left: swept once a version of the file lands, whatever
                // its size then.
                parts_files: match &rec.state {
                    UploadState::Uploading { parts, .. } if !parts.is_empty() => vec![rec.id],
                    _ => Vec::new(),
                },
            };
            item.sched.due_in(Duration::ZERO);
            if rec.disk_failed {
                self.disk_errors
                    .note_again(rec.id, "a write-back failed before the mount stopped");
            }
            if rec.live {
                // A mapping made before the stop may still write it: never reused, and looked
                // for before the item retires, as after a last release (the file as found now
                // is what the engine last saw of it).
                self.in_place.lock().insert(rec.id);
                item.kernel_seen = item
                    .work
                    .clone_file()
                    .ok()
                    .and_then(|f| super::passthrough::stat(&f).ok());
            }
            let shared = Shared::new(item);
            self.space.charge_existing(&shared.charged, rec.size);
            self.by_key.lock().insert(rec.key.clone(), shared.clone());
            tracing::info!(key = %rec.key, size = rec.size, "replaying a staged file from the journal");
            let mut it = shared.item.lock().await;
            self.ensure_task(&shared, &mut it);
        }
        // The kept versions' names, as their bytes were in `verify`: what the replay keeps
        // is durable before anything newer is built on it.
        if !kept.is_empty() {
            let dir = self.dir.staging_dir().clone();
            if let Err(e) = crate::platform::blocking(move || dir.sync()).await {
                tracing::warn!(error = %e, "could not sync the staging directory");
            }
        }
        let mut count = kept.len();
        for rec in not_saved.into_values() {
            if self.replay_not_saved(rec, &mut kept).await {
                count += 1;
            }
        }
        self.remove_unjournaled_staging(&kept, !corrupt.is_empty());
        Ok(count)
    }

    /// Brings back changes that were not saved before the last unmount or crash (I10): staged
    /// and shown, never uploaded, until the user saves the file again. Returns whether it did.
    async fn replay_not_saved(&self, rec: Record, kept: &mut HashSet<u64>) -> bool {
        let UploadState::NotSaved {
            file,
            held,
            present,
            reason,
        } = rec.state.clone()
        else {
            return false;
        };
        let at = self.dir.staging(file);
        let len = match at.stat() {
            Ok(m) => m.len,
            Err(e) => {
                tracing::error!(key = %rec.key, id = file, error = %e, "the staged copy of changes that were not saved is missing; they are lost");
                self.forget_record(rec.id, false).await;
                return false;
            }
        };
        // The state the record kept: later writes to the file were never saved either, and
        // its present ranges do not cover them.
        let len = len.min(rec.size);
        let mut ranges = RangeSet::new();
        for (start, end) in present {
            let end = end.min(len);
            if start < end {
                ranges.insert(start..end);
            }
        }
        kept.insert(file);
        self.bump_next_id(rec.id);
        self.bump_next_id(file);
        let work = StagingFile::open_partial(&at, len, ranges);
        let held = held.then_some(FsError::Io(reason));
        tracing::warn!(key = %rec.key, size = len, "changes that were not saved before the mount stopped are kept staged; they are not uploaded until the file is saved again");
        let existing = self.by_key.lock().get(&rec.key).cloned();
        match existing {
            Some(shared) => {
                let mut it = shared.item.lock().await;
                it.work = work;
                it.work_id = file;
                it.work_live = false;
                // Not the file the kernel was last seen writing (or, the same file, held).
                it.kernel_seen = None;
                it.edits = it.committed + 1;
                it.held = held;
                it.unsaved_record = Some(rec.id);
                it.unsaved_file = Some(file);
                if it.base.is_none() {
                    it.base = rec.base_generation.map(|g| (rec.key.clone(), g));
                }
                shared.publish(&it);
                self.space
                    .charge_existing(&shared.charged, it.staged_bytes(len));
            }
            None => {
                let mtime = rec_mtime(&rec);
                let item = Item {
                    key: rec.key.clone(),
                    base: rec.base_generation.map(|g| (rec.key.clone(), g)),
                    work_id: file,
                    work,
                    work_named: true,
                    forgotten_unsynced: false,
                    mtime,
                    metadata: rec.metadata.clone(),
                    edits: 1,
                    committed: 0,
                    pending: None,
                    next_seq: 1,
                    maybe_landed: rec.maybe_landed.clone(),
                    handles: 0,
                    life: Life::Live,
                    sched: Sched::default(),
                    held,
                    close_failed: true,
                    unsaved_record: Some(rec.id),
                    unsaved_file: Some(file),
                    superseded_uncommitted: Vec::new(),
                    through: None,
                    work_live: false,
                    kernel_openers: Vec::new(),
                    kernel_ino: None,
                    mapped: false,
                    look_unsaved: false,
                    kernel_seen: None,
                    kept_landed: None,
                    parts_files: Vec::new(),
                };
                let shared = Shared::new(item);
                self.space.charge_existing(&shared.charged, len);
                self.by_key.lock().insert(rec.key.clone(), shared);
            }
        }
        true
    }

    /// Of a name's records (newest first), the newest whose bytes check; the others go. One
    /// that fails its check gives way to the version before it, in the same file (an append)
    /// or in an older record: a power cut before its commit lost its bytes (see
    /// [`super::commit`]). With no version before it, it is set aside as damaged.
    async fn newest_whole(&self, recs: Vec<Record>, longer: &HashSet<u64>) -> Option<Record> {
        let mut chosen = None;
        let total = recs.len();
        for (i, mut rec) in recs.into_iter().enumerate() {
            if chosen.is_some() {
                // Superseded by the chosen one, whose commit its removal was waiting for.
                self.forget_record(rec.id, !longer.contains(&rec.id)).await;
                continue;
            }
            let keep_tail = longer.contains(&rec.id);
            // A file the kernel wrote itself (see [`super::passthrough`]) is taken as it is when
            // its pages are known to be what was written last: in the boot that wrote it (a
            // crash or kill keeps them in the kernel). After a power cut, a sealed one is
            // checked against its CRC32C, and one a commit made durable (edited in place
            // since, at most) is taken as it is if that fails; an unsealed one no commit
            // covered is not trusted, and gives way as a damaged version does.
            let same_boot = rec.boot.is_some() && rec.boot == crate::platform::boot_id();
            // Changes that were not saved (I10) in the same file, edited in place: the file as
            // it is holds them, so only the version as sealed may be taken, if its bytes are
            // still there.
            // A file whose write-back the disk failed ([`super::disk_errors`]) is taken only
            // as it was sealed, if its bytes still check: what the disk holds instead is not
            // what was written.
            let live = rec.live && !keep_tail && !rec.disk_failed;
            if live && (same_boot || (rec.unsealed && rec.durable)) {
                self.take_live(&mut rec).await;
            }
            let checked = match rec.live && rec.unsealed && !rec.durable && !same_boot {
                true => Err(std::io::Error::other(
                    "written in place by the kernel and never committed before a power cut",
                )),
                false => self.verify(rec.size, rec.crc32c, &rec, keep_tail).await,
            };
            let checked = match checked {
                Err(_) if live && rec.durable && !rec.unsealed => {
                    self.take_live(&mut rec).await;
                    self.verify(rec.size, rec.crc32c, &rec, keep_tail).await
                }
                other => other,
            };
            let e = match checked {
                Ok(()) => {
                    chosen = Some(rec);
                    continue;
                }
                Err(e) => e,
            };
            if let Some((size, crc)) = rec.prefix {
                if self.verify(size, crc, &rec, keep_tail).await.is_ok() {
                    tracing::warn!(key = %rec.key, size = rec.size, "a version closed just before the mount stopped was not yet durable and was lost to the power cut; the version it appended to is kept");
                    (rec.size, rec.crc32c, rec.prefix) = (size, crc, None);
                    if let Err(e) = self.journal.put(&rec).await {
                        tracing::warn!(key = %rec.key, error = %e, "could not update a journal record");
                    }
                    chosen = Some(rec);
                    continue;
                }
            }
            if i + 1 < total {
                tracing::warn!(key = %rec.key, id = rec.id, error = %e, "a version closed just before the mount stopped was not yet durable and was lost to the power cut; the version before it is kept");
                self.forget_record(rec.id, !longer.contains(&rec.id)).await;
                continue;
            }
            if keep_tail {
                // The file now holds changes that were not saved: it stays theirs.
                tracing::error!(key = %rec.key, id = rec.id, error = %e, "a version was changed in place by changes that were not saved; the changes are kept staged, and the bucket keeps its last whole version");
                self.forget_record(rec.id, false).await;
                continue;
            }
            tracing::error!(key = %rec.key, id = rec.id, error = %e, "staged data of a saved file is missing or damaged; it is kept aside as .damaged and not uploaded");
            let _ = self
                .dir
                .staging(rec.id)
                .rename_to(&self.dir.staging_aside(rec.id, "damaged"));
            self.forget_record(rec.id, false).await;
        }
        chosen
    }

    /// A version the kernel wrote itself: its file as it is now is the version (written after
    /// the record, by a handle still open or a mapping, it holds what the user wrote last).
    /// Its size and CRC32C are taken from it and journaled; a file that is gone stays as the
    /// record says, for [`Self::verify`] to set aside.
    async fn take_live(&self, rec: &mut Record) {
        let at = self.dir.staging(rec.id);
        let measured = crate::platform::blocking(move || {
            let file = at.open(crate::platform::Open::new().read(true))?;
            let len = file.metadata()?.len();
            let crc = crc32c_of_file(&file, len)?;
            // The disk failed to write it back since the daemon stopped: what was read is
            // not what was written, and the record's own CRC32C decides.
            crate::platform::writeback_error(&file)?;
            Ok((len, crc))
        })
        .await;
        match measured {
            Ok((size, crc)) if (size, crc) != (rec.size, rec.crc32c) => {
                tracing::info!(key = %rec.key, size, "a file the kernel wrote itself is taken as it is on the disk");
                // The version as the record sealed it may be in the bucket already (uploaded,
                // with the line that forgot the record lost): it is ours if found there.
                super::item::note_maybe_landed(&mut rec.maybe_landed, (rec.crc32c, rec.size));
                (rec.size, rec.crc32c, rec.prefix) = (size, crc, None);
                rec.unsealed = false;
                rec.boot = crate::platform::boot_id();
                if let Err(e) = self.journal.put(rec).await {
                    tracing::warn!(key = %rec.key, error = %e, "could not update a journal record");
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(key = %rec.key, error = %e, "cannot read a staged file the kernel wrote itself")
            }
        }
    }

    /// Checks that the record's staging file holds its version, and cuts off anything after
    /// it (changes never acknowledged).
    async fn verify(
        &self,
        size: u64,
        crc: u32,
        rec: &Record,
        keep_tail: bool,
    ) -> std::io::Result<()> {
        let at = self.dir.staging(rec.id);
        crate::platform::blocking(move || {
            let file = at.open(crate::platform::Open::new().read(true).write(true))?;
            let len = file.metadata()?.len();
            if len < size {
                return Err(std::io::Error::other(format!(
                    "staging file has {len} bytes, the version {size}"
                )));
            }
            if crc32c_of_file(&file, size)? != crc {
                return Err(std::io::Error::other("CRC32C mismatch"));
            }
            if len > size && !keep_tail {
                file.set_len(size)?;
                file.sync_all()?;
            } else {
                // The version may not have reached its commit before the mount stopped (a
                // crash or kill keeps its pages in the kernel): durable before anything
                // newer is built on it, the superseded records now being gone.
                file.sync_data()?;
            }
            Ok(())
        })
        .await
    }

    async fn forget_record(&self, id: u64, remove_data: bool) {
        if let Err(e) = self.journal.remove(id).await {
            tracing::warn!(id, error = %e, "could not remove a journal record");
        }
        if remove_data {
            let _ = self.dir.staging(id).remove();
        }
    }

    /// Removes staging files that no replayed record names: changes that were never
    /// acknowledged, and versions superseded just before a crash. When the journal had damaged
    /// lines, a file may belong to one of them: those are kept aside as `<id>.orphan` instead.
    fn remove_unjournaled_staging(&self, kept: &HashSet<u64>, journal_damaged: bool) {
        let Ok((ids, _)) = self.dir.staging_ids() else {
            return;
        };
        for id in ids {
            self.bump_next_id(id);
            if kept.contains(&id) {
                continue;
            }
            let at = self.dir.staging(id);
            if journal_damaged {
                tracing::warn!(id, "a staging file no readable journal record names is kept aside as .orphan (the journal was damaged)");
                let _ = at.rename_to(&self.dir.staging_aside(id, "orphan"));
            } else {
                tracing::debug!(id, "removing a staging file no journal record needs");
                let _ = at.remove();
            }
        }
    }

    /// Starts removing temporary parts nobody needs, in the background, trying again with
    /// backoff while the bucket cannot be listed; a drain waits for it.
    pub fn start_orphan_cleanup(self: &std::sync::Arc<Self>) {
        self.cleanups
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let me = self.clone();
        tokio::spawn(async move {
            let mut wait = Duration::from_millis(200);
            for _ in 0..CLEANUP_ROUNDS {
                if me.remove_orphan_parts().await {
                    break;
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(30));
            }
            me.cleanups
                .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            me.settled.notify_waiters();
        });
    }

    /// Deletes temporary part objects nobody needs: this cache directory's unless a version
    /// pending now may use them, and other mounts' once they are old. Returns whether the
    /// whole listing was gone through.
    ///
    /// What is pending is looked at after each page is listed, so a part listed belongs to a
    /// version sealed before: pending still, it is kept; done with, its parts are garbage.
    /// Ids alone cannot tell old from new: after a power cut the ids of versions whose records
    /// were lost are handed out again, and their parts may still be in the bucket.
    pub async fn remove_orphan_parts(&self) -> bool {
        let root = self.cfg.upload.temp_prefix.clone();
        let own = format!("{root}{}/", self.dir.tag());
        let mut token = None;
        loop {
            let req = ListRequest {
                prefix: root.clone(),
                delimiter: None,
                page_token: token,
                max_results: Some(1000),
            };
            let page = match self.store.list(&req).await {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(error = %e, "could not list temporary parts to clean up");
                    return false;
                }
            };
            let live = self.live_versions().await;
            for o in &page.objects {
                let remove = match o.key.strip_prefix(&own) {
                    // A staging file still in use keeps the parts its pending version may use:
                    // those of its own upload, and those its progress lists (an earlier
                    // version's, appended to). An older version's are garbage.
                    Some(rest) => parse_id_seq(rest).is_none_or(|(id, seq)| {
                        live.get(&id).is_none_or(|keep| {
                            keep.seq != Some(seq) && !keep.parts.contains(&o.key)
                        })
                    }),
                    // Another mount's, once old; only names of our own form, so an object
                    // someone else put in the folder is never taken for a leftover.
                    None => {
                        o.key.strip_prefix(&root).is_some_and(is_part_name)
                            && SystemTime::now()
                                .duration_since(o.updated)
                                .is_ok_and(|age| age > FOREIGN_PARTS_AGE)
                    }
                };
                if !remove {
                    continue;
                }
                match self
                    .store
                    .delete(&o.key, Precondition::GenerationMatch(o.generation))
                    .await
                {
                    Ok(()) => tracing::info!(key = %o.key, "removed an orphaned temporary part"),
                    Err(e) => {
                        tracing::warn!(key = %o.key, error = %e, "could not delete an orphaned temporary part")
                    }
                }
            }
            token = page.next_page_token;
            if token.is_none() {
                return true;
            }
        }
    }

    /// The staging files live items still use, each with the parts its pending version may
    /// still upload or reuse.
    async fn live_versions(&self) -> HashMap<u64, KeepParts> {
        let items: Vec<_> = self.by_key.lock().values().cloned().collect();
        let mut live: HashMap<u64, KeepParts> = HashMap::new();
        for shared in items {
            let it = shared.item.lock().await;
            live.entry(it.work_id).or_default();
            if let Some(p) = &it.pending {
                let keep = live.entry(p.id).or_default();
                keep.seq = Some(p.seq);
                if let UploadState::Uploading { parts, .. } = &p.progress {
                    keep.parts.extend(parts.iter().map(|r| r.key.clone()));
                }
            }
        }
        live
    }
}

/// Whether `rest` (a key below the parts folder) has the form of a temporary part:
/// `<tag>/<id>/<seq>/<part>` (or an earlier version's `<tag>/<id>-<seq>/<part>`), tag and id
/// in hex (16 digits), and the part `NNNNN` or a compose level's `cL-NNNNN`.
fn is_part_name(rest: &str) -> bool {
    let hex16 = |s: &str| s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit());
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
    let pieces: Vec<&str> = rest.split('/').collect();
    let (tag, version, part) = match pieces.as_slice() {
        [tag, id, seq, part] if hex16(id) && digits(seq) => (*tag, true, *part),
        [tag, id_seq, part] => {
            let old = id_seq
                .split_once('-')
                .is_some_and(|(id, seq)| hex16(id) && hex(seq));
            (*tag, old, *part)
        }
        _ => return false,
    };
    let part_ok = digits(part)
        || part
            .strip_prefix('c')
            .and_then(|p| p.split_once('-'))
            .is_some_and(|(level, n)| digits(level) && digits(n));
    hex16(tag) && version && part_ok
}

/// What of a staging file still in use the start-up cleanup keeps: the parts of its pending
/// version's upload (`seq`), and the parts that version's progress lists.
#[derive(Default)]
struct KeepParts {
    seq: Option<u64>,
    parts: HashSet<String>,
}

/// The staging file id and version seq a part name starts with (`<id:016x>/<seq>/…`).
fn parse_id_seq(rest: &str) -> Option<(u64, u64)> {
    let mut pieces = rest.split('/');
    let id = u64::from_str_radix(pieces.next()?, 16).ok()?;
    let seq = pieces.next()?.parse().ok()?;
    Some((id, seq))
}

#[cfg(test)]
mod tests {
    use super::is_part_name;

    /// Start-up cleanup removes another mount's old parts only by their form: an object
    /// someone else put in the parts folder is never taken for one.
    #[test]
    fn only_names_of_our_own_form_are_parts() {
        for part in [
            "0123456789abcdef/0000000000000001/3/00000",
            "0123456789abcdef/0000000000000001/12/c1-00004",
            "0123456789abcdef/0000000000000001-1/00000",
            "0123456789abcdef/0000000000000001-00000000/00017",
        ] {
            assert!(is_part_name(part), "{part}");
        }
        for other in [
            "notes.txt",
            "0123456789abcdef/notes.txt",
            "0123456789abcdef/0000000000000001/3/report.pdf",
            "0123456789abcdef/0000000000000001/3/00000/x",
            "tag/0000000000000001/3/00000",
            "0123456789abcdef/01/3/00000",
            "",
        ] {
            assert!(!is_part_name(other), "{other}");
        }
    }
}
