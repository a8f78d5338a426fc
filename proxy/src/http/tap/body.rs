//! A tapped response's body: counts its bytes and reports its end (trailers, reset, or the
//! client going away: the body is dropped, and so is its [`Tapped`]) as the request's
//! `ResponseEnd`. Only tapped responses are wrapped.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Body as _;

use super::registry::{RESET_INTERNAL_ERROR, Tapped};
use crate::http::{Body, BoxError};

pub struct TapBody<B> {
    inner: B,
    tapped: Tapped,
}

/// The response the client gets for a request `tapped` observes (if any): its head reported
/// now, its end when its body ends.
pub fn respond(tapped: Option<Tapped>, response: http::Response<Body>) -> http::Response<Body> {
    let Some(mut tapped) = tapped else { return response };
    tapped.response(&response);
    response.map(|inner| {
        let mut body = TapBody { inner, tapped };
        if body.inner.is_end_stream() {
            // An empty body may never be polled.
            body.tapped.end(None, None);
        }
        body.boxed_unsync()
    })
}

impl<B> hyper::body::Body for TapBody<B>
where
    B: hyper::body::Body<Data = Bytes, Error = BoxError> + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.tapped.add_bytes(data.len());
                }
                if let Some(trailers) = frame.trailers_ref() {
                    self.tapped.end(Some(trailers), None);
                } else if self.inner.is_end_stream() {
                    self.tapped.end(None, None);
                }
            }
            Poll::Ready(Some(Err(_))) => self.tapped.end(None, Some(RESET_INTERNAL_ERROR)),
            Poll::Ready(None) => self.tapped.end(None, None),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}
