//! Windows semantics, kept in the core so they are tested on Linux: the WinFsp adapter only
//! translates. This module owns how object names become Windows names ([`names`]), and how
//! times and attributes look to Windows.

pub mod names;
pub mod volume;

use std::time::{Duration, SystemTime};

use crate::namespace::Kind;

/// 100-nanosecond intervals between 1601-01-01 (the FILETIME epoch) and 1970-01-01.
const FILETIME_UNIX_EPOCH: u64 = 116_444_736_000_000_000;

/// A time as a Windows FILETIME. Times before 1601 become 0.
pub fn to_filetime(t: SystemTime) -> u64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => FILETIME_UNIX_EPOCH.saturating_add((d.as_nanos() / 100) as u64),
        Err(e) => FILETIME_UNIX_EPOCH.saturating_sub((e.duration().as_nanos() / 100) as u64),
    }
}

/// The time of a Windows FILETIME.
pub fn from_filetime(ft: u64) -> SystemTime {
    if ft >= FILETIME_UNIX_EPOCH {
        SystemTime::UNIX_EPOCH + Duration::from_nanos((ft - FILETIME_UNIX_EPOCH) * 100)
    } else {
        SystemTime::UNIX_EPOCH - Duration::from_nanos((FILETIME_UNIX_EPOCH - ft) * 100)
    }
}

pub const FILE_ATTRIBUTE_READONLY: u32 = 0x1;
pub const FILE_ATTRIBUTE_DIRECTORY: u32 = 0x10;
pub const FILE_ATTRIBUTE_ARCHIVE: u32 = 0x20;

/// The attributes Windows sees: a directory, or a file marked archive (a file not yet backed up,
/// which is what Explorer expects of a new file); read-only on a read-only mount. The volume has
/// no reparse points, so a symbolic link (an object in gcsfuse's link format) is a plain file.
pub fn attributes(kind: Kind, read_only: bool) -> u32 {
    let base = match kind {
        Kind::Dir => FILE_ATTRIBUTE_DIRECTORY,
        Kind::File | Kind::Symlink => FILE_ATTRIBUTE_ARCHIVE,
    };
    if read_only {
        base | FILE_ATTRIBUTE_READONLY
    } else {
        base
    }
}

/// The bucket spec in `bucketdrive.exe mount SPEC`. The WinFsp launcher (`net use X:
/// \\bucketdrive\BUCKET`) passes the volume prefix `\bucketdrive\BUCKET`; that is the bucket,
/// lower-cased: bucket names are, and Windows users type share names in any case.
pub fn launcher_bucket_spec(spec: &str) -> String {
    let s = spec.trim_start_matches('\\');
    match s.get(..12) {
        Some(head) if head.eq_ignore_ascii_case("bucketdrive\\") => {
            let rest = &s[12..];
            let end = rest.find(['\\', '/']).unwrap_or(rest.len());
            format!("{}{}", rest[..end].to_lowercase(), &rest[end..])
        }
        _ => spec.to_string(),
    }
}

/// A mountpoint in one form: a drive letter as `X:`, a directory with backslashes and no
/// trailing separator. [`mountpoint_key`] also ignores case, as Windows paths do.
pub fn normalize_mountpoint(mountpoint: &str) -> String {
    let m = mountpoint.trim_end_matches(['\\', '/']).replace('/', "\\");
    if m.len() == 2 && m.ends_with(':') {
        m.to_uppercase()
    } else {
        m
    }
}

/// What names a mount's control pipe: the same for every spelling of its mountpoint.
pub fn mountpoint_key(mountpoint: &str) -> u32 {
    crc32c::crc32c(normalize_mountpoint(mountpoint).to_uppercase().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launcher_prefix_and_mountpoint_forms() {
        assert_eq!(launcher_bucket_spec(r"\bucketdrive\my-bucket"), "my-bucket");
        assert_eq!(
            launcher_bucket_spec(r"\\BucketDrive\my-bucket"),
            "my-bucket"
        );
        assert_eq!(
            launcher_bucket_spec(r"\bucketdrive\My-Bucket"),
            "my-bucket",
            "bucket names are lower case"
        );
        assert_eq!(
            launcher_bucket_spec(r"\bucketdrive\My-Bucket/Some/Prefix"),
            "my-bucket/Some/Prefix"
        );
        assert_eq!(launcher_bucket_spec("gs://b/p"), "gs://b/p");
        assert_eq!(launcher_bucket_spec("bucketdrivex"), "bucketdrivex");
        assert_eq!(normalize_mountpoint("x:"), "X:");
        assert_eq!(normalize_mountpoint("X:\\"), "X:");
        assert_eq!(normalize_mountpoint("c:/Buckets/b/"), r"c:\Buckets\b");
        assert_eq!(mountpoint_key("x:\\"), mountpoint_key("X:"));
        assert_eq!(
            mountpoint_key(r"C:\buckets\B"),
            mountpoint_key("c:/Buckets/b/")
        );
    }

    #[test]
    fn filetimes_round_trip_and_match_known_values() {
        assert_eq!(to_filetime(SystemTime::UNIX_EPOCH), FILETIME_UNIX_EPOCH);
        // 2020-09-13T12:26:40Z, as Windows shows it.
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_600_000_000);
        assert_eq!(to_filetime(t), 132_444_736_000_000_000);
        for t in [
            t,
            t + Duration::from_nanos(123_400),
            SystemTime::UNIX_EPOCH - Duration::from_secs(86_400),
        ] {
            assert_eq!(from_filetime(to_filetime(t)), t);
        }
        // Before 1601 (only Unix can hold such a time; Windows cannot make one).
        if let Some(ancient) =
            SystemTime::UNIX_EPOCH.checked_sub(Duration::from_secs(20_000_000_000))
        {
            assert_eq!(to_filetime(ancient), 0);
        }
    }

    #[test]
    fn attributes_by_kind_and_mount() {
        assert_eq!(attributes(Kind::Dir, false), FILE_ATTRIBUTE_DIRECTORY);
        assert_eq!(attributes(Kind::File, false), FILE_ATTRIBUTE_ARCHIVE);
        assert_eq!(
            attributes(Kind::File, true),
            FILE_ATTRIBUTE_ARCHIVE | FILE_ATTRIBUTE_READONLY
        );
    }
}
