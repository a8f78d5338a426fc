//! What every model reads off a Kubernetes object before anything else: its key (namespace and
//! name), and how a model refuses an object it cannot use. Destination, policy and the Gateway
//! API routes all share these, so they live below all three.
//!
//! Layer: model/index (pure).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Namespace and name: how every object is addressed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NsName {
    pub namespace: String,
    pub name: String,
}

impl NsName {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self { namespace: namespace.into(), name: name.into() }
    }

    /// Objects without a namespace are in `default`, as `kubectl apply` would place them.
    pub fn of(meta: &ObjectMeta) -> Self {
        Self::new(meta.namespace.as_deref().unwrap_or("default"), meta.name.as_deref().unwrap_or_default())
    }
}

impl std::fmt::Display for NsName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A resource the model refuses, with why; logged by the index with the resource's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

pub(crate) fn key_of(meta: &ObjectMeta) -> NsName {
    NsName::new(meta.namespace.as_deref().unwrap_or("default"), meta.name.as_deref().unwrap_or_default())
}

/// `From<T>` for each boxed variant of an index's `Object` enum: the policy and egress indexes
/// take every kind they watch as one enum, whose variants are boxed to keep it small.
macro_rules! boxed_from {
    ($object:ident: $($ty:ty => $variant:ident),* $(,)?) => {$(
        impl From<$ty> for $object {
            fn from(o: $ty) -> Self {
                $object::$variant(Box::new(o))
            }
        }
    )*};
}
pub(crate) use boxed_from;
