//! End-to-end write path: through a real FUSE mount to fake-gcs-server. Every test checks the
//! bytes in the bucket, fetched directly from the emulator, not through the mount.

use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::process::Command;

use bucketdrive_tests::{
    random_bytes, sha256, wait_for_object, write_and_close, Emulator, Mount, Result,
};
use rand::{Rng, SeedableRng};

const MIB: usize = 1024 * 1024;

fn setup(bucket: &str) -> Result<Emulator> {
    let emu = Emulator::start()?;
    emu.create_bucket(bucket)?;
    Ok(emu)
}

#[test]
fn sequential_writes_of_edge_sizes_reach_the_bucket() -> Result<()> {
    let emu = setup("seqw")?;
    let m = Mount::new(&emu, "seqw", &["--write-back-delay", "0s"])?;
    let sizes = [0, 1, 16 * MIB - 1, 16 * MIB + 1, 200 * MIB];
    let mut want = Vec::new();
    for (i, size) in sizes.iter().enumerate() {
        let data = random_bytes(*size, 10 + i as u64);
        let name = format!("w{size}");
        std::fs::write(m.path().join(&name), &data)?;
        want.push((name, sha256(&data)));
    }
    for (name, sha) in &want {
        wait_for_object(&emu, "seqw", name, sha, 120)?;
    }
    assert!(
        emu.keys("seqw")?
            .iter()
            .all(|k| !k.starts_with(".bucketdrive-parts")),
        "temporary parts are gone"
    );
    m.unmount()
}

#[test]
fn fsync_returns_with_the_data_in_the_bucket() -> Result<()> {
    let emu = setup("fsync")?;
    let m = Mount::new(&emu, "fsync", &["--write-back-delay", "1h"])?;
    let data = random_bytes(3 * MIB, 5);
    let mut f = std::fs::File::create(m.path().join("f"))?;
    f.write_all(&data)?;
    f.sync_all()?;
    assert_eq!(
        sha256(&emu.get("fsync", "f")?),
        sha256(&data),
        "in the bucket when fsync returns"
    );
    drop(f);
    m.unmount()
}

#[test]
fn append_truncate_overwrite_and_random_writes() -> Result<()> {
    let emu = setup("modify")?;
    let original = random_bytes(8 * MIB, 1);
    emu.put("modify", "existing", &original)?;
    let m = Mount::new(&emu, "modify", &["--write-back-delay", "0s"])?;
    let p = m.path();

    // Append to a new file over several opens.
    std::fs::write(p.join("log"), b"one\n")?;
    for line in [&b"two\n"[..], b"three\n"] {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(p.join("log"))?;
        f.write_all(line)?;
    }
    wait_for_object(&emu, "modify", "log", &sha256(b"one\ntwo\nthree\n"), 60)?;

    // Random writes into an existing object: untouched bytes come from the bucket.
    let mut model = original.clone();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(p.join("existing"))?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    for _ in 0..200 {
        let off = rng.gen_range(0..model.len() - 4096);
        let len = rng.gen_range(1..4096);
        let chunk: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        f.write_all_at(&chunk, off as u64)?;
        model[off..off + len].copy_from_slice(&chunk);
    }
    drop(f);
    wait_for_object(&emu, "modify", "existing", &sha256(&model), 60)?;
    // The mount reads its own writes.
    assert_eq!(sha256(&std::fs::read(p.join("existing"))?), sha256(&model));

    // Truncate: shrink, then grow.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(p.join("existing"))?;
    f.set_len(1000)?;
    drop(f);
    wait_for_object(&emu, "modify", "existing", &sha256(&model[..1000]), 60)?;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(p.join("existing"))?;
    f.set_len(3000)?;
    drop(f);
    let mut grown = model[..1000].to_vec();
    grown.resize(3000, 0);
    wait_for_object(&emu, "modify", "existing", &sha256(&grown), 60)?;

    // Overwrite with O_TRUNC.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(p.join("existing"))?;
    f.write_all(b"replaced")?;
    f.seek(SeekFrom::Start(0))?;
    drop(f);
    wait_for_object(&emu, "modify", "existing", &sha256(b"replaced"), 60)?;
    m.unmount()
}

#[test]
fn mkdir_rmdir_and_rename_of_files_and_directories() -> Result<()> {
    let emu = setup("names")?;
    let m = Mount::new(&emu, "names", &["--write-back-delay", "0s"])?;
    let p = m.path();
    std::fs::create_dir(p.join("a"))?;
    std::fs::create_dir_all(p.join("a/b/c"))?;
    std::fs::write(p.join("a/b/c/f.txt"), b"deep")?;
    std::fs::write(p.join("a/top.txt"), b"top")?;
    wait_for_object(&emu, "names", "a/b/c/f.txt", &sha256(b"deep"), 60)?;
    wait_for_object(&emu, "names", "a/top.txt", &sha256(b"top"), 60)?;
    assert_eq!(
        std::fs::remove_dir(p.join("a/b"))
            .unwrap_err()
            .raw_os_error(),
        Some(libc::ENOTEMPTY)
    );
    // File rename.
    std::fs::rename(p.join("a/top.txt"), p.join("a/renamed.txt"))?;
    assert_eq!(std::fs::read(p.join("a/renamed.txt"))?, b"top");
    assert!(!p.join("a/top.txt").exists());
    // Directory rename, object by object. Each copy carries the rename's token, and another
    // tool's object keeps its metadata and content type. (The emulator fills in what a copy's
    // body leaves out, where GCS does not: `a_marked_copy_body_keeps_every_editable_field` in
    // the store's unit tests checks the body itself.)
    emu.put_with_metadata("names", "a/b/tool.bin", b"tool", &[("origin", "gsutil")])?;
    let before: serde_json::Value = serde_json::from_str(&emu.metadata("names", "a/b/tool.bin")?)?;
    std::fs::rename(p.join("a/b"), p.join("moved"))?;
    assert_eq!(std::fs::read(p.join("moved/c/f.txt"))?, b"deep");
    assert_eq!(std::fs::read(p.join("moved/tool.bin"))?, b"tool");
    let k = emu.keys("names")?;
    assert_eq!(
        k,
        vec![
            "a/",
            "a/renamed.txt",
            "moved/",
            "moved/c/",
            "moved/c/f.txt",
            "moved/tool.bin"
        ],
        "{k:?}"
    );
    let after: serde_json::Value = serde_json::from_str(&emu.metadata("names", "moved/tool.bin")?)?;
    assert_eq!(after["metadata"]["origin"], "gsutil", "{after}");
    assert!(
        after["metadata"]["bucketdrive-rename"].is_string(),
        "{after}"
    );
    assert_eq!(after["contentType"], before["contentType"], "{after}");
    // Remove everything again.
    std::fs::remove_file(p.join("moved/tool.bin"))?;
    std::fs::remove_file(p.join("moved/c/f.txt"))?;
    std::fs::remove_dir(p.join("moved/c"))?;
    std::fs::remove_dir(p.join("moved"))?;
    std::fs::remove_file(p.join("a/renamed.txt"))?;
    std::fs::remove_dir(p.join("a"))?;
    assert_eq!(emu.keys("names")?, Vec::<String>::new());
    assert_eq!(std::fs::read_dir(p)?.count(), 0);
    m.unmount()
}

#[test]
fn tar_extract_of_a_tree_matches_after_remount() -> Result<()> {
    let emu = setup("tarx")?;
    // A source tree of a few hundred files in nested directories.
    let src = tempfile::tempdir()?;
    for d in 0..12 {
        for f in 0..25 {
            let dir = src.path().join(format!("pkg{d}/mod{}", f % 3));
            std::fs::create_dir_all(&dir)?;
            std::fs::write(
                dir.join(format!("file{f}.rs")),
                random_bytes(100 + f * 37 + d, (d * 100 + f) as u64),
            )?;
        }
    }
    let tarball = src.path().with_extension("tar");
    assert!(Command::new("tar")
        .arg("cf")
        .arg(&tarball)
        .arg("-C")
        .arg(src.path())
        .arg(".")
        .status()?
        .success());
    let cache = tempfile::tempdir()?;
    let m = Mount::with_cache(&emu, "tarx", cache.path(), &["--write-back-delay", "0s"])?;
    assert!(Command::new("tar")
        .arg("xf")
        .arg(&tarball)
        .arg("-C")
        .arg(m.path())
        .status()?
        .success());
    let diff = Command::new("diff")
        .arg("-r")
        .arg(src.path())
        .arg(m.path())
        .output()?;
    assert!(
        diff.status.success(),
        "{}",
        String::from_utf8_lossy(&diff.stdout)
    );
    m.unmount()?;
    let m = Mount::with_cache(&emu, "tarx", cache.path(), &[])?;
    let diff = Command::new("diff")
        .arg("-r")
        .arg(src.path())
        .arg(m.path())
        .output()?;
    let _ = std::fs::remove_file(&tarball);
    assert!(
        diff.status.success(),
        "after remount: {}",
        String::from_utf8_lossy(&diff.stdout)
    );
    m.unmount()
}

/// A kill right after the closes, before their commit (`--commit-interval`, 1 s) loses nothing:
/// the kernel still has the pages; and the same with `--sync-on-close`.
#[test]
fn a_crash_loses_nothing_that_was_closed() -> Result<()> {
    let emu = setup("crash")?;
    for (extra, prefix) in [(None, "f"), (Some("--sync-on-close"), "s")] {
        let cache = tempfile::tempdir()?;
        let mut args = vec!["--write-back-delay", "1h"];
        args.extend(extra);
        let m = Mount::with_cache(&emu, "crash", cache.path(), &args)?;
        let mut want = Vec::new();
        for i in 0..50 {
            let data = random_bytes(1000 + i * 3001, 500 + i as u64);
            std::fs::write(m.path().join(format!("{prefix}{i:02}")), &data)?;
            want.push((format!("{prefix}{i:02}"), sha256(&data)));
        }
        assert!(
            !emu.keys("crash")?.iter().any(|k| k.starts_with(prefix)),
            "nothing uploaded yet: the write-back delay is an hour"
        );
        m.crash()?;
        let m = Mount::with_cache(&emu, "crash", cache.path(), &["--write-back-delay", "0s"])?;
        for (name, sha) in &want {
            wait_for_object(&emu, "crash", name, sha, 60)?;
        }
        m.unmount()?;
    }
    Ok(())
}

#[test]
fn status_wait_returns_when_everything_is_in_the_bucket() -> Result<()> {
    let emu = setup("status")?;
    // Long enough that all 20 files are still pending when `status` looks, however slowly
    // a crowded machine writes them.
    let m = Mount::new(&emu, "status", &["--write-back-delay", "10s"])?;
    let mut want = Vec::new();
    for i in 0..20 {
        let data = random_bytes(10_000 + i * 1000, 900 + i as u64);
        std::fs::write(m.path().join(format!("s{i}")), &data)?;
        want.push((format!("s{i}"), sha256(&data)));
    }
    let text = m.command("status", &[])?;
    assert!(text.contains("pending:   20 files"), "{text}");
    let text = m.command("status", &["--wait"])?;
    assert!(text.contains("pending:   0 files"), "{text}");
    // No polling: everything is there the moment `status --wait` returns.
    for (name, sha) in &want {
        assert_eq!(&sha256(&emu.get("status", name)?), sha, "{name}");
    }
    m.unmount()
}

/// `--cache-size`: files closed beyond the limit wait for earlier ones to upload (their hour of
/// write-back delay cut short) and all arrive; an open file bigger than the limit gets ENOSPC.
#[test]
fn a_full_cache_size_waits_for_uploads_then_refuses_open_data() -> Result<()> {
    let emu = setup("cachesize")?;
    let m = Mount::new(
        &emu,
        "cachesize",
        &["--cache-size", "24MiB", "--write-back-delay", "1h"],
    )?;
    let mut want = Vec::new();
    for i in 0..4u64 {
        let data = random_bytes(10 * MIB, 300 + i);
        write_and_close(&m.path().join(format!("f{i}")), &data)?;
        want.push((format!("f{i}"), sha256(&data)));
    }
    let err = write_and_close(&m.path().join("huge"), &random_bytes(30 * MIB, 399)).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    let _ = std::fs::remove_file(m.path().join("huge"));
    m.command("status", &["--wait"])?;
    for (name, sha) in &want {
        assert_eq!(&sha256(&emu.get("cachesize", name)?), sha, "{name}");
    }
    assert!(!emu.keys("cachesize")?.contains(&"huge".to_string()));
    m.unmount()
}

/// A small tmpfs as the cache disk: a write that does not fit gets ENOSPC, files already
/// closed are not lost, and the mount works again once space is free.
#[test]
fn a_full_cache_disk_gives_enospc_and_loses_nothing() -> Result<()> {
    let emu = setup("cachefull")?;
    let cache = tempfile::tempdir()?;
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=8m", "tmpfs"])
        .arg(cache.path())
        .status()?;
    anyhow::ensure!(ok.success(), "cannot mount a tmpfs for the cache");
    struct Unmount<'a>(&'a std::path::Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(self.0).status();
        }
    }
    let _tmpfs = Unmount(cache.path());
    let m = Mount::with_cache(
        &emu,
        "cachefull",
        cache.path(),
        &["--write-back-delay", "1h"],
    )?;
    let kept = random_bytes(3 * MIB, 77);
    std::fs::write(m.path().join("kept"), &kept)?;
    // Too big for what is left of the cache disk.
    let big = random_bytes(12 * MIB, 78);
    let err = write_and_close(&m.path().join("big"), &big).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    // The file closed earlier is intact and still goes up.
    assert_eq!(
        sha256(&std::fs::read(m.path().join("kept"))?),
        sha256(&kept)
    );
    let _ = std::fs::remove_file(m.path().join("big"));
    // fsync pushes it up now, whatever the write-back delay.
    std::fs::File::open(m.path().join("kept"))?.sync_all()?;
    assert_eq!(sha256(&emu.get("cachefull", "kept")?), sha256(&kept));
    // Space is free again: writing works.
    let mut f = std::fs::File::create(m.path().join("after"))?;
    f.write_all(b"works again")?;
    f.sync_all()?;
    drop(f);
    assert_eq!(emu.get("cachefull", "after")?, b"works again");
    m.unmount()
}

/// Runs fio's random-write job with `extra` arguments against `file`; fails with fio's output.
/// fio runs in a temporary directory because it writes a verify state file
/// (`local-randwrite-0-verify.state`) into its working directory.
fn fio(file: &std::path::Path, extra: &[&str]) -> Result<()> {
    let scratch = tempfile::tempdir()?;
    let out = Command::new("fio")
        .current_dir(scratch.path())
        .args([
            "--name=randwrite",
            "--rw=randwrite",
            "--bs=4k",
            "--size=64m",
            "--ioengine=psync",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--randseed=42",
        ])
        .arg(format!("--filename={}", file.display()))
        .args(extra)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "fio {extra:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// fio writes every 4 KiB block of a 64 MiB file in random order, each block carrying a header
/// with its offset and a CRC, and then verifies them through the mount. After a remount with an
/// empty cache, the same job verifies again, this time against the bytes in the bucket.
#[test]
fn fio_random_writes_verify_through_the_mount_and_from_the_bucket() -> Result<()> {
    let emu = setup("fio")?;
    let m = Mount::new(&emu, "fio", &["--write-back-delay", "0s"])?;
    let file = m.path().join("fio.dat");
    fio(&file, &["--do_verify=1"])?;
    let local = sha256(&std::fs::read(&file)?);
    wait_for_object(&emu, "fio", "fio.dat", &local, 120)?;
    m.unmount()?;

    let m = Mount::new(&emu, "fio", &[])?;
    fio(&m.path().join("fio.dat"), &["--verify_only"])?;
    m.unmount()
}

/// `ln -s` makes an empty object marked with gcsfuse's symlink metadata; `readlink`, `ls -l`
/// and following the link work, also after a remount and a rename.
#[test]
fn symlinks_are_made_read_and_followed() -> Result<()> {
    let emu = setup("links")?;
    emu.put("links", "dir/target.txt", b"pointed at")?;
    let m = Mount::new(&emu, "links", &[])?;
    let p = m.path();
    std::os::unix::fs::symlink("dir/target.txt", p.join("link"))?;
    std::os::unix::fs::symlink("../nowhere", p.join("dir/dangling"))?;
    assert_eq!(
        std::fs::read_link(p.join("link"))?,
        std::path::PathBuf::from("dir/target.txt")
    );
    assert_eq!(std::fs::read(p.join("link"))?, b"pointed at");
    let meta = emu.metadata("links", "link")?;
    assert!(
        meta.contains("\"gcsfuse_symlink_target\":\"dir/target.txt\""),
        "{meta}"
    );
    assert!(emu.get("links", "link")?.is_empty());
    m.unmount()?;

    let m = Mount::new(&emu, "links", &[])?;
    let p = m.path();
    let ls = Command::new("ls").arg("-l").arg(p).output()?;
    let text = String::from_utf8(ls.stdout)?;
    assert!(text.contains("link -> dir/target.txt"), "{text}");
    assert!(std::fs::symlink_metadata(p.join("dir/dangling"))?
        .file_type()
        .is_symlink());
    std::fs::rename(p.join("link"), p.join("renamed"))?;
    assert_eq!(std::fs::read(p.join("renamed"))?, b"pointed at");
    std::fs::remove_file(p.join("renamed"))?;
    assert_eq!(emu.get("links", "dir/target.txt")?, b"pointed at");
    assert!(!emu.keys("links")?.contains(&"renamed".to_string()));
    m.unmount()
}

/// With `--posix-metadata`, chmod and chown are stored as gsutil's `goog-reserved-posix-*`
/// metadata and survive a remount; `touch` of a file in the bucket changes only its metadata.
#[test]
fn posix_metadata_and_touch_patch_the_object() -> Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let emu = setup("posix")?;
    let body = random_bytes(3 * MIB, 41);
    emu.put("posix", "f", &body)?;
    // The owner and group set below are ones the mount may show (others are refused).
    const POSIX: [&str; 5] = [
        "--posix-metadata",
        "--posix-uids",
        "1234",
        "--posix-gids",
        "5678",
    ];
    let m = Mount::new(&emu, "posix", &POSIX)?;
    let f = m.path().join("f");
    let generation = |meta: &str| {
        meta.split("\"generation\":\"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .map(str::to_owned)
    };
    let before = generation(&emu.metadata("posix", "f")?);
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640))?;
    std::os::unix::fs::chown(&f, Some(1234), Some(5678))?;
    let ok = Command::new("touch")
        .args(["-m", "-d", "2020-09-13 12:26:40 UTC"])
        .arg(&f)
        .status()?;
    assert!(ok.success());
    let meta = emu.metadata("posix", "f")?;
    assert!(
        meta.contains("\"goog-reserved-posix-mode\":\"640\""),
        "{meta}"
    );
    assert!(
        meta.contains("\"goog-reserved-posix-uid\":\"1234\""),
        "{meta}"
    );
    assert!(
        meta.contains("\"goog-reserved-posix-gid\":\"5678\""),
        "{meta}"
    );
    assert!(
        meta.contains("\"goog-reserved-file-mtime\":\"1600000000\""),
        "{meta}"
    );
    assert_eq!(
        generation(&meta),
        before,
        "metadata patched, content not re-uploaded"
    );
    assert_eq!(sha256(&emu.get("posix", "f")?), sha256(&body));
    m.unmount()?;

    let m = Mount::new(&emu, "posix", &POSIX)?;
    let st = std::fs::metadata(m.path().join("f"))?;
    assert_eq!(st.mode() & 0o7777, 0o640);
    assert_eq!((st.uid(), st.gid()), (1234, 5678));
    assert_eq!(st.mtime(), 1_600_000_000);
    m.unmount()
}

/// Modification times keep their nanoseconds (rsync and robocopy compare them on their next
/// run): set on a file being written, and touched on a file uploaded through the mount and on
/// one put in the bucket by another tool. The object carries rclone's `mtime` (RFC 3339) beside
/// gsutil's `goog-reserved-file-mtime` (seconds), and a remount shows the time to the
/// nanosecond, from a listing and from a lookup.
#[test]
fn mtimes_keep_their_nanoseconds_across_a_remount() -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let emu = setup("nanos")?;
    emu.put("nanos", "bucket", b"put by another tool")?;
    let m = Mount::new(&emu, "nanos", &["--write-back-delay", "0s"])?;
    let p = m.path();
    write_and_close(&p.join("uploaded"), b"written, then touched")?;
    m.wait_uploaded(std::time::Duration::from_secs(60))?;
    let t = std::time::UNIX_EPOCH + std::time::Duration::new(1_577_941_567, 123_456_700);
    // utimensat on the open file, before the close commits it.
    let mut f = std::fs::File::create(p.join("new"))?;
    f.write_all(b"timed before its upload")?;
    f.set_modified(t)?;
    bucketdrive_tests::close_checked(f)?;
    for name in ["uploaded", "bucket"] {
        let ok = Command::new("touch")
            .args(["-m", "-d", "2020-01-02 05:06:07.1234567 UTC"])
            .arg(p.join(name))
            .status()?;
        assert!(ok.success(), "touch {name}");
    }
    m.wait_uploaded(std::time::Duration::from_secs(60))?;
    let names = ["bucket", "new", "uploaded"];
    for name in names {
        let meta = emu.metadata("nanos", name)?;
        assert!(
            meta.contains("\"mtime\":\"2020-01-02T05:06:07.123456700Z\""),
            "{name}: {meta}"
        );
        assert!(
            meta.contains("\"goog-reserved-file-mtime\":\"1577941567\""),
            "{name}: {meta}"
        );
    }
    m.unmount()?;

    let m = Mount::new(&emu, "nanos", &[])?;
    let mut listed = Vec::new();
    for entry in std::fs::read_dir(m.path())? {
        let entry = entry?;
        let st = entry.metadata()?;
        listed.push((
            entry.file_name().to_string_lossy().into_owned(),
            st.mtime(),
            st.mtime_nsec(),
        ));
    }
    listed.sort();
    let want: Vec<(String, i64, i64)> = names
        .iter()
        .map(|n| (n.to_string(), 1_577_941_567, 123_456_700))
        .collect();
    assert_eq!(listed, want);
    let st = std::fs::metadata(m.path().join("new"))?;
    assert_eq!(st.modified()?, t);
    assert_eq!(
        std::fs::read(m.path().join("new"))?,
        b"timed before its upload"
    );
    m.unmount()
}

/// `bucketdrive unmount` returns once every pending upload is in the bucket, whatever the
/// write-back delay; with `--no-wait` it returns at once and the next mount uploads them.
#[test]
fn unmount_waits_for_uploads_unless_told_not_to() -> Result<()> {
    let emu = setup("unmount")?;
    let cache = tempfile::tempdir()?;
    let m = Mount::with_cache(&emu, "unmount", cache.path(), &["--write-back-delay", "1h"])?;
    let mut want = Vec::new();
    for i in 0..5u64 {
        let data = random_bytes(2 * MIB + i as usize, 500 + i);
        std::fs::write(m.path().join(format!("w{i}")), &data)?;
        want.push((format!("w{i}"), sha256(&data)));
    }
    m.command("unmount", &[])?;
    for (name, sha) in &want {
        assert_eq!(
            &sha256(&emu.get("unmount", name)?),
            sha,
            "{name} in the bucket on return"
        );
    }
    m.unmount()?;

    let m = Mount::with_cache(&emu, "unmount", cache.path(), &["--write-back-delay", "1h"])?;
    let later = random_bytes(MIB, 600);
    std::fs::write(m.path().join("later"), &later)?;
    let said = m.command("unmount", &["--no-wait"])?;
    assert!(said.contains("1 files"), "{said}");
    assert!(emu.get("unmount", "later").is_err(), "left staged");
    m.unmount()?;

    let m = Mount::with_cache(&emu, "unmount", cache.path(), &[])?;
    wait_for_object(&emu, "unmount", "later", &sha256(&later), 60)?;
    m.unmount()
}

/// Writes through a shared mapping reach bucketdrive after the file's last `close()` (the
/// kernel writes the dirty pages back when the mapping goes): they are saved when the last
/// reference is released, and uploaded.
#[test]
fn writes_through_a_shared_mapping_after_close_are_uploaded() -> Result<()> {
    let emu = setup("mmap")?;
    let m = Mount::new(&emu, "mmap", &["--write-back-delay", "0s"])?;
    let path = m.path().join("mapped");
    let len = 3 * MIB;
    let mut want = random_bytes(len, 77);
    std::fs::write(&path, &want)?;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)?;
    // Unmapped below before it goes away.
    let map = bucketdrive_tests::map_shared(&f, len)?;
    // The descriptor is closed (its flush finds nothing dirty); the mapping still holds the
    // file open.
    drop(f);
    let bytes = unsafe { std::slice::from_raw_parts_mut(map as *mut u8, len) };
    let patch = random_bytes(10_000, 78);
    for at in [0usize, MIB + 123, len - patch.len()] {
        bytes[at..at + patch.len()].copy_from_slice(&patch);
        want[at..at + patch.len()].copy_from_slice(&patch);
    }
    // SAFETY: the mapping made above, of `len` bytes, no longer used.
    unsafe { libc::munmap(map, len) };
    wait_for_object(&emu, "mmap", "mapped", &sha256(&want), 60)?;
    assert_eq!(sha256(&std::fs::read(&path)?), sha256(&want));
    m.unmount()
}

/// A program that starts other programs while it writes a file (a build tool, an IDE, a shell
/// script): each child gets a copy of the descriptor and closes it at its `exec` or exit, and
/// the kernel reports each such close. Those closes save nothing: the bucket never gets the
/// file half written, and gets it whole at the writer's own close. A child that goes on
/// writing after the writer closed its copy is saved when the last descriptor goes.
#[test]
fn a_childs_close_of_an_inherited_descriptor_does_not_upload_half_a_file() -> Result<()> {
    let emu = setup("children")?;
    let m = Mount::new(&emu, "children", &["--write-back-delay", "0s"])?;
    let data = random_bytes(4 * MIB, 91);
    let mut f = std::fs::File::create(m.path().join("built"))?;
    f.write_all(&data[..MIB])?;
    // Rust's Command starts the child with a copy of every descriptor, closed at its exec.
    let ran = Command::new("true").status()?;
    anyhow::ensure!(ran.success(), "true failed: {ran}");
    // With a write-back delay of 0s, an upload of what the child's close saved would start at
    // once and land within a moment (it does, without the fix).
    for _ in 0..30 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let keys = emu.keys("children")?;
        anyhow::ensure!(
            !keys.iter().any(|k| k == "built"),
            "a child's close uploaded the file half written: {keys:?}"
        );
    }
    f.write_all(&data[MIB..])?;
    // The writer's own close saves the file: checked with a second descriptor still open, so
    // that it is the close, not the release of the last descriptor, that saved it.
    let still_open = f.try_clone()?;
    bucketdrive_tests::close_checked(f)?;
    wait_for_object(&emu, "children", "built", &sha256(&data), 60)?;
    drop(still_open);

    // Another thread of the writer closes: still the writer's close (threads are one process).
    let mut f = std::fs::File::create(m.path().join("threaded"))?;
    f.write_all(&data[..MIB])?;
    let still_open = f.try_clone()?;
    std::thread::spawn(move || bucketdrive_tests::close_checked(f))
        .join()
        .map_err(|_| anyhow::anyhow!("the closing thread panicked"))??;
    wait_for_object(&emu, "children", "threaded", &sha256(&data[..MIB]), 60)?;
    drop(still_open);

    // The shell opens fd 3, writes, starts a child holding fd 3 and closes its own copy; the
    // child writes after it and exits (its close saves: the opener's close came first). Both
    // lines reach the bucket.
    let script = format!(
        "exec 3>'{}'; echo opener >&3; (sleep 0.3; echo child >&3) & exec 3>&-; wait",
        m.path().join("log").display()
    );
    let ran = Command::new("bash").arg("-c").arg(&script).status()?;
    anyhow::ensure!(ran.success(), "the script failed: {ran}");
    wait_for_object(&emu, "children", "log", &sha256(b"opener\nchild\n"), 60)?;
    m.unmount()
}

/// Opens `path` as Python's `open(path, 'x')` does (`O_CREAT|O_EXCL`), writes `data` and
/// closes, checking the close.
fn create_new_and_write(path: &std::path::Path, data: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?;
    // Held open a moment, so the other machine's create comes while this file is not yet
    // uploaded: only a claim in the bucket can stop it.
    std::thread::sleep(std::time::Duration::from_millis(600));
    f.write_all(data)?;
    bucketdrive_tests::close_checked(f)
}

/// Invariant I12 through two real mounts of one bucket (two machines: each its own cache
/// directory), with `--exclusive-create`: an `O_CREAT|O_EXCL` open of one new name on both,
/// 0.3 s apart, lets exactly one succeed (the first) and gives the other `EEXIST`, and the
/// bucket holds the winner's bytes and nothing else; `mkdir` of one name on both lets exactly
/// one win.
#[test]
fn exclusive_create_and_mkdir_on_two_mounts_let_exactly_one_win() -> Result<()> {
    let emu = setup("excl")?;
    let args = ["--exclusive-create", "--write-back-delay", "0s"];
    let a = Mount::new(&emu, "excl", &args)?;
    let b = Mount::new(&emu, "excl", &args)?;
    for round in 0..2 {
        let name = format!("f{round}");
        let (pa, pb) = (a.path().join(&name), b.path().join(&name));
        // Both machines see the name free, as a program checking first would.
        assert!(!pa.exists() && !pb.exists());
        let (da, db) = (
            format!("from a, round {round}"),
            format!("from b, round {round}"),
        );
        // Each mount goes first once.
        let ((early_path, early_data), (late_path, late_data)) = if round == 0 {
            ((pa, da), (pb, db))
        } else {
            ((pb, db), (pa, da))
        };
        let data = early_data.clone();
        let early = std::thread::spawn(move || create_new_and_write(&early_path, data.as_bytes()));
        std::thread::sleep(std::time::Duration::from_millis(300));
        let late = create_new_and_write(&late_path, late_data.as_bytes());
        let early = early.join().expect("the first create's thread");
        assert!(
            early.is_ok()
                && late.as_ref().err().and_then(|e| e.raw_os_error()) == Some(libc::EEXIST),
            "round {round}: the first create wins, the second gets EEXIST: {early:?} / {late:?}"
        );
        wait_for_object(&emu, "excl", &name, &sha256(early_data.as_bytes()), 60)?;
        a.wait_uploaded(std::time::Duration::from_secs(60))?;
        b.wait_uploaded(std::time::Duration::from_secs(60))?;
        assert_eq!(
            emu.get("excl", &name)?,
            early_data.as_bytes(),
            "round {round}"
        );
        let keys = emu.keys("excl")?;
        assert!(
            keys.iter().all(|k| !k.contains(".conflict-")),
            "round {round}: no conflict copy: {keys:?}"
        );
    }

    // mkdir of one new name on both: exactly one wins, the other is told it exists.
    let (pa, pb) = (a.path().join("d"), b.path().join("d"));
    assert!(!pa.exists() && !pb.exists());
    let ra = std::fs::create_dir(&pa);
    let rb = std::fs::create_dir(&pb);
    assert!(
        ra.is_ok() && rb.as_ref().err().and_then(|e| e.raw_os_error()) == Some(libc::EEXIST),
        "mkdir: the first wins, the second gets EEXIST: {ra:?} / {rb:?}"
    );
    assert_eq!(emu.keys("excl")?, vec!["d/", "f0", "f1"]);
    // The marker names its mount (a retry after a lost answer knows it for its own); the
    // files do not carry their claims' tokens.
    assert!(emu.metadata("excl", "d/")?.contains("bucketdrive-writer"));
    for f in ["f0", "f1"] {
        assert!(
            !emu.metadata("excl", f)?.contains("bucketdrive-writer"),
            "{f}"
        );
    }
    a.unmount()?;
    b.unmount()
}
