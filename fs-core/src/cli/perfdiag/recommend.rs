//! Mount settings from measured figures: each recommendation is one rule on the measurements,
//! named after the `bucketdrive mount` flag it sets, so a user can paste the line.
//!
//! - `--read-concurrency`, `--upload-concurrency`: the knee of the ranged-read and the
//!   composite-write curve ([`Curve::knee`]). The read path may grow its concurrency on its
//!   own; the knee is still the right start and the point beyond which more buys little.
//! - `--read-part-size`: large enough that a part's first-byte wait is at most a tenth of its
//!   time: `part ≥ 9 × per-stream rate × p50 latency`, the per-stream rate being the rate at
//!   the knee divided by the knee.
//! - `--upload-part-size`: the same rule with twice the latency, since every part also costs a
//!   delete after the compose.
//! - `--single-shot-threshold`: a composite upload of two parts beats one request once the
//!   half of the transfer time it saves exceeds its extra round trips (the compose and a first
//!   byte): `size ≥ 2 × single-stream write rate × (compose time + p50 latency)`. And a file
//!   above the threshold must make at least two parts (a one-part composite upload is one
//!   request plus a compose), so the threshold is at least twice the upload part size.
//! - `--upload-files-concurrency`: the knee of the 10 KiB upload curve, which is what many
//!   small files uploading at once see.
//!
//! Sizes are rounded up to a power of two MiB and kept within bounds that make sense for a
//! mount; a figure that could not be measured leaves the mount's default.

use std::time::Duration;

use serde::Serialize;

use super::curve::Curve;
use super::runner::{percentile, Measurements};

const MIB: u64 = 1 << 20;

/// The mount's defaults (see `CommonArgs`), used where nothing was measured.
pub const DEFAULT_READ_CONCURRENCY: usize = 16;
pub const DEFAULT_READ_PART: u64 = 8 * MIB;
pub const DEFAULT_UPLOAD_CONCURRENCY: usize = 8;
pub const DEFAULT_UPLOAD_PART: u64 = 32 * MIB;
pub const DEFAULT_SINGLE_SHOT: u64 = 16 * MIB;
pub const DEFAULT_FILES_CONCURRENCY: usize = 32;

/// Settings for `bucketdrive mount`, sizes in bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Recommended {
    pub read_concurrency: usize,
    pub read_part_size: u64,
    pub upload_concurrency: usize,
    pub upload_part_size: u64,
    pub single_shot_threshold: u64,
    pub upload_files_concurrency: usize,
    /// The same as mount flags.
    pub flags: String,
}

/// Rounds `bytes` up to a power of two MiB within `lo..=hi`.
fn pow2_mib(bytes: f64, lo: u64, hi: u64) -> u64 {
    let mib = (bytes / MIB as f64).ceil().max(1.0) as u64;
    (mib.next_power_of_two() * MIB).clamp(lo, hi)
}

/// `8MiB`, `1GiB`: how the mount's size flags are written.
pub fn size_flag(bytes: u64) -> String {
    if bytes >= 1 << 30 && bytes.is_multiple_of(1 << 30) {
        format!("{}GiB", bytes >> 30)
    } else if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{}MiB", bytes / MIB)
    } else if bytes >= 1024 && bytes.is_multiple_of(1024) {
        format!("{}KiB", bytes / 1024)
    } else {
        bytes.to_string()
    }
}

/// Bytes per second of one stream at the knee of `curve` (in MB/s), if it has one.
fn per_stream_at_knee(curve: &Curve) -> Option<(usize, f64)> {
    let knee = curve.knee()?;
    Some((knee.concurrency, knee.rate * 1e6 / knee.concurrency as f64))
}

/// The part size for a per-stream rate (bytes/s) and a per-part overhead.
fn part_for(rate: f64, overhead: Duration, lo: u64, hi: u64) -> u64 {
    pow2_mib(9.0 * rate * overhead.as_secs_f64(), lo, hi)
}

pub fn recommend(m: &Measurements) -> Recommended {
    let mut sorted = m.latency.clone();
    sorted.sort();
    let p50 = percentile(&sorted, 0.5);

    let (read_concurrency, read_part_size) = match per_stream_at_knee(&m.read) {
        Some((knee, rate)) => (knee, part_for(rate, p50, 4 * MIB, 64 * MIB)),
        None => (DEFAULT_READ_CONCURRENCY, DEFAULT_READ_PART),
    };

    // The per-stream upload rate from the parts alone, at the knee of the whole curve.
    let write_knee = m.write.knee().map(|k| k.concurrency);
    let write_step = write_knee.and_then(|k| m.write_steps.iter().find(|s| s.concurrency == k));
    let (upload_concurrency, upload_part_size) = match write_step {
        Some(s) if s.parts > 0 => {
            let rate = s.upload_mbps() * 1e6 / s.concurrency as f64;
            (s.concurrency, part_for(rate, p50 * 2, 8 * MIB, 128 * MIB))
        }
        _ => (DEFAULT_UPLOAD_CONCURRENCY, DEFAULT_UPLOAD_PART),
    };

    let composes: Vec<Duration> = m
        .write_steps
        .iter()
        .filter(|s| s.parts > 0)
        .map(|s| s.compose)
        .collect();
    let single_shot_threshold = if composes.is_empty() || m.write_single.bytes == 0 {
        DEFAULT_SINGLE_SHOT
    } else {
        let compose = composes.iter().sum::<Duration>() / composes.len() as u32;
        let rate = m.write_single.mbps() * 1e6;
        let pays_off = 2.0 * rate * (compose + p50).as_secs_f64();
        pow2_mib(
            pays_off.max(2.0 * upload_part_size as f64),
            8 * MIB,
            256 * MIB,
        )
    };

    let upload_files_concurrency = m
        .small_upload
        .knee()
        .map_or(DEFAULT_FILES_CONCURRENCY, |k| k.concurrency);

    let flags = format!(
        "--read-concurrency {read_concurrency} --read-part-size {} \
         --upload-concurrency {upload_concurrency} --upload-part-size {} \
         --single-shot-threshold {} --upload-files-concurrency {upload_files_concurrency}",
        size_flag(read_part_size),
        size_flag(upload_part_size),
        size_flag(single_shot_threshold),
    );
    Recommended {
        read_concurrency,
        read_part_size,
        upload_concurrency,
        upload_part_size,
        single_shot_threshold,
        upload_files_concurrency,
        flags,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::perfdiag::curve::Stop;
    use crate::cli::perfdiag::runner::{SmallStep, Transfer, WriteStep};

    fn curve(points: &[(usize, f64)]) -> Curve {
        let mut c = Curve::default();
        for (k, r) in points {
            c.push(*k, *r);
        }
        c.stop = Stop::Flattened;
        c
    }

    /// A link like the benchmark's: 40 MB/s per connection, 20 ms to the first byte, about
    /// 300 MB/s in all, composes of 300 ms.
    fn shaped_link() -> Measurements {
        let ms = Duration::from_millis;
        let write_steps: Vec<WriteStep> = [(1, 40.0), (2, 80.0), (4, 160.0), (8, 290.0)]
            .iter()
            .chain(&[(16, 300.0), (32, 302.0)])
            .map(|&(c, upload_mbps)| {
                let bytes = 512_000_000u64;
                WriteStep {
                    concurrency: c,
                    parts: 61,
                    bytes,
                    upload: Duration::from_secs_f64(bytes as f64 / 1e6 / upload_mbps),
                    compose: ms(300),
                }
            })
            .collect();
        Measurements {
            latency: (0..100).map(|i| ms(20 + i % 3)).collect(),
            write_single: Transfer {
                bytes: 128 << 20,
                elapsed: Duration::from_secs_f64((128 << 20) as f64 / 40e6),
            },
            read_single: Transfer {
                bytes: 128 << 20,
                elapsed: Duration::from_secs_f64((128 << 20) as f64 / 40e6),
            },
            read: curve(&[
                (1, 39.0),
                (2, 78.0),
                (4, 150.0),
                (8, 283.0),
                (16, 300.0),
                (32, 305.0),
            ]),
            write: curve(
                &write_steps
                    .iter()
                    .map(|s| (s.concurrency, s.mbps()))
                    .collect::<Vec<_>>(),
            ),
            write_steps,
            small_upload: curve(&[(1, 45.0), (2, 90.0), (4, 180.0), (8, 350.0), (16, 700.0)]),
            small_download: curve(&[(1, 48.0)]),
            small_steps: vec![SmallStep {
                concurrency: 1,
                uploaded: 90,
                upload: Duration::from_secs(2),
                downloaded: 96,
                download: Duration::from_secs(2),
            }],
            elapsed: Duration::from_secs(100),
        }
    }

    #[test]
    fn a_shaped_link_gets_its_knees_and_parts_sized_to_its_latency() {
        let r = recommend(&shaped_link());
        assert_eq!(r.read_concurrency, 8);
        // 283/8 = 35 MB/s per stream × 20 ms × 9 = 6.4 MB: 8 MiB.
        assert_eq!(r.read_part_size, 8 * MIB);
        assert_eq!(r.upload_concurrency, 8);
        // 290/8 = 36 MB/s × 40 ms × 9 = 13 MB: 16 MiB.
        assert_eq!(r.upload_part_size, 16 * MIB);
        // 2 × 40 MB/s × 320 ms = 25.6 MB, but two parts need 32 MiB.
        assert_eq!(r.single_shot_threshold, 32 * MIB);
        // Still rising at 16: the knee is the last step.
        assert_eq!(r.upload_files_concurrency, 16);
        assert_eq!(
            r.flags,
            "--read-concurrency 8 --read-part-size 8MiB --upload-concurrency 8 \
             --upload-part-size 16MiB --single-shot-threshold 32MiB --upload-files-concurrency 16"
        );
    }

    #[test]
    fn a_far_link_gets_bigger_parts_and_a_slow_compose_a_higher_threshold() {
        let mut m = shaped_link();
        m.latency = vec![Duration::from_millis(150); 10];
        m.write_steps
            .iter_mut()
            .for_each(|s| s.compose = Duration::from_secs(2));
        let r = recommend(&m);
        // 35 MB/s × 150 ms × 9 = 48 MB: 64 MiB, the most a read part gets.
        assert_eq!(r.read_part_size, 64 * MIB);
        // 36 MB/s × 300 ms × 9 = 98 MB: 128 MiB.
        assert_eq!(r.upload_part_size, 128 * MIB);
        // 2 × 40 MB/s × 2.15 s = 172 MB, and two parts of 128 MiB: 256 MiB.
        assert_eq!(r.single_shot_threshold, 256 * MIB);
        // The knees did not move: the wait per request does not change where a link's total
        // is reached.
        assert_eq!((r.read_concurrency, r.upload_concurrency), (8, 8));
    }

    #[test]
    fn nothing_measured_leaves_the_mount_defaults() {
        let mut m = shaped_link();
        m.read = Curve::default();
        m.write = Curve::default();
        m.write_steps.clear();
        m.small_upload = Curve::default();
        let r = recommend(&m);
        assert_eq!(r.read_concurrency, DEFAULT_READ_CONCURRENCY);
        assert_eq!(r.read_part_size, DEFAULT_READ_PART);
        assert_eq!(r.upload_concurrency, DEFAULT_UPLOAD_CONCURRENCY);
        assert_eq!(r.upload_part_size, DEFAULT_UPLOAD_PART);
        assert_eq!(r.single_shot_threshold, DEFAULT_SINGLE_SHOT);
        assert_eq!(r.upload_files_concurrency, DEFAULT_FILES_CONCURRENCY);
    }

    #[test]
    fn size_flags_read_back_as_the_same_size() {
        for b in [
            4 * MIB,
            8 * MIB,
            256 * MIB,
            1 << 30,
            3 << 30,
            12_345,
            512 << 10,
            0,
        ] {
            assert_eq!(crate::config::parse_size(&size_flag(b)), Ok(b));
        }
        assert_eq!(size_flag(1 << 30), "1GiB");
        assert_eq!(size_flag(16 * MIB), "16MiB");
        assert_eq!(size_flag(512 << 10), "512KiB");
    }
}
