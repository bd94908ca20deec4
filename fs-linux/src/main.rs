//! `bucketdrive`: mount a Google Cloud Storage bucket with FUSE.

mod completions;
mod control;
mod daemon;
mod fuse;
mod mount;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use fs_core::cli::options::CommonArgs;
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
    /// Print a completion script for SHELL to stdout.
    Completions { shell: clap_complete::Shell },
    /// Write the man pages into DIR (used to build packages).
    #[command(hide = true)]
    Manpages { dir: PathBuf },
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
    /// Options shared with Windows.
    #[command(flatten)]
    pub common: CommonArgs,
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
    /// Kernel read-ahead for the mount, so sequential reads arrive in 1 MiB requests.
    #[arg(long, value_parser = parse_size, default_value = "4MiB")]
    pub kernel_read_ahead: u64,
    /// Store chmod and chown in goog-reserved-posix-* metadata (as gsutil -P and rclone do)
    /// and show them. Without it, modes and owners come from the mount options.
    #[arg(long)]
    pub posix_metadata: bool,
}

fn main() -> ExitCode {
    pin_malloc_mmap_threshold();
    let cli = Cli::parse();
    match cli.command {
        Command::Mount(args) => mount::run(*args),
        Command::Completions { shell } => completions::print_completions(shell),
        Command::Manpages { dir } => completions::write_manpages(&dir),
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
