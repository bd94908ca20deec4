//! `--metrics-addr`: serves the mount's metrics ([`crate::metrics`]) in the Prometheus text
//! format at `http://HOST:PORT/metrics`.
//!
//! The exporter is `metrics-exporter-prometheus`'s HTTP listener, run as a task on the mount's
//! own runtime, so it needs no thread of its own and ends with the mount. The listener is bound
//! before the filesystem is built: an address in use or not ours to bind is a one-line error
//! on the caller's terminal, and nothing gets mounted. The request-duration histogram gets
//! real buckets ([`crate::metrics::DURATION_BUCKETS`]), so Prometheus can aggregate quantiles
//! across mounts, which client-side summaries cannot.

use std::net::{SocketAddr, ToSocketAddrs};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use tokio::runtime::Runtime;

use crate::metrics::{describe, DURATION_BUCKETS, STORE_REQUEST_DURATION};

/// Installs the Prometheus recorder and starts serving it on `addr` (`HOST:PORT`); does
/// nothing for `None`. Must be called at most once per process.
pub fn serve(rt: &Runtime, addr: Option<&str>) -> Result<(), String> {
    let Some(addr) = addr else {
        return Ok(());
    };
    let sock = resolve(addr)?;
    let fail = |e: &dyn std::fmt::Display| format!("cannot serve metrics on {addr}: {e}");
    let builder = PrometheusBuilder::new()
        .with_http_listener(sock)
        .set_buckets_for_metric(
            Matcher::Full(STORE_REQUEST_DURATION.to_string()),
            DURATION_BUCKETS,
        )
        .map_err(|e| fail(&e))?;
    // Building binds the listener and spawns the recorder's upkeep task: both need the runtime.
    let (recorder, exporter) = {
        let _entered = rt.enter();
        builder.build().map_err(|e| fail(&e))?
    };
    ::metrics::set_global_recorder(recorder).map_err(|e| fail(&e))?;
    rt.spawn(async move {
        if let Err(e) = exporter.await {
            tracing::error!(error = ?e, "the metrics endpoint stopped");
        }
    });
    describe();
    tracing::info!("serving metrics at http://{sock}/metrics");
    Ok(())
}

/// `HOST:PORT` to one socket address: an IP literal as it is, a name through the resolver
/// (the first address it gives).
fn resolve(addr: &str) -> Result<SocketAddr, String> {
    let bad = |why: String| format!("invalid --metrics-addr {addr:?}: {why}");
    if let Ok(sock) = addr.parse::<SocketAddr>() {
        return Ok(sock);
    }
    addr.to_socket_addrs()
        .map_err(|e| bad(format!("{e} (expected HOST:PORT, e.g. 127.0.0.1:9100)")))?
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
        assert!(resolve("127.0.0.1:notaport").is_err());
    }
}
