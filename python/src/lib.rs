//! `ttrace._native`: a trace store read through ttrace's own reader (format/src/reader.rs),
//! for the Python package in python/ttrace. Metadata crosses as JSON (the same serde models
//! `ttrace show --json` prints); tensor bytes cross as a NumPy `uint8` array that owns the
//! decoded buffer (no copy), which the Python side views with the tensor's dtype and shape.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

use numpy::{IntoPyArray, PyArray1};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use ttrace_format::reader::{Segment, Store as StoreReader};
use ttrace_format::FormatError;

create_exception!(
    _native,
    TraceError,
    PyException,
    "A store, segment or record could not be read (the message is the CLI's)."
);

fn trace_err(e: impl std::fmt::Display) -> PyErr {
    TraceError::new_err(e.to_string())
}

/// An open trace store.
#[pyclass(module = "ttrace._native")]
struct Store {
    reader: StoreReader,
    /// The segment read last: reading a record's tensors one after another maps it once.
    open: Mutex<HashMap<(u32, u64), Segment>>,
}

impl Store {
    /// Runs `f` on the segment of (rank, step), opening (and caching) it first.
    fn with_segment<T>(
        &self,
        rank: u32,
        step: u64,
        f: impl FnOnce(&Segment) -> Result<T, FormatError>,
    ) -> Result<T, FormatError> {
        let mut open = self
            .open
            .lock()
            .map_err(|_| FormatError::Invalid("a reader thread panicked".into()))?;
        if !open.contains_key(&(rank, step)) {
            let seg = self.reader.open_segment(rank, step)?;
            open.clear();
            open.insert((rank, step), seg);
        }
        let seg = open
            .get(&(rank, step))
            .ok_or_else(|| FormatError::Invalid("segment cache".into()))?;
        f(seg)
    }
}

#[pymethods]
impl Store {
    /// Opens the store at `path` (a run directory).
    #[new]
    fn new(py: Python<'_>, path: PathBuf) -> PyResult<Store> {
        let reader = py.detach(|| StoreReader::open(&path)).map_err(trace_err)?;
        Ok(Store {
            reader,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// The store's directory.
    fn root(&self) -> String {
        self.reader.root().display().to_string()
    }

    /// manifest.json as JSON text (`None`: no readable manifest).
    fn manifest_json(&self) -> PyResult<Option<String>> {
        self.reader
            .manifest()
            .map(serde_json::to_string)
            .transpose()
            .map_err(trace_err)
    }

    /// Ranks with at least one segment.
    fn ranks(&self) -> Vec<u32> {
        self.reader.ranks()
    }

    /// Steps of `rank`.
    fn steps(&self, rank: u32) -> Vec<u64> {
        self.reader.steps(rank)
    }

    /// What the reader found wrong while opening the store (JSON list).
    fn issues_json(&self) -> PyResult<String> {
        serde_json::to_string(self.reader.issues()).map_err(trace_err)
    }

    /// The records of (rank, step) in seq order, as a JSON list of the record models `ttrace
    /// show --json` prints, each tensor with `stored_bytes`; then the segment's issues.
    fn records_json(&self, py: Python<'_>, rank: u32, step: u64) -> PyResult<(String, String)> {
        py.detach(|| {
            self.with_segment(rank, step, |seg| {
                let mut recs = Vec::with_capacity(seg.len());
                for i in 0..seg.len() {
                    let Ok(view) = seg.read_meta(i) else {
                        continue; // reported in the segment's issues
                    };
                    let mut v = serde_json::to_value(&view.record)
                        .map_err(|e| FormatError::Invalid(e.to_string()))?;
                    if let Some(ts) = v.get_mut("tensors").and_then(|t| t.as_array_mut()) {
                        for (k, t) in ts.iter_mut().enumerate() {
                            if let Some(o) = t.as_object_mut() {
                                o.insert("stored_bytes".into(), view.stored_len(k).into());
                            }
                        }
                    }
                    recs.push(v);
                }
                let issues = serde_json::to_string(seg.issues())
                    .map_err(|e| FormatError::Invalid(e.to_string()))?;
                let recs = serde_json::to_string(&recs)
                    .map_err(|e| FormatError::Invalid(e.to_string()))?;
                Ok((recs, issues))
            })
        })
        .map_err(trace_err)
    }

    /// Tensor `index` of record `seq` of (rank, step): its bytes, decoded and checked
    /// against the record's CRC-32, as a `uint8` array.
    fn tensor_bytes<'py>(
        &self,
        py: Python<'py>,
        rank: u32,
        step: u64,
        seq: u64,
        index: usize,
    ) -> PyResult<Bound<'py, PyArray1<u8>>> {
        let bytes = py
            .detach(|| {
                self.with_segment(rank, step, |seg| {
                    let view = seg
                        .read_seq(seq)
                        .ok_or_else(|| {
                            FormatError::Invalid(format!(
                                "{}: no record rank {rank} step {step} seq {seq}",
                                seg.path().display()
                            ))
                        })?
                        .map_err(|i| FormatError::Corrupt(i.to_string()))?;
                    view.tensor_bytes(index)
                })
            })
            .map_err(trace_err)?;
        Ok(bytes.into_pyarray(py))
    }
}

/// The module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Store>()?;
    m.add("TraceError", m.py().get_type::<TraceError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
