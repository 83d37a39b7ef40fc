//! Recomputing captured ops from their captured inputs: a GEMM with `sim_kernels::gemm`, an
//! all-reduce with the ring-order reduction of `sim_kernels::reduce`. A capture that took an
//! operand at the wrong moment, packed it wrong or lost a parameter fails these bitwise checks.

use std::collections::BTreeMap;

use sim_kernels::gemm::{
    gemm, Activation, BiasLayout, Buffers, CInput, Compute, Epilogue, Gemm, Layout, Op as SimOp,
};
use sim_kernels::reduce::{allreduce_first_rank, reduce_chain, ReduceOp};
use ttrace_format::dtype::DType;
use ttrace_format::record::{CollectiveKind, GemmOp, Op, Role};

use super::{sim_dtype, Rec};

/// One f32 value of a captured scalar tensor.
pub fn f32_of(r: &Rec, role: Role) -> f64 {
    let (t, b) = r.tensor(role);
    assert_eq!(t.dtype, DType::F32, "{role:?}");
    f32::from_le_bytes(b[..4].try_into().expect("4 bytes")) as f64
}

/// A captured scalar of the GEMM's scale type (device pointer mode).
pub fn scalar(r: &Rec, role: Role) -> f64 {
    let (t, b) = r.tensor(role);
    sim_dtype(t.dtype).load(b, 0)
}

/// The result (D, aux, amax) `sim_kernels::gemm` computes from a record's captured inputs.
pub fn recompute(r: &Rec) -> (Vec<u8>, Option<Vec<u8>>, f64) {
    let Op::Gemm(g) = &r.record.op else {
        panic!("not a GEMM: {:?}", r.record.op)
    };
    let g: &GemmOp = g;
    let (m, n, k, batch) = (g.m as usize, g.n as usize, g.k as usize, g.batch as usize);
    let transa = SimOp::from_cublas(g.transa).expect("transa");
    let transb = SimOp::from_cublas(g.transb).expect("transb");
    let (ar, ac) = if transa == SimOp::N { (m, k) } else { (k, m) };
    let (br, bc) = if transb == SimOp::N { (k, n) } else { (n, k) };
    let packed = |role: Role, rows: usize, cols: usize| {
        let (t, _) = r.tensor(role);
        Layout::col(sim_dtype(t.dtype), rows).strided(rows * cols)
    };
    let (a_t, a) = r.tensor(Role::A);
    let (_, b) = r.tensor(Role::B);
    let (d_t, _) = r.tensor(Role::D);
    let c_in = r.has(Role::CIn).then(|| r.tensor(Role::CIn).1.to_vec());
    let scale_type = sim_dtype(DType::from_cuda(g.scale_type).expect("scale type"));
    let alpha = g.alpha.unwrap_or_else(|| scalar(r, Role::Alpha));
    let beta = match (&c_in, g.beta) {
        (None, _) => 0.0,
        (Some(_), Some(b)) => b,
        (Some(_), None) => scalar(r, Role::Beta),
    };
    let mut epilogue = Epilogue::default();
    match g.epilogue {
        1 => {}
        4 => {
            let (t, _) = r.tensor(Role::Bias);
            epilogue.bias = Some(BiasLayout {
                dtype: sim_dtype(t.dtype),
                batch_stride: if t.shape.len() == 2 { m } else { 0 },
            })
        }
        160 => {
            epilogue.activation = Activation::Gelu;
            epilogue.aux = Some(packed(Role::Aux, m, n));
        }
        e => panic!("epilogue {e} not covered by this test"),
    }
    for (role, slot) in [
        (Role::ScaleA, &mut epilogue.scale_a),
        (Role::ScaleB, &mut epilogue.scale_b),
        (Role::ScaleC, &mut epilogue.scale_c),
        (Role::ScaleD, &mut epilogue.scale_d),
    ] {
        if r.has(role) {
            *slot = f32_of(r, role);
        }
    }
    let sg = Gemm {
        m,
        n,
        k,
        batch,
        transa,
        transb,
        a: Layout::col(sim_dtype(a_t.dtype), ar).strided(ar * ac),
        b: packed(Role::B, br, bc),
        c: if c_in.is_some() {
            packed(Role::CIn, m, n)
        } else {
            packed(Role::D, m, n)
        },
        d: packed(Role::D, m, n),
        compute: Compute::from_raw(g.compute_type).expect("compute type"),
        scale_type,
        alpha,
        beta,
        epilogue,
    };
    let mut d = vec![0u8; d_t.nbytes as usize];
    let mut aux = r
        .has(Role::Aux)
        .then(|| vec![0u8; r.tensor(Role::Aux).0.nbytes as usize]);
    let bias = r.has(Role::Bias).then(|| r.tensor(Role::Bias).1);
    let out = gemm(
        &sg,
        Buffers {
            a,
            b,
            c: c_in.as_deref().map_or(CInput::None, CInput::Buffer),
            d: &mut d,
            bias,
            aux: aux.as_deref_mut(),
            bgrad: None,
        },
    )
    .unwrap_or_else(|e| panic!("{}: {e}", r.record.api));
    (d, aux, out.amax_d)
}

/// Checks every all-reduce of `records` (grouped per communicator by call order): each
/// member's output equals the ring-order reduction of the members' captured inputs, bitwise.
/// Returns how many calls were checked.
pub fn check_all_reduces(records: &[Rec]) -> usize {
    let mut calls: BTreeMap<(u64, usize), Vec<&Rec>> = BTreeMap::new();
    let mut count: BTreeMap<(u64, u32), usize> = BTreeMap::new();
    for r in records {
        let Op::Collective(c) = &r.record.op else {
            continue;
        };
        if c.kind != CollectiveKind::AllReduce {
            continue;
        }
        let n = count.entry((c.comm, r.record.rank)).or_default();
        calls.entry((c.comm, *n)).or_default().push(r);
        *n += 1;
    }
    assert!(!calls.is_empty());
    let mut checked = 0;
    for ((comm, n), mut recs) in calls {
        let Op::Collective(c0) = &recs[0].record.op else {
            unreachable!()
        };
        assert_eq!(recs.len(), c0.comm_size as usize, "comm {comm:x} call {n}");
        recs.sort_by_key(|r| match &r.record.op {
            Op::Collective(c) => c.comm_rank,
            _ => unreachable!(),
        });
        let (t, _) = recs[0].tensor(Role::Input);
        let dt = sim_dtype(t.dtype);
        let op = match c0.redop {
            Some(0) => ReduceOp::Sum,
            Some(2) => ReduceOp::Max,
            Some(3) => ReduceOp::Min,
            Some(4) => ReduceOp::avg(dt, recs.len()),
            other => panic!("reduction {other:?}"),
        };
        let inputs: Vec<&[u8]> = recs.iter().map(|r| r.tensor(Role::Input).1).collect();
        let es = dt.size();
        let count = inputs[0].len() / es;
        let mut want = vec![0u8; inputs[0].len()];
        for e in 0..count {
            let one: Vec<&[u8]> = inputs.iter().map(|i| &i[e * es..(e + 1) * es]).collect();
            let first = allreduce_first_rank(e, count, inputs.len());
            reduce_chain(dt, op, &one, first, &mut want[e * es..(e + 1) * es]);
        }
        for r in &recs {
            assert!(
                r.tensor(Role::Output).1 == &want[..],
                "all-reduce {n} on comm {comm:x}, rank {}: output differs",
                r.record.rank
            );
        }
        checked += 1;
    }
    checked
}
