//! Mount options both platforms take, and the configuration they make; and [`StoreArgs`], the
//! flags that say where the bucket is and who asks, shared by every command that talks to it
//! (`mount`, `perfdiag`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

use crate::config::{parse_size, MountConfig};
use crate::store::gcs::GcsOptions;
use crate::write::cache_dir::CacheRoot;
use crate::write::upload::UploadMode;
use crate::write::writeback::WriteConfig;

/// Where the bucket's API is and which credentials to send: the same flags for every command
/// that talks to a bucket.
#[derive(Args, Debug, Clone, Default)]
pub struct StoreArgs {
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
}

impl StoreArgs {
    /// The endpoint and credentials these flags (and `STORAGE_EMULATOR_HOST`) name.
    pub fn gcs_options(&self) -> GcsOptions {
        GcsOptions::resolve(self.endpoint.clone(), self.key_file.clone(), self.anonymous)
    }
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
    /// Ranged GETs in flight per file while reading sequentially.
    #[arg(long, default_value_t = 8)]
    pub read_concurrency: usize,
    /// Memory for read-ahead, shared by all open files.
    #[arg(long, value_parser = parse_size, default_value = "1GiB")]
    pub max_read_memory: u64,
    /// Where written data is staged and the upload journal kept: in a sub-directory
    /// bucketdrive-cache that bucketdrive makes inside it (the directory itself is not
    /// changed). Default: under the user's cache directory, one sub-directory per mount.
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
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
        cfg.read_concurrency = self.read_concurrency;
        cfg.max_read_memory = self.max_read_memory;
        cfg.rename_dir_limit = self.rename_dir_limit;
        cfg.reported_free_bytes = self.free_space.max(1 << 20);
        cfg
    }

    /// The cache directory's root: our sub-directory of `--cache-dir` (or that directory
    /// itself when it holds an earlier version's layout), else one per bucket, prefix and
    /// mountpoint under the user's cache directory. Called once, before the mount starts (see
    /// [`CacheRoot::in_user_dir`] for why it can fail); every later user gets the answer.
    pub fn cache_root(
        &self,
        bucket: &str,
        prefix: &str,
        mountpoint: &Path,
    ) -> Result<CacheRoot, String> {
        match &self.cache_dir {
            Some(named) => CacheRoot::in_user_dir(named),
            None => Ok(CacheRoot::default_for(bucket, prefix, mountpoint)),
        }
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
