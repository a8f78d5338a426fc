//! The proxy as a process: configuration and command line ([`config`], [`cli`]), wiring
//! ([`run`], [`shared`]), the listeners and their connection limits ([`listen`], [`admission`]),
//! and the admin server ([`admin`]). What a connection and its requests go through once accepted
//! is the serving layer's ([`crate::serve`]).

pub mod admin;
pub mod admission;
pub mod cli;
pub mod config;
pub mod listen;
pub mod run;
pub mod shared;
