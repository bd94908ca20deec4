//! `link-proxy`: a TCP proxy that makes a loopback emulator behave like a real link to GCS.
//!
//! Real GCS serves one stream slowly and many streams fast. This proxy recreates that in user
//! space (the test kernel has no netem): every connection is capped at `--rate` bytes per
//! second from server to client, and every request waits `--latency` before it is forwarded,
//! which is the first-byte latency a client sees. A request is a burst of client bytes after a
//! quiet moment; HTTP/1.1 clients send one request at a time per connection.
//!
//! It prints `listening 127.0.0.1:PORT` once ready, and runs until killed.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use clap::Parser;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Parser, Debug, Clone)]
struct Args {
    /// Address to listen on; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Address of the server to forward to.
    #[arg(long)]
    upstream: SocketAddr,
    /// Per-connection bandwidth cap, server to client, in bytes per second (suffixes K, M, G
    /// are decimal, as link speeds are).
    #[arg(long, value_parser = parse_rate, default_value = "40M")]
    rate: u64,
    /// Delay before each request is forwarded.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "20ms")]
    latency: Duration,
}

fn parse_rate(s: &str) -> Result<u64, String> {
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1_000),
        Some('M' | 'm') => (&s[..s.len() - 1], 1_000_000),
        Some('G' | 'g') => (&s[..s.len() - 1], 1_000_000_000),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .map(|n| n * mult)
        .map_err(|e| format!("invalid rate {s:?}: {e}"))
}

/// A gap in client traffic longer than this starts a new request.
const REQUEST_GAP: Duration = Duration::from_millis(2);
/// An idle connection earns no bandwidth credit for later.
const IDLE_RESET: Duration = Duration::from_millis(50);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let listener = TcpListener::bind(args.listen).await?;
    println!("listening {}", listener.local_addr()?);
    loop {
        let (client, _) = listener.accept().await?;
        let args = args.clone();
        tokio::spawn(async move {
            if let Ok(server) = TcpStream::connect(args.upstream).await {
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                relay(client, server, &args).await;
            }
        });
    }
}

async fn relay(client: TcpStream, server: TcpStream, args: &Args) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let latency = args.latency;
    let rate = args.rate.max(1);
    let upstream = async move {
        let mut buf = vec![0u8; 64 * 1024];
        let mut last = None::<Instant>;
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if last.is_none_or(|t| t.elapsed() > REQUEST_GAP) {
                tokio::time::sleep(latency).await;
            }
            last = Some(Instant::now());
            if sw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = sw.shutdown().await;
    };
    let downstream = async move {
        let mut buf = vec![0u8; 64 * 1024];
        let mut window_start = Instant::now();
        let mut sent: u64 = 0;
        let mut last_write = Instant::now();
        loop {
            let n = match sr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if last_write.elapsed() > IDLE_RESET {
                window_start = Instant::now();
                sent = 0;
            }
            if cw.write_all(&buf[..n]).await.is_err() {
                break;
            }
            sent += n as u64;
            last_write = Instant::now();
            let due = window_start + Duration::from_secs_f64(sent as f64 / rate as f64);
            let now = Instant::now();
            if due > now {
                tokio::time::sleep(due - now).await;
            }
        }
        let _ = cw.shutdown().await;
    };
    tokio::join!(upstream, downstream);
}
