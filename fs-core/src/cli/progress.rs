//! The client side of `bucketdrive status` and `unmount`: asking a running mount for its
//! upload status, waiting with a progress bar, and the report at the end.
//!
//! The transport is the platform's: each call takes `request`, which sends one request word
//! (`status`, `drain`, `skip-drain`) to the mount and returns its [`Status`] reply.

use std::time::{Duration, Instant};

use crate::write::writeback::Status;

/// Sends one request to the mount and returns its status.
pub type Request<'a> = &'a dyn Fn(&str) -> Result<Status, String>;

/// One request over a connected control channel: the word and a newline out, one JSON
/// status line back.
pub fn exchange<C: std::io::Read + std::io::Write>(
    mut channel: C,
    what: &str,
) -> Result<Status, String> {
    use std::io::BufRead;
    channel
        .write_all(format!("{what}\n").as_bytes())
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    std::io::BufReader::new(channel)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    serde_json::from_str(&line).map_err(|e| format!("bad status reply: {e}"))
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

/// `bucketdrive status MOUNTPOINT [--wait]`.
pub fn status_command(request: Request, wait: bool) -> Result<(), String> {
    let first = request("status")?;
    if !wait {
        print_status(&first, None);
        return Ok(());
    }
    let last = wait_with_progress(request, first, false)?;
    print_status(&last.status, Some(last.rate));
    Ok(())
}

/// The first half of `bucketdrive unmount`: with `no_wait`, tells the mount to leave pending
/// uploads staged; otherwise starts every pending upload now and waits for them with progress.
/// Returns the last status, or `None` if the mount has no control channel (read-only).
pub fn before_unmount(request: Request, no_wait: bool) -> Result<Option<Status>, String> {
    let first = request(if no_wait { "skip-drain" } else { "drain" }).ok();
    match (first, no_wait) {
        (Some(first), false) => Ok(Some(wait_with_progress(request, first, true)?.status)),
        (first, _) => Ok(first),
    }
}

/// The second half of `bucketdrive unmount`, once the mount is gone: what stayed staged.
pub fn after_unmount(last: Option<Status>, no_wait: bool) -> Result<(), String> {
    let Some(s) = last else {
        return Ok(());
    };
    if no_wait && s.pending_files > 0 {
        println!(
            "{} files ({:.1} MiB) stay staged and upload at the next mount",
            s.pending_files,
            mib(s.pending_bytes)
        );
    }
    if s.held_files > 0 {
        eprintln!(
            "{} files ({:.1} MiB) were not saved: a write to them or their last close failed, so \
             the bucket keeps their last whole version; their changes stay staged, not uploaded",
            s.held_files,
            mib(s.held_bytes)
        );
    }
    if !no_wait && s.failed_files > 0 {
        return Err(format!(
            "unmounted, but {} files ({:.1} MiB) could not be uploaded; they stay staged and \
             upload at the next mount",
            s.failed_files,
            mib(s.pending_bytes)
        ));
    }
    Ok(())
}

/// Waits until `alive` says the mount's process has gone, for at most a minute.
pub fn wait_for_exit(alive: &dyn Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while alive() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The status when a wait ended, and the upload rate while waiting.
pub struct Waited {
    pub status: Status,
    pub rate: f64,
}

/// Polls the mount until nothing is pending, with a progress bar on a terminal. With `drain`,
/// each poll keeps every pending upload going now, and the wait also ends when everything
/// still pending has failed (it is retried with backoff; waiting longer would not help).
pub fn wait_with_progress(request: Request, first: Status, drain: bool) -> Result<Waited, String> {
    let started = Instant::now();
    let bar = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        let b = indicatif::ProgressBar::new(first.pending_bytes.max(1));
        b.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        Some(b)
    } else {
        None
    };
    let total = first.pending_bytes;
    loop {
        let s = request(if drain { "drain" } else { "status" })?;
        if let Some(b) = &bar {
            b.set_position(total.saturating_sub(s.pending_bytes));
            b.set_message(format!("{} files pending", s.pending_files));
        }
        // Failed uploads back off; files still being written wait for their close.
        let stuck =
            drain && s.uploading_files == 0 && s.failed_files + s.unsaved_files == s.pending_files;
        if (s.pending_files == 0 && s.uploading_files == 0) || stuck {
            if let Some(b) = bar {
                b.finish_and_clear();
            }
            let secs = started.elapsed().as_secs_f64();
            let rate =
                (s.uploaded_bytes.saturating_sub(first.uploaded_bytes)) as f64 / secs.max(0.001);
            return Ok(Waited { status: s, rate });
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub fn print_status(s: &Status, rate: Option<f64>) {
    if s.offline {
        println!(
            "offline:   the bucket cannot be reached; listings show the last state seen and \
             changes wait to upload"
        );
    }
    println!(
        "pending:   {} files, {:.1} MiB",
        s.pending_files,
        mib(s.pending_bytes)
    );
    println!(
        "uploading: {} files, {:.1} MiB/s over the last 10 s",
        s.uploading_files,
        mib(s.upload_rate)
    );
    println!(
        "uploaded:  {} files, {:.1} MiB since mount",
        s.uploaded_files,
        mib(s.uploaded_bytes)
    );
    if let Some(r) = rate {
        println!("throughput: {:.1} MiB/s while waiting", mib(r as u64));
    }
    println!("conflicts: {}", s.conflicts);
    println!("failures:  {}", s.failures);
    if s.held_files > 0 {
        println!(
            "not saved: {} files, {:.1} MiB (a write or the last close failed: kept staged, not uploaded)",
            s.held_files,
            mib(s.held_bytes)
        );
    }
}
