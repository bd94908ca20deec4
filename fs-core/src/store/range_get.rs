//! Ranged GETs received straight into the part's buffer.
//!
//! Reading a part through the HTTP client costs a copy the read does not need: the client
//! receives the body into read buffers of its own and hands it over in pieces, and each piece
//! is then copied into the part's buffer. Measured on a GiB read over loopback, that copy and
//! the client's handling of the pieces were about a tenth of the daemon's CPU per GiB
//! (`benchmarks.md`, "Ranged GETs straight into the part"). This module sends the GET itself,
//! over HTTP/1.1 on connections it keeps open, and receives the body with the part's buffer as
//! the socket read's destination: the kernel's copy out of the socket is the only one in user
//! space. Over HTTPS the same holds: rustls makes the connection, and its TLS 1.3 records are
//! opened in the part's buffer where they were received ([`super::tls_records`]).
//!
//! It is deliberately narrow. It only reads a media range of one object generation, the one
//! request the read path sends by the thousand; every other request goes through the client.
//! It takes a body only with a `Content-Length` and the range asked for (`206` and its
//! `Content-Range`, or `200` for a range that starts at 0); anything else it does not take
//! ([`Got::Unsupported`]) and the caller reads the range through the client instead. Where
//! the client would have sent the request through a proxy (an `https` endpoint with a proxy in
//! the environment), the store does not build one of these at all.
//!
//! What is kept from the client: the same URL and headers, the same token, the same trust in
//! certificates (the platform's verifier, which honours `SSL_CERT_FILE`), the same connect
//! and read timeouts. Errors are classified the way the client's are: an HTTP status by
//! [`StoreError::from_status`] with GCS's JSON message, a broken or silent connection as
//! `Transient`, an untrusted certificate as `Other` with what to do about it.

use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::client::TlsStream;

use super::tls_records::{self, Handshake, Records};
use super::{StoreError, StoreErrorKind, StoreResult};
use crate::buffer_pool::Filling;

/// How long a connection may take to open (the client's `connect_timeout`).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long any one read or write may wait (the client's `read_timeout`).
const IO_TIMEOUT: Duration = Duration::from_secs(60);
/// An idle connection older than this is closed rather than used: servers close idle
/// connections after a while, and a request sent on one the server has just closed fails.
const IDLE_LIMIT: Duration = Duration::from_secs(20);
/// Idle connections kept (the client's `pool_max_idle_per_host`).
const MAX_IDLE: usize = 64;
/// The most a response's head, or an error's body, may hold.
const MAX_HEAD: usize = 64 << 10;
/// Headers parsed at most.
const MAX_HEADERS: usize = 64;

/// What a GET made of a range.
pub enum Got {
    /// The range, exactly, in the buffer given.
    Filled(Filling),
    /// An answer this reader does not take (no `Content-Length`, say); read the range through
    /// the client instead.
    Unsupported,
}

/// A `Bearer` token for each request, from the client's token source; `None` for anonymous.
pub type TokenFn =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<String, String>> + Send>> + Send + Sync>;

/// Sends ranged media GETs for one bucket's objects, keeping its connections open between
/// them.
pub struct RangeGetter {
    /// `host:port` to connect to.
    addr: String,
    /// The `Host` header.
    host_header: String,
    /// The path up to the object's name: `{prefix}/storage/v1/b/{bucket}/o/`.
    path_prefix: String,
    tls: Option<Tls>,
    token: Option<TokenFn>,
    idle: Mutex<Vec<(Conn, Instant)>>,
    /// Answers not taken ([`Got::Unsupported`]) so far: each cost a GET the client then sends
    /// again, so an endpoint that keeps answering that way is left to the client.
    unsupported: AtomicU32,
}

/// After this many answers not taken, every range goes through the client.
const UNSUPPORTED_LIMIT: u32 = 8;

struct Tls {
    config: Arc<rustls::ClientConfig>,
    connector: tokio_rustls::TlsConnector,
    name: rustls::pki_types::ServerName<'static>,
    /// Records are carried by [`tls_records`] until a server negotiates what it does not carry
    /// (TLS 1.2), or a read fails in it ([`RangeGetter::records_failed`]); from then on, by
    /// `tokio-rustls`.
    records: AtomicBool,
}

impl RangeGetter {
    /// A reader for `bucket` at `endpoint` (`http://` or `https://`, as the store was given),
    /// or why not.
    pub fn new(endpoint: &str, bucket: &str, token: Option<TokenFn>) -> Result<Self, String> {
        Self::trusting(endpoint, bucket, token, None)
    }

    /// [`RangeGetter::new`], trusting `roots` rather than the platform's verifier if given.
    fn trusting(
        endpoint: &str,
        bucket: &str,
        token: Option<TokenFn>,
        roots: Option<rustls::RootCertStore>,
    ) -> Result<Self, String> {
        let url = reqwest::Url::parse(endpoint).map_err(|e| format!("{endpoint}: {e}"))?;
        let host = url
            .host_str()
            .ok_or_else(|| format!("{endpoint}: no host"))?
            .to_string();
        let port = url
            .port_or_known_default()
            .ok_or_else(|| format!("{endpoint}: no port"))?;
        let tls = match url.scheme() {
            "http" => None,
            "https" => Some(tls_for(&host, roots)?),
            other => return Err(format!("{endpoint}: scheme {other}")),
        };
        let host_header = match url.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.clone(),
        };
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let addr = if bare.contains(':') {
            format!("[{bare}]:{port}")
        } else {
            format!("{bare}:{port}")
        };
        let base = url.path().trim_end_matches('/');
        Ok(RangeGetter {
            addr,
            host_header,
            path_prefix: format!("{base}/storage/v1/b/{}/o/", escape(bucket)),
            tls,
            token,
            idle: Mutex::new(Vec::new()),
            unsupported: AtomicU32::new(0),
        })
    }

    /// Whether ranges are still to be read here: `false` once the endpoint has given
    /// [`UNSUPPORTED_LIMIT`] answers this reader does not take.
    pub fn in_use(&self) -> bool {
        self.unsupported.load(Ordering::Relaxed) < UNSUPPORTED_LIMIT
    }

    /// One GET of bytes `range` of generation `generation` of `key` into `buf` (which wants
    /// exactly the range's length). One attempt: the caller retries.
    pub async fn get(
        &self,
        key: &str,
        generation: i64,
        range: Range<u64>,
        buf: Filling,
    ) -> StoreResult<Got> {
        let authorization = match &self.token {
            Some(token) => Some(token().await.map_err(|e| {
                StoreError::new(StoreErrorKind::PermissionDenied, format!("token: {e}"))
            })?),
            None => None,
        };
        if authorization
            .as_deref()
            .is_some_and(|a| a.contains(['\r', '\n']))
        {
            return Err(StoreError::new(
                StoreErrorKind::PermissionDenied,
                "token: not a valid header value",
            ));
        }
        let request = self.request(key, generation, &range, authorization.as_deref());
        // A connection kept idle may have been closed by the server just now; a request on it
        // then fails before any answer. That is no failure of the request, so it is sent once
        // more on a new connection.
        if let Some(conn) = self.take_idle() {
            match self.exchange(conn, &request, &range, buf).await {
                Ok(got) => return Ok(got),
                Err(Failed::BeforeAnswer(_, buf)) => {
                    return self.fresh_exchange(&request, &range, buf).await
                }
                Err(Failed::Other(e)) => return Err(e),
            }
        }
        self.fresh_exchange(&request, &range, buf).await
    }

    async fn fresh_exchange(
        &self,
        request: &[u8],
        range: &Range<u64>,
        buf: Filling,
    ) -> StoreResult<Got> {
        let conn = self.connect().await?;
        match self.exchange(conn, request, range, buf).await {
            Ok(got) => Ok(got),
            Err(Failed::BeforeAnswer(e, _)) | Err(Failed::Other(e)) => Err(e),
        }
    }

    fn request(
        &self,
        key: &str,
        generation: i64,
        range: &Range<u64>,
        authorization: Option<&str>,
    ) -> Vec<u8> {
        let mut r = format!(
            "GET {}{}?alt=media&generation={generation} HTTP/1.1\r\nHost: {}\r\n\
             Range: bytes={}-{}\r\nUser-Agent: google-cloud-storage\r\n\
             X-Goog-Api-Client: rust\r\nAccept: */*\r\n",
            self.path_prefix,
            escape(key),
            self.host_header,
            range.start,
            range.end.saturating_sub(1),
        );
        if let Some(a) = authorization {
            r.push_str("Authorization: ");
            r.push_str(a);
            r.push_str("\r\n");
        }
        r.push_str("\r\n");
        r.into_bytes()
    }

    fn take_idle(&self) -> Option<Conn> {
        let mut idle = self.idle.lock();
        while let Some((conn, since)) = idle.pop() {
            if since.elapsed() < IDLE_LIMIT {
                return Some(conn);
            }
        }
        None
    }

    fn put_idle(&self, conn: Conn) {
        let mut idle = self.idle.lock();
        idle.retain(|(_, since)| since.elapsed() < IDLE_LIMIT);
        if idle.len() < MAX_IDLE {
            idle.push((conn, Instant::now()));
        }
    }

    async fn connect(&self) -> StoreResult<Conn> {
        let tcp = self.connect_tcp().await?;
        let Some(tls) = &self.tls else {
            return Ok(Conn::Plain(tcp));
        };
        if tls.records.load(Ordering::Relaxed) {
            let handshake = tls_records::connect(tcp, tls.config.clone(), tls.name.clone());
            match self.handshake(handshake).await? {
                Handshake::Records(records) => {
                    tracing::debug!("{}: TLS 1.3, records opened in place", self.addr);
                    return Ok(Conn::Records(records));
                }
                Handshake::NotOurs(what) => {
                    if tls.records.swap(false, Ordering::Relaxed) {
                        tracing::debug!(
                            "{} negotiated {what}: its TLS records go through rustls",
                            self.addr
                        );
                    }
                }
            }
            return self.connect_rustls(tls, self.connect_tcp().await?).await;
        }
        self.connect_rustls(tls, tcp).await
    }

    async fn connect_tcp(&self) -> StoreResult<TcpStream> {
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, connect_any(&self.addr))
            .await
            .map_err(|_| transient(format!("connecting to {}: timed out", self.addr)))?
            .map_err(|e| transient(format!("connecting to {}: {e}", self.addr)))?;
        // Requests are small and sent whole; waiting to coalesce them only adds latency.
        let _ = tcp.set_nodelay(true);
        Ok(tcp)
    }

    async fn connect_rustls(&self, tls: &Tls, tcp: TcpStream) -> StoreResult<Conn> {
        let stream = self
            .handshake(tls.connector.connect(tls.name.clone(), tcp))
            .await?;
        Ok(Conn::Tls(Box::new(stream)))
    }

    /// A TLS handshake, bounded by [`CONNECT_TIMEOUT`], its failure classified by
    /// [`tls_error`].
    async fn handshake<T>(&self, f: impl Future<Output = std::io::Result<T>>) -> StoreResult<T> {
        tokio::time::timeout(CONNECT_TIMEOUT, f)
            .await
            .map_err(|_| transient(format!("TLS handshake with {}: timed out", self.addr)))?
            .map_err(|e| tls_error(&self.addr, e))
    }

    /// Sends `request` on `conn` and receives its answer into `buf`.
    async fn exchange(
        &self,
        mut conn: Conn,
        request: &[u8],
        range: &Range<u64>,
        mut buf: Filling,
    ) -> Result<Got, Failed> {
        if let Err(e) = io(async {
            conn.write_all(request).await?;
            conn.flush().await
        })
        .await
        {
            let timed_out = e.kind() == std::io::ErrorKind::TimedOut;
            let e = transient(format!("sending: {e}"));
            return Err(match timed_out {
                true => Failed::Other(e),
                false => Failed::BeforeAnswer(e, buf),
            });
        }
        let mut head = Vec::with_capacity(8 << 10);
        let parsed = loop {
            let mut chunk = [0u8; 8 << 10];
            let read = io(conn.read(&mut chunk)).await;
            if let Err(e) = &read {
                self.records_failed(&conn, e);
            }
            let n = match read {
                Ok(0) if head.is_empty() => {
                    return Err(Failed::BeforeAnswer(
                        transient("connection closed before an answer".into()),
                        buf,
                    ))
                }
                Ok(0) => return Err(failed("connection closed inside an answer's head")),
                Ok(n) => n,
                // A server that is silent is not one that closed an idle connection.
                Err(e) if head.is_empty() && e.kind() != std::io::ErrorKind::TimedOut => {
                    return Err(Failed::BeforeAnswer(
                        transient(format!("receiving: {e}")),
                        buf,
                    ))
                }
                Err(e) => return Err(failed(format!("receiving: {e}"))),
            };
            head.extend_from_slice(&chunk[..n]);
            // A garbled head is what a stream out of step looks like; asking again on a new
            // connection can succeed, so it is transient, as the client's parse errors are.
            match next_head(&mut head) {
                Ok(Some(h)) => break h,
                Ok(None) if head.len() < MAX_HEAD => continue,
                Ok(None) => return Err(failed("an answer's head is too long")),
                Err(e) => return Err(failed(e)),
            }
        };
        let body_start = parsed.len;
        if !(200..300).contains(&parsed.status) {
            return Err(Failed::Other(
                self.error_answer(conn, &parsed, &head[body_start..]).await,
            ));
        }
        let want = range.end - range.start;
        let Some(length) = parsed.content_length.filter(|_| !parsed.chunked) else {
            if self.unsupported.fetch_add(1, Ordering::Relaxed) + 1 == UNSUPPORTED_LIMIT {
                tracing::warn!(
                    "the endpoint answers ranged reads without a Content-Length: reading \
                     through the HTTP client from now on"
                );
            }
            return Ok(Got::Unsupported);
        };
        let content_range_ok = match parsed.status {
            206 => parsed.content_range == Some((range.start, range.end - 1)),
            200 => range.start == 0,
            _ => false,
        };
        if !content_range_ok || length != want {
            // Not the bytes asked for; the client path would fail the same way.
            return Err(failed(format!(
                "answer {} with {length} bytes ({:?}) for bytes {}-{}",
                parsed.status,
                parsed.content_range,
                range.start,
                range.end - 1
            )));
        }
        let early = &head[body_start..];
        if !buf.push(early) {
            return Err(failed("more bytes than the range after the head"));
        }
        let mut wake = WakeAt::default();
        while buf.remaining() > 0 {
            wake.set(&conn, buf.remaining());
            let read = if wake.raised() {
                match tokio::time::timeout(MARK_PATIENCE, conn.read(buf.unfilled())).await {
                    Ok(read) => read,
                    // A read of a TCP stream dropped unfinished has taken nothing.
                    Err(_) if wake.give_up(&conn) => continue,
                    Err(_) => return Err(failed("cannot lower the receive mark")),
                }
            } else {
                io(conn.read(buf.unfilled())).await
            };
            match read {
                Ok(0) => {
                    return Err(failed(format!(
                        "short read: connection closed after {} of {want} bytes",
                        buf.len()
                    )))
                }
                Ok(n) => buf.advance(n),
                Err(e) => {
                    self.records_failed(&conn, &e);
                    return Err(failed(format!(
                        "receiving after {} of {want} bytes: {e}",
                        buf.len()
                    )));
                }
            }
        }
        if !parsed.close && conn.reusable() && wake.reset(&conn) {
            self.put_idle(conn);
        }
        Ok(Got::Filled(buf))
    }

    /// A read of a connection whose records are carried by [`tls_records`] failed in the
    /// record layer (a record that failed its check or was not understood, an alert from the
    /// server): later connections go through rustls instead, which is slower but may
    /// understand this server better. Whatever it is, it must not fail every read of the
    /// mount.
    fn records_failed(&self, conn: &Conn, e: &std::io::Error) {
        use std::io::ErrorKind::{ConnectionAborted, InvalidData};
        let (Conn::Records(_), Some(tls)) = (conn, &self.tls) else {
            return;
        };
        if matches!(e.kind(), InvalidData | ConnectionAborted)
            && tls.records.swap(false, Ordering::Relaxed)
        {
            tracing::warn!(
                "{}: TLS records failed ({e}); reading through rustls from now on",
                self.addr
            );
        }
    }

    /// The error an answer other than 2xx stands for, with GCS's message if its body has one.
    async fn error_answer(&self, mut conn: Conn, head: &Head, early: &[u8]) -> StoreError {
        let mut body = early.to_vec();
        let want = head
            .content_length
            .map_or(MAX_HEAD, |l| l.min(MAX_HEAD as u64) as usize);
        while body.len() < want && !head.chunked {
            let mut chunk = [0u8; 8 << 10];
            match io(conn.read(&mut chunk)).await {
                Ok(0) | Err(_) => break,
                Ok(n) => body.extend_from_slice(&chunk[..n]),
            }
        }
        let text = String::from_utf8_lossy(&body);
        let message = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| {
                v.pointer("/error/message")
                    .and_then(|m| m.as_str())
                    .map(str::to_string)
            })
            .unwrap_or_else(|| {
                let t = text.trim();
                let cut = t.char_indices().nth(200).map_or(t.len(), |(i, _)| i);
                format!("HTTP {}: {}", head.status, &t[..cut])
            });
        StoreError::from_status(head.status, super::gcs::scrub(&message))
    }
}

/// How many bytes a plain connection's socket holds before its reader is woken, while a body
/// is received (`SO_RCVLOWAT`): each wake-up then takes a large piece in one copy, instead of
/// each packet's worth waking the task again (`benchmarks.md`, "Ranged GETs straight into the
/// part").
const WAKE_AT: usize = 256 << 10;

/// The most body bytes TLS can hold between our reads, with room to spare. Through rustls:
/// one partial record (at most 16 KiB of plaintext and its overhead) and what one read of the
/// socket (at most a record's worth) decrypted. Through [`tls_records`]: its
/// [`tls_records::MOST_HELD`].
const TLS_HELD: usize = 64 << 10;
const _: () = assert!(tls_records::MOST_HELD <= TLS_HELD);

/// The socket's receive low-water mark, kept at most the bytes the socket is sure still to
/// bring, so the last of them still wake the reader. Over TLS that is the body's remaining
/// bytes less what rustls may hold already ([`TLS_HELD`]; each record's bytes on the wire are
/// more than its plaintext). The mark goes back to 1 before the connection waits for its next
/// answer.
#[derive(Default)]
struct WakeAt {
    /// The mark set, 0 if none was.
    set: usize,
    /// The mark was not reached in [`MARK_PATIENCE`]: left at 1 for the rest of this body.
    off: bool,
}

/// How long a read waits for the mark before the mark goes back to 1 for the rest of the
/// body. A socket that cannot queue the mark's worth (a kernel older than 4.18 does not grow
/// the receive buffer for it, and the window closes below it) would otherwise never wake its
/// reader, and the read would fail at [`IO_TIMEOUT`]; a slow link that takes longer to bring
/// the mark's worth gains nothing from it either.
const MARK_PATIENCE: Duration = Duration::from_millis(100);

impl WakeAt {
    fn set(&mut self, conn: &Conn, remaining: usize) {
        if self.off {
            return;
        }
        // Over TLS the socket is still to bring at least the body's remaining bytes less
        // what rustls holds: part of one record not yet decrypted, and records decrypted but
        // not yet read out (a read of its takes at most a record and a bit).
        let still_to_come = match conn {
            Conn::Plain(_) => remaining,
            Conn::Tls(_) | Conn::Records(_) => remaining.saturating_sub(TLS_HELD),
        };
        let want = WAKE_AT.min(still_to_come).max(1);
        if want != self.set && (self.set != 0 || want > 1) && set_rcvlowat(conn, want) {
            self.set = want;
        }
    }

    /// Whether a mark above 1 is set.
    fn raised(&self) -> bool {
        self.set > 1
    }

    /// The mark was not reached in time: back to 1 for the rest of the body; `false` if that
    /// failed.
    fn give_up(&mut self, conn: &Conn) -> bool {
        self.off = true;
        let done = set_rcvlowat(conn, 1);
        if done {
            self.set = 1;
        }
        done
    }

    /// Back to 1; `false` if that failed, and the connection is not to be used again.
    fn reset(&mut self, conn: &Conn) -> bool {
        self.set <= 1 || set_rcvlowat(conn, 1)
    }
}

/// Sets `SO_RCVLOWAT` on a connection's socket; `false` if not (not Unix, or it failed).
fn set_rcvlowat(conn: &Conn, bytes: usize) -> bool {
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        let tcp = match conn {
            Conn::Plain(tcp) => tcp,
            Conn::Tls(tls) => tls.get_ref().0,
            Conn::Records(records) => records.tcp(),
        };
        let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        // SAFETY: a valid socket descriptor owned by `tcp`, and a pointer to a c_int of the
        // size given, as SO_RCVLOWAT takes.
        let r = unsafe {
            libc::setsockopt(
                tcp.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        r == 0
    }
    #[cfg(not(unix))]
    {
        let _ = (conn, bytes);
        false
    }
}

/// How an exchange failed: before any answer arrived (on a connection kept idle, the server
/// may just have closed it; the buffer comes back for another try), or otherwise.
enum Failed {
    BeforeAnswer(StoreError, Filling),
    Other(StoreError),
}

fn failed(message: impl Into<String>) -> Failed {
    Failed::Other(transient(message.into()))
}

fn transient(message: String) -> StoreError {
    StoreError::new(StoreErrorKind::Transient, message)
}

fn other(message: impl Into<String>) -> StoreError {
    StoreError::new(StoreErrorKind::Other, message.into())
}

/// How long a connection attempt to one address runs alone before the next address is tried
/// beside it (as the HTTP client does): a host whose first address silently drops packets
/// (IPv6 without a route, say) then costs this, not the whole connect timeout.
const NEXT_ADDRESS_AFTER: Duration = Duration::from_millis(300);

/// A connection to the first of `addr`'s addresses that answers, trying each in turn, every
/// [`NEXT_ADDRESS_AFTER`] another one beside those still trying.
async fn connect_any(addr: &str) -> std::io::Result<TcpStream> {
    use futures::stream::{FuturesUnordered, StreamExt};
    let addrs: Vec<_> = tokio::net::lookup_host(addr).await?.collect();
    let mut next = addrs.into_iter();
    let mut trying = FuturesUnordered::new();
    let mut last_error = None;
    loop {
        if trying.is_empty() {
            match next.next() {
                Some(a) => trying.push(TcpStream::connect(a)),
                None => {
                    return Err(last_error.unwrap_or_else(|| {
                        std::io::Error::new(std::io::ErrorKind::NotFound, "no address")
                    }))
                }
            }
        }
        tokio::select! {
            done = trying.next() => match done {
                Some(Ok(tcp)) => return Ok(tcp),
                Some(Err(e)) => last_error = Some(e),
                None => {}
            },
            () = tokio::time::sleep(NEXT_ADDRESS_AFTER) => {
                if let Some(a) = next.next() {
                    trying.push(TcpStream::connect(a));
                }
            }
        }
    }
}

/// One read or write, bounded by [`IO_TIMEOUT`].
async fn io<T>(f: impl Future<Output = std::io::Result<T>>) -> std::io::Result<T> {
    tokio::time::timeout(IO_TIMEOUT, f)
        .await
        .unwrap_or_else(|_| Err(std::io::Error::from(std::io::ErrorKind::TimedOut)))
}

/// What a TLS handshake's failure means: an untrusted certificate will not change by asking
/// again; anything else might.
fn tls_error(addr: &str, e: std::io::Error) -> StoreError {
    match super::gcs::certificate_error(&e) {
        Some(why) => other(super::gcs::untrusted(&why, addr)),
        None => transient(format!("TLS handshake with {addr}: {e}")),
    }
}

/// A TLS connector that trusts what the HTTP client trusts: the platform's verifier (the
/// system's roots, and `SSL_CERT_FILE`), with the process's crypto provider. Tests give
/// `roots` of their own instead.
fn tls_for(host: &str, roots: Option<rustls::RootCertStore>) -> Result<Tls, String> {
    super::tls::install_crypto_provider();
    let provider = rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .ok_or("no TLS crypto provider")?;
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS config: {e}"))?;
    let mut config = match roots {
        Some(roots) => builder.with_root_certificates(roots),
        None => {
            let verifier = rustls_platform_verifier::Verifier::new(provider)
                .map_err(|e| format!("TLS verifier: {e}"))?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verifier))
        }
    }
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    // The read path carries the records of TLS 1.3 itself (`tls_records`), with the secrets
    // rustls hands over; they stay inside this process.
    config.enable_secret_extraction = true;
    let config = Arc::new(config);
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let name = rustls::pki_types::ServerName::try_from(bare.to_string())
        .map_err(|e| format!("TLS name {host}: {e}"))?;
    Ok(Tls {
        connector: tokio_rustls::TlsConnector::from(config.clone()),
        config,
        name,
        records: AtomicBool::new(true),
    })
}

/// Percent-encodes a path segment as the client does (all but letters, digits and `*-._`).
fn escape(s: &str) -> String {
    const SET: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'*')
        .remove(b'-')
        .remove(b'.')
        .remove(b'_');
    percent_encoding::utf8_percent_encode(s, SET).to_string()
}

/// What this reader needs of an answer's head.
#[derive(Debug, PartialEq)]
struct Head {
    /// Bytes of the head, up to and including its blank line.
    len: usize,
    status: u16,
    content_length: Option<u64>,
    chunked: bool,
    /// `Content-Range: bytes first-last/total`, as (first, last).
    content_range: Option<(u64, u64)>,
    /// The server will close the connection after this answer.
    close: bool,
}

impl Head {
    /// The head at the start of `bytes`, `None` if it is not complete yet.
    fn parse(bytes: &[u8]) -> Result<Option<Head>, String> {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut r = httparse::Response::new(&mut headers);
        let len = match r.parse(bytes) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(format!("answer not understood: {e}")),
        };
        let status = r.code.unwrap_or(0);
        let mut head = Head {
            len,
            status,
            content_length: None,
            chunked: false,
            content_range: None,
            close: r.version == Some(0),
        };
        for h in r.headers.iter() {
            let value = std::str::from_utf8(h.value).unwrap_or("").trim();
            if h.name.eq_ignore_ascii_case("content-length") {
                let l = value
                    .parse::<u64>()
                    .map_err(|_| format!("Content-Length {value:?}"))?;
                if head.content_length.is_some_and(|old| old != l) {
                    return Err("two Content-Lengths".into());
                }
                head.content_length = Some(l);
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                head.chunked = true;
            } else if h.name.eq_ignore_ascii_case("connection") {
                head.close |= value
                    .split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("close"));
            } else if h.name.eq_ignore_ascii_case("content-range") {
                head.content_range = parse_content_range(value);
            }
        }
        Ok(Some(head))
    }
}

/// The first final answer's head at the start of `bytes`, `None` if it is not complete yet.
/// An interim answer (`100 Continue`, `103 Early Hints`) comes before the final one and has
/// no body: it is dropped from `bytes`.
fn next_head(bytes: &mut Vec<u8>) -> Result<Option<Head>, String> {
    loop {
        match Head::parse(bytes)? {
            Some(h) if (100..200).contains(&h.status) && h.status != 101 => {
                bytes.drain(..h.len);
            }
            head => return Ok(head),
        }
    }
}

/// `bytes first-last/total` as (first, last).
fn parse_content_range(v: &str) -> Option<(u64, u64)> {
    let rest = v.strip_prefix("bytes ")?;
    let (span, _total) = rest.split_once('/')?;
    let (first, last) = span.split_once('-')?;
    Some((first.trim().parse().ok()?, last.trim().parse().ok()?))
}

/// A connection: plain, over TLS with records carried here, or over TLS through
/// `tokio-rustls`.
enum Conn {
    Plain(TcpStream),
    Records(Box<Records>),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Conn {
    /// Whether another request may be sent on it, once an answer is read.
    fn reusable(&mut self) -> bool {
        match self {
            Conn::Records(records) => records.reusable(),
            Conn::Plain(_) | Conn::Tls(_) => true,
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Records(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Records(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Records(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Records(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests;
