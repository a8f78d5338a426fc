//! `cnimesh-control`: the control plane. Identity (certificates for workloads), Destination
//! (service discovery) over gRPC speaking `linkerd2-proxy-api`, and the injection webhook.
