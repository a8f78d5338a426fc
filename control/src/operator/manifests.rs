//! The manifests under `daemonset/`, compiled in.
