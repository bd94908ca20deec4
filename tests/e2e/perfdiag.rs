//! End-to-end: the real `bucketdrive perfdiag` against fake-gcs-server, with a small plan. The
//! JSON report must carry every figure, positive; the table must end with mount flags; and
//! the bucket must hold exactly what it held before, after a finished run, after Ctrl-C while
//! composite parts are uploading, and after SIGTERM among the small objects, each checked
//! while the run still had objects in the bucket. A missing bucket or an unusable key file is
//! one line and a non-zero exit, with nothing written.
//!
//! Needs no FUSE: perfdiag only talks to the bucket.

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use bucketdrive_tests::{bucketdrive_bin, Emulator, Result};

const BUCKET: &str = "perf";

/// A plan that runs in seconds against the emulator, with steps of `step_time`.
fn small(step_time: &'static str) -> Vec<&'static str> {
    vec![
        "--object-size",
        "2MiB",
        "--part-size",
        "256KiB",
        "--step-time",
        step_time,
        "--max-concurrency",
        "4",
        "--latency-samples",
        "10",
        "--small-objects",
        "50",
    ]
}

const SMALL_STEPS: &str = "300ms";

/// An emulator with a bucket holding two objects of the user's, one under the prefix the
/// tests measure in; returns it and its keys.
fn setup() -> Result<(Emulator, Vec<String>)> {
    let emu = Emulator::start()?;
    emu.create_bucket(BUCKET)?;
    emu.put(BUCKET, "data/keep.txt", b"the user's")?;
    emu.put(BUCKET, "keep.bin", &[7u8; 1000])?;
    let keys = emu.keys(BUCKET)?;
    Ok((emu, keys))
}

fn perfdiag(emu: &Emulator, spec: &str, args: &[&str]) -> Command {
    let mut c = Command::new(bucketdrive_bin());
    c.arg("perfdiag")
        .arg(spec)
        .args(["--endpoint", &emu.url(), "--anonymous"])
        .args(args);
    c
}

/// Runs `cmd` to its end, failing the test if it takes longer than `limit`.
fn run_within(mut cmd: Command, limit: Duration) -> Result<Output> {
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    wait_within(child, limit)
}

fn wait_within(mut child: Child, limit: Duration) -> Result<Output> {
    let deadline = Instant::now() + limit;
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output()?;
            anyhow::bail!(
                "perfdiag did not finish within {limit:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(child.wait_with_output()?)
}

/// A number at `path` (`a.b.c`) in `json`.
fn number(json: &serde_json::Value, path: &str) -> Result<f64> {
    let mut v = json;
    for part in path.split('.') {
        v = v
            .get(part)
            .ok_or_else(|| anyhow::anyhow!("no {path} in the report: {json}"))?;
    }
    v.as_f64()
        .ok_or_else(|| anyhow::anyhow!("{path} is not a number: {v}"))
}

#[test]
fn json_report_has_every_figure_and_the_bucket_is_left_as_it_was() -> Result<()> {
    let (emu, before) = setup()?;
    let started = Instant::now();
    let mut cmd = perfdiag(&emu, &format!("gs://{BUCKET}/data/"), &small(SMALL_STEPS));
    cmd.arg("--json");
    let out = run_within(cmd, Duration::from_secs(120))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(out.status.success(), "perfdiag failed: {stderr}");
    // Neither a progress bar nor log lines when all went well.
    anyhow::ensure!(stderr.is_empty(), "stderr: {stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        anyhow::anyhow!(
            "stdout is not one JSON object ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })?;

    for field in [
        "read_single_stream_mbps",
        "read_parallel_mbps",
        "write_single_stream_mbps",
        "write_parallel_mbps",
        "small_objects_per_s.upload",
        "small_objects_per_s.download",
        "latency_ms.p50",
        "latency_ms.p99",
        "recommended.read_concurrency",
        "recommended.read_part_size",
        "recommended.upload_concurrency",
        "recommended.upload_part_size",
        "recommended.single_shot_threshold",
        "recommended.upload_files_concurrency",
    ] {
        let v = number(&report, field)?;
        anyhow::ensure!(v > 0.0, "{field} is {v}");
    }
    anyhow::ensure!(number(&report, "latency_ms.p99")? >= number(&report, "latency_ms.p50")?);
    anyhow::ensure!(number(&report, "latency_ms.samples")? == 10.0);
    // The parallel figures are the best of their curves, which start at one.
    for (curve, best) in [
        ("read_parallel_curve", "read_parallel_mbps"),
        ("write_parallel_curve", "write_parallel_mbps"),
    ] {
        let points = report[curve]["points"]
            .as_array()
            .ok_or_else(|| anyhow::anyhow!("no {curve}: {report}"))?;
        anyhow::ensure!(points[0]["concurrency"] == 1, "{curve}: {points:?}");
        let peak = points
            .iter()
            .filter_map(|p| p["rate"].as_f64())
            .fold(0.0, f64::max);
        anyhow::ensure!(
            peak == number(&report, best)?,
            "{best} is not {curve}'s best"
        );
        anyhow::ensure!(points.len() <= 3, "1, 2, 4 at most: {points:?}");
    }
    let flags = report["recommended"]["flags"].as_str().unwrap_or_default();
    anyhow::ensure!(
        flags.starts_with("--read-concurrency ") && flags.contains(" --single-shot-threshold "),
        "flags: {flags}"
    );
    let temp = report["temp_prefix"].as_str().unwrap_or_default();
    anyhow::ensure!(temp.starts_with("data/bucketdrive-perfdiag-"), "{temp}");
    // It wrote (and so deleted) the latency probe, the test object, parts, composed objects
    // and the small objects.
    anyhow::ensure!(
        number(&report, "deleted_objects")? > 20.0,
        "{}",
        report["deleted_objects"]
    );
    assert_eq!(
        emu.keys(BUCKET)?,
        before,
        "the bucket holds what it held before"
    );
    anyhow::ensure!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    Ok(())
}

#[test]
fn the_table_shows_the_curves_and_ends_with_mount_flags() -> Result<()> {
    let (emu, before) = setup()?;
    let out = run_within(
        perfdiag(&emu, BUCKET, &small(SMALL_STEPS)),
        Duration::from_secs(120),
    )?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(
        out.status.success(),
        "perfdiag failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    anyhow::ensure!(
        lines[0].starts_with(&format!(
            "bucketdrive perfdiag gs://{BUCKET} via {}",
            emu.url()
        )),
        "{stdout}"
    );
    for want in [
        "first-byte latency    p50 ",
        "single-stream read    ",
        "single-stream write   ",
        "parallel ranged read      ",
        "parallel composite write  ",
    ] {
        anyhow::ensure!(
            lines.iter().any(|l| l.starts_with(want)),
            "no line {want:?}:\n{stdout}"
        );
    }
    // The first row of the curves is concurrency 1, with a figure in every column.
    let row = lines
        .iter()
        .find(|l| l.trim_start().starts_with("1 "))
        .ok_or_else(|| anyhow::anyhow!("no row for concurrency 1:\n{stdout}"))?;
    anyhow::ensure!(row.split_whitespace().count() == 5, "{row}");
    anyhow::ensure!(stdout.contains('*'), "the knee is marked:\n{stdout}");
    let last = lines.last().copied().unwrap_or_default();
    anyhow::ensure!(
        last.trim_start().starts_with("--read-concurrency "),
        "{stdout}"
    );
    assert_eq!(emu.keys(BUCKET)?, before);
    Ok(())
}

/// Starts a slow run, waits until the bucket holds a key containing `marker` under the
/// temporary prefix, sends `signal`, and returns the run's output and what the bucket held
/// when the signal was sent.
fn signal_when(emu: &Emulator, marker: &str, signal: i32) -> Result<(Output, Vec<String>)> {
    // Steps of 2 s, so the signal lands inside one.
    let child = perfdiag(emu, &format!("{BUCKET}/data"), &small("2s"))
        .arg("--json")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(90);
    let seen = loop {
        let keys = emu.keys(BUCKET)?;
        if keys
            .iter()
            .any(|k| k.starts_with("data/bucketdrive-perfdiag-") && k.contains(marker))
        {
            break keys;
        }
        if Instant::now() > deadline {
            let mut child = child;
            let _ = child.kill();
            anyhow::bail!("no {marker} object appeared within 90 s; bucket: {keys:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // SAFETY: kill(2) on a child we own.
    unsafe { libc::kill(child.id() as i32, signal) };
    Ok((wait_within(child, Duration::from_secs(60))?, seen))
}

#[test]
fn ctrl_c_while_parts_upload_deletes_everything_written() -> Result<()> {
    let (emu, before) = setup()?;
    let (out, seen) = signal_when(&emu, "/part-", libc::SIGINT)?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "stderr: {stderr}");
    anyhow::ensure!(
        stderr.trim_end().starts_with("bucketdrive: interrupted; ")
            && stderr.trim_end().ends_with(" test objects deleted")
            && stderr.lines().count() == 1,
        "{stderr}"
    );
    anyhow::ensure!(out.stdout.is_empty(), "no report after Ctrl-C");
    anyhow::ensure!(seen.len() > before.len() + 1, "mid-run: {seen:?}");
    assert_eq!(emu.keys(BUCKET)?, before);
    Ok(())
}

#[test]
fn sigterm_among_the_small_objects_deletes_them_all() -> Result<()> {
    let (emu, before) = setup()?;
    let (out, seen) = signal_when(&emu, "/small-", libc::SIGTERM)?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "stderr: {stderr}");
    anyhow::ensure!(stderr.contains("bucketdrive: terminated; "), "{stderr}");
    anyhow::ensure!(
        seen.iter().any(|k| k.contains("/object")),
        "the test object was there too: {seen:?}"
    );
    assert_eq!(emu.keys(BUCKET)?, before);
    Ok(())
}

#[test]
fn a_missing_bucket_or_an_unusable_key_is_one_line_and_writes_nothing() -> Result<()> {
    let (emu, before) = setup()?;
    let out = run_within(
        perfdiag(&emu, "no-such-bucket/data", &small(SMALL_STEPS)),
        Duration::from_secs(60),
    )?;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "bucketdrive: bucket \"no-such-bucket\" does not exist\n"
    );
    anyhow::ensure!(out.stdout.is_empty());

    let mut cmd = Command::new(bucketdrive_bin());
    cmd.args(["perfdiag", BUCKET, "--endpoint", &emu.url()])
        .args(["--key-file", "/nonexistent/key.json"]);
    let out = run_within(cmd, Duration::from_secs(60))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    anyhow::ensure!(
        stderr.starts_with("bucketdrive: cannot use key file /nonexistent/key.json")
            && stderr.lines().count() == 1,
        "{stderr}"
    );

    let out = run_within(
        perfdiag(&emu, BUCKET, &["--part-size", "1GiB"]),
        Duration::from_secs(60),
    )?;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "bucketdrive: --part-size must be more than 0 and at most --object-size\n"
    );
    assert_eq!(emu.keys(BUCKET)?, before);
    Ok(())
}
