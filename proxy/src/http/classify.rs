//! Whether a response succeeded, decided by one rule for every site that asks (the `classification`
//! metric label, the proxy's own answers, the end of a body): a 5xx, or a gRPC status other
//! than OK wherever gRPC puts it (the trailers, or the headers of a trailers-only response,
//! which is how an error without a body, such as a route's injected fault, arrives in an HTTP 200),
//! is a failure. Classified once the body is over, since the trailers come last.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, StatusCode};

use super::BoxError;

/// How a response ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Classification {
    Success,
    Failure,
}

impl Classification {
    /// The `classification` label value (Linkerd's).
    pub fn as_str(self) -> &'static str {
        match self {
            Classification::Success => "success",
            Classification::Failure => "failure",
        }
    }
}

/// The one rule: `status` is the response's, `headers` its headers or, at its end, its
/// trailers (pass the status again then; a head already classified a failure stays one, see
/// [`Classified`]).
pub fn classify(status: StatusCode, headers: &HeaderMap) -> Classification {
    let grpc_failed = headers.get(&crate::http::headers::GRPC_STATUS).is_some_and(|v| v != "0");
    if status.is_server_error() || grpc_failed { Classification::Failure } else { Classification::Success }
}

/// What is told when a response ends.
pub trait OnEnd: Send + 'static {
    fn end(self: Box<Self>, classification: Classification);
}

/// A response body that reports how the response ended.
pub struct Classified<B> {
    inner: B,
    /// The response's status: its trailers are classified with it.
    status: StatusCode,
    /// How the head alone classified: a failure there (a trailers-only gRPC error) stays one
    /// whatever the end brings.
    head: Classification,
    on_end: Option<Box<dyn OnEnd>>,
}

impl<B: hyper::body::Body> Classified<B> {
    /// Wraps `inner`, the body of a response with `status` and `headers`; a body that is already
    /// over (e.g. empty) is classified at once, because the server may never poll it.
    pub fn new(inner: B, status: StatusCode, headers: &HeaderMap, on_end: Box<dyn OnEnd>) -> Self {
        let head = classify(status, headers);
        let mut body = Self { inner, status, head, on_end: Some(on_end) };
        if body.inner.is_end_stream() {
            body.finish(classify(status, &HeaderMap::new()));
        }
        body
    }
}

impl<B> Classified<B> {
    fn finish(&mut self, classification: Classification) {
        if let Some(f) = self.on_end.take() {
            f.end(if self.head == Classification::Failure { Classification::Failure } else { classification });
        }
    }
}

impl<B> Drop for Classified<B> {
    /// A body dropped before its end (client went away, upstream reset) is a failure.
    fn drop(&mut self) {
        self.finish(Classification::Failure);
    }
}

impl<B> hyper::body::Body for Classified<B>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(trailers) = frame.trailers_ref() {
                    let classification = classify(self.status, trailers);
                    self.finish(classification);
                } else if self.inner.is_end_stream() {
                    // The last data frame of a sized body: servers stop polling here.
                    let classification = classify(self.status, &HeaderMap::new());
                    self.finish(classification);
                }
            }
            Poll::Ready(Some(Err(_))) => self.finish(Classification::Failure),
            Poll::Ready(None) => {
                let classification = classify(self.status, &HeaderMap::new());
                self.finish(classification);
            }
            Poll::Pending => {}
        }
        polled.map(|o| o.map(|r| r.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use hyper::body::Frame;
    use std::collections::VecDeque;
    use std::sync::Arc;

    use parking_lot::Mutex;

    struct Record(Arc<Mutex<Vec<&'static str>>>);
    impl OnEnd for Record {
        fn end(self: Box<Self>, c: Classification) {
            self.0.lock().push(c.as_str());
        }
    }

    /// A body of given frames.
    struct Frames(VecDeque<Frame<Bytes>>);
    impl hyper::body::Body for Frames {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.0.pop_front().map(Ok))
        }
    }

    #[tokio::test]
    async fn grpc_trailers_decide_and_early_drops_fail() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", "14".parse().unwrap());
        let frames = Frames(VecDeque::from([Frame::data(Bytes::from_static(b"x")), Frame::trailers(trailers)]));
        let ok = StatusCode::OK;
        Classified::new(frames, ok, &HeaderMap::new(), Box::new(Record(seen.clone()))).collect().await.unwrap();
        drop(Classified::new(
            http_body_util::Empty::<Bytes>::new(),
            ok,
            &HeaderMap::new(),
            Box::new(Record(seen.clone())),
        ));
        let unfinished = Frames(VecDeque::from([Frame::data(Bytes::from_static(b"x"))]));
        drop(Classified::new(unfinished, ok, &HeaderMap::new(), Box::new(Record(seen.clone()))));
        assert_eq!(*seen.lock(), ["failure", "success", "failure"]);
    }

    #[test]
    fn a_5xx_or_a_grpc_error_in_headers_or_trailers_is_a_failure() {
        let grpc = |code: &'static str| {
            let mut h = HeaderMap::new();
            h.insert("grpc-status", code.parse().unwrap());
            h
        };
        let none = HeaderMap::new();
        assert_eq!(classify(StatusCode::OK, &none), Classification::Success);
        assert_eq!(classify(StatusCode::NOT_FOUND, &none), Classification::Success, "the client's error");
        assert_eq!(classify(StatusCode::BAD_GATEWAY, &none), Classification::Failure);
        assert_eq!(classify(StatusCode::OK, &grpc("0")), Classification::Success);
        assert_eq!(classify(StatusCode::OK, &grpc("14")), Classification::Failure, "trailers-only gRPC error");
    }
}
