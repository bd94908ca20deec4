//! Shared buckets: two machines (two mounts of one bucket, each with its own `--cache-dir`) and
//! other tools writing straight to the bucket through the emulator's API. Every test checks the
//! bytes in the bucket, read directly from the emulator, and each wait is bounded: a watchdog
//! kills the daemons of a test that hangs, so its file operations fail instead of blocking.
//!
//! What the suite proves, by invariant:
//!
//! - **I8, nobody else's bytes are destroyed.** `rm` of a file this mount was writing leaves
//!   the other machine's object (`rm_leaves_the_other_machines_object`); an editor's save
//!   (write a temporary, rename it over) keeps the other machine's version
//!   (`editor_save_keeps_the_other_machines_version`).
//! - **I9, every acknowledged version of every mount survives.** Two machines saving one file
//!   at once leave the object plus one conflict copy (`two_machines_saving_one_file_keep_both`);
//!   appends on two machines both survive (`appends_on_two_machines_both_survive`); the editor's
//!   save above keeps both versions.
//! - **I10, a failed write never replaces a good object.** A copy over a big object that fails
//!   with `ENOSPC` leaves the old object whole, also after a remount
//!   (`failed_copy_over_an_object_never_replaces_it`).
//! - **I12, exclusive creates.** `O_CREAT|O_EXCL` of one new name on two mounts: by default
//!   both succeed and both versions survive (`create_new_on_two_mounts_keeps_both_versions`);
//!   with `--exclusive-create` exactly one succeeds (`exclusive_create_lets_one_mount_win`);
//!   `mkdir` of one new name: exactly one wins, 0.3 s apart (`mkdir_on_two_mounts_lets_one_win`)
//!   and at the same moment (`mkdir_at_the_same_moment_on_two_mounts_lets_one_win`).
//! - **Offline listing.** A folder listed before the link went down stays listable, with the
//!   files written since, and `status` and the log say the mount is offline until the link is
//!   back (`offline_folder_lists_old_and_new_files`).
//! - **Other tools' changes show.** A same-size replacement is read new, with its new mtime,
//!   after the stat TTL, with and without the read cache
//!   (`same_size_replacement_is_read_new_after_the_ttl*`), and within the stat TTL when the
//!   kernel asks again late in it: it is given what is left of the TTL, not a fresh one
//!   (`a_change_shows_within_the_stat_ttl_when_the_kernel_asks_late`).
//! - **Readers see writers.** A descriptor opened before an append reads the appended bytes,
//!   for a small and a big (256 MiB) file, with and without an upload landing between the open
//!   and the read (`reader_opened_before_an_append_*`).

use std::collections::BTreeSet;
use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, UNIX_EPOCH};

use bucketdrive_tests::{
    close_checked, random_bytes, sha256, wait_for_object, write_and_close, Emulator, Mount, Proxy,
    Result,
};

const MIB: usize = 1024 * 1024;
/// How long a mount may take to upload what it holds once asked to.
const DRAIN: Duration = Duration::from_secs(120);
/// How long one test may run before the watchdog kills its daemons.
const LIMIT: Duration = Duration::from_secs(300);
/// A write-back delay that keeps an upload waiting for the whole test.
const WAITS: [&str; 2] = ["--write-back-delay", "30s"];
/// A write-back delay that lets an upload land at once.
const LANDS: [&str; 2] = ["--write-back-delay", "0s"];

/// Tests that move hundreds of MiB run one at a time, whatever the number of test threads.
static HEAVY: Mutex<()> = Mutex::new(());

fn heavy() -> std::sync::MutexGuard<'static, ()> {
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}

fn setup(bucket: &str) -> Result<Emulator> {
    let emu = Emulator::start()?;
    emu.create_bucket(bucket)?;
    Ok(emu)
}

/// Kills the given daemons with SIGKILL if the test is still running after `limit`, so a file
/// operation that hangs fails (`ENOTCONN`) instead of blocking the test forever; the mount
/// guards then clear the dead mounts.
struct Watchdog {
    done: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    fn arm(mounts: &[&Mount], limit: Duration) -> Self {
        let pids: Vec<u32> = mounts.iter().filter_map(|m| m.pid()).collect();
        let done = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&done);
        let thread = std::thread::spawn(move || {
            let deadline = Instant::now() + limit;
            while !flag.load(Ordering::SeqCst) {
                if Instant::now() > deadline {
                    eprintln!("watchdog: the test ran past {limit:?}; killing its daemons");
                    for pid in &pids {
                        // SAFETY: kill(2) on a daemon this test started.
                        unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
                    }
                    return;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        Watchdog {
            done,
            thread: Some(thread),
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Every key of the bucket with its bytes whose name is `key` or one of its conflict copies
/// (`KEY.conflict-…`), sorted by name.
fn versions_of(emu: &Emulator, bucket: &str, key: &str) -> Result<Vec<(String, Vec<u8>)>> {
    let prefix = format!("{key}.conflict-");
    let mut out = Vec::new();
    for k in emu.keys(bucket)? {
        if k == key || k.starts_with(&prefix) {
            if let Some(data) = emu.get_opt(bucket, &k)? {
                out.push((k, data));
            }
        }
    }
    Ok(out)
}

/// Which of the named `known` versions each of `got` is, for messages.
fn describe(got: &[(String, Vec<u8>)], known: &[(&str, &[u8])]) -> String {
    let parts: Vec<String> = got
        .iter()
        .map(|(k, data)| {
            let what = known
                .iter()
                .find(|(_, v)| *v == data.as_slice())
                .map_or_else(
                    || format!("{} bytes of no known version", data.len()),
                    |(name, _)| format!("{name}'s version"),
                );
            format!("{k}: {what}")
        })
        .collect();
    if parts.is_empty() {
        "nothing".into()
    } else {
        parts.join(", ")
    }
}

/// The log lines of `m` at warn or error level, for the test's output.
fn warnings(m: &Mount) -> String {
    m.log_text()
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .map(|l| format!("  {l}\n"))
        .collect()
}

/// Names in `dir`, sorted, as `ls` gives them.
fn names_in(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut v: Vec<String> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<_>>()?;
    v.sort();
    Ok(v)
}

/// Starts `true` and waits for it. The child gets a copy of every descriptor of this process
/// (closed at its exec: the kernel sends the mount a flush for each file open here).
fn spawn_true() -> std::io::Result<()> {
    let status = std::process::Command::new("true").status()?;
    if !status.success() {
        return Err(std::io::Error::other(format!("true exited with {status}")));
    }
    Ok(())
}

/// Pseudo-random bytes, fast even in a debug build (xorshift), different per `seed`.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

// ---------------------------------------------------------------------------------------------
// I8: nobody else's bytes are destroyed.

/// Case 1: machine 1 writes `r` (its upload waits), machine 2 writes `r` and it lands, then
/// machine 1 removes its own `r`. The rm succeeds, but it may only drop machine 1's pending
/// version: machine 2's object stays, byte for byte, and nothing of machine 1's is uploaded.
#[test]
fn rm_leaves_the_other_machines_object() -> Result<()> {
    let emu = setup("rmshared")?;
    let m1 = Mount::new(&emu, "rmshared", &WAITS)?;
    let m2 = Mount::new(&emu, "rmshared", &LANDS)?;
    let _dog = Watchdog::arm(&[&m1, &m2], LIMIT);
    let ours = random_bytes(100_000, 11);
    let theirs = random_bytes(120_000, 12);

    write_and_close(&m1.path().join("r"), &ours)?;
    anyhow::ensure!(
        emu.get_opt("rmshared", "r")?.is_none(),
        "test setup: machine 1's upload should wait"
    );
    write_and_close(&m2.path().join("r"), &theirs)?;
    m2.wait_uploaded(DRAIN)?;
    anyhow::ensure!(
        emu.get_opt("rmshared", "r")?.as_deref() == Some(&theirs[..]),
        "test setup: machine 2's r should have landed"
    );

    std::fs::remove_file(m1.path().join("r"))
        .map_err(|e| anyhow::anyhow!("machine 1's rm of its own r failed: {e}"))?;
    let known: [(&str, &[u8]); 2] = [("machine 1", &ours), ("machine 2", &theirs)];
    let after_rm = versions_of(&emu, "rmshared", "r")?;
    eprintln!(
        "after machine 1's rm the bucket holds: {}",
        describe(&after_rm, &known)
    );
    eprintln!("machine 1's warnings:\n{}", warnings(&m1));
    anyhow::ensure!(
        emu.get_opt("rmshared", "r")?.as_deref() == Some(&theirs[..]),
        "machine 1's rm destroyed machine 2's r: the bucket holds {}",
        describe(&after_rm, &known)
    );

    m1.unmount()?;
    let all = emu.objects("rmshared")?;
    anyhow::ensure!(
        !all.values().any(|v| *v == ours),
        "machine 1's removed r was uploaded after all: {:?}",
        all.keys().collect::<Vec<_>>()
    );
    anyhow::ensure!(
        all.keys().map(String::as_str).collect::<Vec<_>>() == ["r"]
            && all.get("r").map(Vec::as_slice) == Some(&theirs[..]),
        "after machine 1 drained the bucket holds {}",
        describe(&versions_of(&emu, "rmshared", "r")?, &known)
    );
    m2.unmount()
}

/// Case 2: machine 1 writes `doc` (its upload waits), machine 2 writes `doc` and it lands,
/// then machine 1 saves as editors do (write `doc.tmp`, rename it over `doc`). Once both have
/// drained, machine 2's bytes and machine 1's saved bytes are both in the bucket, at `doc` or
/// in a conflict copy.
#[test]
fn editor_save_keeps_the_other_machines_version() -> Result<()> {
    let emu = setup("editsave")?;
    let m1 = Mount::new(&emu, "editsave", &WAITS)?;
    let m2 = Mount::new(&emu, "editsave", &LANDS)?;
    let _dog = Watchdog::arm(&[&m1, &m2], LIMIT);
    let first = random_bytes(50_000, 21);
    let theirs = random_bytes(60_000, 22);
    let saved = random_bytes(70_000, 23);

    write_and_close(&m1.path().join("doc"), &first)?;
    write_and_close(&m2.path().join("doc"), &theirs)?;
    m2.wait_uploaded(DRAIN)?;
    anyhow::ensure!(
        emu.get_opt("editsave", "doc")?.as_deref() == Some(&theirs[..]),
        "test setup: machine 2's doc should have landed"
    );

    write_and_close(&m1.path().join("doc.tmp"), &saved)?;
    std::fs::rename(m1.path().join("doc.tmp"), m1.path().join("doc"))?;
    anyhow::ensure!(
        std::fs::read(m1.path().join("doc"))? == saved,
        "machine 1 reads back its save"
    );
    m1.unmount()?;
    m2.unmount()?;

    let known: [(&str, &[u8]); 3] = [
        ("machine 1's first", &first),
        ("machine 2", &theirs),
        ("machine 1's saved", &saved),
    ];
    let got = versions_of(&emu, "editsave", "doc")?;
    eprintln!("after both drained: {}", describe(&got, &known));
    let has = |v: &[u8]| got.iter().any(|(_, d)| d == v);
    anyhow::ensure!(
        has(&theirs) && has(&saved),
        "both versions must survive the save; the bucket holds {}",
        describe(&got, &known)
    );
    let keys = emu.keys("editsave")?;
    anyhow::ensure!(
        !keys.iter().any(|k| k.starts_with("doc.tmp")),
        "the temporary name is gone: {keys:?}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// I10: a failed write never replaces a good object.

/// Case 3: a 64 MiB object, a mount with `--cache-size 16MiB`, and a different 64 MiB file
/// written over it with a 1 MiB buffer. The write or the close fails (`ENOSPC`); the bucket's
/// object stays the whole old version, also after a remount with the same cache directory:
/// the failed edit is never uploaded.
#[test]
fn failed_copy_over_an_object_never_replaces_it() -> Result<()> {
    let _heavy = heavy();
    let emu = setup("failcopy")?;
    let old = pattern(64 * MIB, 31);
    let new = pattern(64 * MIB, 32);
    emu.put("failcopy", "big", &old)?;
    let old_sha = sha256(&old);
    let cache = tempfile::Builder::new().prefix("bd-cache").tempdir()?;
    let args = ["--cache-size", "16MiB", "--write-back-delay", "1s"];
    let m = Mount::with_cache(&emu, "failcopy", cache.path(), &args)?;
    let dog = Watchdog::arm(&[&m], LIMIT);

    let started = Instant::now();
    // Which call failed: a write (and after how many bytes) or the close.
    let outcome = (|| -> std::result::Result<(), (String, std::io::Error)> {
        let mut f =
            std::fs::File::create(m.path().join("big")).map_err(|e| ("the open".to_string(), e))?;
        for (i, chunk) in new.chunks(MIB).enumerate() {
            f.write_all(chunk)
                .map_err(|e| (format!("a write after {i} MiB"), e))?;
            if i == 7 {
                // A program that starts another one while it writes (a build tool, an IDE):
                // the child's copy of the descriptor is closed at its exec, and the kernel
                // tells the mount about that close as a flush of this file.
                spawn_true().map_err(|e| ("starting a child process".to_string(), e))?;
            }
        }
        close_checked(f).map_err(|e| ("the close".to_string(), e))
    })();
    let (stage, err) = match outcome {
        Ok(()) => anyhow::bail!("writing 64 MiB through a 16 MiB cache succeeded"),
        Err(e) => e,
    };
    eprintln!(
        "the copy failed at {stage} after {:?} with {err} (errno {:?})",
        started.elapsed(),
        err.raw_os_error()
    );
    anyhow::ensure!(
        err.raw_os_error() == Some(libc::ENOSPC),
        "the copy must fail with ENOSPC, not {err}"
    );
    let status = m.command_within(Duration::from_secs(10), "status", &[])?;
    eprintln!("status after the failed copy:\n{status}");

    // Give a (wrong) upload of the failed edit every chance to land: past the write-back
    // delay, then a drain.
    std::thread::sleep(Duration::from_secs(3));
    let drained = m.wait_uploaded(Duration::from_secs(60));
    eprintln!("drain after the failed copy: {drained:?}");
    let now = emu.get("failcopy", "big")?;
    anyhow::ensure!(
        sha256(&now) == old_sha,
        "the failed copy replaced big: the bucket holds {} bytes (sha256 {}){}",
        now.len(),
        &sha256(&now)[..16],
        if now[..] == new[..now.len().min(new.len())] {
            ", the start of the failed copy"
        } else {
            ""
        }
    );
    eprintln!("mount log warnings:\n{}", warnings(&m));
    drop(dog);
    // The mount may refuse a clean exit while the failed edit stays unsaved; what counts is
    // the bucket.
    if let Err(e) = m.unmount() {
        eprintln!("unmount: {e}");
    }

    let m = Mount::with_cache(
        &emu,
        "failcopy",
        cache.path(),
        &["--write-back-delay", "0s"],
    )?;
    let _dog = Watchdog::arm(&[&m], LIMIT);
    let drained = m.wait_uploaded(Duration::from_secs(60));
    eprintln!("drain after the remount: {drained:?}");
    std::thread::sleep(Duration::from_secs(2));
    let now = emu.get("failcopy", "big")?;
    anyhow::ensure!(
        sha256(&now) == old_sha,
        "after a remount the failed copy replaced big: {} bytes (sha256 {})",
        now.len(),
        &sha256(&now)[..16]
    );
    let keys = emu.keys("failcopy")?;
    anyhow::ensure!(keys == ["big"], "the bucket holds {keys:?}");
    if let Err(e) = m.unmount() {
        eprintln!("unmount after the remount: {e}");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// I9: every acknowledged version of every mount survives.

/// Two machines overwrite one existing file, each from the generation it opened, before
/// either upload lands: the object plus exactly one conflict copy, each machine's version in
/// one of them.
#[test]
fn two_machines_saving_one_file_keep_both() -> Result<()> {
    let emu = setup("bothsave")?;
    let base = random_bytes(10_000, 40);
    emu.put("bothsave", "shared.txt", &base)?;
    let m1 = Mount::new(&emu, "bothsave", &WAITS)?;
    let m2 = Mount::new(&emu, "bothsave", &WAITS)?;
    let _dog = Watchdog::arm(&[&m1, &m2], LIMIT);
    let one = random_bytes(30_000, 41);
    let two = random_bytes(31_000, 42);
    write_and_close(&m1.path().join("shared.txt"), &one)?;
    write_and_close(&m2.path().join("shared.txt"), &two)?;
    // Both drain at once.
    let t = std::thread::spawn(move || m1.unmount());
    m2.unmount()?;
    t.join()
        .map_err(|_| anyhow::anyhow!("unmount thread panicked"))??;

    let known: [(&str, &[u8]); 3] = [
        ("the base", &base),
        ("machine 1", &one),
        ("machine 2", &two),
    ];
    let got = versions_of(&emu, "bothsave", "shared.txt")?;
    let contents: BTreeSet<&[u8]> = got.iter().map(|(_, d)| d.as_slice()).collect();
    anyhow::ensure!(
        got.len() == 2
            && got[0].0 == "shared.txt"
            && contents == BTreeSet::from([&one[..], &two[..]]),
        "want the object and one conflict copy with both versions; the bucket holds {}",
        describe(&got, &known)
    );
    Ok(())
}

/// An existing log; each machine opens it with `O_APPEND` and writes its own line, before
/// either upload lands. Both lines survive: the object or a conflict copy holds each.
#[test]
fn appends_on_two_machines_both_survive() -> Result<()> {
    let emu = setup("appends")?;
    let base = b"started\n".to_vec();
    emu.put("appends", "log", &base)?;
    let m1 = Mount::new(&emu, "appends", &WAITS)?;
    let m2 = Mount::new(&emu, "appends", &WAITS)?;
    let _dog = Watchdog::arm(&[&m1, &m2], LIMIT);
    for (m, line) in [(&m1, &b"machine 1\n"[..]), (&m2, b"machine 2\n")] {
        let mut f = OpenOptions::new().append(true).open(m.path().join("log"))?;
        f.write_all(line)?;
        close_checked(f)?;
    }
    m1.unmount()?;
    m2.unmount()?;
    let one = [&base[..], b"machine 1\n"].concat();
    let two = [&base[..], b"machine 2\n"].concat();
    let known: [(&str, &[u8]); 3] = [
        ("the base", &base),
        ("machine 1", &one),
        ("machine 2", &two),
    ];
    let got = versions_of(&emu, "appends", "log")?;
    let has = |v: &[u8]| got.iter().any(|(_, d)| d == v);
    anyhow::ensure!(
        has(&one) && has(&two),
        "each machine's appended line must survive; the bucket holds {}",
        describe(&got, &known)
    );
    anyhow::ensure!(
        got.len() == 2,
        "the object and one conflict copy: {}",
        describe(&got, &known)
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// I12: exclusive creates.

/// Creates `name` with `O_CREAT|O_EXCL` and writes `data` into it.
fn create_new(dir: &Path, name: &str, data: &[u8]) -> std::io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dir.join(name))?;
    f.write_all(data)?;
    close_checked(f)
}

/// Case 5, default mode: `O_CREAT|O_EXCL` of one new name on two mounts 0.3 s apart both
/// succeed (a mount cannot know of the other's unsent file); after both drain, the object and
/// one conflict copy hold the two versions.
#[test]
fn create_new_on_two_mounts_keeps_both_versions() -> Result<()> {
    let emu = setup("locks")?;
    let m1 = Mount::new(&emu, "locks", &WAITS)?;
    let m2 = Mount::new(&emu, "locks", &WAITS)?;
    let _dog = Watchdog::arm(&[&m1, &m2], LIMIT);
    let one = b"locked by machine 1\n";
    let two = b"locked by machine 2\n";
    create_new(m1.path(), "job.lock", one)?;
    std::thread::sleep(Duration::from_millis(300));
    create_new(m2.path(), "job.lock", two)?;
    m1.unmount()?;
    m2.unmount()?;
    let known: [(&str, &[u8]); 2] = [("machine 1", one), ("machine 2", two)];
    let got = versions_of(&emu, "locks", "job.lock")?;
    let contents: BTreeSet<&[u8]> = got.iter().map(|(_, d)| d.as_slice()).collect();
    anyhow::ensure!(
        got.len() == 2
            && got[0].0 == "job.lock"
            && contents == BTreeSet::from([&one[..], &two[..]]),
        "want the object and one conflict copy with both versions; the bucket holds {}",
        describe(&got, &known)
    );
    Ok(())
}

/// Case 5 with `--exclusive-create`: of two `O_CREAT|O_EXCL` of one new name on two mounts,
/// 0.3 s apart, exactly one succeeds and the other gets `EEXIST`; the bucket holds the
/// winner's bytes and no conflict copy.
#[test]
fn exclusive_create_lets_one_mount_win() -> Result<()> {
    let emu = setup("exlocks")?;
    let args = ["--exclusive-create", "--write-back-delay", "0s"];
    let m1 = Mount::new(&emu, "exlocks", &args)?;
    let m2 = Mount::new(&emu, "exlocks", &args)?;
    let _dog = Watchdog::arm(&[&m1, &m2], LIMIT);
    let one = b"locked by machine 1\n";
    let two = b"locked by machine 2\n";
    let first = create_new(m1.path(), "job.lock", one);
    std::thread::sleep(Duration::from_millis(300));
    let second = create_new(m2.path(), "job.lock", two);
    eprintln!("machine 1: {first:?}; machine 2: {second:?}");
    let (winner, loser) = match (&first, &second) {
        (Ok(()), Err(e)) => (&one[..], e),
        (Err(e), Ok(())) => (&two[..], e),
        _ => {
            anyhow::bail!("exactly one create must win: machine 1 {first:?}, machine 2 {second:?}")
        }
    };
    anyhow::ensure!(
        loser.raw_os_error() == Some(libc::EEXIST),
        "the loser gets EEXIST, not {loser}"
    );
    m1.unmount()?;
    m2.unmount()?;
    let known: [(&str, &[u8]); 2] = [("machine 1", one), ("machine 2", two)];
    let got = versions_of(&emu, "exlocks", "job.lock")?;
    anyhow::ensure!(
        got.len() == 1 && got[0].0 == "job.lock" && got[0].1 == winner,
        "the winner's lock alone: the bucket holds {}",
        describe(&got, &known)
    );
    Ok(())
}

/// `mkdir` of one new name on two mounts, 0.3 s apart: exactly one wins, the other gets
/// `EEXIST`; the marker is in the bucket.
#[test]
fn mkdir_on_two_mounts_lets_one_win() -> Result<()> {
    let emu = setup("mkdirs")?;
    let m1 = Mount::new(&emu, "mkdirs", &[])?;
    let m2 = Mount::new(&emu, "mkdirs", &[])?;
    let _dog = Watchdog::arm(&[&m1, &m2], LIMIT);
    let first = std::fs::create_dir(m1.path().join("lockdir"));
    std::thread::sleep(Duration::from_millis(300));
    let second = std::fs::create_dir(m2.path().join("lockdir"));
    eprintln!("machine 1: {first:?}; machine 2: {second:?}");
    let loser = match (&first, &second) {
        (Ok(()), Err(e)) | (Err(e), Ok(())) => e,
        _ => anyhow::bail!("exactly one mkdir must win: machine 1 {first:?}, machine 2 {second:?}"),
    };
    anyhow::ensure!(
        loser.raw_os_error() == Some(libc::EEXIST),
        "the loser gets EEXIST, not {loser}"
    );
    let keys = emu.keys("mkdirs")?;
    anyhow::ensure!(keys == ["lockdir/"], "the bucket holds {keys:?}");
    m1.unmount()?;
    m2.unmount()
}

/// `mkdir` of one new name on two mounts at the same moment (the strongest form of the lock
/// that `mkdir` is used as): exactly one wins, the other gets `EEXIST`.
#[test]
fn mkdir_at_the_same_moment_on_two_mounts_lets_one_win() -> Result<()> {
    let emu = setup("mkdirrace")?;
    let m1 = Mount::new(&emu, "mkdirrace", &[])?;
    let m2 = Mount::new(&emu, "mkdirrace", &[])?;
    let _dog = Watchdog::arm(&[&m1, &m2], LIMIT);
    let mut tally = Vec::new();
    for round in 0..5 {
        let name = format!("lockdir{round}");
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let racers: Vec<_> = [m1.path().join(&name), m2.path().join(&name)]
            .into_iter()
            .map(|p| {
                let b = Arc::clone(&barrier);
                std::thread::spawn(move || {
                    b.wait();
                    std::fs::create_dir(p)
                })
            })
            .collect();
        let mut results = Vec::new();
        for r in racers {
            results.push(
                r.join()
                    .map_err(|_| anyhow::anyhow!("mkdir thread panicked"))?,
            );
        }
        let wins = results.iter().filter(|r| r.is_ok()).count();
        let eexist = results
            .iter()
            .filter(|r| matches!(r, Err(e) if e.raw_os_error() == Some(libc::EEXIST)))
            .count();
        tally.push(format!("round {round}: {results:?}"));
        anyhow::ensure!(
            wins == 1 && eexist == 1,
            "exactly one mkdir must win, the other get EEXIST: {}",
            tally.join("; ")
        );
    }
    eprintln!("{}", tally.join("\n"));
    m1.unmount()?;
    m2.unmount()
}

// ---------------------------------------------------------------------------------------------
// Offline listing.

/// Case 6: a folder listed through the mount, then the link is cut; 20 new files are copied
/// into it and each reads back; listing the folder must still work, showing the old names
/// and the new ones. Once the link is back, the 20 files land byte for byte.
#[test]
fn offline_folder_lists_old_and_new_files() -> Result<()> {
    let emu = setup("offline")?;
    let old_names = ["a.txt", "b.txt", "c.txt"];
    for (i, n) in old_names.iter().enumerate() {
        emu.put(
            "offline",
            &format!("folder/{n}"),
            &random_bytes(1000 + i, 60 + i as u64),
        )?;
    }
    let proxy = Proxy::start(&emu, &["--rate", "1G", "--latency", "0ms"])?;
    let cache = tempfile::Builder::new().prefix("bd-cache").tempdir()?;
    let m = Mount::with_endpoint(
        &proxy.url(),
        "offline",
        cache.path(),
        &["--write-back-delay", "0s", "--upload-retry-max", "2s"],
    )?;
    let _dog = Watchdog::arm(&[&m], LIMIT);
    let folder = m.path().join("folder");
    anyhow::ensure!(
        names_in(&folder)? == old_names,
        "test setup: the folder lists"
    );

    proxy.down()?;
    let started = Instant::now();
    let mut want = Vec::new();
    for i in 0..20u64 {
        let name = format!("new{i:02}.bin");
        let data = random_bytes(20_000 + i as usize * 100, 600 + i);
        write_and_close(&folder.join(&name), &data)
            .map_err(|e| anyhow::anyhow!("offline copy of {name} failed: {e}"))?;
        want.push((name, data));
    }
    eprintln!("20 files copied offline in {:?}", started.elapsed());
    for (name, data) in &want {
        anyhow::ensure!(
            std::fs::read(folder.join(name))? == *data,
            "{name} reads back offline"
        );
    }
    let started = Instant::now();
    let listed = names_in(&folder);
    eprintln!(
        "offline listing after {:?}: {:?}",
        started.elapsed(),
        listed.as_ref().map(Vec::len)
    );
    let listed = listed.map_err(|e| {
        anyhow::anyhow!(
            "listing the folder offline failed after {:?}: {e} (errno {:?})",
            started.elapsed(),
            e.raw_os_error()
        )
    })?;
    let mut expected: Vec<String> = old_names.iter().map(|n| n.to_string()).collect();
    expected.extend(want.iter().map(|(n, _)| n.clone()));
    expected.sort();
    anyhow::ensure!(
        listed == expected,
        "offline listing: {listed:?}, want {expected:?}"
    );
    let status = m.command("status", &[])?;
    anyhow::ensure!(
        status.contains("offline:"),
        "status says the mount is offline: {status}"
    );
    anyhow::ensure!(
        m.log_text().contains("the mount is offline"),
        "the log says the mount is offline:\n{}",
        m.log_tail(20)
    );

    proxy.up()?;
    m.wait_uploaded(DRAIN)?;
    for (name, data) in &want {
        let key = format!("folder/{name}");
        anyhow::ensure!(
            emu.get_opt("offline", &key)?.as_deref() == Some(&data[..]),
            "{key} landed byte for byte"
        );
    }
    let status = m.command("status", &[])?;
    anyhow::ensure!(
        !status.contains("offline"),
        "back online once the uploads landed: {status}"
    );
    anyhow::ensure!(
        m.log_text().contains("back online"),
        "the log says the mount is back online:\n{}",
        m.log_tail(20)
    );
    m.unmount()
}

// ---------------------------------------------------------------------------------------------
// Other tools' changes show after the TTL.

/// The mtime `stat` shows, in nanoseconds since the epoch.
fn mtime_ns(p: &Path) -> Result<i128> {
    let md = std::fs::metadata(p)?;
    Ok(i128::from(md.mtime()) * 1_000_000_000 + i128::from(md.mtime_nsec()))
}

/// The object's `updated` time, in whole seconds since the epoch, from the emulator.
fn updated_secs(emu: &Emulator, bucket: &str, key: &str) -> Result<i64> {
    let meta: serde_json::Value = serde_json::from_str(&emu.metadata(bucket, key)?)?;
    let text = meta
        .get("updated")
        .and_then(|v| v.as_str())
        .ok_or_else(|| anyhow::anyhow!("no updated time in {meta}"))?;
    let t = humantime::parse_rfc3339_weak(text.trim_end_matches('Z'))?;
    Ok(t.duration_since(UNIX_EPOCH)?.as_secs() as i64)
}

/// Another tool replaces an object with one of the same size, twice: once with a plain upload
/// (no mtime metadata: the mtime is the object's update time) and once as gsutil and rclone
/// do, with `goog-reserved-file-mtime`. After the stat TTL a fresh open reads the new bytes and
/// `stat` shows the new mtime (which `rsync -a` compares, with the size, to skip a file).
fn same_size_replacement(bucket: &str, extra: &[&str]) -> Result<()> {
    let emu = setup(bucket)?;
    let v1 = random_bytes(MIB, 71);
    let v2 = random_bytes(MIB, 72);
    let v3 = random_bytes(MIB, 73);
    emu.put_with_metadata(
        bucket,
        "f",
        &v1,
        &[("goog-reserved-file-mtime", "1600000000")],
    )?;
    let mut args = vec!["--stat-ttl", "1s"];
    args.extend_from_slice(extra);
    let m = Mount::new(&emu, bucket, &args)?;
    let _dog = Watchdog::arm(&[&m], LIMIT);
    let path = m.path().join("f");
    anyhow::ensure!(std::fs::read(&path)? == v1, "the first version reads");
    // Twice, so the kernel's pages (and the read cache) hold it.
    anyhow::ensure!(std::fs::read(&path)? == v1, "the first version reads again");
    let t1 = mtime_ns(&path)?;
    anyhow::ensure!(
        t1 == 1_600_000_000 * 1_000_000_000,
        "the first mtime is the metadata's: {t1}"
    );

    // A plain upload: the mtime is the update time. What is wrong is collected, so one run
    // shows both replacements.
    let mut wrong = Vec::new();
    emu.put(bucket, "f", &v2)?;
    let updated = updated_secs(&emu, bucket, "f")?;
    std::thread::sleep(Duration::from_millis(2500));
    let t2 = mtime_ns(&path)?;
    anyhow::ensure!(std::fs::metadata(&path)?.len() == MIB as u64, "same size");
    let read2 = std::fs::read(&path)?;
    eprintln!(
        "after a plain same-size replacement: mtime {t2} ns (was {t1}; object updated at \
         {updated} s), reads {}",
        which(&read2, &[("the new", &v2), ("the OLD", &v1)])
    );
    if read2 != v2 {
        wrong.push("the plain replacement does not read new".to_string());
    }
    if (t2 / 1_000_000_000 - i128::from(updated)).abs() > 1 {
        wrong.push(format!(
            "stat shows mtime {t2} ns after the plain replacement, not its update time \
             ({updated} s)"
        ));
    }

    // As gsutil rsync and rclone upload: the mtime in metadata.
    emu.put_with_metadata(
        bucket,
        "f",
        &v3,
        &[("goog-reserved-file-mtime", "1700000000")],
    )?;
    std::thread::sleep(Duration::from_millis(2500));
    let t3 = mtime_ns(&path)?;
    let read3 = std::fs::read(&path)?;
    eprintln!(
        "after a same-size replacement with mtime metadata: mtime {t3} ns, reads {}",
        which(&read3, &[("the new", &v3), ("the OLD", &v2)])
    );
    if read3 != v3 {
        wrong.push("the replacement with metadata does not read new".to_string());
    }
    if t3 != 1_700_000_000 * 1_000_000_000 {
        wrong.push(format!(
            "stat shows mtime {t3} ns after the replacement with metadata, not 1700000000 s"
        ));
    }
    anyhow::ensure!(wrong.is_empty(), "after the stat TTL: {}", wrong.join("; "));
    m.unmount()
}

/// Which of the named `versions` `got` is.
fn which<'a>(got: &[u8], versions: &[(&'a str, &[u8])]) -> &'a str {
    versions
        .iter()
        .find(|(_, v)| *v == got)
        .map_or("neither version", |(name, _)| *name)
}

#[test]
fn same_size_replacement_is_read_new_after_the_ttl() -> Result<()> {
    same_size_replacement("samesize", &[])
}

#[test]
fn same_size_replacement_is_read_new_after_the_ttl_with_the_read_cache() -> Result<()> {
    let rc = tempfile::Builder::new().prefix("bd-rcache").tempdir()?;
    let dir = rc.path().to_string_lossy().into_owned();
    same_size_replacement("samesizerc", &["--read-cache-dir", &dir])
}

/// The kernel is told what is left of the mount's stat TTL, so another tool's change shows
/// within `--stat-ttl` even when the kernel asks late. The kernel forgets the name (its
/// dentries are dropped, as memory pressure does) halfway through the TTL and asks again: the
/// mount answers from its cache, and a fresh TTL there would let the kernel show the old
/// object for up to twice `--stat-ttl`.
#[test]
fn a_change_shows_within_the_stat_ttl_when_the_kernel_asks_late() -> Result<()> {
    const TTL: Duration = Duration::from_secs(4);
    let bucket = "latettl";
    let emu = setup(bucket)?;
    let m = Mount::new(&emu, bucket, &["--stat-ttl", "4s"])?;
    let _dog = Watchdog::arm(&[&m], LIMIT);
    // A slow moment can make one try unable to tell (the old TTL would have ended anyway):
    // up to three tries, each on a name of its own.
    for attempt in 1..=3 {
        let name = format!("f{attempt}");
        let path = m.path().join(&name);
        emu.put(bucket, &name, b"old")?;
        let t0 = Instant::now();
        anyhow::ensure!(
            std::fs::metadata(&path)?.len() == 3,
            "the first version shows"
        );
        emu.put(bucket, &name, b"replaced")?;
        std::thread::sleep(TTL / 2);
        std::fs::write("/proc/sys/vm/drop_caches", "2")?;
        let dropped = Instant::now();
        let cached = std::fs::metadata(&path)?.len();
        std::thread::sleep(
            (t0 + TTL + Duration::from_millis(600)).saturating_duration_since(Instant::now()),
        );
        let checked = Instant::now();
        let len = std::fs::metadata(&path)?.len();
        eprintln!(
            "try {attempt}: asked again at {:?}, showed {cached} bytes; at {:?}: {len} bytes",
            dropped - t0,
            checked - t0
        );
        if cached != 3 || checked >= dropped + TTL {
            // The mount's own cache had expired, or a fresh TTL would have ended by now too.
            continue;
        }
        anyhow::ensure!(
            len == 8,
            "{:?} after the mount first saw it, the replaced object still shows ({len} bytes): \
             the kernel was given a fresh TTL for a cached answer",
            checked - t0
        );
        return m.unmount();
    }
    anyhow::bail!("three tries could not tell (the machine was too slow); rerun")
}

// ---------------------------------------------------------------------------------------------
// Readers see writers, on one mount.

/// Drops the kernel's cached pages of `f`, so the next reads go back to the daemon.
fn drop_pages(f: &std::fs::File) -> Result<()> {
    // SAFETY: posix_fadvise on a descriptor we own.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    anyhow::ensure!(rc == 0, "posix_fadvise: errno {rc}");
    Ok(())
}

/// Reads `f` from its start to its end in 1 MiB pieces and compares with `want`; names the
/// first piece that differs.
fn read_all_through(f: &std::fs::File, want: &[u8]) -> Result<()> {
    let mut buf = vec![0u8; MIB];
    let mut off = 0usize;
    loop {
        let n = f.read_at(&mut buf, off as u64).map_err(|e| {
            anyhow::anyhow!("read at {off} failed: {e} (errno {:?})", e.raw_os_error())
        })?;
        if n == 0 {
            break;
        }
        let end = off + n;
        if end > want.len() || buf[..n] != want[off..end] {
            let first = (0..n)
                .find(|&i| want.get(off + i) != Some(&buf[i]))
                .map_or(end, |i| off + i);
            let zeros = buf[first - off..n].iter().all(|&b| b == 0);
            anyhow::bail!(
                "a read of {n} bytes at {off} differs from the appended file ({} bytes) from \
                 byte {first} on{}",
                want.len(),
                if zeros { ", where it is all zeros" } else { "" }
            );
        }
        off = end;
    }
    anyhow::ensure!(
        off == want.len(),
        "the first descriptor read {off} bytes of {}",
        want.len()
    );
    Ok(())
}

/// A reader opens an existing object of `size` bytes and reads its start; a writer on the
/// same mount appends 1 MiB and closes; with `land`, the upload of the appended file lands
/// first; with `drop`, the kernel's cached pages of the file are dropped, so the reads reach
/// the daemon. The reader's first descriptor must read the whole appended file.
fn reader_sees_append(bucket: &str, size: usize, land: bool, drop: bool) -> Result<()> {
    let emu = setup(bucket)?;
    let old = pattern(size, 81);
    let extra = pattern(MIB, 82);
    emu.put(bucket, "grow", &old)?;
    let delay = if land { LANDS } else { WAITS };
    let m = Mount::new(&emu, bucket, &delay)?;
    let _dog = Watchdog::arm(&[&m], LIMIT);
    let path = m.path().join("grow");

    let reader = std::fs::File::open(&path)?;
    let mut head = vec![0u8; 64 * 1024];
    reader.read_exact_at(&mut head, 0)?;
    anyhow::ensure!(head[..] == old[..head.len()], "the start reads");

    let mut w = OpenOptions::new().append(true).open(&path)?;
    w.write_all(&extra)?;
    close_checked(w)?;
    let mut want = old;
    want.extend_from_slice(&extra);
    if land {
        m.wait_uploaded(DRAIN)?;
        wait_for_object(&emu, bucket, "grow", &sha256(&want), 60)?;
    } else {
        anyhow::ensure!(
            emu.get(bucket, "grow")?.len() == size,
            "test setup: the upload waits"
        );
    }
    if drop {
        drop_pages(&reader)?;
    }
    let started = Instant::now();
    if let Err(e) = read_all_through(&reader, &want) {
        eprintln!("the mount's log:\n{}", m.log_tail(80));
        return Err(e);
    }
    eprintln!(
        "{} bytes read through the first descriptor in {:?}",
        want.len(),
        started.elapsed()
    );
    // A fresh descriptor agrees.
    let mut fresh = Vec::new();
    std::fs::File::open(&path)?.read_to_end(&mut fresh)?;
    anyhow::ensure!(fresh == want, "a fresh open reads the appended file");
    std::mem::drop(reader);
    m.unmount()
}

#[test]
fn reader_opened_before_an_append_reads_it() -> Result<()> {
    reader_sees_append("appread", 3 * MIB + 123, false, false)
}

#[test]
fn reader_opened_before_an_append_reads_it_past_the_page_cache() -> Result<()> {
    reader_sees_append("appreaddrop", 3 * MIB + 123, false, true)
}

#[test]
fn reader_opened_before_an_append_reads_it_after_the_upload_lands() -> Result<()> {
    reader_sees_append("appreadup", 3 * MIB + 123, true, false)
}

#[test]
fn reader_opened_before_an_append_reads_a_big_file() -> Result<()> {
    let _heavy = heavy();
    reader_sees_append("appreadbig", 256 * MIB, false, true)
}

#[test]
fn reader_opened_before_an_append_reads_a_big_file_after_the_upload_lands() -> Result<()> {
    let _heavy = heavy();
    reader_sees_append("appreadbigup", 256 * MIB, true, true)
}

/// Another tool wrote keys Linux cannot show as names (`d//x`: an empty component; `d/../y`):
/// the directory lists as empty, `rmdir` rightly fails with `ENOTEMPTY` (removing its marker
/// would not remove it, and the objects are someone's), and the log says why and names the
/// keys. A directory that also holds a name it can show just fails, with no such warning.
#[test]
fn a_directory_of_names_linux_cannot_show_says_why_it_is_not_empty() -> Result<()> {
    let bucket = "hiddennames";
    let emu = setup(bucket)?;
    emu.put(bucket, "d/", b"")?;
    emu.put(bucket, "d//x", b"hidden one")?;
    emu.put(bucket, "d/../y", b"hidden two")?;
    emu.put(bucket, "e//x", b"hidden three")?;
    emu.put(bucket, "e/shown", b"shown")?;
    let m = Mount::new(&emu, bucket, &[])?;
    let _dog = Watchdog::arm(&[&m], LIMIT);
    let d = m.path().join("d");
    let names: Vec<_> = std::fs::read_dir(&d)?.collect::<std::io::Result<_>>()?;
    anyhow::ensure!(names.is_empty(), "d lists as empty: {names:?}");
    let err = std::fs::remove_dir(&d).expect_err("rmdir of d must fail");
    anyhow::ensure!(
        err.raw_os_error() == Some(libc::ENOTEMPTY),
        "rmdir d: {err} (want ENOTEMPTY)"
    );
    // The log is written in the background: give it a moment.
    let deadline = Instant::now() + Duration::from_secs(5);
    let hint = loop {
        let log = m.log_text();
        if let Some(l) = log
            .lines()
            .find(|l| l.contains("cannot show") && l.contains("d//x"))
        {
            break l.to_string();
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no hint naming d//x in the log:\n{}",
            m.log_tail(20)
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    anyhow::ensure!(
        hint.contains("d/../y"),
        "the hint names every hidden key: {hint}"
    );
    let err = std::fs::remove_dir(m.path().join("e")).expect_err("rmdir of e must fail");
    anyhow::ensure!(
        err.raw_os_error() == Some(libc::ENOTEMPTY),
        "rmdir e: {err}"
    );
    std::thread::sleep(Duration::from_millis(500));
    anyhow::ensure!(
        !m.log_text()
            .lines()
            .any(|l| l.contains("cannot show") && l.contains("dir=e")),
        "a directory with a name it can show gets no hint"
    );
    let objects = emu.objects(bucket)?;
    for key in ["d/", "d//x", "d/../y", "e//x", "e/shown"] {
        anyhow::ensure!(objects.contains_key(key), "{key} is still in the bucket");
    }
    m.unmount()
}
