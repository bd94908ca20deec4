//! One options struct for a mount, shared by both CLIs and every layer of the core.
//!
//! The CLIs parse flags into [`MountConfig`]; nothing below the facade reads flags or the
//! environment. Defaults live here so Linux and Windows agree on them.

use std::time::Duration;

use crate::store::Posix;

/// Everything that shapes one mount's behaviour.
#[derive(Debug, Clone)]
pub struct MountConfig {
    /// The bucket name, without `gs://`.
    pub bucket: String,
    /// A key prefix to mount instead of the bucket root; empty, or ending in `/`.
    pub prefix: String,
    /// How long a positive stat result is trusted.
    pub stat_ttl: Duration,
    /// How long "this name does not exist" is trusted.
    pub negative_ttl: Duration,
    /// Upper bound on entries in each metadata cache.
    pub cache_entries: u64,
    /// About how many bytes the last known state of listed directories may take (what lookups
    /// and listings answer from while the bucket cannot be reached).
    pub last_known_bytes: u64,
    pub uid: u32,
    pub gid: u32,
    pub file_mode: u16,
    pub dir_mode: u16,
    /// Size of one prefetch part (one ranged GET).
    pub read_part_size: u64,
    /// Ranged GETs in flight per open file when reading sequentially: where probing starts,
    /// or the fixed number when `read_concurrency_max` is the same.
    pub read_concurrency: usize,
    /// Most ranged GETs per open file that probing may reach.
    pub read_concurrency_max: usize,
    /// Bytes of prefetched data allowed across all open files.
    pub max_read_memory: u64,
    /// Free space reported by statfs; never 0, because some programs refuse to copy then.
    pub reported_free_bytes: u64,
    /// Most objects a directory rename copies; more gives `EXDEV` (and `mv` copies instead).
    pub rename_dir_limit: usize,
    /// Read and store owner, group and mode in `goog-reserved-posix-*` metadata.
    pub posix_metadata: bool,
    /// With `posix_metadata`: setuid, setgid and sticky bits are shown and stored too. Off,
    /// they are dropped, so a bucket writer cannot make a local setuid file.
    pub posix_special_modes: bool,
    /// With `posix_metadata`: the owners and groups a file may show from its metadata, besides
    /// `uid`/`gid` (any other shows as those). A bucket writer may not decide which local user
    /// owns a file.
    pub posix_uids: Vec<u32>,
    pub posix_gids: Vec<u32>,
    /// An exclusive create (`O_CREAT|O_EXCL`, Windows' `CREATE_NEW`) claims the name in the
    /// bucket before it returns, so one name created on two machines goes to exactly one.
    /// Off: exclusive on this mount only, and no bucket request.
    pub exclusive_create: bool,
}

impl MountConfig {
    /// A configuration with the documented defaults for `bucket`.
    pub fn new(bucket: impl Into<String>) -> Self {
        MountConfig {
            bucket: bucket.into(),
            prefix: String::new(),
            stat_ttl: Duration::from_secs(60),
            negative_ttl: Duration::from_secs(5),
            cache_entries: 100_000,
            last_known_bytes: 64 * 1024 * 1024,
            uid: 0,
            gid: 0,
            file_mode: 0o644,
            dir_mode: 0o755,
            read_part_size: 8 * 1024 * 1024,
            read_concurrency: 16,
            read_concurrency_max: 32,
            max_read_memory: 1024 * 1024 * 1024,
            reported_free_bytes: 1 << 50,
            rename_dir_limit: 10_000,
            posix_metadata: false,
            posix_special_modes: false,
            posix_uids: Vec::new(),
            posix_gids: Vec::new(),
            exclusive_create: false,
        }
    }

    /// What of `p`, read from an object's metadata (written by anyone who can write the
    /// bucket), a file may show: bucket writers are trusted for content, not for local
    /// permissions. The mode loses setuid, setgid and sticky unless `posix_special_modes`; an
    /// owner or group outside the configured set is dropped (the file shows `uid`/`gid`).
    pub fn trusted_posix(&self, p: Posix) -> Posix {
        Posix {
            mode: p.mode.map(|m| m & self.posix_mode_mask()),
            uid: p.uid.filter(|u| self.posix_uid_allowed(*u)),
            gid: p.gid.filter(|g| self.posix_gid_allowed(*g)),
        }
    }

    /// The mode bits `--posix-metadata` shows and stores.
    pub fn posix_mode_mask(&self) -> u32 {
        if self.posix_special_modes {
            0o7777
        } else {
            0o777
        }
    }

    pub fn posix_uid_allowed(&self, uid: u32) -> bool {
        uid == self.uid || self.posix_uids.contains(&uid)
    }

    pub fn posix_gid_allowed(&self, gid: u32) -> bool {
        gid == self.gid || self.posix_gids.contains(&gid)
    }

    /// Sets the mounted prefix, normalising it to end in `/` (or be empty).
    pub fn with_prefix(mut self, prefix: &str) -> Self {
        let p = prefix.trim_matches('/');
        self.prefix = if p.is_empty() {
            String::new()
        } else {
            format!("{p}/")
        };
        self
    }
}

/// Parses `BUCKET`, `BUCKET/PREFIX` or `gs://BUCKET/PREFIX` into bucket and prefix.
pub fn parse_bucket_spec(spec: &str) -> Result<(String, String), String> {
    let rest = spec.strip_prefix("gs://").unwrap_or(spec);
    let (bucket, prefix) = match rest.split_once('/') {
        Some((b, p)) => (b, p),
        None => (rest, ""),
    };
    if bucket.len() < 3 || bucket.len() > 222 {
        return Err(format!(
            "invalid bucket name {bucket:?}: must be 3 to 222 characters"
        ));
    }
    let ok = bucket
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.'));
    if !ok {
        return Err(format!(
            "invalid bucket name {bucket:?}: use lowercase letters, digits, '-', '_' and '.'"
        ));
    }
    // A prefix is an object-name prefix, but one given on a command line never needs a quote
    // or a control character; refusing them keeps a spec from carrying extra arguments
    // through a launcher's quoting (WinFsp's strips quotes, not backslashes: a trailing `\`
    // escapes its closing quote, leaving a literal `"` in the argument).
    if let Some(c) = prefix.chars().find(|c| c.is_control() || *c == '"') {
        return Err(format!(
            "invalid prefix {prefix:?}: {c:?} is not allowed in a prefix here"
        ));
    }
    Ok((bucket.to_string(), prefix.trim_matches('/').to_string()))
}

/// Parses a byte size such as `8MiB`, `512K`, `1G` or `1048576`. Suffixes are binary.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("invalid size {s:?}: expected a number like 8MiB"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        "p" | "pb" | "pib" => 1 << 50,
        _ => return Err(format!("invalid size {s:?}: unknown unit {unit:?}")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

/// Parses an octal permission mode such as `644` or `0755`.
pub fn parse_mode(s: &str) -> Result<u16, String> {
    u16::from_str_radix(s.trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| format!("invalid mode {s:?}: expected octal such as 644"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_modes() {
        assert_eq!(parse_size("8MiB").unwrap(), 8 << 20);
        assert_eq!(parse_size("512k").unwrap(), 512 << 10);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("42").unwrap(), 42);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("1X").is_err());
        assert_eq!(parse_mode("644").unwrap(), 0o644);
        assert_eq!(parse_mode("0755").unwrap(), 0o755);
        assert!(parse_mode("999").is_err());
    }

    #[test]
    fn bucket_specs() {
        assert_eq!(
            parse_bucket_spec("my-bucket").unwrap(),
            ("my-bucket".into(), "".into())
        );
        assert_eq!(
            parse_bucket_spec("gs://my-bucket/a/b/").unwrap(),
            ("my-bucket".into(), "a/b".into())
        );
        assert_eq!(
            parse_bucket_spec("bkt/x").unwrap(),
            ("bkt".into(), "x".into())
        );
        assert!(parse_bucket_spec("ab").is_err());
        // What a launcher's quoting could leave in an argument carrying more arguments.
        assert!(parse_bucket_spec("evil/x\" Y X: --security=D:P(A;;FA;;;WD)").is_err());
        assert!(parse_bucket_spec("bkt/a\nb").is_err());
        assert_eq!(
            parse_bucket_spec("bkt/My Documents").unwrap(),
            ("bkt".to_string(), "My Documents".to_string())
        );
        assert!(parse_bucket_spec("Upper").is_err());
    }

    #[test]
    fn prefix_normalised() {
        assert_eq!(MountConfig::new("b").with_prefix("/a/b/").prefix, "a/b/");
        assert_eq!(MountConfig::new("b").with_prefix("").prefix, "");
    }
}
