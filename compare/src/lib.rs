//! Alignment, shard merging, numerics and localization behind `ttrace compare` (issue 6), and
//! the reference-free consistency checks behind `ttrace check` (issue 7, [`check`]).
//!
//! `ttrace compare` ([`engine::compare`]): [`trace`] opens the stores, [`align`] finds each
//! run GEMM's reference counterpart, [`numerics`] places shards and measures errors,
//! [`tolerance`] says how much round-off explains, [`engine`] localizes the first divergence,
//! and [`report`] holds what was found (text, JSON, HTML views).

pub mod align;
pub mod check;
pub mod engine;
pub mod layout;
pub mod numerics;
pub mod report;
pub mod tolerance;
pub mod trace;

pub use engine::{compare, CompareOptions};

/// Errors of `ttrace compare` (as opposed to divergences, which are in the report).
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// A store could not be opened or read.
    #[error("{path}: {source}")]
    Store {
        /// The store.
        path: String,
        /// What failed.
        #[source]
        source: ttrace_format::FormatError,
    },
    /// A store has no manifest.
    #[error("{0}: no readable manifest (try `ttrace fsck --repair`)")]
    NoManifest(String),
    /// A store holds no records.
    #[error("{0}: the store holds no records")]
    Empty(String),
    /// A record could not be read.
    #[error("{0}")]
    Record(String),
    /// Nothing in the run lines up with the reference.
    #[error("{0}")]
    NothingAligned(String),
    /// The steps asked for are not in both runs.
    #[error("{0}")]
    Steps(String),
}
