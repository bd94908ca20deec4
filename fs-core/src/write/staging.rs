//! A staging file: the local copy of a file being written, on the cache disk.
//!
//! It is sparse: creating one costs nothing, whatever the file's size. It records which bytes
//! are really present (written by the user, or fetched from the bucket for a read or a partial
//! overwrite), so a hole is never mistaken for zeros, and fetched bytes never overwrite what the
//! user wrote. Files are created mode 0600.
//!
//! It also keeps the CRC32C of the runs of bytes written since they were last changed, merged
//! as they meet ([`CrcRuns`]), so the commit of a file written front to back (a copy, a
//! download, `dd`) needs no second pass over its bytes, even when the kernel's write-back
//! hands the pages over out of order (it sends up to 64 writes at once, and they are served
//! in parallel): for a 1 GiB file that pass took a second of the time `close()` took.
//!
//! A staging file keeps no descriptor while nobody uses it: [`StagingFile::close_fd`] drops it
//! and the next access reopens it by name in the held staging directory (never following a
//! link: [`platform::At`]), so a hundred thousand files waiting for upload cost no descriptors.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::ops::Range;

use super::ranges::RangeSet;
use crate::platform::{self, read_exact_at, start_writeback, write_all_at, At, Open};

/// The local copy of one file.
#[derive(Debug)]
pub struct StagingFile {
    at: At,
    /// Open while in use; reopened by name on demand.
    file: Option<File>,
    size: u64,
    present: RangeSet,
    /// CRC32C of the runs of bytes written (or fetched) and unchanged since.
    crcs: CrcRuns,
    /// Bytes written since the disk was last asked to start writing them back.
    unflushed: u64,
}

/// Every this many bytes written, the disk is asked to start writing them back, so the fsync at
/// `close()` finds little left to do instead of a whole file's worth.
const WRITEBACK_KICK: u64 = 16 << 20;

impl StagingFile {
    /// Creates a staging file for a file of `size` bytes, of which `present` are already valid
    /// locally (nothing, for a file that exists in the bucket; everything, for a new file).
    pub fn create(at: &At, size: u64, present: RangeSet) -> io::Result<Self> {
        let file = at.open(
            Open::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true),
        )?;
        Self::sized(at, file, size, present)
    }

    /// Like [`create`](Self::create), in an empty file of the [staging
    /// pool](super::staging_pool) whose name is durable: it must exist (a file made here would
    /// not have a durable name).
    pub fn open_pooled(at: &At, size: u64, present: RangeSet) -> io::Result<Self> {
        let file = at.open(Open::new().read(true).write(true))?;
        Self::sized(at, file, size, present)
    }

    /// Sizes a new staging file. An empty file is never truncated to empty: ext4 marks a
    /// file cut to nothing (`auto_da_alloc`, for programs that replace a file by truncating
    /// it) and then starts writing back all of its pages at the next close of any descriptor
    /// of it; for a file the kernel writes itself (passthrough) that close is the writer's
    /// own, which would wait for it.
    fn sized(at: &At, file: File, size: u64, present: RangeSet) -> io::Result<Self> {
        platform::make_sparse(&file);
        // Whatever it held goes (a new file's bytes are zeros, or the object's, fetched).
        let mut len = file.metadata()?.len();
        if len != 0 {
            at.freeing();
            file.set_len(0)?;
            len = 0;
        }
        if size != len {
            file.set_len(size)?;
        }
        Ok(StagingFile {
            at: at.clone(),
            file: Some(file),
            size,
            present,
            crcs: CrcRuns::default(),
            unflushed: 0,
        })
    }

    /// A complete staging file already on disk (left by an earlier run, or a copy), of `size`
    /// bytes. No descriptor is opened until it is used.
    pub fn open_complete(at: &At, size: u64) -> Self {
        StagingFile {
            at: at.clone(),
            file: None,
            size,
            present: RangeSet::full(0..size),
            crcs: CrcRuns::default(),
            unflushed: 0,
        }
    }

    /// A staging file already on disk, of `size` bytes of which `present` are valid (changes
    /// that were not saved, kept by the journal). No descriptor is opened until it is used.
    pub fn open_partial(at: &At, size: u64, present: RangeSet) -> Self {
        StagingFile {
            at: at.clone(),
            file: None,
            size,
            present,
            crcs: CrcRuns::default(),
            unflushed: 0,
        }
    }

    /// The same file with only `present` valid locally (a copy of a partial working copy),
    /// cut to its size.
    pub fn with_present(mut self, mut present: RangeSet) -> Self {
        present.truncate(self.size);
        self.present = present;
        self
    }

    /// The file, in the held staging directory.
    pub fn at(&self) -> &At {
        &self.at
    }

    /// Which bytes are valid locally.
    pub fn present(&self) -> &RangeSet {
        &self.present
    }

    /// The open descriptor, reopening the file if it was closed.
    fn fd(&mut self) -> io::Result<&File> {
        if self.file.is_none() {
            let f = self.at.open(Open::new().read(true).write(true))?;
            self.file = Some(f);
        }
        self.file
            .as_ref()
            .ok_or_else(|| io::Error::other("staging file not open"))
    }

    /// Closes the descriptor until the next access.
    pub fn close_fd(&mut self) {
        self.file = None;
    }

    /// Another descriptor on the same file, for work on the blocking pool (fsync, a CRC pass):
    /// it stays valid even if the staging file is removed meanwhile.
    pub fn clone_file(&mut self) -> io::Result<File> {
        self.fd()?.try_clone()
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Whether every byte of the file is present locally (it can be uploaded).
    pub fn is_complete(&self) -> bool {
        self.present.contains(&(0..self.size))
    }

    /// The parts of `range` (clipped to the file) that must be fetched before reading it.
    pub fn missing(&self, range: Range<u64>) -> Vec<Range<u64>> {
        let end = range.end.min(self.size);
        if range.start >= end {
            return Vec::new();
        }
        self.present.missing(range.start..end)
    }

    /// Writes user data. The file grows as needed; a gap it leaves reads as zeros, as on a disk.
    pub fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        // Forget the runs first: a write that fails part-way may still have changed some of
        // their bytes, and a run must never vouch for bytes it did not see.
        self.crcs.forget(offset, offset + data.len() as u64);
        if offset > self.size {
            // The hole must read as zeros, not as bytes left past the end.
            self.cut_tail()?;
        }
        write_all_at(self.fd()?, data, offset)?;
        self.track_crc(offset, data);
        self.unflushed += data.len() as u64;
        if self.unflushed >= WRITEBACK_KICK {
            self.unflushed = 0;
            start_writeback(self.fd()?);
        }
        let end = offset + data.len() as u64;
        if offset > self.size {
            // The hole between the old end and this write is zeros, not bucket data.
            self.present.insert(self.size..offset);
        }
        self.present.insert(offset..end);
        self.size = self.size.max(end);
        Ok(())
    }

    /// Stores bytes fetched from the bucket at `offset`, only where nothing is present yet, so a
    /// fetch that races a user write can never undo it.
    pub fn fill(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        let end = (offset + data.len() as u64).min(self.size);
        for gap in self.present.missing(offset..end) {
            let from = (gap.start - offset) as usize;
            let to = (gap.end - offset) as usize;
            self.crcs.forget(gap.start, gap.end);
            write_all_at(self.fd()?, &data[from..to], gap.start)?;
            self.track_crc(gap.start, &data[from..to]);
            self.present.insert(gap);
        }
        Ok(())
    }

    /// Reads bytes that are present. Callers fetch [`Self::missing`] ranges first.
    pub fn read_at(&mut self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let end = (offset + len as u64).min(self.size);
        if offset >= end {
            return Ok(Vec::new());
        }
        if !self.present.contains(&(offset..end)) {
            return Err(io::Error::other(
                "staging file read of bytes not present locally",
            ));
        }
        let mut buf = vec![0u8; (end - offset) as usize];
        read_exact_at(self.fd()?, &mut buf, offset)?;
        Ok(buf)
    }

    /// Whether the bytes at `offset` already equal `data` (where the file has them). The
    /// kernel writes back whole pages, so an append often rewrites the last page's head with
    /// the bytes it already holds; that is no change to what came before.
    pub fn holds(&mut self, offset: u64, data: &[u8]) -> io::Result<bool> {
        let end = (offset + data.len() as u64).min(self.size);
        if offset >= end {
            return Ok(true);
        }
        if !self.present.contains(&(offset..end)) {
            return Ok(false);
        }
        let have = self.read_at(offset, (end - offset) as usize)?;
        Ok(have[..] == data[..have.len()])
    }

    /// Shrinks or grows the file. Growth is zeros, present locally.
    pub fn truncate(&mut self, len: u64) -> io::Result<()> {
        if len > self.size {
            self.cut_tail()?;
        } else {
            self.at.freeing();
        }
        self.fd()?.set_len(len)?;
        self.crcs.truncate(len);
        if len > self.size {
            self.present.insert(self.size..len);
        } else {
            self.present.truncate(len);
        }
        self.size = len;
        Ok(())
    }

    /// The file was changed behind this value's back (the kernel wrote it itself): it is now
    /// `len` bytes, all present, their CRC32C unknown.
    pub fn adopt(&mut self, len: u64) {
        self.size = len;
        self.present = RangeSet::full(0..len);
        self.crcs = CrcRuns::default();
        self.unflushed = 0;
    }

    /// Cuts the file on disk to its size. Bytes past the end may be there (an append never
    /// acknowledged, kept by a replay that left the tail, or a write that failed part way), and
    /// growth must show zeros there, never them (I2).
    pub(super) fn cut_tail(&mut self) -> io::Result<()> {
        let size = self.size;
        if self.fd()?.metadata()?.len() > size {
            self.at.freeing();
            self.fd()?.set_len(size)?;
        }
        Ok(())
    }

    /// Records the CRC of bytes written at `offset`.
    fn track_crc(&mut self, offset: u64, data: &[u8]) {
        self.crcs.insert(offset, data);
    }

    /// The CRC32C of the whole file when it is known without reading it (every byte written
    /// once, in any order, and unchanged since).
    pub fn known_crc32c(&self) -> Option<u32> {
        self.crcs.whole(self.size)
    }

    /// Returns the CRC32C of the whole file, which must be complete, after making the data
    /// durable when `sync` (else a commit does, later: see [`super::commit`]). The fsync and
    /// any pass over the bytes run on the blocking pool.
    pub async fn seal(&mut self, sync: bool) -> io::Result<u32> {
        if !self.is_complete() {
            return Err(io::Error::other("staging file is not complete"));
        }
        let (size, known) = (self.size, self.known_crc32c());
        if let (false, Some(crc)) = (sync, known) {
            return Ok(crc);
        }
        let file = self.clone_file()?;
        let crc = platform::blocking(move || {
            if sync {
                file.sync_all()?;
            }
            match known {
                Some(crc) => Ok(crc),
                None => {
                    let crc = crc32c_of_file(&file, size)?;
                    // A page the disk failed to write back may have been read as the disk
                    // holds it: then the CRC32C is not of what was written.
                    platform::writeback_error(&file)?;
                    Ok(crc)
                }
            }
        })
        .await?;
        self.crcs.set_whole(size, crc);
        Ok(crc)
    }

    /// CRC32C of the whole file, reading it if need be; it must be complete.
    pub fn crc32c(&mut self) -> io::Result<u32> {
        if !self.is_complete() {
            return Err(io::Error::other("staging file is not complete"));
        }
        match self.known_crc32c() {
            Some(crc) => Ok(crc),
            None => {
                let size = self.size;
                crc32c_of_file(self.fd()?, size)
            }
        }
    }
}

/// The CRC32C of runs of a file's bytes: disjoint ranges, each with the CRC of its bytes, merged
/// with `crc32c_combine` when they meet. A write over a run drops the run (its bytes changed);
/// past [`CrcRuns::MAX`] runs (a random writer) only the run at offset 0 is kept, so the
/// tracking stays small and a commit falls back to one pass over the file.
#[derive(Debug, Default, Clone)]
pub struct CrcRuns {
    /// start -> (end, CRC32C of bytes start..end).
    runs: BTreeMap<u64, (u64, u32)>,
}

impl CrcRuns {
    const MAX: usize = 256;

    /// Bytes `data` now stand at `offset`.
    pub fn insert(&mut self, offset: u64, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let (mut start, mut end) = (offset, offset + data.len() as u64);
        self.forget(start, end);
        // Merge with the run ending where this one starts (an append: its CRC carries on
        // over the new bytes, where combining two CRCs would cost a pass of its own), and
        // the one starting where it ends.
        let before = self.runs.range(..start).next_back().map(|(&s, &r)| (s, r));
        let mut crc = match before {
            Some((s, (e, c))) if e == start => {
                self.runs.remove(&s);
                start = s;
                crc32c::crc32c_append(c, data)
            }
            _ => crc32c::crc32c(data),
        };
        if let Some(&(e, c)) = self.runs.get(&end) {
            self.runs.remove(&end);
            crc = crc32c::crc32c_combine(crc, c, (e - end) as usize);
            end = e;
        }
        self.runs.insert(start, (end, crc));
        if self.runs.len() > Self::MAX {
            self.runs.retain(|&s, _| s == 0);
        }
    }

    /// Drops every run with a byte in `start..end`: those bytes are about to change.
    pub fn forget(&mut self, start: u64, end: u64) {
        let hit: Vec<u64> = self
            .runs
            .range(..end)
            .rev()
            .take_while(|(_, &(e, _))| e > start)
            .map(|(&s, _)| s)
            .collect();
        // Runs are disjoint and sorted, so those ending after `start` are the last ones
        // starting before `end`; an earlier run that ends before `start` stops the scan.
        for s in hit {
            self.runs.remove(&s);
        }
    }

    /// The file is cut (or grown) to `len`: runs reaching past it are no longer whole.
    pub fn truncate(&mut self, len: u64) {
        self.forget(len, u64::MAX);
    }

    /// The CRC32C of bytes `0..size`, if one run holds them all.
    pub fn whole(&self, size: u64) -> Option<u32> {
        if size == 0 {
            return Some(0);
        }
        match self.runs.get(&0) {
            Some(&(end, crc)) if end == size => Some(crc),
            _ => None,
        }
    }

    /// Bytes `0..size` are known to have `crc` (computed by a pass over them).
    pub fn set_whole(&mut self, size: u64, crc: u32) {
        self.runs.clear();
        if size > 0 {
            self.runs.insert(0, (size, crc));
        }
    }
}

/// Copies the first `len` bytes of the complete staging file `from` to a new private file `to`
/// (copy-on-write of a version that must stay intact), returning the copy. Runs on the
/// blocking pool.
pub async fn copy_prefix(from: &At, to: &At, len: u64) -> io::Result<StagingFile> {
    let (from, dest) = (from.clone(), to.clone());
    platform::blocking(move || {
        let mut src = from.open(Open::new().read(true))?;
        let mut dst = dest.open(
            Open::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true),
        )?;
        let copied = io::copy(&mut io::Read::take(&mut src, len), &mut dst)?;
        if copied != len {
            return Err(io::Error::other("staging file shorter than its version"));
        }
        // A page the disk failed to write back may have been copied as the disk holds it.
        platform::writeback_error(&src)
    })
    .await?;
    Ok(StagingFile::open_complete(to, len))
}

/// CRC32C of the first `size` bytes of `file`, read in 1 MiB blocks.
pub fn crc32c_of_file(file: &File, size: u64) -> io::Result<u32> {
    let mut crc = 0u32;
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    while off < size {
        let n = ((size - off) as usize).min(buf.len());
        read_exact_at(file, &mut buf[..n], off)?;
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        off += n as u64;
    }
    Ok(crc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::Dir;

    /// The file `name` of the held directory `dir`.
    fn at(dir: &tempfile::TempDir, name: &str) -> At {
        Dir::private(dir.path()).unwrap().at(name)
    }

    /// A link planted where a staging file goes (to a file of root's, say) is never followed:
    /// the open fails, and the link's target is neither read nor emptied.
    #[cfg(unix)]
    #[test]
    fn a_link_in_place_of_a_staging_file_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("shadow");
        std::fs::write(&target, b"root:secret\n").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join("7.data")).unwrap();
        let planted = at(&dir, "7.data");
        let e = StagingFile::open_pooled(&planted, 10, RangeSet::new()).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        let e = StagingFile::create(&planted, 10, RangeSet::new()).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read(&target).unwrap(), b"root:secret\n");
    }

    /// The cache directory's ancestry: nobody but us and root may be able to swap what is in
    /// it, unless a directory is sticky.
    #[cfg(unix)]
    #[test]
    fn a_cache_directory_others_can_write_to_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let base = tempfile::tempdir().unwrap();
        let shared = base.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        let cache = shared.join("cache");
        std::fs::create_dir(&cache).unwrap();
        let mode = |p: &std::path::Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        mode(&shared, 0o777);
        let e = crate::platform::check_ancestry(&cache)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not sticky") && e.contains("shared"), "{e}");
        mode(&shared, 0o1777);
        crate::platform::check_ancestry(&cache).unwrap();
        mode(&shared, 0o755);
        crate::platform::check_ancestry(&cache).unwrap();
        // Group-writable by the user's own group (umask 002 systems): fine.
        mode(&shared, 0o775);
        crate::platform::check_ancestry(&cache).unwrap();
        // A link on the way, in a directory anyone can write to, could be repointed.
        let open = base.path().join("open");
        std::fs::create_dir(&open).unwrap();
        mode(&open, 0o777);
        let link = open.join("via");
        std::os::unix::fs::symlink(&shared, &link).unwrap();
        let e = crate::platform::check_ancestry(&link.join("cache"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("open"), "{e}");
        mode(&shared, 0o755);
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(&shared, Some(54321), None).unwrap();
            let e = crate::platform::check_ancestry(&cache)
                .unwrap_err()
                .to_string();
            assert!(e.contains("belongs to user 54321"), "{e}");
        }
    }

    #[test]
    fn sparse_fill_never_overwrites_user_bytes() {
        let dir = tempfile::tempdir().unwrap();
        // A 100-byte object of which nothing is local yet.
        let mut f = StagingFile::create(&at(&dir, "f.data"), 100, RangeSet::new()).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let p = dir.path().join("f.data");
            let mode = std::fs::metadata(&p).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert!(!f.is_complete());
        f.write_at(10, b"USER").unwrap();
        assert_eq!(f.missing(0..100), vec![0..10, 14..100]);
        assert!(f.read_at(0, 20).is_err(), "holes are not zeros");
        // The bucket's bytes arrive for the whole object; the user's write survives.
        f.fill(0, &[b'b'; 100]).unwrap();
        assert!(f.is_complete());
        let all = f.read_at(0, 100).unwrap();
        assert_eq!(&all[..10], &[b'b'; 10]);
        assert_eq!(&all[10..14], b"USER");
        assert_eq!(&all[14..], &[b'b'; 86][..]);
        assert_eq!(f.crc32c().unwrap(), crc32c::crc32c(&all));
    }

    /// A staging file longer than its version (an append never acknowledged, left by a replay)
    /// grows by zeros: the sim's seed 225 saw a truncate that grew a replayed file show the
    /// bytes of the lost append.
    #[test]
    fn growth_past_a_left_tail_is_zeros() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.data");
        std::fs::write(&p, [b'x'; 100]).unwrap();
        let mut f = StagingFile::open_complete(&at(&dir, "f.data"), 50);
        f.truncate(80).unwrap();
        assert_eq!(f.read_at(50, 30).unwrap(), vec![0u8; 30]);
        let mut g = StagingFile::open_complete(&at(&dir, "f.data"), 50);
        std::fs::write(&p, [b'y'; 100]).unwrap();
        g.write_at(90, b"END").unwrap();
        assert_eq!(g.read_at(50, 40).unwrap(), vec![0u8; 40]);
        assert_eq!(g.read_at(90, 3).unwrap(), b"END");
        let mut all = vec![b'y'; 50];
        all.extend([0u8; 40]);
        all.extend(b"END");
        assert_eq!(g.crc32c().unwrap(), crc32c::crc32c(&all));
    }

    proptest::proptest! {
        /// The CRC kept while writing equals a full pass over the file, whatever mix of
        /// in-order writes, rewrites, gaps and truncations made it.
        #[test]
        fn running_crc_equals_a_full_pass(ops in proptest::collection::vec(
            (0u8..4, 0u64..3000, 1usize..700), 1..40)) {
            let dir = tempfile::tempdir().unwrap();
            let mut f = StagingFile::create(&at(&dir, "c"), 0, RangeSet::new()).unwrap();
            let mut next = 0u64;
            for (i, (op, at, len)) in ops.into_iter().enumerate() {
                let data = vec![i as u8 ^ 0x5a; len];
                match op {
                    // Mostly in order, as a copy writes.
                    0 | 1 => {
                        f.write_at(next, &data).unwrap();
                        next += len as u64;
                    }
                    2 => f.write_at(at, &data).unwrap(),
                    _ => f.truncate(at).unwrap(),
                }
                next = next.min(f.size());
                let all = f.read_at(0, f.size() as usize).unwrap();
                let want = crc32c::crc32c(&all);
                if let Some(known) = f.known_crc32c() {
                    proptest::prop_assert_eq!(known, want);
                }
                proptest::prop_assert_eq!(f.crc32c().unwrap(), want);
            }
        }
    }

    /// The kernel's write-back hands a sequential file over out of order: the CRC is still
    /// known at the end without a pass over the file.
    #[test]
    fn out_of_order_writes_keep_the_crc_known() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = StagingFile::create(&at(&dir, "o"), 0, RangeSet::new()).unwrap();
        let chunk = 4096usize;
        let data: Vec<u8> = (0..chunk * 40).map(|i| (i * 7 + i / 13) as u8).collect();
        // Blocks in a scrambled order, each written once.
        let mut order: Vec<usize> = (0..40).collect();
        order.sort_by_key(|i| (i * 17) % 40);
        for i in order {
            f.write_at((i * chunk) as u64, &data[i * chunk..(i + 1) * chunk])
                .unwrap();
        }
        assert_eq!(f.known_crc32c(), Some(crc32c::crc32c(&data)));
        // A rewrite of changed bytes in the middle drops the knowledge; a pass still agrees.
        f.write_at(5000, b"changed").unwrap();
        assert_eq!(f.known_crc32c(), None);
        let all = f.read_at(0, data.len()).unwrap();
        assert_eq!(f.crc32c().unwrap(), crc32c::crc32c(&all));
    }

    #[test]
    fn growth_and_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = StagingFile::create(&at(&dir, "g"), 0, RangeSet::new()).unwrap();
        assert!(f.is_complete());
        f.write_at(5, b"xy").unwrap();
        assert_eq!(f.read_at(0, 10).unwrap(), b"\0\0\0\0\0xy");
        f.truncate(3).unwrap();
        assert_eq!(f.read_at(0, 10).unwrap(), b"\0\0\0");
        f.truncate(6).unwrap();
        assert_eq!(f.read_at(0, 10).unwrap(), b"\0\0\0\0\0\0");
        let crc = f.crc32c().unwrap();
        let mut again = StagingFile::open_complete(f.at(), 6);
        assert_eq!(again.size(), 6);
        assert!(again.is_complete());
        assert_eq!(again.crc32c().unwrap(), crc);
        assert!(again.holds(2, b"\0\0").unwrap());
        assert!(!again.holds(2, b"\0x").unwrap());
        assert!(again.holds(5, b"\0beyond the end").unwrap());
    }
}
