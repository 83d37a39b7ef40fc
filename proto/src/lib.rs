//! What a traced process links (`libttrace.so`) and the daemon and store share with it: the
//! [`record::Record`] a snapshot becomes and its [`dtype`]s, the capture [`config`], the
//! snapshot [`ring`], the client–daemon [`wire`] protocol with its descriptor passing
//! ([`fdpass`]) and peer check ([`peer`]), and the one [`producer`] side of that protocol.
//!
//! Nothing here compresses or speaks JSON: `cargo tree -p ttrace-intercept -e normal` must stay
//! free of zstd and serde_json. The trace store on disk is `ttrace-format`, which re-exports
//! these modules under their old paths.

pub mod blockscale;
pub mod config;
pub mod dtype;
pub mod fdpass;
pub mod peer;
pub mod producer;
pub mod record;
pub mod ring;
pub mod secrets;
pub mod tensor;
pub mod wire;

#[cfg(test)]
mod preload_deps;

use std::path::Path;

/// Errors of encoding, decoding, and store I/O. Messages name the file, record or field.
/// (One type for the wire and the store: `ttrace-format` re-exports it.)
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
