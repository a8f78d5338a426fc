//! The exchange: a decided request sent to its target's endpoint and its answer back.
//! Linkerd's HTTP/1-over-HTTP/2 undone inbound and optionally done outbound, a Service named in
//! the authority followed (outbound without a route), a route's timeout and retries, the
//! endpoint picked (with the Service's failure accrual), and upgrades and CONNECT spliced on a
//! connection of their own.

use std::sync::Arc;

use http::{Method, Request, Response, StatusCode, Version};
use http_body_util::Either;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use super::{HttpProxy, Side};
use crate::client::discovery::accrual::ConsecutiveFailures;
use crate::client::target::{Picked, RouteError};
use crate::client::targets::Target;
use crate::client::upstream::{RequestBody, SendError};
use crate::http::classify::{Classification, classify};
use crate::http::error::{ProxyError, upstream_error};
use crate::http::headers::{GATEWAY_CLIENT_ID, strip_hop_by_hop, wants_upgrade};
use crate::http::orig_proto;
use crate::http::origin_form::{override_authority, to_origin_form};
use crate::http::trace::{self as spans, Traced};
use crate::inbound::policy::enforce::ConnPolicy;
use crate::outbound::http::routed::Routed;
use crate::outbound::http::{Exchanged, OutboundHttp, Try, TryTo};
use crate::serve::metrics::{Direction, TargetCluster};

/// On a response whose endpoint's `target_cluster_name` is not its target's (a
/// federated Service spans clusters: its target has none), the endpoint's; the request is
/// counted under it.
#[derive(Clone)]
pub(super) struct WentTo(pub(super) TargetCluster);

fn route_error(e: RouteError) -> ProxyError {
    match e {
        RouteError::NoEndpoints(service) => ProxyError::NoEndpoints(service),
        RouteError::NoIdentity(why) => ProxyError::NoIdentity(why),
    }
}

/// The tries of a request from this connection: each one [`HttpProxy::send`], the request in
/// the form it needs (`downgraded`: it came as HTTP/1 over HTTP/2 from a peer proxy).
struct Tries<'a> {
    proxy: &'a HttpProxy,
    downgraded: bool,
}

impl Try for Tries<'_> {
    fn send(&self, req: Request<RequestBody>, to: TryTo<'_>) -> impl Future<Output = Exchanged> + Send {
        self.proxy.send(to.target, req, (self.downgraded, to.accrual), to.timeout, to.span, to.b3)
    }
}

impl HttpProxy {
    /// Sends a decided request (`forwarded`: the policy a gateway's remote workload is held to;
    /// `routed`: the route that took it) and returns its answer, with the endpoint's load held
    /// until the response ends.
    pub(super) async fn exchange(
        &self,
        mut req: Request<Incoming>,
        forwarded: Option<Arc<ConnPolicy>>,
        decided: (Option<&Routed>, Option<&Arc<Target>>),
        traced: Option<&mut Traced>,
    ) -> Exchanged {
        // Only the inbound speaks to apps, so only it undoes a peer proxy's upgrade.
        let downgraded = match self.direction {
            Direction::inbound => orig_proto::downgrade_request(&mut req),
            Direction::outbound => Ok(false),
        };
        match downgraded {
            Err(e) => Err(e),
            Ok(false) if req.version() != Version::HTTP_2 && wants_upgrade(&req) => {
                // Boxed: an upgrade is rare, and its connection and splice would otherwise size
                // every request's future.
                Box::pin(self.upgrade(req, forwarded, traced)).await.map(|r| (r, None))
            }
            Ok(downgraded) => {
                let tries = Tries { proxy: self, downgraded };
                let exchanged = match &self.side {
                    Side::Outbound(outbound) => {
                        outbound.forward(req, decided, traced, &self.shared.outbound, &tries).await
                    }
                    Side::Inbound(_) => {
                        let b3 = traced.as_deref().and_then(Traced::b3);
                        let span = traced.map(|t| &mut t.span);
                        tries
                            .send(
                                req.map(Either::Left),
                                TryTo { target: &self.target, accrual: None, timeout: None, span, b3 },
                            )
                            .await
                    }
                };
                exchanged.map(|(mut response, load)| {
                    if downgraded {
                        orig_proto::mark_response(&mut response);
                    }
                    (response, load)
                })
            }
        }
    }

    /// One attempt: an endpoint of `target`, the request in the form it needs, its answer.
    /// `span`, when traced, is the span of this try: it names the endpoint and is the next
    /// hop's parent (with B3 in `b3`'s form too).
    async fn send(
        &self,
        target: &Arc<Target>,
        mut req: Request<RequestBody>,
        (downgraded, accrual): (bool, Option<ConsecutiveFailures>),
        timeout: Option<std::time::Duration>,
        mut span: Option<&mut cnimesh_trace::Span>,
        b3: Option<cnimesh_trace::B3Form>,
    ) -> Exchanged {
        let picked = target.route.pick(accrual.as_ref()).map_err(route_error)?;
        // The request is made for this endpoint; another one it may go to takes the same form.
        let upstream = picked.upstream.clone();
        if let Some(span) = span.as_deref_mut() {
            // A CLIENT span's peer is the endpoint; a SERVER span's (a gateway's too) stays the
            // client.
            if span.kind == cnimesh_trace::SpanKind::Client {
                spans::peer(span, upstream.addr);
            }
            spans::propagate(req.headers_mut(), span, b3);
        }
        strip_hop_by_hop(req.headers_mut(), false);
        self.stamp_gateway_client(req.headers_mut());
        if let Some(gateway) = &upstream.gateway {
            override_authority(&mut req, &gateway.authority)?;
        }
        let upgraded = self.h2_upgrade && req.version() != Version::HTTP_2 && upstream.tls.is_some();
        if upgraded {
            orig_proto::upgrade_request(&mut req, self.addr)?;
        } else if req.version() != Version::HTTP_2 {
            // HTTP/1.0 stays HTTP/1.0 only when a downgrade named it; otherwise HTTP/1 goes as 1.1.
            if !(downgraded && req.version() == Version::HTTP_10) {
                *req.version_mut() = Version::HTTP_11;
            }
            to_origin_form(&mut req, self.addr)?;
        }
        // A connection refused before anything was sent goes to another endpoint, within the
        // try's timeout.
        let sent = target.route.send(picked, req);
        let (Picked { upstream, load, cluster }, result) = match timeout {
            Some(timeout) => match tokio::time::timeout(timeout, sent).await {
                Ok(sent) => sent,
                Err(_) => {
                    if let Some(span) = span {
                        spans::timeout_event(span, "try", timeout);
                    }
                    return Err(ProxyError::ResponseTimeout { addr: upstream.addr, after: timeout });
                }
            },
            None => sent.await,
        };
        if let Some(load) = &load {
            match &result {
                Ok(response) => {
                    load.observe();
                    // A failing head (5xx, a trailers-only gRPC error) counts even when the
                    // response is retried and never reaches its end.
                    if accrual.is_some() && classify(response.status(), response.headers()) == Classification::Failure {
                        load.outcome(true);
                    }
                }
                Err(_) => load.fail(),
            }
        }
        let mut response = result.map_err(|e| gateway_error(&upstream, &e))?;
        strip_hop_by_hop(response.headers_mut(), false);
        // Only an endpoint outside its target's cluster label (a federated Service's)
        // says where it was; every other response carries nothing more.
        if cluster != target.cluster.0 {
            response.extensions_mut().insert(WentTo(TargetCluster(cluster)));
        }
        if upgraded {
            orig_proto::downgrade_response(&mut response);
        }
        Ok((response, load))
    }

    /// HTTP/1 `Upgrade` (e.g. WebSocket) and `CONNECT`: the handshake goes upstream on a fresh
    /// connection, and on success both upgraded connections are spliced together.
    async fn upgrade(
        &self,
        mut req: Request<Incoming>,
        forwarded: Option<Arc<ConnPolicy>>,
        traced: Option<&mut Traced>,
    ) -> Result<Response<Incoming>, ProxyError> {
        let Picked { upstream, load, .. } = self.target.route.pick(None).map_err(route_error)?;
        let target = upstream.addr;
        if let Some(traced) = traced {
            let b3 = traced.b3();
            if traced.span.kind == cnimesh_trace::SpanKind::Client {
                spans::peer(&mut traced.span, target);
            }
            spans::propagate(req.headers_mut(), &traced.span, b3);
        }
        if let Some(gateway) = &upstream.gateway {
            override_authority(&mut req, &gateway.authority)?;
        }
        let io = upstream
            .connect_for(Some(crate::transport::header::SessionProtocol::Http1))
            .await
            .map_err(|e| upstream_error(target, &e))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(io)).await.map_err(|e| upstream_error(target, &e))?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(error = %e, "upstream upgrade connection ended");
            }
        });
        let server_side = hyper::upgrade::on(&mut req);
        let is_connect = req.method() == Method::CONNECT;
        strip_hop_by_hop(req.headers_mut(), !is_connect);
        self.stamp_gateway_client(req.headers_mut());
        let mut response = sender.send_request(req).await.map_err(|e| upstream_error(target, &e))?;
        let switched =
            response.status() == StatusCode::SWITCHING_PROTOCOLS || (is_connect && response.status().is_success());
        if switched {
            let client_side = hyper::upgrade::on(&mut response);
            // The tunnel counts as load on its endpoint for as long as it lasts.
            let held = (self.shared.drain.guard(), self.open.clone(), load);
            // A tunnel is not re-checked per request: it ends when its authorization does (a
            // gateway's remote workload's, for a request the gateway forwarded).
            let policy = forwarded.or_else(|| match &self.side {
                Side::Inbound(inbound) => inbound.policy().cloned(),
                Side::Outbound(_) => None,
            });
            let revoked = async move {
                match policy {
                    Some(policy) => policy.revoked().await,
                    None => std::future::pending().await,
                }
            };
            tokio::spawn(crate::http::upgrade::splice(server_side, client_side, target, held, revoked));
        } else {
            strip_hop_by_hop(response.headers_mut(), false);
        }
        Ok(response)
    }

    /// A gateway's request: whatever its client sent as [`GATEWAY_CLIENT_ID`] is replaced by the
    /// identity its certificate proved. Done after hop-by-hop stripping, so a client's
    /// `Connection: cnimesh-gateway-client-id` cannot take the header off again.
    fn stamp_gateway_client(&self, headers: &mut http::HeaderMap) {
        if let Side::Outbound(OutboundHttp { gateway_client: Some(client), .. }) = &self.side {
            headers.insert(GATEWAY_CLIENT_ID, client.clone());
        }
    }
}

/// A failure of a multicluster gateway says so (the client's operator then knows to look at
/// the linked cluster's gateway, not at a pod of their own), and which failure by the send
/// error's kind: no connection could be made (unreachable), or one was and the gateway closed
/// or refused the request on it; 502 as any upstream failure.
pub(super) fn gateway_error(upstream: &crate::client::upstream::Upstream, e: &SendError) -> ProxyError {
    let error = upstream_error(upstream.addr, e);
    let Some(gateway) = &upstream.gateway else { return error };
    let what = match e {
        SendError::Connect(_) => "unreachable",
        SendError::Http(_) => "closed or refused the request",
    };
    ProxyError::Upstream {
        addr: upstream.addr,
        why: format!("multicluster gateway for {}:{} {what}: {error}", gateway.name, gateway.port),
    }
}
