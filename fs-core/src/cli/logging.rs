//! Where the mount's log goes, and in what form.
//!
//! - Attached to a terminal or a service manager (`--foreground`, Windows): standard error,
//!   coloured only when it is a terminal (and `NO_COLOR` is unset), so a journal or a pipe
//!   never receives escape codes.
//! - Detached: `--log-file` if given; else the system log through `/dev/log` when that socket
//!   exists; else `<cache-dir>/bucketdrive.log`. A detached process's standard error is
//!   /dev/null, so it must never be the destination there. That default is chosen, and its
//!   file opened, by [`detached`] before the process detaches: when it cannot be opened (the
//!   cache directory cannot be made: no writable home, or a read-only mount with nowhere to put
//!   one), the reason is printed on the terminal and the mount runs without a log, as it did
//!   before there was a default file; a log is never worth refusing a mount for. A
//!   `--log-file` that cannot be opened is still an error: it was asked for.
//!
//! Log files are created 0600 and never hold colour codes: a log can name files and buckets
//! the rest of the machine should not see, and a file is read with tools that do not interpret
//! escape codes. `--log-format json` writes one JSON object per line instead of text.
//!
//! What is never logged: credentials (tokens, keys) and resumable-upload session URLs, which
//! are bearer credentials for one upload. The store strips URLs from its errors
//! ([`crate::store::gcs`]); [`SECRET_CEILINGS`] caps the few dependency targets that can print
//! request bytes or signed URLs, even when `RUST_LOG` asks for more.

use std::path::{Path, PathBuf};

use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

use super::options::CommonArgs;
use crate::write::cache_dir::CacheRoot;

/// The file a detached mount logs to when there is neither `--log-file` nor a system log,
/// inside its cache directory.
pub const DEFAULT_LOG_FILE: &str = "bucketdrive.log";

/// The system log's local socket.
#[cfg(unix)]
pub const SYSLOG_SOCKET: &str = "/dev/log";

/// Targets that can print secrets at their most verbose levels, and the most they may log.
/// `reqwest::connect` dumps raw request bytes (the `Authorization` header) at trace when a
/// client is built verbose; `gcloud_storage` prints what it signs for signed URLs at trace.
/// Applied on top of `RUST_LOG`, so no environment setting lifts them (they only cap: they
/// never enable anything the level does not).
pub const SECRET_CEILINGS: &[(&str, tracing::Level)] = &[
    ("reqwest::connect", tracing::Level::DEBUG),
    ("gcloud_storage::sign", tracing::Level::DEBUG),
    ("gcloud_storage::client", tracing::Level::DEBUG),
];

/// `--log-format` values.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// One line of text per event.
    #[default]
    Text,
    /// One JSON object per line (timestamp, level, fields, spans).
    Json,
}

/// How the process runs, which decides the default destination.
#[derive(Debug)]
pub enum Destination {
    /// In the foreground: `--log-file`, else standard error.
    Attached,
    /// Detached from its terminal: `--log-file`, else what [`detached`] chose.
    Detached(DetachedLog),
}

/// Where a detached mount logs without `--log-file`, chosen before it detaches.
#[derive(Debug)]
pub enum DetachedLog {
    /// The system log, through this socket.
    Syslog(PathBuf),
    /// `<cache root>/bucketdrive.log`, already open.
    File(PathBuf, std::sync::Mutex<std::fs::File>),
    /// Nowhere: `--log-file` is given (it is opened by [`init`]), or the default file could
    /// not be opened (the reason was printed before detaching).
    Nothing,
}

/// The destination of a mount about to detach, and a warning to print on the terminal while
/// it still has one. Opens the default log file in `cache`'s root now, creating the root if
/// needed (it is inherited across the fork), so a failure is seen by the user instead of
/// being lost on a detached process's /dev/null; it is not an error (see the module
/// documentation).
pub fn detached(common: &CommonArgs, cache: &CacheRoot) -> (Destination, Option<String>) {
    #[cfg(unix)]
    let syslog = Path::new(SYSLOG_SOCKET);
    #[cfg(not(unix))]
    let syslog = Path::new("");
    detached_with(common, cache, syslog)
}

/// [`detached`] with `syslog` as the system log's socket path.
fn detached_with(
    common: &CommonArgs,
    cache: &CacheRoot,
    syslog: &Path,
) -> (Destination, Option<String>) {
    if common.log_file.is_some() {
        return (Destination::Detached(DetachedLog::Nothing), None);
    }
    if cfg!(unix) && is_socket(syslog) {
        return (
            Destination::Detached(DetachedLog::Syslog(syslog.to_path_buf())),
            None,
        );
    }
    let path = cache.path.join(DEFAULT_LOG_FILE);
    match cache.ensure().and_then(|()| open_log_file(&path)) {
        Ok(file) => (Destination::Detached(DetachedLog::File(path, file)), None),
        Err(why) => (
            Destination::Detached(DetachedLog::Nothing),
            Some(format!(
                "cannot log to {} ({why}); the mount runs without a log (--log-file PATH \
                 names one)",
                path.display()
            )),
        ),
    }
}

/// Sets up the process's logging from `--log-level`, `--log-file` and `--log-format`
/// (`RUST_LOG` overrides the level). `quiet_targets` are crates whose logs are kept to errors
/// unless `RUST_LOG` says otherwise. Returns a one-line message on failure.
pub fn init(
    common: &CommonArgs,
    quiet_targets: &[&str],
    destination: Destination,
) -> Result<(), String> {
    let (layer, _) = build(common, quiet_targets, destination)?;
    tracing_subscriber::registry()
        .with(layer)
        .try_init()
        .map_err(|e| format!("cannot set up logging: {e}"))
}

/// Logging for a command that runs attached and ends (`perfdiag`): text on standard error at
/// `level` (`RUST_LOG` overrides it), under the same secret ceilings as a mount's log.
pub fn init_stderr(level: &str) -> Result<(), String> {
    use std::io::IsTerminal;
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let layer = tracing_subscriber::fmt::layer()
        .with_target(false)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .with_filter(filter(level, &[])?);
    tracing_subscriber::registry()
        .with(layer)
        .try_init()
        .map_err(|e| format!("cannot set up logging: {e}"))
}

/// Where a subscriber built by [`build`] writes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Sink {
    Stderr { ansi: bool },
    File(PathBuf),
    Syslog(PathBuf),
    Nowhere,
}

type BoxedLayer = Box<dyn Layer<Registry> + Send + Sync>;

/// The filter and formatting layer for `common`, writing to the destination chosen from
/// `destination`: `--log-file` first, else the destination's own default.
fn build(
    common: &CommonArgs,
    quiet_targets: &[&str],
    destination: Destination,
) -> Result<(BoxedLayer, Sink), String> {
    use tracing_subscriber::filter::LevelFilter;
    let filter = filter(&common.log_level, quiet_targets)?;
    let (writer, sink) = match (common.log_file.as_deref(), destination) {
        (Some(path), _) => (
            BoxMakeWriter::new(OneLine(open_log_file(path)?)),
            Sink::File(path.to_path_buf()),
        ),
        (None, Destination::Attached) => {
            use std::io::IsTerminal;
            let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            (
                BoxMakeWriter::new(OneLine(std::io::stderr)),
                Sink::Stderr { ansi },
            )
        }
        (None, Destination::Detached(DetachedLog::File(path, file))) => {
            (BoxMakeWriter::new(OneLine(file)), Sink::File(path))
        }
        (None, Destination::Detached(DetachedLog::Syslog(path))) => (
            BoxMakeWriter::new(OneLine(SyslogSink::connect(&path)?)),
            Sink::Syslog(path),
        ),
        (None, Destination::Detached(DetachedLog::Nothing)) => {
            // Nothing is formatted for nowhere.
            let layer = tracing_subscriber::fmt::layer()
                .with_writer(std::io::sink)
                .with_filter(LevelFilter::OFF)
                .boxed();
            return Ok((layer, Sink::Nowhere));
        }
    };
    let ansi = matches!(sink, Sink::Stderr { ansi: true });
    // Syslog stamps every message itself.
    let with_time = !matches!(sink, Sink::Syslog(_));
    let layer: BoxedLayer = match (common.log_format, with_time) {
        (LogFormat::Text, true) => tracing_subscriber::fmt::layer()
            .with_target(false)
            .with_ansi(ansi)
            .with_writer(writer)
            .with_filter(filter)
            .boxed(),
        (LogFormat::Text, false) => tracing_subscriber::fmt::layer()
            .with_target(false)
            .with_ansi(false)
            .without_time()
            .with_writer(writer)
            .with_filter(filter)
            .boxed(),
        (LogFormat::Json, _) => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(writer)
            .with_filter(filter)
            .boxed(),
    };
    Ok((layer, sink))
}

/// `RUST_LOG` if set, else `level` with `quiet_targets` kept to errors; and, whichever it is,
/// the secret ceilings.
fn filter(
    level: &str,
    quiet_targets: &[&str],
) -> Result<impl tracing_subscriber::layer::Filter<Registry>, String> {
    use tracing_subscriber::filter::{FilterExt, LevelFilter, Targets};
    let mut directives = level.to_string();
    for t in quiet_targets {
        directives.push_str(&format!(",{t}=error"));
    }
    let wanted = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&directives))
        .map_err(|e| format!("invalid --log-level {level:?}: {e}"))?;
    let ceilings = SECRET_CEILINGS.iter().fold(
        Targets::new().with_default(LevelFilter::TRACE),
        |t, (target, max)| t.with_target(*target, *max),
    );
    Ok(wanted.and(ceilings))
}

fn is_socket(path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        std::fs::metadata(path).is_ok_and(|m| m.file_type().is_socket())
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        false
    }
}

/// Opens `path` for appending, readable only by its owner.
///
/// The mount often runs as root, so the path must not lead it anywhere else: a symbolic link
/// (not followed), a device or FIFO, a file with other hard links (one planted as a link to
/// `/etc/shadow` in a directory the attacker can write), or someone else's file are refused,
/// all checked on the opened descriptor. A file of ours an earlier version created 0644 is
/// narrowed to 0600 through the descriptor too.
fn open_log_file(path: &Path) -> Result<std::sync::Mutex<std::fs::File>, String> {
    let fail = |e: std::io::Error| format!("cannot open log file {}: {e}", path.display());
    let mut options = std::fs::OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // Not blocking on a FIFO: it is refused below.
        options.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    let file = crate::platform::private_file(&mut options)
        .open(path)
        .map_err(|e| {
            if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
                format!(
                    "log file {} is a symbolic link, which is not followed: give the file itself",
                    path.display()
                )
            } else {
                fail(e)
            }
        })?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let meta = file.metadata().map_err(fail)?;
        let refuse = |why: &str| format!("refusing log file {}: {why}", path.display());
        if !meta.file_type().is_file() {
            return Err(refuse("not a regular file"));
        }
        if meta.nlink() != 1 {
            return Err(refuse("it has other hard links"));
        }
        // SAFETY: geteuid cannot fail.
        let euid = unsafe { libc::geteuid() };
        if meta.uid() != euid {
            return Err(refuse(&format!(
                "it belongs to uid {}, not to this user ({euid})",
                meta.uid()
            )));
        }
        if meta.mode() & 0o077 != 0 {
            file.set_permissions(std::fs::Permissions::from_mode(0o600))
                .map_err(fail)?;
        }
    }
    Ok(std::sync::Mutex::new(file))
}

/// Every event as one line: a control character inside it (a newline or carriage return in
/// an object name, say, which another bucket writer chose) is written escaped, so no logged
/// value can forge a line of its own. Tabs stay, and so do escape codes, which the formatter
/// already escapes in values and adds itself only for a colour terminal.
struct OneLine<M>(M);

impl<'a, M: tracing_subscriber::fmt::MakeWriter<'a>> tracing_subscriber::fmt::MakeWriter<'a>
    for OneLine<M>
{
    type Writer = OneLineWriter<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        OneLineWriter(self.0.make_writer())
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Self::Writer {
        OneLineWriter(self.0.make_writer_for(meta))
    }
}

/// The writer of [`OneLine`]: the formatter hands it one whole event per write.
struct OneLineWriter<W>(W);

fn needs_escape(b: u8) -> bool {
    (b < 0x20 && b != b'\t' && b != 0x1b) || b == 0x7f
}

impl<W: std::io::Write> std::io::Write for OneLineWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let body = buf.strip_suffix(b"\n").unwrap_or(buf);
        if !body.iter().copied().any(needs_escape) {
            self.0.write_all(buf)?;
            return Ok(buf.len());
        }
        let mut out = Vec::with_capacity(buf.len() + 16);
        for &b in body {
            match b {
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                b if needs_escape(b) => out.extend_from_slice(format!("\\x{b:02x}").as_bytes()),
                b => out.push(b),
            }
        }
        if body.len() < buf.len() {
            out.push(b'\n');
        }
        self.0.write_all(&out)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// The system log as a `MakeWriter`: each event becomes one datagram, with the syslog
/// severity of its level (facility daemon). If the syslog daemon restarts, the socket is
/// reconnected once per failed message; a message that still cannot be sent is dropped, as
/// logging must never stop the mount.
#[cfg(unix)]
struct SyslogSink {
    path: PathBuf,
    logger: std::sync::Mutex<Option<SyslogLogger>>,
}

#[cfg(unix)]
type SyslogLogger = syslog::Logger<syslog::LoggerBackend, syslog::Formatter3164>;

/// Longest message sent: syslog daemons cut or drop longer datagrams.
#[cfg(unix)]
const SYSLOG_MAX_MESSAGE: usize = 8 * 1024;

#[cfg(unix)]
impl SyslogSink {
    fn connect(path: &Path) -> Result<Self, String> {
        let logger = Self::open(path)
            .map_err(|e| format!("cannot connect to syslog at {}: {e}", path.display()))?;
        Ok(SyslogSink {
            path: path.to_path_buf(),
            logger: std::sync::Mutex::new(Some(logger)),
        })
    }

    fn open(path: &Path) -> Result<SyslogLogger, syslog::Error> {
        let formatter = syslog::Formatter3164 {
            facility: syslog::Facility::LOG_DAEMON,
            hostname: None,
            process: "bucketdrive".into(),
            pid: std::process::id(),
        };
        syslog::unix_custom(formatter, path)
    }

    fn send(&self, level: tracing::Level, message: &str) {
        let mut guard = match self.logger.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        for _ in 0..2 {
            if guard.is_none() {
                *guard = Self::open(&self.path).ok();
            }
            let Some(logger) = guard.as_mut() else {
                return;
            };
            let sent = match level {
                tracing::Level::ERROR => logger.err(message),
                tracing::Level::WARN => logger.warning(message),
                tracing::Level::INFO => logger.info(message),
                _ => logger.debug(message),
            };
            if sent.is_ok() {
                return;
            }
            *guard = None;
        }
    }
}

/// One event's bytes, sent to syslog when the formatter is done with it.
#[cfg(unix)]
struct SyslogEvent<'a> {
    sink: &'a SyslogSink,
    level: tracing::Level,
    buf: Vec<u8>,
}

#[cfg(unix)]
impl std::io::Write for SyslogEvent<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(unix)]
impl Drop for SyslogEvent<'_> {
    fn drop(&mut self) {
        let text = String::from_utf8_lossy(&self.buf);
        let mut text = text.trim_end();
        if text.is_empty() {
            return;
        }
        if text.len() > SYSLOG_MAX_MESSAGE {
            let mut end = SYSLOG_MAX_MESSAGE;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text = &text[..end];
        }
        self.sink.send(self.level, text);
    }
}

#[cfg(unix)]
impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for SyslogSink {
    type Writer = SyslogEvent<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        SyslogEvent {
            sink: self,
            level: tracing::Level::INFO,
            buf: Vec::new(),
        }
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Self::Writer {
        SyslogEvent {
            sink: self,
            level: *meta.level(),
            buf: Vec::new(),
        }
    }
}

/// Windows has no `/dev/log`; [`choose`] never picks syslog there.
#[cfg(not(unix))]
struct SyslogSink;

#[cfg(not(unix))]
impl SyslogSink {
    fn connect(path: &Path) -> Result<fn() -> std::io::Sink, String> {
        Err(format!("no syslog at {} on this platform", path.display()))
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use clap::Parser;
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::net::UnixDatagram;
    use std::time::Duration;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        common: CommonArgs,
    }

    fn common(args: &[&str]) -> CommonArgs {
        let mut all = vec!["test"];
        all.extend_from_slice(args);
        Cli::parse_from(all).common
    }

    fn root(dir: &Path) -> CacheRoot {
        CacheRoot::at(dir.to_path_buf())
    }

    /// What a detached mount of `c` with its cache root in `dir` logs to, and the warning.
    fn detached_sink(c: &CommonArgs, dir: &Path, syslog: &Path) -> (Sink, Option<String>) {
        let (destination, warning) = detached_with(c, &root(dir), syslog);
        let (_, sink) = build(c, &[], destination).unwrap();
        (sink, warning)
    }

    #[test]
    fn destinations() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let no_syslog = dir.path().join("no-such-socket");
        let file = dir.path().join("x.log");
        let with_file = common(&["--log-file", file.to_str().unwrap()]);
        let (_, sink) = build(&with_file, &[], Destination::Attached).unwrap();
        assert_eq!(sink, Sink::File(file.clone()));
        assert_eq!(
            detached_sink(&with_file, &cache, &no_syslog),
            (Sink::File(file.clone()), None)
        );
        assert!(
            !cache.exists(),
            "no default log made when --log-file is given"
        );
        let plain = common(&[]);
        assert_eq!(
            detached_sink(&plain, &cache, &no_syslog),
            (Sink::File(cache.join(DEFAULT_LOG_FILE)), None)
        );
        assert!(cache.join(DEFAULT_LOG_FILE).is_file());
        // A plain file where the socket should be is not a syslog.
        std::fs::write(&no_syslog, b"").unwrap();
        assert_eq!(
            detached_sink(&plain, &cache, &no_syslog).0,
            Sink::File(cache.join(DEFAULT_LOG_FILE))
        );
        let socket = dir.path().join("log.sock");
        let _server = UnixDatagram::bind(&socket).unwrap();
        assert_eq!(
            detached_sink(&plain, &cache, &socket),
            (Sink::Syslog(socket.clone()), None)
        );
        let (_, sink) = build(&plain, &[], Destination::Attached).unwrap();
        assert!(matches!(sink, Sink::Stderr { .. }));
    }

    #[test]
    fn a_default_log_that_cannot_be_opened_is_no_log() {
        let dir = tempfile::tempdir().unwrap();
        let no_syslog = dir.path().join("no-such-socket");
        // A cache root that cannot be made: its parent is a file.
        let file = dir.path().join("file");
        std::fs::write(&file, b"").unwrap();
        let c = common(&[]);
        let (sink, warning) = detached_sink(&c, &file.join("cache"), &no_syslog);
        assert_eq!(sink, Sink::Nowhere);
        let warning = warning.unwrap();
        assert!(warning.contains("without a log"), "{warning}");
        assert!(warning.contains(DEFAULT_LOG_FILE), "{warning}");
        assert!(warning.contains("Not a directory"), "{warning}");
        // An earlier layout in place is the root as it is: its log goes there, nothing made.
        let old = dir.path().join("old");
        std::fs::create_dir(&old).unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o750)).unwrap();
        let legacy = CacheRoot {
            legacy: true,
            ..CacheRoot::at(old.clone())
        };
        let (destination, warning) = detached_with(&c, &legacy, &no_syslog);
        assert!(warning.is_none());
        assert_eq!(
            build(&c, &[], destination).unwrap().1,
            Sink::File(old.join(DEFAULT_LOG_FILE))
        );
        assert_eq!(
            std::fs::metadata(&old).unwrap().permissions().mode() & 0o7777,
            0o750
        );
        // An explicit --log-file that cannot be opened is an error, attached or not.
        let bad = file.join("x.log");
        let explicit = common(&["--log-file", bad.to_str().unwrap()]);
        let (destination, warning) = detached_with(&explicit, &root(dir.path()), &no_syslog);
        assert!(warning.is_none());
        let err = build(&explicit, &[], destination).err().unwrap();
        assert!(err.contains("cannot open log file"), "{err}");
        let err = build(&explicit, &[], Destination::Attached).err().unwrap();
        assert!(err.contains("cannot open log file"), "{err}");
    }

    #[test]
    fn log_files_are_private_plain_text() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.log");
        std::fs::write(&path, b"from an earlier version\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let c = common(&["--log-file", path.to_str().unwrap(), "--log-level", "debug"]);
        let (layer, sink) = build(&c, &[], Destination::Attached).unwrap();
        assert_eq!(sink, Sink::File(path.clone()));
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::debug_span!("gcs", op = "list", key = "a/b");
            let _e = span.enter();
            tracing::info!(bucket = "bkt", "mounted \x1b[31mred");
        });
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("from an earlier version\n"), "{text}");
        assert!(text.contains("mounted"), "{text}");
        assert!(text.contains("op=\"list\""), "{text}");
        assert!(!text.contains('\x1b'), "escape codes in {text:?}");
    }

    /// A value another bucket writer chose (an object name with a newline) cannot forge a
    /// log line: the event stays one line, the newline written escaped.
    #[test]
    fn a_logged_name_cannot_forge_a_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("forge.log");
        let c = common(&["--log-file", path.to_str().unwrap()]);
        let (layer, _) = build(&c, &[], Destination::Attached).unwrap();
        let key = "x\n2026-01-01T00:00:00Z ERROR forged\r\x07";
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
            tracing::warn!(key = %key, "hidden {key}");
        });
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 1, "{text:?}");
        assert!(
            text.contains("x\\n2026-01-01T00:00:00Z ERROR forged\\r\\x07"),
            "{text:?}"
        );
    }

    #[test]
    fn a_log_file_that_is_a_link_or_not_ours_alone_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("shadow");
        std::fs::write(&target, b"root:x:0:0\n").unwrap();
        let link = dir.path().join("link.log");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = open_log_file(&link).unwrap_err();
        assert!(e.contains("symbolic link"), "{e}");
        let hard = dir.path().join("hard.log");
        std::fs::hard_link(&target, &hard).unwrap();
        let e = open_log_file(&hard).unwrap_err();
        assert!(e.contains("hard links"), "{e}");
        let e = open_log_file(Path::new("/dev/null")).unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
        assert_eq!(
            std::fs::read(&target).unwrap(),
            b"root:x:0:0\n",
            "untouched"
        );
        assert!(open_log_file(&dir.path().join("fine.log")).is_ok());
    }

    #[test]
    fn json_lines_parse() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.log");
        let c = common(&["--log-file", path.to_str().unwrap(), "--log-format", "json"]);
        let (layer, _) = build(&c, &[], Destination::Attached).unwrap();
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
            let span = tracing::info_span!("gcs", op = "put");
            let _e = span.enter();
            tracing::warn!(key = "k", "upload failed");
        });
        let text = std::fs::read_to_string(&path).unwrap();
        let line = text.lines().next().unwrap();
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["level"], "WARN");
        assert_eq!(v["fields"]["message"], "upload failed");
        assert_eq!(v["span"]["op"], "put");
    }

    #[test]
    fn syslog_writer_maps_levels_to_severities() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("log.sock");
        let server = UnixDatagram::bind(&socket).unwrap();
        server
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let c = common(&["--log-level", "debug"]);
        let (destination, _) = detached_with(&c, &root(dir.path()), &socket);
        let (layer, sink) = build(&c, &[], destination).unwrap();
        assert_eq!(sink, Sink::Syslog(socket.clone()));
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
            tracing::error!("e-line");
            tracing::warn!("w-line");
            tracing::info!(n = 3, "i-line");
            tracing::debug!("d-line");
            tracing::trace!("not sent");
        });
        let mut got = Vec::new();
        let mut buf = [0u8; 65536];
        for _ in 0..4 {
            let n = server.recv(&mut buf).unwrap();
            got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        // Facility daemon (3) * 8 + severity: err 3, warning 4, info 6, debug 7.
        for (msg, (pri, word)) in got.iter().zip([
            ("<27>", "e-line"),
            ("<28>", "w-line"),
            ("<30>", "i-line"),
            ("<31>", "d-line"),
        ]) {
            assert!(msg.starts_with(pri), "{msg:?} should start with {pri}");
            assert!(msg.contains(word), "{msg:?}");
            assert!(msg.contains("bucketdrive["), "{msg:?}");
            assert!(!msg.ends_with('\n'), "{msg:?}");
            assert!(!msg.contains('\x1b'), "{msg:?}");
        }
        assert!(got[2].contains("n=3"), "{}", got[2]);
        server.set_nonblocking(true).unwrap();
        assert!(server.recv(&mut buf).is_err(), "trace was filtered out");
    }

    #[test]
    fn ceilings_cap_without_enabling() {
        let dir = tempfile::tempdir().unwrap();
        let run = |level: &str| -> String {
            let path = dir.path().join(format!("{level}.log"));
            let c = common(&["--log-file", path.to_str().unwrap(), "--log-level", level]);
            let (layer, _) = build(&c, &[], Destination::Attached).unwrap();
            tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
                tracing::trace!(target: "reqwest::connect", "raw-bytes");
                tracing::debug!(target: "reqwest::connect", "new-connection");
                tracing::trace!(target: "fs_core::x", "core-trace");
            });
            std::fs::read_to_string(&path).unwrap_or_default()
        };
        let trace = run("trace");
        assert!(!trace.contains("raw-bytes"), "{trace}");
        assert!(trace.contains("new-connection"), "{trace}");
        assert!(trace.contains("core-trace"), "{trace}");
        let info = run("info");
        assert!(
            !info.contains("new-connection"),
            "a ceiling enables nothing: {info}"
        );
    }
}
