//! Baseline of the compare benchmark (`scripts/bench-compare.sh`): read and decompress every
//! captured tensor of the given stores, checking each one's CRC-32, and do nothing else. What
//! `ttrace compare` costs beyond this is alignment, shard placement and numerics.
//!
//! ```text
//! read_all STORE...
//! ```
//!
//! Prints one line per store and a total line, `total: stores S records R tensors T
//! raw_bytes B stored_bytes C seconds X`, with B the decoded bytes. Segments are read in
//! parallel on every core, as `ttrace compare` uses them (`RAYON_NUM_THREADS=1`: one).
//! Exits 1 when a record or tensor could not be read (after reading the rest), 2 on usage
//! errors.

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use rayon::prelude::*;
use ttrace_format::reader::Store;

/// What was read from one store (or from all of them).
#[derive(Default)]
struct Totals {
    records: u64,
    tensors: u64,
    raw_bytes: u64,
    stored_bytes: u64,
    errors: u64,
}

impl Totals {
    fn add(&mut self, o: &Totals) {
        self.records += o.records;
        self.tensors += o.tensors;
        self.raw_bytes += o.raw_bytes;
        self.stored_bytes += o.stored_bytes;
        self.errors += o.errors;
    }
}

/// Decodes every captured tensor of the store at `root`, its segments in parallel.
fn read_store(root: &Path) -> Totals {
    let store = match Store::open(root) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("read_all: {}: {e}", root.display());
            return Totals {
                errors: 1,
                ..Totals::default()
            };
        }
    };
    let segments: Vec<(u32, u64)> = store
        .ranks()
        .into_iter()
        .flat_map(|rank| store.steps(rank).into_iter().map(move |step| (rank, step)))
        .collect();
    segments
        .par_iter()
        // Two buffers per thread, reused: the benchmark measures decoding, not the allocator.
        .map_init(
            || (Vec::new(), Vec::new()),
            |(scratch, out), &(rank, step)| read_segment(&store, rank, step, scratch, out),
        )
        .reduce(Totals::default, |mut a, b| {
            a.add(&b);
            a
        })
}

/// Decodes every captured tensor of one segment.
fn read_segment(
    store: &Store,
    rank: u32,
    step: u64,
    scratch: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> Totals {
    let mut t = Totals::default();
    let seg = match store.open_segment(rank, step) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("read_all: {e}");
            t.errors += 1;
            return t;
        }
    };
    for view in seg.records() {
        let view = match view {
            Ok(v) => v,
            Err(issue) => {
                eprintln!("read_all: {issue}");
                t.errors += 1;
                continue;
            }
        };
        t.records += 1;
        for i in 0..view.record.tensors.len() {
            if !view.is_captured(i) {
                continue;
            }
            t.stored_bytes += view.stored_len(i).unwrap_or(0);
            match view.tensor_bytes_into(i, scratch, out) {
                Ok(()) => {
                    t.tensors += 1;
                    t.raw_bytes += out.len() as u64;
                }
                Err(e) => {
                    eprintln!("read_all: {e}");
                    t.errors += 1;
                }
            }
        }
    }
    t
}

fn line(t: &Totals, secs: f64) -> String {
    format!(
        "records {} tensors {} raw_bytes {} stored_bytes {} seconds {secs:.6}",
        t.records, t.tensors, t.raw_bytes, t.stored_bytes
    )
}

fn main() -> ExitCode {
    let stores: Vec<String> = std::env::args().skip(1).collect();
    if stores.is_empty() || stores.iter().any(|s| s.starts_with('-')) {
        eprintln!("usage: read_all STORE...");
        return ExitCode::from(2);
    }
    let mut total = Totals::default();
    let started = Instant::now();
    for s in &stores {
        let t0 = Instant::now();
        let t = read_store(Path::new(s));
        println!("{s}: {}", line(&t, t0.elapsed().as_secs_f64()));
        total.add(&t);
    }
    println!(
        "total: stores {} {}",
        stores.len(),
        line(&total, started.elapsed().as_secs_f64())
    );
    if total.errors > 0 {
        eprintln!("read_all: {} unreadable records or tensors", total.errors);
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}
