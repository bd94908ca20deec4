//! `bucketdrive`: mount a Google Cloud Storage bucket with FUSE.

mod completions;
mod control;
mod daemon;
mod fuse;
mod kernel_mount;
mod mount;
mod mount_options;
mod notify;
mod processes;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use fs_core::cli::options::CommonArgs;
use fs_core::cli::perfdiag::PerfdiagArgs;
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
    /// Mount BUCKET[/PREFIX] (or gs://BUCKET/PREFIX) on MOUNTPOINT. Also run as
    /// `bucketdrive BUCKET MOUNTPOINT -o OPTIONS` (by `mount -t fuse.bucketdrive` and fstab),
    /// where each option is a flag below without its dashes, `_` for `-`: `cache_dir=/x,ro`.
    Mount(Box<MountArgs>),
    /// Unmount a bucketdrive mount, then wait for its pending uploads with progress.
    Unmount {
        mountpoint: PathBuf,
        /// Return at once; pending uploads stay staged and finish at the next mount.
        #[arg(long)]
        no_wait: bool,
        /// Only detach a bucketdrive mount whose daemon is gone (after a crash), and leave
        /// anything else mounted there alone; succeeds either way. The systemd unit's stop hook.
        #[arg(long, conflicts_with = "no_wait")]
        stale: bool,
    },
    /// Show what a mount has staged, is uploading, and has uploaded.
    Status {
        mountpoint: PathBuf,
        /// Block until nothing is pending, with a progress bar on a terminal.
        #[arg(long)]
        wait: bool,
    },
    /// Measure the link to BUCKET[/PREFIX] (latency, single-stream and parallel reads and
    /// writes, small objects) and recommend mount options. Writes test objects under a
    /// temporary prefix and deletes them at the end, also on Ctrl-C.
    Perfdiag(Box<PerfdiagArgs>),
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
    /// Let every user on this machine use the mount (file permissions still apply). Not root:
    /// needs user_allow_other in /etc/fuse.conf.
    #[arg(long)]
    pub allow_other: bool,
    /// Let root use the mount too. Not root: needs user_allow_other in /etc/fuse.conf.
    #[arg(long, conflicts_with = "allow_other")]
    pub allow_root: bool,
    /// Owner files show. Default: the user running bucketdrive. To let that user in when
    /// root mounts for them, add --allow-other.
    #[arg(long)]
    pub uid: Option<u32>,
    /// Group files show. Default: the group running bucketdrive.
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
    /// FUSE passthrough (Linux 6.9+, root mounts): the kernel itself reads and writes local
    /// files at the local disk's speed, without the daemon. `auto`: on --read-only mounts it
    /// reads files wholly in the --read-cache-dir, once checked, from their cache files; on
    /// writable ones it reads and writes new and rewritten files straight in their staged
    /// copies (not with --cache-size). `on`: cached reads on writable mounts too; `writes`:
    /// both; `off`: never. Passthrough turns the kernel's write-back cache off for the mount's
    /// other writes (docs/semantics.md). The start-up log says which, and why not.
    #[arg(long, default_value = "auto", value_parser = parse_passthrough)]
    pub passthrough: fs_core::filesystem::PassthroughMode,
    /// No program may be run from the mount (the kernel's noexec), as fstab's `noexec`.
    #[arg(long)]
    pub noexec: bool,
    /// Symbolic links on the mount are not followed when resolving paths (the kernel's
    /// nosymfollow, Linux 5.10), as fstab's `nosymfollow`. Root mounts only: fusermount3
    /// cannot set it.
    #[arg(long)]
    pub nosymfollow: bool,
    /// Store chmod and chown in goog-reserved-posix-* metadata (as gsutil -P and rclone do)
    /// and show them. Without it, modes and owners come from the mount options. Whoever can
    /// write the bucket can write that metadata: see the next three options.
    #[arg(long)]
    pub posix_metadata: bool,
    /// With --posix-metadata, also show and store setuid, setgid and sticky bits (dropped
    /// otherwise, so no bucket writer can make a setuid file here).
    #[arg(long, requires = "posix_metadata")]
    pub posix_special_modes: bool,
    /// With --posix-metadata, owners (uids, comma-separated) a file may show from its
    /// metadata besides --uid; any other shows as --uid, and chown to it is refused.
    #[arg(long, value_delimiter = ',', requires = "posix_metadata")]
    pub posix_uids: Vec<u32>,
    /// With --posix-metadata, groups (gids) a file may show besides --gid, as --posix-uids.
    #[arg(long, value_delimiter = ',', requires = "posix_metadata")]
    pub posix_gids: Vec<u32>,
}

fn main() -> ExitCode {
    pin_malloc_mmap_threshold();
    let cli = match parse_cli() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    match cli.command {
        Command::Mount(args) => mount::run(*args),
        Command::Perfdiag(args) => fs_core::cli::perfdiag::command(*args),
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
            stale: true,
            ..
        } => match mount::unmount_stale(&mountpoint) {
            Ok(what) => {
                eprintln!("bucketdrive: {what}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("bucketdrive: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Unmount {
            mountpoint,
            no_wait,
            ..
        } => match control::unmount_command(&mountpoint, no_wait) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("bucketdrive: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

/// Parses the command line, accepting the mount-helper form `bucketdrive BUCKET DIR -o OPTS`.
fn parse_cli() -> Result<Cli, ExitCode> {
    let cmd = Cli::command();
    let subcommands: Vec<String> = cmd
        .get_subcommands()
        .flat_map(|c| std::iter::once(c.get_name()).chain(c.get_all_aliases()))
        .map(String::from)
        .chain(["help".to_string()])
        .collect();
    let mount_flags: Vec<String> = cmd
        .find_subcommand("mount")
        .map(|m| {
            m.get_arguments()
                .filter_map(|a| a.get_long())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    let args = mount_options::rewrite(std::env::args_os().collect(), &subcommands, &mount_flags)
        .map_err(|e| {
            eprintln!("bucketdrive: {e}");
            ExitCode::from(2)
        })?;
    let matches = cmd.get_matches_from(args);
    Cli::from_arg_matches(&matches).map_err(|e| {
        let _ = e.print();
        ExitCode::from(2)
    })
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

fn parse_passthrough(s: &str) -> Result<fs_core::filesystem::PassthroughMode, String> {
    s.parse()
}
