//! End-to-end metrics: a mount with `--metrics-addr` is scraped over HTTP before and after a
//! read and a write through the real FUSE mount, and each counter must have moved by exactly
//! what was done (bytes, requests, uploads), gauges must come back to rest, and a taken address
//! must stop the mount with a one-line error.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bucketdrive_tests::{
    free_port, random_bytes, sha256, write_and_close, Emulator, Mount, Result,
};

const MIB: usize = 1024 * 1024;

/// One scrape: each sample's value by metric name and label set.
#[derive(Debug, Default)]
struct Scrape {
    samples: Vec<(String, BTreeMap<String, String>, f64)>,
    text: String,
}

impl Scrape {
    /// Parses the Prometheus text format, as much of it as these tests need: `# ` lines are
    /// skipped, label values hold no commas or escaped quotes.
    fn parse(text: &str) -> Result<Self> {
        let mut samples = Vec::new();
        for line in text.lines() {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (series, value) = line
                .rsplit_once(' ')
                .ok_or_else(|| anyhow::anyhow!("sample without a value: {line:?}"))?;
            let value: f64 = value
                .parse()
                .map_err(|e| anyhow::anyhow!("bad value in {line:?}: {e}"))?;
            let (name, labels) = match series.split_once('{') {
                None => (series, BTreeMap::new()),
                Some((name, rest)) => {
                    let inner = rest
                        .strip_suffix('}')
                        .ok_or_else(|| anyhow::anyhow!("unclosed labels in {line:?}"))?;
                    let mut labels = BTreeMap::new();
                    for pair in inner.split(',').filter(|p| !p.is_empty()) {
                        let (k, v) = pair
                            .split_once('=')
                            .ok_or_else(|| anyhow::anyhow!("bad label in {line:?}"))?;
                        labels.insert(k.to_string(), v.trim_matches('"').to_string());
                    }
                    (name, labels)
                }
            };
            samples.push((name.to_string(), labels, value));
        }
        Ok(Scrape {
            samples,
            text: text.to_string(),
        })
    }

    /// The sum of every sample of `name` whose labels include `labels`; 0 when there is none.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|(n, l, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.get(*k).map(String::as_str) == Some(v))
            })
            .map(|(_, _, v)| v)
            .sum()
    }

    fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|(n, _, _)| n == name)
    }
}

/// GET /metrics from a mount.
fn scrape(addr: &str) -> Result<Scrape> {
    let resp = ureq::get(&format!("http://{addr}/metrics"))
        .timeout(Duration::from_secs(10))
        .call()?;
    anyhow::ensure!(
        resp.content_type() == "text/plain",
        "content type {:?}",
        resp.content_type()
    );
    Scrape::parse(&resp.into_string()?)
}

/// Scrapes until `ok` holds for a scrape (gauges settle a moment after the event that moves
/// them), for up to `secs` seconds.
fn scrape_until(addr: &str, secs: u64, what: &str, ok: impl Fn(&Scrape) -> bool) -> Result<Scrape> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let s = scrape(addr)?;
        if ok(&s) {
            return Ok(s);
        }
        if Instant::now() > deadline {
            anyhow::bail!("{what} within {secs} s; last scrape:\n{}", s.text);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// How much `name{labels}` grew from `a` to `b`.
fn delta(a: &Scrape, b: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    b.sum(name, labels) - a.sum(name, labels)
}

#[test]
fn a_read_and_a_write_move_the_counters_by_what_they_did() -> Result<()> {
    let emu = Emulator::start()?;
    emu.create_bucket("metrics")?;
    // Not a multiple of the page size: the kernel's last request asks past the end, and only
    // the bytes that exist may be counted.
    let n = 3 * MIB + 12_345;
    let data = random_bytes(n, 1);
    emu.put("metrics", "in.bin", &data)?;
    let addr = format!("127.0.0.1:{}", free_port()?);
    // A write-back delay long enough to see the saved file waiting before it uploads.
    let m = Mount::new(
        &emu,
        "metrics",
        &["--metrics-addr", &addr, "--write-back-delay", "3s"],
    )?;

    let start = scrape(&addr)?;
    // Every metric is there from the first scrape, at zero, before anything happened.
    for name in [
        "bucketdrive_read_bytes_total",
        "bucketdrive_fetched_bytes_total",
        "bucketdrive_prefetch_hits_total",
        "bucketdrive_prefetch_misses_total",
        "bucketdrive_read_budget_bytes_in_use",
        "bucketdrive_read_budget_bytes_limit",
        "bucketdrive_store_requests_total",
        "bucketdrive_store_retries_total",
        "bucketdrive_uploads_pending",
        "bucketdrive_uploads_total",
        "bucketdrive_upload_bytes_total",
        "bucketdrive_upload_failures_total",
        "bucketdrive_conflicts_total",
        "bucketdrive_staged_bytes",
    ] {
        assert!(start.has(name), "{name} missing from the first scrape");
    }
    assert_eq!(start.sum("bucketdrive_read_bytes_total", &[]), 0.0);
    assert_eq!(
        start.sum("bucketdrive_read_budget_bytes_limit", &[]),
        1024.0 * 1024.0 * 1024.0,
        "the default --max-read-memory"
    );
    assert!(
        start
            .text
            .contains("# TYPE bucketdrive_store_request_duration_seconds histogram"),
        "the request duration is a histogram, not a summary:\n{}",
        start.text
    );

    // Read: a file the kernel has never cached, so every byte comes through the mount once.
    let before = scrape(&addr)?;
    let read = std::fs::read(m.path().join("in.bin"))?;
    assert_eq!(
        sha256(&read),
        sha256(&data),
        "content read through the mount"
    );
    // The handle's release reaches the mount after close() returns: wait for its read-ahead
    // memory to be given back.
    let after = scrape_until(&addr, 10, "read-ahead memory not released", |s| {
        s.sum("bucketdrive_read_budget_bytes_in_use", &[]) == 0.0
    })?;
    assert_eq!(
        delta(&before, &after, "bucketdrive_read_bytes_total", &[]),
        n as f64,
        "bytes returned to the reader"
    );
    assert!(
        delta(&before, &after, "bucketdrive_fetched_bytes_total", &[]) >= n as f64,
        "every byte read was downloaded"
    );
    let gets = delta(
        &before,
        &after,
        "bucketdrive_store_requests_total",
        &[("op", "get_range")],
    );
    assert!(gets >= 1.0, "ranged GETs sent: {gets}");
    assert_eq!(
        delta(
            &before,
            &after,
            "bucketdrive_store_request_duration_seconds_count",
            &[("op", "get_range")],
        ),
        gets,
        "one duration observed per GET"
    );
    assert_eq!(
        delta(
            &before,
            &after,
            "bucketdrive_store_request_duration_seconds_bucket",
            &[("op", "get_range"), ("le", "+Inf")],
        ),
        gets,
        "the +Inf bucket holds every GET"
    );
    assert!(
        delta(
            &before,
            &after,
            "bucketdrive_store_requests_total",
            &[("op", "head")]
        ) >= 1.0,
        "the lookup of in.bin asked the bucket"
    );
    assert!(
        delta(&before, &after, "bucketdrive_prefetch_misses_total", &[]) >= 1.0,
        "the first read of a file cannot have been prefetched"
    );
    assert_eq!(
        delta(&before, &after, "bucketdrive_store_retries_total", &[]),
        0.0,
        "a healthy emulator needs no retry"
    );

    // Write: a new file, saved by close, uploaded after the write-back delay.
    let mlen = MIB + 777;
    let written = random_bytes(mlen, 2);
    let before = scrape(&addr)?;
    write_and_close(&m.path().join("out.bin"), &written)?;
    let saved = scrape(&addr)?;
    assert_eq!(
        delta(&before, &saved, "bucketdrive_uploads_pending", &[]),
        1.0,
        "the saved file waits for its upload"
    );
    assert_eq!(
        delta(&before, &saved, "bucketdrive_staged_bytes", &[]),
        mlen as f64,
        "the saved file is staged in the cache directory"
    );
    assert_eq!(
        delta(&before, &saved, "bucketdrive_upload_bytes_total", &[]),
        0.0,
        "nothing uploaded before the write-back delay"
    );
    m.wait_uploaded(Duration::from_secs(60))?;
    assert_eq!(
        emu.get("metrics", "out.bin").map(|d| sha256(&d))?,
        sha256(&written),
        "content in the bucket"
    );
    let after = scrape_until(&addr, 10, "the write path did not come to rest", |s| {
        s.sum("bucketdrive_uploads_pending", &[]) == before.sum("bucketdrive_uploads_pending", &[])
            && s.sum("bucketdrive_staged_bytes", &[]) == before.sum("bucketdrive_staged_bytes", &[])
    })?;
    assert_eq!(after.sum("bucketdrive_uploads_pending", &[]), 0.0);
    assert_eq!(after.sum("bucketdrive_staged_bytes", &[]), 0.0);
    assert_eq!(
        delta(&before, &after, "bucketdrive_upload_bytes_total", &[]),
        mlen as f64,
        "bytes uploaded"
    );
    assert_eq!(
        delta(&before, &after, "bucketdrive_uploads_total", &[]),
        1.0
    );
    assert_eq!(
        delta(
            &before,
            &after,
            "bucketdrive_store_requests_total",
            &[("op", "put")]
        ),
        1.0,
        "a file under the single-shot threshold is one PUT"
    );
    for name in [
        "bucketdrive_upload_failures_total",
        "bucketdrive_conflicts_total",
        "bucketdrive_store_retries_total",
    ] {
        assert_eq!(delta(&before, &after, name, &[]), 0.0, "{name}");
    }
    // Nothing was read while writing: the kernel had no page of the new file to fill.
    assert_eq!(
        delta(&before, &after, "bucketdrive_read_bytes_total", &[]),
        0.0
    );
    m.unmount()
}

#[test]
fn a_taken_metrics_address_stops_the_mount_with_one_line() -> Result<()> {
    let emu = Emulator::start()?;
    emu.create_bucket("taken")?;
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = taken.local_addr()?.to_string();
    let err = match Mount::new(&emu, "taken", &["--metrics-addr", &addr]) {
        Ok(m) => {
            m.unmount()?;
            anyhow::bail!("mounted although {addr} is taken");
        }
        Err(e) => e.to_string(),
    };
    let line = format!("bucketdrive: cannot serve metrics on {addr}: ");
    assert!(err.contains(&line), "error was: {err}");
    let reason = err
        .split(&line)
        .nth(1)
        .map(str::trim_end)
        .unwrap_or_default();
    assert!(
        !reason.is_empty() && !reason.contains('\n'),
        "error was: {err}"
    );
    drop(taken);
    Ok(())
}
