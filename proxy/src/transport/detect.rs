//! Protocol detection on the first bytes of a connection.
//!
//! The HTTP/2 preface means HTTP/2; a well-formed HTTP/1.x request line (checked by `httparse`)
//! means HTTP/1; anything else is opaque TCP, forwarded with the bytes already read. A client
//! that says nothing decisive within the detect timeout (silent, or dribbling a request line from
//! its first byte) is an error, not opaque: forwarding it would let idle and slowloris clients
//! hold two descriptors each for the opaque idle timeout. Opaque ports never get here
//! (server-speaks-first protocols would stall).

use std::io;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

pub const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// A request line longer than this is not worth waiting for: treat as opaque.
const MAX_REQUEST_LINE: usize = 8 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Http1,
    Http2,
    Opaque,
}

/// Classifies what has been read so far; `None` means "need more bytes".
pub fn classify(buf: &[u8]) -> Option<Protocol> {
    let n = buf.len().min(H2_PREFACE.len());
    if buf[..n] == H2_PREFACE[..n] {
        return (buf.len() >= H2_PREFACE.len()).then_some(Protocol::Http2);
    }
    // Empty lines before the request line are skipped, as httparse (and so hyper) skips them:
    // detection must call HTTP whatever the HTTP server will parse as HTTP, or a request could
    // pass as opaque bytes past every check made on requests.
    let Some(rest) = skip_empty_lines(buf) else {
        return (buf.len() >= MAX_REQUEST_LINE).then_some(Protocol::Opaque);
    };
    // Only the request line decides (headers are hyper's business), so httparse sees the first
    // line alone. It fails at the first byte that cannot belong to a request line, so a binary
    // client-first protocol (a TLS ClientHello starts with 0x16) is opaque at once instead of
    // waiting for a newline that never comes.
    let line = match rest.iter().position(|b| *b == b'\n') {
        Some(end) => &rest[..=end],
        None => rest,
    };
    let mut request = httparse::Request::new(&mut []);
    match request.parse(line) {
        Err(_) => Some(Protocol::Opaque),
        // A whole line parsed up to its version (httparse accepts HTTP/1.0 and 1.1 only).
        Ok(_) if line.ends_with(b"\n") => {
            Some(if request.version.is_some() { Protocol::Http1 } else { Protocol::Opaque })
        }
        // A valid prefix of a request line: wait for the rest, unless it is too long to be one.
        Ok(_) => (buf.len() >= MAX_REQUEST_LINE).then_some(Protocol::Opaque),
    }
}

/// `buf` after its leading empty lines (`\r\n` or `\n`); `None` while nothing else has come
/// (only empty lines, or a `\r` whose `\n` is still to come).
fn skip_empty_lines(mut buf: &[u8]) -> Option<&[u8]> {
    loop {
        buf = match buf {
            [b'\r', b'\n', rest @ ..] | [b'\n', rest @ ..] => rest,
            [] | [b'\r'] => return None,
            _ => return Some(buf),
        };
    }
}

/// Why detection gave no protocol.
#[derive(Debug, thiserror::Error)]
pub enum DetectError {
    /// The timeout passed before the first bytes decided the protocol.
    #[error("protocol detection timed out after {timeout:?} with {read} bytes read")]
    TimedOut { timeout: Duration, read: usize },
    #[error("reading for protocol detection: {0}")]
    Io(#[from] io::Error),
}

/// Reads until the protocol is known or the peer stops sending (what it sent is then opaque);
/// fails when `timeout` passes first. `read` holds bytes an earlier step (the TLS check) already
/// took from the stream.
pub async fn detect<S: AsyncRead + Unpin>(
    stream: &mut S,
    read: Bytes,
    timeout: Duration,
) -> Result<(Protocol, Bytes), DetectError> {
    let mut buf = BytesMut::with_capacity(1024.max(read.len()));
    buf.extend_from_slice(&read);
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(p) = classify(&buf) {
            return Ok((p, buf.freeze()));
        }
        match tokio::time::timeout_at(deadline, stream.read_buf(&mut buf)).await {
            Err(_elapsed) => return Err(DetectError::TimedOut { timeout, read: buf.len() }),
            Ok(Ok(0)) => return Ok((Protocol::Opaque, buf.freeze())),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(e.into()),
        }
    }
}

/// On a port whose policy declares HTTP/1 (a Server's `proxyProtocol`, a Service's
/// `appProtocol`): which HTTP the client speaks, never opaque and never cut off. A meshed client
/// may carry HTTP/1 requests over HTTP/2 (`l5d-orig-proto`), so its preface is still looked for,
/// up to `wait`; a client undecided by then (silent, or slower than that) is HTTP/1, and the HTTP
/// server's header timeout bounds it from there. Any byte off the preface decides at once.
pub async fn http_version<S: AsyncRead + Unpin>(
    stream: &mut S,
    read: Bytes,
    wait: Duration,
) -> io::Result<(Protocol, Bytes)> {
    let mut buf = BytesMut::with_capacity(1024.max(read.len()));
    buf.extend_from_slice(&read);
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let n = buf.len().min(H2_PREFACE.len());
        if buf[..n] != H2_PREFACE[..n] {
            return Ok((Protocol::Http1, buf.freeze()));
        }
        if n == H2_PREFACE.len() {
            return Ok((Protocol::Http2, buf.freeze()));
        }
        match tokio::time::timeout_at(deadline, stream.read_buf(&mut buf)).await {
            Err(_) | Ok(Ok(0)) => return Ok((Protocol::Http1, buf.freeze())),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(e),
        }
    }
}

/// What decided a connection's protocol: a configured opaque port, a policy from the control
/// plane, or detection on the client's first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, prometheus_client::encoding::EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum DecidedBy {
    configuration,
    policy,
    detection,
    /// A multicluster gateway's connection, whose transport header names it.
    transport_header,
}

/// A connection's protocol known before reading from it, and what made it known.
#[derive(Debug, Clone, Copy)]
pub struct Known {
    pub protocol: Protocol,
    pub by: DecidedBy,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::prefixed::PrefixedIo;

    #[test]
    fn classifies_first_bytes() {
        assert_eq!(classify(b"GET / HTTP/1.1\r\nHost: x\r\n"), Some(Protocol::Http1));
        assert_eq!(classify(b"POST /a?b=c HTTP/1.0\n"), Some(Protocol::Http1));
        assert_eq!(classify(b"GET / HTT"), None, "wait for the line");
        assert_eq!(classify(H2_PREFACE), Some(Protocol::Http2));
        assert_eq!(classify(&H2_PREFACE[..10]), None, "a partial preface waits");
        assert_eq!(classify(b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n"), Some(Protocol::Opaque));
        assert_eq!(classify(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"), Some(Protocol::Opaque), "TLS, at once");
        assert_eq!(classify(b"\x16"), Some(Protocol::Opaque), "one byte is enough");
        assert_eq!(classify(b"GET /\x00"), Some(Protocol::Opaque), "binary in the target");
        assert_eq!(
            classify(b"\r\nGET / HTTP/1.1\r\n"),
            Some(Protocol::Http1),
            "an empty line first, as httparse skips"
        );
        assert_eq!(classify(b"\n\r\n\nPOST /a HTTP/1.0\n"), Some(Protocol::Http1), "several, bare LF too");
        assert_eq!(classify(b"\r\n"), None, "only empty lines: wait for the request line");
        assert_eq!(classify(b"\r\n\r"), None, "a CR waits for its LF");
        assert_eq!(classify(b"\r\nGET / HTT"), None, "wait for the line after the empty one");
        assert_eq!(classify(b"\r\n\x16\x03"), Some(Protocol::Opaque), "binary after an empty line");
        assert_eq!(classify(b"\rGET / HTTP/1.1\r\n"), Some(Protocol::Opaque), "a lone CR is no empty line");
        assert_eq!(classify(&b"\r\n".repeat(MAX_REQUEST_LINE / 2)), Some(Protocol::Opaque), "empty lines without end");
        assert_eq!(
            classify(b"\r\nPRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
            Some(Protocol::Opaque),
            "no preface after empty lines"
        );
        assert_eq!(classify(b"GET"), None, "a method prefix waits");
        assert_eq!(classify(b"GET / HTTP/2\r\n"), Some(Protocol::Opaque));
        assert_eq!(classify(b"G(T / HTTP/1.1\r\n"), Some(Protocol::Opaque));
        assert_eq!(classify(b"SSH-2.0-OpenSSH\r\n"), Some(Protocol::Opaque));
        assert_eq!(classify(&vec![b'a'; MAX_REQUEST_LINE]), Some(Protocol::Opaque));
    }

    #[tokio::test]
    async fn opaque_bytes_are_replayed() {
        let (mut client, mut server) = tokio::io::duplex(64);
        tokio::io::AsyncWriteExt::write_all(&mut client, b"\x00hel").await.unwrap();
        let (p, prefix) = detect(&mut server, Bytes::new(), Duration::from_secs(5)).await.unwrap();
        assert_eq!((p, &prefix[..]), (Protocol::Opaque, &b"\x00hel"[..]));
        let mut io = PrefixedIo::new(prefix, server);
        tokio::io::AsyncWriteExt::write_all(&mut client, b"lo").await.unwrap();
        let mut got = [0u8; 6];
        io.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"\x00hello");
    }

    #[tokio::test]
    async fn silent_and_dribbling_clients_time_out_instead_of_going_opaque() {
        let (_quiet, mut server) = tokio::io::duplex(64);
        let e = detect(&mut server, Bytes::new(), Duration::from_millis(100)).await.unwrap_err();
        assert!(matches!(e, DetectError::TimedOut { read: 0, .. }), "{e}");
        // A valid request line, one byte every 30 ms from the first byte: the deadline counts
        // from the start, not from the last byte.
        let (mut client, mut server) = tokio::io::duplex(64);
        tokio::spawn(async move {
            for b in b"GET /hello HTTP/1.1\r\n" {
                tokio::time::sleep(Duration::from_millis(30)).await;
                if tokio::io::AsyncWriteExt::write_all(&mut client, &[*b]).await.is_err() {
                    return;
                }
            }
        });
        let e = detect(&mut server, Bytes::new(), Duration::from_millis(300)).await.unwrap_err();
        assert!(matches!(e, DetectError::TimedOut { read: 1..20, .. }), "{e}");
    }

    #[tokio::test]
    async fn a_declared_http_port_tells_http2_from_http1_and_a_late_client_is_http1() {
        let (mut client, mut server) = tokio::io::duplex(64);
        tokio::io::AsyncWriteExt::write_all(&mut client, H2_PREFACE).await.unwrap();
        let (p, prefix) = http_version(&mut server, Bytes::new(), Duration::from_secs(5)).await.unwrap();
        assert_eq!((p, &prefix[..]), (Protocol::Http2, H2_PREFACE));

        // Off the preface from the first byte: HTTP/1 at once, even for bytes detection calls
        // opaque (a declared port is served as declared).
        let (p, prefix) =
            http_version(&mut server, Bytes::from_static(b"\x16\x03"), Duration::from_secs(5)).await.unwrap();
        assert_eq!((p, &prefix[..]), (Protocol::Http1, &b"\x16\x03"[..]));

        // Silent past the wait: HTTP/1, and a half-sent preface prefix is kept for replay.
        let (mut client, mut server) = tokio::io::duplex(64);
        tokio::io::AsyncWriteExt::write_all(&mut client, b"PRI").await.unwrap();
        let (p, prefix) = http_version(&mut server, Bytes::new(), Duration::from_millis(50)).await.unwrap();
        assert_eq!((p, &prefix[..]), (Protocol::Http1, &b"PRI"[..]));
        drop(client);
    }

    #[tokio::test]
    async fn a_client_that_closes_before_deciding_is_opaque() {
        let (mut client, mut server) = tokio::io::duplex(64);
        tokio::io::AsyncWriteExt::write_all(&mut client, b"GET").await.unwrap();
        drop(client);
        let (p, prefix) = detect(&mut server, Bytes::new(), Duration::from_secs(5)).await.unwrap();
        assert_eq!((p, &prefix[..]), (Protocol::Opaque, &b"GET"[..]));
    }
}
