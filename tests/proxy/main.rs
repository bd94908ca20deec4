//! `link-proxy`: a TCP proxy that makes a loopback emulator behave like a real link to GCS, and
//! on demand like a bad one.
//!
//! Shaping. Real GCS serves one stream slowly and many streams fast. This proxy recreates that
//! in user space (the test kernel has no netem): every connection is capped at `--rate` bytes
//! per second from server to client, and every request waits `--latency` before it is
//! forwarded, which is the first-byte latency a client sees. `--up-rate` caps client-to-server
//! bytes the same way, for uploads.
//!
//! Requests. The proxy does not parse HTTP beyond a request line. A request starts with the
//! first client bytes of a connection, or with client bytes that follow a quiet moment
//! (`--request-gap`) once the server has answered the previous request (HTTP/1.1 clients send
//! one request at a time per connection, and wait for the answer before sending the next; a
//! `100 Continue` is not an answer). With `--enforce-preconditions`, client bytes that begin
//! like a request line once the server has answered start a new request however soon they come.
//!
//! Preconditions (`--enforce-preconditions`, off by default). The emulator answers 200 to a
//! compose, a media upload, the start of a resumable session, a copy or rewrite and a delete
//! whose `ifGenerationMatch` does not hold. With this flag the proxy reads the request line of
//! each new request; when it is a write that names its object there (a compose, by the path;
//! a copy or rewrite, by its destination; an upload or a resumable session's start, by the
//! `name` query parameter; a delete or metadata update, by the path), the proxy:
//! - waits until the previous such write to the same object name, on any connection, has been
//!   answered by the server, and holds the name until this one's answer starts, so that its
//!   check and its write are one step for every other write the proxy recognises;
//! - if it carries `ifGenerationMatch` or `ifGenerationNotMatch` (0 meaning "no live object"),
//!   looks up the object's generation with a side request to the server (`GET` of the object
//!   resource; 404 means there is none) and, when a condition does not hold, answers
//!   `412 Precondition Failed` itself with a GCS-shaped JSON error and `Connection: close`,
//!   never forwarding the request, and reads the rest of the request before closing so that
//!   the client reads the answer rather than a reset; if the lookup fails it answers 503.
//!
//! Writes that name their object only in the body (multipart uploads and resumable sessions
//! started without a `name` parameter, which the emulator checks itself for multipart) and a
//! resumable session's chunks are forwarded unchecked and unserialised; a resumable session's
//! start is checked, but the object is only written by its last chunk, later. Fault decisions
//! come first: a request refused or swallowed by a fault is neither checked nor serialised.
//!
//! Faults, all off by default and all drawn from one random generator seeded with `--seed`:
//! - resets: per MiB relayed in a direction, the chance that the connection is reset (both
//!   sides closed abruptly, with an RST) in the middle of the transfer;
//! - error bursts: a new request may start a burst: it and the next requests, across
//!   connections, are answered `503 Service Unavailable` by the proxy and never reach the server;
//! - dropped responses: the request reaches the server whole, but when its answer starts the
//!   client's connection is reset instead: the server acted, the client never hears;
//! - black holes: a new request may start a period during which new requests are read and
//!   never forwarded nor answered, their connections held open: only the client's own timeout
//!   ends them.
//!
//! Control. With `--control ADDR`, a test can change the link while it runs: it connects, sends
//! one line and reads `ok`:
//! - `faults on` / `faults off`: inject the faults above, or stop (faults start on when any
//!   fault flag is given);
//! - `down`: the link is cut: open connections are reset, new ones are reset as they arrive;
//! - `up`: the link works again;
//! - `stats`: answers the counts of faults injected (and, when enforced, of the preconditions
//!   checked and answered 412) instead of `ok`.
//!
//! Every change prints one line with the counts to standard error, so a test log shows what the
//! link did. It prints `listening 127.0.0.1:PORT` once ready, then `control 127.0.0.1:PORT` if
//! asked for, and runs until killed.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use preconditions::{Locks, Write};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedMutexGuard};

mod preconditions;

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
    /// Quiet time on the client side, after the server has answered, before client bytes count
    /// as a new request. With the default, a request sent within 2 ms of the previous
    /// request's last bytes (a quick answer on a kept-alive connection) is taken for more of
    /// the same request, and is neither delayed nor judged for faults; 0 makes every request
    /// after an answer a new one.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2ms")]
    request_gap: Duration,
    /// Seed of every random fault decision (default: a random seed, printed at start).
    #[arg(long)]
    seed: Option<u64>,
    /// Chance per MiB relayed from server to client that the connection is reset.
    #[arg(long, value_parser = parse_probability, default_value = "0")]
    reset_down_per_mib: f64,
    /// Chance per MiB relayed from client to server that the connection is reset.
    #[arg(long, value_parser = parse_probability, default_value = "0")]
    reset_up_per_mib: f64,
    /// Chance that a new request starts a burst of `503 Service Unavailable` answers.
    #[arg(long, value_parser = parse_probability, default_value = "0")]
    error_burst_rate: f64,
    /// Requests answered 503 in one burst, counting the one that started it.
    #[arg(long, default_value_t = 1)]
    error_burst_len: u32,
    /// Chance that a request reaches the server but its answer never reaches the client.
    #[arg(long, value_parser = parse_probability, default_value = "0")]
    drop_response_rate: f64,
    /// Chance that a new request starts a black-hole period.
    #[arg(long, value_parser = parse_probability, default_value = "0")]
    blackhole_rate: f64,
    /// How long a black-hole period lasts.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    blackhole_for: Duration,
    /// Address of the control port (e.g. 127.0.0.1:0); none by default.
    #[arg(long)]
    control: Option<SocketAddr>,
    /// Enforce `ifGenerationMatch` and `ifGenerationNotMatch` on writes that name their object
    /// in the request line, answering `412 Precondition Failed` itself when they do not hold,
    /// and serialise the writes to one object name.
    #[arg(long)]
    enforce_preconditions: bool,
}

impl Args {
    /// Whether any fault is asked for; faults then start on.
    fn any_fault(&self) -> bool {
        self.reset_down_per_mib > 0.0
            || self.reset_up_per_mib > 0.0
            || self.error_burst_rate > 0.0
            || self.drop_response_rate > 0.0
            || self.blackhole_rate > 0.0
    }
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

fn parse_probability(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err(format!("invalid probability {s:?}: a number from 0 to 1")),
    }
}

/// An idle connection earns no bandwidth credit for later.
const IDLE_RESET: Duration = Duration::from_millis(50);
/// How long a refused client may take to read the 503 and close its side.
const REFUSE_LINGER: Duration = Duration::from_secs(5);
const MIB: f64 = 1024.0 * 1024.0;
const SERVICE_UNAVAILABLE: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let listener = TcpListener::bind(args.listen).await?;
    println!("listening {}", listener.local_addr()?);
    let seed = args.seed.unwrap_or_else(rand::random);
    let link = Arc::new(Link::new(args.clone(), seed));
    if let Some(addr) = args.control {
        let control = TcpListener::bind(addr).await?;
        println!("control {}", control.local_addr()?);
        tokio::spawn(serve_control(link.clone(), control));
    }
    if args.any_fault() || args.enforce_preconditions {
        eprintln!("link-proxy: seed {seed}, {}", link.summary());
    }
    loop {
        let (client, _) = listener.accept().await?;
        let link = link.clone();
        tokio::spawn(async move { serve(link, client).await });
    }
}

/// What the proxy injected so far.
#[derive(Default)]
struct Counts {
    requests: AtomicU64,
    resets_up: AtomicU64,
    resets_down: AtomicU64,
    bursts: AtomicU64,
    refused: AtomicU64,
    dropped_responses: AtomicU64,
    black_holes: AtomicU64,
    swallowed: AtomicU64,
    cut_by_down: AtomicU64,
    preconditions_checked: AtomicU64,
    preconditions_failed: AtomicU64,
    precondition_lookup_errors: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// The random state of the faults: one generator, and the burst or black hole under way.
struct Fate {
    rng: StdRng,
    burst_left: u32,
    black_hole_until: Option<Instant>,
}

/// What happens to a new request.
enum Verdict {
    Forward { drop_response: bool },
    Refuse,
    Swallow,
}

/// Which way bytes flow.
#[derive(Clone, Copy)]
enum Direction {
    Up,
    Down,
}

/// The link all connections share: its settings, whether faults are on and it is up, and what
/// it injected.
struct Link {
    args: Args,
    faults_on: AtomicBool,
    down: watch::Sender<bool>,
    fate: Mutex<Fate>,
    counts: Counts,
    /// The writes under way per object name, when preconditions are enforced.
    locks: Locks,
}

impl Link {
    fn new(args: Args, seed: u64) -> Self {
        Link {
            faults_on: AtomicBool::new(args.any_fault()),
            down: watch::Sender::new(false),
            fate: Mutex::new(Fate {
                rng: StdRng::seed_from_u64(seed),
                burst_left: 0,
                black_hole_until: None,
            }),
            counts: Counts::default(),
            locks: Locks::default(),
            args,
        }
    }

    fn faults_on(&self) -> bool {
        self.faults_on.load(Ordering::SeqCst)
    }

    fn is_down(&self) -> bool {
        *self.down.borrow()
    }

    fn fate(&self) -> std::sync::MutexGuard<'_, Fate> {
        self.fate.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Decides the fate of a new request: a black hole under way or starting swallows it, a
    /// burst under way or starting refuses it, else it goes through, perhaps to lose its answer.
    fn judge_request(&self) -> Verdict {
        bump(&self.counts.requests);
        if !self.faults_on() {
            return Verdict::Forward {
                drop_response: false,
            };
        }
        let a = &self.args;
        let mut fate = self.fate();
        let now = Instant::now();
        if fate.black_hole_until.is_some_and(|t| now < t) {
            bump(&self.counts.swallowed);
            return Verdict::Swallow;
        }
        if fate.burst_left > 0 {
            fate.burst_left -= 1;
            bump(&self.counts.refused);
            return Verdict::Refuse;
        }
        if fate.rng.gen::<f64>() < a.blackhole_rate {
            fate.black_hole_until = Some(now + a.blackhole_for);
            bump(&self.counts.black_holes);
            bump(&self.counts.swallowed);
            return Verdict::Swallow;
        }
        if fate.rng.gen::<f64>() < a.error_burst_rate {
            fate.burst_left = a.error_burst_len.saturating_sub(1);
            bump(&self.counts.bursts);
            bump(&self.counts.refused);
            return Verdict::Refuse;
        }
        let drop_response = fate.rng.gen::<f64>() < a.drop_response_rate;
        Verdict::Forward { drop_response }
    }

    /// Whether the connection is reset instead of relaying `n` more bytes in `dir`.
    fn roll_reset(&self, dir: Direction, n: usize) -> bool {
        let (per_mib, counter) = match dir {
            Direction::Up => (self.args.reset_up_per_mib, &self.counts.resets_up),
            Direction::Down => (self.args.reset_down_per_mib, &self.counts.resets_down),
        };
        if per_mib <= 0.0 || !self.faults_on() {
            return false;
        }
        let chance = 1.0 - (1.0 - per_mib).powf(n as f64 / MIB);
        let reset = self.fate().rng.gen::<f64>() < chance;
        if reset {
            bump(counter);
        }
        reset
    }

    /// Applies one control command; returns the answer line.
    fn command(&self, cmd: &str) -> String {
        match cmd {
            "faults on" => self.faults_on.store(true, Ordering::SeqCst),
            "faults off" => {
                self.faults_on.store(false, Ordering::SeqCst);
                let mut fate = self.fate();
                fate.burst_left = 0;
                fate.black_hole_until = None;
            }
            "down" => {
                self.down.send_replace(true);
            }
            "up" => {
                self.down.send_replace(false);
            }
            "stats" => return format!("{}\n", self.summary()),
            _ => return format!("error: unknown command {cmd:?}\n"),
        }
        eprintln!("link-proxy: {cmd}: {}", self.summary());
        "ok\n".into()
    }

    /// One line with the state and what was injected.
    fn summary(&self) -> String {
        let c = &self.counts;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "faults {}, link {}; requests {}, resets {} (up {}, down {}), 503 bursts {} \
             ({} requests refused), dropped responses {}, black holes {} ({} requests \
             swallowed), connections cut by down {}; preconditions {}",
            if self.faults_on() { "on" } else { "off" },
            if self.is_down() { "down" } else { "up" },
            n(&c.requests),
            n(&c.resets_up) + n(&c.resets_down),
            n(&c.resets_up),
            n(&c.resets_down),
            n(&c.bursts),
            n(&c.refused),
            n(&c.dropped_responses),
            n(&c.black_holes),
            n(&c.swallowed),
            n(&c.cut_by_down),
            if self.args.enforce_preconditions {
                format!(
                    "enforced: {} checked, {} answered 412, {} lookups failed",
                    n(&c.preconditions_checked),
                    n(&c.preconditions_failed),
                    n(&c.precondition_lookup_errors),
                )
            } else {
                "left to the server".to_string()
            },
        )
    }
}

/// Answers control connections: one command line each.
async fn serve_control(link: Arc<Link>, listener: TcpListener) {
    while let Ok((stream, _)) = listener.accept().await {
        let link = link.clone();
        tokio::spawn(async move {
            let (r, mut w) = stream.into_split();
            let mut line = String::new();
            if BufReader::new(r).read_line(&mut line).await.is_ok() {
                let reply = link.command(line.trim());
                let _ = w.write_all(reply.as_bytes()).await;
            }
        });
    }
}

/// Closes a connection abruptly: the peer sees a reset, not an orderly end.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

/// Resolves once the link is down (at once if it already is).
async fn link_down(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|down| *down).await;
}

/// How a relay ended early.
enum Cut {
    /// Reset both sides: a reset fault, a dropped response, or the link went down.
    Reset,
    /// Answer the client 503 and close.
    Refuse,
    /// Hold the client's connection open and never answer.
    Swallow,
    /// Answer the client 412 and close: the write's preconditions do not hold.
    PreconditionFailed,
}

/// What one connection's two directions share.
#[derive(Default)]
struct Conn {
    /// The server sent bytes since the current request started.
    answered: AtomicBool,
    /// The answer to the current request is to be dropped.
    drop_response: AtomicBool,
    /// The lock of the object the current request writes, held until its answer starts.
    write_lock: Mutex<Option<OwnedMutexGuard<()>>>,
}

impl Conn {
    /// Lets the next write to the object of the current request go ahead.
    fn release_write_lock(&self) {
        let guard = self
            .write_lock
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        drop(guard);
    }
}

/// Serves one client connection until either side closes or a fault ends it.
async fn serve(link: Arc<Link>, mut client: TcpStream) {
    let mut down = link.down.subscribe();
    if link.is_down() {
        bump(&link.counts.cut_by_down);
        return reset(client);
    }
    let Ok(mut server) = TcpStream::connect(link.args.upstream).await else {
        return reset(client);
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let conn = Conn::default();
    let cut = {
        let (cr, cw) = client.split();
        let (sr, sw) = server.split();
        let both = async {
            tokio::try_join!(
                pump_up(&link, &conn, cr, sw),
                pump_down(&link, &conn, sr, cw)
            )
        };
        tokio::select! {
            r = both => r.err(),
            _ = link_down(&mut down) => {
                bump(&link.counts.cut_by_down);
                Some(Cut::Reset)
            }
        }
    };
    match cut {
        None => {}
        Some(Cut::Reset) => {
            reset(server);
            reset(client);
        }
        Some(Cut::Refuse) => {
            drop(server);
            answer_and_close(client, SERVICE_UNAVAILABLE).await;
        }
        Some(Cut::PreconditionFailed) => {
            drop(server);
            answer_and_close(client, &preconditions::precondition_failed()).await;
        }
        Some(Cut::Swallow) => {
            drop(server);
            hold(client, &mut down).await;
        }
    }
}

/// Relays client to server, judging each new request and rolling for resets.
async fn pump_up(
    link: &Link,
    conn: &Conn,
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
) -> Result<(), Cut> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut shaper = Shaper::new(link.args.up_rate);
    let mut last = None::<Instant>;
    let enforce = link.args.enforce_preconditions;
    loop {
        let mut n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let new_request = match last {
            None => true,
            Some(t) => {
                // Enforcing preconditions, a request line right after an answer is a new
                // request however soon it comes.
                let fresh = t.elapsed() >= link.args.request_gap
                    || (enforce && preconditions::looks_like_request(&buf[..n]));
                fresh && conn.answered.swap(false, Ordering::SeqCst)
            }
        };
        if new_request {
            match link.judge_request() {
                Verdict::Forward { drop_response } => {
                    conn.drop_response.store(drop_response, Ordering::SeqCst)
                }
                Verdict::Refuse => return Err(Cut::Refuse),
                Verdict::Swallow => return Err(Cut::Swallow),
            }
            tokio::time::sleep(link.args.latency).await;
            if enforce {
                n = read_request_line(&mut from, &mut buf, n).await;
                enforce_preconditions(link, conn, &buf[..n]).await?;
            }
        }
        if link.roll_reset(Direction::Up, n) {
            return Err(Cut::Reset);
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
        shaper.sent(n).await;
        last = Some(Instant::now());
    }
    let _ = to.shutdown().await;
    Ok(())
}

/// Reads on until `buf[..n]` holds a whole request line (or the buffer is full, or the client
/// stops sending); returns the bytes now in `buf`.
async fn read_request_line(
    from: &mut (impl AsyncRead + Unpin),
    buf: &mut [u8],
    mut n: usize,
) -> usize {
    while n < buf.len() && !buf[..n].windows(2).any(|w| w == b"\r\n") {
        match from.read(&mut buf[n..]).await {
            Ok(0) | Err(_) => break,
            Ok(m) => n += m,
        }
    }
    n
}

/// For a new request starting with `head`: if it writes an object named in its request line,
/// waits for the previous write to that name to be answered and holds the name until this
/// one's answer starts; if it carries generation conditions, looks up the object's generation
/// upstream and refuses the request (412) when they do not hold, or (503) when the lookup
/// fails.
async fn enforce_preconditions(link: &Link, conn: &Conn, head: &[u8]) -> Result<(), Cut> {
    let Some(Write {
        bucket,
        name,
        condition,
    }) = preconditions::parse_request_line(head).and_then(|r| preconditions::classify(&r))
    else {
        return Ok(());
    };
    let key = format!("{bucket}/{name}");
    let guard = link.locks.lock(key).await;
    *conn.write_lock.lock().unwrap_or_else(|e| e.into_inner()) = Some(guard);
    let Some(condition) = condition else {
        return Ok(());
    };
    bump(&link.counts.preconditions_checked);
    match preconditions::current_generation(link.args.upstream, &bucket, &name).await {
        Ok(current) if condition.holds(current) => Ok(()),
        Ok(_) => {
            bump(&link.counts.preconditions_failed);
            conn.release_write_lock();
            Err(Cut::PreconditionFailed)
        }
        Err(e) => {
            bump(&link.counts.precondition_lookup_errors);
            eprintln!("link-proxy: generation of {bucket}/{name} unknown ({e}): answering 503");
            conn.release_write_lock();
            Err(Cut::Refuse)
        }
    }
}

/// Relays server to client, dropping an answer when told to and rolling for resets.
async fn pump_down(
    link: &Link,
    conn: &Conn,
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
) -> Result<(), Cut> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut shaper = Shaper::new(link.args.rate.max(1));
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // An interim answer (100 Continue) is not the answer: the body follows it.
        if !buf[..n].starts_with(b"HTTP/1.1 1") {
            conn.release_write_lock();
            conn.answered.store(true, Ordering::SeqCst);
            if conn.drop_response.swap(false, Ordering::SeqCst) {
                bump(&link.counts.dropped_responses);
                return Err(Cut::Reset);
            }
        }
        if link.roll_reset(Direction::Down, n) {
            return Err(Cut::Reset);
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
        shaper.sent(n).await;
    }
    let _ = to.shutdown().await;
    Ok(())
}

/// Sends `answer` (one that closes the connection) and closes, reading what the client still
/// sends (the rest of its request) so that closing does not reset the connection before the
/// client has read the answer.
async fn answer_and_close(mut client: TcpStream, answer: &[u8]) {
    let _ = client.write_all(answer).await;
    let _ = client.shutdown().await;
    let mut buf = vec![0u8; 64 * 1024];
    let _ = tokio::time::timeout(REFUSE_LINGER, async {
        while matches!(client.read(&mut buf).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// Reads and discards what the client sends, never answering, until it gives up or the link
/// goes down.
async fn hold(mut client: TcpStream, down: &mut watch::Receiver<bool>) {
    let mut buf = vec![0u8; 64 * 1024];
    let read_all = async { while matches!(client.read(&mut buf).await, Ok(n) if n > 0) {} };
    tokio::select! {
        _ = read_all => {}
        _ = link_down(down) => {}
    }
    reset(client);
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
