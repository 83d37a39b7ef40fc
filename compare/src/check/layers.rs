//! Consistency across layers: the layers of a model run the same code, so the same GEMM of
//! every layer (same module kind, e.g. `layers.#.mlp.fc2`, same shape, same use within the
//! step) must be called with the same `beta` (whether it accumulates into its output). A
//! layer that overwrites where the others accumulate (or the reverse) is a finding; at least
//! three layers must be compared, so that the odd one out is known.

use std::collections::BTreeMap;

use ttrace_format::record::{Op, Role};

use crate::check::load::Trace;
use crate::check::replicas::module_kind;
use crate::check::report::{Finding, FindingKind};

/// One GEMM's place: (step, API, module kind, m, n, k, transposes, use within its module).
type Place = (u64, String, String, [u64; 5], usize);

/// Runs the check on every rank; a finding lists every rank where it shows.
pub fn check(trace: &Trace) -> Vec<Finding> {
    // (place, odd module) -> (ranks, detail, example op)
    let mut found: BTreeMap<(Place, String), (Vec<u32>, String, String)> = BTreeMap::new();
    for &rank in &trace.ranks {
        let mut uses: BTreeMap<(u64, String), usize> = BTreeMap::new();
        let mut places: BTreeMap<Place, Vec<(String, bool, String)>> = BTreeMap::new();
        for r in trace.of_rank(rank) {
            let Op::Gemm(g) = &r.record.op else { continue };
            let Some(module) = r.record.nvtx.last() else {
                continue;
            };
            let kind = module_kind(module);
            if kind == *module {
                // Not a per-layer module.
                continue;
            }
            let u = uses.entry((r.record.step, module.clone())).or_default();
            let accumulates = g.beta.map_or_else(
                || r.record.tensors.iter().any(|t| t.role == Role::CIn),
                |b| b != 0.0,
            );
            places
                .entry((
                    r.record.step,
                    r.record.api.clone(),
                    kind,
                    [g.m, g.n, g.k, g.transa as u64, g.transb as u64],
                    *u,
                ))
                .or_default()
                .push((module.clone(), accumulates, r.name()));
            *u += 1;
        }
        for (place, inst) in places {
            if inst.len() < 3 {
                continue;
            }
            let acc = inst.iter().filter(|i| i.1).count();
            let odd_acc = acc * 2 < inst.len();
            if acc == 0 || acc == inst.len() || acc * 2 == inst.len() {
                continue;
            }
            for (module, a, name) in inst.iter().filter(|i| i.1 == odd_acc) {
                let detail = format!(
                    "this GEMM {} (beta {}) where the same GEMM of the other {} layers {}",
                    if *a {
                        "accumulates into its output"
                    } else {
                        "overwrites its output"
                    },
                    if *a { "!= 0" } else { "= 0" },
                    inst.len() - 1,
                    if *a { "overwrite" } else { "accumulate" },
                );
                let e = found
                    .entry((place.clone(), module.clone()))
                    .or_insert_with(|| (Vec::new(), detail, name.clone()));
                e.0.push(rank);
            }
        }
    }
    found
        .into_iter()
        .map(|((place, module), (ranks, detail, op))| Finding {
            kind: FindingKind::LayerInconsistency,
            step: place.0,
            ranks,
            op,
            module,
            detail,
        })
        .collect()
}
