//! One cached object generation: its bytes in a data file, at their own offsets, and the
//! index of the blocks that are there in a file beside it.
//!
//! The object is cut into [`BLOCK`]-sized blocks (the last one shorter). A block's bytes sit
//! at the block's offset in the data file (`<name>.data`), so it is sparse: a block never
//! fetched takes no disk space, and a file holding every block is exactly the object, byte for
//! byte, no longer. That is what lets the kernel read it itself (FUSE passthrough: its reads
//! are not clamped to the object's size, so nothing may follow the data). The index file
//! (`<name>.index`) holds a 4 KiB header naming the object (bucket, key, generation, size,
//! CRC32C), then one 8-byte record per block: the CRC32C of the block's bytes and a check
//! value that ties the record to its block number and to this header. A record that is all
//! zeros (never written), torn, or copied from elsewhere fails its check and the block counts
//! as absent.
//!
//! Why per-block CRCs rather than an fsync'd journal: this is a cache. Nothing here is ever
//! the only copy, so nothing is synced. A block is written before its record, and every block
//! the mount reads back is checked against its record's CRC32C before it is served; a file
//! the kernel is to read itself is checked whole first ([`verify`]). A crash, a torn write, a
//! flipped bit, or the file changing under a reader can only make a block fail that check, and
//! a failed block is fetched again from the bucket: never served.
//!
//! [`BLOCK`] is 64 KiB because the reader aligns every request to 64 KiB
//! (`PrefetchConfig::align`): read-ahead parts and demand reads then cover whole blocks, so
//! everything fetched can be kept. The index costs 8 bytes per block (0.012%).
//!
//! The files' name is a hash of the object's identity ([`Identity::name`]), so a new
//! generation of an object never shares files with the old one, and the header is compared
//! whole before a file is trusted.

use std::fs::File;
use std::io;
use std::ops::Range;

use bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::platform::{self, At, Open};
use crate::store::ObjectMeta;

/// Bytes per block: the unit of presence, of the CRC check and of eviction accounting.
pub const BLOCK: u64 = 64 * 1024;
/// Disk allocation granularity assumed when charging bytes against the cap.
pub const PAGE: u64 = 4096;
const MAGIC: &[u8; 8] = b"BDRCACH2";
pub(super) const HEADER_LEN: u64 = 4096;
const RECORD_LEN: u64 = 8;
/// Blocks read and checked at a time on read-back (1 MiB).
const CHECK_CHUNK: u64 = 16;

/// Exactly one generation of one object: what a cache file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub bucket: String,
    pub key: String,
    pub generation: i64,
    pub size: u64,
    pub crc32c: Option<u32>,
    name: String,
    salt: u32,
}

impl Identity {
    /// The identity of `meta` in `bucket`; `None` for what is not cached: empty objects,
    /// objects without a generation (files being written), names too long for the header.
    pub fn new(bucket: &str, meta: &ObjectMeta) -> Option<Identity> {
        if meta.size == 0 || meta.generation <= 0 {
            return None;
        }
        let mut id = Identity {
            bucket: bucket.to_string(),
            key: meta.key.clone(),
            generation: meta.generation,
            size: meta.size,
            crc32c: meta.crc32c,
            name: String::new(),
            salt: 0,
        };
        let header = id.header()?;
        id.salt = crc32c::crc32c(&header);
        let mut h = Sha256::new();
        h.update(b"bucketdrive read cache v2\0");
        for part in [id.bucket.as_bytes(), id.key.as_bytes()] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part);
        }
        h.update(id.generation.to_le_bytes());
        h.update(id.size.to_le_bytes());
        h.update(id.crc32c.map_or([0u8; 5], |c| {
            let b = c.to_le_bytes();
            [1, b[0], b[1], b[2], b[3]]
        }));
        let digest = h.finalize();
        id.name = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        Some(id)
    }

    /// The file's name without its extension: 32 hex digits.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn blocks(&self) -> u64 {
        self.size.div_ceil(BLOCK)
    }

    /// The object bytes block `i` holds.
    pub fn block_range(&self, i: u64) -> Range<u64> {
        i * BLOCK..((i + 1) * BLOCK).min(self.size)
    }

    /// The blocks that cover `range` (which must lie inside the object).
    pub fn covering(&self, range: &Range<u64>) -> Range<u64> {
        range.start / BLOCK..range.end.div_ceil(BLOCK)
    }

    /// The blocks wholly inside `range`; the last block counts as whole when `range` reaches
    /// the object's end.
    pub fn inside(&self, range: &Range<u64>) -> Range<u64> {
        let first = range.start.div_ceil(BLOCK);
        let end = if range.end >= self.size {
            self.blocks()
        } else {
            range.end / BLOCK
        };
        first..end.max(first)
    }

    /// Disk bytes a present block is charged: its length rounded up to a page.
    pub fn block_charge(&self, i: u64) -> u64 {
        let r = self.block_range(i);
        (r.end - r.start).div_ceil(PAGE) * PAGE
    }

    /// Disk bytes charged for the header and every record, whether written yet or not.
    pub fn index_charge(&self) -> u64 {
        HEADER_LEN + (self.blocks() * RECORD_LEN).div_ceil(PAGE) * PAGE
    }

    /// Where block `i`'s record is in the index file.
    pub(super) fn record_at(&self, i: u64) -> u64 {
        HEADER_LEN + i * RECORD_LEN
    }

    /// The header bytes; `None` if the names do not fit.
    fn header(&self) -> Option<Vec<u8>> {
        let mut h = Vec::with_capacity(HEADER_LEN as usize);
        h.extend_from_slice(MAGIC);
        h.extend_from_slice(&(BLOCK as u32).to_le_bytes());
        h.extend_from_slice(&self.generation.to_le_bytes());
        h.extend_from_slice(&self.size.to_le_bytes());
        match self.crc32c {
            Some(c) => {
                h.push(1);
                h.extend_from_slice(&c.to_le_bytes());
            }
            None => h.extend_from_slice(&[0; 5]),
        }
        for part in [self.bucket.as_bytes(), self.key.as_bytes()] {
            h.extend_from_slice(&u16::try_from(part.len()).ok()?.to_le_bytes());
            h.extend_from_slice(part);
        }
        if h.len() as u64 > HEADER_LEN - 4 {
            return None;
        }
        h.resize(HEADER_LEN as usize - 4, 0);
        let crc = crc32c::crc32c(&h);
        h.extend_from_slice(&crc.to_le_bytes());
        Some(h)
    }

    fn record(&self, i: u64, crc: u32) -> [u8; RECORD_LEN as usize] {
        let check = self.record_check(i, crc);
        let mut r = [0u8; RECORD_LEN as usize];
        r[..4].copy_from_slice(&crc.to_le_bytes());
        r[4..].copy_from_slice(&check.to_le_bytes());
        r
    }

    fn record_check(&self, i: u64, crc: u32) -> u32 {
        let mut b = [0u8; 12];
        b[..8].copy_from_slice(&i.to_le_bytes());
        b[8..].copy_from_slice(&crc.to_le_bytes());
        // Inverted, so a record of zeros is never accidentally valid for a zero CRC.
        !crc32c::crc32c_append(self.salt, &b)
    }

    /// The CRC32C a valid record holds; `None` for a record that fails its check.
    fn parse_record(&self, i: u64, r: &[u8]) -> Option<u32> {
        let crc = u32::from_le_bytes(r.get(..4)?.try_into().ok()?);
        let check = u32::from_le_bytes(r.get(4..8)?.try_into().ok()?);
        (check == self.record_check(i, crc)).then_some(crc)
    }
}

pub use crate::platform::Stat;

/// Where one generation's two files are, in the held `objects/` directory.
#[derive(Debug, Clone)]
pub struct Paths {
    pub data: At,
    pub index: At,
}

/// One generation's two files, open.
#[derive(Debug)]
pub struct Files {
    pub data: File,
    pub index: File,
}

impl Paths {
    /// Opens both files for reading (never following a link in their place: [`At`]).
    pub fn open_read(&self) -> io::Result<Files> {
        Ok(Files {
            data: self.data.open(Open::new().read(true))?,
            index: self.index.open(Open::new().read(true))?,
        })
    }

    /// Opens both existing files for writing.
    pub fn open_write(&self) -> io::Result<Files> {
        Ok(Files {
            data: self.data.open(Open::new().write(true))?,
            index: self.index.open(Open::new().write(true))?,
        })
    }

    /// Creates (or empties) both files of `id`: the data file sparse, the index with its
    /// header.
    pub fn create(&self, id: &Identity) -> io::Result<Files> {
        let header = id
            .header()
            .ok_or_else(|| io::Error::other("object name too long for a cache header"))?;
        let how = Open::new().write(true).create(true).truncate(true);
        let data = self.data.open(how)?;
        platform::make_sparse(&data);
        let index = self.index.open(how)?;
        platform::write_all_at(&index, &header, 0)?;
        Ok(Files { data, index })
    }

    /// Removes both files (either may be missing).
    pub fn remove(&self) {
        let _ = self.data.remove();
        let _ = self.index.remove();
    }

    /// Renames both files to `to`'s names; fails if the data file is not there.
    pub fn rename_to(&self, to: &Paths) -> io::Result<()> {
        self.data.rename_to(&to.data)?;
        let _ = self.index.rename_to(&to.index);
        Ok(())
    }
}

/// Which blocks have a valid record in `index`: `None` when the index is not `id`'s (a header
/// that differs, is torn, or is missing), and the files should be discarded.
pub fn load(index: &File, id: &Identity) -> io::Result<Option<Vec<bool>>> {
    let Some(want) = id.header() else {
        return Ok(None);
    };
    let len = index.metadata()?.len();
    if len < HEADER_LEN {
        return Ok(None);
    }
    let mut header = vec![0u8; HEADER_LEN as usize];
    platform::read_exact_at(index, &mut header, 0)?;
    if header != want {
        return Ok(None);
    }
    // Records past the end of the file were never written.
    let records_at = id.record_at(0);
    let have = ((len - records_at) / RECORD_LEN).min(id.blocks());
    let mut buf = vec![0u8; (have * RECORD_LEN) as usize];
    platform::read_exact_at(index, &mut buf, records_at)?;
    let mut present = vec![false; id.blocks() as usize];
    for (i, r) in buf.chunks_exact(RECORD_LEN as usize).enumerate() {
        present[i] = id.parse_record(i as u64, r).is_some();
    }
    Ok(Some(present))
}

/// Writes whole blocks starting at block `first`: the bytes, then their records.
pub fn write_blocks(files: &Files, id: &Identity, first: u64, data: &[u8]) -> io::Result<()> {
    let start = id.block_range(first).start;
    platform::write_all_at(&files.data, data, start)?;
    let mut records = Vec::with_capacity(data.len().div_ceil(BLOCK as usize) * 8);
    for (n, chunk) in data.chunks(BLOCK as usize).enumerate() {
        records.extend_from_slice(&id.record(first + n as u64, crc32c::crc32c(chunk)));
    }
    platform::write_all_at(&files.index, &records, id.record_at(first))
}

/// Reads blocks `blocks` back and checks each against its record. `Err` lists the blocks
/// that failed (missing, torn or altered), which must not be served.
pub fn read_blocks(
    files: &Files,
    id: &Identity,
    blocks: Range<u64>,
) -> io::Result<Result<Bytes, Vec<u64>>> {
    let start = id.block_range(blocks.start).start;
    let end = id.block_range(blocks.end - 1).end;
    if files.index.metadata()?.len() < id.record_at(blocks.end)
        || files.data.metadata()?.len() < end
    {
        // Shorter than its blocks or their records: what is missing was never written.
        return Ok(Err(blocks.collect()));
    }
    let mut records = vec![0u8; ((blocks.end - blocks.start) * RECORD_LEN) as usize];
    platform::read_exact_at(&files.index, &mut records, id.record_at(blocks.start))?;
    let mut data = vec![0u8; (end - start) as usize];
    let mut bad = Vec::new();
    // A chunk at a time, each checked while it is still in the CPU's cache.
    let mut first = blocks.start;
    while first < blocks.end {
        let last = (first + CHECK_CHUNK).min(blocks.end);
        let (from, to) = (
            id.block_range(first).start - start,
            id.block_range(last - 1).end - start,
        );
        let chunk = &mut data[from as usize..to as usize];
        platform::read_exact_at(&files.data, chunk, start + from)?;
        for i in first..last {
            let range = id.block_range(i);
            let at = (range.start - start - from) as usize;
            let bytes = &chunk[at..at + (range.end - range.start) as usize];
            let n = ((i - blocks.start) * RECORD_LEN) as usize;
            let record = &records[n..n + RECORD_LEN as usize];
            if id.parse_record(i, record) != Some(crc32c::crc32c(bytes)) {
                bad.push(i);
            }
        }
        first = last;
    }
    Ok(if bad.is_empty() {
        Ok(Bytes::from(data))
    } else {
        Err(bad)
    })
}

/// Checks a whole generation before the kernel reads it itself (passthrough bypasses the
/// per-read check): every block against its record, and the data file exactly the object's
/// length. Returns the blocks that failed; none means the file is the object, byte for byte.
pub fn verify(files: &Files, id: &Identity) -> io::Result<Vec<u64>> {
    if files.data.metadata()?.len() != id.size {
        return Ok((0..id.blocks()).collect());
    }
    let mut bad = Vec::new();
    let mut first = 0;
    while first < id.blocks() {
        let last = (first + CHECK_CHUNK).min(id.blocks());
        if let Err(failed) = read_blocks(files, id, first..last)? {
            bad.extend(failed);
        }
        first = last;
    }
    Ok(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(size: u64, generation: i64) -> Identity {
        let meta = ObjectMeta {
            metadata_trimmed: false,
            key: "dir/obj".into(),
            generation,
            metageneration: 1,
            size,
            crc32c: Some(7),
            updated: std::time::SystemTime::UNIX_EPOCH,
            content_type: None,
            metadata: Default::default(),
        };
        Identity::new("bkt", &meta).unwrap()
    }

    #[test]
    fn names_differ_by_generation_and_are_stable() {
        assert_eq!(id(100, 1).name(), id(100, 1).name());
        assert_ne!(id(100, 1).name(), id(100, 2).name());
        assert_ne!(id(100, 1).name(), id(101, 1).name());
        assert_eq!(id(100, 1).name().len(), 32);
    }

    #[test]
    fn block_math() {
        let i = id(3 * BLOCK + 10, 1);
        assert_eq!(i.blocks(), 4);
        assert_eq!(i.block_range(3), 3 * BLOCK..3 * BLOCK + 10);
        assert_eq!(i.covering(&(10..BLOCK + 1)), 0..2);
        assert_eq!(i.inside(&(10..3 * BLOCK)), 1..3);
        assert_eq!(
            i.inside(&(BLOCK..i.size)),
            1..4,
            "the short last block is whole"
        );
        assert_eq!(i.inside(&(10..20)), 1..1);
        assert_eq!(i.block_charge(3), PAGE);
    }

    #[test]
    fn blocks_round_trip_and_a_flipped_bit_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        let held = platform::Dir::private(dir.path()).unwrap();
        let paths = Paths {
            data: held.at("f.data"),
            index: held.at("f.index"),
        };
        let i = id(3 * BLOCK + 10, 1);
        let data: Vec<u8> = (0..i.size).map(|n| (n % 251) as u8).collect();
        let f = paths.create(&i).unwrap();
        let r = paths.open_read().unwrap();
        assert_eq!(load(&r.index, &i).unwrap(), Some(vec![false; 4]));
        write_blocks(&f, &i, 1, &data[BLOCK as usize..]).unwrap();
        assert_eq!(
            load(&r.index, &i).unwrap(),
            Some(vec![false, true, true, true])
        );
        let got = read_blocks(&r, &i, 1..4).unwrap().unwrap();
        assert_eq!(&got[..], &data[BLOCK as usize..]);
        assert_eq!(read_blocks(&r, &i, 0..2).unwrap(), Err(vec![0]));
        assert_eq!(verify(&r, &i).unwrap(), vec![0], "block 0 is a hole");
        write_blocks(&f, &i, 0, &data[..BLOCK as usize]).unwrap();
        assert_eq!(verify(&r, &i).unwrap(), Vec::<u64>::new());
        // Whole: the data file is the object, byte for byte, and nothing more.
        assert_eq!(std::fs::read(paths.data.path()).unwrap(), data);
        platform::write_all_at(&f.data, &[0xff], 2 * BLOCK + 5).unwrap();
        assert_eq!(read_blocks(&r, &i, 1..4).unwrap(), Err(vec![2]));
        assert_eq!(verify(&r, &i).unwrap(), vec![2]);
        // Another generation's header makes the whole file foreign.
        assert_eq!(load(&r.index, &id(3 * BLOCK + 10, 2)).unwrap(), None);
    }
}
