//! Opening a store for analysis, the one way compare and check do it: the store and its
//! manifest (a store without one is refused, `ttrace fsck --repair` makes it).

use std::path::Path;

use ttrace_format::reader::Store;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_that_is_not_there_is_refused_naming_its_path() {
        let path = Path::new("/nonexistent/ttrace-model-store-test");
        match open(path) {
            Err(e @ OpenError::Store { .. }) => {
                assert!(e
                    .to_string()
                    .starts_with("/nonexistent/ttrace-model-store-test"))
            }
            Err(e) => panic!("expected a store error, got {e}"),
            Ok(_) => panic!("a missing store opened"),
        }
    }

    #[test]
    fn a_directory_without_a_manifest_is_refused_or_said_unreadable() {
        let dir = std::env::temp_dir().join(format!("ttrace-model-store-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let opened = open(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(opened.is_err(), "an empty directory is no store to analyse");
    }
}
