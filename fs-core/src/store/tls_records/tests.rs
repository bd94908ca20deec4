//! The record layer against rustls's own server, in process: the bytes it reads must be the
//! bytes the server wrote, whatever the record sizes, the reads' sizes, key updates and session
//! tickets; a changed byte, a cut connection or an alert must fail the read, never pass on
//! bytes; and what it does not carry must be said so the caller can go through rustls.

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::server::ServerConfig;
use rustls::{ClientConfig, HandshakeKind, RootCertStore, SupportedProtocolVersion};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;

use super::{connect, Handshake, Records};

/// A self-signed certificate for `localhost` and its key.
pub(in crate::store) struct Certs {
    cert: CertificateDer<'static>,
    key: Vec<u8>,
}

pub(in crate::store) fn certs() -> Certs {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])
        .expect("a test certificate");
    Certs {
        cert: made.cert.der().clone(),
        key: made.signing_key.serialize_der(),
    }
}

fn provider(chacha_only: bool) -> rustls::crypto::CryptoProvider {
    let mut p = rustls::crypto::ring::default_provider();
    if chacha_only {
        p.cipher_suites.retain(|s| {
            s.suite() == rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256
                || s.suite() == rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
        });
    }
    p
}

pub(in crate::store) fn server_config(
    certs: &Certs,
    versions: &[&'static SupportedProtocolVersion],
    fragment: Option<usize>,
    chacha_only: bool,
) -> Arc<ServerConfig> {
    let mut config = ServerConfig::builder_with_provider(Arc::new(provider(chacha_only)))
        .with_protocol_versions(versions)
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![certs.cert.clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certs.key.clone())),
        )
        .expect("server config");
    config.max_fragment_size = fragment;
    Arc::new(config)
}

/// Roots that trust `certs` alone.
pub(in crate::store) fn roots(certs: &Certs) -> RootCertStore {
    let mut roots = RootCertStore::empty();
    roots.add(certs.cert.clone()).expect("root");
    roots
}

fn client_config(certs: &Certs) -> Arc<ClientConfig> {
    let roots = roots(certs);
    let mut config = ClientConfig::builder_with_provider(Arc::new(provider(false)))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.enable_secret_extraction = true;
    Arc::new(config)
}

/// A listener whose first connection is handed, after its handshake, to `serve`.
async fn server<F, Fut>(
    config: Arc<ServerConfig>,
    serve: F,
) -> (String, tokio::task::JoinHandle<Fut::Output>)
where
    F: FnOnce(TlsStream<TcpStream>) -> Fut + Send + 'static,
    Fut: std::future::Future + Send + 'static,
    Fut::Output: Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let task = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.expect("accept");
        let tls = acceptor.accept(tcp).await.expect("server handshake");
        serve(tls).await
    });
    (addr, task)
}

async fn client(addr: &str, config: Arc<ClientConfig>) -> std::io::Result<Handshake> {
    let tcp = TcpStream::connect(addr).await?;
    connect(
        tcp,
        config,
        ServerName::try_from("localhost").expect("name"),
    )
    .await
}

async fn records(addr: &str, config: Arc<ClientConfig>) -> Box<Records> {
    match client(addr, config).await.expect("client handshake") {
        Handshake::Records(r) => r,
        Handshake::NotOurs(what) => panic!("records not carried: {what}"),
    }
}

fn data(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A small deterministic generator for sizes.
struct Sizes(u64);

impl Sizes {
    fn next(&mut self, choices: &[usize]) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let pick = choices[(self.0 % choices.len() as u64) as usize];
        // Not a round number: records and reads then end anywhere.
        pick + (self.0 >> 32) as usize % (pick / 3 + 1)
    }
}

/// Reads `len` bytes with reads of varied sizes into buffers of varied sizes.
async fn read_varied(r: &mut Records, len: usize, seed: u64) -> std::io::Result<Vec<u8>> {
    let mut sizes = Sizes(seed | 1);
    let mut got = Vec::with_capacity(len);
    while got.len() < len {
        let want = sizes.next(&[1, 100, 8 << 10, 80 << 10, 300 << 10, 2 << 20]);
        let mut buf = vec![0u8; want.min(len - got.len()).max(1)];
        let n = r.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    Ok(got)
}

/// The request the client sends (larger than a record, so sealed as several), and the answer
/// the server writes in pieces of varied sizes, the records cut at `fragment`; with
/// `key_update`, the server changes its keys half-way.
async fn round_trip(seed: u64, fragment: Option<usize>, chacha: bool, key_update: bool) {
    let certs = certs();
    let request = data(40_000 + seed as usize, seed);
    let answer = data(3 << 20, seed + 1);
    let (req, ans) = (request.clone(), answer.clone());
    let config = server_config(&certs, &[&rustls::version::TLS13], fragment, chacha);
    let (addr, task) = server(config, move |mut tls| async move {
        let mut got = vec![0u8; req.len()];
        tls.read_exact(&mut got)
            .await
            .expect("server reads the request");
        assert!(got == req, "the request arrives exactly");
        let mut sizes = Sizes(seed.wrapping_add(7) | 1);
        let mut at = 0;
        while at < ans.len() {
            let n = sizes
                .next(&[10, 1000, 16 << 10, 100 << 10, 1 << 20])
                .min(ans.len() - at);
            tls.write_all(&ans[at..at + n])
                .await
                .expect("server writes");
            at += n;
            if key_update && at >= ans.len() / 2 && at - n < ans.len() / 2 {
                tls.get_mut().1.refresh_traffic_keys().expect("key update");
            }
            if n < 1000 {
                tls.flush().await.expect("flush");
            }
        }
        tls.flush().await.expect("flush");
        // Held open until the client has read it all.
        let mut rest = [0u8; 1];
        let _ = tls.read(&mut rest).await;
    })
    .await;
    let mut r = records(&addr, client_config(&certs)).await;
    r.write_all(&request).await.expect("client writes");
    r.flush().await.expect("client flushes");
    let got = read_varied(&mut r, answer.len(), seed)
        .await
        .expect("client reads");
    assert_eq!(got.len(), answer.len(), "every byte of the answer");
    assert!(got == answer, "the answer exactly (seed {seed})");
    assert_eq!(
        r.reusable(),
        !key_update,
        "a key update the server asked us for ends reuse"
    );
    if key_update {
        assert!(
            r.write_all(b"x").await.is_err(),
            "no data before the KeyUpdate owed"
        );
    }
    drop(r);
    task.await.expect("server");
}

#[tokio::test]
async fn bytes_arrive_exactly_whatever_the_records_and_the_reads() {
    for (seed, fragment) in [(1, None), (2, Some(512)), (3, Some(4096)), (4, Some(1500))] {
        round_trip(seed, fragment, false, false).await;
    }
}

#[tokio::test]
async fn chacha20_records_are_carried_too() {
    round_trip(5, None, true, false).await;
}

#[tokio::test]
async fn a_key_update_mid_answer_is_followed_and_ends_reuse() {
    round_trip(6, None, false, true).await;
    round_trip(7, Some(700), false, true).await;
}

/// rustls's server sends session tickets after the handshake: they arrive as records here and
/// are handed to rustls, so the next handshake with the same config resumes.
#[tokio::test]
async fn session_tickets_are_kept_for_the_next_handshake() {
    let certs = certs();
    let config = server_config(&certs, &[&rustls::version::TLS13], None, false);
    let client = client_config(&certs);
    for round in 0..2 {
        let (addr, task) = server(config.clone(), |mut tls| async move {
            tls.write_all(b"hello").await.expect("write");
            tls.flush().await.expect("flush");
            let kind = tls.get_ref().1.handshake_kind();
            let mut rest = [0u8; 1];
            let _ = tls.read(&mut rest).await;
            kind
        })
        .await;
        let mut r = records(&addr, client.clone()).await;
        let mut got = [0u8; 5];
        r.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"hello");
        // The tickets come after the handshake; a read after them makes sure they were seen.
        drop(r);
        let kind = task.await.expect("server");
        let want = if round == 0 {
            HandshakeKind::Full
        } else {
            HandshakeKind::Resumed
        };
        assert_eq!(kind, Some(want), "round {round}");
    }
}

#[tokio::test]
async fn close_notify_ends_the_answer_and_a_cut_fails_it() {
    let certs = certs();
    let body = data(100 << 10, 9);
    let b = body.clone();
    let config = server_config(&certs, &[&rustls::version::TLS13], None, false);
    let (addr, task) = server(config.clone(), move |mut tls| async move {
        tls.write_all(&b).await.expect("write");
        tls.shutdown().await.expect("close_notify");
    })
    .await;
    let mut r = records(&addr, client_config(&certs)).await;
    let mut got = Vec::new();
    r.read_to_end(&mut got).await.expect("a clean end");
    assert!(got == body, "all of it before the end");
    assert!(!r.reusable(), "a closed connection is not used again");
    task.await.expect("server");

    let b = body.clone();
    let (addr, task) = server(config, move |mut tls| async move {
        tls.write_all(&b[..50 << 10]).await.expect("write");
        tls.flush().await.expect("flush");
        // The socket closes with no close_notify.
        let (tcp, _) = tls.into_inner();
        drop(tcp);
    })
    .await;
    let mut r = records(&addr, client_config(&certs)).await;
    let mut got = Vec::new();
    let e = r
        .read_to_end(&mut got)
        .await
        .expect_err("a cut is an error");
    assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    assert!(
        got == body[..got.len()],
        "what came before the cut is exact"
    );
    task.await.expect("server");
}

/// A `close_notify` that came with an answer's last bytes, read in small pieces and so left
/// unopened, still keeps the connection from being used again.
#[tokio::test]
async fn a_close_notify_behind_the_last_bytes_ends_reuse() {
    let certs = certs();
    let body = data(20 << 10, 11);
    let b = body.clone();
    let config = server_config(&certs, &[&rustls::version::TLS13], None, false);
    let (addr, task) = server(config, move |mut tls| async move {
        tls.write_all(&b).await.expect("write");
        tls.shutdown().await.expect("close_notify");
    })
    .await;
    let mut r = records(&addr, client_config(&certs)).await;
    // Wait for both to be in the socket, so one small read takes them together.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let mut got = vec![0u8; body.len()];
    let mut at = 0;
    while at < got.len() {
        let end = (at + (8 << 10)).min(got.len());
        let n = r.read(&mut got[at..end]).await.expect("read");
        assert!(n > 0, "data before the end");
        at += n;
    }
    assert!(got == body);
    assert!(
        !r.reusable(),
        "the close_notify received with the data is seen"
    );
    task.await.expect("server");
}

/// A byte changed on the way fails the read at that record: the bytes passed on before the
/// error are exactly the answer's first bytes.
#[tokio::test]
async fn a_changed_byte_fails_the_read() {
    let certs = certs();
    let body = data(1 << 20, 10);
    let b = body.clone();
    let config = server_config(&certs, &[&rustls::version::TLS13], None, false);
    let (real, task) = server(config, move |mut tls| async move {
        let _ = tls.write_all(&b).await;
        let _ = tls.flush().await;
        let mut rest = [0u8; 1];
        let _ = tls.read(&mut rest).await;
    })
    .await;
    let relay_addr = corrupting_relay(real, 500 << 10).await;
    let mut r = records(&relay_addr, client_config(&certs)).await;
    let mut got = Vec::new();
    let e = r
        .read_to_end(&mut got)
        .await
        .expect_err("the changed record fails");
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
    assert!(
        got.len() < body.len() && got == body[..got.len()],
        "only exact bytes before it"
    );
    let again = r.read(&mut [0u8; 10]).await;
    assert!(again.is_err(), "the connection stays failed");
    drop(r);
    task.abort();
}

/// The server's alert fails the read: here rustls's server answers a record it cannot open
/// (sealed under the wrong sequence number) with `bad_record_mac`.
#[tokio::test]
async fn an_alert_fails_the_read() {
    let certs = certs();
    let config = server_config(&certs, &[&rustls::version::TLS13], None, false);
    let (addr, task) = server(config, move |mut tls| async move {
        let mut buf = [0u8; 16];
        let _ = tls.read(&mut buf).await;
        let _ = tls.flush().await;
    })
    .await;
    let mut r = records(&addr, client_config(&certs)).await;
    r.tx.seq += 1;
    r.write_all(b"a record sealed out of turn")
        .await
        .expect("write");
    r.flush().await.expect("flush");
    let mut got = Vec::new();
    let e = r
        .read_to_end(&mut got)
        .await
        .expect_err("an alert is an error");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionAborted, "{e}");
    assert!(e.to_string().contains("alert 20"), "bad_record_mac: {e}");
    assert!(got.is_empty());
    task.await.expect("server");
}

/// A server that negotiates TLS 1.2 is not carried here: the caller is told, to connect
/// through rustls instead.
#[tokio::test]
async fn tls12_is_left_to_rustls() {
    let certs = certs();
    let config = server_config(&certs, &[&rustls::version::TLS12], None, false);
    let (addr, task) = server(config, |_tls| async {}).await;
    match client(&addr, client_config(&certs))
        .await
        .expect("handshake")
    {
        Handshake::NotOurs(what) => assert!(what.contains("TLSv1_2"), "{what}"),
        Handshake::Records(_) => panic!("TLS 1.2 records carried"),
    }
    task.await.expect("server");
}

/// A certificate nobody vouches for fails the handshake with rustls's error inside, as
/// `tokio-rustls` gives it, so the store says what to do about it.
#[tokio::test]
async fn an_untrusted_certificate_is_rustls_error() {
    let certs = certs();
    let config = server_config(&certs, &[&rustls::version::TLS13], None, false);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let task = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.expect("accept");
        let _ = acceptor.accept(tcp).await;
    });
    let other = certs_other();
    let e = match client(&addr, client_config(&other)).await {
        Err(e) => e,
        Ok(_) => panic!("an untrusted certificate was taken"),
    };
    assert!(
        crate::store::gcs::certificate_error(&e).is_some(),
        "rustls's certificate error inside: {e}"
    );
    task.await.expect("server");
}

fn certs_other() -> Certs {
    certs()
}

/// A relay on loopback to `real`: on its first connection it flips one bit `at` bytes into what
/// the server sends; later connections pass through untouched. Returns its address.
pub(in crate::store) async fn corrupting_relay(real: String, at: usize) -> String {
    let relay = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = relay.local_addr().expect("addr").to_string();
    tokio::spawn(async move {
        for first in std::iter::once(true).chain(std::iter::repeat(false)) {
            let Ok((client_side, _)) = relay.accept().await else {
                return;
            };
            let Ok(server_side) = TcpStream::connect(&real).await else {
                return;
            };
            tokio::spawn(async move {
                let (mut cr, mut cw) = client_side.into_split();
                let (mut sr, mut sw) = server_side.into_split();
                let up = tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut cr, &mut sw).await;
                });
                let mut seen = 0usize;
                let mut buf = vec![0u8; 64 << 10];
                loop {
                    let n = match sr.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    if first && (seen..seen + n).contains(&at) {
                        buf[at - seen] ^= 0x20;
                    }
                    seen += n;
                    if cw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                up.abort();
            });
        }
    });
    addr
}
