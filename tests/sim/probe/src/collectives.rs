//! NCCL probe, run as every rank of a job (`simrun --nproc-per-node N -- sim-probe collectives`):
//! communicators from `NCCL_COMM_ID` (set from MASTER_ADDR:MASTER_PORT), every collective and
//! reduction in FP32/BF16/FP8, in-place variants, point-to-point rings and large grouped
//! exchanges, split communicators used concurrently with the world, group deferral (a copy
//! enqueued inside a group sees stale data), asynchrony and graph capture. Results are checked against an f64
//! reference within the round-off of a chain of `n - 1` roundings in the buffer's type, and
//! all-reduce results are all-gathered to check that every rank got the same bits.
//!
//! Modes (first argument): `all` (default), `kill RANK` (that rank SIGKILLs itself during a
//! collective; the others must fail with an NCCL error, and exit nonzero, within seconds),
//! `exit RANK` (the same with a plain `exit(3)`), `single-process` (no simrun: one process
//! drives 4 devices with `ncclCommInitAll` and with grouped `ncclCommInitRank`).
// NCCL's enum constants (`ncclSum`, ...) are matched as patterns.
#![allow(non_upper_case_globals)]

use core::ffi::{c_int, c_void};
use std::time::{Duration, Instant};

use cuda_dyn::abi::cudart::*;
use cuda_dyn::abi::nccl::*;
use cuda_dyn::cudart::*;
use cuda_dyn::nccl::*;
use sim_kernels::dtype::DType;

use crate::support::{ck, cstr, job, nc, nccl_error, stream, world, DevBuf, Job};

fn nccl_type(t: DType) -> ncclDataType_t {
    match t {
        DType::F32 => ncclFloat32,
        DType::BF16 => ncclBfloat16,
        DType::E4M3 => ncclFloat8e4m3,
        DType::E5M2 => ncclFloat8e5m2,
        DType::F16 => ncclFloat16,
        DType::F64 => ncclFloat64,
        DType::I32 => ncclInt32,
        _ => ncclUint8,
    }
}

/// Input element `i` of rank `r`: multiples of 1/4 in [-2, 2], exact in every float type.
fn value(r: usize, i: usize) -> f64 {
    ((i * 7 + r * 13) % 17) as f64 / 4.0 - 2.0
}

/// Input for products: {0.75, 0.875, 1, 1.125, 1.25} (E5M2 rounds 0.875 and 1.125).
fn prod_value(r: usize, i: usize) -> f64 {
    1.0 + ((i + 3 * r) % 5) as f64 / 8.0 - 0.25
}

fn encode(t: DType, vals: impl Iterator<Item = f64>) -> Vec<u8> {
    let vals: Vec<f64> = vals.collect();
    let mut b = vec![0u8; vals.len() * t.size()];
    for (i, v) in vals.iter().enumerate() {
        t.store(&mut b, i, *v);
    }
    b
}

fn decode(t: DType, b: &[u8]) -> Vec<f64> {
    (0..b.len() / t.size()).map(|i| t.load(b, i)).collect()
}

/// Half the smallest subnormal of `t`: the absolute round-off floor near zero.
fn floor(t: DType) -> f64 {
    match t {
        DType::E4M3 => 2f64.powi(-10),
        DType::E5M2 => 2f64.powi(-17),
        DType::F16 => 2f64.powi(-25),
        _ => 0.0,
    }
}

/// Checks `got` against `want` within `tol` (all per element).
fn check_close(what: &str, got: &[f64], want: &[f64], tol: &[f64]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} elements, expected {}",
            got.len(),
            want.len()
        ));
    }
    for i in 0..got.len() {
        // Written so that a NaN fails.
        let close = (got[i] - want[i]).abs() <= tol[i];
        if !close {
            return Err(format!(
                "{what}: element {i} is {}, expected {} within {}",
                got[i], want[i], tol[i]
            ));
        }
    }
    Ok(())
}

/// Reference and tolerance of a reduction of `n` ranks' inputs `x(r, i)` in type `t`: a chain of
/// `n - 1` roundings, each at most `u` times a partial result bounded by the sum of |inputs|.
fn reference(
    t: DType,
    op: ncclRedOp_t,
    n: usize,
    count: usize,
    x: impl Fn(usize, usize) -> f64,
) -> (Vec<f64>, Vec<f64>) {
    let u = t.epsilon() / 2.0;
    let chain = (n - 1) as f64;
    let mut want = Vec::with_capacity(count);
    let mut tol = Vec::with_capacity(count);
    for i in 0..count {
        // The inputs as the buffer holds them.
        let xs: Vec<f64> = (0..n).map(|r| t.round(x(r, i))).collect();
        let abs: f64 = xs.iter().map(|v| v.abs()).sum();
        let (w, e) = match op {
            ncclSum => (xs.iter().sum(), chain * u * abs * 1.01 + chain * floor(t)),
            ncclProd => {
                let p: f64 = xs.iter().product();
                (p, chain * u * p.abs() * 1.05 + chain * floor(t))
            }
            ncclMax => (xs.iter().cloned().fold(f64::MIN, f64::max), 0.0),
            ncclMin => (xs.iter().cloned().fold(f64::MAX, f64::min), 0.0),
            _ => {
                // Avg: NCCL multiplies every input by 1/n rounded (through float) to the type,
                // rounds each product, then sums.
                let s = t.round((1.0 / n as f64) as f32 as f64);
                let mean = xs.iter().sum::<f64>() / n as f64;
                let scale_err = (s - 1.0 / n as f64).abs() * abs;
                (
                    mean,
                    scale_err + n as f64 * u * s * abs * 1.01 + n as f64 * floor(t),
                )
            }
        };
        want.push(w);
        tol.push(e);
    }
    (want, tol)
}

fn op_name(op: ncclRedOp_t) -> &'static str {
    ["sum", "prod", "max", "min", "avg"]
        .get(op as usize)
        .copied()
        .unwrap_or("user")
}

/// All-gathers `data` (bytes) over `comm` and checks every rank holds the same bytes.
fn same_everywhere(
    what: &str,
    data: &[u8],
    comm: ncclComm_t,
    n: usize,
    s: cudaStream_t,
) -> Result<(), String> {
    let src = DevBuf::from_host(data)?;
    let all = DevBuf::new(data.len() * n)?;
    nc!(ncclAllGather(
        src.ptr,
        all.ptr,
        data.len(),
        ncclUint8,
        comm,
        s
    ));
    ck!(cudaStreamSynchronize(s));
    let got = all.read()?;
    for r in 0..n {
        if got[r * data.len()..(r + 1) * data.len()] != *data {
            return Err(format!("{what}: rank {r} got different bits"));
        }
    }
    Ok(())
}

fn all_reduce_checks(j: &Job, comm: ncclComm_t, s: cudaStream_t) -> Result<(), String> {
    let n = j.n;
    for t in [DType::F32, DType::BF16, DType::E4M3, DType::E5M2] {
        // 300k FP32 elements span several 256 KiB staging windows.
        let count = if t == DType::F32 { 300_000 } else { 5_000 };
        for op in [ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg] {
            let x = |r: usize, i: usize| {
                if op == ncclProd {
                    prod_value(r, i)
                } else {
                    value(r, i)
                }
            };
            let send = DevBuf::from_host(&encode(t, (0..count).map(|i| x(j.rank, i))))?;
            let recv = DevBuf::new(count * t.size())?;
            nc!(ncclAllReduce(
                send.ptr,
                recv.ptr,
                count,
                nccl_type(t),
                op,
                comm,
                s
            ));
            ck!(cudaStreamSynchronize(s));
            let bytes = recv.read()?;
            let (want, tol) = reference(t, op, n, count, x);
            let what = format!("all-reduce {} {t:?}", op_name(op));
            check_close(&what, &decode(t, &bytes), &want, &tol)?;
            same_everywhere(&what, &bytes, comm, n, s)?;
        }
    }
    // In place, BF16 sum.
    let (t, count) = (DType::BF16, 70_000);
    let buf = DevBuf::from_host(&encode(t, (0..count).map(|i| value(j.rank, i))))?;
    nc!(ncclAllReduce(
        buf.ptr,
        buf.ptr,
        count,
        nccl_type(t),
        ncclSum,
        comm,
        s
    ));
    ck!(cudaStreamSynchronize(s));
    let (want, tol) = reference(t, ncclSum, n, count, value);
    check_close("in-place all-reduce", &decode(t, &buf.read()?), &want, &tol)?;

    // A user PreMulSum operator (scalar 0.5 on the host).
    let t = DType::F32;
    let count = 1000;
    let mut op: ncclRedOp_t = 0;
    let mut half = 0.5f32;
    nc!(ncclRedOpCreatePreMulSum(
        &mut op,
        (&mut half as *mut f32).cast(),
        ncclFloat32,
        ncclScalarHostImmediate,
        comm
    ));
    let send = DevBuf::from_host(&encode(t, (0..count).map(|i| value(j.rank, i))))?;
    let recv = DevBuf::new(count * 4)?;
    nc!(ncclAllReduce(
        send.ptr,
        recv.ptr,
        count,
        ncclFloat32,
        op,
        comm,
        s
    ));
    ck!(cudaStreamSynchronize(s));
    let (sum, tol) = reference(t, ncclSum, n, count, value);
    let want: Vec<f64> = sum.iter().map(|v| v / 2.0).collect();
    check_close(
        "premulsum all-reduce",
        &decode(t, &recv.read()?),
        &want,
        &tol,
    )?;
    nc!(ncclRedOpDestroy(op, comm));
    // Unknown dynamic operators are refused.
    // SAFETY: plain call with valid buffers; the operator handle is bogus on purpose.
    let bad = unsafe { ncclAllReduce(send.ptr, recv.ptr, count, ncclFloat32, op, comm, s) };
    if bad != ncclInvalidArgument {
        return Err(format!(
            "a destroyed operator gave {}, expected ncclInvalidArgument",
            nccl_error(bad)
        ));
    }
    Ok(())
}

fn other_collectives(j: &Job, comm: ncclComm_t, s: cudaStream_t) -> Result<(), String> {
    let (n, me) = (j.n, j.rank);

    // All-gather, BF16, out of place and in place.
    let (t, count) = (DType::BF16, 40_000);
    let es = t.size();
    let mine = encode(t, (0..count).map(|i| value(me, i)));
    let send = DevBuf::from_host(&mine)?;
    let recv = DevBuf::new(count * n * es)?;
    nc!(ncclAllGather(
        send.ptr,
        recv.ptr,
        count,
        nccl_type(t),
        comm,
        s
    ));
    let inplace = DevBuf::new(count * n * es)?;
    inplace.write(me * count * es, &mine)?;
    nc!(ncclAllGather(
        inplace.at(me * count * es),
        inplace.ptr,
        count,
        nccl_type(t),
        comm,
        s
    ));
    ck!(cudaStreamSynchronize(s));
    let want: Vec<u8> = (0..n)
        .flat_map(|r| encode(t, (0..count).map(move |i| value(r, i))))
        .collect();
    if recv.read()? != want {
        return Err("all-gather: wrong data".into());
    }
    if inplace.read()? != want {
        return Err("in-place all-gather: wrong data".into());
    }

    // Reduce-scatter, FP32 sum, out of place and in place.
    let (t, count) = (DType::F32, 50_000);
    let es = t.size();
    let full = encode(t, (0..count * n).map(|i| value(me, i)));
    let send = DevBuf::from_host(&full)?;
    let recv = DevBuf::new(count * es)?;
    nc!(ncclReduceScatter(
        send.ptr,
        recv.ptr,
        count,
        ncclFloat32,
        ncclSum,
        comm,
        s
    ));
    let inplace = DevBuf::from_host(&full)?;
    nc!(ncclReduceScatter(
        inplace.ptr,
        inplace.at(me * count * es),
        count,
        ncclFloat32,
        ncclSum,
        comm,
        s
    ));
    ck!(cudaStreamSynchronize(s));
    let (want, tol) = reference(t, ncclSum, n, count, |r, i| value(r, me * count + i));
    check_close("reduce-scatter", &decode(t, &recv.read()?), &want, &tol)?;
    let all = inplace.read()?;
    check_close(
        "in-place reduce-scatter",
        &decode(t, &all[me * count * es..(me + 1) * count * es]),
        &want,
        &tol,
    )?;

    // Broadcast from the last rank (out of place) and ncclBcast from rank 0 (in place), FP8.
    let (t, count) = (DType::E4M3, 300_000);
    let root = n - 1;
    let send = DevBuf::from_host(&encode(t, (0..count).map(|i| value(me, i))))?;
    let recv = DevBuf::new(count)?;
    nc!(ncclBroadcast(
        send.ptr,
        recv.ptr,
        count,
        ncclFloat8e4m3,
        root as c_int,
        comm,
        s
    ));
    let bc = DevBuf::from_host(&encode(t, (0..count).map(|i| value(me, i))))?;
    nc!(ncclBcast(bc.ptr, count, ncclFloat8e4m3, 0, comm, s));
    ck!(cudaStreamSynchronize(s));
    if recv.read()? != encode(t, (0..count).map(|i| value(root, i))) {
        return Err("broadcast: wrong data".into());
    }
    if bc.read()? != encode(t, (0..count).map(|i| value(0, i))) {
        return Err("ncclBcast: wrong data".into());
    }

    // Reduce to rank 1 % n, FP32 max and sum; recvbuff NULL on the other ranks.
    let (t, count) = (DType::F32, 20_000);
    let root = 1 % n;
    let send = DevBuf::from_host(&encode(t, (0..count).map(|i| value(me, i))))?;
    let recv = DevBuf::new(count * 4)?;
    let dst = if me == root {
        recv.ptr
    } else {
        std::ptr::null_mut()
    };
    nc!(ncclReduce(
        send.ptr,
        dst,
        count,
        ncclFloat32,
        ncclSum,
        root as c_int,
        comm,
        s
    ));
    ck!(cudaStreamSynchronize(s));
    if me == root {
        let (want, tol) = reference(t, ncclSum, n, count, value);
        check_close("reduce", &decode(t, &recv.read()?), &want, &tol)?;
    }
    Ok(())
}

fn point_to_point(j: &Job, comm: ncclComm_t, s: cudaStream_t) -> Result<(), String> {
    let (n, me) = (j.n, j.rank);
    // A ring in one group: send to the next rank, receive from the previous one (FP8).
    let (t, count) = (DType::E5M2, 100_000);
    let next = (me + 1) % n;
    let prev = (me + n - 1) % n;
    let send = DevBuf::from_host(&encode(t, (0..count).map(|i| value(me, i))))?;
    let recv = DevBuf::new(count)?;
    nc!(ncclGroupStart());
    nc!(ncclSend(
        send.ptr,
        count,
        ncclFloat8e5m2,
        next as c_int,
        comm,
        s
    ));
    nc!(ncclRecv(
        recv.ptr,
        count,
        ncclFloat8e5m2,
        prev as c_int,
        comm,
        s
    ));
    nc!(ncclGroupEnd());
    ck!(cudaStreamSynchronize(s));
    if recv.read()? != encode(t, (0..count).map(|i| value(prev, i))) {
        return Err("send/recv ring: wrong data".into());
    }

    // Partners exchange 4 MiB both ways in one group, both sending first: far more than a
    // mailbox holds, so it only completes if the group's operations progress concurrently.
    let partner = me ^ 1;
    if partner < n {
        let count = 1 << 20;
        let t = DType::F32;
        let send = DevBuf::from_host(&encode(t, (0..count).map(|i| value(me, i))))?;
        let recv = DevBuf::new(count * 4)?;
        nc!(ncclGroupStart());
        nc!(ncclSend(
            send.ptr,
            count,
            ncclFloat32,
            partner as c_int,
            comm,
            s
        ));
        nc!(ncclRecv(
            recv.ptr,
            count,
            ncclFloat32,
            partner as c_int,
            comm,
            s
        ));
        nc!(ncclGroupEnd());
        ck!(cudaStreamSynchronize(s));
        if recv.read()? != encode(t, (0..count).map(|i| value(partner, i))) {
            return Err("grouped exchange: wrong data".into());
        }
    }
    Ok(())
}

/// A copy enqueued inside a group runs before the group's collectives (they launch at the
/// outermost `ncclGroupEnd`), so it sees the old contents.
fn group_deferral(j: &Job, comm: ncclComm_t, s: cudaStream_t) -> Result<(), String> {
    let (t, count) = (DType::F32, 1000);
    let send = DevBuf::from_host(&encode(t, (0..count).map(|i| value(j.rank, i))))?;
    let sentinel = encode(t, (0..count).map(|_| -99.0));
    let recv = DevBuf::from_host(&sentinel)?;
    let mut host: *mut c_void = std::ptr::null_mut();
    ck!(cudaMallocHost(&mut host, count * 4));
    nc!(ncclGroupStart());
    nc!(ncclGroupStart());
    nc!(ncclAllReduce(
        send.ptr,
        recv.ptr,
        count,
        ncclFloat32,
        ncclSum,
        comm,
        s
    ));
    nc!(ncclGroupEnd());
    // Still inside the outer group: nothing launched yet.
    ck!(cudaMemcpyAsync(
        host,
        recv.ptr,
        count * 4,
        cudaMemcpyDeviceToHost,
        s
    ));
    nc!(ncclGroupEnd());
    ck!(cudaStreamSynchronize(s));
    // SAFETY: pinned buffer of count*4 bytes, its copy completed.
    let snap = unsafe { std::slice::from_raw_parts(host.cast::<u8>(), count * 4) }.to_vec();
    ck!(cudaFreeHost(host));
    if snap != sentinel {
        return Err("a copy enqueued inside a group saw the collective's result".into());
    }
    let (want, tol) = reference(t, ncclSum, j.n, count, value);
    check_close("grouped all-reduce", &decode(t, &recv.read()?), &want, &tol)
}

/// The call returns before the collective ran: with the other ranks late, the stream is busy.
fn asynchrony(j: &Job, comm: ncclComm_t, s: cudaStream_t) -> Result<(), String> {
    if j.n < 2 {
        return Ok(());
    }
    let count = 1000;
    let send = DevBuf::from_host(&encode(DType::F32, (0..count).map(|i| value(j.rank, i))))?;
    let recv = DevBuf::new(count * 4)?;
    if j.rank != 0 {
        std::thread::sleep(Duration::from_millis(300));
    }
    let t0 = Instant::now();
    nc!(ncclAllReduce(
        send.ptr,
        recv.ptr,
        count,
        ncclFloat32,
        ncclSum,
        comm,
        s
    ));
    if j.rank == 0 {
        // SAFETY: plain query.
        let q = unsafe { cudaStreamQuery(s) };
        if q != cudaErrorNotReady || t0.elapsed() > Duration::from_millis(200) {
            return Err(format!(
                "ncclAllReduce waited for the late ranks (stream query {q}, {:?})",
                t0.elapsed()
            ));
        }
    }
    ck!(cudaStreamSynchronize(s));
    Ok(())
}

/// A collective captured into a graph runs only when the graph is launched (every time), and
/// eager collectives issued between capture and launch do not wait for it.
fn graphs(j: &Job, comm: ncclComm_t, s: cudaStream_t) -> Result<(), String> {
    let (t, count) = (DType::F32, 10_000);
    let send = DevBuf::from_host(&encode(t, (0..count).map(|i| value(j.rank, i))))?;
    let sentinel = encode(t, (0..count).map(|_| -99.0));
    let recv = DevBuf::from_host(&sentinel)?;
    ck!(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    nc!(ncclAllReduce(
        send.ptr,
        recv.ptr,
        count,
        ncclFloat32,
        ncclSum,
        comm,
        s
    ));
    let mut graph: cudaGraph_t = std::ptr::null_mut();
    ck!(cudaStreamEndCapture(s, &mut graph));
    // An eager all-reduce in between.
    let eager = DevBuf::new(count * 4)?;
    nc!(ncclAllReduce(
        send.ptr,
        eager.ptr,
        count,
        ncclFloat32,
        ncclMax,
        comm,
        s
    ));
    ck!(cudaStreamSynchronize(s));
    if recv.read()? != sentinel {
        return Err("a captured all-reduce ran before its graph was launched".into());
    }
    let (want, tol) = reference(t, ncclMax, j.n, count, value);
    check_close(
        "eager all-reduce after a capture",
        &decode(t, &eager.read()?),
        &want,
        &tol,
    )?;
    let mut exec: cudaGraphExec_t = std::ptr::null_mut();
    ck!(cudaGraphInstantiate(&mut exec, graph, 0));
    ck!(cudaGraphLaunch(exec, s));
    ck!(cudaStreamSynchronize(s));
    let (want, tol) = reference(t, ncclSum, j.n, count, value);
    check_close(
        "captured all-reduce, first launch",
        &decode(t, &recv.read()?),
        &want,
        &tol,
    )?;
    // The second launch reduces again (same inputs, same result).
    recv.write(0, &sentinel)?;
    ck!(cudaGraphLaunch(exec, s));
    ck!(cudaStreamSynchronize(s));
    check_close(
        "captured all-reduce, second launch",
        &decode(t, &recv.read()?),
        &want,
        &tol,
    )?;
    ck!(cudaGraphExecDestroy(exec));
    ck!(cudaGraphDestroy(graph));
    Ok(())
}

/// Even/odd split (keys reverse the order) used concurrently with the world on another stream,
/// and a split where rank 0 opts out.
fn splits(j: &Job, comm: ncclComm_t, s: cudaStream_t) -> Result<(), String> {
    let (n, me) = (j.n, j.rank);
    let mut sub: ncclComm_t = std::ptr::null_mut();
    nc!(ncclCommSplit(
        comm,
        (me % 2) as c_int,
        -(me as c_int),
        &mut sub,
        std::ptr::null_mut()
    ));
    let members: Vec<usize> = (0..n).rev().filter(|r| r % 2 == me % 2).collect();
    let (mut cnt, mut rk) = (0, 0);
    nc!(ncclCommCount(sub, &mut cnt));
    nc!(ncclCommUserRank(sub, &mut rk));
    let my_pos = members.iter().position(|r| *r == me).unwrap_or(usize::MAX);
    if cnt as usize != members.len() || rk as usize != my_pos {
        return Err(format!(
            "split: rank {rk} of {cnt}, expected {my_pos} of {}",
            members.len()
        ));
    }
    let s2 = stream()?;
    let (t, count) = (DType::BF16, 30_000);
    let x_sub = |r: usize, i: usize| value(members[r], i);
    let a = DevBuf::from_host(&encode(t, (0..count).map(|i| value(me, i))))?;
    let a_out = DevBuf::new(count * 2)?;
    let b = DevBuf::from_host(&encode(t, (0..count).map(|i| value(me, i + 1))))?;
    let b_out = DevBuf::new(count * 2)?;
    // Both in flight at once, on different streams and communicators.
    nc!(ncclAllReduce(
        a.ptr,
        a_out.ptr,
        count,
        ncclBfloat16,
        ncclSum,
        sub,
        s2
    ));
    nc!(ncclAllReduce(
        b.ptr,
        b_out.ptr,
        count,
        ncclBfloat16,
        ncclSum,
        comm,
        s
    ));
    ck!(cudaStreamSynchronize(s2));
    ck!(cudaStreamSynchronize(s));
    let (want, tol) = reference(t, ncclSum, members.len(), count, x_sub);
    check_close("split all-reduce", &decode(t, &a_out.read()?), &want, &tol)?;
    let (want, tol) = reference(t, ncclSum, n, count, |r, i| value(r, i + 1));
    check_close(
        "world all-reduce next to the split",
        &decode(t, &b_out.read()?),
        &want,
        &tol,
    )?;

    let mut rest: ncclComm_t = std::ptr::null_mut();
    let color = if me == 0 { NCCL_SPLIT_NOCOLOR } else { 7 };
    nc!(ncclCommSplit(
        comm,
        color,
        0,
        &mut rest,
        std::ptr::null_mut()
    ));
    if me == 0 {
        if !rest.is_null() {
            return Err("NCCL_SPLIT_NOCOLOR gave a communicator".into());
        }
    } else {
        nc!(ncclCommCount(rest, &mut cnt));
        if cnt as usize != n - 1 {
            return Err(format!("split without rank 0 has {cnt} ranks"));
        }
        nc!(ncclCommDestroy(rest));
    }
    nc!(ncclCommDestroy(sub));
    ck!(cudaStreamDestroy(s2));
    Ok(())
}

/// A non-blocking communicator (`config.blocking = 0`): init returns `ncclInProgress` while
/// peers are missing, `ncclCommGetAsyncError` reports progress until every rank joined.
fn nonblocking(j: &Job, s: cudaStream_t) -> Result<(), String> {
    let mut id = ncclUniqueId {
        internal: [0; NCCL_UNIQUE_ID_BYTES],
    };
    nc!(ncclGetUniqueId(&mut id));
    if j.rank != 0 {
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut config = ncclConfig_t::INITIALIZER;
    config.blocking = 0;
    let mut comm: ncclComm_t = std::ptr::null_mut();
    // SAFETY: valid output pointer and config.
    let rc = unsafe {
        ncclCommInitRankConfig(&mut comm, j.n as c_int, id, j.rank as c_int, &mut config)
    };
    let expected_first = if j.rank == 0 && j.n > 1 {
        ncclInProgress
    } else {
        rc
    };
    if rc != expected_first || (rc != ncclSuccess && rc != ncclInProgress) {
        return Err(format!("non-blocking init returned {}", nccl_error(rc)));
    }
    let t0 = Instant::now();
    loop {
        let mut e: ncclResult_t = ncclInternalError;
        nc!(ncclCommGetAsyncError(comm, &mut e));
        match e {
            ncclSuccess => break,
            ncclInProgress if t0.elapsed() < Duration::from_secs(60) => {
                std::thread::sleep(Duration::from_millis(5))
            }
            _ => return Err(format!("non-blocking init: async error {}", nccl_error(e))),
        }
    }
    let count = 100;
    let send = DevBuf::from_host(&encode(DType::F32, (0..count).map(|i| value(j.rank, i))))?;
    let recv = DevBuf::new(count * 4)?;
    nc!(ncclAllReduce(
        send.ptr,
        recv.ptr,
        count,
        ncclFloat32,
        ncclMin,
        comm,
        s
    ));
    ck!(cudaStreamSynchronize(s));
    let (want, tol) = reference(DType::F32, ncclMin, j.n, count, value);
    check_close(
        "non-blocking comm all-reduce",
        &decode(DType::F32, &recv.read()?),
        &want,
        &tol,
    )?;
    nc!(ncclCommDestroy(comm));
    Ok(())
}

/// One process, several devices: `ncclCommInitAll`, and `ncclCommInitRank` per device inside a
/// group from one thread; then one group with an all-reduce per device, each on its device's
/// stream.
fn single_process(ndev: usize) -> Result<(), String> {
    let mut have: c_int = 0;
    ck!(cudaGetDeviceCount(&mut have));
    let ndev = ndev.min(have as usize).max(1);
    let mut comms: Vec<ncclComm_t> = vec![std::ptr::null_mut(); ndev];
    nc!(ncclCommInitAll(
        comms.as_mut_ptr(),
        ndev as c_int,
        std::ptr::null()
    ));
    let mut id = ncclUniqueId {
        internal: [0; NCCL_UNIQUE_ID_BYTES],
    };
    nc!(ncclGetUniqueId(&mut id));
    let mut grouped: Vec<ncclComm_t> = vec![std::ptr::null_mut(); ndev];
    nc!(ncclGroupStart());
    for (d, c) in grouped.iter_mut().enumerate() {
        ck!(cudaSetDevice(d as c_int));
        nc!(ncclCommInitRank(c, ndev as c_int, id, d as c_int));
    }
    nc!(ncclGroupEnd());
    for set in [&comms, &grouped] {
        let (t, count) = (DType::BF16, 20_000);
        let mut bufs = Vec::new();
        let mut streams = Vec::new();
        for (d, c) in set.iter().enumerate() {
            let mut dev: c_int = -1;
            nc!(ncclCommCuDevice(*c, &mut dev));
            if dev != d as c_int {
                return Err(format!("communicator {d} is on device {dev}"));
            }
            ck!(cudaSetDevice(d as c_int));
            streams.push(stream()?);
            bufs.push(DevBuf::from_host(&encode(
                t,
                (0..count).map(|i| value(d, i)),
            ))?);
        }
        nc!(ncclGroupStart());
        for d in 0..set.len() {
            ck!(cudaSetDevice(d as c_int));
            nc!(ncclAllReduce(
                bufs[d].ptr,
                bufs[d].ptr,
                count,
                ncclBfloat16,
                ncclSum,
                set[d],
                streams[d]
            ));
        }
        nc!(ncclGroupEnd());
        let (want, tol) = reference(t, ncclSum, set.len(), count, value);
        let mut first: Option<Vec<u8>> = None;
        for d in 0..set.len() {
            ck!(cudaSetDevice(d as c_int));
            ck!(cudaStreamSynchronize(streams[d]));
            let got = bufs[d].read()?;
            check_close("single-process all-reduce", &decode(t, &got), &want, &tol)?;
            if first.get_or_insert_with(|| got.clone()) != &got {
                return Err(format!("device {d} got different bits"));
            }
            ck!(cudaStreamDestroy(streams[d]));
        }
        for c in set.iter() {
            nc!(ncclCommDestroy(*c));
        }
    }
    println!("single process, {ndev} devices: collectives OK");
    Ok(())
}

/// `sim-probe collectives [all | kill RANK | exit RANK | single-process]`.
pub fn collectives(args: &[String]) -> Result<(), String> {
    let mode = args.first().map(String::as_str).unwrap_or("all");
    if mode == "single-process" {
        return single_process(4);
    }
    let j = job()?;
    match mode {
        "all" => run_all(&j),
        "kill" | "exit" => {
            let victim: usize = args
                .get(1)
                .and_then(|a| a.parse().ok())
                .ok_or("usage: collectives kill|exit RANK")?;
            peer_failure(&j, mode == "kill", victim)
        }
        other => Err(format!("unknown mode `{other}`")),
    }
}

fn run_all(j: &Job) -> Result<(), String> {
    let mut v: c_int = 0;
    nc!(ncclGetVersion(&mut v));
    if v != 22705 {
        return Err(format!("ncclGetVersion reports {v}"));
    }
    let comm = world(j)?;
    let (mut cnt, mut rk, mut dev, mut cur) = (0, 0, -1, -2);
    nc!(ncclCommCount(comm, &mut cnt));
    nc!(ncclCommUserRank(comm, &mut rk));
    nc!(ncclCommCuDevice(comm, &mut dev));
    ck!(cudaGetDevice(&mut cur));
    if (cnt as usize, rk as usize) != (j.n, j.rank) || dev != cur {
        return Err(format!(
            "world comm: rank {rk} of {cnt} on device {dev}, expected {} of {} on {cur}",
            j.rank, j.n
        ));
    }
    let s = stream()?;
    all_reduce_checks(j, comm, s)?;
    other_collectives(j, comm, s)?;
    point_to_point(j, comm, s)?;
    group_deferral(j, comm, s)?;
    asynchrony(j, comm, s)?;
    graphs(j, comm, s)?;
    splits(j, comm, s)?;
    nonblocking(j, s)?;
    let mut e: ncclResult_t = ncclInternalError;
    nc!(ncclCommGetAsyncError(comm, &mut e));
    if e != ncclSuccess {
        return Err(format!("async error {}", nccl_error(e)));
    }
    nc!(ncclCommFinalize(comm));
    nc!(ncclCommDestroy(comm));
    ck!(cudaStreamDestroy(s));
    println!("rank {} of {}: collectives OK", j.rank, j.n);
    Ok(())
}

/// One rank dies in the middle of the job; every other one must see an NCCL error within a
/// bounded time. Survivors return `Err` ("peer failure detected") so that they exit nonzero.
fn peer_failure(j: &Job, kill: bool, victim: usize) -> Result<(), String> {
    let comm = world(j)?;
    let s = stream()?;
    let count = 100_000;
    let send = DevBuf::from_host(&encode(DType::F32, (0..count).map(|i| value(j.rank, i))))?;
    let recv = DevBuf::new(count * 4)?;
    // One collective that completes everywhere.
    nc!(ncclAllReduce(
        send.ptr,
        recv.ptr,
        count,
        ncclFloat32,
        ncclSum,
        comm,
        s
    ));
    ck!(cudaStreamSynchronize(s));
    if j.rank == victim {
        // Die while the others are inside the next collective.
        std::thread::sleep(Duration::from_millis(200));
        if kill {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &std::process::id().to_string()])
                .status();
            std::thread::sleep(Duration::from_secs(60));
        }
        std::process::exit(3);
    }
    nc!(ncclAllReduce(
        send.ptr,
        recv.ptr,
        count,
        ncclFloat32,
        ncclSum,
        comm,
        s
    ));
    let t0 = Instant::now();
    // SAFETY: plain synchronisation.
    let sync = unsafe { cudaStreamSynchronize(s) };
    let took = t0.elapsed();
    if sync == cudaSuccess {
        return Err("the collective succeeded although a rank died".into());
    }
    let mut e: ncclResult_t = ncclSuccess;
    nc!(ncclCommGetAsyncError(comm, &mut e));
    // SAFETY: plain query.
    let why = cstr(unsafe { ncclGetLastError(comm) });
    if e != ncclRemoteError {
        return Err(format!(
            "async error after a peer died is {}, expected ncclRemoteError",
            nccl_error(e)
        ));
    }
    // Later calls on the communicator fail too.
    // SAFETY: valid arguments; the communicator is in error.
    let again = unsafe { ncclAllReduce(send.ptr, recv.ptr, count, ncclFloat32, ncclSum, comm, s) };
    if again == ncclSuccess {
        return Err("a call on the failed communicator succeeded".into());
    }
    // SAFETY: abort frees the failed communicator.
    unsafe { ncclCommAbort(comm) };
    Err(format!(
        "peer failure detected: stream synchronize returned cudaError {sync} after {:.2}s, \
         async error ncclResult {e}: {why}",
        took.as_secs_f64()
    ))
}
