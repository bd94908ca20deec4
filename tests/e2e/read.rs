//! End-to-end read path: the real GCS client against fake-gcs-server, through a real FUSE mount.
//! Every test checks content (checksums of what is read back), not just success.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::process::Command;
use std::time::Duration;

use bucketdrive_tests::{
    drop_page_cache, metric, random_bytes, sha256, wait_for_log, Emulator, Mount, Result,
};
use rand::{Rng, SeedableRng};

const MIB: usize = 1024 * 1024;

fn setup(bucket: &str) -> Result<Emulator> {
    let emu = Emulator::start()?;
    emu.create_bucket(bucket)?;
    Ok(emu)
}

#[test]
fn whole_files_of_edge_sizes_read_back_exactly() -> Result<()> {
    let emu = setup("sizes")?;
    let sizes = [0, 1, 8 * MIB - 1, 8 * MIB + 1, 100 * MIB];
    let mut expected = BTreeMap::new();
    for (i, size) in sizes.iter().enumerate() {
        let data = random_bytes(*size, i as u64);
        let name = format!("f{size}");
        emu.put("sizes", &name, &data)?;
        expected.insert(name, sha256(&data));
    }
    let m = Mount::new(&emu, "sizes", &[])?;
    for (name, want) in &expected {
        // `cat` is what users run; it reads with its own buffer sizes.
        let out = Command::new("cat").arg(m.path().join(name)).output()?;
        assert!(out.status.success(), "cat {name} failed");
        assert_eq!(&sha256(&out.stdout), want, "content of {name}");
    }
    m.unmount()
}

#[test]
fn random_preads_match_the_source() -> Result<()> {
    let emu = setup("random")?;
    let data = random_bytes(64 * MIB, 42);
    emu.put("random", "obj.bin", &data)?;
    let m = Mount::new(&emu, "random", &[])?;
    let f = std::fs::File::open(m.path().join("obj.bin"))?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut buf = vec![0u8; 256 * 1024];
    for i in 0..1000 {
        let len = rng.gen_range(1..=buf.len());
        let off = rng.gen_range(0..data.len() as u64);
        let n = f.read_at(&mut buf[..len], off)?;
        let end = (off as usize + len).min(data.len());
        assert_eq!(n, end - off as usize, "pread {i} length at {off}");
        assert!(
            buf[..n] == data[off as usize..end],
            "pread {i} content at {off}+{len}"
        );
    }
    drop(f);
    m.unmount()
}

#[test]
fn implicit_and_marker_directories_are_browsable() -> Result<()> {
    let emu = setup("dirs")?;
    emu.put("dirs", "a/b/c/deep.txt", b"deep")?;
    emu.put("dirs", "a/top.txt", b"top")?;
    emu.put("dirs", "marker/", b"")?;
    emu.put("dirs", "marker/inside/", b"")?;
    emu.put("dirs", "both", b"shadowed file")?;
    emu.put("dirs", "both/child", b"child")?;
    let m = Mount::new(&emu, "dirs", &[])?;
    let names = |p: &str| -> Result<Vec<String>> {
        let mut v: Vec<String> = std::fs::read_dir(m.path().join(p))?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<std::io::Result<_>>()?;
        v.sort();
        Ok(v)
    };
    assert_eq!(names("")?, vec!["a", "both", "marker"]);
    assert_eq!(names("a")?, vec!["b", "top.txt"]);
    assert_eq!(names("a/b/c")?, vec!["deep.txt"]);
    assert_eq!(names("marker")?, vec!["inside"]);
    assert!(names("marker/inside")?.is_empty());
    assert_eq!(std::fs::read(m.path().join("a/b/c/deep.txt"))?, b"deep");
    assert!(
        m.path().join("both").is_dir(),
        "the directory wins over the file of the same name"
    );
    assert_eq!(std::fs::read(m.path().join("both/child"))?, b"child");
    // find walks everything.
    let out = Command::new("find")
        .arg(".")
        .current_dir(m.path())
        .output()?;
    let mut found: Vec<String> = String::from_utf8(out.stdout)?
        .lines()
        .map(str::to_owned)
        .collect();
    found.sort();
    assert_eq!(
        found,
        vec![
            ".",
            "./a",
            "./a/b",
            "./a/b/c",
            "./a/b/c/deep.txt",
            "./a/top.txt",
            "./both",
            "./both/child",
            "./marker",
            "./marker/inside"
        ]
    );
    assert!(std::fs::metadata(m.path().join("nope")).is_err());
    m.unmount()
}

#[test]
fn large_directory_lists_completely_with_sizes() -> Result<()> {
    let emu = setup("large")?;
    let n = 5000;
    std::thread::scope(|s| -> Result<()> {
        let handles: Vec<_> = (0..8)
            .map(|t| {
                let emu = &emu;
                s.spawn(move || -> Result<()> {
                    for i in (t..n).step_by(8) {
                        emu.put(
                            "large",
                            &format!("big/file-{i:05}.dat"),
                            &vec![b'x'; i % 100],
                        )?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| anyhow::anyhow!("uploader panicked"))??;
        }
        Ok(())
    })?;
    let m = Mount::new(&emu, "large", &[])?;
    let out = Command::new("ls")
        .args(["-l", "--time-style=+"])
        .arg(m.path().join("big"))
        .output()?;
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout)?;
    let mut seen = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with('-')) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let size: usize = fields[4].parse()?;
        seen.insert(fields.last().copied().unwrap_or_default().to_string(), size);
    }
    assert_eq!(seen.len(), n, "every object is listed once");
    for i in 0..n {
        assert_eq!(
            seen.get(&format!("file-{i:05}.dat")),
            Some(&(i % 100)),
            "size of file {i}"
        );
    }
    m.unmount()
}

#[test]
fn concurrent_readers_of_different_files_all_verify() -> Result<()> {
    let emu = setup("concurrent")?;
    let mut want = Vec::new();
    for i in 0..8 {
        let data = random_bytes(12 * MIB + i * 4097, 100 + i as u64);
        emu.put("concurrent", &format!("f{i}"), &data)?;
        want.push(sha256(&data));
    }
    let m = Mount::new(&emu, "concurrent", &[])?;
    let results: Vec<Result<String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..8)
            .map(|i| {
                let p = m.path().join(format!("f{i}"));
                s.spawn(move || -> Result<String> { Ok(sha256(&std::fs::read(p)?)) })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("reader panicked")))
            })
            .collect()
    });
    for (i, r) in results.into_iter().enumerate() {
        assert_eq!(r?, want[i], "reader {i}");
    }
    m.unmount()
}

#[test]
fn replaced_object_shows_new_content_after_ttl_and_is_never_mixed() -> Result<()> {
    let emu = setup("replace")?;
    let old = random_bytes(20 * MIB, 1);
    let new = random_bytes(20 * MIB, 2);
    emu.put("replace", "f", &old)?;
    let m = Mount::new(&emu, "replace", &["--stat-ttl", "1s"])?;
    let path = m.path().join("f");
    let f = std::fs::File::open(&path)?;
    let mut head = vec![0u8; MIB];
    f.read_at(&mut head, 0)?;
    assert!(head == old[..MIB]);
    emu.put("replace", "f", &new)?;
    // The open handle keeps reading the generation it opened, or fails; it never returns bytes
    // of the new object.
    let mut buf = vec![0u8; MIB];
    let mut off = MIB;
    while off < old.len() {
        match f.read_at(&mut buf, off as u64) {
            Ok(0) => break,
            Ok(n) => {
                assert!(
                    buf[..n] == old[off..off + n],
                    "old handle returned foreign bytes at {off}"
                );
                off += n;
            }
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "unexpected error {e}");
                break;
            }
        }
    }
    drop(f);
    std::thread::sleep(Duration::from_millis(1500));
    let now = std::fs::read(&path)?;
    assert_eq!(
        sha256(&now),
        sha256(&new),
        "after the stat TTL the new object is read whole"
    );
    // Replacements of another size: the kernel caches file sizes, so each must show at its
    // own size, neither clipped nor padded, and `stat` must agree.
    for (i, len) in [(3u64, 30 * MIB), (4, 1000), (5, 0), (6, 5 * MIB)] {
        let body = random_bytes(len, i);
        emu.put("replace", "f", &body)?;
        std::thread::sleep(Duration::from_millis(1500));
        assert_eq!(
            std::fs::metadata(&path)?.len(),
            len as u64,
            "stat after replace"
        );
        assert_eq!(sha256(&std::fs::read(&path)?), sha256(&body), "{len} bytes");
    }
    m.unmount()
}

#[test]
fn read_only_mount_refuses_writes_with_erofs() -> Result<()> {
    let emu = setup("readonly")?;
    emu.put("readonly", "f", b"data")?;
    let m = Mount::new(&emu, "readonly", &["--read-only"])?;
    let err = std::fs::write(m.path().join("new"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
    let err = std::fs::OpenOptions::new()
        .write(true)
        .open(m.path().join("f"))
        .unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
    let err = std::fs::create_dir(m.path().join("d")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
    assert_eq!(
        emu.get("readonly", "f")?,
        b"data",
        "the object is untouched"
    );
    m.unmount()
}

#[test]
fn startup_errors_are_one_clear_line_and_nonzero() -> Result<()> {
    let emu = setup("exists")?;
    let dir = tempfile::tempdir()?;
    let run = |spec: &str, mp: &std::path::Path| {
        Command::new(bucketdrive_tests::bucketdrive_bin())
            .args(["mount", spec])
            .arg(mp)
            .args(["--anonymous", "--endpoint", &emu.url()])
            .output()
    };
    let out = run("no-such-bucket", dir.path())?;
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr)?;
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(
        err.contains("bucket \"no-such-bucket\" does not exist"),
        "{err}"
    );

    let out = run("exists", &dir.path().join("missing"))?;
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr)?;
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(err.contains("does not exist"), "{err}");

    let key = dir.path().with_extension("key.json");
    std::fs::write(&key, b"{ not a key file")?;
    // Private, as a key file should be (one readable by others gets a warning line too).
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    let out = Command::new(bucketdrive_tests::bucketdrive_bin())
        .args(["mount", "exists"])
        .arg(dir.path())
        .args(["--endpoint", &emu.url(), "--key-file"])
        .arg(&key)
        .output()?;
    let _ = std::fs::remove_file(&key);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr)?;
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(err.contains("key file"), "{err}");
    assert!(!bucketdrive_tests::is_mounted(dir.path()));

    // Detached mode: the parent waits for readiness, then the mount serves.
    emu.put("exists", "hello.txt", b"hi")?;
    let out = run("exists", dir.path())?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read = std::fs::read(dir.path().join("hello.txt"));
    let unmount = Command::new(bucketdrive_tests::bucketdrive_bin())
        .arg("unmount")
        .arg(dir.path())
        .status()?;
    if !unmount.success() {
        let _ = Command::new("umount").arg("-l").arg(dir.path()).status();
    }
    assert_eq!(read?, b"hi");
    assert!(unmount.success());
    assert!(!bucketdrive_tests::is_mounted(dir.path()));
    Ok(())
}

/// Names in `dir`, sorted, as `ls` gives them.
fn names_in(dir: &std::path::Path) -> Result<Vec<String>> {
    let mut v: Vec<String> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<_>>()?;
    v.sort();
    Ok(v)
}

/// Listings a request made the mount send, from its debug log.
fn list_requests(m: &Mount) -> usize {
    m.log_text()
        .lines()
        .filter(|l| l.contains("op=\"list\""))
        .filter(|l| l.contains("d/") || l.contains("key=\"d"))
        .count()
}

/// An unchanged listing is answered by the kernel's own directory cache, with no request; a
/// change made through the mount shows at once, and one made by another client once the stat
/// TTL has passed.
#[test]
fn unchanged_listings_are_cached_in_the_kernel() -> Result<()> {
    let emu = setup("dircache")?;
    emu.put("dircache", "d/a", b"a")?;
    emu.put("dircache", "d/b", b"b")?;
    let m = Mount::new(
        &emu,
        "dircache",
        &["--stat-ttl", "3s", "--log-level", "debug"],
    )?;
    let d = m.path().join("d");
    assert_eq!(names_in(&d)?, ["a", "b"]);
    let after_first = list_requests(&m);
    assert!(after_first >= 1, "the first listing asks the bucket");
    for _ in 0..5 {
        assert_eq!(names_in(&d)?, ["a", "b"]);
    }
    assert_eq!(
        list_requests(&m),
        after_first,
        "unchanged listings come from the kernel's cache"
    );

    // Changes through the mount show at once.
    std::fs::write(d.join("c"), b"c")?;
    assert_eq!(names_in(&d)?, ["a", "b", "c"]);
    std::fs::remove_file(d.join("a"))?;
    assert_eq!(names_in(&d)?, ["b", "c"]);

    // Another client's change shows once the stat TTL has passed.
    m.wait_uploaded(Duration::from_secs(30))?;
    emu.put("dircache", "d/z", b"z")?;
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(names_in(&d)?, ["b", "c", "z"]);
    m.unmount()
}

/// Disk bytes the files under `dir` take (sparse holes excluded).
fn disk_use(dir: &std::path::Path) -> Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut n = 0;
    for e in std::fs::read_dir(dir)? {
        let m = std::fs::symlink_metadata(e?.path())?;
        n += m.blocks() * 512;
    }
    Ok(n)
}

#[test]
fn read_cache_serves_a_reread_after_remount_and_never_a_replaced_object() -> Result<()> {
    let emu = setup("rcache")?;
    let old = random_bytes(40 * MIB + 12_345, 11);
    let new = random_bytes(40 * MIB + 12_345, 12);
    emu.put("rcache", "f.bin", &old)?;
    let rc = tempfile::Builder::new().prefix("bd-rcache").tempdir()?;
    let rc_dir = rc.path().to_string_lossy().into_owned();
    let objects = rc.path().join("bucketdrive-read-cache").join("objects");
    // Reads the file through a fresh mount; returns its sha256, the bytes downloaded and the
    // bytes served from the read cache.
    let read = |extra: &[&str]| -> Result<(String, f64, f64)> {
        let addr = format!("127.0.0.1:{}", bucketdrive_tests::free_port()?);
        let mut args = vec!["--read-cache-dir", &rc_dir, "--metrics-addr", &addr];
        args.extend_from_slice(extra);
        let m = Mount::new(&emu, "rcache", &args)?;
        let sum = sha256(&std::fs::read(m.path().join("f.bin"))?);
        let fetched = metric(&addr, "bucketdrive_fetched_bytes_total")?;
        let hits = metric(&addr, "bucketdrive_read_cache_hit_bytes_total")?;
        m.unmount()?;
        Ok((sum, fetched, hits))
    };

    let (sum, fetched, hits) = read(&[])?;
    assert_eq!(sum, sha256(&old), "first read");
    assert!(
        fetched >= old.len() as f64,
        "first read downloads: {fetched}"
    );
    // The cache starts empty, so what it serves is bytes this mount downloaded first: a range
    // read again within the read (the kernel's read-ahead arriving out of order on a busy
    // machine resets the window) may come from the cache. Seen: 1 MiB of 40.
    assert!(
        hits < fetched / 4.0,
        "the first read was served {hits} bytes from an empty cache, having downloaded {fetched}"
    );

    let (sum, fetched, hits) = read(&[])?;
    assert_eq!(sum, sha256(&old), "re-read after remount");
    assert_eq!(fetched, 0.0, "the re-read downloads nothing");
    assert!(
        hits >= old.len() as f64,
        "it is served from the cache: {hits}"
    );

    // Replaced in the bucket (same size): the next mount reads the new bytes, from the bucket.
    emu.put("rcache", "f.bin", &new)?;
    let (sum, fetched, hits) = read(&[])?;
    assert_eq!(sum, sha256(&new), "a replaced object is read new");
    assert!(fetched >= new.len() as f64, "{fetched}");
    // Nothing of the old generation is served: the bytes read are the new object's (the
    // checksum above). The new generation's cache starts empty, so, as for the first read, a
    // range read again within the read may be served from what this read just downloaded.
    assert!(
        hits < fetched / 4.0,
        "the read of a replaced object was served {hits} bytes from the cache, having downloaded {fetched}"
    );
    let (sum, fetched, _) = read(&[])?;
    assert_eq!(sum, sha256(&new));
    assert_eq!(fetched, 0.0, "and is cached in turn");

    // A cap below the object: reads stay right, the disk use stays under it.
    let (sum, _, _) = read(&["--read-cache-size", "8MiB"])?;
    assert_eq!(sum, sha256(&new));
    let used = disk_use(&objects)?;
    assert!(used <= 8 * MIB as u64, "{used} bytes on disk");
    let (sum, fetched, hits) = read(&["--read-cache-size", "8MiB"])?;
    assert_eq!(sum, sha256(&new));
    assert!(hits > 0.0 && fetched < new.len() as f64, "{hits} {fetched}");
    assert!(disk_use(&objects)? <= 8 * MIB as u64);
    Ok(())
}

/// Opens and reads `path` whole until the mount's passthrough-opens counter moves (the first
/// opens of a file wholly in the read cache start the mount's check of it, and pass through
/// once it passed); returns the bytes of the read that passed through and how many bytes the
/// daemon served meanwhile.
fn read_until_passthrough(addr: &str, path: &std::path::Path) -> Result<(Vec<u8>, f64)> {
    let end = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        drop_page_cache()?;
        let (opens, served) = (
            metric(addr, "bucketdrive_passthrough_opens_total")?,
            metric(addr, "bucketdrive_read_bytes_total")?,
        );
        let data = std::fs::read(path)?;
        if metric(addr, "bucketdrive_passthrough_opens_total")? > opens {
            let served = metric(addr, "bucketdrive_read_bytes_total")? - served;
            return Ok((data, served));
        }
        anyhow::ensure!(
            std::time::Instant::now() < end,
            "no open passed through within 20 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A file wholly in the disk read cache, once the mount checked it, is read by the kernel
/// itself (FUSE passthrough): the right bytes, while the daemon serves none of them, also to
/// two readers at once and to a reader of 4 KiB reads at offsets. Root mounts, `--read-only`.
#[test]
fn a_file_wholly_in_the_read_cache_is_read_by_the_kernel_itself() -> Result<()> {
    let emu = setup("pthru")?;
    let data = random_bytes(24 * MIB + 4321, 31);
    emu.put("pthru", "f.bin", &data)?;
    let rc = tempfile::Builder::new().prefix("bd-rcache").tempdir()?;
    let rc_dir = rc.path().to_string_lossy().into_owned();
    let addr = format!("127.0.0.1:{}", bucketdrive_tests::free_port()?);
    let args = [
        "--read-only",
        "--read-cache-dir",
        &rc_dir,
        "--metrics-addr",
        &addr,
    ];
    // Fill the cache, then remount: the new mount finds it on disk.
    let m = Mount::new(&emu, "pthru", &args)?;
    assert_eq!(
        sha256(&std::fs::read(m.path().join("f.bin"))?),
        sha256(&data)
    );
    m.unmount()?;
    let m = Mount::new(&emu, "pthru", &args)?;
    wait_for_log(&m, "FUSE passthrough: on")?;
    let f = m.path().join("f.bin");
    let (got, served) = read_until_passthrough(&addr, &f)?;
    assert_eq!(sha256(&got), sha256(&data), "the right bytes");
    assert_eq!(served, 0.0, "the daemon served none of them");
    // Two readers at once share the inode's backing file; and 4 KiB reads at offsets.
    drop_page_cache()?;
    let served = metric(&addr, "bucketdrive_read_bytes_total")?;
    let opens = metric(&addr, "bucketdrive_passthrough_opens_total")?;
    let (a, b) = (std::fs::File::open(&f)?, std::fs::File::open(&f)?);
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for _ in 0..200 {
        let at = rng.gen_range(0..data.len() as u64 - 4096);
        let (mut x, mut y) = ([0u8; 4096], [0u8; 4096]);
        a.read_exact_at(&mut x, at)?;
        b.read_exact_at(&mut y, data.len() as u64 - 4096 - at)?;
        assert_eq!(&x[..], &data[at as usize..at as usize + 4096]);
        let back = data.len() - 4096 - at as usize;
        assert_eq!(&y[..], &data[back..back + 4096]);
    }
    assert_eq!(
        metric(&addr, "bucketdrive_passthrough_opens_total")? - opens,
        2.0
    );
    assert_eq!(metric(&addr, "bucketdrive_read_bytes_total")?, served);
    drop((a, b));
    assert_eq!(metric(&addr, "bucketdrive_fetched_bytes_total")?, 0.0);
    m.unmount()
}

/// Without passthrough the same reads go through the daemon as before: `--passthrough off`,
/// and a writable mount under `auto`, which passes only files being written through (so that
/// a writer never meets readers passing through as a busy file), and says so in its log.
#[test]
fn passthrough_off_and_writable_mounts_read_through_the_daemon() -> Result<()> {
    let emu = setup("pthruoff")?;
    let data = random_bytes(6 * MIB + 99, 32);
    emu.put("pthruoff", "f.bin", &data)?;
    let rc = tempfile::Builder::new().prefix("bd-rcache").tempdir()?;
    let rc_dir = rc.path().to_string_lossy().into_owned();
    let cases = [
        (
            &["--read-only", "--passthrough", "off"][..],
            "FUSE passthrough: off",
        ),
        (
            &["--passthrough", "auto"][..],
            "FUSE passthrough: on (the kernel itself reads and writes files being written whose bytes are all local)",
        ),
    ];
    for (extra, says) in cases {
        let addr = format!("127.0.0.1:{}", bucketdrive_tests::free_port()?);
        let mut args = vec!["--read-cache-dir", &rc_dir, "--metrics-addr", &addr];
        args.extend_from_slice(extra);
        let m = Mount::new(&emu, "pthruoff", &args)?;
        wait_for_log(&m, says)?;
        for _ in 0..4 {
            drop_page_cache()?;
            assert_eq!(
                sha256(&std::fs::read(m.path().join("f.bin"))?),
                sha256(&data)
            );
            std::thread::sleep(Duration::from_millis(300));
        }
        assert_eq!(metric(&addr, "bucketdrive_passthrough_opens_total")?, 0.0);
        assert!(metric(&addr, "bucketdrive_read_bytes_total")? >= 4.0 * data.len() as f64);
        m.unmount()?;
    }
    Ok(())
}

/// `--passthrough on` on a writable mount: while readers pass through a file, opening it for
/// writing (or truncating it) is refused with `ETXTBSY` ("text file busy", as for a program
/// being run), never `EIO`, and nothing is written into the cache file; once they closed, the
/// write goes through, reaches the bucket, and the next open reads it.
#[test]
fn a_writer_beside_passthrough_readers_is_told_the_file_is_busy() -> Result<()> {
    let emu = setup("pthruw")?;
    let old = random_bytes(5 * MIB + 7, 33);
    emu.put("pthruw", "f.bin", &old)?;
    let rc = tempfile::Builder::new().prefix("bd-rcache").tempdir()?;
    let rc_dir = rc.path().to_string_lossy().into_owned();
    let addr = format!("127.0.0.1:{}", bucketdrive_tests::free_port()?);
    let args = [
        "--passthrough",
        "on",
        "--read-cache-dir",
        &rc_dir,
        "--metrics-addr",
        &addr,
    ];
    let m = Mount::new(&emu, "pthruw", &args)?;
    let f = m.path().join("f.bin");
    let (got, _) = read_until_passthrough(&addr, &f)?;
    assert_eq!(sha256(&got), sha256(&old));
    let opens = metric(&addr, "bucketdrive_passthrough_opens_total")?;
    let reader = std::fs::File::open(&f)?;
    assert_eq!(
        metric(&addr, "bucketdrive_passthrough_opens_total")?,
        opens + 1.0
    );
    let busy = |r: std::io::Result<()>| -> Result<()> {
        let e = r.expect_err("refused while readers pass through");
        anyhow::ensure!(e.raw_os_error() == Some(libc::ETXTBSY), "{e}");
        Ok(())
    };
    busy(std::fs::OpenOptions::new().write(true).open(&f).map(drop))?;
    busy(std::fs::File::create(&f).map(drop))?;
    busy(
        std::fs::OpenOptions::new()
            .write(true)
            .open(&f)
            .and_then(|w| w.set_len(1)),
    )?;
    let mut head = vec![0u8; 1 << 20];
    reader.read_exact_at(&mut head, 0)?;
    assert_eq!(&head[..], &old[..1 << 20], "the reader reads its bytes");
    drop(reader);
    // Closed: the write goes through.
    let new = random_bytes(5 * MIB + 7, 34);
    {
        use std::io::Write;
        let mut w = std::fs::OpenOptions::new().write(true).open(&f)?;
        w.write_all(&new)?;
        w.sync_all()?;
    }
    m.wait_uploaded(Duration::from_secs(60))?;
    assert_eq!(sha256(&emu.get("pthruw", "f.bin")?), sha256(&new));
    drop_page_cache()?;
    assert_eq!(sha256(&std::fs::read(&f)?), sha256(&new), "read new");
    m.unmount()?;
    // Nothing was written into a cache file: the old generation's holds it whole, and no data
    // file holds a mix.
    let mut whole_old = 0;
    for e in std::fs::read_dir(rc.path().join("bucketdrive-read-cache").join("objects"))? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "data")
            && std::fs::metadata(&p)?.len() == old.len() as u64
        {
            let on_disk = std::fs::read(&p)?;
            assert!(
                on_disk == old || on_disk == new,
                "{} holds a mix",
                p.display()
            );
            whole_old += usize::from(on_disk == old);
        }
    }
    assert_eq!(whole_old, 1, "the old generation's file is intact");
    Ok(())
}

/// Real buckets are reached over HTTPS. The same client goes through TLS to the emulator and
/// trusts a CA made for this test, given to the daemon alone through `SSL_CERT_FILE`; the
/// read path's ranges come over TLS 1.3 with their records opened in place (`tls_records`).
/// Bytes read and written are checked. Without that trust the mount is refused: nothing in
/// the machine's trust store vouches for the emulator.
#[test]
fn reads_and_writes_over_https_trusting_a_test_ca() -> Result<()> {
    let ca = bucketdrive_tests::TestCa::new()?;
    let emu = Emulator::start_https(&ca)?;
    emu.create_bucket("tls-bucket")?;
    let data = random_bytes(5 * MIB + 123, 77);
    emu.put("tls-bucket", "in.bin", &data)?;
    let https = emu
        .https_url()
        .ok_or_else(|| anyhow::anyhow!("the emulator serves no HTTPS"))?;
    let cache = tempfile::tempdir()?;
    let m = Mount::with_env(
        &https,
        "tls-bucket",
        cache.path(),
        &[
            ("SSL_CERT_FILE", &ca.cert),
            (
                "RUST_LOG",
                std::path::Path::new("info,fs_core::store::range_get=debug"),
            ),
        ],
        &[],
    )?;
    let got = std::fs::read(m.path().join("in.bin"))?;
    assert_eq!(sha256(&got), sha256(&data), "read over HTTPS");
    // The emulator (Go's TLS) negotiates TLS 1.3: the ranges' records were opened in place.
    assert!(
        m.log_text().contains("TLS 1.3, records opened in place"),
        "records carried by tls_records: {}",
        m.log_tail(20)
    );
    let out = random_bytes(3 * MIB + 7, 78);
    bucketdrive_tests::write_and_close(&m.path().join("out.bin"), &out)?;
    m.wait_uploaded(Duration::from_secs(60))?;
    m.unmount()?;
    assert_eq!(
        sha256(&emu.get("tls-bucket", "out.bin")?),
        sha256(&out),
        "written over HTTPS"
    );

    let mnt = tempfile::tempdir()?;
    let cache = tempfile::tempdir()?;
    let refused = Command::new(bucketdrive_tests::bucketdrive_bin())
        .args(["mount", "tls-bucket"])
        .arg(mnt.path())
        .args(["--endpoint", &https, "--anonymous", "--cache-dir"])
        .arg(cache.path())
        .env_remove("SSL_CERT_FILE")
        .env_remove("SSL_CERT_DIR")
        .output()?;
    if bucketdrive_tests::is_mounted(mnt.path()) {
        let _ = Command::new("umount").arg("-l").arg(mnt.path()).status();
        anyhow::bail!("mounted an endpoint whose certificate nothing trusted");
    }
    assert!(!refused.status.success(), "the mount fails");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("tls-bucket") && err.contains("certificate is not trusted"),
        "a clear error: {err}"
    );
    Ok(())
}
