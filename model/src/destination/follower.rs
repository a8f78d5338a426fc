//! One `Get` stream's state: what it has told its client, so each snapshot becomes the encoded
//! messages it still needs, shared with the other streams of its service port ([`super::updates`]).
//!
//! Layer: model/index (pure).

use std::sync::Arc;

use bytes::Bytes;

use super::index::ServiceView;
use super::updates::{Encoded, Endpoints, encode, updates};
use super::{Caller, Config, resolve};

/// What one `Get` stream has told its client, so each snapshot becomes the messages it still needs.
pub struct Follower {
    /// Who asked; a gateway sees only exported Services ([`Caller`]).
    caller: Caller,
    port: u16,
    config: Arc<Config>,
    /// Shared with every stream of the same service port that has sent the same.
    sent: Endpoints,
    /// The `exists` of the last `no_endpoints` sent, while the client holds no endpoints.
    no_endpoints: Option<bool>,
}

impl Follower {
    pub fn new(caller: Caller, port: u16, config: Arc<Config>) -> Self {
        Self { caller, port, config, sent: Arc::default(), no_endpoints: None }
    }

    /// The encoded messages that bring this stream's client to `view`.
    pub fn step(&mut self, view: &ServiceView) -> Encoded {
        let Some(snapshot) = self.caller.service(view) else {
            // The service is gone (or hidden from this caller): rare, and nothing to share.
            let messages = encode(&updates(None, &self.sent, &Endpoints::default(), self.no_endpoints));
            self.sent = Endpoints::default();
            self.no_endpoints = Some(false);
            return messages;
        };
        let next = resolve::port_endpoints(snapshot, self.port, &self.config);
        if Arc::ptr_eq(&next.endpoints, &self.sent) && !next.endpoints.is_empty() {
            return Encoded::default();
        }
        let messages = next.step_from(&snapshot.key, &self.sent, self.no_endpoints);
        self.no_endpoints = next.endpoints.is_empty().then_some(true);
        self.sent = next.endpoints.clone();
        messages
    }
}

/// The messages of a step one by one, each a reference to the shared bytes.
pub fn messages(encoded: Encoded) -> impl Iterator<Item = Bytes> + Send + 'static {
    (0..encoded.len()).map(move |i| encoded[i].clone())
}

#[cfg(test)]
mod tests {
    use linkerd2_proxy_api::destination::{Update, update};
    use prost::Message;

    use super::*;
    use crate::destination::test_objects::object;
    use crate::destination::{Change, Index};
    use crate::meta::NsName;

    fn service() -> Change {
        Change::Upsert(object(serde_json::json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80}]},
        })))
    }

    fn slice(hosts: &[u8]) -> Change {
        let endpoints: Vec<_> =
            hosts.iter().map(|h| serde_json::json!({"addresses": [format!("10.244.0.{h}")]})).collect();
        Change::Upsert(object(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "web-a", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4", "endpoints": endpoints,
        })))
    }

    fn decode(messages: &[Bytes]) -> Vec<Update> {
        messages.iter().map(|m| Update::decode(m.as_ref()).unwrap()).collect()
    }

    #[test]
    fn streams_at_the_same_state_send_the_same_bytes_and_a_new_stream_the_full_set() {
        let index = Index::new();
        index.apply([service(), slice(&[1, 2]), Change::Reset(crate::destination::Kind::Pod, vec![])]);
        let rx = index.watch_service(&NsName::new("shop", "web"));
        let config = Arc::new(Config::default());
        let mut streams: Vec<Follower> = (0..3).map(|_| Follower::new(Caller::Proxy, 80, config.clone())).collect();
        let first: Vec<Encoded> = streams.iter_mut().map(|s| s.step(&rx.borrow())).collect();
        assert!(first.iter().all(|m| Arc::ptr_eq(m, &first[0])), "one encoding for every new stream");
        index.apply([slice(&[1, 2, 3])]);
        let second: Vec<Encoded> = streams.iter_mut().map(|s| s.step(&rx.borrow())).collect();
        assert!(second.iter().all(|m| Arc::ptr_eq(m, &second[0])), "one encoding for every stream at one state");
        let [Update { update: Some(update::Update::Add(added)) }] = &decode(&second[0])[..] else {
            panic!("{:?}", decode(&second[0]));
        };
        assert_eq!(added.addrs.len(), 1, "only the new endpoint");
        let mut late = Follower::new(Caller::Proxy, 80, config);
        let [Update { update: Some(update::Update::Add(all)) }] = &decode(&late.step(&rx.borrow()))[..] else {
            panic!("a late stream starts with the full set");
        };
        assert_eq!(all.addrs.len(), 3);
    }
}
