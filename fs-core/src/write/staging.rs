//! A staging file: the local copy of a file being written, on the cache disk.
//!
//! It is sparse: creating one costs nothing, whatever the file's size. It records which bytes
//! are really present (written by the user, or fetched from the bucket for a read or a partial
//! overwrite), so a hole is never mistaken for zeros, and fetched bytes never overwrite what the
//! user wrote. Files are created mode 0600.
//!
//! It also keeps the CRC32C of its longest prefix written in order, so the commit of a file
//! written front to back (a copy, a download, `dd`) needs no second pass over its bytes: for a
//! 1 GiB file that pass was a third of the time `close()` took.
//!
//! A staging file keeps no descriptor while nobody uses it: [`StagingFile::close_fd`] drops it
//! and the next access reopens it by path, so a hundred thousand files waiting for upload cost
//! no descriptors.

use std::fs::{File, OpenOptions};
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};

use super::ranges::RangeSet;
use crate::platform::{self, read_exact_at, start_writeback, write_all_at};

/// The local copy of one file.
#[derive(Debug)]
pub struct StagingFile {
    path: PathBuf,
    /// Open while in use; reopened by path on demand.
    file: Option<File>,
    size: u64,
    present: RangeSet,
    /// (n, CRC32C of bytes 0..n), while bytes 0..n are known and unchanged since.
    prefix_crc: Option<(u64, u32)>,
    /// Bytes written since the disk was last asked to start writing them back.
    unflushed: u64,
}

/// Every this many bytes written, the disk is asked to start writing them back, so the fsync at
/// `close()` finds little left to do instead of a whole file's worth.
const WRITEBACK_KICK: u64 = 16 << 20;

impl StagingFile {
    /// Creates a staging file for a file of `size` bytes, of which `present` are already valid
    /// locally (nothing, for a file that exists in the bucket; everything, for a new file).
    pub fn create(path: &Path, size: u64, present: RangeSet) -> io::Result<Self> {
        let file = platform::private_file(
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true),
        )
        .open(path)?;
        file.set_len(size)?;
        Ok(StagingFile {
            path: path.to_path_buf(),
            file: Some(file),
            size,
            present,
            prefix_crc: (size == 0).then_some((0, 0)),
            unflushed: 0,
        })
    }

    /// A complete staging file already on disk (left by an earlier run, or a copy), of `size`
    /// bytes. No descriptor is opened until it is used.
    pub fn open_complete(path: &Path, size: u64) -> Self {
        StagingFile {
            path: path.to_path_buf(),
            file: None,
            size,
            present: RangeSet::full(0..size),
            prefix_crc: (size == 0).then_some((0, 0)),
            unflushed: 0,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open descriptor, reopening the file if it was closed.
    fn fd(&mut self) -> io::Result<&File> {
        if self.file.is_none() {
            let f = OpenOptions::new().read(true).write(true).open(&self.path)?;
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
        self.fd()?.set_len(len)?;
        if self.prefix_crc.is_some_and(|(n, _)| len < n) {
            self.prefix_crc = None;
        }
        if len > self.size {
            self.present.insert(self.size..len);
        } else {
            self.present.truncate(len);
        }
        self.size = len;
        Ok(())
    }

    /// Extends the prefix CRC with bytes written at `offset`, or drops it if they change the
    /// prefix.
    fn track_crc(&mut self, offset: u64, data: &[u8]) {
        self.prefix_crc = match self.prefix_crc {
            Some((n, _)) if offset < n => None,
            Some((n, crc)) if offset == n => {
                Some((n + data.len() as u64, crc32c::crc32c_append(crc, data)))
            }
            other => other,
        };
    }

    /// The CRC32C of the whole file when it is known without reading it (written in order).
    pub fn known_crc32c(&self) -> Option<u32> {
        match self.prefix_crc {
            Some((n, crc)) if n == self.size => Some(crc),
            _ => None,
        }
    }

    /// Makes the data durable and returns the CRC32C of the whole file, which must be complete.
    /// The fsync and any pass over the bytes run on the blocking pool.
    pub async fn seal(&mut self) -> io::Result<u32> {
        if !self.is_complete() {
            return Err(io::Error::other("staging file is not complete"));
        }
        let file = self.clone_file()?;
        let (size, known) = (self.size, self.known_crc32c());
        let crc = platform::blocking(move || {
            file.sync_all()?;
            match known {
                Some(crc) => Ok(crc),
                None => crc32c_of_file(&file, size),
            }
        })
        .await?;
        self.prefix_crc = Some((size, crc));
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

/// Copies the first `len` bytes of the complete staging file at `from` to a new private file at
/// `to` (copy-on-write of a version that must stay intact), returning the copy. Runs on the
/// blocking pool.
pub async fn copy_prefix(from: &Path, to: &Path, len: u64) -> io::Result<StagingFile> {
    let (from, dest) = (from.to_path_buf(), to.to_path_buf());
    platform::blocking(move || {
        let mut src = File::open(&from)?;
        let mut dst = platform::private_file(
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true),
        )
        .open(&dest)?;
        let copied = io::copy(&mut io::Read::take(&mut src, len), &mut dst)?;
        if copied != len {
            return Err(io::Error::other("staging file shorter than its version"));
        }
        Ok(())
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
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn sparse_fill_never_overwrites_user_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.data");
        // A 100-byte object of which nothing is local yet.
        let mut f = StagingFile::create(&p, 100, RangeSet::new()).unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
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

    proptest::proptest! {
        /// The CRC kept while writing equals a full pass over the file, whatever mix of
        /// in-order writes, rewrites, gaps and truncations made it.
        #[test]
        fn running_crc_equals_a_full_pass(ops in proptest::collection::vec(
            (0u8..4, 0u64..3000, 1usize..700), 1..40)) {
            let dir = tempfile::tempdir().unwrap();
            let mut f = StagingFile::create(&dir.path().join("c"), 0, RangeSet::new()).unwrap();
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
                proptest::prop_assert_eq!(f.crc32c().unwrap(), crc32c::crc32c(&all));
            }
        }
    }

    #[test]
    fn growth_and_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = StagingFile::create(&dir.path().join("g"), 0, RangeSet::new()).unwrap();
        assert!(f.is_complete());
        f.write_at(5, b"xy").unwrap();
        assert_eq!(f.read_at(0, 10).unwrap(), b"\0\0\0\0\0xy");
        f.truncate(3).unwrap();
        assert_eq!(f.read_at(0, 10).unwrap(), b"\0\0\0");
        f.truncate(6).unwrap();
        assert_eq!(f.read_at(0, 10).unwrap(), b"\0\0\0\0\0\0");
        let crc = f.crc32c().unwrap();
        let mut again = StagingFile::open_complete(f.path(), 6);
        assert_eq!(again.size(), 6);
        assert!(again.is_complete());
        assert_eq!(again.crc32c().unwrap(), crc);
        assert!(again.holds(2, b"\0\0").unwrap());
        assert!(!again.holds(2, b"\0x").unwrap());
        assert!(again.holds(5, b"\0beyond the end").unwrap());
    }
}
