//! `bucketdrive`: mount a Google Cloud Storage bucket with FUSE.

mod control;
mod daemon;
mod fuse;
mod mount;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use fs_core::config::{parse_mode, parse_size};

#[derive(Parser)]
#[command(
    name = "bucketdrive",
    version,
    about = "Mount a Google Cloud Storage bucket as a drive"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Mount BUCKET[/PREFIX] (or gs://BUCKET/PREFIX) on MOUNTPOINT.
    Mount(Box<MountArgs>),
    /// Unmount a bucketdrive mount, then wait for its pending uploads with progress.
    Unmount {
        mountpoint: PathBuf,
        /// Return at once; pending uploads stay staged and finish at the next mount.
        #[arg(long)]
        no_wait: bool,
    },
    /// Show what a mount has staged, is uploading, and has uploaded.
    Status {
        mountpoint: PathBuf,
        /// Block until nothing is pending, with a progress bar on a terminal.
        #[arg(long)]
        wait: bool,
    },
}

/// Options of `bucketdrive mount`.
#[derive(Args, Debug, Clone)]
pub struct MountArgs {
    /// BUCKET, BUCKET/PREFIX or gs://BUCKET/PREFIX.
    pub bucket: String,
    /// An existing empty directory.
    pub mountpoint: PathBuf,
    /// Stay attached to the terminal instead of detaching once the mount is ready.
    #[arg(long)]
    pub foreground: bool,
    /// JSON API endpoint, e.g. http://127.0.0.1:4443. Default: STORAGE_EMULATOR_HOST if set,
    /// else https://storage.googleapis.com.
    #[arg(long)]
    pub endpoint: Option<String>,
    /// Service-account JSON key file, instead of Application Default Credentials.
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// Send no credentials (public buckets, emulators). Implied by STORAGE_EMULATOR_HOST.
    #[arg(long)]
    pub anonymous: bool,
    /// How long file and directory attributes are cached.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    pub stat_ttl: Duration,
    /// How long "no such file" answers are cached.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    pub negative_ttl: Duration,
    /// Owner of every file. Default: the user running bucketdrive.
    #[arg(long)]
    pub uid: Option<u32>,
    /// Group of every file. Default: the group running bucketdrive.
    #[arg(long)]
    pub gid: Option<u32>,
    /// Permission bits of files, in octal.
    #[arg(long, value_parser = parse_mode, default_value = "644")]
    pub file_mode: u16,
    /// Permission bits of directories, in octal.
    #[arg(long, value_parser = parse_mode, default_value = "755")]
    pub dir_mode: u16,
    /// Size of one read-ahead part (one ranged GET).
    #[arg(long, value_parser = parse_size, default_value = "8MiB")]
    pub read_part_size: u64,
    /// Ranged GETs in flight per file while reading sequentially.
    #[arg(long, default_value_t = 8)]
    pub read_concurrency: usize,
    /// Memory for read-ahead, shared by all open files.
    #[arg(long, value_parser = parse_size, default_value = "1GiB")]
    pub max_read_memory: u64,
    /// Kernel read-ahead for the mount, so sequential reads arrive in 1 MiB requests.
    #[arg(long, value_parser = parse_size, default_value = "4MiB")]
    pub kernel_read_ahead: u64,
    /// Where written data is staged and the upload journal kept. Default: under the user's
    /// cache directory, one sub-directory per mount.
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Most bytes staged in the cache directory at once (e.g. 20GiB). When full, writes wait
    /// for closed files to upload; ENOSPC only when the files still open cannot fit. Default:
    /// bounded by the disk alone.
    #[arg(long, value_parser = parse_size)]
    pub cache_size: Option<u64>,
    /// How long after close() a file's upload starts.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    pub write_back_delay: Duration,
    /// Make close() wait for the upload and return its error.
    #[arg(long)]
    pub upload_on_close: bool,
    /// Files under this size are uploaded in one request.
    #[arg(long, value_parser = parse_size, default_value = "16MiB")]
    pub single_shot_threshold: u64,
    /// Smallest part of a parallel composite upload.
    #[arg(long, value_parser = parse_size, default_value = "32MiB")]
    pub upload_part_size: u64,
    /// Parts of one file uploading at once.
    #[arg(long, default_value_t = 8)]
    pub upload_concurrency: usize,
    /// How big files are uploaded: composite (parallel parts) or resumable (one session).
    #[arg(long, value_enum, default_value = "composite")]
    pub upload_mode: UploadModeArg,
    /// Files uploading at once.
    #[arg(long, default_value_t = 32)]
    pub upload_files_concurrency: usize,
    /// Most objects a directory rename moves; more gives EXDEV.
    #[arg(long, default_value_t = 10_000)]
    pub rename_dir_limit: usize,
    /// Store chmod and chown in goog-reserved-posix-* metadata (as gsutil -P and rclone do)
    /// and show them. Without it, modes and owners come from the mount options.
    #[arg(long)]
    pub posix_metadata: bool,
    /// Free space statfs reports (a bucket has no limit; some programs refuse to copy onto a
    /// disk that looks full). Never 0.
    #[arg(long, value_parser = parse_size, default_value = "1PiB")]
    pub free_space: u64,
    /// Mount read-only: every change fails with EROFS.
    #[arg(long)]
    pub read_only: bool,
    /// Log level (error, warn, info, debug, trace). RUST_LOG overrides it.
    #[arg(long, default_value = "info")]
    pub log_level: String,
    /// Append logs to this file. Default: standard error in the foreground, nowhere when detached.
    #[arg(long)]
    pub log_file: Option<PathBuf>,
}

/// `--upload-mode` values.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum UploadModeArg {
    Composite,
    Resumable,
}

fn main() -> ExitCode {
    pin_malloc_mmap_threshold();
    let cli = Cli::parse();
    match cli.command {
        Command::Mount(args) => mount::run(*args),
        Command::Status { mountpoint, wait } => match control::status_command(&mountpoint, wait) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("bucketdrive: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Unmount {
            mountpoint,
            no_wait,
        } => match control::unmount_command(&mountpoint, no_wait) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("bucketdrive: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

/// Makes glibc serve every allocation of 1 MiB or more (read-ahead parts are up to
/// `--read-part-size`) with its own mmap, returned to the system on free. Without this, glibc
/// raises the threshold after the first large free and keeps later part buffers in its heap
/// arenas, so the process stays larger than the read budget long after the parts are gone.
fn pin_malloc_mmap_threshold() {
    // SAFETY: mallopt only adjusts allocator tuning; it is called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1024 * 1024);
    }
}
