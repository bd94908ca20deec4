//! A recorder for tests: what the counting calls did, by series, on the current thread only
//! (so tests running in parallel never see each other's counts).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ::metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use parking_lot::Mutex;

/// How many values a histogram series observed.
#[derive(Debug, Default)]
struct Observations(AtomicU64);

impl HistogramFn for Observations {
    fn record(&self, _value: f64) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// Every series touched, by `name{label=value,…}` (labels in the order given).
#[derive(Debug, Default)]
pub struct Recorded {
    counters: Mutex<HashMap<String, Arc<AtomicU64>>>,
    gauges: Mutex<HashMap<String, Arc<AtomicU64>>>,
    histograms: Mutex<HashMap<String, Arc<Observations>>>,
}

fn series(key: &Key) -> String {
    let labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    if labels.is_empty() {
        key.name().to_string()
    } else {
        format!("{}{{{}}}", key.name(), labels.join(","))
    }
}

impl Recorded {
    pub fn counter(&self, series: &str) -> u64 {
        self.counters
            .lock()
            .get(series)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    pub fn gauge(&self, series: &str) -> f64 {
        self.gauges
            .lock()
            .get(series)
            .map_or(0.0, |g| f64::from_bits(g.load(Ordering::Relaxed)))
    }

    /// How many values the histogram series observed.
    pub fn observed(&self, series: &str) -> u64 {
        self.histograms
            .lock()
            .get(series)
            .map_or(0, |h| h.0.load(Ordering::Relaxed))
    }
}

impl Recorder for Recorded {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.counters.lock().entry(series(key)).or_default().clone())
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.gauges.lock().entry(series(key)).or_default().clone())
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(
            self.histograms
                .lock()
                .entry(series(key))
                .or_default()
                .clone(),
        )
    }
}

/// Runs `f` on a current-thread runtime (its spawned tasks included) with `rec` recording.
pub fn run<T>(rec: &Recorded, f: impl Future<Output = T>) -> T {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a test runtime");
    ::metrics::with_local_recorder(rec, || rt.block_on(f))
}
