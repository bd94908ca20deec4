//! `--metrics-addr`: serves the mount's metrics ([`crate::metrics`]) in the Prometheus text
//! format at `http://HOST:PORT/metrics`.
//!
//! `metrics-exporter-prometheus` records and renders; the listener is a small one of ours, run
//! as a task on the mount's own runtime, because the exporter's own listener bounds nothing: it
//! accepts any number of connections and waits for their headers for ever, and every one holds
//! a descriptor from the same limit staging files, read-cache files and bucket connections
//! draw on. Ours answers `GET /metrics` only, to at most [`MAX_CONNECTIONS`] connections at
//! once, each of which must send its request headers (at most [`MAX_HEADER_BYTES`]) within
//! [`HEADER_TIMEOUT`]. A bare port means 127.0.0.1; an address other machines can reach is
//! allowed, with a warning (see `docs/metrics.md` for what is exposed).
//!
//! The listener is bound before the filesystem is built: an address in use or not ours to bind
//! is a one-line error on the caller's terminal, and nothing gets mounted. The
//! request-duration histogram gets real buckets ([`crate::metrics::DURATION_BUCKETS`]), so
//! Prometheus can aggregate quantiles across mounts, which client-side summaries cannot.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Runtime;

use crate::metrics::{describe, DURATION_BUCKETS, STORE_REQUEST_DURATION};

/// Connections served at once; more wait in the kernel's backlog.
pub const MAX_CONNECTIONS: usize = 16;
/// How long a connection may take to send its request headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// The most bytes of request headers read.
pub const MAX_HEADER_BYTES: usize = 8 * 1024;
/// How often the recorder's histograms are drained and idle metrics aged.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Installs the Prometheus recorder and starts serving it on `addr` (`HOST:PORT`, or a bare
/// port for 127.0.0.1); does nothing for `None`. Must be called at most once per process.
pub fn serve(rt: &Runtime, addr: Option<&str>) -> Result<(), String> {
    let Some(addr) = addr else {
        return Ok(());
    };
    let sock = resolve(addr)?;
    let fail = |e: &dyn std::fmt::Display| format!("cannot serve metrics on {addr}: {e}");
    let listener = {
        let _entered = rt.enter();
        let std = std::net::TcpListener::bind(sock).map_err(|e| fail(&e))?;
        std.set_nonblocking(true).map_err(|e| fail(&e))?;
        tokio::net::TcpListener::from_std(std).map_err(|e| fail(&e))?
    };
    if !sock.ip().is_loopback() {
        tracing::warn!(
            "metrics at {sock} can be read by anyone who can reach this machine (request \
             counts, errors, bytes moved): bind 127.0.0.1 unless a firewall narrows it"
        );
    }
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(STORE_REQUEST_DURATION.to_string()),
            DURATION_BUCKETS,
        )
        .map_err(|e| fail(&e))?
        .install_recorder()
        .map_err(|e| fail(&e))?;
    let upkeep = handle.clone();
    rt.spawn(async move {
        let mut every = tokio::time::interval(UPKEEP_EVERY);
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    rt.spawn(accept(listener, handle));
    describe();
    tracing::info!("serving metrics at http://{sock}/metrics");
    Ok(())
}

/// Serves connections, at most [`MAX_CONNECTIONS`] at once.
async fn accept(listener: tokio::net::TcpListener, handle: PrometheusHandle) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        // A slot first, then a connection: beyond the cap, callers wait in the backlog and
        // hold no descriptor of ours.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors, say: back off instead of spinning.
                tracing::warn!(error = %e, "metrics listener: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let handle = handle.clone();
        tokio::spawn(async move {
            let _slot = slot;
            // The whole exchange is bounded too: a peer that reads its reply slowly gives up
            // its slot as well.
            let _ = tokio::time::timeout(HEADER_TIMEOUT * 2, answer(stream, &handle)).await;
        });
    }
}

/// Reads one request's headers (bounded in size and time) and answers it; the connection then
/// closes.
async fn answer(
    mut stream: tokio::net::TcpStream,
    handle: &PrometheusHandle,
) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let read = async {
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
            if head.len() >= MAX_HEADER_BYTES {
                return Err(std::io::Error::other("request headers too long"));
            }
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok(())
    };
    match tokio::time::timeout(HEADER_TIMEOUT, read).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e),
        Err(_) => return Err(std::io::ErrorKind::TimedOut.into()),
    }
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let mut parts = line.split(|b| *b == b' ');
    let (method, path) = (parts.next(), parts.next());
    let (status, kind, body) = match (method, path) {
        (Some(b"GET"), Some(b"/metrics")) => {
            ("200 OK", "text/plain; version=0.0.4", handle.render())
        }
        (Some(b"GET"), _) => ("404 Not Found", "text/plain", "not found\n".to_string()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET /metrics\n".to_string(),
        ),
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {kind}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(reply.as_bytes()).await?;
    stream.shutdown().await
}

/// `HOST:PORT` to one socket address: an IP literal as it is, a name through the resolver
/// (the first address it gives), a bare port on 127.0.0.1.
fn resolve(addr: &str) -> Result<SocketAddr, String> {
    let bad = |why: String| format!("invalid --metrics-addr {addr:?}: {why}");
    if let Ok(port) = addr.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    if let Ok(sock) = addr.parse::<SocketAddr>() {
        return Ok(sock);
    }
    addr.to_socket_addrs()
        .map_err(|e| {
            bad(format!(
                "{e} (expected HOST:PORT or PORT, e.g. 127.0.0.1:9100)"
            ))
        })?
        .next()
        .ok_or_else(|| bad("the name resolves to no address".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(
            resolve("127.0.0.1:9100"),
            Ok(SocketAddr::from(([127, 0, 0, 1], 9100)))
        );
        assert_eq!(resolve("[::1]:9100").ok(), "[::1]:9100".parse().ok());
        assert!(resolve("localhost:9100").is_ok_and(|a| a.ip().is_loopback()));
        assert!(resolve("127.0.0.1").is_err());
        assert_eq!(
            resolve("9100"),
            Ok(SocketAddr::from(([127, 0, 0, 1], 9100))),
            "a bare port is this machine's only"
        );
        assert!(resolve("127.0.0.1:notaport").is_err());
    }

    /// Idle connections cannot take the endpoint (or the mount's descriptors): past the cap,
    /// callers wait in the backlog, and a connection that sends no request is dropped after
    /// the header timeout, so a scrape behind a full house of idle ones is still answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_connections_are_capped_and_timed_out() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let handle = PrometheusBuilder::new().build_recorder().handle();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(accept(listener, handle));
        let mut idle = Vec::new();
        for _ in 0..MAX_CONNECTIONS * 2 {
            idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        let started = std::time::Instant::now();
        let mut scrape = tokio::net::TcpStream::connect(addr).await.unwrap();
        scrape
            .write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut reply = String::new();
        tokio::time::timeout(HEADER_TIMEOUT * 4, scrape.read_to_string(&mut reply))
            .await
            .expect("the scrape was answered")
            .unwrap();
        assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");
        assert!(
            started.elapsed() >= HEADER_TIMEOUT,
            "answered before the idle ones left"
        );
        // The first idle ones were dropped: they read end of file.
        let mut buf = [0u8; 16];
        let n = tokio::time::timeout(HEADER_TIMEOUT, idle[0].read(&mut buf)).await;
        assert!(matches!(n, Ok(Ok(0))), "{n:?}");
        // Headers past the bound are not read to the end.
        let mut big = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _ = big.write_all(&vec![b'a'; MAX_HEADER_BYTES * 2]).await;
        let mut reply = Vec::new();
        let _ = tokio::time::timeout(HEADER_TIMEOUT * 4, big.read_to_end(&mut reply)).await;
        assert!(
            !reply.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&reply)
        );
    }
}
