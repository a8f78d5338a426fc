//! Classifying a response once its body is over: gRPC puts its status in the trailers.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;

use super::BoxError;

/// What is told when a response ends: `"success"` or `"failure"`.
pub trait OnEnd: Send + 'static {
    fn end(self: Box<Self>, classification: &'static str);
}

/// A response body that reports how the response ended.
pub struct Classified<B> {
    inner: B,
    on_end: Option<Box<dyn OnEnd>>,
}

impl<B: hyper::body::Body> Classified<B> {
    /// Wraps `inner`; a body that is already over (e.g. empty) is classified at once, because
    /// the server may never poll it.
    pub fn new(inner: B, on_end: Box<dyn OnEnd>) -> Self {
        let mut body = Self { inner, on_end: Some(on_end) };
        if body.inner.is_end_stream() {
            body.finish("success");
        }
        body
    }
}

impl<B> Classified<B> {
    fn finish(&mut self, classification: &'static str) {
        if let Some(f) = self.on_end.take() {
            f.end(classification);
        }
    }
}

impl<B> Drop for Classified<B> {
    /// A body dropped before its end (client went away, upstream reset) is a failure.
    fn drop(&mut self) {
        self.finish("failure");
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
                    let failed = trailers.get("grpc-status").is_some_and(|v| v != "0");
                    self.finish(if failed { "failure" } else { "success" });
                } else if self.inner.is_end_stream() {
                    // The last data frame of a sized body: servers stop polling here.
                    self.finish("success");
                }
            }
            Poll::Ready(Some(Err(_))) => self.finish("failure"),
            Poll::Ready(None) => self.finish("success"),
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
        fn end(self: Box<Self>, c: &'static str) {
            self.0.lock().push(c);
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
        Classified::new(frames, Box::new(Record(seen.clone()))).collect().await.unwrap();
        drop(Classified::new(http_body_util::Empty::<Bytes>::new(), Box::new(Record(seen.clone()))));
        let unfinished = Frames(VecDeque::from([Frame::data(Bytes::from_static(b"x"))]));
        drop(Classified::new(unfinished, Box::new(Record(seen.clone()))));
        assert_eq!(*seen.lock(), ["failure", "success", "failure"]);
    }
}
