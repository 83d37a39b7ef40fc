//! Opening a store for analysis, the one way compare and check do it: the store and its
//! manifest (a store without one is refused, `ttrace fsck --repair` makes it), and its
//! segments rank by rank, step by step, each unreadable one said once.

use std::path::Path;

use ttrace_format::reader::{Segment, Store};
use ttrace_format::store::Manifest;
use ttrace_format::FormatError;

/// Why a store could not be opened for analysis.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The store could not be opened or read.
    #[error("{path}: {source}")]
    Store {
        /// The store.
        path: String,
        /// What failed.
        #[source]
        source: FormatError,
    },
    /// The store has no readable manifest.
    #[error("{0}: no readable manifest (try `ttrace fsck --repair`)")]
    NoManifest(String),
}

/// Opens the store at `path` with its manifest.
pub fn open(path: &Path) -> Result<(Store, Manifest), OpenError> {
    let store = Store::open(path).map_err(|source| OpenError::Store {
        path: path.display().to_string(),
        source,
    })?;
    let manifest = store
        .manifest()
        .cloned()
        .ok_or_else(|| OpenError::NoManifest(path.display().to_string()))?;
    Ok((store, manifest))
}

/// Every segment of `store`, rank by rank and step by step, opened; a segment that cannot
/// be opened is skipped and said in `unreadable` (`rank R step S: error`).
pub fn segments<'a>(
    store: &'a Store,
    unreadable: &'a mut Vec<String>,
) -> impl Iterator<Item = (u32, u64, Segment)> + 'a {
    let keys: Vec<(u32, u64)> = store
        .ranks()
        .into_iter()
        .flat_map(|rank| store.steps(rank).into_iter().map(move |step| (rank, step)))
        .collect();
    keys.into_iter()
        .filter_map(move |(rank, step)| match store.open_segment(rank, step) {
            Ok(seg) => Some((rank, step, seg)),
            Err(e) => {
                unreadable.push(format!("rank {rank} step {step}: {e}"));
                None
            }
        })
}
