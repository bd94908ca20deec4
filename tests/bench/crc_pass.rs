//! What one pass over a GiB costs this machine's CPU, for benchmarks: the floor under the
//! CRC32C pass that a version written through passthrough gets after its last release (the
//! daemon never saw its bytes, so it must read them back once).
//!
//!   crc-pass FILE    # FILE: 1 GiB or so, already in the page cache
//!
//! Prints CPU seconds per GiB (this process's user and system time) of: CRC32C over bytes
//! already in memory (a 64 MiB buffer, 16 times); a copy of the same; and the pass bucketdrive
//! makes (`fs_core::write::staging::crc32c_of_file`: `pread` in 1 MiB blocks, then CRC32C).
//! Each is the median of 5.

use std::time::Instant;

fn cpu_s() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut r) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(r.ru_utime) + t(r.ru_stime)
}

/// Median CPU seconds per GiB of `f`, which works through `bytes` bytes.
fn measure(bytes: u64, mut f: impl FnMut()) -> f64 {
    let mut v: Vec<f64> = (0..5)
        .map(|_| {
            let c = cpu_s();
            f();
            (cpu_s() - c) * (1u64 << 30) as f64 / bytes as f64
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[2]
}

fn main() -> anyhow::Result<()> {
    let path = std::env::args()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("usage: crc-pass FILE"))?;
    let file = std::fs::File::open(&path)?;
    let size = file.metadata()?.len();
    let buf: Vec<u8> = (0..64u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let mut dst = vec![0u8; buf.len()];
    let mem = buf.len() as u64 * 16;
    let started = Instant::now();
    let crc = measure(mem, || {
        let mut c = 0;
        for _ in 0..16 {
            c = crc32c::crc32c_append(c, std::hint::black_box(&buf));
        }
        std::hint::black_box(c);
    });
    let copy = measure(mem, || {
        for _ in 0..16 {
            dst.copy_from_slice(std::hint::black_box(&buf));
        }
        std::hint::black_box(&dst);
    });
    let pass = measure(size, || {
        std::hint::black_box(fs_core::write::staging::crc32c_of_file(&file, size).ok());
    });
    println!("CRC32C of bytes in memory: {crc:.3} CPU s per GiB");
    println!("a copy of bytes in memory: {copy:.3} CPU s per GiB");
    println!("the CRC32C pass over a file in the page cache (pread 1 MiB, CRC32C): {pass:.3} CPU s per GiB");
    eprintln!("({:.1} s)", started.elapsed().as_secs_f64());
    Ok(())
}
