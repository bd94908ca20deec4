//! `link-proxy`: a TCP proxy that makes a loopback emulator behave like a real link to GCS.
//!
//! Real GCS serves one stream slowly and many streams fast. This proxy recreates that in user
//! space (the test kernel has no netem): every connection is capped at `--rate` bytes per
//! second from server to client, and every request waits `--latency` before it is forwarded,
//! which is the first-byte latency a client sees. `--up-rate` caps client-to-server bytes the
//! same way, for uploads. A request is a burst of client bytes after a
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
    /// Per-connection bandwidth cap, client to server (uploads); 0 means uncapped.
    #[arg(long, value_parser = parse_rate, default_value = "0")]
    up_rate: u64,
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
    let mut up_shaper = Shaper::new(args.up_rate);
    let mut down_shaper = Shaper::new(args.rate.max(1));
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
            if sw.write_all(&buf[..n]).await.is_err() {
                break;
            }
            up_shaper.sent(n).await;
            last = Some(Instant::now());
        }
        let _ = sw.shutdown().await;
    };
    let downstream = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match sr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if cw.write_all(&buf[..n]).await.is_err() {
                break;
            }
            down_shaper.sent(n).await;
        }
        let _ = cw.shutdown().await;
    };
    tokio::join!(upstream, downstream);
}

/// Holds one direction of a connection to `rate` bytes per second, measured from the start of
/// the current burst (an idle connection earns no credit).
struct Shaper {
    rate: u64,
    window_start: Instant,
    sent: u64,
    last: Instant,
}

impl Shaper {
    fn new(rate: u64) -> Self {
        let now = Instant::now();
        Shaper {
            rate,
            window_start: now,
            sent: 0,
            last: now,
        }
    }

    /// Records `n` bytes just forwarded and sleeps until they are due at the capped rate.
    async fn sent(&mut self, n: usize) {
        if self.rate == 0 {
            return;
        }
        if self.last.elapsed() > IDLE_RESET {
            self.window_start = Instant::now();
            self.sent = 0;
        }
        self.sent += n as u64;
        let due = self.window_start + Duration::from_secs_f64(self.sent as f64 / self.rate as f64);
        let now = Instant::now();
        if due > now {
            tokio::time::sleep(due - now).await;
        }
        self.last = Instant::now();
    }
}
