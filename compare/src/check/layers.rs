//! Consistency across layers: the layers of a model run the same code, so the same GEMM of
//! every layer (same module kind, e.g. `layers.#.mlp.fc2`, same shape, same use within the
//! step) must be called with the same `alpha` (a scale such as attention's 1/sqrt(d)) and the
//! same `beta` (whether it accumulates into its output). A layer that differs from a strict
//! majority of the others is a finding; at least three layers must be compared, so that the
//! odd one out is known.

use std::collections::BTreeMap;

use ttrace_format::record::{Op, Role};

use crate::check::load::Trace;
use crate::check::replicas::module_kind;
use crate::check::report::{Finding, FindingKind};

/// One GEMM's place: (step, API, module kind, m, n, k, transposes, use within its module).
type Place = (u64, String, String, [u64; 5], usize);

/// How a GEMM is called: whether it accumulates (beta != 0), and alpha's bits when it is a
/// host scalar.
type Call = (bool, Option<u64>);

fn describe(c: Call) -> String {
    let alpha = c.1.map_or("alpha in device memory".to_string(), |a| {
        format!("alpha {}", f64::from_bits(a))
    });
    let beta = if c.0 {
        "beta != 0 (accumulates)"
    } else {
        "beta = 0 (overwrites)"
    };
    format!("{alpha}, {beta}")
}

/// Runs the check on every rank; a finding lists every rank where it shows.
pub fn check(trace: &Trace) -> Vec<Finding> {
    // (place, odd module) -> (ranks, detail, example op)
    let mut found: BTreeMap<(Place, String), (Vec<u32>, String, String)> = BTreeMap::new();
    for &rank in &trace.ranks {
        let mut uses: BTreeMap<(u64, String), usize> = BTreeMap::new();
        let mut places: BTreeMap<Place, Vec<(String, Call, String)>> = BTreeMap::new();
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
                .push((
                    module.clone(),
                    (accumulates, g.alpha.map(f64::to_bits)),
                    r.name(),
                ));
            *u += 1;
        }
        for (place, inst) in places {
            if inst.len() < 3 {
                continue;
            }
            let mut counts: BTreeMap<Call, usize> = BTreeMap::new();
            for i in &inst {
                *counts.entry(i.1).or_default() += 1;
            }
            let Some((&usual, &most)) = counts.iter().max_by_key(|(_, c)| **c) else {
                continue;
            };
            if most * 2 <= inst.len() {
                continue;
            }
            for (module, call, name) in inst.iter().filter(|i| i.1 != usual) {
                let detail = format!(
                    "this GEMM is called with {} where the same GEMM of {most} of the other {} layers has {}",
                    describe(*call),
                    inst.len() - 1,
                    describe(usual)
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
