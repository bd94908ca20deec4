//! The Windows adapter behind `bucketdrive.exe`: mount a Google Cloud Storage bucket as a
//! Windows drive with WinFsp.
//!
//! This crate only translates: WinFsp callbacks become calls on
//! [`fs_core::windows::volume::Volume`], which holds every Windows decision (names, case,
//! the handle's life) and is tested on Linux.
//!
//! Everything here is Windows-only, so on any other target the library is empty and the
//! workspace builds, lints and tests there as a whole. The binary (`src/main.rs`) is a thin
//! `main` over [`main`] and needs the `exe` feature, so that a Linux build of the workspace has
//! one `bucketdrive` binary, fs-linux's (see `docs/windows.md` for the Windows build command).
//! On Linux the adapter is type-checked with
//! `--target x86_64-pc-windows-msvc --features cross-check,exe` (`tests/windows_check.sh`).

#![cfg(windows)]

#[cfg(feature = "winfsp")]
mod adapter;
mod control;
#[cfg(feature = "winfsp")]
mod dll;
#[cfg(feature = "winfsp")]
mod mount;
// The descriptors serve the WinFsp volume and the mount's control pipe; without WinFsp only
// their test uses them.
#[cfg_attr(not(feature = "winfsp"), allow(dead_code))]
mod security;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use fs_core::cli::options::CommonArgs;
use fs_core::cli::perfdiag::PerfdiagArgs;

#[derive(Parser)]
#[command(
    name = "bucketdrive",
    version,
    about = "Mount a Google Cloud Storage bucket as a Windows drive"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Mount BUCKET[/PREFIX] (or gs://BUCKET/PREFIX) on a drive letter (X:) or a directory
    /// that does not exist yet.
    Mount(Box<MountArgs>),
    /// Wait for a mount's pending uploads with progress, then unmount it.
    Unmount {
        mountpoint: String,
        /// Return at once; pending uploads stay staged and finish at the next mount.
        #[arg(long)]
        no_wait: bool,
    },
    /// Show what a mount has staged, is uploading, and has uploaded.
    Status {
        mountpoint: String,
        /// Block until nothing is pending, with a progress bar on a terminal.
        #[arg(long)]
        wait: bool,
    },
    /// Measure the link to BUCKET[/PREFIX] (latency, single-stream and parallel reads and
    /// writes, small objects) and recommend mount options. Writes test objects under a
    /// temporary prefix and deletes them at the end, also on Ctrl-C.
    Perfdiag(Box<PerfdiagArgs>),
}

/// Options of `bucketdrive.exe mount`.
#[derive(Args, Debug, Clone)]
pub struct MountArgs {
    /// BUCKET, BUCKET/PREFIX or gs://BUCKET/PREFIX.
    pub bucket: String,
    /// A drive letter such as X:, or a directory that does not exist yet (its parent must).
    pub mountpoint: String,
    /// Options shared with Linux.
    #[command(flatten)]
    pub common: CommonArgs,
    /// Show the drive as a network drive (\\bucketdrive\BUCKET), so Explorer shows icons
    /// instead of reading every file for thumbnails. On by default.
    #[arg(long, overrides_with = "no_network_mode")]
    pub network_mode: bool,
    /// Show the drive as a local disk instead of a network drive.
    #[arg(long)]
    pub no_network_mode: bool,
    /// Security descriptor every file and directory reports, in SDDL. Default: full access
    /// for the user who mounted, SYSTEM and Administrators, nobody else. Under the WinFsp
    /// launcher (which runs the mount as SYSTEM) name the group that may use it, e.g.
    /// "O:BAG:BAD:P(A;;FA;;;SY)(A;;FA;;;BA)(A;;FA;;;S-1-5-21-…)".
    #[arg(long)]
    pub security: Option<String>,
    /// Mount only these buckets (comma-separated), refusing any other: for the WinFsp
    /// launcher, where any user allowed to start an instance names the bucket.
    /// (Given once: a second --only-buckets is refused, not added to the first.)
    #[arg(long, value_delimiter = ',', action = clap::ArgAction::Set)]
    pub only_buckets: Vec<String>,
    /// How long Windows may cache a file's attributes before asking again.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    pub file_info_timeout: Duration,
}

/// `bucketdrive.exe`: parses the command line and runs the command.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        #[cfg(feature = "winfsp")]
        Command::Mount(args) => return mount::run(*args),
        #[cfg(not(feature = "winfsp"))]
        Command::Mount(_) => Err(
            "this bucketdrive.exe was built without WinFsp support (the \
                                  `winfsp` feature), so it cannot mount; perfdiag, status and \
                                  unmount work"
                .to_string(),
        ),
        Command::Perfdiag(args) => return fs_core::cli::perfdiag::command(*args),
        Command::Status { mountpoint, wait } => {
            let pipe = control::pipe_name(&mountpoint);
            fs_core::cli::progress::status_command(&|what| control::request(&pipe, what), wait)
        }
        Command::Unmount {
            mountpoint,
            no_wait,
        } => control::unmount_command(&mountpoint, no_wait),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bucketdrive: {e}");
            ExitCode::FAILURE
        }
    }
}
