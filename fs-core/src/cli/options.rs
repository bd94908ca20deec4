//! Mount options both platforms take, and the configuration they make; and [`StoreArgs`], the
//! flags that say where the bucket is and who asks, shared by every command that talks to it
//! (`mount`, `perfdiag`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

use crate::config::{parse_size, MountConfig};
use crate::read::cache::{fill_queue_for, ReadCacheConfig, LOCK_WAIT, SUBDIR as READ_CACHE_SUBDIR};
use crate::store::gcs::GcsOptions;
use crate::write::cache_dir::{default_container, CacheRoot, Owner, SUBDIR};
use crate::write::upload::UploadMode;
use crate::write::writeback::WriteConfig;

/// Where the bucket's API is and which credentials to send: the same flags for every command
/// that talks to a bucket.
#[derive(Args, Debug, Clone, Default)]
pub struct StoreArgs {
    /// JSON API endpoint with its scheme, e.g. http://127.0.0.1:4443. Default:
    /// http://$STORAGE_EMULATOR_HOST if that is set (anonymous), else
    /// https://storage.googleapis.com.
    #[arg(long)]
    pub endpoint: Option<String>,
    /// Service-account JSON key file, instead of Application Default Credentials.
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// Send no credentials (public buckets, emulators). Implied by STORAGE_EMULATOR_HOST.
    #[arg(long)]
    pub anonymous: bool,
    /// Send credentials over plain http:// to an endpoint that is not this machine (anyone on
    /// the path can read and reuse them). Without it such an endpoint is refused.
    #[arg(long)]
    pub insecure_endpoint: bool,
}

impl StoreArgs {
    /// The endpoint and credentials these flags (and `STORAGE_EMULATOR_HOST`) name; an error
    /// for a combination that would send credentials in clear text.
    pub fn gcs_options(&self) -> Result<GcsOptions, String> {
        GcsOptions::resolve(
            self.endpoint.clone(),
            self.key_file.clone(),
            self.anonymous,
            self.insecure_endpoint,
        )
    }
}

/// Refuses a cache directory (`dir`, or the nearest directory above it that exists) another
/// user could swap files under: see [`crate::platform::check_ancestry`]. Staged files are
/// uploaded as the user's, and replay trusts the journal: a directory someone else can write
/// to would let them plant records or link a staging file to one of root's.
fn check_dir_safe(dir: &Path) -> Result<(), String> {
    let abs = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    let existing = abs
        .ancestors()
        .find(|p| p.is_dir())
        .unwrap_or(Path::new("/"));
    crate::platform::check_ancestry(existing).map_err(|e| e.to_string())
}

/// Options of `bucketdrive mount` that mean the same on Linux and Windows.
#[derive(Args, Debug, Clone)]
pub struct CommonArgs {
    /// Endpoint and credentials.
    #[command(flatten)]
    pub store: StoreArgs,
    /// How long file and directory attributes are cached.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    pub stat_ttl: Duration,
    /// How long "no such file" answers are cached.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    pub negative_ttl: Duration,
    /// Size of one read-ahead part (one ranged GET).
    #[arg(long, value_parser = parse_size, default_value = "8MiB")]
    pub read_part_size: u64,
    /// Ranged GETs in flight per file while reading sequentially, fixed. Default: found per
    /// file, starting at 16 and doubling while throughput grows, up to --max-read-concurrency.
    #[arg(long)]
    pub read_concurrency: Option<usize>,
    /// Most ranged GETs in flight per file when the number is found per file.
    #[arg(long, default_value_t = 32)]
    pub max_read_concurrency: usize,
    /// Memory for read-ahead, shared by all open files.
    #[arg(long, value_parser = parse_size, default_value = "1GiB")]
    pub max_read_memory: u64,
    /// Keep what is read in a disk cache in this directory, kept across mounts, so files read
    /// again are read from the local disk (in a sub-directory bucketdrive-read-cache that
    /// bucketdrive makes inside it; the directory itself is not changed). Must not be the
    /// write cache's directory. Default: no read cache.
    #[arg(long, value_name = "DIR")]
    pub read_cache_dir: Option<PathBuf>,
    /// Most disk space the read cache takes; beyond it, the least recently used files are
    /// evicted.
    #[arg(long, value_parser = parse_size, default_value = "10GiB", requires = "read_cache_dir")]
    pub read_cache_size: u64,
    /// Where written data is staged and the upload journal kept: in a sub-directory
    /// bucketdrive-cache that bucketdrive makes inside it (the directory itself is not
    /// changed), which belongs to one bucket and prefix; another bucket or prefix gets one of
    /// its own inside that. Default: under the user's cache directory, one sub-directory per
    /// bucket and prefix.
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Upload files that an earlier bucketdrive version staged in the cache directory, which
    /// did not record their bucket, to this mount's bucket and prefix (and record it). Without
    /// it such files are never uploaded: the mount is refused with a message saying where they
    /// are.
    #[arg(long)]
    pub adopt_staged: bool,
    /// Most bytes staged in the cache directory at once (e.g. 20GiB). When full, writes wait
    /// for closed files to upload; "disk full" only when the files still open cannot fit.
    /// Default: bounded by the disk alone.
    #[arg(long, value_parser = parse_size)]
    pub cache_size: Option<u64>,
    /// How long after close a file's upload starts.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    pub write_back_delay: Duration,
    /// Make close wait for the upload and return its error.
    #[arg(long)]
    pub upload_on_close: bool,
    /// At most this long after close() returns, a closed file is durable on the cache disk
    /// against a power cut (before then, against a crash or kill of the daemon only, like a
    /// local file system's commit; ext4's is 5s). fsync() is always durable at once.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    pub commit_interval: Duration,
    /// Make every close() wait until the file is durable on the cache disk against a power
    /// cut (an fdatasync of the file and the journal), instead of within --commit-interval.
    #[arg(long)]
    pub sync_on_close: bool,
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
    /// Longest wait between two upload attempts of a file whose uploads keep failing (the
    /// wait starts at one second and doubles up to this).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    pub upload_retry_max: Duration,
    /// Most objects a directory rename moves; more is refused.
    #[arg(long, default_value_t = 10_000)]
    pub rename_dir_limit: usize,
    /// Free space the drive reports (a bucket has no limit; some programs, Explorer among
    /// them, refuse to copy onto a disk that looks full). Never 0.
    #[arg(long, value_parser = parse_size, default_value = "1PiB")]
    pub free_space: u64,
    /// Make an exclusive create (O_CREAT|O_EXCL, as `cp`, `tar`, `rsync` and mkstemp use;
    /// CREATE_NEW on Windows) claim the name in the bucket before it returns: of two machines
    /// creating one name, exactly one succeeds. Costs a request per such create, and fails
    /// while the bucket is unreachable. Default: exclusive on this mount only.
    #[arg(long)]
    pub exclusive_create: bool,
    /// Mount read-only: every change fails.
    #[arg(long)]
    pub read_only: bool,
    /// Log level (error, warn, info, debug, trace). RUST_LOG overrides it.
    #[arg(long, default_value = "info")]
    pub log_level: String,
    /// Append logs to this file (created 0600). Default: standard error in the foreground;
    /// when detached, syslog (/dev/log) if present, else bucketdrive.log in the cache directory
    /// (no log, with a warning, if that cannot be created).
    #[arg(long)]
    pub log_file: Option<PathBuf>,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics (e.g. 127.0.0.1:9100). Default:
    /// no metrics endpoint.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_addr: Option<String>,
    /// Log line format: text, or json (one JSON object per line).
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: super::logging::LogFormat,
}

/// `--upload-mode` values.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum UploadModeArg {
    Composite,
    Resumable,
}

impl CommonArgs {
    /// The mount configuration these options describe (platform options are added by the
    /// caller).
    pub fn mount_config(&self, bucket: &str, prefix: &str) -> MountConfig {
        let mut cfg = MountConfig::new(bucket.to_string()).with_prefix(prefix);
        cfg.stat_ttl = self.stat_ttl;
        cfg.negative_ttl = self.negative_ttl;
        cfg.read_part_size = self.read_part_size;
        match self.read_concurrency {
            Some(n) => {
                cfg.read_concurrency = n.max(1);
                cfg.read_concurrency_max = n.max(1);
            }
            None => {
                cfg.read_concurrency_max = self.max_read_concurrency.max(1);
                cfg.read_concurrency = cfg.read_concurrency.min(cfg.read_concurrency_max);
            }
        }
        cfg.max_read_memory = self.max_read_memory;
        cfg.rename_dir_limit = self.rename_dir_limit;
        cfg.exclusive_create = self.exclusive_create;
        cfg.reported_free_bytes = self.free_space.max(1 << 20);
        cfg
    }

    /// The cache directory's root, the one of this bucket and prefix (I11): in `--cache-dir`
    /// ([`CacheRoot::in_user_dir`]), else under the user's cache directory
    /// ([`CacheRoot::default_for`]). Called once, before the mount starts (see those for why it
    /// can fail); every later user gets the answer. A read-only mount stages nothing and
    /// uploads nothing, so what would refuse a writable one only puts its (log) directory in
    /// the bucket's own sub-directory.
    pub fn cache_root(
        &self,
        bucket: &str,
        prefix: &str,
        mountpoint: &Path,
    ) -> Result<CacheRoot, String> {
        let owner = Owner::new(bucket, prefix);
        let decided = match &self.cache_dir {
            Some(named) => CacheRoot::in_user_dir(named, &owner, self.adopt_staged),
            None => CacheRoot::default_for(&owner, mountpoint, self.adopt_staged),
        };
        // After the layout's own refusals, which say more about an earlier version's files.
        if decided.is_ok() && !self.read_only {
            let dir = self.cache_dir.clone().unwrap_or_else(default_container);
            check_dir_safe(&dir)?;
        }
        match decided {
            Err(_) if self.read_only => {
                let base = match &self.cache_dir {
                    Some(named) => named.join(SUBDIR),
                    None => default_container(),
                };
                Ok(CacheRoot::at(base.join(owner.dir_name())))
            }
            other => other,
        }
    }

    /// The read cache's configuration (`None` without `--read-cache-dir`): our sub-directory
    /// of the named directory. Refused when it and the write cache's root `write_root` are the
    /// same directory or one holds the other: each must own its directory.
    pub fn read_cache_config(
        &self,
        write_root: &CacheRoot,
    ) -> Result<Option<ReadCacheConfig>, String> {
        let Some(named) = &self.read_cache_dir else {
            return Ok(None);
        };
        check_dir_safe(named)?;
        let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        let root = abs(named).join(READ_CACHE_SUBDIR);
        let w = abs(&write_root.path);
        if root.starts_with(&w) || w.starts_with(&root) {
            return Err(format!(
                "--read-cache-dir {} would share the write cache directory {}; give the read \
                 cache a directory of its own",
                named.display(),
                write_root.path.display()
            ));
        }
        Ok(Some(ReadCacheConfig {
            root,
            size: self.read_cache_size,
            lock_wait: LOCK_WAIT,
            fill_queue: fill_queue_for(self.max_read_memory),
        }))
    }

    /// The write-back configuration staging in `root`; `None` for a read-only mount.
    pub fn write_config(&self, root: &CacheRoot) -> Option<WriteConfig> {
        if self.read_only {
            return None;
        }
        let mut w = WriteConfig::new(root.path.clone());
        w.legacy_cache_dir = root.legacy;
        w.write_back_delay = self.write_back_delay;
        w.upload_on_close = self.upload_on_close;
        w.commit_interval = self.commit_interval;
        w.sync_on_close = self.sync_on_close;
        w.cache_size = self.cache_size;
        w.files_concurrency = self.upload_files_concurrency;
        w.retry_max = self.upload_retry_max;
        w.upload.single_shot_threshold = self.single_shot_threshold;
        w.upload.part_size = self.upload_part_size;
        w.upload.concurrency = self.upload_concurrency;
        w.upload.mode = match self.upload_mode {
            UploadModeArg::Composite => UploadMode::Composite,
            UploadModeArg::Resumable => UploadMode::Resumable,
        };
        Some(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        common: CommonArgs,
    }

    fn parse(args: &[&str]) -> Result<CommonArgs, clap::Error> {
        let mut all = vec!["test"];
        all.extend_from_slice(args);
        Cli::try_parse_from(all).map(|c| c.common)
    }

    #[test]
    fn the_read_cache_is_off_unless_named_and_never_shares_the_write_cache() {
        let write = CacheRoot::at(PathBuf::from("/var/cache/w/bucketdrive-cache"));
        assert_eq!(parse(&[]).unwrap().read_cache_config(&write), Ok(None));
        assert!(
            parse(&["--read-cache-size", "1GiB"]).is_err(),
            "a size without a directory is a mistake"
        );
        let c = parse(&["--read-cache-dir", "/var/cache/w"]).unwrap();
        assert_eq!(
            c.read_cache_config(&write),
            Ok(Some(ReadCacheConfig {
                root: PathBuf::from("/var/cache/w/bucketdrive-read-cache"),
                size: crate::read::cache::DEFAULT_SIZE,
                lock_wait: LOCK_WAIT,
                fill_queue: 256 << 20,
            })),
            "the same named directory is fine: each works in its own sub-directory"
        );
        let c = parse(&["--read-cache-dir", "/r", "--read-cache-size", "3GiB"]).unwrap();
        assert_eq!(c.read_cache_config(&write).unwrap().unwrap().size, 3 << 30);
        for inside in [
            "/var/cache/w/bucketdrive-cache",
            "/var/cache/w/bucketdrive-cache/x",
        ] {
            let c = parse(&["--read-cache-dir", inside]).unwrap();
            let err = c.read_cache_config(&write).unwrap_err();
            assert!(err.contains("would share the write cache"), "{err}");
        }
        // A write cache inside the read cache's directory is refused too.
        let nested = CacheRoot::at(PathBuf::from("/r/bucketdrive-read-cache/bucketdrive-cache"));
        let c = parse(&["--read-cache-dir", "/r"]).unwrap();
        assert!(c.read_cache_config(&nested).is_err());
    }
}
