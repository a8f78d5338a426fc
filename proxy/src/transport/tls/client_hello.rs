//! Reading a TLS ClientHello's server name from the first bytes of a connection, without
//! consuming them: the inbound proxy terminates TLS only when the name is its own identity, and
//! otherwise forwards the very same bytes (an application's own TLS passes through untouched).

use std::io;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

/// A ClientHello larger than this (across records) is not worth buffering: treated as not ours.
const MAX_HELLO: usize = 64 * 1024;

#[derive(Debug, PartialEq, Eq)]
pub enum Peek {
    /// Not a TLS handshake (or a malformed one): handle as plaintext.
    NotTls,
    /// A complete ClientHello; its SNI if it sent one.
    ClientHello(Option<String>),
    /// Not decided yet; nothing new can be learnt before the buffer holds this many bytes (so a
    /// client dribbling bytes costs one parse per step it completes, not one per read).
    NeedMore(usize),
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| b[0] as usize)
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]) as usize)
    }
    fn u24(&mut self) -> Option<usize> {
        self.take(3).map(|b| (b[0] as usize) << 16 | (b[1] as usize) << 8 | b[2] as usize)
    }
    /// A length-prefixed vector with a prefix of `width` bytes.
    fn vec(&mut self, width: usize) -> Option<&'a [u8]> {
        let n = match width {
            1 => self.u8()?,
            2 => self.u16()?,
            _ => self.u24()?,
        };
        self.take(n)
    }
}

/// Classifies `buf`, the first bytes of a connection.
pub fn peek(buf: &[u8]) -> Peek {
    // The handshake message may span several records: gather the handshake bytes first.
    let mut handshake = Vec::new();
    let mut records = Reader(buf);
    loop {
        let offset = buf.len() - records.0.len();
        let Some(header) = records.take(5) else {
            return if buf.first().is_some_and(|b| *b != 0x16) { Peek::NotTls } else { Peek::NeedMore(offset + 5) };
        };
        // Handshake content type and a TLS record version. Only its major byte is checked: RFC 8446
        // says the legacy record version must be ignored, and rustls accepts any 0x03xx (found by
        // fuzzing: a hello rustls takes must not be refused mTLS here).
        if header[0] != 0x16 || header[1] != 0x03 {
            return Peek::NotTls;
        }
        let len = u16::from_be_bytes([header[3], header[4]]) as usize;
        if len == 0 || len > 16 * 1024 + 256 {
            return Peek::NotTls;
        }
        let Some(fragment) = records.take(len) else { return Peek::NeedMore(offset + 5 + len) };
        handshake.extend_from_slice(fragment);
        if handshake[0] != 0x01 {
            return Peek::NotTls;
        }
        if handshake.len() >= 4 {
            let body_len = Reader(&handshake[1..4]).u24().unwrap_or(0);
            if body_len + 4 > MAX_HELLO {
                return Peek::NotTls;
            }
            if handshake.len() >= body_len + 4 {
                return match server_name(&handshake[4..body_len + 4]) {
                    Some(sni) => Peek::ClientHello(sni),
                    None => Peek::NotTls,
                };
            }
        }
    }
}

/// The SNI of a ClientHello body; `None` when the body is malformed, `Some(None)` without SNI.
fn server_name(body: &[u8]) -> Option<Option<String>> {
    let mut r = Reader(body);
    r.take(2 + 32)?; // legacy_version, random
    r.vec(1)?; // session id
    r.vec(2)?; // cipher suites
    r.vec(1)?; // compression methods
    if r.0.is_empty() {
        return Some(None);
    }
    let mut exts = Reader(r.vec(2)?);
    while !exts.0.is_empty() {
        let kind = exts.u16()?;
        let data = exts.vec(2)?;
        if kind != 0 {
            continue;
        }
        let mut list = Reader(Reader(data).vec(2)?);
        while !list.0.is_empty() {
            let name_type = list.u8()?;
            let name = list.vec(2)?;
            if name_type == 0 {
                return Some(std::str::from_utf8(name).ok().map(str::to_ascii_lowercase));
            }
        }
    }
    Some(None)
}

/// Reads from `stream` until `peek` decides, within `timeout`. Returns the verdict and every byte
/// read (to be replayed). EOF means not TLS; when the timeout passes first (a silent client, or
/// one dribbling a handshake), the verdict is still [`Peek::NeedMore`], for the caller to decide
/// (an opaque port carries on with a server-speaks-first client; other ports close).
pub async fn read<S: AsyncRead + Unpin>(stream: &mut S, timeout: Duration) -> io::Result<(Peek, Bytes)> {
    let mut buf = BytesMut::with_capacity(2048);
    let deadline = tokio::time::Instant::now() + timeout;
    let mut needed = 1;
    loop {
        if buf.len() >= needed {
            match peek(&buf) {
                Peek::NeedMore(n) if n <= MAX_HELLO + 5 * 8 => needed = n,
                Peek::NeedMore(_) => return Ok((Peek::NotTls, buf.freeze())),
                verdict => return Ok((verdict, buf.freeze())),
            }
        }
        match tokio::time::timeout_at(deadline, stream.read_buf(&mut buf)).await {
            Err(_) => return Ok((Peek::NeedMore(needed), buf.freeze())),
            Ok(Ok(0)) => return Ok((Peek::NotTls, buf.freeze())),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A real ClientHello, as rustls writes it for `name`.
    fn hello(name: &str) -> Vec<u8> {
        let roots = Arc::new(rustls::RootCertStore::empty());
        let config = rustls::ClientConfig::builder_with_provider(cnimesh_identity::tls::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let server_name = rustls_pki_types::ServerName::try_from(name.to_string()).unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(config), server_name).unwrap();
        let mut out = Vec::new();
        conn.write_tls(&mut out).unwrap();
        out
    }

    #[test]
    fn reads_the_server_name_of_a_real_client_hello() {
        let bytes = hello("web.shop.serviceaccount.identity.cnimesh.cluster.local");
        assert_eq!(
            peek(&bytes),
            Peek::ClientHello(Some("web.shop.serviceaccount.identity.cnimesh.cluster.local".into()))
        );
        for cut in [0, 1, 5, 40, bytes.len() - 1] {
            assert!(matches!(peek(&bytes[..cut]), Peek::NeedMore(n) if n > cut), "cut at {cut}");
        }
    }

    /// `hello`'s body in two handshake records, the second with record version `03 minor`.
    fn split_in_two_records(hello: &[u8], minor: u8) -> Vec<u8> {
        let (one, two) = hello[5..].split_at(100);
        let mut split = vec![0x16, 0x03, 0x01];
        split.extend_from_slice(&(one.len() as u16).to_be_bytes());
        split.extend_from_slice(one);
        split.extend_from_slice(&[0x16, 0x03, minor]);
        split.extend_from_slice(&(two.len() as u16).to_be_bytes());
        split.extend_from_slice(two);
        split
    }

    #[test]
    fn a_hello_split_across_records_is_reassembled() {
        let split = split_in_two_records(&hello("a.b"), 0x01);
        assert_eq!(peek(&split), Peek::ClientHello(Some("a.b".into())));
    }

    #[test]
    fn any_minor_record_version_is_read_as_rustls_reads_it() {
        // Found by fuzz/fuzz_targets/proxy_client_hello.rs: a second record with version 0x0305.
        let split = split_in_two_records(&hello("a.b"), 0x05);
        assert_eq!(peek(&split), Peek::ClientHello(Some("a.b".into())));
        let mut acceptor = rustls::server::Acceptor::default();
        acceptor.read_tls(&mut &split[..]).unwrap();
        let accepted = acceptor.accept().unwrap().expect("rustls takes it too");
        assert_eq!(accepted.client_hello().server_name(), Some("a.b"));
    }

    #[test]
    fn anything_else_is_not_tls_and_never_panics() {
        assert_eq!(peek(b"GET / HTTP/1.1\r\n"), Peek::NotTls);
        assert_eq!(peek(b"\x16\x03\x01\x00\x00"), Peek::NotTls, "empty record");
        assert_eq!(peek(b"\x16\x03\x01\x00\x04\x02\x00\x00\x00"), Peek::NotTls, "a ServerHello");
        let bytes = hello("a.b");
        // Truncate every length field in turn: malformed, never a panic.
        for i in 5..bytes.len() {
            let mut b = bytes.clone();
            b[i] = 0xff;
            let _ = peek(&b);
        }
        let mut lcg = 7u64;
        for _ in 0..2000 {
            let len = (lcg % 300) as usize;
            let junk: Vec<u8> = (0..len)
                .map(|_| {
                    lcg = lcg.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    (lcg >> 56) as u8
                })
                .collect();
            let mut b = vec![0x16, 0x03, 0x01, (len >> 8) as u8, len as u8, 0x01];
            b.extend_from_slice(&junk);
            let _ = peek(&b);
        }
    }
}
