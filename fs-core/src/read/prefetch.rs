//! Per-handle read-ahead: sequential detection, a growing window of parallel parts, in-order
//! delivery, and an end-to-end CRC32C check.
//!
//! A *part* is one ranged GET of the object. While the reader moves forward, the window (bytes
//! requested ahead of it) starts small, so a program that reads only a file's header pays for
//! little, and grows [`WINDOW_GROWTH`]-fold each time the reader finishes a part, up to
//! `part_size × (streams + 1)`; when the probe doubles the first level of streams (the reader
//! waited with all of them in flight: it is streaming), the window goes to its new maximum at
//! once.
//! Parts are fetched concurrently and handed out strictly in offset order. How many streams
//! (parts in flight) a reader uses is [`super::streams::Streams`]'s choice, within the
//! reader's fair share of the budget.
//!
//! A read inside the window is served from memory, including short hops forward and slightly
//! out-of-order kernel requests. Any other seek drops the window; reads then fetch only what is
//! asked (rounded to [`PrefetchConfig::align`]) until the reader is seen moving forward again.
//!
//! Every GET is pinned to the generation the handle opened, so a replaced object can never be
//! mixed with its successor: reads of a vanished generation fail with `Stale`. When the window
//! has covered the whole object in order, the CRC32C of the bytes is compared with the object's.
//!
//! Each read is counted once as a prefetch hit or miss ([`crate::metrics::prefetch`]) where its
//! source is decided: a hit when its bytes were already requested by the window (even if still
//! in flight) or held in the last demand block; a miss when a GET had to start for them.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::task::JoinHandle;

use super::budget::{ReadBudget, Reservation, Streaming};
use super::cache::{read_range, ObjectCache};
use super::streams::Streams;
use crate::error::{FsError, FsResult};
use crate::store::{ObjectMeta, ObjectStore, StoreError, StoreErrorKind, StoreResult};

/// How many times larger each part the reader finishes makes the window. Each step waits for a
/// part to come over the link (0.1 to 0.2 s for 4 to 8 MiB at 40 MB/s a stream), so doubling
/// from 1 MiB took 8 steps to reach 17 parts of 8 MiB, most of a second of a 1 GiB read spent
/// below the streams it was allowed (`benchmarks.md`, "The read ramp when the reader is not
/// the bound"); four-fold takes 4. A program that reads a file's first MiB and stops has then
/// fetched at most 6 MiB (4 MiB with doubling).
const WINDOW_GROWTH: u64 = 4;

/// Streams each of several readers streaming at once may always have, whatever their share of
/// the stream cap: where probing started before a single reader started higher, and the
/// number eight readers together fill a link with.
const SHARED_FLOOR: usize = 8;

/// Tuning of one reader.
#[derive(Debug, Clone, Copy)]
pub struct PrefetchConfig {
    /// Largest part (one ranged GET).
    pub part_size: u64,
    /// Parts in flight at once: the start of probing, or the fixed number.
    pub concurrency: usize,
    /// Most parts in flight once probing has raised the number; equal to `concurrency` for a
    /// fixed number.
    pub max_concurrency: usize,
    /// First window size after sequential access is detected.
    pub initial_window: u64,
    /// Random reads are widened to this alignment.
    pub align: u64,
    /// How far behind the newest read a request may land and still count as sequential: the
    /// kernel issues read-ahead requests concurrently, so they can arrive slightly out of order.
    pub slack: u64,
}

impl PrefetchConfig {
    /// A fixed `concurrency` parts in flight.
    pub fn new(part_size: u64, concurrency: usize) -> Self {
        Self::adaptive(part_size, concurrency, concurrency)
    }

    /// Starts at `start` parts in flight and probes for more, up to `cap`.
    pub fn adaptive(part_size: u64, start: usize, cap: usize) -> Self {
        let part_size = part_size.max(64 * 1024);
        PrefetchConfig {
            part_size,
            concurrency: start.max(1),
            max_concurrency: cap.max(start).max(1),
            initial_window: (1024 * 1024).min(part_size),
            align: 64 * 1024,
            slack: 4 * 1024 * 1024,
        }
    }

    fn streams(&self) -> Streams {
        if self.max_concurrency > self.concurrency {
            Streams::adaptive(self.concurrency, self.max_concurrency)
        } else {
            Streams::fixed(self.concurrency)
        }
    }
}

/// A fetch's bytes (with their CRC32C when computed as they arrived) and how long the
/// request took.
type Fetched = (StoreResult<(Bytes, Option<u32>)>, std::time::Duration);

enum PartState {
    Pending(JoinHandle<Fetched>),
    /// The part's bytes, and their CRC32C if it came with them: the whole-object check then
    /// combines it instead of reading the bytes again.
    Ready(Bytes, Option<u32>),
}

struct Part {
    start: u64,
    end: u64,
    state: PartState,
    /// The stream count when this part started, and whether that many were in flight.
    level: usize,
    full: bool,
    /// Budget held for this part, released when it is dropped.
    _reservation: Reservation,
}

impl Drop for Part {
    fn drop(&mut self) {
        if let PartState::Pending(h) = &self.state {
            h.abort();
        }
    }
}

/// What a reader has done; for tests, benchmarks and logs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReaderStats {
    pub parts: u64,
    pub demand_fetches: u64,
    pub window_resets: u64,
    pub crc_verified: bool,
    /// Most parts this reader has had in flight at once.
    pub peak_streams: usize,
}

/// Reads one generation of one object for one open handle.
pub struct Reader<S: ObjectStore> {
    store: Arc<S>,
    key: Arc<str>,
    generation: i64,
    size: u64,
    object_crc: Option<u32>,
    /// The disk read cache's view of this generation, if the mount has one.
    cache: Option<ObjectCache>,
    budget: ReadBudget,
    cfg: PrefetchConfig,
    /// How many parts to keep in flight.
    streams: Streams,
    /// This reader's place among the streaming readers, while it has a window.
    streaming: Option<Streaming>,
    /// Contiguous parts, ascending, ending at `next_fetch`.
    parts: VecDeque<Part>,
    next_fetch: u64,
    window: u64,
    /// End of the furthest read served so far.
    high_water: Option<u64>,
    /// Consecutive forward reads seen while not prefetching.
    streak: u32,
    /// End of the last part whose completion grew the window.
    grown_to: u64,
    /// Running CRC32C over bytes `0..next` fetched by the window, in order.
    crc: Option<(u64, u32)>,
    /// The last demand-fetched block, for repeated small reads.
    block: Option<(u64, Bytes)>,
    stats: ReaderStats,
}

/// The running CRC32C `(next, crc)` over the object's bytes `0..next`, carried over `bytes`
/// (the object's bytes from `start`, with their own CRC32C if it was computed as they
/// arrived) where they reach past `next`. Bytes starting after `next` leave it as it is.
fn fold_into(run: (u64, u32), start: u64, bytes: &[u8], bytes_crc: Option<u32>) -> (u64, u32) {
    let (next, crc) = run;
    let end = start + bytes.len() as u64;
    if start > next || end <= next {
        return run;
    }
    let crc = match bytes_crc {
        Some(c) if start == next => crc32c::crc32c_combine(crc, c, bytes.len()),
        _ => crc32c::crc32c_append(crc, &bytes[(next - start) as usize..]),
    };
    (end, crc)
}

impl<S: ObjectStore> Reader<S> {
    pub fn new(store: Arc<S>, meta: &ObjectMeta, budget: ReadBudget, cfg: PrefetchConfig) -> Self {
        Reader {
            store,
            key: Arc::from(meta.key.as_str()),
            generation: meta.generation,
            size: meta.size,
            object_crc: meta.crc32c,
            cache: None,
            budget,
            streams: cfg.streams(),
            streaming: None,
            cfg,
            parts: VecDeque::new(),
            next_fetch: 0,
            window: cfg.initial_window,
            high_water: None,
            streak: 0,
            grown_to: 0,
            crc: None,
            block: None,
            stats: ReaderStats::default(),
        }
    }

    /// Makes every GET of this reader, parts and demand reads alike, go through the disk read
    /// cache `cache` (the same generation as this reader's): served from disk when it holds
    /// the range, else fetched and offered to it.
    pub fn with_cache(mut self, cache: Option<ObjectCache>) -> Self {
        self.cache = cache;
        self
    }

    pub fn generation(&self) -> i64 {
        self.generation
    }

    /// The size of the generation it reads.
    pub fn object_size(&self) -> u64 {
        self.size
    }

    pub fn stats(&self) -> ReaderStats {
        self.stats
    }

    /// Parts to keep in flight now: the streams chosen, within this reader's fair share of the
    /// budget (which leaves room for the part being read).
    fn concurrency(&self) -> usize {
        self.streams.level().min(self.ceiling())
    }

    /// The most streams this reader may use now: its share of the budget (less the part being
    /// read), and its share of the stream cap among the readers streaming now (never below
    /// [`SHARED_FLOOR`], nor below a fixed number). Eight readers at once each stay at 8 rather
    /// than each probing up to the cap: together they already hold the link.
    fn ceiling(&self) -> usize {
        let share_parts = self.budget.fair_share() / self.cfg.part_size;
        let by_budget = usize::try_from(share_parts.saturating_sub(1).max(1)).unwrap_or(usize::MAX);
        let readers = usize::try_from(self.budget.streaming_readers().max(1)).unwrap_or(1);
        let floor = match self.cfg.max_concurrency > self.cfg.concurrency {
            true => self.cfg.concurrency.min(SHARED_FLOOR),
            false => self.cfg.concurrency,
        };
        let by_streams = (self.streams.cap() / readers).max(floor);
        by_budget.min(by_streams)
    }

    /// The window counts the part being read as well as those ahead of it, so one extra part
    /// keeps `concurrency` GETs in flight while the reader consumes the current one.
    fn max_window(&self) -> u64 {
        self.cfg.part_size * (self.concurrency() as u64 + 1)
    }

    /// Parts whose GET has not been taken in yet.
    fn in_flight(&self) -> usize {
        self.parts
            .iter()
            .filter(|p| matches!(p.state, PartState::Pending(_)))
            .count()
    }

    /// Bytes this reader holds in parts, reserved or not.
    pub fn held_bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.end - p.start).sum()
    }

    /// Reads up to `len` bytes at `offset`; fewer only at the end of the object.
    pub async fn read(&mut self, offset: u64, len: u32) -> FsResult<Bytes> {
        if offset >= self.size || len == 0 {
            return Ok(Bytes::new());
        }
        let end = (offset + u64::from(len)).min(self.size);
        let window_start = self.parts.front().map(|p| p.start);
        let in_window = matches!(window_start, Some(s) if offset >= s && offset <= self.next_fetch);
        let result = if in_window {
            self.read_window(offset, end).await
        } else if window_start.is_some_and(|s| offset < s && offset + self.cfg.slack >= s) {
            // A late, out-of-order request just behind the window: serve it without disturbing
            // the window.
            self.read_demand(offset, end).await
        } else if self.looks_sequential(offset) {
            self.reset_window(offset);
            self.read_window(offset, end).await
        } else {
            self.drop_window();
            self.read_demand(offset, end).await
        };
        if result.is_ok() {
            self.high_water = Some(self.high_water.map_or(end, |h| h.max(end)));
        }
        result
    }

    fn looks_sequential(&mut self, offset: u64) -> bool {
        match self.high_water {
            None if offset <= self.cfg.slack => true,
            Some(h) if offset <= h && offset + self.cfg.slack >= h => true,
            Some(h) if offset == h => {
                self.streak += 1;
                self.streak >= 2
            }
            _ => {
                self.streak = 0;
                false
            }
        }
    }

    fn drop_window(&mut self) {
        if !self.parts.is_empty() {
            self.stats.window_resets += 1;
        }
        self.parts.clear();
        self.window = self.cfg.initial_window;
        self.streaming = None;
    }

    fn reset_window(&mut self, offset: u64) {
        self.drop_window();
        self.streaming = Some(self.budget.join());
        let start = offset - offset % self.cfg.align;
        self.next_fetch = start;
        self.grown_to = start;
        self.streak = 0;
        // The whole-object check goes on when the new window starts within the bytes it has
        // covered (a window the budget refused, then granted again); else it can start only
        // from the first byte of an object that has a CRC32C.
        self.crc = match self.crc {
            Some(run) if start <= run.0 => Some(run),
            _ => (start == 0 && self.object_crc.is_some()).then_some((0, 0)),
        };
    }

    /// Starts parts until the window is full, the concurrency limit is reached, or the budget
    /// refuses. Returns false if a part covering bytes before `needed` did not fit the budget.
    fn top_up(&mut self, reader_at: u64, needed: u64) -> bool {
        let concurrency = self.concurrency();
        let window = self.window.min(self.max_window());
        while self.next_fetch < self.size {
            let ahead = self.next_fetch.saturating_sub(reader_at);
            let must = self.next_fetch < needed;
            let in_flight = self.in_flight();
            if !must && (ahead >= window || in_flight >= concurrency) {
                break;
            }
            let len = self
                .cfg
                .part_size
                .min(window)
                .min(self.size - self.next_fetch);
            match self.budget.try_reserve(len) {
                Some(r) => {
                    let full = in_flight + 1 >= self.streams.level();
                    self.spawn_part(self.next_fetch, self.next_fetch + len, r, full);
                    self.stats.peak_streams = self.stats.peak_streams.max(in_flight + 1);
                }
                None if must => return false,
                None => break,
            }
        }
        true
    }

    fn spawn_part(&mut self, start: u64, end: u64, reservation: Reservation, full: bool) {
        let store = self.store.clone();
        let key = self.key.clone();
        let generation = self.generation;
        let cache = self.cache.clone();
        // Each part's CRC32C as its bytes arrive, only while the whole-object check runs and
        // only for a part it will take whole (one starting before the bytes it covers, after
        // a window started within them, has only its tail hashed, in `fold_into`).
        let crc = self.crc.is_some_and(|(next, _)| start >= next);
        let handle = tokio::spawn(async move {
            let began = tokio::time::Instant::now();
            let got = read_range(
                store.as_ref(),
                cache.as_ref(),
                &key,
                generation,
                start..end,
                crc,
            )
            .await;
            (got, began.elapsed())
        });
        self.parts.push_back(Part {
            start,
            end,
            state: PartState::Pending(handle),
            level: self.streams.level(),
            full,
            _reservation: reservation,
        });
        self.next_fetch = end;
        self.stats.parts += 1;
    }

    async fn read_window(&mut self, offset: u64, end: u64) -> FsResult<Bytes> {
        // Forget parts the reader has moved well past.
        while let Some(p) = self.parts.front() {
            if p.end + self.cfg.slack > offset || p.end >= end {
                break;
            }
            if self.crc.is_some_and(|(next, _)| next < p.end) {
                self.crc = None; // skipped bytes were never checked
            }
            self.parts.pop_front();
        }
        // Each part the reader finishes grows the window, up to its maximum.
        let max_window = self.max_window();
        for p in &self.parts {
            if p.end <= end && p.end > self.grown_to {
                self.grown_to = p.end;
                self.window = (self.window * WINDOW_GROWTH).min(max_window);
            }
        }
        // Whether the window had requested all of this read before it came.
        let foreseen = self.next_fetch >= end;
        if !self.top_up(offset, end) {
            // Over budget: give this handle's memory back and fetch only what was asked. The
            // next forward read tries to build a window again.
            self.drop_window();
            return self.read_demand(offset, end).await;
        }
        crate::metrics::prefetch(foreseen);

        let mut out: Option<BytesMut> = None;
        let mut single: Option<Bytes> = None;
        for i in 0..self.parts.len() {
            let (start, stop) = (self.parts[i].start, self.parts[i].end);
            if stop <= offset || start >= end {
                continue;
            }
            let data = match self.ready(i).await {
                Ok(d) => d,
                Err(e) => {
                    self.drop_window();
                    return Err(self.map_err(e));
                }
            };
            let from = (offset.max(start) - start) as usize;
            let to = (end.min(stop) - start) as usize;
            let piece = data.slice(from..to);
            if single.is_none() && out.is_none() && end <= stop {
                single = Some(piece);
            } else {
                let buf =
                    out.get_or_insert_with(|| BytesMut::with_capacity((end - offset) as usize));
                if let Some(s) = single.take() {
                    buf.extend_from_slice(&s);
                }
                buf.extend_from_slice(&piece);
            }
        }
        self.fold_crc()?;
        // Keep the pipe full now that the reader has advanced.
        self.top_up(end, end);
        let data = match (single, out) {
            (Some(s), _) => s,
            (None, Some(b)) => b.freeze(),
            (None, None) => Bytes::new(),
        };
        if (data.len() as u64) != end - offset {
            return Err(FsError::Io(format!(
                "read of {} returned {} of {} bytes",
                self.key,
                data.len(),
                end - offset
            )));
        }
        Ok(data)
    }

    /// Waits for part `i` and returns its bytes. A wait (and how many parts were in flight
    /// then) and each part's timing feed the stream-count probe.
    async fn ready(&mut self, i: usize) -> StoreResult<Bytes> {
        let waits = matches!(&self.parts[i].state, PartState::Pending(h) if !h.is_finished());
        if waits {
            let in_flight = self.in_flight();
            let ceiling = self.ceiling();
            if let Some(now) = self.streams.waited_while_full(in_flight, ceiling) {
                tracing::debug!(key = %self.key, streams = now, "read streams changed");
                // A reader that kept the first level's whole window busy is streaming: the
                // doubled level's parts start now, not a window step later.
                self.window = self.max_window();
                self.top_up(self.parts[i].start, 0);
            }
        }
        let part = &mut self.parts[i];
        if let PartState::Pending(h) = &mut part.state {
            let (bytes, elapsed) = match h.await {
                Ok((r, elapsed)) => (r?, elapsed),
                Err(e) => {
                    return Err(StoreError::new(
                        StoreErrorKind::Other,
                        format!("part task failed: {e}"),
                    ))
                }
            };
            let (bytes, crc) = bytes;
            let (level, full, len) = (part.level, part.full, bytes.len() as u64);
            part.state = PartState::Ready(bytes, crc);
            let ceiling = self.ceiling();
            if let Some(now) = self.streams.record(level, full, len, elapsed, ceiling) {
                tracing::debug!(key = %self.key, streams = now, "read streams changed");
            }
        }
        let part = &self.parts[i];
        match &part.state {
            PartState::Ready(b, _) => Ok(b.clone()),
            PartState::Pending(_) => Err(StoreError::new(StoreErrorKind::Other, "part not ready")),
        }
    }

    /// Folds finished parts into the running CRC, in offset order, and checks the whole-object
    /// CRC once the reads have covered the object from its first byte to its last.
    fn fold_crc(&mut self) -> FsResult<()> {
        let Some(mut run) = self.crc else {
            return Ok(());
        };
        for p in &self.parts {
            if p.end <= run.0 {
                continue;
            }
            match &p.state {
                PartState::Ready(b, part_crc) if p.start <= run.0 => {
                    run = fold_into(run, p.start, b, *part_crc);
                }
                _ => break,
            }
        }
        self.crc = Some(run);
        self.check_crc()
    }

    /// Folds a demand-fetched block (the object's bytes from `start`) into the running CRC
    /// where it continues it: a reader the budget refused a window keeps its check going.
    fn fold_block(&mut self, start: u64, bytes: &[u8], block_crc: Option<u32>) -> FsResult<()> {
        self.crc = self.crc.map(|run| fold_into(run, start, bytes, block_crc));
        self.check_crc()
    }

    /// Checks the whole-object CRC once the running one has reached the object's last byte.
    fn check_crc(&mut self) -> FsResult<()> {
        let Some((next, crc)) = self.crc else {
            return Ok(());
        };
        if next == self.size {
            self.crc = None;
            if let Some(want) = self.object_crc {
                if want != crc {
                    tracing::error!(
                        key = %self.key,
                        generation = self.generation,
                        expected = format!("{want:08x}"),
                        actual = format!("{crc:08x}"),
                        "CRC32C mismatch: the bytes read do not match the object"
                    );
                    if let Some(c) = &self.cache {
                        c.forget();
                    }
                    self.drop_window();
                    return Err(FsError::Corrupt(format!(
                        "{} generation {}",
                        self.key, self.generation
                    )));
                }
                self.stats.crc_verified = true;
                tracing::debug!(key = %self.key, generation = self.generation, "whole-object CRC32C verified");
            }
        }
        Ok(())
    }

    /// Fetches exactly what is asked, widened to the alignment; no read-ahead.
    async fn read_demand(&mut self, offset: u64, end: u64) -> FsResult<Bytes> {
        if let Some((start, b)) = &self.block {
            if offset >= *start && end <= start + b.len() as u64 {
                crate::metrics::prefetch(true);
                return Ok(b.slice((offset - start) as usize..(end - start) as usize));
            }
        }
        crate::metrics::prefetch(false);
        let start = offset - offset % self.cfg.align;
        let stop = round_up(end, self.cfg.align).min(self.size);
        self.stats.demand_fetches += 1;
        // Its CRC32C as the bytes arrive when the block continues the whole-object check.
        let want_crc = self.crc.is_some_and(|(next, _)| next == start);
        let (data, crc) = read_range(
            self.store.as_ref(),
            self.cache.as_ref(),
            &self.key,
            self.generation,
            start..stop,
            want_crc,
        )
        .await
        .map_err(|e| self.map_err(e))?;
        self.fold_block(start, &data, crc)?;
        let out = data.slice((offset - start) as usize..(end - start) as usize);
        self.block = Some((start, data));
        Ok(out)
    }

    fn map_err(&self, e: StoreError) -> FsError {
        let err = FsError::from_pinned_read(e.clone());
        if err == FsError::Stale {
            tracing::warn!(key = %self.key, generation = self.generation, "generation vanished while open: the object was replaced or deleted");
        } else {
            tracing::error!(key = %self.key, error = %e, "read failed");
        }
        err
    }
}

fn round_up(n: u64, align: u64) -> u64 {
    n.div_ceil(align) * align
}

#[cfg(test)]
mod tests;
