//! `bucketdrive.exe mount`: checks, the runtime, the WinFsp host, and the wait for an unmount.
//!
//! The mount runs in the foreground until Ctrl+C, Ctrl+Break (how the WinFsp launcher service
//! stops a file system it started), logoff or shutdown, or `bucketdrive.exe unmount`. Pending
//! uploads then finish before the process exits, unless `unmount --no-wait` asked to leave them
//! staged for the next mount.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::SystemTime;

use fs_core::cli::lifecycle;
use fs_core::store::gcs::GcsStore;
use fs_core::windows::volume::{Volume, MAX_NAME_UNITS};
use fs_core::windows::{launcher_bucket_spec, normalize_mountpoint, to_filetime};
use winfsp::host::{FileSystemHost, FileSystemParams, VolumeParams};

use crate::adapter::BucketFs;
use crate::security::Descriptor;
use crate::MountArgs;

/// WinFsp dispatcher threads. WinFsp's default is one per processor, 4 to 16. Reads, writes
/// and listings leave their thread at once (they pend on the runtime), but the namespace calls
/// block theirs, and Explorer keeps many in flight at once; a queued request that waits past
/// WinFsp's IRP timeout is cancelled. Threads that wait cost little.
const DISPATCHER_THREADS: u32 = 32;

pub fn run(args: MountArgs) -> ExitCode {
    match serve(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            tracing::error!("{msg}");
            eprintln!("bucketdrive: {msg}");
            ExitCode::FAILURE
        }
    }
}

/// A drive letter must be free; a directory must not exist yet (WinFsp creates it) but its
/// parent must.
fn check_mountpoint(mountpoint: &str) -> Result<String, String> {
    let m = normalize_mountpoint(mountpoint);
    let is_drive = m.len() == 2 && m.ends_with(':') && m.as_bytes()[0].is_ascii_alphabetic();
    if is_drive {
        if Path::new(&format!("{m}\\")).exists() {
            return Err(format!("drive {m} is in use: pick a free drive letter"));
        }
        return Ok(m);
    }
    let p = Path::new(&m);
    if p.exists() {
        return Err(format!(
            "{m} exists: mount on a drive letter (X:) or on a directory that does not exist yet"
        ));
    }
    match p.parent() {
        Some(parent) if parent.as_os_str().is_empty() || parent.is_dir() => Ok(m),
        _ => Err(format!("the parent directory of {m} does not exist")),
    }
}

fn volume_params(args: &MountArgs, bucket: &str, read_only: bool) -> FileSystemParams {
    let mut vp = VolumeParams::new();
    vp.filesystem_name("bucketdrive")
        .sector_size(4096)
        .sectors_per_allocation_unit(1)
        .max_component_length(MAX_NAME_UNITS as u16)
        .volume_creation_time(to_filetime(SystemTime::now()))
        .volume_serial_number(crc32c::crc32c(bucket.as_bytes()))
        // The one timeout WinFsp reads from these parameters. The per-kind setters
        // (`dir_info_timeout`, `security_timeout`, ...) only take effect with
        // `VolumeParams.Version` set, which winfsp-rs leaves at 0, so none is used.
        .file_info_timeout(u32::try_from(args.file_info_timeout.as_millis()).unwrap_or(u32::MAX))
        // Case-insensitive lookups, names keep their case, full Unicode.
        .case_sensitive_search(false)
        .case_preserved_names(true)
        .unicode_on_disk(true)
        // No ACLs in a bucket, no alternate streams (so no Zone.Identifier), no reparse
        // points, no extended attributes.
        .persistent_acls(false)
        .named_streams(false)
        .reparse_points(false)
        .extended_attributes(false)
        .read_only_volume(read_only)
        // Cleanup only matters for files that were changed or are to be deleted.
        .post_cleanup_when_modified_only(true)
        .flush_and_purge_on_cleanup(true)
        // WinFsp matches enumeration patterns itself, with Windows' rules; the core answers
        // lookups of one name in a directory (`get_dir_info_by_name`).
        .pass_query_directory_pattern(false)
        .pass_query_directory_filename(true);
    if !args.no_network_mode {
        vp.prefix(format!(r"\bucketdrive\{bucket}"));
    }
    let mut params = FileSystemParams::default_params(vp);
    params.use_dir_info_by_name = true;
    params
}

fn serve(args: &MountArgs) -> Result<(), String> {
    let common = &args.common;
    let (bucket, prefix) = fs_core::config::parse_bucket_spec(&launcher_bucket_spec(&args.bucket))?;
    if !args.only_buckets.is_empty() && !args.only_buckets.contains(&bucket) {
        return Err(format!(
            "bucket {bucket} is not one this mount may serve (--only-buckets {})",
            args.only_buckets.join(",")
        ));
    }
    let mountpoint = check_mountpoint(&args.mountpoint)?;
    let me = crate::security::current_user_sid()?;
    let sddl = match &args.security {
        Some(given) => given.clone(),
        None => crate::security::files_sddl(&me),
    };
    let security = Descriptor::from_sddl(&sddl)?;
    let pipe_security = Descriptor::from_sddl(&crate::security::pipe_sddl(&me))?;
    // Decided once, before anything uses the cache directory.
    let cache = common.cache_root(&bucket, &prefix, Path::new(&mountpoint))?;
    // Always attached: the WinFsp launcher runs the mount as a foreground process.
    fs_core::cli::logging::init(common, &[], fs_core::cli::logging::Destination::Attached)?;
    let _winfsp = crate::dll::init()?;
    let rt = lifecycle::runtime()?;
    fs_core::cli::metrics::serve(&rt, common.metrics_addr.as_deref())?;
    let fs = lifecycle::open_filesystem(&rt, common, &cache, &bucket, &prefix, |_| {})?;
    let volume = Arc::new(Volume::new(fs.clone(), &bucket));
    let context = BucketFs::new(volume, rt.handle().clone(), security);
    // WinFsp's fine guard: most callbacks run concurrently (the core locks per handle); only
    // namespace-wide changes such as rename run alone.
    let mut host: FileSystemHost<BucketFs<GcsStore>> = FileSystemHost::new_with_options_async(
        volume_params(args, &bucket, fs.is_read_only()),
        context,
    )
    .map_err(|e| format!("cannot create the WinFsp file system: {e:?}"))?;
    host.mount(mountpoint.as_str())
        .map_err(|e| format!("cannot mount on {mountpoint}: {e:?}"))?;
    if let Err(e) = host.start_with_threads(DISPATCHER_THREADS) {
        host.unmount();
        return Err(format!("cannot start the WinFsp dispatcher: {e:?}"));
    }

    let control = Arc::new(lifecycle::Control::default());
    let (unmount_tx, mut unmount_rx) = tokio::sync::mpsc::unbounded_channel();
    let pipe = crate::control::pipe_name(&mountpoint);
    if let Err(e) = crate::control::serve(
        &rt,
        fs.clone(),
        pipe,
        pipe_security,
        control.clone(),
        unmount_tx,
    ) {
        tracing::warn!("no control pipe: {e}");
    }
    tracing::info!(mountpoint = %mountpoint, bucket = %bucket, "mounted");
    println!("bucketdrive: {bucket} is mounted on {mountpoint}");

    rt.block_on(async {
        use tokio::signal::windows::{ctrl_break, ctrl_close, ctrl_shutdown};
        let (Ok(mut brk), Ok(mut close), Ok(mut shutdown)) =
            (ctrl_break(), ctrl_close(), ctrl_shutdown())
        else {
            tracing::error!("cannot install console handlers; waiting for an unmount request");
            let _ = unmount_rx.recv().await;
            return;
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = brk.recv() => {},
            _ = close.recv() => {},
            _ = shutdown.recv() => {},
            _ = unmount_rx.recv() => {},
        }
    });
    tracing::info!(mountpoint = %mountpoint, "unmounting");
    host.stop();
    host.unmount();
    drop(host);

    lifecycle::finish(rt, &fs, control.skip_drain());
    Ok(())
}
