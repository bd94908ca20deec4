//! The kernel's own cost of a read through FUSE, for benchmarks: a read-only FUSE server with
//! one file, `big`, whose bytes it answers from memory with nothing else to do.
//!
//! What a reader of it costs the server (CPU seconds per GiB) is the floor under any FUSE
//! daemon on this machine: reading each request off `/dev/fuse` and writing the reply back,
//! the kernel copying the bytes, and the wake-ups between the reader and the server. It is
//! tuned as bucketdrive's mounts are (1 MiB kernel read-ahead window per request, one session
//! thread), so `tests/bench/read_profile.sh` can print bucketdrive's CPU per GiB beside it.
//!
//!   fuse-floor MOUNTPOINT SIZE_MIB    # serves until unmounted
//!   fuse-floor --emit SIZE_MIB        # writes the file's bytes to standard output
//!
//! `FLOOR_PATTERN_MIB` (16 unless set) is how much memory the bytes repeat from: 16 MiB stays
//! in the CPU's caches, a pattern as big as the file does not (as bytes fetched ahead do not).
//! Three knobs make it more like bucketdrive, one at a time, to see what each costs:
//! `FLOOR_STAGED=1` (replies from parts another thread fills ahead, see [`Staged`]),
//! `FLOOR_BG=N` (N background requests, as bucketdrive's `MAX_BACKGROUND`) and `FLOOR_WBC=1`
//! (the kernel's write-back cache, which bucketdrive's default mounts ask for).

use std::ffi::OsStr;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, KernelConfig,
    LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyEntry, ReplyOpen, Request,
};

/// The pattern the file repeats, in MiB unless `FLOOR_PATTERN_MIB` says: pseudo-random bytes,
/// so nothing compresses or dedups, and a read of 1 MiB aligned never straddles two copies.
const PATTERN_MIB: usize = 16;
const FILE_INO: u64 = 2;
const TTL: Duration = Duration::from_secs(3600);

fn pattern() -> Vec<u8> {
    let mib = std::env::var("FLOOR_PATTERN_MIB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&m| m > 0)
        .unwrap_or(PATTERN_MIB);
    let len = mib << 20;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        // xorshift64: fixed, so --emit and the server agree.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v
}

struct Floor {
    bytes: Arc<Vec<u8>>,
    size: u64,
    staged: Option<Arc<Staged>>,
}

/// `FLOOR_STAGED=1`: the bytes are served as bucketdrive serves a read from the bucket, from
/// 8 MiB parts another thread copies into a ring of buffers ahead of the reader, instead of
/// from the one pattern. What that costs the kernel's copy of each reply, against the plain
/// floor, is the price of serving bytes another core wrote a moment before.
struct Staged {
    slots: Vec<parking_lot::RwLock<(u64, Vec<u8>)>>,
    /// The part the reader last asked for.
    reading: AtomicU64,
    /// How many parts are filled.
    filled: AtomicU64,
}

const PART: u64 = 8 << 20;
const SLOTS: u64 = 8;

impl Staged {
    fn start(bytes: Arc<Vec<u8>>, size: u64) -> Arc<Staged> {
        let st = Arc::new(Staged {
            slots: (0..SLOTS)
                .map(|_| parking_lot::RwLock::new((u64::MAX, vec![0u8; PART as usize])))
                .collect(),
            reading: AtomicU64::new(0),
            filled: AtomicU64::new(0),
        });
        let s = st.clone();
        std::thread::spawn(move || {
            let parts = size.div_ceil(PART);
            let mut p = 0;
            loop {
                if p >= parts {
                    // A second read starts over.
                    if s.reading.load(Ordering::Acquire) == 0 {
                        p = 0;
                        s.filled.store(0, Ordering::Release);
                    }
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
                if p >= s.reading.load(Ordering::Acquire) + SLOTS - 2 {
                    std::thread::sleep(Duration::from_micros(200));
                    continue;
                }
                let mut slot = s.slots[(p % SLOTS) as usize].write();
                let from = ((p * PART) % bytes.len() as u64) as usize;
                let len = PART.min(size - p * PART) as usize;
                slot.1[..len].copy_from_slice(&bytes[from..from + len]);
                slot.0 = p;
                drop(slot);
                p += 1;
                s.filled.store(p, Ordering::Release);
            }
        });
        st
    }

    /// Replies with `offset..end`, all within one part, once that part is filled.
    fn reply(&self, offset: u64, end: u64, reply: ReplyData) {
        let p = offset / PART;
        self.reading.store(p, Ordering::Release);
        while self.filled.load(Ordering::Acquire) <= p {
            std::thread::sleep(Duration::from_micros(50));
        }
        let slot = self.slots[(p % SLOTS) as usize].read();
        assert_eq!(slot.0, p, "the part the read needs is in its slot");
        let at = (offset - p * PART) as usize;
        reply.data(&slot.1[at..at + (end - offset) as usize]);
    }
}

impl Floor {
    fn attr(&self, ino: u64) -> FileAttr {
        let (kind, perm, size) = if ino == FILE_INO {
            (FileType::RegularFile, 0o444, self.size)
        } else {
            (FileType::Directory, 0o555, 0)
        };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind,
            perm,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }
}

impl Filesystem for Floor {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if let Err(max) = config.set_max_readahead(1 << 20) {
            let _ = config.set_max_readahead(max);
        }
        if let Some(v) = std::env::var("FLOOR_BG")
            .ok()
            .and_then(|v| v.parse::<u16>().ok())
        {
            let _ = config.set_max_background(v);
            let _ = config.set_congestion_threshold(v * 3 / 4);
        }
        if std::env::var_os("FLOOR_WBC").is_some() {
            let _ = config.add_capabilities(fuser::InitFlags::FUSE_WRITEBACK_CACHE);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent.0 == 1 && name == "big" {
            reply.entry(&TTL, &self.attr(FILE_INO), Generation(0));
        } else {
            reply.error(fuser::Errno::ENOENT);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        reply.attr(&TTL, &self.attr(ino.0));
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let end = (offset + u64::from(size)).min(self.size);
        if offset >= end {
            reply.data(&[]);
            return;
        }
        if let Some(st) = &self.staged {
            if offset / PART == (end - 1) / PART {
                st.reply(offset, end, reply);
                return;
            }
        }
        let pattern = self.bytes.len();
        let (from, len) = ((offset as usize) % pattern, (end - offset) as usize);
        if from + len <= pattern {
            reply.data(&self.bytes[from..from + len]);
        } else {
            let mut v = Vec::with_capacity(len);
            v.extend_from_slice(&self.bytes[from..]);
            v.extend_from_slice(&self.bytes[..len - (pattern - from)]);
            reply.data(&v);
        }
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mib = |s: &str| -> anyhow::Result<u64> { Ok(s.parse::<u64>()? << 20) };
    match args.as_slice() {
        [flag, size] if flag == "--emit" => {
            let (bytes, mut left) = (pattern(), mib(size)?);
            let mut out = std::io::stdout().lock();
            while left > 0 {
                let n = left.min(bytes.len() as u64) as usize;
                out.write_all(&bytes[..n])?;
                left -= n as u64;
            }
            Ok(())
        }
        [mountpoint, size] => {
            let (bytes, size) = (Arc::new(pattern()), mib(size)?);
            let staged =
                std::env::var_os("FLOOR_STAGED").map(|_| Staged::start(bytes.clone(), size));
            let fs = Floor {
                bytes,
                size,
                staged,
            };
            let mut config = fuser::Config::default();
            config.mount_options = vec![
                fuser::MountOption::RO,
                fuser::MountOption::FSName("fuse-floor".into()),
            ];
            fuser::mount(fs, mountpoint, &config)?;
            Ok(())
        }
        _ => anyhow::bail!("usage: fuse-floor MOUNTPOINT SIZE_MIB | fuse-floor --emit SIZE_MIB"),
    }
}
