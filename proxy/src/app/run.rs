//! Wiring: builds the shared state (identity, discovery, policies, metrics) from the
//! configuration, binds the listeners and the admin server, and runs until shutdown, then drains.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;

use crate::app::admin::{self, Admin, LogLevel};
use crate::app::admission::{self, Admission, Limits};
use crate::app::config::Config;
use crate::app::listen;
use crate::client::discovery;
use crate::inbound::policy;
use crate::outbound;
use crate::serve::drain::Drain;
use crate::serve::metrics::{Direction, Metrics};
use crate::serve::shared::Shared;
use crate::serve::{spans, tap};
use crate::transport::identity;
use cnimesh_identity::grpc_channel;

/// Runs the proxy until `shutdown` resolves or `/shutdown` is called, then keeps accepting (not
/// ready) for the shutdown delay, then stops its listeners and drains for up to the grace period.
pub async fn run(
    config: Config,
    log: Box<dyn LogLevel>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let drain = Drain::default();
    let metrics = Arc::new(Metrics::default());
    let identity = match &config.identity {
        Some(id) => {
            let identity = Arc::new(identity::Identity::new(id).context("setting up the workload identity")?);
            tokio::spawn(identity::refresh::run(identity.clone(), id.clone(), metrics.identity()));
            Some(identity)
        }
        None => None,
    };
    let discovery = match (&config.destination, &identity) {
        (Some(d), Some(id)) => {
            let channel = grpc_channel::channel(&d.addr, &d.name, id.roots.clone(), Some(id.cert.clone()), None)?;
            let max_backoff = config.identity.as_ref().map_or(Duration::from_secs(30), |i| i.max_backoff);
            let discovery = discovery::Discovery::new(channel, d.first_answer, max_backoff, metrics.discovery());
            // A gateway is answered as if only the Services exported through it existed.
            let gateway = config.mode.is_gateway();
            Some(Arc::new(if gateway { discovery.for_gateway() } else { discovery }))
        }
        _ => None,
    };
    let policies = match (&config.policy, &config.destination, &identity) {
        (Some(p), Some(d), Some(id)) => {
            let channel = grpc_channel::channel(&d.addr, &d.name, id.roots.clone(), Some(id.cert.clone()), None)?;
            let max_backoff = config.identity.as_ref().map_or(Duration::from_secs(30), |i| i.max_backoff);
            Some(Arc::new(policy::discover::Policies::new(
                channel,
                p.workload.clone(),
                p.default,
                p.cluster_networks.clone(),
                &p.declared_ports,
                (d.first_answer, max_backoff),
                &metrics.control_streams,
            )))
        }
        _ => None,
    };
    let outbound_policies = match (&config.destination, &identity) {
        (Some(d), Some(id)) if d.outbound_policy => {
            let channel = grpc_channel::channel(&d.addr, &d.name, id.roots.clone(), Some(id.cert.clone()), None)?;
            let workload = config.policy.as_ref().map(|p| p.workload.clone()).unwrap_or_default();
            let max_backoff = config.identity.as_ref().map_or(Duration::from_secs(30), |i| i.max_backoff);
            Some(Arc::new(outbound::policy::discover::OutboundPolicies::new(
                channel,
                workload,
                d.first_answer,
                max_backoff,
                &metrics.control_streams,
            )))
        }
        _ => None,
    };
    let admission = Arc::new(Admission::new(Limits::resolve(&config, admission::fd_limit())));
    let mut shared = Shared::new(config.clone(), metrics.clone(), drain.clone(), identity.clone(), discovery.clone());
    shared.inbound.policies = policies;
    shared.outbound.policies = outbound_policies;
    if let Some(trace) = &config.trace {
        let own = config.identity.as_ref().map(|id| id.name.to_string());
        let tracer = spans::Tracer::spawn(trace, own).context("setting up tracing")?;
        metrics.trace.set(tracer.exporter().clone(), tracer.budget());
        tracing::info!(collector = %trace.collector, sampling = trace.sampling, "tracing on");
        shared.tracer = Some(tracer);
    }
    let shared = Arc::new(shared);
    tokio::spawn(evict_idle_targets(shared.clone()));
    let mut listeners = Vec::new();
    let mut inherited = listen::Inherited::from_env()?;
    // A gateway has no captured outbound traffic: its inbound listeners are all.
    let gateway = config.mode.is_gateway();
    anyhow::ensure!(!gateway || shared.gateway.is_some(), "gateway mode without an identity");
    let outbound_addrs = if gateway { &Vec::new() } else { &config.outbound };
    for (direction, addrs) in [(Direction::inbound, &config.inbound), (Direction::outbound, outbound_addrs)] {
        if addrs.is_empty() && gateway {
            continue;
        }
        for addr in addrs {
            if let Some(listener) = inherited.take(*addr).with_context(|| format!("adopting the listener {addr}"))? {
                tracing::info!(%addr, ?direction, "listening on an inherited socket");
                listeners.push((direction, listener));
                continue;
            }
            match bind(*addr).await {
                Ok(listener) => listeners.push((direction, listener)),
                // A node or pod without IPv6 still gets a working IPv4 proxy.
                Err(e)
                    if addr.is_ipv6() && matches!(e.raw_os_error(), Some(libc::EADDRNOTAVAIL | libc::EAFNOSUPPORT)) =>
                {
                    tracing::warn!(%addr, error = %e, "IPv6 is not available here; skipping this listener");
                }
                Err(e) => return Err(e).with_context(|| format!("binding the {direction:?} listener {addr}")),
            }
        }
        anyhow::ensure!(
            listeners.iter().any(|(d, _)| *d == direction),
            "no {direction:?} listener could be bound from {addrs:?}"
        );
    }
    inherited.finish()?;
    let tap = match &identity {
        Some(id) => {
            Some(tap::TapListener::start(id, config.tap_identities.clone(), shared.taps.clone(), metrics.clone())?)
        }
        None => {
            tracing::info!("no identity: tap is not served (TLS on the admin port is refused)");
            None
        }
    };
    let admin = Arc::new(Admin {
        tap,
        metrics,
        ready: false.into(),
        log,
        drain: drain.clone(),
        identity,
        env: admin::status::redacted_env(std::env::vars()),
        config: config.clone(),
        discovery,
        policies: shared.inbound.policies.clone(),
    });
    let admin_listener = TcpListener::bind(config.admin)
        .await
        .with_context(|| format!("binding the admin listener {}", config.admin))?;
    let admin_task = tokio::spawn(admin.clone().serve(admin_listener));
    for (direction, listener) in listeners {
        tokio::spawn(listen::accept_loop(listener, direction, shared.clone(), admission.clone()));
    }
    match (&shared.inbound.policies, &config.policy) {
        (Some(policies), Some(p)) => {
            let (admin, policies, bound) = (admin.clone(), policies.clone(), p.ready_timeout);
            tokio::spawn(async move {
                if !policies.declared_answered(bound).await {
                    // Ready anyway: a port without an answer gets the effective default (as
                    // injected, or as the control plane last stated it), never a wider one, so
                    // serving now is safe; holding for ever would keep the pod out of service
                    // whenever the control plane is down.
                    tracing::warn!(
                        ports = ?policies.unanswered(),
                        wait = ?bound,
                        default = %policies.fallback().server.name,
                        "ready without the control plane's answer for these declared ports; they use the default policy"
                    );
                }
                admin.ready.store(true, Ordering::SeqCst);
            });
        }
        _ => admin.ready.store(true, Ordering::SeqCst),
    }
    let limits = admission.limits;
    tracing::info!(inbound = ?config.inbound, outbound = ?config.outbound, admin = %config.admin, "proxy listening");
    tracing::info!(
        inbound = limits.inbound,
        outbound = limits.outbound,
        inbound_per_source = limits.inbound_per_source,
        open_files = admission::fd_limit(),
        "connection limits"
    );

    tokio::select! {
        () = shutdown => drain.terminate(),
        () = drain.terminating() => {}
    }
    // Not ready, still accepting: a client that has not yet learnt that this endpoint is gone
    // gets served rather than refused.
    tracing::info!(delay = ?config.shutdown_delay, "terminating: accepting until the shutdown delay is over");
    tokio::select! {
        () = tokio::time::sleep(config.shutdown_delay) => drain.start(),
        () = drain.signalled() => {}
    }
    tracing::info!(active = drain.active(), grace = ?config.shutdown_grace, "draining");
    if tokio::time::timeout(config.shutdown_grace, drain.idle()).await.is_err() {
        tracing::warn!(active = drain.active(), "grace period over; exiting with connections still open");
    }
    admin_task.abort();
    Ok(())
}

/// How often idle targets are looked for, and how long unused before they go.
const TARGET_SWEEP: Duration = Duration::from_secs(30);
const TARGET_IDLE: Duration = Duration::from_secs(60);

/// Drops targets no connection has used for a while, with their pooled upstream connections.
async fn evict_idle_targets(shared: Arc<Shared>) {
    let mut every = tokio::time::interval(TARGET_SWEEP);
    loop {
        every.tick().await;
        shared.inbound.targets.evict_idle(TARGET_IDLE);
        shared.outbound.by_addr.evict_idle(TARGET_IDLE);
        shared.outbound.by_service.evict_idle(TARGET_IDLE);
    }
}

/// Binds a listener; IPv6 wildcard listeners are v6-only so they coexist with IPv4 ones.
async fn bind(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv6() { tokio::net::TcpSocket::new_v6()? } else { tokio::net::TcpSocket::new_v4()? };
    socket.set_reuseaddr(true)?;
    if addr.is_ipv6() {
        nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::Ipv6V6Only, &true)?;
    }
    socket.bind(addr)?;
    socket.listen(1024)
}
