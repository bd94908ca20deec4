//! Generation preconditions, enforced by the proxy where the emulator does not enforce them.
//!
//! [`parse_request_line`] reads the method and target of a request; [`classify`] recognises a
//! write to one object (a compose, a copy or rewrite to a destination, an upload whose object
//! name is in the query, a delete, a metadata update) and the `ifGenerationMatch` and
//! `ifGenerationNotMatch` it carries; [`current_generation`] asks the upstream for the
//! object's generation; [`Locks`] serialises the writes to one object name.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::OwnedMutexGuard;

/// How long the side request for an object's generation may take.
const LOOKUP_LIMIT: Duration = Duration::from_secs(10);
/// The most a generation lookup's answer may hold.
const LOOKUP_MAX: usize = 1024 * 1024;

/// The request line of an HTTP request: its method, its decoded-later path and its query.
#[derive(Debug, PartialEq)]
pub struct RequestLine {
    pub method: String,
    /// The path as sent, still percent-encoded.
    pub path: String,
    /// The query's parameters, decoded.
    pub query: Vec<(String, String)>,
}

impl RequestLine {
    fn param(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses the first line of `head` (`METHOD TARGET HTTP/1.x`); `None` if it is not one (or
/// not complete yet).
pub fn parse_request_line(head: &[u8]) -> Option<RequestLine> {
    let end = head.windows(2).position(|w| w == b"\r\n")?;
    let line = std::str::from_utf8(&head[..end]).ok()?;
    let mut parts = line.split(' ');
    let method = parts.next()?;
    let target = parts.next()?;
    let version = parts.next()?;
    if parts.next().is_some()
        || method.is_empty()
        || !method.bytes().all(|b| b.is_ascii_uppercase())
        || !version.starts_with("HTTP/")
        || !target.starts_with('/')
    {
        return None;
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let query = query
        .split('&')
        .filter(|p| !p.is_empty())
        .filter_map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            Some((decode(k, true)?, decode(v, true)?))
        })
        .collect();
    Some(RequestLine {
        method: method.to_string(),
        path: path.to_string(),
        query,
    })
}

/// Whether `bytes` begin like an HTTP request line.
pub fn looks_like_request(bytes: &[u8]) -> bool {
    const METHODS: [&[u8]; 7] = [
        b"GET /",
        b"POST /",
        b"PUT /",
        b"PATCH /",
        b"DELETE /",
        b"HEAD /",
        b"OPTIONS /",
    ];
    METHODS.iter().any(|m| bytes.starts_with(m))
}

/// Percent-decodes `s` (and, in a query, `+` as a space); `None` unless it decodes to UTF-8.
fn decode(s: &str, query: bool) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' {
            if let (Some(&h), Some(&l)) = (b.get(i + 1), b.get(i + 2)) {
                if let (Some(h), Some(l)) = (hex(h), hex(l)) {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
            }
        }
        out.push(if query && b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// Percent-encodes `s` for one URL path segment.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The generation conditions of a write; a generation of 0 stands for "no live object".
#[derive(Debug, Default, PartialEq, Clone, Copy)]
pub struct Condition {
    pub if_generation_match: Option<u64>,
    pub if_generation_not_match: Option<u64>,
}

impl Condition {
    /// Whether the conditions hold for an object whose generation is `current` (`None`: there
    /// is no such object).
    pub fn holds(&self, current: Option<u64>) -> bool {
        let is = |g: u64| match current {
            None => g == 0,
            Some(c) => g != 0 && c == g,
        };
        // `ifGenerationNotMatch=0` asks for a live object of any generation.
        let is_not = |g: u64| match current {
            None => g != 0,
            Some(c) => c != g,
        };
        self.if_generation_match.is_none_or(is) && self.if_generation_not_match.is_none_or(is_not)
    }
}

/// A write to one object that the proxy recognises.
#[derive(Debug, PartialEq)]
pub struct Write {
    pub bucket: String,
    pub name: String,
    /// The conditions to enforce; `None` when the request carries none (it is only
    /// serialised).
    pub condition: Option<Condition>,
}

/// Recognises a write to one object: which object, and the conditions it carries. A request
/// whose object name is not in its request line (a multipart upload or a resumable session
/// that names the object only in its body, a resumable upload's chunks) is not recognised.
pub fn classify(req: &RequestLine) -> Option<Write> {
    let (bucket, name) = if let Some(rest) = req.path.strip_prefix("/upload/storage/v1/b/") {
        // An upload, or the start of a resumable session, naming its object in the query.
        let bucket = rest.strip_suffix("/o")?;
        if req.method != "POST" || bucket.contains('/') || req.param("upload_id").is_some() {
            return None;
        }
        (decode(bucket, false)?, req.param("name")?.to_string())
    } else {
        let rest = req.path.strip_prefix("/storage/v1/b/")?;
        let (bucket, object) = rest.split_once("/o/")?;
        if bucket.contains('/') {
            return None;
        }
        let copy = ["/copyTo/b/", "/rewriteTo/b/"]
            .iter()
            .find_map(|verb| object.split_once(verb));
        match (req.method.as_str(), copy) {
            ("POST", Some((_source, dest))) => {
                let (bucket, name) = dest.split_once("/o/")?;
                (decode(bucket, false)?, decode(name, false)?)
            }
            ("POST", None) => (
                decode(bucket, false)?,
                decode(object.strip_suffix("/compose")?, false)?,
            ),
            ("DELETE" | "PATCH" | "PUT", None) => (decode(bucket, false)?, decode(object, false)?),
            _ => return None,
        }
    };
    if name.is_empty() {
        return None;
    }
    let number = |key: &str| req.param(key).and_then(|v| v.parse::<u64>().ok());
    let condition = Condition {
        if_generation_match: number("ifGenerationMatch"),
        if_generation_not_match: number("ifGenerationNotMatch"),
    };
    Some(Write {
        bucket,
        name,
        condition: (condition != Condition::default()).then_some(condition),
    })
}

/// The current generation of `bucket/name`, asked of the upstream with a side request;
/// `None` if there is no such object.
pub async fn current_generation(
    upstream: SocketAddr,
    bucket: &str,
    name: &str,
) -> Result<Option<u64>, String> {
    let ask = async {
        let mut s = TcpStream::connect(upstream)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        // HTTP/1.0: the answer is not chunked and ends when the server closes.
        let req = format!(
            "GET /storage/v1/b/{}/o/{}?fields=generation HTTP/1.0\r\nHost: {upstream}\r\n\
             Accept: application/json\r\n\r\n",
            encode(bucket),
            encode(name)
        );
        s.write_all(req.as_bytes())
            .await
            .map_err(|e| format!("send: {e}"))?;
        let mut resp = Vec::new();
        (&mut s)
            .take(LOOKUP_MAX as u64)
            .read_to_end(&mut resp)
            .await
            .map_err(|e| format!("read: {e}"))?;
        Ok::<_, String>(resp)
    };
    let resp = tokio::time::timeout(LOOKUP_LIMIT, ask)
        .await
        .map_err(|_| format!("no answer within {LOOKUP_LIMIT:?}"))??;
    let split = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("an answer without a header end")?;
    let head = String::from_utf8_lossy(&resp[..split]);
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| format!("a malformed status line: {head:?}"))?;
    match status {
        404 => Ok(None),
        200 => {
            let body: serde_json::Value = serde_json::from_slice(&resp[split + 4..])
                .map_err(|e| format!("an object resource that is not JSON: {e}"))?;
            let generation = match &body["generation"] {
                serde_json::Value::String(s) => s.parse::<u64>().ok(),
                serde_json::Value::Number(n) => n.as_u64(),
                _ => None,
            };
            generation
                .map(Some)
                .ok_or_else(|| format!("an object resource without a generation: {body}"))
        }
        other => Err(format!("status {other} for the object resource")),
    }
}

/// One lock per object name: a write waits until the previous write to the same name has
/// been answered.
#[derive(Default)]
pub struct Locks {
    by_key: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Locks {
    /// Waits for the lock of `key`; it is held until the guard is dropped.
    pub async fn lock(&self, key: String) -> OwnedMutexGuard<()> {
        let lock = {
            let mut map = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
            if map.len() > 1024 {
                // Forget the locks nobody holds or waits for.
                map.retain(|_, l| Arc::strong_count(l) > 1);
            }
            map.entry(key).or_default().clone()
        };
        lock.lock_owned().await
    }
}

/// The proxy's answer to a write whose conditions do not hold, in the shape of GCS's.
pub fn precondition_failed() -> Vec<u8> {
    let body = r#"{"error":{"code":412,"message":"conditionNotMet","errors":[{"domain":"global","reason":"conditionNotMet","message":"At least one of the pre-conditions you specified did not hold.","locationType":"header","location":"If-Match"}]}}"#;
    format!(
        "HTTP/1.1 412 Precondition Failed\r\nContent-Type: application/json; charset=UTF-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(line: &str) -> Option<Write> {
        classify(&parse_request_line(
            format!("{line}\r\nHost: x\r\n").as_bytes(),
        )?)
    }

    fn cond(m: Option<u64>, n: Option<u64>) -> Option<Condition> {
        Some(Condition {
            if_generation_match: m,
            if_generation_not_match: n,
        })
    }

    #[test]
    fn request_lines_are_parsed_and_decoded() {
        let r = parse_request_line(b"POST /a%20b?name=x+y%2Fz&k HTTP/1.1\r\n").unwrap();
        assert_eq!(r.method, "POST");
        assert_eq!(r.path, "/a%20b");
        assert_eq!(
            r.query,
            vec![("name".into(), "x y/z".into()), ("k".into(), "".into())]
        );
        assert!(
            parse_request_line(b"POST /a HTTP/1.1").is_none(),
            "incomplete"
        );
        assert!(parse_request_line(b"\x00\x01 junk\r\n").is_none());
        assert!(parse_request_line(b"post /a HTTP/1.1\r\n").is_none());
    }

    #[test]
    fn writes_are_recognised_with_their_object_and_conditions() {
        let w = write("POST /storage/v1/b/bk/o/dir%2Ff%20g/compose?ifGenerationMatch=0 HTTP/1.1");
        assert_eq!(
            w,
            Some(Write {
                bucket: "bk".into(),
                name: "dir/f g".into(),
                condition: cond(Some(0), None),
            })
        );
        let w = write("POST /upload/storage/v1/b/bk/o?uploadType=media&name=a%2Fb&ifGenerationNotMatch=7 HTTP/1.1").unwrap();
        assert_eq!((w.name.as_str(), w.condition), ("a/b", cond(None, Some(7))));
        let w =
            write("POST /storage/v1/b/bk/o/src/copyTo/b/b2/o/d%2Fst?ifGenerationMatch=3 HTTP/1.1")
                .unwrap();
        assert_eq!(
            (w.bucket.as_str(), w.name.as_str(), w.condition),
            ("b2", "d/st", cond(Some(3), None))
        );
        let w = write("DELETE /storage/v1/b/bk/o/x HTTP/1.1").unwrap();
        assert_eq!((w.name.as_str(), w.condition), ("x", None));
        // Reads, listings, resumable chunks and uploads naming the object in the body are not.
        assert_eq!(
            write("GET /storage/v1/b/bk/o/x?ifGenerationMatch=1 HTTP/1.1"),
            None
        );
        assert_eq!(write("GET /storage/v1/b/bk/o HTTP/1.1"), None);
        assert_eq!(
            write("PUT /upload/storage/v1/b/bk/o?uploadType=resumable&upload_id=u HTTP/1.1"),
            None
        );
        assert_eq!(
            write("POST /upload/storage/v1/b/bk/o?uploadType=multipart HTTP/1.1"),
            None
        );
    }

    #[test]
    fn conditions_hold_as_in_gcs() {
        let m = |g| Condition {
            if_generation_match: Some(g),
            if_generation_not_match: None,
        };
        let n = |g| Condition {
            if_generation_match: None,
            if_generation_not_match: Some(g),
        };
        assert!(m(0).holds(None));
        assert!(!m(0).holds(Some(5)));
        assert!(m(5).holds(Some(5)));
        assert!(!m(5).holds(Some(6)));
        assert!(!m(5).holds(None));
        assert!(n(5).holds(Some(6)));
        assert!(n(5).holds(None));
        assert!(!n(5).holds(Some(5)));
        assert!(n(0).holds(Some(5)));
        assert!(!n(0).holds(None));
    }
}
