//! TLS 1.3 records opened where they land: in the part's buffer.
//!
//! Over HTTPS, rustls received each record into a buffer of its own, decrypted it there, copied
//! the plaintext into a second buffer, and then copied it out to the reader: two copies of
//! every byte in user space, and one socket read per record (16 KiB), on top of the cipher
//! itself. Measured on a GiB read over loopback, carrying the records here took the daemon
//! from 0.95 to 0.59 CPU seconds (`benchmarks.md`, "TLS records opened in the part").
//!
//! So for the ranged GETs of the read path ([`super::range_get`]) rustls does the handshake
//! and keeps the secrets, and this module carries the records. rustls completes the handshake
//! (its unbuffered API: the bytes received stay in our buffer, and what follows the handshake
//! is ours to open, once any message rustls holds in part is whole), verifies the
//! certificate with the same verifier as ever, and hands over the traffic secrets and a
//! [`KernelConnection`], which derives the next keys on a `KeyUpdate` and keeps session
//! tickets for the next handshake. Then a read of the body takes the socket's bytes straight
//! into the caller's buffer, many records at a time, and opens each record there with ring's
//! AEAD, writing its plaintext over the record's own header and the tag before it: the
//! plaintext ends up packed at the front of the caller's buffer without a copy.
//!
//! What is ours, then, is the TLS 1.3 record layer (RFC 8446, section 5): the nonce (the
//! write IV XOR the record's sequence number), the header as the additional data, the inner
//! content type after the plaintext and the zero padding before it, and the limits on a
//! record's size. Of the other content types, a handshake record may carry session tickets
//! (handed to rustls) and a `KeyUpdate` (new keys from rustls; if the server asks for ours in
//! turn, the connection is not used for another request, as the RFC allows instead of
//! answering); an alert other than `close_notify` fails the read. Anything else fails the
//! connection. A connection is also not used again once it nears its cipher's limit of
//! records under one key.
//!
//! Only TLS 1.3 with an AEAD ring runs (AES-GCM, ChaCha20-Poly1305) is carried here. A server
//! that negotiates TLS 1.2 gets [`Handshake::NotOurs`], and the caller connects again through
//! `tokio-rustls`, for that connection and every later one. So does a server whose records
//! fail here once a connection is made (a record that fails its check, an alert): rustls
//! cannot hand over everything it may hold at the handover (a `KeyUpdate` it owes the server
//! is sent only with its next data), and whatever the cause, it must not fail every read.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Buf, BytesMut};
use ring::aead::{
    Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM, AES_256_GCM, CHACHA20_POLY1305,
};
use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::kernel::KernelConnection;
use rustls::pki_types::ServerName;
use rustls::unbuffered::{ConnectionState, EncodeError, UnbufferedStatus};
use rustls::{ClientConfig, ConnectionTrafficSecrets, SupportedCipherSuite};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

/// The most plaintext a record carries (2^14).
const MAX_PLAINTEXT: usize = 16 << 10;
/// The most a record's encrypted part may be (2^14 + 256).
const MAX_CIPHERTEXT: usize = MAX_PLAINTEXT + 256;
/// A record's header: type, legacy version, length.
const HEADER: usize = 5;
/// The AEAD tag after each record's ciphertext.
const TAG: usize = 16;
/// The least a reader's buffer must have free, beyond the bytes of a record already received,
/// for the socket's bytes to go straight into it; a smaller read goes through [`Records::raw`]
/// and is copied out.
const DIRECT_MIN: usize = 64 << 10;
/// How much a read into [`Records::raw`] takes at most.
const RAW_READ: usize = 32 << 10;
/// Handshake bytes kept while a message after the handshake is incomplete.
const MAX_HANDSHAKE: usize = 64 << 10;
/// The most the handshake's flight may take to arrive whole: rustls takes handshake messages
/// of up to 64 KiB (a long certificate chain), with their records' overhead.
const MAX_FLIGHT: usize = 256 << 10;
/// The most body bytes this layer holds between reads, received from the socket but not yet
/// read out: a partial record and one read into [`Records::raw`] (opened records' data in
/// [`Records::plain`] came out of `raw`, which is read again only once `plain` is empty).
/// The receive mark of [`super::range_get`] stays this far below the body's remaining bytes.
pub(super) const MOST_HELD: usize = HEADER + MAX_CIPHERTEXT - 1 + RAW_READ;

/// How long the rest of a handshake message rustls holds in part may take to come.
const HELD_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// Content types (RFC 8446, section 5.1).
const ALERT: u8 = 21;
const HANDSHAKE: u8 = 22;
const APPLICATION_DATA: u8 = 23;
/// Handshake message types that may follow the handshake (section 4.6).
const NEW_SESSION_TICKET: u8 = 4;
const KEY_UPDATE: u8 = 24;

/// How a handshake ended.
pub(super) enum Handshake {
    /// TLS 1.3 with a cipher carried here.
    Records(Box<Records>),
    /// Anything else (TLS 1.2, say, or a server that sends data before it is asked): the
    /// caller connects through `tokio-rustls` instead.
    NotOurs(String),
}

/// Runs the handshake on `tcp` through rustls (which must have `enable_secret_extraction`),
/// then takes the connection's records over if they are TLS 1.3. An error is rustls's, in an
/// `io::Error` of kind `InvalidData` as `tokio-rustls` gives it, so a certificate error is
/// found the same way.
pub(super) async fn connect(
    mut tcp: TcpStream,
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
) -> io::Result<Handshake> {
    let mut conn = UnbufferedClientConnection::new(config, name).map_err(invalid)?;
    let mut incoming = vec![0u8; RAW_READ];
    let mut received = 0;
    let mut outgoing = vec![0u8; 4 << 10];
    let mut encoded = 0;
    loop {
        let UnbufferedStatus { discard, state } =
            conn.process_tls_records(&mut incoming[..received]);
        let done = match state.map_err(invalid)? {
            ConnectionState::EncodeTlsData(mut data) => {
                loop {
                    match data.encode(&mut outgoing[encoded..]) {
                        Ok(n) => {
                            encoded += n;
                            break;
                        }
                        Err(EncodeError::InsufficientSize(e)) => {
                            outgoing.resize(encoded + e.required_size, 0);
                        }
                        Err(e) => return Err(invalid(e)),
                    }
                }
                false
            }
            ConnectionState::TransmitTlsData(data) => {
                tcp.write_all(&outgoing[..encoded]).await?;
                encoded = 0;
                data.done();
                false
            }
            ConnectionState::BlockedHandshake => {
                receive(&mut tcp, &mut incoming, &mut received).await?;
                false
            }
            ConnectionState::WriteTraffic(_) => true,
            ConnectionState::PeerClosed | ConnectionState::Closed => {
                return Err(closed_in_handshake())
            }
            other => return Ok(Handshake::NotOurs(format!("{other:?} in the handshake"))),
        };
        if discard > 0 {
            incoming.copy_within(discard..received, 0);
            received -= discard;
        }
        if done {
            // rustls has opened every whole record it was given before it says the handshake
            // is done, so a whole record still here is one it keeps: the first part of a
            // handshake message (a session ticket) whose rest is in the next record. Its
            // bytes are opened already, and would not open again here; the rest is on its
            // way, so it is received and given to rustls first.
            // A server that sent nothing after it (an empty handshake record, which the RFC
            // forbids and rustls lets by) is left to rustls rather than waited for.
            if !matches!(record_len(&incoming[..received]), Ok(Some(_))) {
                break;
            }
            let more = receive(&mut tcp, &mut incoming, &mut received);
            match tokio::time::timeout(HELD_PATIENCE, more).await {
                Ok(more) => more?,
                Err(_) => {
                    return Ok(Handshake::NotOurs(
                        "a handshake record held with nothing after it".into(),
                    ))
                }
            }
        }
    }
    if encoded > 0 {
        tcp.write_all(&outgoing[..encoded]).await?;
    }
    let (secrets, kernel) = match conn.dangerous_into_kernel_connection() {
        Ok(taken) => taken,
        Err(e) => return Ok(Handshake::NotOurs(format!("secrets not handed over: {e}"))),
    };
    // A TLS 1.3 suite is a TLS 1.3 connection; anything else is left to rustls.
    let limit = match kernel.negotiated_cipher_suite() {
        SupportedCipherSuite::Tls13(suite) => suite.common.confidentiality_limit,
        #[allow(unreachable_patterns)]
        _ => {
            return Ok(Handshake::NotOurs(format!(
                "{:?}",
                kernel.protocol_version()
            )))
        }
    };
    let (Some(rx), Some(tx)) = (Cipher::new(secrets.rx), Cipher::new(secrets.tx)) else {
        return Ok(Handshake::NotOurs("a cipher not carried here".into()));
    };
    Ok(Handshake::Records(Box::new(Records {
        tcp,
        kernel,
        rx,
        tx,
        limit,
        raw: BytesMut::from(&incoming[..received]),
        plain: BytesMut::new(),
        handshake: Vec::new(),
        out: BytesMut::new(),
        closed: false,
        broken: false,
        answer_key_update: false,
    })))
}

/// Receives more of the handshake's flight after the `received` bytes of `incoming`.
async fn receive(
    tcp: &mut TcpStream,
    incoming: &mut Vec<u8>,
    received: &mut usize,
) -> io::Result<()> {
    if *received == incoming.len() {
        if incoming.len() >= MAX_FLIGHT {
            return Err(invalid("the server's handshake messages are too long"));
        }
        incoming.resize(incoming.len() * 2, 0);
    }
    let n = tcp.read(&mut incoming[*received..]).await?;
    if n == 0 {
        return Err(closed_in_handshake());
    }
    *received += n;
    Ok(())
}

fn closed_in_handshake() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the server closed the connection during the TLS handshake",
    )
}

fn invalid(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// One direction's key, IV and record count.
struct Cipher {
    key: LessSafeKey,
    iv: [u8; 12],
    seq: u64,
}

impl Cipher {
    /// `None` for a cipher ring does not run here.
    fn new((seq, secrets): (u64, ConnectionTrafficSecrets)) -> Option<Cipher> {
        let (alg, key, iv) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&AES_128_GCM, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&AES_256_GCM, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (&CHACHA20_POLY1305, key, iv),
            _ => return None,
        };
        let key = LessSafeKey::new(UnboundKey::new(alg, key.as_ref()).ok()?);
        let iv = iv.as_ref().try_into().ok()?;
        Some(Cipher { key, iv, seq })
    }

    /// The next record's nonce (section 5.3), and the count moved on.
    fn next_nonce(&mut self) -> io::Result<Nonce> {
        let mut nonce = self.iv;
        for (n, s) in nonce[4..].iter_mut().zip(self.seq.to_be_bytes()) {
            *n ^= s;
        }
        self.seq = self
            .seq
            .checked_add(1)
            .ok_or_else(|| invalid("TLS record sequence number exhausted"))?;
        Ok(Nonce::assume_unique_for_key(nonce))
    }
}

/// A TLS 1.3 connection whose records are carried here.
pub(super) struct Records {
    tcp: TcpStream,
    kernel: KernelConnection<ClientConnectionData>,
    rx: Cipher,
    tx: Cipher,
    /// Records under one key before the connection is not used again.
    limit: u64,
    /// Bytes received and not yet opened, from a record's start: whole records, the last one
    /// perhaps partial. Only what a small read left, or what the handshake did.
    raw: BytesMut,
    /// Application data opened and not yet read out, when the reader's buffer was small.
    plain: BytesMut,
    /// A handshake message received in part.
    handshake: Vec<u8>,
    /// Sealed records not yet written.
    out: BytesMut,
    /// The server sent `close_notify`: reads return end of file.
    closed: bool,
    /// A read failed: the connection's state is lost and every read fails.
    broken: bool,
    /// The server asked for a `KeyUpdate` of ours, which is not sent: no more requests.
    answer_key_update: bool,
}

impl Records {
    /// The socket, for its options.
    #[cfg(unix)]
    pub(super) fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    /// Whether another request may be sent on this connection, once its answer is read. Whole
    /// records received after the answer are opened first: a `close_notify`, or a `KeyUpdate`
    /// that asks for ours, may have come with the answer's last bytes; data is more than the
    /// answer had, and the stream is out of step.
    pub(super) fn reusable(&mut self) -> bool {
        while !self.closed && !self.broken && self.plain.is_empty() {
            match record_len(&self.raw) {
                Ok(Some(len)) => {
                    if self.open_raw(len).is_err() {
                        self.broken = true;
                    }
                }
                Ok(None) => break,
                Err(_) => self.broken = true,
            }
        }
        self.plain.is_empty()
            && !self.closed
            && !self.broken
            && !self.answer_key_update
            && self.rx.seq < self.limit / 2
            && self.tx.seq < self.limit / 2
    }

    /// Opens the whole record of `len` bytes at the start of `raw`, where it is, its data
    /// moved to `plain`.
    fn open_raw(&mut self, len: usize) -> io::Result<()> {
        let mut raw = std::mem::take(&mut self.raw);
        let opened = self.open(&mut raw, 0..len, 0);
        if let Ok(n) = opened {
            self.plain.extend_from_slice(&raw[..n]);
            raw.advance(len);
        }
        self.raw = raw;
        opened.map(|_| ())
    }

    /// Opens the record at `buf[record]` (whole, header included), its plaintext written to
    /// `buf[to..]` (`to` at most the record's start), and handles it unless it is application
    /// data: returns the application data's length, 0 for any other type.
    fn open(
        &mut self,
        buf: &mut [u8],
        record: std::ops::Range<usize>,
        to: usize,
    ) -> io::Result<usize> {
        let mut header = [0u8; HEADER];
        header.copy_from_slice(&buf[record.start..record.start + HEADER]);
        let nonce = self.rx.next_nonce()?;
        let opened = self
            .rx
            .key
            .open_within(
                nonce,
                Aad::from(header),
                &mut buf[to..record.end],
                record.start + HEADER - to..,
            )
            .map_err(|_| invalid("a TLS record failed its integrity check"))?;
        // The inner content type is the last byte not zero; zeros after it are padding.
        let Some(end) = opened.iter().rposition(|&b| b != 0) else {
            return Err(invalid("a TLS record without a content type"));
        };
        // Data, content type and padding together (section 5.4).
        if opened.len() > MAX_PLAINTEXT + 1 {
            return Err(invalid("a TLS record longer than allowed"));
        }
        let plaintext = &opened[..end];
        let typ = opened[end];
        // A handshake message in parts comes in records of its own, one after another.
        if typ != HANDSHAKE && !self.handshake.is_empty() {
            return Err(invalid("a TLS handshake message broken by another record"));
        }
        match typ {
            APPLICATION_DATA => Ok(end),
            HANDSHAKE => self.handshake(plaintext).map(|()| 0),
            ALERT => self.alert(plaintext).map(|()| 0),
            t => Err(invalid(format!("a TLS record of content type {t}"))),
        }
    }

    /// Handshake messages after the handshake: session tickets and key updates.
    fn handshake(&mut self, bytes: &[u8]) -> io::Result<()> {
        if bytes.is_empty() {
            return Err(invalid("an empty TLS handshake record"));
        }
        self.handshake.extend_from_slice(bytes);
        while let &[typ, a, b, c, ..] = self.handshake.as_slice() {
            let len = u32::from_be_bytes([0, a, b, c]) as usize;
            if self.handshake.len() < 4 + len {
                if 4 + len > MAX_HANDSHAKE {
                    return Err(invalid("a TLS handshake message too long"));
                }
                break;
            }
            let body: Vec<u8> = self.handshake.drain(..4 + len).skip(4).collect();
            match typ {
                NEW_SESSION_TICKET => {
                    // A ticket only makes the next handshake shorter; one that cannot be kept
                    // costs nothing else.
                    if let Err(e) = self.kernel.handle_new_session_ticket(&body) {
                        tracing::debug!("TLS session ticket not kept: {e}");
                    }
                }
                KEY_UPDATE => {
                    // The new key applies from the next record, so the update must end its
                    // record (section 5.1).
                    if !self.handshake.is_empty() {
                        return Err(invalid("a TLS KeyUpdate not at the end of its record"));
                    }
                    match body.as_slice() {
                        [0] => {}
                        [1] => self.answer_key_update = true,
                        _ => return Err(invalid("a TLS KeyUpdate not understood")),
                    }
                    let secrets = self.kernel.update_rx_secret().map_err(invalid)?;
                    self.rx = Cipher::new(secrets)
                        .ok_or_else(|| invalid("a TLS KeyUpdate to a cipher not carried here"))?;
                }
                t => return Err(invalid(format!("a TLS handshake message of type {t}"))),
            }
        }
        Ok(())
    }

    fn alert(&mut self, bytes: &[u8]) -> io::Result<()> {
        match bytes {
            // close_notify: no more data comes.
            [_, 0] => {
                self.closed = true;
                Ok(())
            }
            // user_canceled comes before a close_notify.
            [_, 90] => Ok(()),
            [_, description] => Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                format!("the server sent TLS alert {description}"),
            )),
            _ => Err(invalid("a TLS alert not understood")),
        }
    }

    /// Opens every whole record in `buf[..end]`, packing their application data at its front:
    /// returns that data's length and where the bytes of a partial record start.
    fn open_all(&mut self, buf: &mut [u8], end: usize) -> io::Result<(usize, usize)> {
        let mut packed = 0;
        let mut at = 0;
        while let Some(len) = record_len(&buf[at..end])? {
            let n = self.open(buf, at..at + len, packed)?;
            packed += n;
            at += len;
            if self.closed {
                // Nothing after close_notify is read.
                return Ok((packed, end));
            }
        }
        Ok((packed, at))
    }

    /// One step of a read into `dst`; `Ready(Ok(true))` once it has data or reached the end.
    fn read_step(&mut self, cx: &mut Context<'_>, dst: &mut ReadBuf<'_>) -> Poll<io::Result<bool>> {
        if !self.plain.is_empty() {
            let n = dst.remaining().min(self.plain.len());
            dst.put_slice(&self.plain[..n]);
            self.plain.advance(n);
            return Poll::Ready(Ok(true));
        }
        if self.closed || dst.remaining() == 0 {
            return Poll::Ready(Ok(true));
        }
        let pending = self.raw.len();
        let whole = record_len(&self.raw)?;
        if dst.remaining() >= pending + DIRECT_MIN {
            // Into the reader's buffer: what is held first, then the socket's bytes after it.
            let buf = dst.initialize_unfilled();
            buf[..pending].copy_from_slice(&self.raw);
            let mut end = pending;
            if whole.is_none() {
                let mut read = ReadBuf::new(&mut buf[pending..]);
                ready!(Pin::new(&mut self.tcp).poll_read(cx, &mut read))?;
                let n = read.filled().len();
                if n == 0 {
                    return Poll::Ready(Err(eof()));
                }
                end += n;
            }
            self.raw.clear();
            let (packed, partial) = self.open_all(buf, end)?;
            self.raw.extend_from_slice(&buf[partial..end]);
            dst.advance(packed);
            return Poll::Ready(Ok(packed > 0));
        }
        if let Some(len) = whole {
            // A small read: open one record where it was received, and copy its data out.
            self.open_raw(len)?;
            return Poll::Ready(Ok(false));
        }
        // Part of a record only, and a small buffer: receive into `raw`.
        let held = self.raw.len();
        self.raw.resize(held + RAW_READ, 0);
        let mut read = ReadBuf::new(&mut self.raw[held..]);
        let polled = Pin::new(&mut self.tcp).poll_read(cx, &mut read);
        let n = read.filled().len();
        self.raw.truncate(held + n);
        ready!(polled)?;
        if n == 0 {
            return Poll::Ready(Err(eof()));
        }
        Poll::Ready(Ok(false))
    }

    /// Writes sealed records not yet written.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.out.is_empty() {
            let n = ready!(Pin::new(&mut self.tcp).poll_write(cx, &self.out))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.out.advance(n);
        }
        Poll::Ready(Ok(()))
    }

    /// Seals `data` (at most a record's worth) as one application data record into `out`.
    fn seal(&mut self, data: &[u8]) -> io::Result<()> {
        if self.tx.seq >= self.limit {
            return Err(invalid("TLS record limit for this key reached"));
        }
        let len = data.len() + 1 + TAG;
        let header = [APPLICATION_DATA, 3, 3, (len >> 8) as u8, len as u8];
        let nonce = self.tx.next_nonce()?;
        let start = self.out.len();
        self.out.extend_from_slice(&header);
        self.out.extend_from_slice(data);
        self.out.extend_from_slice(&[APPLICATION_DATA]);
        let tag = self
            .tx
            .key
            .seal_in_place_separate_tag(nonce, Aad::from(header), &mut self.out[start + HEADER..])
            .map_err(|_| invalid("sealing a TLS record failed"))?;
        self.out.extend_from_slice(tag.as_ref());
        Ok(())
    }
}

/// The length of the record at the start of `bytes`, header included, if it is all there.
fn record_len(bytes: &[u8]) -> io::Result<Option<usize>> {
    let &[typ, major, _, a, b, ..] = bytes else {
        return Ok(None);
    };
    if typ != APPLICATION_DATA || major != 3 {
        return Err(invalid(format!(
            "a TLS record of outer type {typ} after the handshake"
        )));
    }
    let len = usize::from(u16::from_be_bytes([a, b]));
    if !(TAG + 1..=MAX_CIPHERTEXT).contains(&len) {
        return Err(invalid(format!("a TLS record of {len} bytes")));
    }
    Ok((bytes.len() >= HEADER + len).then_some(HEADER + len))
}

fn eof() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the server closed the connection without a TLS close_notify",
    )
}

impl AsyncRead for Records {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        dst: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.broken {
            return Poll::Ready(Err(invalid("the TLS connection failed before")));
        }
        loop {
            match this.read_step(cx, dst) {
                Poll::Ready(Ok(true)) => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(false)) => continue,
                Poll::Ready(Err(e)) => {
                    this.broken = true;
                    return Poll::Ready(Err(e));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl AsyncWrite for Records {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        // The server asked for our KeyUpdate, which must come before any more of our data.
        if this.answer_key_update {
            return Poll::Ready(Err(invalid("a TLS KeyUpdate is owed before more data")));
        }
        ready!(this.poll_drain(cx))?;
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let n = data.len().min(MAX_PLAINTEXT);
        this.seal(&data[..n])?;
        // Sent now if the socket takes it; otherwise by the next write or the flush.
        if let Poll::Ready(Err(e)) = this.poll_drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
pub(super) mod tests;
