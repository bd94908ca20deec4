//! `bucketdrive perfdiag BUCKET[/PREFIX]`: measures the link to a bucket the way a mount uses
//! it, like `gsutil perfdiag`, and recommends mount settings for it.
//!
//! This module is the command around the measurement: its flags, connecting with the same
//! endpoint and credential flags as `mount`, Ctrl-C and SIGTERM, deleting the test objects
//! whatever happened, and printing. The parts, each in its own file:
//!
//! - [`plan`]: what is measured, and how each step is bounded in bytes and in time;
//! - [`runner`]: the requests and the clock, generic over the store;
//! - [`curve`]: when a concurrency ladder stops, and where it flattens;
//! - [`recommend`]: mount flags from the figures;
//! - [`cleanup`]: the temporary prefix, the record of what was written, and deleting it;
//! - [`report`]: the table and the JSON object; [`bar`]: the progress bar.
//!
//! After Ctrl-C or SIGTERM the run is dropped (every request in flight is cancelled), the
//! objects are deleted, and the process exits with 130 or 143. A second signal while deleting
//! stops at once and names the prefix that may still hold objects.

pub mod bar;
pub mod cleanup;
pub mod curve;
pub mod plan;
pub mod recommend;
pub mod report;
pub mod runner;

#[cfg(test)]
mod tests;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use clap::Args;

use self::bar::Bar;
use self::cleanup::Written;
use self::plan::Plan;
use self::report::{Report, Target};
use self::runner::Runner;
use super::options::StoreArgs;
use crate::config::{parse_bucket_spec, parse_size};
use crate::store::gcs::GcsStore;

/// Options of `bucketdrive perfdiag`.
#[derive(Args, Debug, Clone)]
pub struct PerfdiagArgs {
    /// BUCKET, BUCKET/PREFIX or gs://BUCKET/PREFIX. The test objects go under
    /// PREFIX/bucketdrive-perfdiag-<time>-<random>/ and are deleted at the end.
    pub bucket: String,
    /// Endpoint and credentials, as for mount.
    #[command(flatten)]
    pub store: StoreArgs,
    /// Print one JSON object instead of the table, and no progress bar.
    #[arg(long)]
    pub json: bool,
    /// Size of the test object the single-stream steps write and read, and the ranged reads
    /// read.
    #[arg(long, value_parser = parse_size, default_value = "128MiB")]
    pub object_size: u64,
    /// Size of one ranged read and of one part of a composite write.
    #[arg(long, value_parser = parse_size, default_value = "8MiB")]
    pub part_size: u64,
    /// Longest time of one concurrency step (the single-stream steps get twice it).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "4s")]
    pub step_time: Duration,
    /// Most bytes one concurrency step reads or writes.
    #[arg(long, value_parser = parse_size, default_value = "512MiB")]
    pub step_bytes: u64,
    /// Highest concurrency tried: 1, 2, 4, … up to this, or until the figures stop rising.
    #[arg(long, default_value_t = 64)]
    pub max_concurrency: usize,
    /// First-byte latency samples.
    #[arg(long, default_value_t = 100)]
    pub latency_samples: usize,
    /// Most 10 KiB objects one small-object step uploads.
    #[arg(long, default_value_t = 1000)]
    pub small_objects: usize,
    /// Time for all the measurements; deleting the test objects comes after.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "150s")]
    pub time_limit: Duration,
    /// Log level on standard error (error, warn, info, debug, trace). RUST_LOG overrides it.
    #[arg(long, default_value = "warn")]
    pub log_level: String,
}

impl PerfdiagArgs {
    pub fn plan(&self) -> Plan {
        Plan {
            object_size: self.object_size,
            part_size: self.part_size,
            step_time: self.step_time,
            step_bytes: self.step_bytes,
            max_concurrency: self.max_concurrency,
            latency_samples: self.latency_samples,
            small_objects: self.small_objects,
            time_limit: self.time_limit,
        }
    }
}

/// Runs `bucketdrive perfdiag`: the report on standard output, errors as one line each on
/// standard error.
pub fn command(args: PerfdiagArgs) -> ExitCode {
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            for line in &failure.lines {
                eprintln!("bucketdrive: {line}");
            }
            ExitCode::from(failure.code)
        }
    }
}

/// Why the command failed, and its exit code.
struct Failure {
    lines: Vec<String>,
    code: u8,
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Failure {
            lines: vec![message],
            code: 1,
        }
    }
}

/// A signal that ends the run.
#[derive(Debug, Clone, Copy)]
enum Caught {
    Interrupt,
    Terminate,
}

impl Caught {
    /// 128 + the signal's number, as a shell reports a process the signal killed.
    fn code(self) -> u8 {
        match self {
            Caught::Interrupt => 130,
            Caught::Terminate => 143,
        }
    }

    fn word(self) -> &'static str {
        match self {
            Caught::Interrupt => "interrupted",
            Caught::Terminate => "terminated",
        }
    }
}

/// Ctrl-C and SIGTERM (on Windows: Ctrl-C, Ctrl-Break, the console closing), caught from
/// before the first request, so none ends the process without deleting what it wrote.
struct Signals {
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(windows)]
    ctrl_c: tokio::signal::windows::CtrlC,
    #[cfg(windows)]
    ctrl_break: tokio::signal::windows::CtrlBreak,
    #[cfg(windows)]
    ctrl_close: tokio::signal::windows::CtrlClose,
}

impl Signals {
    /// Installs the handlers; needs a runtime context.
    fn install() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Signals {
                int: signal(SignalKind::interrupt())?,
                term: signal(SignalKind::terminate())?,
            })
        }
        #[cfg(windows)]
        {
            use tokio::signal::windows::{ctrl_break, ctrl_c, ctrl_close};
            Ok(Signals {
                ctrl_c: ctrl_c()?,
                ctrl_break: ctrl_break()?,
                ctrl_close: ctrl_close()?,
            })
        }
    }

    async fn next(&mut self) -> Caught {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.int.recv() => Caught::Interrupt,
                _ = self.term.recv() => Caught::Terminate,
            }
        }
        #[cfg(windows)]
        {
            // Ctrl-Break and a closed console window are Windows' ways to ask a console
            // program to stop.
            tokio::select! {
                _ = self.ctrl_c.recv() => Caught::Interrupt,
                _ = self.ctrl_break.recv() => Caught::Terminate,
                _ = self.ctrl_close.recv() => Caught::Terminate,
            }
        }
    }
}

fn run(args: &PerfdiagArgs) -> Result<(), Failure> {
    let (bucket, prefix) = parse_bucket_spec(&args.bucket)?;
    let plan = args.plan();
    plan.check()?;
    super::logging::init_stderr(&args.log_level)?;
    let rt = super::lifecycle::runtime()?;
    let mut signals = rt
        .block_on(async { Signals::install() })
        .map_err(|e| format!("cannot catch Ctrl-C and SIGTERM: {e}"))?;
    let opts = args.store.gcs_options()?;
    for note in &opts.notes {
        eprintln!("bucketdrive: {note}");
    }
    let bar = Bar::new(!args.json, plan.steps());
    bar.message("connecting");

    // Nothing is written before the bucket answers, so a signal here has nothing to delete.
    let connected = rt.block_on(async {
        tokio::select! {
            store = async {
                let store = GcsStore::connect(&bucket, &opts).await.map_err(|e| e.message)?;
                store.check_access().await?;
                Ok::<_, String>(store)
            } => store.map_err(Failure::from),
            caught = signals.next() => Err(Failure {
                lines: vec![caught.word().to_string()],
                code: caught.code(),
            }),
        }
    });
    let store = match connected {
        Ok(s) => Arc::new(s),
        Err(f) => {
            bar.clear();
            return Err(f);
        }
    };

    let root = cleanup::temp_prefix(&prefix, SystemTime::now(), rand::random());
    let written = Arc::new(Written::new(&bucket, &root));
    tracing::info!(endpoint = %opts.endpoint, prefix = %written.url(), "measuring");
    let runner = Runner::new(store.clone(), plan.clone(), written.clone());
    let outcome = rt.block_on(async {
        tokio::select! {
            measured = runner.run(&bar) => Ok(measured),
            caught = signals.next() => Err(caught),
        }
    });
    drop(runner);

    bar.message("deleting the test objects");
    // After a cancelled or failed run a write may still be landing: give it a moment.
    let settle = match &outcome {
        Ok(Ok(_)) => Duration::ZERO,
        _ => Duration::from_secs(1),
    };
    let removed = rt.block_on(async {
        tokio::select! {
            r = cleanup::remove_all(&*store, &written, settle) => r,
            caught = signals.next() => Err(format!(
                "{} again while deleting: test objects may be left under {}",
                caught.word(),
                written.url()
            )),
        }
    });
    bar.clear();
    rt.shutdown_timeout(Duration::from_secs(1));

    let cleanup_line = removed.err();
    match outcome {
        Err(caught) => {
            let mut lines = vec![format!(
                "{}; {} test objects deleted",
                caught.word(),
                written.deleted()
            )];
            lines.extend(cleanup_line);
            Err(Failure {
                lines,
                code: caught.code(),
            })
        }
        Ok(Err(e)) => {
            let mut lines = vec![e];
            lines.extend(cleanup_line);
            Err(Failure { lines, code: 1 })
        }
        Ok(Ok(measured)) => {
            let target = Target {
                bucket,
                prefix,
                endpoint: opts.endpoint.clone(),
                temp_prefix: root,
            };
            let report = Report::new(&target, &plan, &measured, written.deleted());
            if args.json {
                println!("{}", report.json());
            } else {
                print!("{}", report.table());
            }
            match cleanup_line {
                Some(line) => Err(Failure::from(line)),
                None => Ok(()),
            }
        }
    }
}
