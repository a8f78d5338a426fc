//! What the control plane's tap relay speaks, shared with the `cnimesh tap` / `top` commands: the
//! query string ([`query`]) and one line of the answer ([`event`]). The relay itself is
//! `cnimesh_control::tap`.

pub mod event;
pub mod query;

pub use event::{Body, Stream, TapLine};
pub use query::{TOKEN_HEADER, TapQuery};
