//! The trace store on disk (specified in docs/format.md): segments of framed records
//! ([`frame`] holds the one definition of their headers), blobs and their [`codec`]s, indexes,
//! the [`reader`], [`recover`]y and its [`repair`] policy, [`dedup`] references, [`stream`]ed
//! tensors, sets of stores, and sizes as people read them ([`units`]).
//!
//! The vocabulary the store shares with the traced process (records, dtypes, configuration,
//! ring, wire protocol) lives in `ttrace-proto`, the crate `libttrace.so` links; it is
//! re-exported here under its old paths, so `ttrace_format::record::Record` still names it.

// Items' docs link the private items they rest on: read with `cargo doc --document-private-items`.
#![allow(rustdoc::private_intra_doc_links)]

pub mod codec;
pub mod dedup;
pub mod frame;
pub mod reader;
pub mod recover;
pub mod repair;
pub mod store;
pub mod storeset;
pub mod stream;
pub mod units;

pub use ttrace_proto::{
    blockscale, config, dtype, fdpass, peer, producer, record, ring, secrets, tensor, wire,
    FormatError,
};
