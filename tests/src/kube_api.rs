//! The in-process Kubernetes API server, where the end-to-end tests have always found it: it lives
//! in `cnimesh-apiserver`, which local mode uses too.

pub use cnimesh_apiserver::*;
