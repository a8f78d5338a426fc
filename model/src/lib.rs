//! `cnimesh-model`: the control plane's pure layer, as the `core` and `k8s/index` crates of
//! Linkerd's policy controller are: the models and indexes of what the cluster says (objects'
//! keys, workloads, Gateway API routes, Destination, EgressNetworks, inbound policy), the
//! identity issuer, and the injection webhook's mutation. Kubernetes objects go in as changes,
//! answers come out as values and watch channels; no servers and no listeners live here.
//!
//! Who builds on it: the control plane (`cnimesh-control`: the gRPC servers, the webhook server,
//! the tap relay, the sources that feed these indexes), the multicluster mirror (object keys, a
//! pod's identity as Destination reads it) and the operator's command line (`cnimesh authz`
//! evaluates with the policy index, `cnimesh inject` with the webhook's mutation), so none of the
//! latter two links the servers.
//!
//! Layers, each built on those before it (never after):
//! 1. [`meta`] (objects' keys), [`resource`] (what an operator names), [`workload`] (a pod's
//!    owner), [`metrics`] (the control plane's registry, which every layer reports to);
//! 2. the Gateway API routes ([`routes`]), which [`destination`] (model, index, path, resolve)
//!    reads for service defaults, beside [`egress`] (EgressNetworks and the routes attached to
//!    them); then [`policy`] (CRDs, model, index). [`identity`] (issuer, token checks, join
//!    tokens) and [`external`] (ExternalWorkloads, read by Destination and policy) come before
//!    the routes;
//!    then [`index_list`], the fan-out that feeds each index the kinds it declares, and the
//!    outbound index above it ([`outbound`]: per parent, Service or EgressNetwork, the routes
//!    attached to it; it declares its own kinds);
//! 3. what the servers and the CLI share on top: [`inject`] (the sidecar and the patch that adds
//!    it), [`tap`] (the tap relay's query and lines), [`ca_init`] (a fresh trust anchor and
//!    issuer on disk).
//!
//! Layers: metrics | resource | meta | workload → identity → external → routes → destination | egress → policy → index_list → outbound | inject | tap | ca_init

pub mod ca_init;
pub mod destination;
pub mod egress;
pub mod external;
pub mod identity;
pub mod index_list;
pub mod inject;
pub mod meta;
pub mod metrics;
pub mod outbound;
pub mod policy;
pub mod resource;
pub mod routes;
pub mod tap;
pub mod workload;
