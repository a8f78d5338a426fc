//! What the proxy does with one HTTP request, decided before anything is sent: forward it (as
//! the direction's own [`Decision::Forward`] value says) or answer it itself. Each direction
//! builds its decision before anything is sent ([`crate::inbound::http`], with no I/O at all;
//! [`crate::outbound::http`], which may wait on discovery for a backend); the executor runs it,
//! and every answer the proxy makes itself goes through one arm there: counted, tapped and ended
//! in its span the same way.

use http::{Response, StatusCode};

use super::Body;

/// One request's fate.
pub enum Decision<F> {
    /// Sent on: `F` is what the direction decided (the policy a forwarded request is held to,
    /// the route that took it).
    Forward(F),
    /// Answered by the proxy, never sent.
    Answer(Answer),
}

impl<F> Decision<F> {
    /// The same decision with its forward value mapped (an answer stays as it is).
    pub fn map<G>(self, f: impl FnOnce(F) -> G) -> Decision<G> {
        match self {
            Decision::Forward(forward) => Decision::Forward(f(forward)),
            Decision::Answer(answer) => Decision::Answer(answer),
        }
    }
}

/// Why the proxy answered a request itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerKind {
    /// The request cannot be checked as sent (a path servers read differently, a gateway's
    /// request without the identity it forwards for): 400.
    Malformed,
    /// The port's policy refused it: unauthorized (403), no route (404), or over its Server's
    /// rate limit (429); a gRPC request gets the status as `grpc-status`.
    Policy,
    /// Its route answered: no route matched, a fault the route injects, an EgressNetwork's
    /// refusal, a route without backends.
    Route,
}

/// The proxy's own answer to a request, and why.
pub struct Answer {
    pub kind: AnswerKind,
    pub response: Response<Body>,
}

impl Answer {
    pub fn new(kind: AnswerKind, response: Response<Body>) -> Self {
        Self { kind, response }
    }

    pub fn status(&self) -> StatusCode {
        self.response.status()
    }
}
