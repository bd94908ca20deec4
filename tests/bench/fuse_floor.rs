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

use std::ffi::OsStr;
use std::io::Write;
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
    bytes: Vec<u8>,
    size: u64,
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
            let fs = Floor {
                bytes: pattern(),
                size: mib(size)?,
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
