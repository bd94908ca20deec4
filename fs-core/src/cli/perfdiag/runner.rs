//! Running the plan against a bucket: every request `perfdiag` sends, and the clock around it.
//!
//! Generic over [`ObjectStore`], so the whole run is tested against the in-memory store; in
//! production every request goes through `GcsStore`, with its tracing spans and retries, as a
//! mount's would. The steps, in order:
//!
//! 1. **First-byte latency:** one 10 KiB object, read again and again, one GET at a time: the
//!    time from sending each GET to its first body bytes.
//! 2. **Single-stream write:** the test object in one request, as curl or a mount's
//!    single-shot upload sends it. A first 4 MiB object shows the rate, and the test object is
//!    as large as that rate fills in the rest of the step's time, at most `--object-size`.
//! 3. **Single-stream read:** one GET of the whole test object.
//! 4. **Ranged reads** at rising concurrency: that many workers GET `--part-size` ranges of
//!    the test object, each as soon as its last one ended. Bytes are counted as they arrive,
//!    up to the step's time or until the step's bytes are all asked for, so the figure is
//!    what came in while every worker was busy.
//! 5. **Composite writes** at rising concurrency: one parallel composite upload per step, as a
//!    mount makes them: parts of `--part-size` uploaded by that many workers, then composed
//!    (in a tree above 32 parts). The figure covers the parts and the compose.
//! 6. **10 KiB objects** at rising concurrency: uploads for half the step, then downloads of
//!    what was uploaded for the other half.
//!
//! Each ladder stops when it flattens ([`Curve::flattened`]) or its share of the time limit
//! is spent. Every name is recorded in [`Written`] before it is written, and each step deletes
//! its own objects before the next starts (untimed); whatever is left is for
//! [`super::cleanup::remove_all`].

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use parking_lot::Mutex;
use rand::RngCore;
use tokio::task::JoinSet;
use tokio::time::{timeout_at, Instant};

use super::cleanup::{self, Written};
use super::curve::{Curve, Stop};
use super::plan::{Plan, MAX_COMPOSE_SOURCES, PROBE_SIZE, SMALL_OBJECT_SIZE};
use crate::store::{
    ByteStream, ObjectMeta, ObjectStore, Precondition, StoreError, StoreErrorKind, StoreResult,
    WriteOptions,
};

const MIB: u64 = 1 << 20;

/// Told what the run is doing, for a progress bar.
pub trait Observer: Send + Sync {
    /// A step starts.
    fn start(&self, _label: &str) {}
    /// A step ended with this figure.
    fn finish(&self, _label: &str, _figure: &str) {}
    /// `n` planned steps will not run (a ladder flattened or ran out of time).
    fn skip(&self, _n: u64) {}
}

/// An observer that ignores everything.
pub struct Quiet;

impl Observer for Quiet {}

/// Bytes moved in a time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Transfer {
    pub bytes: u64,
    pub elapsed: Duration,
}

impl Transfer {
    /// MB/s (10^6 bytes per second, as link speeds and curl count).
    pub fn mbps(&self) -> f64 {
        mbps(self.bytes, self.elapsed)
    }
}

fn mbps(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / 1e6 / elapsed.as_secs_f64().max(1e-6)
}

fn per_s(count: usize, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64().max(1e-6)
}

/// One composite write step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WriteStep {
    pub concurrency: usize,
    pub parts: usize,
    pub bytes: u64,
    /// From the first part sent to the last part answered.
    pub upload: Duration,
    /// The composes that joined the parts into one object.
    pub compose: Duration,
}

impl WriteStep {
    /// Parts and compose together: what a composite upload of this size takes.
    pub fn mbps(&self) -> f64 {
        mbps(self.bytes, self.upload + self.compose)
    }

    /// The parts alone.
    pub fn upload_mbps(&self) -> f64 {
        mbps(self.bytes, self.upload)
    }
}

/// One small-object step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SmallStep {
    pub concurrency: usize,
    pub uploaded: usize,
    pub upload: Duration,
    pub downloaded: usize,
    pub download: Duration,
}

/// Everything a run measured.
#[derive(Debug, Clone)]
pub struct Measurements {
    /// First-byte times, in the order measured.
    pub latency: Vec<Duration>,
    pub write_single: Transfer,
    pub read_single: Transfer,
    /// Ranged reads, MB/s by concurrency.
    pub read: Curve,
    /// Composite writes, MB/s by concurrency (parts and compose).
    pub write: Curve,
    pub write_steps: Vec<WriteStep>,
    /// 10 KiB uploads per second by concurrency.
    pub small_upload: Curve,
    /// 10 KiB downloads per second by concurrency (the same steps as the uploads).
    pub small_download: Curve,
    pub small_steps: Vec<SmallStep>,
    pub elapsed: Duration,
}

impl Measurements {
    /// Whether a ladder was cut by the time limit rather than ending on its own.
    pub fn cut_short(&self) -> bool {
        [&self.read, &self.write, &self.small_upload]
            .iter()
            .any(|c| c.stop == Stop::TimeLimit)
    }
}

/// A one-line message for a failed request, saying what it was for.
pub fn describe(what: &str, e: &StoreError) -> String {
    match e.kind {
        StoreErrorKind::PermissionDenied => format!("{what}: access denied ({})", e.message),
        StoreErrorKind::NotFound => format!("{what}: not found ({})", e.message),
        _ => format!("{what}: {}", e.message),
    }
}

/// Runs a [`Plan`] under one temporary prefix.
pub struct Runner<S: ObjectStore> {
    store: Arc<S>,
    plan: Plan,
    written: Arc<Written>,
    /// Random bytes, as many as the largest object; every payload is a slice of them.
    data: Bytes,
}

impl<S: ObjectStore> Runner<S> {
    /// A runner writing under `written`'s root. The plan must have passed [`Plan::check`].
    pub fn new(store: Arc<S>, plan: Plan, written: Arc<Written>) -> Self {
        let len = plan.part_size.max(plan.object_size).max(SMALL_OBJECT_SIZE);
        // One random MiB, repeated: incompressible to anything on the way, and quick to make.
        let mut block = vec![0u8; 1 << 20];
        rand::thread_rng().fill_bytes(&mut block);
        let mut data = Vec::with_capacity(len as usize);
        while data.len() < len as usize {
            let n = block.len().min(len as usize - data.len());
            data.extend_from_slice(&block[..n]);
        }
        Runner {
            store,
            plan,
            written,
            data: Bytes::from(data),
        }
    }

    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.written.root())
    }

    /// Runs every step; the objects it leaves (on an error, or when cancelled) are recorded in
    /// `written` for the caller to delete.
    pub async fn run(&self, obs: &dyn Observer) -> Result<Measurements, String> {
        let started = Instant::now();
        let end = started + self.plan.time_limit;
        let latency = self.latency(obs, end).await?;
        let (object, write_single) = self.write_single(obs, end).await?;
        let read_single = self.read_single(&object, obs, end).await?;
        // Each ladder gets an equal share of the time left when it starts, so time a ladder
        // does not use goes to the next.
        let share = |ladders_left: u32| {
            let now = Instant::now();
            now + end.saturating_duration_since(now) / ladders_left
        };
        let object = &object;
        let (read, _) = self
            .climb("ranged read", "MB/s", share(3), obs, |c, until, _| {
                self.read_step(object, c, until)
            })
            .await?;
        let (write, write_steps) = self
            .climb(
                "composite write",
                "MB/s",
                share(2),
                obs,
                |c, until, hard| self.write_step(c, until, hard),
            )
            .await?;
        let (small_upload, small_steps) = self
            .climb(
                "10 KiB objects",
                "uploads/s",
                share(1),
                obs,
                |c, until, hard| self.small_step(c, until, hard),
            )
            .await?;
        let small_download = Curve {
            points: small_steps
                .iter()
                .map(|s| super::curve::Point {
                    concurrency: s.concurrency,
                    rate: per_s(s.downloaded, s.download),
                })
                .collect(),
            stop: small_upload.stop,
        };
        Ok(Measurements {
            latency,
            write_single,
            read_single,
            read,
            write,
            write_steps,
            small_upload,
            small_download,
            small_steps,
            elapsed: started.elapsed(),
        })
    }

    /// Runs `step` at each concurrency of the ladder until the curve flattens, the ladder
    /// ends, or `end` is near. `step` gets the concurrency, the time by which it should stop
    /// starting work, and the time by which everything must have stopped; it returns the
    /// step's figure and its details.
    async fn climb<T, F, Fut>(
        &self,
        label: &str,
        unit: &str,
        end: Instant,
        obs: &dyn Observer,
        mut step: F,
    ) -> Result<(Curve, Vec<T>), String>
    where
        F: FnMut(usize, Instant, Instant) -> Fut,
        Fut: Future<Output = Result<(f64, T), String>>,
    {
        let ladder = self.plan.ladder();
        let mut curve = Curve::default();
        let mut details = Vec::new();
        for (i, &c) in ladder.iter().enumerate() {
            let now = Instant::now();
            let left = (ladder.len() - i) as u64;
            // With less than half a step left, a step would mostly measure its own start.
            if end.saturating_duration_since(now) < self.plan.step_time / 2 {
                curve.stop = Stop::TimeLimit;
                obs.skip(left);
                return Ok((curve, details));
            }
            let name = format!("{label} ×{c}");
            obs.start(&name);
            let until = (now + self.plan.step_time).min(end);
            let (rate, detail) = step(c, until, end).await?;
            curve.push(c, rate);
            details.push(detail);
            obs.finish(&name, &format!("{rate:.1} {unit}"));
            if rate <= 0.0 {
                // Nothing finished in the step's time: the next step would fare no better.
                curve.stop = Stop::TimeLimit;
                obs.skip(left - 1);
                return Ok((curve, details));
            }
            if curve.flattened() {
                curve.stop = Stop::Flattened;
                obs.skip(left - 1);
                return Ok((curve, details));
            }
        }
        curve.stop = Stop::MaxConcurrency;
        Ok((curve, details))
    }

    /// First-byte times of small GETs, one at a time.
    pub(super) async fn latency(
        &self,
        obs: &dyn Observer,
        end: Instant,
    ) -> Result<Vec<Duration>, String> {
        const LABEL: &str = "first-byte latency";
        obs.start(LABEL);
        let key = self.key("latency");
        self.written.add(&key);
        let meta = self
            .store
            .put(
                &key,
                self.data.slice(..SMALL_OBJECT_SIZE as usize),
                Precondition::None,
                &WriteOptions::default(),
            )
            .await
            .map_err(|e| describe("writing a test object", &e))?;
        let until = (Instant::now() + self.plan.single_time()).min(end);
        let mut samples = Vec::with_capacity(self.plan.latency_samples);
        while samples.is_empty()
            || (samples.len() < self.plan.latency_samples && Instant::now() < until)
        {
            let sent = Instant::now();
            let first = async {
                let mut stream = self
                    .store
                    .get_range(&key, meta.generation, 0..meta.size)
                    .await?;
                let first = stream.next().await.transpose()?;
                let ttfb = sent.elapsed();
                if first.is_some() {
                    while let Some(chunk) = stream.next().await {
                        chunk?;
                    }
                }
                Ok::<_, StoreError>(ttfb)
            };
            samples.push(
                first
                    .await
                    .map_err(|e| describe("reading a test object", &e))?,
            );
        }
        let mut sorted = samples.clone();
        sorted.sort();
        obs.finish(
            LABEL,
            &format!(
                "p50 {:.1} ms",
                percentile(&sorted, 0.5).as_secs_f64() * 1000.0
            ),
        );
        Ok(samples)
    }

    /// Writes the test object in one request, as large as fits in the step's time at the rate
    /// a first, smaller request showed.
    pub(super) async fn write_single(
        &self,
        obs: &dyn Observer,
        end: Instant,
    ) -> Result<(ObjectMeta, Transfer), String> {
        const LABEL: &str = "single-stream write";
        obs.start(LABEL);
        let fail = |e: StoreError| describe("writing the test object", &e);
        let until = (Instant::now() + self.plan.single_time()).min(end);
        let probe_size = PROBE_SIZE.min(self.plan.object_size);
        let probe = self
            .put_timed("object-probe", probe_size)
            .await
            .map_err(fail)?;
        let rate = probe.1.bytes as f64 / probe.1.elapsed.as_secs_f64().max(1e-6);
        let left = until.saturating_duration_since(Instant::now());
        let fits = ((rate * left.as_secs_f64()) as u64 / MIB * MIB).min(self.plan.object_size);
        let (meta, t) = if fits > probe_size {
            let object = self.put_timed("object", fits).await.map_err(fail)?;
            cleanup::delete(&*self.store, &self.written, vec![probe.0.key]).await;
            object
        } else {
            probe
        };
        obs.finish(LABEL, &format!("{:.1} MB/s", t.mbps()));
        Ok((meta, t))
    }

    /// One put of `size` bytes under `name`, timed.
    async fn put_timed(&self, name: &str, size: u64) -> StoreResult<(ObjectMeta, Transfer)> {
        let key = self.key(name);
        self.written.add(&key);
        let start = Instant::now();
        let meta = self
            .store
            .put(
                &key,
                self.data.slice(..size as usize),
                Precondition::None,
                &WriteOptions::default(),
            )
            .await?;
        let t = Transfer {
            bytes: size,
            elapsed: start.elapsed(),
        };
        Ok((meta, t))
    }

    /// One GET of the whole test object.
    pub(super) async fn read_single(
        &self,
        object: &ObjectMeta,
        obs: &dyn Observer,
        end: Instant,
    ) -> Result<Transfer, String> {
        const LABEL: &str = "single-stream read";
        obs.start(LABEL);
        let until = (Instant::now() + self.plan.single_time()).min(end);
        let bytes = AtomicU64::new(0);
        let start = Instant::now();
        let read = async {
            let stream = self
                .store
                .get_range(&object.key, object.generation, 0..object.size)
                .await?;
            drain(stream, until, &bytes).await
        };
        if let Ok(r) = timeout_at(until, read).await {
            r.map_err(|e| describe("reading the test object", &e))?;
        }
        let t = Transfer {
            bytes: bytes.load(Ordering::SeqCst),
            elapsed: Instant::now().min(until) - start,
        };
        obs.finish(LABEL, &format!("{:.1} MB/s", t.mbps()));
        Ok(t)
    }

    /// `c` workers reading ranges of the test object until `until` or the step's bytes. The
    /// figure covers the time while every worker was busy: it ends at `until`, or when the
    /// first worker finds the bytes used up (the ranges still arriving then are its tail,
    /// with fewer streams at work, and are not counted).
    pub(super) async fn read_step(
        &self,
        object: &ObjectMeta,
        c: usize,
        until: Instant,
    ) -> Result<(f64, ()), String> {
        let part = self.plan.part_size.min(object.size).max(1);
        let slots = (object.size / part).max(1);
        let budget = self.plan.step_bytes;
        let next = Arc::new(AtomicU64::new(0));
        let bytes = Arc::new(AtomicU64::new(0));
        let cut = Arc::new(Mutex::new(None::<(Instant, u64)>));
        let start = Instant::now();
        let mut set = JoinSet::new();
        for _ in 0..c {
            let (store, next, bytes, cut) =
                (self.store.clone(), next.clone(), bytes.clone(), cut.clone());
            let (key, generation) = (object.key.clone(), object.generation);
            set.spawn(async move {
                loop {
                    let k = next.fetch_add(1, Ordering::SeqCst);
                    if k.saturating_mul(part) >= budget {
                        cut.lock()
                            .get_or_insert_with(|| (Instant::now(), bytes.load(Ordering::SeqCst)));
                        return Ok(());
                    }
                    if Instant::now() >= until {
                        return Ok(());
                    }
                    let offset = (k % slots) * part;
                    let request = store.get_range(&key, generation, offset..offset + part);
                    let Ok(stream) = timeout_at(until, request).await else {
                        return Ok(());
                    };
                    if !drain(stream?, until, &bytes).await? {
                        return Ok(());
                    }
                }
            });
        }
        join(set)
            .await
            .map_err(|e| describe("reading the test object", &e))?;
        let (end, moved) = match *cut.lock() {
            Some((at, moved)) if at < until => (at, moved),
            _ => (Instant::now().min(until), bytes.load(Ordering::SeqCst)),
        };
        Ok((mbps(moved, end - start), ()))
    }

    /// One parallel composite upload with `c` workers: parts until `until` (or the step's
    /// bytes), then the compose; everything stops at `hard`.
    pub(super) async fn write_step(
        &self,
        c: usize,
        until: Instant,
        hard: Instant,
    ) -> Result<(f64, WriteStep), String> {
        let fail = |e: StoreError| describe("composite write", &e);
        let dir = self.key(&format!("write-{c:03}/"));
        let part = self.plan.part_size;
        let max_parts = self.plan.max_parts();
        let data = self.data.slice(..part as usize);
        let start = Instant::now();
        let (set, done) = self.put_numbered(c, &format!("{dir}part-"), data, max_parts, until);
        // Parts started before `until` finish, unless the ladder's time is up.
        if let Ok(r) = timeout_at(hard, join(set)).await {
            r.map_err(fail)?;
        }
        let upload = start.elapsed();
        let mut parts = std::mem::take(&mut *done.lock());
        parts.sort();
        let composed_at = Instant::now();
        let composed = if parts.is_empty() {
            Ok(())
        } else {
            let sources = parts.iter().map(|(_, k, g)| (k.clone(), *g)).collect();
            self.compose_tree(&dir, sources).await
        };
        let compose = composed_at.elapsed();
        self.delete_under(&dir).await;
        composed.map_err(fail)?;
        let step = WriteStep {
            concurrency: c,
            parts: parts.len(),
            bytes: parts.len() as u64 * part,
            upload,
            compose,
        };
        let rate = if parts.is_empty() { 0.0 } else { step.mbps() };
        Ok((rate, step))
    }

    /// `c` workers putting `data` as `{stem}00000`, `{stem}00001`, … until `limit` objects or
    /// `until`, each name recorded before its write. The tasks, and what landed as (number,
    /// key, generation), in the order the answers came.
    #[allow(clippy::type_complexity)]
    fn put_numbered(
        &self,
        c: usize,
        stem: &str,
        data: Bytes,
        limit: usize,
        until: Instant,
    ) -> (
        JoinSet<StoreResult<()>>,
        Arc<Mutex<Vec<(usize, String, i64)>>>,
    ) {
        let next = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(Mutex::new(Vec::new()));
        let mut set = JoinSet::new();
        for _ in 0..c {
            let (store, written, next, done) = (
                self.store.clone(),
                self.written.clone(),
                next.clone(),
                done.clone(),
            );
            let (stem, data) = (stem.to_string(), data.clone());
            set.spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= limit || Instant::now() >= until {
                        return Ok(());
                    }
                    let key = format!("{stem}{i:05}");
                    written.add(&key);
                    let meta = store
                        .put(
                            &key,
                            data.clone(),
                            Precondition::None,
                            &WriteOptions::default(),
                        )
                        .await?;
                    done.lock().push((i, key, meta.generation));
                }
            });
        }
        (set, done)
    }

    /// Deletes what this run wrote under `dir`; what cannot be deleted now is deleted at the
    /// end.
    async fn delete_under(&self, dir: &str) {
        let mine: Vec<String> = self
            .written
            .pending()
            .into_iter()
            .filter(|k| k.starts_with(dir))
            .collect();
        cleanup::delete(&*self.store, &self.written, mine).await;
    }

    /// Composes `sources` into `{dir}object`, through intermediate objects of at most 32
    /// sources each when there are more.
    async fn compose_tree(&self, dir: &str, mut sources: Vec<(String, i64)>) -> StoreResult<()> {
        let opts = WriteOptions::default();
        let mut level = 0;
        while sources.len() > MAX_COMPOSE_SOURCES {
            level += 1;
            let joins = sources
                .chunks(MAX_COMPOSE_SOURCES)
                .enumerate()
                .map(|(n, group)| {
                    let key = format!("{dir}c{level}-{n:05}");
                    self.written.add(&key);
                    let opts = &opts;
                    async move {
                        let meta = self
                            .store
                            .compose(group, &key, Precondition::None, opts)
                            .await?;
                        Ok::<_, StoreError>((key, meta.generation))
                    }
                });
            sources = futures::future::join_all(joins)
                .await
                .into_iter()
                .collect::<StoreResult<_>>()?;
        }
        let key = format!("{dir}object");
        self.written.add(&key);
        self.store
            .compose(&sources, &key, Precondition::None, &opts)
            .await?;
        Ok(())
    }

    /// `c` workers uploading 10 KiB objects for the first half of the step, then downloading
    /// them for the second half.
    pub(super) async fn small_step(
        &self,
        c: usize,
        until: Instant,
        hard: Instant,
    ) -> Result<(f64, SmallStep), String> {
        let dir = self.key(&format!("small-{c:03}/"));
        let half = until.saturating_duration_since(Instant::now()) / 2;
        let data = self.data.slice(..SMALL_OBJECT_SIZE as usize);
        let limit = self.plan.small_objects;

        let up_until = Instant::now() + half;
        let start = Instant::now();
        let (set, done) = self.put_numbered(c, &format!("{dir}o-"), data, limit, up_until);
        let uploaded = match timeout_at(hard, join(set)).await {
            Ok(r) => r,
            Err(_) => Ok(()),
        };
        let upload = start.elapsed();
        let objects: Arc<Vec<(String, i64)>> = Arc::new(
            std::mem::take(&mut *done.lock())
                .into_iter()
                .map(|(_, key, generation)| (key, generation))
                .collect(),
        );

        let down_until = (Instant::now() + half).min(hard);
        let next = Arc::new(AtomicUsize::new(0));
        let count = Arc::new(AtomicUsize::new(0));
        let start = Instant::now();
        let mut set = JoinSet::new();
        if uploaded.is_ok() {
            for _ in 0..c {
                let (store, objects, next, count) = (
                    self.store.clone(),
                    objects.clone(),
                    next.clone(),
                    count.clone(),
                );
                set.spawn(async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        if i >= objects.len() || Instant::now() >= down_until {
                            return Ok(());
                        }
                        let (key, generation) = &objects[i];
                        let stream = store
                            .get_range(key, *generation, 0..SMALL_OBJECT_SIZE)
                            .await?;
                        if drain(stream, hard, &AtomicU64::new(0)).await? {
                            count.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                });
            }
        }
        let downloaded = match timeout_at(hard, join(set)).await {
            Ok(r) => r,
            Err(_) => Ok(()),
        };
        let download = start.elapsed();
        self.delete_under(&dir).await;
        uploaded.map_err(|e| describe("uploading small objects", &e))?;
        downloaded.map_err(|e| describe("downloading small objects", &e))?;
        let step = SmallStep {
            concurrency: c,
            uploaded: objects.len(),
            upload,
            downloaded: count.load(Ordering::SeqCst),
            download,
        };
        Ok((per_s(step.uploaded, step.upload), step))
    }
}

/// The `p` quantile (0 to 1) of sorted samples, by the nearest-rank method; zero for none.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Reads `stream` to its end, adding each chunk's length to `bytes`; `false` if `until` came
/// first.
async fn drain(mut stream: ByteStream, until: Instant, bytes: &AtomicU64) -> StoreResult<bool> {
    loop {
        match timeout_at(until, stream.next()).await {
            Err(_) => return Ok(false),
            Ok(None) => return Ok(true),
            Ok(Some(chunk)) => {
                bytes.fetch_add(chunk?.len() as u64, Ordering::SeqCst);
            }
        }
    }
}

/// Waits for every worker; on the first failure the others are stopped and it is returned.
async fn join(mut set: JoinSet<StoreResult<()>>) -> StoreResult<()> {
    let mut first = None;
    while let Some(joined) = set.join_next().await {
        let failed = match joined {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(e) if e.is_cancelled() => None,
            Err(e) => Some(StoreError::new(
                StoreErrorKind::Other,
                format!("a measuring task failed: {e}"),
            )),
        };
        if let Some(e) = failed {
            if first.is_none() {
                set.abort_all();
                first = Some(e);
            }
        }
    }
    first.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let ms =
            |v: &[u64]| -> Vec<Duration> { v.iter().map(|m| Duration::from_millis(*m)).collect() };
        let s = ms(&(1..=100).collect::<Vec<_>>());
        assert_eq!(percentile(&s, 0.5), Duration::from_millis(50));
        assert_eq!(percentile(&s, 0.99), Duration::from_millis(99));
        assert_eq!(percentile(&ms(&[7]), 0.99), Duration::from_millis(7));
        assert_eq!(percentile(&ms(&[1, 2, 3]), 0.5), Duration::from_millis(2));
        assert_eq!(percentile(&[], 0.5), Duration::ZERO);
    }
}
