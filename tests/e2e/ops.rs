//! End-to-end operation of a mount as a system service would run it: where its log goes and
//! in what form, what the log must never hold (credentials, resumable session URLs), and the
//! cache directory's rules (our own private sub-directory in a named directory, an earlier
//! version's layout used in place at every start or refused when unsafe, a user's directory
//! not taken for one, I11: one bucket and prefix per cache directory), and a detached mount
//! that cannot make its default log running without.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bucketdrive_tests::{
    bucketdrive_bin, close_checked, is_mounted, random_bytes, sha256, wait_for_object,
    write_and_close, Emulator, Mount, Proxy, Result,
};

const MIB: usize = 1024 * 1024;

/// Our sub-directory in a named `--cache-dir` (fs-core's `cache_dir::SUBDIR`).
const SUBDIR: &str = "bucketdrive-cache";

fn setup(bucket: &str) -> Result<Emulator> {
    let emu = Emulator::start()?;
    emu.create_bucket(bucket)?;
    Ok(emu)
}

fn mode(p: &Path) -> Result<u32> {
    Ok(std::fs::metadata(p)?.permissions().mode() & 0o7777)
}

#[test]
fn the_log_file_is_private_plain_text() -> Result<()> {
    let emu = setup("logfile")?;
    // Debug logs every request inside its span, so span fields are in the file too.
    let m = Mount::new(&emu, "logfile", &["--log-level", "debug"])?;
    write_and_close(&m.path().join("a"), b"hello")?;
    m.wait_uploaded(Duration::from_secs(30))?;
    let log = std::fs::read_to_string(m.log_path())?;
    assert_eq!(mode(m.log_path())?, 0o600, "the log file is private");
    assert!(
        log.contains("mounted"),
        "a known line is in the log:\n{log}"
    );
    assert!(
        log.contains("op=\"put\""),
        "span fields are in the log:\n{log}"
    );
    assert!(!log.contains("\x1b["), "no colour codes in a file:\n{log}");
    m.unmount()
}

#[test]
fn json_log_lines_parse() -> Result<()> {
    let emu = setup("logjson")?;
    let m = Mount::new(
        &emu,
        "logjson",
        &["--log-format", "json", "--log-level", "debug"],
    )?;
    write_and_close(&m.path().join("a"), b"hello")?;
    m.wait_uploaded(Duration::from_secs(30))?;
    let log = std::fs::read_to_string(m.log_path())?;
    let mut messages = Vec::new();
    for line in log.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| anyhow::anyhow!("not JSON ({e}): {line:?}"))?;
        assert!(
            v["timestamp"].is_string() && v["level"].is_string(),
            "{line}"
        );
        if let Some(msg) = v["fields"]["message"].as_str() {
            messages.push(msg.to_string());
        }
    }
    assert!(messages.iter().any(|m| m == "mounted"), "{messages:?}");
    m.unmount()
}

/// A mount started without `--foreground`, taken down on drop (even when the test panics):
/// `bucketdrive unmount`, then `umount -l` if that failed.
struct Detached {
    dir: tempfile::TempDir,
}

impl Detached {
    fn start(emu: &Emulator, spec: &str, cache_dir: &Path, args: &[&str]) -> Result<Self> {
        let (d, out) = Self::try_start(emu, spec, cache_dir, args)?;
        anyhow::ensure!(
            out.status.success(),
            "bucketdrive mount failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        anyhow::ensure!(
            is_mounted(d.path()),
            "not mounted after the parent returned"
        );
        Ok(d)
    }

    /// Runs `bucketdrive mount` detached and returns what the parent printed and how it
    /// exited, whether or not it mounted (the guard takes down whatever did).
    fn try_start(
        emu: &Emulator,
        spec: &str,
        cache_dir: &Path,
        args: &[&str],
    ) -> Result<(Self, std::process::Output)> {
        let dir = tempfile::Builder::new().prefix("bd-mnt").tempdir()?;
        let out = Command::new(bucketdrive_bin())
            .arg("mount")
            .arg(spec)
            .arg(dir.path())
            .args(["--anonymous", "--endpoint", &emu.url()])
            .arg("--cache-dir")
            .arg(cache_dir)
            .args(args)
            .stdin(Stdio::null())
            .output()?;
        Ok((Detached { dir }, out))
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn unmount(&self) -> Result<()> {
        let out = Command::new(bucketdrive_bin())
            .arg("unmount")
            .arg(self.path())
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "bucketdrive unmount failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }
}

impl Drop for Detached {
    fn drop(&mut self) {
        if is_mounted(self.path()) {
            let _ = self.unmount();
        }
        if is_mounted(self.path()) {
            let _ = Command::new("umount").arg("-l").arg(self.path()).status();
        }
    }
}

#[test]
fn a_detached_mount_logs_to_its_cache_dir_and_leaves_a_shared_dir_alone() -> Result<()> {
    if Path::new("/dev/log").exists() {
        // With a system log the detached mount logs there, as documented; the file is the
        // fallback this test is about. (The syslog writer itself is unit-tested in fs-core
        // against a socket of its own.)
        eprintln!("skipped: this machine has /dev/log");
        return Ok(());
    }
    let emu = setup("detached")?;
    let base = tempfile::tempdir()?;
    let shared = base.path().join("shared");
    std::fs::create_dir(&shared)?;
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777))?;
    let m = Detached::start(&emu, "detached", &shared, &["--write-back-delay", "0s"])?;
    let data = random_bytes(100_000, 3);
    write_and_close(&m.path().join("f"), &data)?;
    wait_for_object(&emu, "detached", "f", &sha256(&data), 30)?;
    m.unmount()?;

    let ours = shared.join(SUBDIR);
    assert_eq!(mode(&shared)?, 0o1777, "the named directory keeps its mode");
    assert_eq!(mode(&ours)?, 0o700, "our sub-directory is private");
    let log_path = ours.join("bucketdrive.log");
    let log = std::fs::read_to_string(&log_path)
        .map_err(|e| anyhow::anyhow!("no log at {}: {e}", log_path.display()))?;
    assert_eq!(mode(&log_path)?, 0o600);
    assert!(log.contains("mounted"), "{log}");
    assert!(log.contains("session ended"), "{log}");
    assert!(!log.contains("\x1b["), "{log}");
    Ok(())
}

#[test]
fn an_earlier_cache_layout_is_used_in_place() -> Result<()> {
    let emu = setup("legacy")?;
    let cache = tempfile::tempdir()?;
    // A file acknowledged (closed) but not uploaded when the mount dies.
    let m = Mount::with_cache(&emu, "legacy", cache.path(), &["--write-back-delay", "1h"])?;
    let data = random_bytes(200_000, 9);
    write_and_close(&m.path().join("kept"), &data)?;
    m.crash()?;
    assert!(emu.get_opt("legacy", "kept")?.is_none());

    // Make it what an earlier version left: the layout directly in the named directory.
    let ours = cache.path().join(SUBDIR);
    for entry in std::fs::read_dir(&ours)? {
        let entry = entry?;
        std::fs::rename(entry.path(), cache.path().join(entry.file_name()))?;
    }
    std::fs::remove_dir(&ours)?;
    // Earlier versions wrote no marker: the bucket of what they staged is unknown.
    std::fs::remove_file(cache.path().join("owner"))?;
    std::fs::set_permissions(cache.path(), std::fs::Permissions::from_mode(0o750))?;

    let refused = Mount::with_cache(&emu, "legacy", cache.path(), &["--write-back-delay", "0s"]);
    let err = refused.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("--adopt-staged"), "not refused: {err}");
    assert!(emu.get_opt("legacy", "kept")?.is_none());
    let m = Mount::with_cache(
        &emu,
        "legacy",
        cache.path(),
        &["--write-back-delay", "0s", "--adopt-staged"],
    )?;
    wait_for_object(&emu, "legacy", "kept", &sha256(&data), 30)?;
    let log = m.log_text();
    assert!(log.contains("layout of an earlier version"), "{log}");
    m.unmount()?;
    assert!(
        !ours.exists(),
        "no sub-directory: the earlier layout is used as it is"
    );
    assert_eq!(mode(cache.path())?, 0o750, "its mode is left as it is");
    Ok(())
}

/// Leaves in `cache` what an earlier version left behind: its layout directly in the named
/// directory, holding `key` acknowledged (closed) but not uploaded when the mount died.
/// Returns the file's content.
fn leave_earlier_layout(emu: &Emulator, bucket: &str, cache: &Path, key: &str) -> Result<Vec<u8>> {
    let m = Mount::with_cache(emu, bucket, cache, &["--write-back-delay", "1h"])?;
    let data = random_bytes(200_000, 5);
    write_and_close(&m.path().join(key), &data)?;
    m.crash()?;
    assert!(emu.get_opt(bucket, key)?.is_none());
    let ours = cache.join(SUBDIR);
    for entry in std::fs::read_dir(&ours)? {
        let entry = entry?;
        std::fs::rename(entry.path(), cache.join(entry.file_name()))?;
    }
    std::fs::remove_dir(&ours)?;
    // Earlier versions wrote no marker: the next mount adopts what they staged only with
    // --adopt-staged.
    std::fs::remove_file(cache.join("owner"))?;
    Ok(data)
}

#[test]
fn a_detached_mount_replays_an_earlier_layout_every_time() -> Result<()> {
    if Path::new("/dev/log").exists() {
        // Only without a system log does a detached mount create its cache directory for the
        // log file before the cache directory is opened, the order this test is about.
        eprintln!("skipped: this machine has /dev/log");
        return Ok(());
    }
    let emu = setup("legacydetached")?;
    let cache = tempfile::tempdir()?;
    let data = leave_earlier_layout(&emu, "legacydetached", cache.path(), "kept")?;
    // What a start that did not use the earlier layout left: our sub-directory with a log in
    // it. Whether it exists must not change which directory is used.
    let ours = cache.path().join(SUBDIR);
    std::fs::create_dir(&ours)?;
    std::fs::write(ours.join("bucketdrive.log"), b"an earlier start\n")?;

    let m = Detached::start(
        &emu,
        "legacydetached",
        cache.path(),
        &["--write-back-delay", "0s", "--adopt-staged"],
    )?;
    wait_for_object(&emu, "legacydetached", "kept", &sha256(&data), 30)?;
    m.unmount()?;
    let log_path = cache.path().join("bucketdrive.log");
    let log = std::fs::read_to_string(&log_path)
        .map_err(|e| anyhow::anyhow!("no log at {}: {e}", log_path.display()))?;
    assert!(log.contains("layout of an earlier version"), "{log}");
    assert!(
        !ours.join("journal").exists(),
        "the earlier layout is the root: nothing staged in the sub-directory"
    );

    // The same answer on the next start: a file staged now is replayed from the same place.
    let m = Detached::start(
        &emu,
        "legacydetached",
        cache.path(),
        &["--write-back-delay", "1h"],
    )?;
    let again = random_bytes(50_000, 6);
    write_and_close(&m.path().join("later"), &again)?;
    // Unmounting without waiting leaves it staged, as a crash would.
    let out = Command::new(bucketdrive_bin())
        .args(["unmount", "--no-wait"])
        .arg(m.path())
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(emu.get_opt("legacydetached", "later")?.is_none());
    let m = Detached::start(
        &emu,
        "legacydetached",
        cache.path(),
        &["--write-back-delay", "0s"],
    )?;
    wait_for_object(&emu, "legacydetached", "later", &sha256(&again), 30)?;
    m.unmount()?;
    assert!(!ours.join("journal").exists());
    Ok(())
}

#[test]
fn an_earlier_layout_others_may_write_to_is_refused() -> Result<()> {
    let emu = setup("legacyunsafe")?;
    let cache = tempfile::tempdir()?;
    let data = leave_earlier_layout(&emu, "legacyunsafe", cache.path(), "kept")?;
    std::fs::set_permissions(cache.path(), std::fs::Permissions::from_mode(0o2770))?;

    // Detached, so the refusal has to reach this terminal from the daemon, whatever the log
    // set up first.
    let (m, out) = Detached::try_start(&emu, "legacyunsafe", cache.path(), &[])?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "mounted anyway: {err}");
    assert!(!is_mounted(m.path()), "nothing is mounted");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains("earlier bucketdrive version"), "{err}");
    assert!(err.contains("mode 2770"), "{err}");
    assert!(err.contains("chmod go-w"), "{err}");
    assert!(
        !cache.path().join(SUBDIR).exists(),
        "nothing was created beside the earlier files"
    );
    assert_eq!(
        mode(cache.path())?,
        0o2770,
        "the directory is left as it is"
    );

    // Doing what the message says lets the mount upload what was staged.
    std::fs::set_permissions(cache.path(), std::fs::Permissions::from_mode(0o2750))?;
    let m = Mount::with_cache(
        &emu,
        "legacyunsafe",
        cache.path(),
        &["--write-back-delay", "0s", "--adopt-staged"],
    )?;
    wait_for_object(&emu, "legacyunsafe", "kept", &sha256(&data), 30)?;
    m.unmount()
}

#[test]
fn a_named_dir_with_a_staging_dir_of_its_own_is_not_taken_for_ours() -> Result<()> {
    let emu = setup("notours")?;
    let work = tempfile::tempdir()?;
    // A user's directory that happens to have `staging/` and `journal/` directories, with a
    // file named like one of our staging files.
    let staging = work.path().join("staging");
    std::fs::create_dir(&staging)?;
    std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o755))?;
    let theirs = staging.join("0000000000000001.data");
    std::fs::write(&theirs, b"not bucketdrive's")?;
    std::fs::create_dir(work.path().join("journal"))?;
    std::fs::write(work.path().join("mount-id"), b"0123456789abcdef")?;

    let m = Mount::with_cache(&emu, "notours", work.path(), &["--write-back-delay", "0s"])?;
    let data = random_bytes(10_000, 8);
    write_and_close(&m.path().join("f"), &data)?;
    wait_for_object(&emu, "notours", "f", &sha256(&data), 30)?;
    m.unmount()?;

    let kept = std::fs::read(&theirs).map_err(|e| anyhow::anyhow!("their file is gone: {e}"))?;
    assert_eq!(kept, b"not bucketdrive's", "their file is untouched");
    assert_eq!(mode(&staging)?, 0o755, "their staging/ keeps its mode");
    assert!(!work.path().join("lock").exists(), "no lock of ours in it");
    assert!(work.path().join(SUBDIR).join("lock").exists());
    Ok(())
}

#[test]
fn a_detached_mount_runs_without_a_log_when_its_default_log_cannot_be_made() -> Result<()> {
    if Path::new("/dev/log").exists() {
        eprintln!("skipped: this machine has /dev/log");
        return Ok(());
    }
    let emu = setup("nolog")?;
    let base = tempfile::tempdir()?;
    // A cache directory that cannot be created: its parent is a file.
    let file = base.path().join("file");
    std::fs::write(&file, b"")?;
    let cache = file.join("cache");

    // A read-only mount needs no cache directory: it runs, logging nowhere, and says so first.
    let (m, out) = Detached::try_start(&emu, "nolog", &cache, &["--read-only"])?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(is_mounted(m.path()));
    assert!(err.contains("warning"), "{err}");
    assert!(err.contains("bucketdrive.log"), "{err}");
    assert!(std::fs::read_dir(m.path()).is_ok(), "the mount answers");
    m.unmount()?;

    // An explicit --log-file that cannot be opened is still an error.
    let bad = file.join("x.log");
    let (m, out) = Detached::try_start(
        &emu,
        "nolog",
        base.path(),
        &[
            "--read-only",
            "--log-file",
            bad.to_str().unwrap_or_default(),
        ],
    )?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "mounted anyway: {err}");
    assert!(!is_mounted(m.path()));
    assert!(err.contains("cannot open log file"), "{err}");
    Ok(())
}

/// Every `upload_id` value in the text (a resumable session URL's query parameter).
fn upload_ids(text: &str) -> Vec<String> {
    text.split("upload_id=")
        .skip(1)
        .map(|rest| {
            rest.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '%'))
                .collect::<String>()
        })
        .filter(|id| !id.is_empty())
        .collect()
}

#[test]
fn resumable_session_urls_stay_out_of_a_debug_log() -> Result<()> {
    let emu = setup("secrets")?;
    // 503 bursts make chunk uploads fail, so their errors (which name the request's URL) are
    // logged and retried.
    let proxy = Proxy::start(
        &emu,
        &[
            "--error-burst-rate",
            "0.3",
            "--error-burst-len",
            "2",
            "--seed",
            "11",
            "--latency",
            "1ms",
        ],
    )?;
    proxy.faults(false)?;
    let cache = tempfile::tempdir()?;
    let m = Mount::with_endpoint(
        &proxy.url(),
        "secrets",
        cache.path(),
        &[
            "--log-level",
            "debug",
            "--upload-mode",
            "resumable",
            "--single-shot-threshold",
            "1MiB",
            "--write-back-delay",
            "0s",
        ],
    )?;
    proxy.faults(true)?;
    let journal = cache.path().join(SUBDIR).join("journal");
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    // Collects the session URLs the journal records while the uploads run.
    let stop = Arc::new(AtomicUsize::new(0));
    let watcher = {
        let (seen, stop, journal) = (seen.clone(), stop.clone(), journal.clone());
        std::thread::spawn(move || {
            while stop.load(Ordering::SeqCst) == 0 {
                for entry in std::fs::read_dir(&journal).into_iter().flatten().flatten() {
                    if let Ok(text) = std::fs::read_to_string(entry.path()) {
                        let mut s = seen.lock().unwrap_or_else(|p| p.into_inner());
                        for id in upload_ids(&text) {
                            if !s.contains(&id) {
                                s.push(id);
                            }
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let mut want = Vec::new();
    for i in 0..3 {
        let data = random_bytes(20 * MIB + i * 1000, 40 + i as u64);
        let name = format!("big{i}");
        write_and_close(&m.path().join(&name), &data)?;
        want.push((name, sha256(&data)));
    }
    let waited = m.wait_uploaded(Duration::from_secs(180));
    stop.store(1, Ordering::SeqCst);
    let _ = watcher.join();
    proxy.faults(false)?;
    waited?;
    for (name, sha) in &want {
        wait_for_object(&emu, "secrets", name, sha, 30)?;
    }
    let log = m.log_text();
    let ids = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    eprintln!(
        "{} session ids seen in the journal; proxy: {}",
        ids.len(),
        proxy.stats()?
    );
    // The test must have had something to leak: chunk uploads failed and were logged with
    // their URL (whose query, the session, must be gone).
    assert!(
        log.lines()
            .any(|l| l.contains("upload_chunk") && l.contains("/upload/storage/v1/b/")),
        "no failed chunk upload was logged with its URL; the test proves nothing:\n{}",
        m.log_tail(40)
    );
    for id in &ids {
        assert!(!log.contains(id.as_str()), "session id {id} is in the log");
    }
    let leaked: Vec<String> = upload_ids(&log);
    assert!(leaked.is_empty(), "upload ids in the log: {leaked:?}");
    m.unmount()
}

/// A minimal OAuth token endpoint: answers every POST with `token` and keeps what it was sent.
struct TokenServer {
    port: u16,
    hits: Arc<AtomicUsize>,
    bodies: Arc<Mutex<Vec<String>>>,
}

impl TokenServer {
    fn start(token: &'static str) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let hits = Arc::new(AtomicUsize::new(0));
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let (h, b) = (hits.clone(), bodies.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(std::result::Result::ok) {
                let mut reader = BufReader::new(&stream);
                let mut len = 0usize;
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                    let l = line.trim().to_ascii_lowercase();
                    if l.is_empty() {
                        break;
                    }
                    if let Some(v) = l.strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                    line.clear();
                }
                let mut body = vec![0u8; len];
                if reader.read_exact(&mut body).is_err() {
                    continue;
                }
                b.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(String::from_utf8_lossy(&body).into_owned());
                h.fetch_add(1, Ordering::SeqCst);
                let json = format!(
                    r#"{{"access_token":"{token}","token_type":"Bearer","expires_in":3600}}"#
                );
                let reply = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{json}",
                    json.len()
                );
                let _ = (&stream).write_all(reply.as_bytes());
            }
        });
        Ok(TokenServer { port, hits, bodies })
    }
}

/// A fresh RSA key in PEM, from the openssl command line.
fn rsa_key_pem() -> Result<String> {
    let out = Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
        ])
        .stderr(Stdio::null())
        .output()
        .map_err(|e| anyhow::anyhow!("openssl is needed to make a key: {e}"))?;
    anyhow::ensure!(out.status.success(), "openssl genpkey failed");
    Ok(String::from_utf8(out.stdout)?)
}

#[test]
fn credentials_stay_out_of_a_trace_log() -> Result<()> {
    const TOKEN: &str = "ya29.bucketdrive-test-token-3f9c2e7a1b";
    let emu = setup("creds")?;
    let server = TokenServer::start(TOKEN)?;
    let pem = rsa_key_pem()?;
    let dir = tempfile::tempdir()?;
    let key_file: PathBuf = dir.path().join("key.json");
    let key = serde_json::json!({
        "type": "service_account",
        "project_id": "bucketdrive-test",
        "private_key_id": "0123456789abcdef0123456789abcdef01234567",
        "private_key": pem,
        "client_email": "tester@bucketdrive-test.iam.gserviceaccount.com",
        "client_id": "100000000000000000001",
        "auth_uri": format!("http://127.0.0.1:{}/auth", server.port),
        "token_uri": format!("http://127.0.0.1:{}/token", server.port),
    });
    std::fs::write(&key_file, serde_json::to_vec(&key)?)?;
    let cache = tempfile::tempdir()?;
    let m = Mount::with_key_file(
        &emu.url(),
        "creds",
        cache.path(),
        &key_file,
        &["--log-level", "trace", "--write-back-delay", "0s"],
    )?;
    let data = random_bytes(300_000, 21);
    write_and_close(&m.path().join("f"), &data)?;
    m.wait_uploaded(Duration::from_secs(30))?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.hits.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        server.hits.load(Ordering::SeqCst) > 0,
        "the token endpoint was never asked: the key file was not used"
    );
    let log = m.log_text();
    assert!(log.len() > 1000, "a trace log has lines:\n{log}");
    assert!(!log.contains(TOKEN), "the access token is in the log");
    assert!(
        !log.contains("PRIVATE KEY"),
        "the private key is in the log"
    );
    for line in pem.lines().filter(|l| !l.starts_with("-----")).take(5) {
        assert!(
            !log.contains(line),
            "a line of the private key is in the log"
        );
    }
    let bodies = server
        .bodies
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    for body in &bodies {
        // The signed assertion sent to the token endpoint is a credential too.
        if let Some(assertion) = body.split("assertion=").nth(1) {
            let assertion = assertion.split('&').next().unwrap_or_default();
            assert!(!assertion.is_empty());
            assert!(
                !log.contains(assertion),
                "the signed assertion is in the log"
            );
        }
    }
    m.unmount()
}

/// I11: what a mount of one bucket staged in a `--cache-dir` is never uploaded to another
/// bucket mounted with the same `--cache-dir`, and both buckets keep their own pending files
/// there, each uploaded by the next mount of its own bucket.
#[test]
fn a_named_cache_dir_keeps_each_buckets_pending_files_apart() -> Result<()> {
    let emu = setup("owner-a")?;
    emu.create_bucket("owner-b")?;
    let cache = tempfile::tempdir()?;
    let a_data = random_bytes(150_000, 21);
    let m = Mount::with_cache(&emu, "owner-a", cache.path(), &["--write-back-delay", "1h"])?;
    write_and_close(&m.path().join("from-a"), &a_data)?;
    m.crash()?;
    assert!(emu.get_opt("owner-a", "from-a")?.is_none());

    // Bucket B, the same cache directory: A's file must not land in B. B stages a file of its
    // own and dies too.
    let b_data = random_bytes(120_000, 22);
    let m = Mount::with_cache(&emu, "owner-b", cache.path(), &["--write-back-delay", "0s"])?;
    m.wait_uploaded(Duration::from_secs(60))?;
    assert!(
        emu.get_opt("owner-b", "from-a")?.is_none(),
        "A's file was uploaded into bucket B"
    );
    m.crash()?;
    let m = Mount::with_cache(&emu, "owner-b", cache.path(), &["--write-back-delay", "1h"])?;
    write_and_close(&m.path().join("from-b"), &b_data)?;
    m.crash()?;

    // A again: its own file, byte for byte, and not B's.
    let m = Mount::with_cache(&emu, "owner-a", cache.path(), &["--write-back-delay", "0s"])?;
    wait_for_object(&emu, "owner-a", "from-a", &sha256(&a_data), 30)?;
    m.wait_uploaded(Duration::from_secs(60))?;
    assert_eq!(emu.get("owner-a", "from-a")?, a_data);
    assert!(
        emu.get_opt("owner-a", "from-b")?.is_none(),
        "B's file went to A"
    );
    m.unmount()?;
    // B again: its own.
    let m = Mount::with_cache(&emu, "owner-b", cache.path(), &["--write-back-delay", "0s"])?;
    wait_for_object(&emu, "owner-b", "from-b", &sha256(&b_data), 30)?;
    m.unmount()?;
    assert_eq!(emu.keys("owner-a")?, vec!["from-a".to_string()]);
    assert_eq!(emu.keys("owner-b")?, vec!["from-b".to_string()]);
    Ok(())
}

/// I11: the default cache directory does not depend on the mountpoint, so a file staged by a
/// mount that died is uploaded by the next mount of the bucket wherever it is mounted.
#[test]
fn the_default_cache_dir_is_replayed_at_another_mountpoint() -> Result<()> {
    let emu = setup("moved")?;
    let home = tempfile::tempdir()?;
    let data = random_bytes(180_000, 23);
    let m = Mount::with_default_cache(&emu, "moved", home.path(), &["--write-back-delay", "1h"])?;
    let first = m.path().to_path_buf();
    write_and_close(&m.path().join("kept"), &data)?;
    m.crash()?;
    assert!(emu.get_opt("moved", "kept")?.is_none());

    let m = Mount::with_default_cache(&emu, "moved", home.path(), &["--write-back-delay", "0s"])?;
    assert_ne!(m.path(), first, "mounted somewhere else");
    wait_for_object(&emu, "moved", "kept", &sha256(&data), 30)?;
    assert_eq!(emu.get("moved", "kept")?, data);
    m.unmount()
}

/// Runs `bucketdrive mount SPEC DIR ARGS…` detached with `env` set (and the emulator variable
/// removed unless `env` sets it), its cache directory under `cache`; returns the guard and
/// what the parent printed.
fn mount_with_env(
    cache: &Path,
    spec: &str,
    env: &[(&str, &str)],
    args: &[&str],
) -> Result<(Detached, std::process::Output)> {
    let dir = tempfile::Builder::new().prefix("bd-mnt").tempdir()?;
    let mut cmd = Command::new(bucketdrive_bin());
    cmd.arg("mount")
        .arg(spec)
        .arg(dir.path())
        .arg("--cache-dir")
        .arg(cache)
        .args(args)
        .env_remove("STORAGE_EMULATOR_HOST")
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output()?;
    Ok((Detached { dir }, out))
}

/// A plain-HTTP listener that counts every connection made to it.
fn counting_listener() -> Result<(u16, Arc<AtomicUsize>)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(std::result::Result::ok) {
            h.fetch_add(1, Ordering::SeqCst);
            drop(stream);
        }
    });
    Ok((port, hits))
}

/// A service-account key file whose token endpoint is `server`, with `mode`.
fn key_file_for(dir: &Path, server: &TokenServer, mode: u32) -> Result<PathBuf> {
    let key_file = dir.join("key.json");
    let key = serde_json::json!({
        "type": "service_account",
        "project_id": "bucketdrive-test",
        "private_key_id": "0123456789abcdef0123456789abcdef01234567",
        "private_key": rsa_key_pem()?,
        "client_email": "tester@bucketdrive-test.iam.gserviceaccount.com",
        "client_id": "100000000000000000001",
        "auth_uri": format!("http://127.0.0.1:{}/auth", server.port),
        "token_uri": format!("http://127.0.0.1:{}/token", server.port),
    });
    std::fs::write(&key_file, serde_json::to_vec(&key)?)?;
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(mode))?;
    Ok(key_file)
}

/// A bearer token never goes to a plain-HTTP host that is not this machine, and the emulator
/// variable never takes a real key's tokens anywhere: `STORAGE_EMULATOR_HOST` with
/// `--key-file` is refused (it used to send `Authorization: Bearer …` to the host it named), an
/// `http://` endpoint elsewhere with credentials is refused, and an endpoint without a scheme
/// is refused. Nothing reaches the named host, and no token is even minted.
#[test]
fn credentials_never_go_to_a_plain_http_host_elsewhere() -> Result<()> {
    const TOKEN: &str = "ya29.bucketdrive-test-token-plain-http";
    let server = TokenServer::start(TOKEN)?;
    let dir = tempfile::tempdir()?;
    let key = key_file_for(dir.path(), &server, 0o600)?;
    let key = key.to_string_lossy().into_owned();
    let (port, plain) = counting_listener()?;
    let host = format!("127.0.0.1:{port}");
    /// What is tried, the environment, the flags, and what the refusal must say.
    type Case<'a> = (
        &'a str,
        Vec<(&'a str, &'a str)>,
        Vec<&'a str>,
        &'a [&'a str],
    );
    let cases: [Case; 3] = [
        (
            "the emulator variable with a key file",
            vec![("STORAGE_EMULATOR_HOST", host.as_str())],
            vec!["--key-file", &key],
            &["STORAGE_EMULATOR_HOST", "--key-file"],
        ),
        (
            "a key file and a plain-HTTP endpoint elsewhere",
            vec![],
            vec!["--key-file", &key, "--endpoint", "http://192.0.2.1:9"],
            &["clear text", "--insecure-endpoint"],
        ),
        (
            "an endpoint without a scheme",
            vec![],
            vec!["--key-file", &key, "--endpoint", &host],
            &["needs a scheme"],
        ),
    ];
    for (what, env, args, says) in cases {
        let (m, out) = mount_with_env(&dir.path().join("cache"), "creds", &env, &args)?;
        let err = String::from_utf8_lossy(&out.stderr);
        anyhow::ensure!(!out.status.success(), "{what}: the mount started: {err}");
        anyhow::ensure!(!is_mounted(m.path()), "{what}: mounted");
        for s in says {
            anyhow::ensure!(
                err.contains(s),
                "{what}: the error does not say {s:?}: {err}"
            );
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        plain.load(Ordering::SeqCst),
        0,
        "the plain-HTTP host was contacted"
    );
    assert_eq!(server.hits.load(Ordering::SeqCst), 0, "a token was minted");
    Ok(())
}

/// What may go ahead says so on the terminal before the mount detaches: the emulator variable
/// choosing the endpoint (anonymously), and a key file other users can read.
#[test]
fn the_terminal_is_told_when_the_environment_picks_the_endpoint_or_a_key_is_readable() -> Result<()>
{
    let emu = setup("envnote")?;
    let host = emu.url().trim_start_matches("http://").to_string();
    let dir = tempfile::tempdir()?;
    let cache = dir.path().join("cache");
    let (m, out) = mount_with_env(&cache, "envnote", &[("STORAGE_EMULATOR_HOST", &host)], &[])?;
    let err = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(out.status.success(), "the mount failed: {err}");
    anyhow::ensure!(
        err.contains("STORAGE_EMULATOR_HOST") && err.contains("anonymously"),
        "the terminal is not told the environment chose the endpoint: {err}"
    );
    let data = random_bytes(10_000, 5);
    write_and_close(&m.path().join("f"), &data)?;
    m.unmount()?;
    anyhow::ensure!(
        emu.get("envnote", "f")? == data,
        "the file reached the emulator"
    );

    let server = TokenServer::start("ya29.bucketdrive-test-token-readable")?;
    let key = key_file_for(dir.path(), &server, 0o644)?;
    let key = key.to_string_lossy().into_owned();
    let url = emu.url();
    let args = ["--key-file", &key, "--endpoint", &url];
    let (m, out) = mount_with_env(&cache, "envnote", &[], &args)?;
    let err = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(
        out.status.success(),
        "the mount with a readable key failed: {err}"
    );
    anyhow::ensure!(
        err.contains("can be read by other users"),
        "no warning about the readable key file: {err}"
    );
    m.unmount()
}

/// Bucket writers decide content, not local permissions (`--posix-metadata`): an object whose
/// metadata says setuid root (`104755`, uid and gid 0) shows as an ordinary file of the
/// mount's owner, so root's `cp -a` of it makes no setuid file on the local disk; a new file
/// keeps the mode it was created with (0600 stays private on a shared mount); and only the
/// opt-ins show the metadata's special bits and owner.
#[test]
fn a_setuid_object_makes_no_setuid_file_here() -> Result<()> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let bucket = "suid";
    let emu = setup(bucket)?;
    let hostile = [
        ("goog-reserved-posix-mode", "104755"),
        ("goog-reserved-posix-uid", "0"),
        ("goog-reserved-posix-gid", "0"),
    ];
    emu.put_with_metadata(bucket, "tool", b"#!/bin/sh\necho hi\n", &hostile)?;
    let cache = tempfile::tempdir()?;
    let ids = ["--uid", "1000", "--gid", "1000", "--allow-other"];
    let mut args = vec!["--posix-metadata", "--write-back-delay", "0s"];
    args.extend(ids);
    let m = Mount::with_cache(&emu, bucket, cache.path(), &args)?;
    let tool = m.path().join("tool");
    let md = std::fs::metadata(&tool)?;
    assert_eq!(
        (md.mode() & 0o7777, md.uid(), md.gid()),
        (0o755, 1000, 1000),
        "the object's setuid bit and root owner are not shown"
    );
    let local = tempfile::tempdir()?;
    let copied = local.path().join("tool");
    let status = Command::new("cp")
        .arg("-a")
        .arg(&tool)
        .arg(&copied)
        .status()?;
    assert!(status.success(), "cp -a");
    let cmd = std::fs::metadata(&copied)?;
    assert_eq!(
        cmd.mode() & 0o7000,
        0,
        "cp -a made a setuid file: {:o}",
        cmd.mode()
    );
    assert_ne!(cmd.uid(), 0, "cp -a made a root-owned file");

    let private = m.path().join("private");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&private)?;
    f.write_all(b"secret")?;
    close_checked(f)?;
    assert_eq!(
        std::fs::metadata(&private)?.mode() & 0o777,
        0o600,
        "as created"
    );
    m.wait_uploaded(Duration::from_secs(30))?;
    let meta: serde_json::Value = serde_json::from_str(&emu.metadata(bucket, "private")?)?;
    assert_eq!(
        meta["metadata"]["goog-reserved-posix-mode"], "600",
        "the object keeps the mode: {meta}"
    );
    m.unmount()?;

    // The opt-ins show what the metadata says.
    let mut args = vec![
        "--posix-metadata",
        "--posix-special-modes",
        "--posix-uids",
        "0",
        "--posix-gids",
        "0",
    ];
    args.extend(ids);
    let m = Mount::with_cache(&emu, bucket, cache.path(), &args)?;
    let md = std::fs::metadata(m.path().join("tool"))?;
    assert_eq!((md.mode() & 0o7777, md.uid(), md.gid()), (0o4755, 0, 0));
    m.unmount()
}

/// A cache directory under a directory other users can write to (not sticky) is refused at
/// mount, in one line on the terminal: another user could swap what the mount opens there
/// (plant journal records, or link a staging file to a file of root's). Sticky, it is used.
#[test]
fn a_cache_dir_others_could_swap_is_refused() -> Result<()> {
    let emu = setup("swapdir")?;
    let base = tempfile::tempdir()?;
    let open = base.path().join("open");
    std::fs::create_dir(&open)?;
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777))?;
    let cache = open.join("cache");
    let (m, out) = Detached::try_start(&emu, "swapdir", &cache, &[])?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "mounted anyway: {err}");
    assert!(!is_mounted(m.path()));
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains("not sticky") && err.contains("open"), "{err}");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777))?;
    let m = Detached::start(&emu, "swapdir", &cache, &[])?;
    m.unmount()
}

/// The cache directory is held open, not looked up again by path: a directory swapped in
/// for it after the mount started (here by root, the one user the ancestry check cannot keep
/// out) is never read or written. The planted staging file has the same length and CRC32C as
/// the user's (CRC32C is no MAC: four chosen bytes give any CRC), so only where the upload
/// opens the file decides what reaches the bucket.
#[test]
fn a_cache_dir_swapped_after_the_mount_started_is_not_used() -> Result<()> {
    let emu = setup("heldcache")?;
    let base = tempfile::tempdir()?;
    let cache = base.path().join("cache");
    let m = Mount::with_cache(&emu, "heldcache", &cache, &["--write-back-delay", "4s"])?;
    let ours = random_bytes(100_000, 7);
    write_and_close(&m.path().join("a.bin"), &ours)?;
    // Before the upload starts: move our directory away and put a look-alike in its place,
    // each staging file replaced by bytes of the same length and CRC32C.
    let root = cache.join(SUBDIR);
    let moved = cache.join("moved");
    std::fs::rename(&root, &moved)?;
    std::fs::create_dir_all(root.join("staging"))?;
    std::fs::create_dir_all(root.join("journal"))?;
    let mut planted = 0;
    for entry in std::fs::read_dir(moved.join("staging"))? {
        let entry = entry?;
        let real = std::fs::read(entry.path())?;
        if real.is_empty() {
            continue;
        }
        let mut fake = vec![b'X'; real.len() - 4];
        fake.extend(forge_crc32c(&fake, crc32c::crc32c(&real)));
        assert_eq!(crc32c::crc32c(&fake), crc32c::crc32c(&real));
        std::fs::write(root.join("staging").join(entry.file_name()), &fake)?;
        planted += 1;
    }
    assert_eq!(planted, 1, "one staged file");
    let before: Vec<_> = std::fs::read_dir(root.join("staging"))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<std::io::Result<_>>()?;
    // A file written after the swap goes to the held directory too.
    write_and_close(&m.path().join("b.bin"), b"after the swap")?;
    m.wait_uploaded(Duration::from_secs(60))?;
    assert_eq!(sha256(&emu.get("heldcache", "a.bin")?), sha256(&ours));
    assert_eq!(emu.get("heldcache", "b.bin")?, b"after the swap");
    let after: Vec<_> = std::fs::read_dir(root.join("staging"))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<std::io::Result<_>>()?;
    assert_eq!(before, after, "the swapped-in directory was written to");
    m.unmount()
}

/// Four bytes that, appended to `prefix`, give the whole the CRC32C `target`: CRC32C is
/// affine over GF(2) in its input, so the 32 unit vectors span every change of it.
fn forge_crc32c(prefix: &[u8], target: u32) -> [u8; 4] {
    let f = |x: u32| {
        let mut d = prefix.to_vec();
        d.extend(x.to_le_bytes());
        crc32c::crc32c(&d)
    };
    let zero = f(0);
    // A reduced basis: (value, the bits of x that make it), leading bits distinct, descending.
    let mut basis: Vec<(u32, u32)> = Vec::new();
    let reduce = |basis: &[(u32, u32)], mut v: u32, mut bits: u32| {
        for &(b, c) in basis {
            if v ^ b < v {
                v ^= b;
                bits ^= c;
            }
        }
        (v, bits)
    };
    for i in 0..32 {
        let (v, bits) = reduce(&basis, f(1 << i) ^ zero, 1 << i);
        if v != 0 {
            basis.push((v, bits));
            basis.sort_by_key(|b| std::cmp::Reverse(b.0));
        }
    }
    let (rest, bits) = reduce(&basis, target ^ zero, 0);
    assert_eq!(
        rest, 0,
        "CRC32C reaches every value through its last four bytes"
    );
    bits.to_le_bytes()
}

/// A name chosen by whoever writes to the bucket or the mount cannot forge a log line: a
/// file named with a newline and a fake log line after it is logged escaped, on one line.
/// (Made through the mount: the emulator cannot hold such a name for a direct writer, and
/// GCS refuses CR and LF in names, so the mount's own requests for it are what log it.)
#[test]
fn a_name_with_a_newline_cannot_forge_a_log_line() -> Result<()> {
    let emu = setup("forgelog")?;
    let m = Mount::new(&emu, "forgelog", &["--log-level", "debug"])?;
    let forged = "2026-01-01T00:00:00.000000Z ERROR bucketdrive: forged";
    let name = format!("x\n{forged}\ry");
    // Whether the bucket takes the name does not matter here, only what is logged.
    let _ = write_and_close(&m.path().join(&name), b"payload");
    let _ = std::fs::metadata(m.path().join(&name));
    let _ = m.command_within(Duration::from_secs(20), "status", &["--wait"]);
    let log = m.log_text();
    assert!(
        log.contains(&format!("x\\n{forged}\\ry")),
        "the name is logged escaped:\n{log}"
    );
    for line in log.lines() {
        assert!(!line.starts_with(forged), "a forged line: {line:?}");
        assert!(!line.contains('\r'), "a carriage return: {line:?}");
    }
    m.unmount()
}
