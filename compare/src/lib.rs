//! Alignment, shard merging, numerics and localization behind `ttrace compare`, and
//! the reference-free consistency checks behind `ttrace check` ([`check`]).
//!
//! `ttrace compare` ([`engine::compare`]): [`trace`] opens the stores (through [`model`],
//! the analysis model compare and check share; their metadata held within a budget by
//! [`records`]), [`align`] finds each run GEMM's reference
//! counterpart, [`engine`] walks the reference's ops and calls the units that place shards
//! (`placement`, `hints`), combine them ([`combine`]), judge reductions (`reductions`),
//! tolerate round-off ([`tolerance`]) and localize the first divergence (`localize`);
//! [`numerics`] measures errors and [`report`] holds what was found (text, JSON, HTML
//! views; the comparisons held within a budget, the rest spilled to a temporary file:
//! `results`, `spill`).

// Items' docs link the private items they rest on: read with `cargo doc --document-private-items`.
#![allow(rustdoc::private_intra_doc_links)]

pub mod align;
pub mod check;
pub mod combine;
mod comparison;
pub mod decoded;
pub mod engine;
pub mod gradscale;
mod hints;
pub mod kernels;
pub mod layout;
mod localize;
pub mod losses;
pub mod model;
pub mod numerics;
pub mod partition;
mod placement;
pub mod prefetch;
mod prepare;
pub mod records;
mod reductions;
pub mod replicas;
pub mod report;
mod results;
pub mod simd;
mod spill;
pub mod tolerance;
pub mod trace;
pub mod twin;
pub mod validate;
pub mod widen;

pub use engine::{compare, CompareOptions, DpScale};

/// Errors of `ttrace compare` (as opposed to divergences, which are in the report).
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// A store could not be opened or read.
    #[error("{}", store_message(.path, .source))]
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
    /// The stores or options cannot be compared as given (another model, precision or
    /// layout; stores swapped; a layout the communicator map contradicts).
    #[error("{0}")]
    Invalid(String),
    /// The comparison's results, spilled to a temporary file (in `TMPDIR`) past their share
    /// of `--memory`, could not be written or read back.
    #[error(
        "the comparison's results, spilled to a temporary file in TMPDIR past their share of \
         --memory, could not be written or read back ({0}): set TMPDIR to a file system with \
         room, or give a larger --memory"
    )]
    Results(std::io::Error),
}

impl From<model::store::OpenError> for CompareError {
    fn from(e: model::store::OpenError) -> CompareError {
        match e {
            model::store::OpenError::Store { path, source } => CompareError::Store { path, source },
            model::store::OpenError::NoManifest(path) => CompareError::NoManifest(path),
        }
    }
}

/// `path: error`, or the error alone when it names the path already.
fn store_message(path: &str, e: &ttrace_format::FormatError) -> String {
    let text = e.to_string();
    if text.contains(path) {
        text
    } else {
        format!("{path}: {text}")
    }
}

/// One line for an error and its causes, each cause said once: a cause whose text an
/// earlier message already holds (a store error that names its path and its I/O error) is
/// not repeated.
pub fn error_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = c.source();
    }
    line
}
