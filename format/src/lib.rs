//! What every ttrace component shares: the [`record::Record`] a snapshot becomes, the
//! client–daemon [`wire`] protocol and snapshot [`ring`], the capture [`config`], and the
//! trace [`store`] format (specified in docs/format.md).

pub mod blockscale;
pub mod codec;
pub mod config;
pub mod dedup;
pub mod dtype;
pub mod peer;
pub mod reader;
pub mod record;
pub mod recover;
pub mod repair;
pub mod ring;
pub mod secrets;
pub mod store;
pub mod storeset;
pub mod stream;
pub mod tensor;
pub mod wire;

use std::path::Path;

/// Errors of encoding, decoding, and store I/O. Messages name the file, record or field.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{path}: {source}")]
    File {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("corrupt: {0}")]
    Corrupt(String),
    #[error("unsupported version: {0}")]
    Version(String),
}

impl FormatError {
    /// An I/O error on `path`.
    pub fn at(path: &Path, source: std::io::Error) -> FormatError {
        FormatError::File {
            path: path.display().to_string(),
            source,
        }
    }
}
