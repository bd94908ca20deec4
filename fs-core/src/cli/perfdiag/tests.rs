//! Whole runs against the in-memory store behind a simulated link, on tokio's paused clock (so
//! seconds of simulated transfer take milliseconds): the figures come out where the link puts
//! them, the knees where its total cap is reached, and nothing is left under the temporary
//! prefix after a run, a failure, or a cancellation in the middle of a composite write.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use parking_lot::Mutex;
use tokio::time::Instant;

use super::cleanup::{remove_all, Written};
use super::curve::Stop;
use super::plan::Plan;
use super::recommend::recommend;
use super::runner::{Observer, Quiet, Runner};
use crate::store::memory::MemoryStore;
use crate::store::{
    ByteStream, ChunkOutcome, ListPage, ListRequest, ObjectMeta, ObjectStore, Precondition,
    ResumableSession, StoreResult, WriteOptions,
};

const MIB: u64 = 1 << 20;

/// A link in front of a [`MemoryStore`]: every request waits `latency` before anything else,
/// and bytes move at `per_stream` bytes per second per request, less when more requests are
/// in flight than `total` allows (each gets an equal share of it).
struct Link {
    inner: MemoryStore,
    latency: Duration,
    per_stream: f64,
    total: f64,
    in_flight: Arc<AtomicUsize>,
    /// The number of sources of every compose.
    composes: Mutex<Vec<usize>>,
}

/// Counts a request in flight until dropped.
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Link {
    fn new(latency_ms: u64, per_stream_mbps: f64, total_mbps: f64) -> Self {
        Link {
            inner: MemoryStore::new(),
            latency: Duration::from_millis(latency_ms),
            per_stream: per_stream_mbps * 1e6,
            total: total_mbps * 1e6,
            in_flight: Arc::new(AtomicUsize::new(0)),
            composes: Mutex::new(Vec::new()),
        }
    }

    fn enter(&self) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(self.in_flight.clone())
    }

    fn transfer_time(per_stream: f64, total: f64, in_flight: &AtomicUsize, len: usize) -> Duration {
        let n = in_flight.load(Ordering::SeqCst).max(1) as f64;
        Duration::from_secs_f64(len as f64 / per_stream.min(total / n))
    }

    async fn send(&self, len: usize) -> InFlight {
        let guard = self.enter();
        let t = Self::transfer_time(self.per_stream, self.total, &self.in_flight, len);
        tokio::time::sleep(self.latency + t).await;
        guard
    }
}

#[async_trait::async_trait]
impl ObjectStore for Link {
    async fn head(&self, key: &str) -> StoreResult<ObjectMeta> {
        let _g = self.send(0).await;
        self.inner.head(key).await
    }

    async fn list(&self, req: &ListRequest) -> StoreResult<ListPage> {
        let _g = self.send(0).await;
        self.inner.list(req).await
    }

    async fn get_range(
        &self,
        key: &str,
        generation: i64,
        range: Range<u64>,
    ) -> StoreResult<ByteStream> {
        let guard = self.enter();
        tokio::time::sleep(self.latency).await;
        let mut inner = self.inner.get_range(key, generation, range).await?;
        let mut data = Vec::new();
        while let Some(chunk) = inner.next().await {
            data.extend_from_slice(&chunk?);
        }
        let data = Bytes::from(data);
        let (per_stream, total, in_flight) = (self.per_stream, self.total, self.in_flight.clone());
        // 64 KiB at a time, each due its transfer time at the share of the moment after the
        // last (counted from when the last was due, so the timer's 1 ms ticks do not add up).
        let pieces: Vec<Bytes> = (0..data.len())
            .step_by(64 * 1024)
            .map(|at| data.slice(at..(at + 64 * 1024).min(data.len())))
            .collect();
        let stream = futures::stream::iter(pieces).scan(Instant::now(), move |due, piece| {
            *due += Link::transfer_time(per_stream, total, &in_flight, piece.len());
            let at = *due;
            async move {
                tokio::time::sleep_until(at).await;
                Some(Ok(piece))
            }
        });
        // The guard lives as long as the stream.
        let stream = stream.map(move |item| {
            let _ = &guard;
            item
        });
        Ok(Box::pin(stream))
    }

    async fn put(
        &self,
        key: &str,
        data: Bytes,
        pre: Precondition,
        opts: &WriteOptions,
    ) -> StoreResult<ObjectMeta> {
        let _g = self.send(data.len()).await;
        self.inner.put(key, data, pre, opts).await
    }

    async fn start_resumable(
        &self,
        key: &str,
        pre: Precondition,
        opts: &WriteOptions,
    ) -> StoreResult<ResumableSession> {
        let _g = self.send(0).await;
        self.inner.start_resumable(key, pre, opts).await
    }

    async fn upload_chunk(
        &self,
        session: &ResumableSession,
        offset: u64,
        data: Bytes,
        total: Option<u64>,
    ) -> StoreResult<ChunkOutcome> {
        let _g = self.send(data.len()).await;
        self.inner.upload_chunk(session, offset, data, total).await
    }

    async fn compose(
        &self,
        sources: &[(String, i64)],
        dest: &str,
        pre: Precondition,
        opts: &WriteOptions,
    ) -> StoreResult<ObjectMeta> {
        self.composes.lock().push(sources.len());
        let _g = self.send(0).await;
        self.inner.compose(sources, dest, pre, opts).await
    }

    async fn copy(
        &self,
        src: &str,
        src_generation: i64,
        dest: &str,
        pre: Precondition,
        mark: Option<&str>,
    ) -> StoreResult<ObjectMeta> {
        let _g = self.send(0).await;
        self.inner.copy(src, src_generation, dest, pre, mark).await
    }

    async fn delete(&self, key: &str, pre: Precondition) -> StoreResult<()> {
        let _g = self.send(0).await;
        self.inner.delete(key, pre).await
    }

    async fn update_metadata(
        &self,
        key: &str,
        generation: i64,
        metadata: &HashMap<String, String>,
    ) -> StoreResult<ObjectMeta> {
        let _g = self.send(0).await;
        self.inner.update_metadata(key, generation, metadata).await
    }
}

const ROOT: &str = "data/bucketdrive-perfdiag-test/";

/// A plan small enough for a unit test, on a link with 4 MiB parts.
fn small_plan() -> Plan {
    Plan {
        object_size: 16 * MIB,
        part_size: 4 * MIB,
        step_time: Duration::from_secs(2),
        step_bytes: 128 * MIB,
        max_concurrency: 32,
        latency_samples: 20,
        small_objects: 200,
        time_limit: Duration::from_secs(150),
    }
}

/// A link and a runner on it, with objects of the user's beside the temporary prefix.
fn setup(link: Link, plan: Plan) -> (Arc<Link>, Arc<Written>, Runner<Link>) {
    link.inner.insert("data/keep.txt", b"mine".to_vec());
    link.inner.insert("other", b"not under the prefix".to_vec());
    let link = Arc::new(link);
    let written = Arc::new(Written::new("bkt", ROOT));
    let runner = Runner::new(link.clone(), plan, written.clone());
    (link, written, runner)
}

fn near(got: f64, want: f64, tolerance: f64) -> bool {
    (got - want).abs() <= want * tolerance
}

#[tokio::test(start_paused = true)]
async fn a_shaped_link_is_measured_where_its_caps_are_and_leaves_nothing_behind() {
    // 40 MB/s per connection, 160 MB/s in all, 5 ms to the first byte.
    let (link, written, runner) = setup(Link::new(5, 40.0, 160.0), small_plan());
    let m = runner.run(&Quiet).await.unwrap();

    // Every GET waits 5 ms; its 10 KiB take 0.26 ms more at 40 MB/s (and the paused clock
    // ticks in whole milliseconds).
    assert_eq!(m.latency.len(), 20);
    assert!(m.latency.iter().all(|l| *l > Duration::from_millis(5)));
    assert!(m.latency.iter().all(|l| *l <= Duration::from_millis(6)));
    assert!(
        near(m.read_single.mbps(), 40.0, 0.03),
        "{:?}",
        m.read_single
    );
    // One request for the whole object, after a 4 MiB one that showed the rate.
    assert!(
        near(m.write_single.mbps(), 40.0, 0.03),
        "{:?}",
        m.write_single
    );
    assert_eq!(m.write_single.bytes, 16 * MIB);
    assert_eq!(m.read_single.bytes, 16 * MIB);

    // One connection gets 40 MB/s; four fill the 160 MB/s; more only share it.
    let read_knee = m.read.knee().unwrap();
    assert_eq!(read_knee.concurrency, 4, "{:?}", m.read);
    assert!(near(read_knee.rate, 152.0, 0.05), "{:?}", m.read);
    assert_eq!(m.read.stop, Stop::Flattened);
    assert!(m.read.peak() <= 160.0, "{:?}", m.read);
    assert_eq!(
        m.read
            .points
            .iter()
            .map(|p| p.concurrency)
            .collect::<Vec<_>>(),
        vec![1, 2, 4, 8, 16],
        "two flat steps after the knee, then it stops"
    );
    assert_eq!(
        m.write.knee().map(|k| k.concurrency),
        Some(4),
        "{:?}",
        m.write
    );
    assert_eq!(m.write.stop, Stop::Flattened);
    for s in &m.write_steps {
        assert!(s.parts > 0 && s.bytes == s.parts as u64 * 4 * MIB, "{s:?}");
    }
    // 10 KiB objects are bound by the wait per request, not by bytes: they scale all the way.
    assert_eq!(m.small_upload.stop, Stop::MaxConcurrency);
    assert_eq!(m.small_upload.knee().map(|k| k.concurrency), Some(32));
    let one = m.small_upload.at(1).unwrap();
    // One at a time: one per 5.26 ms, which the paused clock's 1 ms ticks make 6 ms.
    assert!(
        (1.0 / 0.0061..=1.0 / 0.00525).contains(&one),
        "{:?}",
        m.small_upload
    );
    assert_eq!(m.small_download.points.len(), m.small_upload.points.len());
    assert!(m.small_steps.iter().all(|s| s.downloaded == s.uploaded));
    assert!(!m.cut_short());

    let r = recommend(&m);
    assert_eq!((r.read_concurrency, r.upload_concurrency), (4, 4));
    assert_eq!(r.upload_files_concurrency, 32);

    // Each step deleted its own objects; the test object and the latency probe are left for
    // the end.
    assert!(written.deleted() > 100, "{}", written.deleted());
    assert_eq!(
        link.inner
            .keys()
            .into_iter()
            .filter(|k| k.starts_with(ROOT))
            .collect::<Vec<_>>(),
        vec![format!("{ROOT}latency"), format!("{ROOT}object")]
    );
    remove_all(&*link, &written, Duration::ZERO).await.unwrap();
    assert_eq!(link.inner.keys(), vec!["data/keep.txt", "other"]);
}

#[tokio::test(start_paused = true)]
async fn every_step_is_bounded_by_its_time_on_a_slow_link() {
    // 1 MB/s per connection, 4 MB/s in all, 100 ms per request: the defaults' 128 MiB object
    // would take two minutes in one stream.
    let plan = Plan::default();
    let (link, written, runner) = setup(Link::new(100, 1.0, 4.0), plan.clone());
    let started = tokio::time::Instant::now();
    let m = runner.run(&Quiet).await.unwrap();
    let took = started.elapsed();
    assert!(took <= plan.time_limit + plan.step_time, "{took:?}");
    // The single-stream write: 4 MiB took 4.3 s, so the second object would not have fit in
    // the rest of its 8 s; the first is the test object.
    assert!(
        m.write_single.elapsed <= plan.single_time() + Duration::from_secs(1),
        "{:?}",
        m.write_single
    );
    assert_eq!(m.write_single.bytes, 4 * MIB);
    assert!(
        near(m.write_single.mbps(), 1.0, 0.1),
        "{:?}",
        m.write_single
    );
    assert!(near(m.read_single.mbps(), 1.0, 0.1), "{:?}", m.read_single);
    assert!(m.read.points.iter().all(|p| p.rate > 0.0), "{:?}", m.read);
    remove_all(&*link, &written, Duration::ZERO).await.unwrap();
    assert_eq!(link.inner.keys(), vec!["data/keep.txt", "other"]);
}

#[tokio::test(start_paused = true)]
async fn the_single_stream_write_sends_what_fits_in_its_time() {
    // 10 MB/s and 100 ms: the 4 MiB probe shows about 8 MB/s, so about 58 MB fit in the
    // 7.5 s left of the step's 8 s, less than the 128 MiB asked for.
    let plan = Plan::default();
    let (link, written, runner) = setup(Link::new(100, 10.0, 40.0), plan.clone());
    let end = tokio::time::Instant::now() + plan.time_limit;
    let (object, t) = runner.write_single(&Quiet, end).await.unwrap();
    assert_eq!(object.key, format!("{ROOT}object"));
    assert_eq!(object.size, t.bytes);
    assert!((50 * MIB..=60 * MIB).contains(&t.bytes), "{t:?}");
    assert!(t.elapsed < plan.single_time(), "{t:?}");
    assert!(
        near(t.mbps(), 10.0, 0.03),
        "one request at the link's rate: {t:?}"
    );
    // The probe was deleted once the test object was written.
    assert_eq!(written.pending(), vec![format!("{ROOT}object")]);
    assert!(link
        .inner
        .object_bytes(&format!("{ROOT}object-probe"))
        .is_none());
}

#[tokio::test(start_paused = true)]
async fn a_read_step_counts_only_while_every_worker_is_busy() {
    // Nine 4 MiB ranges for four workers: two rounds at 40 MB/s each, then one range alone.
    let plan = Plan {
        step_bytes: 9 * 4 * MIB,
        ..small_plan()
    };
    let (link, _written, runner) = setup(Link::new(5, 40.0, 160.0), plan);
    let object = link
        .inner
        .insert(&format!("{ROOT}object"), vec![0u8; 16 << 20]);
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    let (rate, ()) = runner.read_step(&object, 4, until).await.unwrap();
    // Four streams of 40 MB/s, each waiting 5 ms per range; the lone ninth range, which
    // would pull the figure down to about 115 MB/s, is not counted.
    assert!(near(rate, 152.7, 0.03), "{rate}");
}

#[tokio::test(start_paused = true)]
async fn more_than_32_parts_are_composed_in_a_tree_and_all_deleted() {
    let plan = Plan {
        part_size: MIB,
        step_bytes: 40 * MIB,
        ..small_plan()
    };
    let (link, written, runner) = setup(Link::new(5, 40.0, 1000.0), plan);
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    let (rate, step) = runner.write_step(8, until, until).await.unwrap();
    assert_eq!(step.parts, 40);
    assert!(rate > 0.0 && rate < step.upload_mbps());
    // 32 + 8 parts into two intermediates, then those two into the object.
    assert_eq!(*link.composes.lock(), vec![32, 8, 2]);
    assert_eq!(written.deleted(), 40 + 2 + 1);
    assert!(written.pending().is_empty());
    assert_eq!(link.inner.keys(), vec!["data/keep.txt", "other"]);
}

/// Cancels the run once `label` has started and `after` has passed.
struct CancelAt {
    label: &'static str,
    started: tokio::sync::Notify,
}

impl Observer for CancelAt {
    fn start(&self, label: &str) {
        if label == self.label {
            self.started.notify_one();
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_run_cancelled_during_a_composite_write_leaves_nothing_after_cleanup() {
    let (link, written, runner) = setup(Link::new(5, 40.0, 160.0), small_plan());
    let obs = CancelAt {
        label: "composite write ×4",
        started: tokio::sync::Notify::new(),
    };
    tokio::select! {
        r = runner.run(&obs) => panic!("the run ended before it was cancelled: {:?}", r.map(|_| ())),
        _ = async {
            obs.started.notified().await;
            tokio::time::sleep(Duration::from_millis(150)).await;
        } => {}
    }
    drop(runner);
    let ours: Vec<String> = link
        .inner
        .keys()
        .into_iter()
        .filter(|k| k.starts_with(ROOT))
        .collect();
    assert!(
        ours.iter().any(|k| k.contains("/write-004/part-")),
        "parts were in the bucket when the run was cancelled: {ours:?}"
    );
    remove_all(&*link, &written, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(link.inner.keys(), vec!["data/keep.txt", "other"]);
}

#[tokio::test(start_paused = true)]
async fn a_failing_bucket_ends_the_run_with_what_failed() {
    let (link, written, runner) = setup(Link::new(5, 40.0, 160.0), small_plan());
    // The store retries nothing itself here: the first write fails for good.
    link.inner.set_offline(true);
    let err = runner.run(&Quiet).await.unwrap_err();
    assert!(err.starts_with("writing a test object: "), "{err}");
    assert_eq!(written.pending(), vec![format!("{ROOT}latency")]);
    link.inner.set_offline(false);
    remove_all(&*link, &written, Duration::ZERO).await.unwrap();
    assert_eq!(link.inner.keys(), vec!["data/keep.txt", "other"]);
}
