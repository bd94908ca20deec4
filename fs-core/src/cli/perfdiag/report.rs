//! What a run prints: a table for people and one JSON object for scripts, both made from one
//! [`Report`] so they never disagree.
//!
//! Rates are MB/s of 10^6 bytes, as link speeds and curl's `speed_download` count them, and
//! objects per second for the 10 KiB objects; latencies are milliseconds.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde::Serialize;

use super::curve::{Curve, Stop};
use super::plan::{Plan, SMALL_OBJECT_SIZE};
use super::recommend::{recommend, size_flag, Recommended};
use super::runner::{percentile, Measurements};

/// Where the run went, for the report's heading.
#[derive(Debug, Clone)]
pub struct Target {
    pub bucket: String,
    pub prefix: String,
    pub endpoint: String,
    pub temp_prefix: String,
}

/// Everything printed about a run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub bucket: String,
    pub prefix: String,
    pub endpoint: String,
    /// Where the test objects were (all deleted when the report is printed).
    pub temp_prefix: String,
    /// Seconds the measurements took (deleting the objects comes after).
    pub duration_s: f64,
    pub latency_ms: Latency,
    pub read_single_stream_mbps: f64,
    pub write_single_stream_mbps: f64,
    /// The best of the ranged-read curve.
    pub read_parallel_mbps: f64,
    /// The best of the composite-write curve.
    pub write_parallel_mbps: f64,
    /// The best of the 10 KiB curves.
    pub small_objects_per_s: SmallRates,
    pub read_parallel_curve: CurveReport,
    pub write_parallel_curve: CurveReport,
    pub small_upload_curve: CurveReport,
    pub small_download_curve: CurveReport,
    pub recommended: Recommended,
    pub plan: PlanReport,
    /// Whether the time limit ended a ladder before it flattened.
    pub cut_short: bool,
    /// Test objects deleted, during the run and after it.
    pub deleted_objects: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p99: f64,
    pub samples: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct SmallRates {
    pub upload: f64,
    pub download: f64,
}

/// One ladder: its steps, where it flattened, and why it ended.
#[derive(Debug, Clone, Serialize)]
pub struct CurveReport {
    pub unit: &'static str,
    /// The lowest concurrency within 10% of the best figure.
    pub knee: Option<usize>,
    pub stop: Stop,
    pub points: Vec<CurvePoint>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CurvePoint {
    pub concurrency: usize,
    pub rate: f64,
    /// Composite writes: the parts alone, MB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upload_mbps: Option<f64>,
    /// Composite writes: the composes, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compose_ms: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PlanReport {
    pub object_size: u64,
    pub part_size: u64,
    pub step_time_s: f64,
    pub step_bytes: u64,
    pub max_concurrency: usize,
    pub small_object_size: u64,
}

/// Three decimals: enough for any rate, and short JSON.
fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn curve_report(curve: &Curve, unit: &'static str) -> CurveReport {
    CurveReport {
        unit,
        knee: curve.knee().map(|k| k.concurrency),
        stop: curve.stop,
        points: curve
            .points
            .iter()
            .map(|p| CurvePoint {
                concurrency: p.concurrency,
                rate: round(p.rate),
                upload_mbps: None,
                compose_ms: None,
            })
            .collect(),
    }
}

impl Report {
    pub fn new(target: &Target, plan: &Plan, m: &Measurements, deleted_objects: u64) -> Self {
        let mut sorted = m.latency.clone();
        sorted.sort();
        let ms = |p: f64| round(percentile(&sorted, p).as_secs_f64() * 1000.0);
        let mut write = curve_report(&m.write, "MB/s");
        for (point, step) in write.points.iter_mut().zip(&m.write_steps) {
            point.upload_mbps = Some(round(step.upload_mbps()));
            point.compose_ms = Some(round(step.compose.as_secs_f64() * 1000.0));
        }
        Report {
            bucket: target.bucket.clone(),
            prefix: target.prefix.clone(),
            endpoint: target.endpoint.clone(),
            temp_prefix: target.temp_prefix.clone(),
            duration_s: round(m.elapsed.as_secs_f64()),
            latency_ms: Latency {
                p50: ms(0.5),
                p99: ms(0.99),
                samples: sorted.len(),
            },
            read_single_stream_mbps: round(m.read_single.mbps()),
            write_single_stream_mbps: round(m.write_single.mbps()),
            read_parallel_mbps: round(m.read.peak()),
            write_parallel_mbps: round(m.write.peak()),
            small_objects_per_s: SmallRates {
                upload: round(m.small_upload.peak()),
                download: round(m.small_download.peak()),
            },
            read_parallel_curve: curve_report(&m.read, "MB/s"),
            write_parallel_curve: write,
            small_upload_curve: curve_report(&m.small_upload, "objects/s"),
            small_download_curve: curve_report(&m.small_download, "objects/s"),
            recommended: recommend(m),
            plan: PlanReport {
                object_size: plan.object_size,
                part_size: plan.part_size,
                step_time_s: plan.step_time.as_secs_f64(),
                step_bytes: plan.step_bytes,
                max_concurrency: plan.max_concurrency,
                small_object_size: SMALL_OBJECT_SIZE,
            },
            cut_short: m.cut_short(),
            deleted_objects,
        }
    }

    /// The JSON object.
    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The table, with the recommendation as a mount command line.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let place = if self.prefix.is_empty() {
            format!("gs://{}", self.bucket)
        } else {
            format!("gs://{}/{}", self.bucket, self.prefix)
        };
        let _ = writeln!(out, "bucketdrive perfdiag {place} via {}", self.endpoint);
        let _ = writeln!(
            out,
            "measured in {:.0} s with {} parts and a {} test object; {} test objects deleted",
            self.duration_s,
            size_flag(self.plan.part_size),
            size_flag(self.plan.object_size),
            self.deleted_objects
        );
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "first-byte latency    p50 {:.1} ms, p99 {:.1} ms ({} GETs)",
            self.latency_ms.p50, self.latency_ms.p99, self.latency_ms.samples
        );
        let _ = writeln!(
            out,
            "single-stream read    {:.1} MB/s",
            self.read_single_stream_mbps
        );
        let _ = writeln!(
            out,
            "single-stream write   {:.1} MB/s",
            self.write_single_stream_mbps
        );
        let _ = writeln!(out);
        let curves = [
            &self.read_parallel_curve,
            &self.write_parallel_curve,
            &self.small_upload_curve,
            &self.small_download_curve,
        ];
        let _ = writeln!(
            out,
            "{:>11}  {:>12}  {:>15}  {:>10}  {:>11}",
            "concurrency", "ranged read", "composite write", "10 KiB up", "10 KiB down"
        );
        let _ = writeln!(
            out,
            "{:>11}  {:>12}  {:>15}  {:>10}  {:>11}",
            "", "MB/s", "MB/s", "objects/s", "objects/s"
        );
        let rows: BTreeSet<usize> = curves
            .iter()
            .flat_map(|c| c.points.iter().map(|p| p.concurrency))
            .collect();
        for c in rows {
            let cell = |curve: &CurveReport| match curve.points.iter().find(|p| p.concurrency == c)
            {
                Some(p) => {
                    let mark = if curve.knee == Some(c) { "*" } else { " " };
                    format!("{:.1}{mark}", p.rate)
                }
                None => "- ".to_string(),
            };
            let _ = writeln!(
                out,
                "{c:>11}  {:>12}  {:>15}  {:>10}  {:>11}",
                cell(curves[0]),
                cell(curves[1]),
                cell(curves[2]),
                cell(curves[3])
            );
        }
        let _ = writeln!(
            out,
            "* the knee: the lowest concurrency within 10% of the column's best"
        );
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "parallel ranged read      {:.1} MB/s at best",
            self.read_parallel_mbps
        );
        let _ = writeln!(
            out,
            "parallel composite write  {:.1} MB/s at best (parts and compose)",
            self.write_parallel_mbps
        );
        let _ = writeln!(
            out,
            "10 KiB objects            {:.0} uploads/s, {:.0} downloads/s at best",
            self.small_objects_per_s.upload, self.small_objects_per_s.download
        );
        if self.cut_short {
            let _ = writeln!(
                out,
                "(the time limit ended a curve before it flattened: --time-limit gives more)"
            );
        }
        let _ = writeln!(out);
        let _ = writeln!(out, "recommended mount options:");
        let _ = writeln!(out, "  {}", self.recommended.flags);
        out
    }
}
