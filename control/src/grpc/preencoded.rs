//! A tonic codec whose responses are messages encoded already: their bytes are framed and sent as
//! they are. Streams that send what many other streams send (a change fanned out to every
//! subscriber of a Service) encode it once and share the bytes ([`Bytes`] clones are a reference
//! count), where a typed response would be encoded again by every stream.
//!
//! Layer: gRPC: a codec for [`tonic::server::Grpc`].

use std::marker::PhantomData;

use bytes::{BufMut, Bytes};
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, EncodeBuf, Encoder};
use tonic_prost::ProstDecoder;

/// What each response stream reserves for encoding at first (tonic's default is 8 KiB per
/// stream, held for as long as the stream is open). Updates are mostly a few hundred bytes; a
/// larger one grows the buffer for as long as it needs.
const BUFFER: usize = 512;

/// Decodes requests of type `R` with prost; encodes pre-encoded messages by copying them.
#[derive(Debug)]
pub struct PreEncoded<R>(PhantomData<fn() -> R>);

impl<R> Default for PreEncoded<R> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<R: prost::Message + Default + Send + 'static> Codec for PreEncoded<R> {
    type Encode = Bytes;
    type Decode = R;
    type Encoder = BytesEncoder;
    type Decoder = ProstDecoder<R>;

    fn encoder(&mut self) -> Self::Encoder {
        BytesEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::new(BufferSettings::default())
    }
}

/// Writes a message's bytes into tonic's frame.
#[derive(Debug, Clone, Copy)]
pub struct BytesEncoder;

impl Encoder for BytesEncoder {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }

    /// Yield after every message: a stream sends one change at a time, and waiting for more
    /// would only delay it.
    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::new(BUFFER, 0)
    }
}
