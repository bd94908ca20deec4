//! The ranged GET against a scripted server: the bytes asked for, one connection kept for
//! many requests, and every answer it must not take as the range.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use std::sync::atomic::Ordering;

use super::{Got, RangeGetter, TokenFn};
use crate::buffer_pool::BufferPool;
use crate::store::tls_records::tests::{certs as tls_certs, roots as tls_roots, server_config};
use crate::store::StoreErrorKind;

/// What the server does with one request.
#[derive(Clone)]
enum Answer {
    /// Sends these bytes (head and body), in pieces of at most `piece`, then waits for the
    /// next request on the connection.
    Send(Vec<u8>, usize),
    /// Sends these bytes, then closes the connection.
    SendAndClose(Vec<u8>),
    /// Sends the first `n` bytes, waits, then the rest in pieces of at most `piece`.
    Pause(Vec<u8>, usize, Duration, usize),
}

/// A server on loopback that answers the `n`-th request of the `c`-th connection with
/// `script[c][n]`, closing a connection once its answers run out. Returns its endpoint and
/// the requests it received, in order, each with the index of its connection.
async fn serve(script: Vec<Vec<Answer>>) -> (String, Arc<Mutex<Vec<(usize, String)>>>) {
    let (port, seen) = serve_with(script, None).await;
    (format!("http://127.0.0.1:{port}"), seen)
}

/// [`serve`], over TLS through `tls` if given; returns the port.
async fn serve_with(
    script: Vec<Vec<Answer>>,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> (u16, Arc<Mutex<Vec<(usize, String)>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        for (c, answers) in script.into_iter().enumerate() {
            let Ok((conn, _)) = listener.accept().await else {
                return;
            };
            let log = log.clone();
            match &tls {
                None => {
                    tokio::spawn(answer_all(conn, c, answers, log));
                }
                Some(tls) => {
                    let tls = tls.clone();
                    tokio::spawn(async move {
                        if let Ok(conn) = tls.accept(conn).await {
                            answer_all(conn, c, answers, log).await;
                        }
                    });
                }
            }
        }
    });
    (port, seen)
}

/// Answers the requests of connection `c` with `answers`, in turn.
async fn answer_all<S>(
    mut conn: S,
    c: usize,
    answers: Vec<Answer>,
    log: Arc<Mutex<Vec<(usize, String)>>>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    for answer in answers {
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            if conn.read(&mut b).await.unwrap_or(0) == 0 {
                return;
            }
            head.push(b[0]);
        }
        log.lock()
            .push((c, String::from_utf8_lossy(&head).into_owned()));
        match answer {
            Answer::Send(bytes, piece) => {
                for p in bytes.chunks(piece) {
                    if conn.write_all(p).await.is_err() || conn.flush().await.is_err() {
                        return;
                    }
                    tokio::task::yield_now().await;
                }
            }
            Answer::Pause(bytes, n, pause, piece) => {
                if conn.write_all(&bytes[..n]).await.is_err() || conn.flush().await.is_err() {
                    return;
                }
                tokio::time::sleep(pause).await;
                for p in bytes[n..].chunks(piece) {
                    if conn.write_all(p).await.is_err() || conn.flush().await.is_err() {
                        return;
                    }
                }
            }
            Answer::SendAndClose(bytes) => {
                let _ = conn.write_all(&bytes).await;
                let _ = conn.flush().await;
                return;
            }
        }
    }
}

fn data(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(31).wrapping_add(seed) % 251) as u8)
        .collect()
}

/// A `206` for `range` of an object of `total` bytes whose content is `object`.
fn partial(object: &[u8], range: std::ops::Range<usize>, extra: &str) -> Vec<u8> {
    let mut r = format!(
        "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {}-{}/{}\r\n\
         {extra}\r\n",
        range.len(),
        range.start,
        range.end - 1,
        object.len()
    )
    .into_bytes();
    r.extend_from_slice(&object[range]);
    r
}

async fn get(
    getter: &RangeGetter,
    pool: &Arc<BufferPool>,
    range: std::ops::Range<u64>,
) -> crate::store::StoreResult<Got> {
    let buf = pool
        .filling((range.end - range.start) as usize)
        .with_crc32c();
    getter.get("dir one/file+1", 42, range, buf).await
}

/// Two ranges on one connection: exactly the bytes asked for, with their CRC32C, and a
/// request the server can route (the key escaped, the generation and range given).
#[tokio::test]
async fn reads_ranges_exactly_on_one_connection() {
    let object = data(3 << 20, 7);
    let (endpoint, seen) = serve(vec![vec![
        Answer::Send(partial(&object, 1000..(2 << 20), ""), 70_001),
        Answer::Send(partial(&object, (2 << 20)..(3 << 20), ""), 1 << 20),
    ]])
    .await;
    let getter = RangeGetter::new(&endpoint, "bkt", None).unwrap();
    let pool = BufferPool::new(16 << 20);
    for range in [1000..(2u64 << 20), (2 << 20)..(3 << 20)] {
        let Got::Filled(buf) = get(&getter, &pool, range.clone()).await.unwrap() else {
            panic!("not taken");
        };
        let want = &object[range.start as usize..range.end as usize];
        assert_eq!(buf.crc32c(), Some(crc32c::crc32c(want)));
        assert_eq!(&buf.freeze()[..], want, "the bytes of {range:?}");
    }
    let seen = seen.lock();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].0, 0, "both requests on the one connection");
    let seen: Vec<&String> = seen.iter().map(|(_, r)| r).collect();
    assert!(
        seen[0].starts_with(
            "GET /storage/v1/b/bkt/o/dir%20one%2Ffile%2B1?alt=media&generation=42 HTTP/1.1\r\n"
        ),
        "{}",
        seen[0]
    );
    assert!(seen[0].contains("\r\nRange: bytes=1000-2097151\r\n"));
    assert!(!seen[0].contains("Authorization"), "anonymous");
}

/// The socket's receive mark never holds back the bytes a body still needs: a body whose
/// last piece is smaller than the mark, one that pauses below the mark, and then a small
/// answer on the same connection (which a mark left raised would hold back) all arrive, and
/// the connection is kept with its mark back at 1.
#[tokio::test]
async fn the_receive_mark_never_holds_back_a_body() {
    let object = data(1 << 20, 11);
    let big = (300 << 10) + 7;
    let (endpoint, seen) = serve(vec![vec![
        Answer::Send(partial(&object, 0..big, ""), 4093),
        Answer::Pause(
            partial(&object, 5..(200 << 10), ""),
            70_000,
            Duration::from_millis(400),
            1 << 20,
        ),
        Answer::Send(partial(&object, 3..13, ""), 64),
    ]])
    .await;
    let getter = RangeGetter::new(&endpoint, "bkt", None).unwrap();
    let pool = BufferPool::new(4 << 20);
    for range in [0..big as u64, 5..(200 << 10), 3..13] {
        let got = tokio::time::timeout(Duration::from_secs(5), get(&getter, &pool, range.clone()))
            .await
            .expect("the body arrives well before the read timeout");
        let Got::Filled(buf) = got.unwrap() else {
            panic!("not taken");
        };
        let want = &object[range.start as usize..range.end as usize];
        assert_eq!(buf.crc32c(), Some(crc32c::crc32c(want)));
        assert_eq!(&buf.freeze()[..], want, "the bytes of {range:?}");
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            let idle = getter.idle.lock();
            let super::Conn::Plain(tcp) = &idle[0].0 else {
                panic!("a plain connection");
            };
            let mut mark: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: a valid socket, and a c_int with its size for the answer.
            let r = unsafe {
                libc::getsockopt(
                    tcp.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_RCVLOWAT,
                    (&mut mark as *mut libc::c_int).cast(),
                    &mut len,
                )
            };
            assert_eq!((r, mark), (0, 1), "kept with the mark back at 1");
        }
    }
    assert!(seen.lock().iter().all(|(c, _)| *c == 0), "one connection");
}

/// A token from the source goes in every request's `Authorization` header.
#[tokio::test]
async fn sends_the_token() {
    let object = data(10, 1);
    let (endpoint, seen) = serve(vec![vec![Answer::Send(partial(&object, 0..10, ""), 64)]]).await;
    let token: TokenFn = Arc::new(|| Box::pin(async { Ok("Bearer abc".to_string()) }));
    let getter = RangeGetter::new(&endpoint, "bkt", Some(token)).unwrap();
    let pool = BufferPool::new(1 << 20);
    assert!(matches!(
        get(&getter, &pool, 0..10).await.unwrap(),
        Got::Filled(_)
    ));
    assert!(seen.lock()[0]
        .1
        .contains("\r\nAuthorization: Bearer abc\r\n"));
}

/// A connection the server closed while it sat idle is replaced without failing the request.
#[tokio::test]
async fn replaces_a_connection_closed_while_idle() {
    let object = data(5000, 3);
    let (endpoint, seen) = serve(vec![
        vec![Answer::Send(partial(&object, 0..5000, ""), 999)],
        vec![Answer::Send(partial(&object, 100..200, ""), 999)],
    ])
    .await;
    let getter = RangeGetter::new(&endpoint, "bkt", None).unwrap();
    let pool = BufferPool::new(1 << 20);
    assert!(matches!(
        get(&getter, &pool, 0..5000).await.unwrap(),
        Got::Filled(_)
    ));
    let Got::Filled(buf) = get(&getter, &pool, 100..200).await.unwrap() else {
        panic!("not taken");
    };
    assert_eq!(&buf.freeze()[..], &object[100..200]);
    let seen = seen.lock();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].0, 1, "the second request went on a new connection");
}

/// A connection the server said it would close (`Connection: close`, or HTTP/1.0) is not used
/// again; an interim `100 Continue` before the answer is skipped; a `200` for a range from
/// the start is taken.
#[tokio::test]
async fn follows_what_the_answer_says_of_its_connection() {
    let object = data(300, 4);
    let whole = |version: &str, extra: &str| {
        let mut r =
            format!("HTTP/{version} 200 OK\r\nContent-Length: 300\r\n{extra}\r\n").into_bytes();
        r.extend_from_slice(&object);
        r
    };
    let mut interim = b"HTTP/1.1 100 Continue\r\n\r\n".to_vec();
    interim.extend(partial(&object, 10..20, ""));
    let (endpoint, seen) = serve(vec![
        vec![
            Answer::Send(whole("1.1", "Connection: close\r\n"), 50),
            Answer::Send(whole("1.1", ""), 50),
        ],
        vec![
            Answer::Send(whole("1.0", ""), 50),
            Answer::Send(whole("1.1", ""), 50),
        ],
        vec![Answer::Send(interim, 7), Answer::Send(whole("1.1", ""), 50)],
    ])
    .await;
    let getter = RangeGetter::new(&endpoint, "bkt", None).unwrap();
    let pool = BufferPool::new(1 << 20);
    for _ in 0..2 {
        let Got::Filled(buf) = get(&getter, &pool, 0..300).await.unwrap() else {
            panic!("not taken");
        };
        assert_eq!(&buf.freeze()[..], &object[..]);
    }
    let Got::Filled(buf) = get(&getter, &pool, 10..20).await.unwrap() else {
        panic!("not taken");
    };
    assert_eq!(&buf.freeze()[..], &object[10..20]);
    let conns: Vec<usize> = seen.lock().iter().map(|(c, _)| *c).collect();
    assert_eq!(conns, vec![0, 1, 2], "a new connection each time");
}

/// A head that cannot be parsed is transient: a new connection may get a good one.
#[tokio::test]
async fn a_garbled_head_is_transient() {
    let (endpoint, _) = serve(vec![vec![Answer::Send(
        b"HTTP/1.1 2x6 Partial\r\n\r\n".to_vec(),
        64,
    )]])
    .await;
    let getter = RangeGetter::new(&endpoint, "bkt", None).unwrap();
    let pool = BufferPool::new(1 << 20);
    let Err(e) = get(&getter, &pool, 0..10).await else {
        panic!("a garbled answer taken");
    };
    assert_eq!(e.kind, StoreErrorKind::Transient, "{e}");
}

/// An answer that stops short is a transient failure (the caller retries), not a short range.
#[tokio::test]
async fn a_body_cut_short_is_transient() {
    let object = data(100_000, 5);
    let mut cut = partial(&object, 0..100_000, "");
    cut.truncate(cut.len() - 1);
    let (endpoint, _) = serve(vec![vec![Answer::SendAndClose(cut)]]).await;
    let getter = RangeGetter::new(&endpoint, "bkt", None).unwrap();
    let pool = BufferPool::new(1 << 20);
    let Err(e) = get(&getter, &pool, 0..100_000).await else {
        panic!("a short body taken");
    };
    assert_eq!(e.kind, StoreErrorKind::Transient, "{e}");
}

/// An error answer is classified by its status, with GCS's message.
#[tokio::test]
async fn an_error_answer_says_what_gcs_said() {
    let body = r#"{"error":{"code":404,"message":"No such object: bkt/x"}}"#;
    let answer = format!(
        "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let (endpoint, _) = serve(vec![vec![Answer::Send(answer.into_bytes(), 7)]]).await;
    let getter = RangeGetter::new(&endpoint, "bkt", None).unwrap();
    let pool = BufferPool::new(1 << 20);
    let Err(e) = get(&getter, &pool, 0..10).await else {
        panic!("an error taken as bytes");
    };
    assert_eq!(e.kind, StoreErrorKind::NotFound);
    assert!(e.message.contains("No such object"), "{e}");
}

/// Bytes other than the range asked for are never taken: another range, or an answer without
/// a length (which the client reads instead).
#[tokio::test]
async fn takes_only_the_range_asked_for() {
    let object = data(1000, 9);
    let chunked =
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n".to_vec();
    let whole = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789".to_vec();
    let (endpoint, _) = serve(vec![
        vec![Answer::Send(partial(&object, 0..10, ""), 100)],
        vec![Answer::Send(chunked, 100)],
        vec![Answer::Send(whole, 100)],
    ])
    .await;
    let getter = RangeGetter::new(&endpoint, "bkt", None).unwrap();
    let pool = BufferPool::new(1 << 20);
    let Err(e) = get(&getter, &pool, 10..20).await else {
        panic!("bytes 0-9 taken for 10-19");
    };
    assert_eq!(e.kind, StoreErrorKind::Transient, "{e}");
    assert!(matches!(
        get(&getter, &pool, 0..5).await.unwrap(),
        Got::Unsupported
    ));
    let Err(_) = get(&getter, &pool, 10..20).await else {
        panic!("a whole object taken for a range not at its start");
    };
}

/// A server that answers nothing fails the request once the read times out (time paused).
#[tokio::test(start_paused = true)]
async fn a_silent_server_times_out() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let hold = tokio::spawn(async move {
        let (_conn, _) = listener.accept().await.unwrap();
        std::future::pending::<()>().await;
    });
    let start = tokio::time::Instant::now();
    let getter = RangeGetter::new(&endpoint, "bkt", None).unwrap();
    let pool = BufferPool::new(1 << 20);
    let Err(e) = get(&getter, &pool, 0..10).await else {
        panic!("an answer from a silent server");
    };
    assert_eq!(e.kind, StoreErrorKind::Transient, "{e}");
    assert!(e.message.contains("timed out"), "{e}");
    assert!(start.elapsed() >= super::IO_TIMEOUT);
    hold.abort();
}

/// An endpoint that keeps answering without a length is left to the client: each such answer
/// costs a GET the client sends again.
#[tokio::test]
async fn an_endpoint_that_never_gives_a_length_is_left_to_the_client() {
    let chunked =
        b"HTTP/1.1 206 Partial Content\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
            .to_vec();
    let script = (0..super::UNSUPPORTED_LIMIT)
        .map(|_| vec![Answer::Send(chunked.clone(), 100)])
        .collect();
    let (endpoint, _) = serve(script).await;
    let getter = RangeGetter::new(&endpoint, "bkt", None).unwrap();
    let pool = BufferPool::new(1 << 20);
    for _ in 0..super::UNSUPPORTED_LIMIT {
        assert!(getter.in_use());
        assert!(matches!(
            get(&getter, &pool, 0..5).await.unwrap(),
            Got::Unsupported
        ));
    }
    assert!(!getter.in_use());
}

/// A handshake refused for the server's certificate is not retried, and says what to do; any
/// other handshake failure is transient.
#[test]
fn an_untrusted_certificate_is_said_and_not_retried() {
    let refused = std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
    );
    let e = super::tls_error("127.0.0.1:443", refused);
    assert_eq!(e.kind, StoreErrorKind::Other);
    assert!(
        e.message.contains("certificate is not trusted") && e.message.contains("SSL_CERT_FILE"),
        "{e}"
    );
    let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
    assert_eq!(
        super::tls_error("127.0.0.1:443", reset).kind,
        StoreErrorKind::Transient
    );
}

/// Over HTTPS, a TLS 1.3 server's records are carried by `tls_records`, a connection kept
/// for the next range; a TLS 1.2 server's first connection is given up after its handshake,
/// and from then on rustls carries the records. The bytes are exact either way.
#[tokio::test]
async fn reads_over_tls_13_in_place_and_tls_12_through_rustls() {
    super::super::tls::install_crypto_provider();
    let certs = tls_certs();
    let object = data(3 << 20, 21);
    let answers = vec![
        Answer::Send(partial(&object, 0..1_000_000, ""), 70_000),
        Answer::Send(partial(&object, 1_000_000..3 << 20, ""), 1 << 20),
    ];
    for (version, script, conn, records) in [
        (&rustls::version::TLS13, vec![answers.clone()], 0, true),
        (
            &rustls::version::TLS12,
            vec![vec![], answers.clone()],
            1,
            false,
        ),
    ] {
        let acceptor =
            tokio_rustls::TlsAcceptor::from(server_config(&certs, &[version], None, false));
        let (port, seen) = serve_with(script, Some(acceptor)).await;
        let getter = RangeGetter::trusting(
            &format!("https://localhost:{port}"),
            "b",
            None,
            Some(tls_roots(&certs)),
        )
        .unwrap();
        let pool = BufferPool::new(16 << 20);
        for range in [0..1_000_000u64, 1_000_000..3 << 20] {
            let Got::Filled(buf) = get(&getter, &pool, range.clone()).await.unwrap() else {
                panic!("not taken");
            };
            let want = &object[range.start as usize..range.end as usize];
            assert_eq!(buf.crc32c(), Some(crc32c::crc32c(want)));
            assert!(&buf.freeze()[..] == want, "{version:?}: bytes {range:?}");
        }
        let conns: Vec<usize> = seen.lock().iter().map(|(c, _)| *c).collect();
        assert_eq!(
            conns,
            vec![conn, conn],
            "{version:?}: both on one connection"
        );
        let carried = getter.tls.as_ref().unwrap().records.load(Ordering::Relaxed);
        assert_eq!(carried, records, "{version:?}");
    }
}

/// A read whose TLS records fail here (a bit changed on the way, on the first connection
/// only) fails that GET, as any broken stream does, and sends later connections through
/// rustls: the next GET reads the exact bytes.
#[tokio::test]
async fn a_record_layer_failure_sends_later_connections_through_rustls() {
    super::super::tls::install_crypto_provider();
    let certs = tls_certs();
    let object = data(1 << 20, 22);
    let answer = Answer::Send(partial(&object, 0..1 << 20, ""), 1 << 20);
    let acceptor = tokio_rustls::TlsAcceptor::from(server_config(
        &certs,
        &[&rustls::version::TLS13],
        None,
        false,
    ));
    let (port, seen) = serve_with(vec![vec![answer.clone()], vec![answer]], Some(acceptor)).await;
    let relay =
        super::super::tls_records::tests::corrupting_relay(format!("127.0.0.1:{port}"), 600 << 10)
            .await;
    let relay_port = relay.rsplit(':').next().unwrap();
    let getter = RangeGetter::trusting(
        &format!("https://localhost:{relay_port}"),
        "b",
        None,
        Some(tls_roots(&certs)),
    )
    .unwrap();
    let pool = BufferPool::new(16 << 20);
    let e = match get(&getter, &pool, 0..1 << 20).await {
        Err(e) => e,
        Ok(_) => panic!("a changed record was taken"),
    };
    assert_eq!(e.kind, StoreErrorKind::Transient, "{e}");
    let tls = getter.tls.as_ref().unwrap();
    assert!(
        !tls.records.load(Ordering::Relaxed),
        "through rustls from now on"
    );
    let Got::Filled(buf) = get(&getter, &pool, 0..1 << 20).await.unwrap() else {
        panic!("not taken");
    };
    assert_eq!(buf.crc32c(), Some(crc32c::crc32c(&object)));
    assert!(buf.freeze()[..] == object[..], "the bytes, through rustls");
    assert_eq!(seen.lock().len(), 2);
}
