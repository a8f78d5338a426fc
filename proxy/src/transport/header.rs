//! Linkerd's transport header (linkerd2-proxy's `linkerd/transport-header`), which a
//! client proxy writes at the start of an mTLS connection to a multicluster gateway to say where
//! the connection is for, and the gateway reads before anything else.
//!
//! On the wire: the preamble `transport.l5d.io/v1` (19 bytes), a big-endian u32 length, then
//! that many bytes of the protobuf message
//! `TransportHeader { int32 port = 1; string name = 2; SessionProtocol session_protocol = 3; }`
//! with `SessionProtocol { oneof kind { Http1 http1 = 1; Http2 http2 = 2; } }`.
//!
//! One module for both sides, so what one writes the other reads. Decoding never trusts the
//! peer: a length above [`MAX_LEN`] is refused before anything is allocated, and bad bytes are
//! an error, never a panic.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt};

/// The preamble every transport header starts with.
pub const PREAMBLE: &[u8; 19] = b"transport.l5d.io/v1";
/// The largest message accepted: a name is at most 253 bytes, so 64 KiB is far beyond any
/// honest header, and small enough to never be a way to make us allocate.
pub const MAX_LEN: u32 = 64 * 1024;

/// How the gateway should serve the connection's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionProtocol {
    Http1,
    Http2,
}

/// Where a connection is for: `name:port` (`name` a Service's fully qualified name), and how its
/// bytes are spoken (`None`: opaque).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportHeader {
    pub port: u16,
    pub name: String,
    pub protocol: Option<SessionProtocol>,
}

/// Why bytes are not a transport header.
#[derive(Debug, thiserror::Error)]
pub enum HeaderError {
    #[error("no transport header: the connection does not start with {:?}", String::from_utf8_lossy(PREAMBLE))]
    NoPreamble,
    #[error("transport header length {0} is over the limit of {MAX_LEN} bytes")]
    TooLong(u32),
    #[error("transport header is not a valid message: {0}")]
    Invalid(String),
    #[error("transport header port {0} is not a TCP port")]
    BadPort(i32),
    #[error("transport header names no target")]
    NoName,
    #[error("no whole transport header within {0:?}")]
    TimedOut(Duration),
    #[error("reading the transport header: {0}")]
    Io(#[from] std::io::Error),
}

mod proto {
    //! The protobuf messages, written by hand as linkerd2-proxy's `transport_header.proto` has
    //! them (no code generation in the build).

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TransportHeader {
        #[prost(int32, tag = "1")]
        pub port: i32,
        #[prost(string, tag = "2")]
        pub name: String,
        #[prost(message, optional, tag = "3")]
        pub session_protocol: Option<SessionProtocol>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SessionProtocol {
        #[prost(oneof = "Kind", tags = "1, 2")]
        pub kind: Option<Kind>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Kind {
        #[prost(message, tag = "1")]
        Http1(Http1),
        #[prost(message, tag = "2")]
        Http2(Http2),
    }

    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct Http1 {}

    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct Http2 {}
}

impl TransportHeader {
    /// The header as it goes on the wire.
    pub fn encode(&self) -> Bytes {
        let message = proto::TransportHeader {
            port: i32::from(self.port),
            name: self.name.clone(),
            session_protocol: self.protocol.map(|p| proto::SessionProtocol {
                kind: Some(match p {
                    SessionProtocol::Http1 => proto::Kind::Http1(proto::Http1 {}),
                    SessionProtocol::Http2 => proto::Kind::Http2(proto::Http2 {}),
                }),
            }),
        };
        let len = message.encoded_len();
        let mut buf = BytesMut::with_capacity(PREAMBLE.len() + 4 + len);
        buf.put_slice(PREAMBLE);
        // A name is bounded by its caller (a Service's name); u32 cannot overflow here.
        buf.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
        message.encode_raw(&mut buf);
        buf.freeze()
    }

    /// Decodes a whole header at the start of `buf`: `Ok(None)` when more bytes are needed,
    /// else the header and how many bytes it took.
    pub fn decode(buf: &[u8]) -> Result<Option<(Self, usize)>, HeaderError> {
        let have = buf.len().min(PREAMBLE.len());
        if buf[..have] != PREAMBLE[..have] {
            return Err(HeaderError::NoPreamble);
        }
        let Some(len) = buf.get(PREAMBLE.len()..PREAMBLE.len() + 4) else { return Ok(None) };
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]);
        if len > MAX_LEN {
            return Err(HeaderError::TooLong(len));
        }
        let start = PREAMBLE.len() + 4;
        let Some(message) = buf.get(start..start + len as usize) else { return Ok(None) };
        Ok(Some((Self::from_message(message)?, start + len as usize)))
    }

    fn from_message(bytes: &[u8]) -> Result<Self, HeaderError> {
        let message = proto::TransportHeader::decode(bytes).map_err(|e| HeaderError::Invalid(e.to_string()))?;
        let port = u16::try_from(message.port).ok().filter(|p| *p != 0).ok_or(HeaderError::BadPort(message.port))?;
        if message.name.is_empty() {
            return Err(HeaderError::NoName);
        }
        let protocol = message.session_protocol.and_then(|p| p.kind).map(|k| match k {
            proto::Kind::Http1(_) => SessionProtocol::Http1,
            proto::Kind::Http2(_) => SessionProtocol::Http2,
        });
        Ok(Self { port, name: message.name, protocol })
    }

    /// Reads exactly one header from the start of `io` (nothing after it), within `timeout`.
    pub async fn read<I: AsyncRead + Unpin>(io: &mut I, timeout: Duration) -> Result<Self, HeaderError> {
        let read = async {
            let mut head = [0u8; PREAMBLE.len() + 4];
            // The preamble first, so a client that sends anything else is told apart at once.
            io.read_exact(&mut head[..PREAMBLE.len()]).await?;
            if head[..PREAMBLE.len()] != PREAMBLE[..] {
                return Err(HeaderError::NoPreamble);
            }
            io.read_exact(&mut head[PREAMBLE.len()..]).await?;
            let len = u32::from_be_bytes([head[19], head[20], head[21], head[22]]);
            if len > MAX_LEN {
                return Err(HeaderError::TooLong(len));
            }
            let mut message = vec![0u8; len as usize];
            io.read_exact(&mut message).await?;
            Self::from_message(&message)
        };
        tokio::time::timeout(timeout, read).await.map_err(|_| HeaderError::TimedOut(timeout))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(protocol: Option<SessionProtocol>) -> TransportHeader {
        TransportHeader { port: 8080, name: "web.shop.svc.west.local".into(), protocol }
    }

    #[test]
    fn a_header_round_trips_with_each_session_protocol() {
        for protocol in [None, Some(SessionProtocol::Http1), Some(SessionProtocol::Http2)] {
            let encoded = header(protocol).encode();
            assert!(encoded.starts_with(PREAMBLE));
            let mut with_data = encoded.to_vec();
            with_data.extend_from_slice(b"GET / HTTP/1.1\r\n");
            let (decoded, used) = TransportHeader::decode(&with_data).unwrap().unwrap();
            assert_eq!((decoded, used), (header(protocol), encoded.len()));
        }
    }

    #[test]
    fn the_wire_form_is_linkerds() {
        // Preamble, length 18, then field 1 (varint 8080), field 2 (the name), field 3 (http2 {}).
        let encoded =
            TransportHeader { port: 8080, name: "a.b.svc.c".into(), protocol: Some(SessionProtocol::Http2) }.encode();
        let expected: &[u8] = b"transport.l5d.io/v1\x00\x00\x00\x12\x08\x90\x3f\x12\x09a.b.svc.c\x1a\x02\x12\x00";
        assert_eq!(&encoded[..], expected);
    }

    #[test]
    fn truncated_headers_ask_for_more_at_every_length() {
        let encoded = header(Some(SessionProtocol::Http1)).encode();
        for cut in 0..encoded.len() {
            assert!(TransportHeader::decode(&encoded[..cut]).unwrap().is_none(), "cut at {cut}");
        }
    }

    #[test]
    fn oversized_garbage_and_incomplete_messages_are_refused_without_panicking() {
        let mut oversized = PREAMBLE.to_vec();
        oversized.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(TransportHeader::decode(&oversized), Err(HeaderError::TooLong(u32::MAX))));
        assert!(matches!(TransportHeader::decode(b"GET / HTTP/1.1\r\n"), Err(HeaderError::NoPreamble)));
        assert!(matches!(TransportHeader::decode(b"\x16\x03\x01"), Err(HeaderError::NoPreamble)));
        let framed = |message: &[u8]| {
            let mut buf = PREAMBLE.to_vec();
            buf.extend_from_slice(&(message.len() as u32).to_be_bytes());
            buf.extend_from_slice(message);
            TransportHeader::decode(&buf)
        };
        assert!(matches!(framed(b"\xff\xff\xff"), Err(HeaderError::Invalid(_))));
        assert!(matches!(framed(b"\x12\x01a"), Err(HeaderError::BadPort(0))), "no port");
        assert!(matches!(framed(b"\x08\x50"), Err(HeaderError::NoName)), "no name");
        assert!(matches!(framed(b"\x08\x80\x80\x04\x12\x01a"), Err(HeaderError::BadPort(65536))));
        // Every prefix of a pile of junk after a good preamble: errors or "more", never a panic.
        let mut junk = PREAMBLE.to_vec();
        junk.extend_from_slice(&[0, 0, 0, 40]);
        junk.extend((0u8..40).map(|i| i.wrapping_mul(97)));
        for cut in 0..=junk.len() {
            let _ = TransportHeader::decode(&junk[..cut]);
        }
    }

    #[tokio::test]
    async fn reading_takes_the_header_alone_and_refuses_other_bytes_at_once() {
        let mut bytes = header(None).encode().to_vec();
        bytes.extend_from_slice(b"after");
        let mut io = &bytes[..];
        let read = TransportHeader::read(&mut io, Duration::from_secs(5)).await.unwrap();
        assert_eq!((read, io), (header(None), &b"after"[..]));
        let mut plain = &b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..];
        assert!(matches!(
            TransportHeader::read(&mut plain, Duration::from_secs(5)).await,
            Err(HeaderError::NoPreamble)
        ));
        let mut short = &header(None).encode()[..10];
        assert!(matches!(TransportHeader::read(&mut short, Duration::from_secs(5)).await, Err(HeaderError::Io(_))));
    }
}
