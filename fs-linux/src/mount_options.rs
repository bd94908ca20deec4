//! The mount-helper form of the command line: `bucketdrive BUCKET DIR -o OPTIONS`.
//!
//! `mount -t fuse.bucketdrive BUCKET DIR -o OPTIONS` (and so `/etc/fstab` and systemd `.mount`
//! units) runs `mount.fuse3`, which runs `bucketdrive BUCKET DIR -o OPTIONS`. This module
//! rewrites that form into `bucketdrive mount BUCKET DIR --option…` before clap sees it, so
//! every mount option has exactly one definition (its `--long` flag) and one meaning:
//! `cache_dir=/x` is `--cache-dir=/x`, `allow_other` is `--allow-other`, `ro` is `--read-only`.
//! `-o` is accepted after `bucketdrive mount` too.
//!
//! Options that only `mount`, fstab and systemd act on are accepted and ignored, so one fstab
//! line works unchanged. Anything else that is not one of our flags is refused with one line
//! that names it, before anything is mounted.

use std::ffi::OsString;

/// Options meant for `mount(8)`, fstab or systemd rather than for us. The kernel flags among
/// them (`dev`, `suid`, `exec`, …) are decided by us: every mount is `nodev,nosuid`. The two
/// that narrow what the mount allows, `noexec` and `nosymfollow`, are flags of ours and kept.
const IGNORED: &[&str] = &[
    "_netdev",
    "nofail",
    "noauto",
    "auto",
    "user",
    "users",
    "nouser",
    "owner",
    "group",
    "defaults",
    "rw",
    "dev",
    "nodev",
    "suid",
    "nosuid",
    "exec",
    "atime",
    "noatime",
    "relatime",
    "async",
    "nodiratime",
    "diratime",
    "lazytime",
    "strictatime",
    "symfollow",
    "nousers",
    "noowner",
    "nogroup",
    // Classic FUSE options we always apply ourselves.
    "default_permissions",
];

/// Ignored option prefixes: systemd's and other userspace tools' `x-…` options, and the
/// names `mount.fuse3` may add.
const IGNORED_PREFIXES: &[&str] = &[
    "x-", "comment=", "fsname=", "subtype=", "uhelper=", "helper=", "user=",
];

/// Rewrites `args` (including the program name) into the subcommand form. `subcommands` are
/// the names that start a subcommand; `mount_flags` are the long flags of `mount`.
pub fn rewrite(
    args: Vec<OsString>,
    subcommands: &[String],
    mount_flags: &[String],
) -> Result<Vec<OsString>, String> {
    let Some(first) = args.get(1).and_then(|a| a.to_str()) else {
        return Ok(args);
    };
    let helper_form = !first.starts_with('-')
        && !subcommands.iter().any(|s| s == first)
        && !looks_like_a_mistyped_subcommand(first, &args, subcommands);
    let is_mount = helper_form || first == "mount";
    if !is_mount {
        return Ok(args);
    }
    let mut out = Vec::with_capacity(args.len() + 4);
    let mut it = args.into_iter();
    out.extend(it.next());
    if helper_form {
        out.push("mount".into());
    }
    while let Some(arg) = it.next() {
        let list = match arg.to_str() {
            Some("-o") => match it.next() {
                Some(v) => v,
                None => return Err("-o needs a list of options".into()),
            },
            Some(s) if s.starts_with("-o") && !s.starts_with("--") => OsString::from(&s[2..]),
            _ => {
                out.push(arg);
                continue;
            }
        };
        let list = list
            .into_string()
            .map_err(|l| format!("mount options are not valid UTF-8: {l:?}"))?;
        for opt in list.split(',').filter(|o| !o.is_empty()) {
            out.extend(translate(opt, mount_flags)?);
        }
    }
    Ok(out)
}

/// A first word one or two letters away from a subcommand (`stauts`), with no `-o` anywhere,
/// is a typo rather than a bucket: clap then says "did you mean". `mount.fuse3` always passes
/// `-o`, so the mount-helper form is never mistaken for one.
fn looks_like_a_mistyped_subcommand(
    first: &str,
    args: &[OsString],
    subcommands: &[String],
) -> bool {
    let has_o = args
        .iter()
        .filter_map(|a| a.to_str())
        .any(|a| a.starts_with("-o") && !a.starts_with("--"));
    !has_o && subcommands.iter().any(|s| edit_distance(first, s) <= 2)
}

/// Levenshtein distance, for the few short words above.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// One `-o` option as zero or one `--flag[=value]` argument.
fn translate(opt: &str, mount_flags: &[String]) -> Result<Option<OsString>, String> {
    if IGNORED.contains(&opt) || IGNORED_PREFIXES.iter().any(|p| opt.starts_with(p)) {
        return Ok(None);
    }
    if opt == "ro" {
        return Ok(Some("--read-only".into()));
    }
    if opt == "drop_privileges" {
        // mount.fuse3 would hand us an already-open /dev/fuse instead of a mountpoint.
        return Err(
            "mount option \"drop_privileges\" is not supported: mount as the user \
                    instead (fusermount3 makes that safe)"
                .into(),
        );
    }
    let (key, value) = match opt.split_once('=') {
        Some((k, v)) => (k, Some(v)),
        None => (opt, None),
    };
    let flag = key.replace('_', "-");
    if flag.starts_with('-') || !mount_flags.contains(&flag) {
        return Err(format!("unknown mount option \"{key}\""));
    }
    Ok(Some(match value {
        Some(v) => format!("--{flag}={v}").into(),
        None => format!("--{flag}").into(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Vec<String>, String> {
        let subs = ["mount", "unmount", "status", "completions", "help"].map(String::from);
        let flags = ["cache-dir", "stat-ttl", "allow-other", "read-only", "uid"].map(String::from);
        rewrite(args.iter().map(OsString::from).collect(), &subs, &flags).map(|v| {
            v.into_iter()
                .map(|a| a.into_string().unwrap_or_default())
                .collect()
        })
    }

    #[test]
    fn helper_form_becomes_a_mount_subcommand() {
        let got = run(&[
            "bucketdrive",
            "bkt",
            "/mnt/b",
            "-o",
            "rw,_netdev,nofail,x-systemd.automount,cache_dir=/x,stat_ttl=5s,allow_other,ro,uid=7",
        ]);
        assert_eq!(
            got.unwrap(),
            [
                "bucketdrive",
                "mount",
                "bkt",
                "/mnt/b",
                "--cache-dir=/x",
                "--stat-ttl=5s",
                "--allow-other",
                "--read-only",
                "--uid=7"
            ]
        );
    }

    #[test]
    fn values_keep_their_equals_signs_and_joined_o_works() {
        let got = run(&["bucketdrive", "mount", "b", "/m", "-ocache_dir=/a=b"]).unwrap();
        assert_eq!(got, ["bucketdrive", "mount", "b", "/m", "--cache-dir=/a=b"]);
    }

    #[test]
    fn unknown_options_are_named() {
        let err = run(&["bucketdrive", "b", "/m", "-o", "rw,frobnicate=3"]).unwrap_err();
        assert_eq!(err, "unknown mount option \"frobnicate\"");
        let err = run(&["bucketdrive", "b", "/m", "-o", "-x"]).unwrap_err();
        assert!(err.contains("\"-x\""), "{err}");
    }

    #[test]
    fn a_mistyped_subcommand_is_left_to_clap_unless_o_says_mount() {
        let args = ["bucketdrive", "stauts", "/m"];
        assert_eq!(run(&args).unwrap(), args);
        let got = run(&["bucketdrive", "stauts", "/m", "-o", "rw"]).unwrap();
        assert_eq!(got, ["bucketdrive", "mount", "stauts", "/m"]);
        let got = run(&["bucketdrive", "my-bucket", "/m"]).unwrap();
        assert_eq!(got, ["bucketdrive", "mount", "my-bucket", "/m"]);
        assert_eq!(edit_distance("stauts", "status"), 2);
        assert_eq!(edit_distance("", "ab"), 2);
    }

    #[test]
    fn other_subcommands_and_flags_pass_through() {
        let args = ["bucketdrive", "status", "/m", "-o", "x"];
        assert_eq!(run(&args).unwrap(), args);
        let args = ["bucketdrive", "--version"];
        assert_eq!(run(&args).unwrap(), args);
        let args = ["bucketdrive", "mount", "b", "/m", "--stat-ttl", "1s"];
        assert_eq!(run(&args).unwrap(), args);
    }
}
