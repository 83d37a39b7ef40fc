//! Reading a store for the checks: every record's metadata, the bytes of collective tensors,
//! and the first non-finite value of each rank (found while reading, so that GEMM tensors are
//! decoded once and never held). Segments come from the loader compare shares
//! ([`crate::model::store::segments`]).

use std::collections::BTreeMap;

use ttrace_format::reader::{RecordView, Store};
use ttrace_format::record::{Op, Record, Role};
use ttrace_format::FormatError;

use crate::check::nonfinite::{self, NonFinite};

/// One record, with the bytes the collective checks need.
#[derive(Debug, Clone)]
pub struct Rec {
    /// The record's metadata.
    pub record: Record,
    /// Bytes of each tensor for collectives (`None`: not captured, or not a collective).
    pub bytes: Vec<Option<Vec<u8>>>,
}

impl Rec {
    /// The index of the first tensor with `role`.
    pub fn find(&self, role: Role) -> Option<usize> {
        self.record.tensors.iter().position(|t| t.role == role)
    }

    /// The bytes of the tensor with `role`, when captured.
    pub fn bytes_of(&self, role: Role) -> Option<&[u8]> {
        self.find(role)
            .and_then(|i| self.bytes.get(i))
            .and_then(|b| b.as_deref())
    }

    /// `rank R step S seq Q API [nvtx]` for messages.
    pub fn name(&self) -> String {
        let r = &self.record;
        format!("rank {} step {} seq {} {}", r.rank, r.step, r.seq, r.api)
    }
}

/// A store read for checking.
#[derive(Debug, Default)]
pub struct Trace {
    /// Ranks present.
    pub ranks: Vec<u32>,
    /// Every readable record, by rank, then step, then seq.
    pub records: Vec<Rec>,
    /// The earliest non-finite value (by step, then call time) over all ranks.
    pub first_nonfinite: Option<NonFinite>,
    /// Records or tensors that could not be read (they are skipped).
    pub unreadable: Vec<String>,
}

impl Trace {
    /// Records of `rank`, in call order.
    pub fn of_rank(&self, rank: u32) -> impl Iterator<Item = &Rec> {
        self.records.iter().filter(move |r| r.record.rank == rank)
    }
}

/// Reads `store`; `progress(done, total)` counts records.
pub fn load(store: &Store, progress: &mut dyn FnMut(u64, u64)) -> Result<Trace, FormatError> {
    let total: u64 = store
        .manifest()
        .map_or(0, |m| m.ranks.iter().map(|r| r.records).sum());
    let mut trace = Trace {
        ranks: store.ranks(),
        ..Trace::default()
    };
    let mut firsts: BTreeMap<u32, NonFinite> = BTreeMap::new();
    let mut done = 0u64;
    for seg in crate::model::store::segments(store) {
        let (rank, seg) = match seg {
            Ok((rank, _, seg)) => (rank, seg),
            Err(line) => {
                trace.unreadable.push(line);
                continue;
            }
        };
        for view in seg.records() {
            done += 1;
            if done.is_multiple_of(256) {
                progress(done, total.max(done));
            }
            let view = match view {
                Ok(v) => v,
                Err(issue) => {
                    trace.unreadable.push(issue.to_string());
                    continue;
                }
            };
            if let std::collections::btree_map::Entry::Vacant(slot) = firsts.entry(rank) {
                match nonfinite::scan(&view) {
                    Ok(Some(nf)) => {
                        slot.insert(nf);
                    }
                    Ok(None) => {}
                    Err(e) => trace.unreadable.push(e.to_string()),
                }
            }
            trace.records.push(keep(&view, &mut trace.unreadable));
        }
    }
    progress(done, total.max(done));
    // Call times are host times (the host runs ahead of the device): a collective called
    // early receives a NaN made later on another rank. So within a step, a value that a
    // collective "produced" ranks after one that arose locally; then call time decides.
    trace.first_nonfinite = firsts
        .into_values()
        .min_by_key(|n| (n.step, n.via_collective(), n.t_call_ns, n.rank));
    Ok(trace)
}

/// The record, with its tensors' bytes when it is a collective.
fn keep(view: &RecordView<'_>, unreadable: &mut Vec<String>) -> Rec {
    let bytes = match &view.record.op {
        Op::Collective(_) => (0..view.record.tensors.len())
            .map(|i| {
                if !view.is_captured(i) {
                    return None;
                }
                view.tensor_bytes(i)
                    .map_err(|e| unreadable.push(e.to_string()))
                    .ok()
            })
            .collect(),
        _ => vec![None; view.record.tensors.len()],
    };
    Rec {
        record: view.record.clone(),
        bytes,
    }
}
