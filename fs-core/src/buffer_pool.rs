//! Memory filled again and again: upload parts read off a staging file, write requests
//! copied out of the kernel's buffer, and ranges of objects read from the bucket.
//!
//! An upload reads each part (32 MiB by default) off the staging file into memory before it
//! sends it; a write request from the kernel (up to 1 MiB) is copied out of the FUSE
//! adapter's buffer before the engine writes it to the staging file. A buffer that size,
//! freshly allocated, is fresh memory: the kernel faults in and zeroes every page of it, and
//! only then are the bytes copied over the zeroes. Measured, that zeroing cost more CPU than
//! the read and the send together (`benchmarks.md`, "What the daemon spends on a GiB
//! written"); for write requests, a fifth of the daemon's CPU until `close()`; for reads from
//! the bucket (a part of 8 MiB collected from the HTTP body), a fifth of the daemon's CPU
//! per GiB read.
//!
//! So a buffer comes back here once every copy of its [`Bytes`] is dropped (the HTTP client's,
//! a retry's, the write's), and the next part or request is copied into it: no fault, no
//! zeroing (a buffer stays at its full length; shorter bytes use its front). A pool keeps at
//! most `cap` bytes, about what is in flight at once anyway; a buffer free for [`IDLE`] is let
//! go, so a mount doing nothing holds none of it; and small bytes never take a buffer many
//! times their size (a small file uploaded every few seconds would keep the big ones).

mod block;

use std::fs::File;
use std::ops::Range;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::time::Instant;

use block::Block;

/// How long a returned buffer waits to be used again before it is let go.
pub const IDLE: Duration = Duration::from_secs(5);

/// Buffers free to be filled again.
#[derive(Debug)]
pub struct BufferPool {
    cap: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Free buffers, each at its full length, with when it came back.
    free: Vec<(Block, Instant)>,
    /// Bytes of the buffers in `free`.
    bytes: usize,
    /// A task that lets go of idle buffers is running.
    trimming: bool,
}

/// Bytes at most this many times shorter than a free buffer are put in it.
const MAX_WASTE: usize = 4;

impl BufferPool {
    /// A pool keeping at most `cap` bytes of free buffers.
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(BufferPool {
            cap,
            state: Mutex::new(State::default()),
        })
    }

    /// Reads `range` of `file` into a buffer of the pool; the buffer comes back when the
    /// returned bytes (and every clone of them) are dropped. Blocking: call it off the
    /// runtime's worker threads.
    pub fn read_at(self: &Arc<Self>, file: &File, range: Range<u64>) -> std::io::Result<Bytes> {
        let len = usize::try_from(range.end - range.start)
            .map_err(|_| std::io::Error::other("part too large for memory"))?;
        let mut buf = self.take(len);
        crate::platform::read_exact_at(file, &mut buf[..len], range.start)?;
        Ok(Bytes::from_owner(Pooled {
            buf,
            len,
            pool: Arc::downgrade(self),
        }))
    }

    /// A copy of `data` in a buffer of the pool, which comes back when the returned bytes (and
    /// every clone of them) are dropped.
    pub fn copy_of(self: &Arc<Self>, data: &[u8]) -> Bytes {
        let mut buf = self.take(data.len());
        buf[..data.len()].copy_from_slice(data);
        Bytes::from_owner(Pooled {
            buf,
            len: data.len(),
            pool: Arc::downgrade(self),
        })
    }

    /// A buffer of the pool to be filled with exactly `len` bytes, piece by piece
    /// ([`Filling::push`]); one dropped unfinished comes back at once.
    pub fn filling(self: &Arc<Self>, len: usize) -> Filling {
        Filling {
            buf: self.take(len),
            want: len,
            len: 0,
            crc: None,
            pool: Arc::downgrade(self),
        }
    }

    /// The smallest free buffer that holds `len` bytes and is not many times longer, else a
    /// new one. Either is at least `len` long.
    fn take(&self, len: usize) -> Block {
        let mut s = self.state.lock();
        let best = (s.free.iter().enumerate())
            .filter(|(_, (b, _))| b.len() >= len && b.len() / MAX_WASTE <= len)
            .min_by_key(|(_, (b, _))| b.len())
            .map(|(i, _)| i);
        match best {
            Some(i) => {
                let (buf, _) = s.free.swap_remove(i);
                s.bytes -= buf.len();
                buf
            }
            // Zeroed by the kernel as it faults each page in, not by a pass of ours; in huge
            // pages where it has them (see `block`).
            None => Block::zeroed(len),
        }
    }

    fn give_back(self: &Arc<Self>, buf: Block) {
        let mut s = self.state.lock();
        if s.bytes + buf.len() > self.cap {
            drop(s);
            return;
        }
        s.bytes += buf.len();
        s.free.push((buf, Instant::now()));
        // Outside a runtime (a test's thread) nothing trims: the pool is dropped with it.
        if !s.trimming {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                s.trimming = true;
                rt.spawn(Self::trim(Arc::downgrade(self)));
            }
        }
    }

    /// Lets go of each buffer once it has been free for [`IDLE`]; ends when none is left.
    async fn trim(pool: Weak<Self>) {
        let mut wait = IDLE;
        loop {
            tokio::time::sleep(wait).await;
            let Some(pool) = pool.upgrade() else { return };
            let (old, done) = {
                let mut s = pool.state.lock();
                let (old, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut s.free)
                    .into_iter()
                    .partition(|(_, t)| t.elapsed() >= IDLE);
                s.bytes = keep.iter().map(|(b, _)| b.len()).sum();
                s.free = keep;
                let oldest = s.free.iter().map(|(_, t)| *t).min();
                if let Some(t) = oldest {
                    wait = IDLE.saturating_sub(t.elapsed());
                }
                s.trimming = oldest.is_some();
                (old, oldest.is_none())
            };
            // Freed outside the lock.
            drop(old);
            if done {
                return;
            }
        }
    }

    /// Bytes of free buffers held now.
    pub fn held(&self) -> usize {
        self.state.lock().bytes
    }
}

/// A buffer of the pool being filled ([`BufferPool::filling`]).
pub struct Filling {
    buf: Block,
    /// How many bytes it is to hold.
    want: usize,
    /// How many it holds: the front of `buf`.
    len: usize,
    /// CRC32C of the bytes it holds, carried on as each piece goes in, if asked for
    /// ([`Filling::with_crc32c`]).
    crc: Option<u32>,
    pool: Weak<BufferPool>,
}

impl Filling {
    /// Appends `data`; `false`, and nothing appended, if that would pass the length asked for.
    ///
    /// The CRC32C is carried on over the piece just copied, while it is still in the CPU's
    /// cache: a pass over the whole buffer later reads it back from memory, and on a machine
    /// whose memory bandwidth the reader, the kernel and the network already share, that
    /// costs about twice as much (`benchmarks.md`, "CRC32C as the bytes arrive").
    pub fn push(&mut self, data: &[u8]) -> bool {
        let end = self.len + data.len();
        if end > self.want {
            return false;
        }
        let dst = &mut self.buf[self.len..end];
        dst.copy_from_slice(data);
        if let Some(crc) = &mut self.crc {
            *crc = crc32c::crc32c_append(*crc, dst);
        }
        self.len = end;
        true
    }

    /// The rest of the buffer, to be received into directly (a socket's read, with no buffer
    /// of its own in between); then [`Filling::advance`] by what was received. Only the length
    /// asked for is offered, so a peer sending more cannot write past it.
    pub fn unfilled(&mut self) -> &mut [u8] {
        &mut self.buf[self.len..self.want]
    }

    /// Counts the first `n` bytes of [`Filling::unfilled`] as filled, carrying the CRC32C
    /// over them as [`Filling::push`] does (they were just written, so still in the cache).
    /// `n` past the rest of the buffer is a caller's bug: it is clamped.
    pub fn advance(&mut self, n: usize) {
        let end = self.len.saturating_add(n).min(self.want);
        if let Some(crc) = &mut self.crc {
            *crc = crc32c::crc32c_append(*crc, &self.buf[self.len..end]);
        }
        self.len = end;
    }

    /// How many more bytes it is to hold.
    pub fn remaining(&self) -> usize {
        self.want - self.len
    }

    /// Has [`Filling::push`] carry the CRC32C of what is pushed from now on (call it before
    /// the first push): only when something will check it, as a pass costs CPU.
    pub fn with_crc32c(mut self) -> Self {
        self.crc = Some(0);
        self
    }

    /// CRC32C of the bytes pushed so far, if asked for.
    pub fn crc32c(&self) -> Option<u32> {
        self.crc
    }

    /// How many bytes it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds nothing yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes pushed; the buffer comes back when they (and every clone) are dropped.
    pub fn freeze(mut self) -> Bytes {
        Bytes::from_owner(Pooled {
            buf: std::mem::take(&mut self.buf),
            len: self.len,
            pool: std::mem::take(&mut self.pool),
        })
    }
}

impl Drop for Filling {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.give_back(std::mem::take(&mut self.buf));
        }
    }
}

/// Bytes lent out of the pool until dropped.
struct Pooled {
    buf: Block,
    /// How many bytes: the front of `buf`.
    len: usize,
    pool: Weak<BufferPool>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.give_back(std::mem::take(&mut self.buf));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file(bytes: &[u8]) -> File {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(bytes).unwrap();
        f
    }

    /// Reads give the file's bytes, whatever a reused buffer held before, and a buffer comes
    /// back only once every clone of its bytes is gone.
    #[test]
    fn reuses_buffers_and_reads_exact_bytes() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + 3) as u8).collect();
        let f = file(&data);
        let pool = BufferPool::new(1 << 20);
        let a = pool.read_at(&f, 0..60_000).unwrap();
        let a2 = a.clone();
        drop(a);
        assert_eq!(pool.held(), 0, "a clone still holds the buffer");
        assert_eq!(&a2[..], &data[..60_000]);
        let ptr = a2.as_ptr();
        drop(a2);
        assert!(pool.held() >= 60_000);
        // A shorter part reuses the buffer; a longer one than any free gets a new one.
        let b = pool.read_at(&f, 50_000..90_000).unwrap();
        assert_eq!(b.as_ptr(), ptr);
        assert_eq!(&b[..], &data[50_000..90_000]);
        assert_eq!(pool.held(), 0);
        let c = pool.read_at(&f, 0..100_000).unwrap();
        assert_eq!(&c[..], &data[..]);
        drop(b);
        // A part many times shorter than every free buffer does not take one.
        let d = pool.read_at(&f, 0..100).unwrap();
        assert_ne!(d.as_ptr(), ptr);
        assert_eq!(&d[..], &data[..100]);
        // Reading past the end fails and keeps nothing back.
        assert!(pool.read_at(&f, 90_000..110_000).is_err());
    }

    /// A copy is the bytes given, in a buffer used again once the copy is dropped, whatever
    /// that buffer held before.
    #[test]
    fn copies_into_buffers_used_again() {
        let pool = BufferPool::new(4 << 20);
        let one = vec![1u8; 1 << 20];
        let a = pool.copy_of(&one);
        assert_eq!(&a[..], &one[..]);
        let ptr = a.as_ptr();
        drop(a);
        let two: Vec<u8> = (0..(700u32 << 10)).map(|i| (i % 251) as u8).collect();
        let b = pool.copy_of(&two);
        assert_eq!(b.as_ptr(), ptr, "the free buffer is used again");
        assert_eq!(&b[..], &two[..]);
        assert_eq!(pool.held(), 0);
    }

    /// The pool keeps no more than its cap.
    #[test]
    fn keeps_at_most_cap() {
        let f = file(&[5u8; 4096]);
        let pool = BufferPool::new(6000);
        let a = pool.read_at(&f, 0..4096).unwrap();
        let b = pool.read_at(&f, 0..4096).unwrap();
        drop(a);
        drop(b);
        assert!(pool.held() >= 4096 && pool.held() <= 6000);
    }

    /// A buffer free for IDLE is let go, even while others are in use.
    #[tokio::test(start_paused = true)]
    async fn lets_go_when_idle() {
        let f = file(&[9u8; 64 << 10]);
        let pool = BufferPool::new(1 << 20);
        drop(pool.read_at(&f, 0..(64 << 10)).unwrap());
        assert_eq!(pool.held(), 64 << 10);
        tokio::time::sleep(IDLE / 2).await;
        // A small part, taken and returned again and again, keeps only its own buffer.
        for _ in 0..4 {
            drop(pool.read_at(&f, 0..4096).unwrap());
            tokio::time::sleep(IDLE / 4).await;
        }
        assert_eq!(
            pool.held(),
            4096,
            "the big buffer went, the small one is in use"
        );
        tokio::time::sleep(IDLE * 2).await;
        assert_eq!(pool.held(), 0);
    }

    /// A buffer filled piece by piece holds exactly what was pushed, whatever it held before;
    /// one dropped unfinished comes back, and nothing past the length asked for goes in.
    #[test]
    fn fills_piece_by_piece() {
        let pool = BufferPool::new(1 << 20);
        let old = pool.copy_of(&[0xAB; 50_000]);
        drop(old);
        assert_eq!(pool.held(), 50_000);
        let mut f = pool.filling(40_000).with_crc32c();
        assert_eq!(pool.held(), 0, "the free buffer is reused");
        assert!(f.is_empty());
        let data: Vec<u8> = (0..40_000u32).map(|i| (i % 251) as u8).collect();
        assert!(f.push(&data[..12_345]));
        assert!(f.push(&data[12_345..]));
        assert!(!f.push(&[1]), "nothing past the length asked for");
        assert_eq!(f.len(), 40_000);
        assert_eq!(
            f.crc32c(),
            Some(crc32c::crc32c(&data)),
            "the CRC32C of every piece pushed"
        );
        let b = f.freeze();
        assert_eq!(&b[..], &data[..]);
        drop(b);
        assert_eq!(pool.held(), 50_000, "back once the bytes are dropped");
        let mut unfinished = pool.filling(30_000);
        assert!(unfinished.push(&data[..10]));
        assert_eq!(unfinished.crc32c(), None, "no CRC32C unless asked for");
        drop(unfinished);
        assert_eq!(
            pool.held(),
            50_000,
            "an unfinished fill gives its buffer back"
        );
    }

    /// Bytes received straight into the buffer count as pushed ones do: only the length asked
    /// for is offered, and the CRC32C covers what was advanced over, pushes mixed in.
    #[test]
    fn fills_by_receiving_into_the_rest() {
        let pool = BufferPool::new(1 << 20);
        drop(pool.copy_of(&[0xCD; 20_000]));
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 13 % 251) as u8).collect();
        let mut f = pool.filling(10_000).with_crc32c();
        assert!(f.push(&data[..100]));
        assert_eq!(f.unfilled().len(), 9_900, "only the length asked for");
        f.unfilled()[..4_000].copy_from_slice(&data[100..4_100]);
        f.advance(4_000);
        assert_eq!(f.remaining(), 5_900);
        f.unfilled().copy_from_slice(&data[4_100..]);
        f.advance(usize::MAX);
        assert_eq!(f.remaining(), 0, "advancing past the end is clamped");
        assert_eq!(f.crc32c(), Some(crc32c::crc32c(&data)));
        assert_eq!(&f.freeze()[..], &data[..]);
    }
}
