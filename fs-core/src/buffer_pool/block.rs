//! The memory behind one buffer of the pool, and how it is backed.
//!
//! A buffer the pool makes is fresh memory, and the kernel faults in and zeroes each page of it
//! at its first touch. With 4 KiB pages that is 2,048 faults for each 8 MiB part read from the
//! bucket, and a reader's window holds dozens of parts: measured on a 1 GiB read through a fresh
//! mount, about 80,000 faults, whose handling (not the zeroing, which any fresh memory costs)
//! took about a fifth of the daemon's CPU (`benchmarks.md`, "Huge pages for the pool's
//! buffers").
//!
//! So on Linux a buffer of at least [`HUGE`] bytes is its own mapping, its start aligned to
//! [`HUGE`] and marked for transparent huge pages (`MADV_HUGEPAGE`): one fault per 2 MiB. Only
//! whole aligned 2 MiB ranges of the mapping can be huge pages, so the part of a buffer past its
//! last such range (none, for the default 8 MiB parts) gets 4 KiB pages and costs no more memory
//! than its length. Where the kernel has no huge page to give, the same mapping gets 4 KiB pages;
//! with the kernel's default `defrag` setting (`madvise`) it first tries to compact memory for
//! one, which on a badly fragmented machine can make that first touch slower. Smaller buffers,
//! and every buffer off Linux, come from the heap. Either way the bytes start zeroed; a mapping
//! is unmapped when dropped, heap memory freed.

use std::ops::{Deref, DerefMut};

/// Buffers at least this long are mapped on their own, in huge pages where the kernel has them
/// (the size of a transparent huge page on x86-64, and on arm64 with 4 KiB pages; with other
/// page sizes the mapping simply gets no huge pages).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub const HUGE: usize = 2 << 20;

/// The bytes of one buffer: `len` of them, zeroed when made.
pub enum Block {
    Heap(Vec<u8>),
    #[cfg(target_os = "linux")]
    Mapped(huge::Mapping),
}

impl Block {
    /// A zeroed buffer of `len` bytes.
    pub fn zeroed(len: usize) -> Self {
        #[cfg(target_os = "linux")]
        if len >= HUGE {
            if let Some(m) = huge::Mapping::new(len) {
                return Block::Mapped(m);
            }
        }
        Block::Heap(vec![0; len])
    }

    /// Whether its memory is a mapping of its own (and so may be in huge pages).
    #[cfg(test)]
    pub fn is_mapped(&self) -> bool {
        !matches!(self, Block::Heap(_))
    }
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            Block::Heap(_) => "heap",
            #[cfg(target_os = "linux")]
            Block::Mapped(_) => "mapped",
        };
        write!(f, "Block({} bytes, {kind})", self.len())
    }
}

impl Default for Block {
    fn default() -> Self {
        Block::Heap(Vec::new())
    }
}

impl Deref for Block {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Block::Heap(v) => v,
            #[cfg(target_os = "linux")]
            Block::Mapped(m) => m.as_slice(),
        }
    }
}

impl DerefMut for Block {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            Block::Heap(v) => v,
            #[cfg(target_os = "linux")]
            Block::Mapped(m) => m.as_mut_slice(),
        }
    }
}

#[cfg(target_os = "linux")]
mod huge {
    use super::HUGE;
    use std::ptr::NonNull;

    /// An anonymous private mapping whose start is aligned to [`HUGE`], unmapped when dropped.
    pub struct Mapping {
        ptr: NonNull<u8>,
        /// Bytes handed out: the front of the mapping.
        len: usize,
        /// Bytes mapped: `len` rounded up to the page size.
        mapped: usize,
    }

    // SAFETY: the mapping is owned by this value alone, like a Vec's allocation.
    unsafe impl Send for Mapping {}
    // SAFETY: shared access only reads, through `&self`.
    unsafe impl Sync for Mapping {}

    /// The system's page size (4 KiB where it cannot be asked).
    fn page_size() -> usize {
        // SAFETY: sysconf reads a constant of the system.
        let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
    }

    impl Mapping {
        /// `None` when the system refuses the mapping (the caller falls back to the heap).
        pub fn new(len: usize) -> Option<Self> {
            let mapped = len.checked_next_multiple_of(page_size())?;
            // Map a huge page more than needed, then cut the mapping down to an aligned start:
            // mmap itself only aligns to a page, and a huge page can back only a 2 MiB range
            // that is aligned and wholly inside the mapping.
            let total = mapped.checked_add(HUGE)?;
            // SAFETY: a fresh anonymous mapping; no existing memory is touched.
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    total,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if base == libc::MAP_FAILED {
                return None;
            }
            let base_addr = base as usize;
            let start = base_addr.next_multiple_of(HUGE);
            let head = start - base_addr;
            let tail = total - head - mapped;
            // SAFETY: both ranges lie within the mapping just made and are not handed out; on
            // a failure (the process at its limit of mappings) the whole of it is unmapped.
            let trimmed = unsafe {
                (head == 0 || libc::munmap(base, head) == 0)
                    && (tail == 0 || libc::munmap((start + mapped) as *mut libc::c_void, tail) == 0)
            };
            if !trimmed {
                // SAFETY: as above; unmapping a range already unmapped is not an error.
                unsafe { libc::munmap(base, total) };
                return None;
            }
            // SAFETY: advice only, over the mapping kept. If the kernel does not take it (huge
            // pages off), the mapping gets pages of the usual size.
            unsafe { libc::madvise(start as *mut libc::c_void, mapped, libc::MADV_HUGEPAGE) };
            Some(Mapping {
                // Not null: within a mapping the kernel made at an address of its choosing.
                ptr: NonNull::new(start as *mut u8)?,
                len,
                mapped,
            })
        }

        pub fn as_slice(&self) -> &[u8] {
            // SAFETY: `len` bytes from `ptr` are mapped, readable and zero-initialised by the
            // kernel, and live as long as `self`.
            unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
        }

        pub fn as_mut_slice(&mut self) -> &mut [u8] {
            // SAFETY: as in `as_slice`, and `&mut self` makes the access exclusive.
            unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
        }
    }

    impl Drop for Mapping {
        fn drop(&mut self) {
            // SAFETY: the mapping made in `new`, no longer referenced.
            unsafe {
                libc::munmap(self.ptr.as_ptr().cast(), self.mapped);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer of any length starts zeroed, holds what is written to it to its last byte, and
    /// a big one is mapped on its own, aligned for huge pages.
    #[test]
    fn zeroed_writable_and_big_ones_aligned() {
        for len in [
            0,
            1,
            4096,
            HUGE - 1,
            HUGE,
            HUGE + 1,
            8 << 20,
            (8 << 20) + 12_345,
        ] {
            let mut b = Block::zeroed(len);
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x == 0), "{len} bytes start zeroed");
            for (i, x) in b.iter_mut().enumerate() {
                *x = (i % 251) as u8;
            }
            assert!(b.iter().enumerate().all(|(i, &x)| x == (i % 251) as u8));
            if cfg!(target_os = "linux") && len >= HUGE {
                assert!(b.is_mapped(), "{len} bytes are a mapping");
                assert_eq!(b.as_ptr() as usize % HUGE, 0, "aligned to a huge page");
            } else {
                assert!(!b.is_mapped(), "{len} bytes come from the heap");
            }
        }
    }
}
