//! NCCL hooks: every collective and point-to-point call, groups, and communicator life.
//!
//! A collective's `Input` is its send buffer (taken before the op when the op overwrites it:
//! in place), its `Output` the receive buffer after. Inside `ncclGroupStart/End` operations are
//! only recorded; their kernels are launched by the outermost `ncclGroupEnd`, so a snapshot
//! enqueued at call time would run before the collective. The after-op copies of grouped calls
//! are therefore deferred (per thread) to the outermost `ncclGroupEnd`. Non-blocking
//! communicators (`ncclInProgress`) are polled with the real `ncclCommGetAsyncError` before the
//! copies are enqueued.
//!
//! NCCL exports each entry point under a second, profiling name (`pncclAllReduce` for
//! `ncclAllReduce`: the same function), which is what a PMPI-style wrapper calls once it has
//! taken the `ncclX` name for itself. Those names are hooked too (`name / pname` in the hook
//! macros), the record named after the `ncclX` function: with such a wrapper loaded before
//! libttrace.so its calls to NCCL were silent. Loaded after it, the wrapper is what the hook
//! calls as "real", and its `pnccl` call comes back to the hooks from inside that real call: a
//! collective only runs there (the reentrancy guard), a communicator is registered once (the
//! creation guard), and a group level is opened and closed by both hooks, which balances.
//!
//! `ncclGroupSimulateEnd` closes a group as `ncclGroupEnd` does but launches nothing: the
//! snapshots deferred to it are dropped (their ops never run). A collective whose reduction is a
//! PreMulSum operator records its factor (a device-resident scalar as an `Alpha` tensor).

use core::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cuda_abi::cudart::cudaStream_t;
use cuda_abi::nccl::*;
use ttrace_proto::dtype::DType;
use ttrace_proto::record::{CollectiveKind, CollectiveOp, GapReason, Op, PreMulSum, Role};

use crate::comms;
use crate::cuda::ErrScope;
use crate::engine::{self, Call, InFlight};
use crate::plan::{self, Vector, When};
use crate::{identity, mode, real, thread};

/// What a hook returns when the real function is missing.
const MISSING: ncclResult_t = ncclSystemError;
/// Group numbers (0: not in a group).
static GROUPS: AtomicU64 = AtomicU64::new(0);

/// One collective or point-to-point call.
struct Coll {
    api: &'static str,
    kind: CollectiveKind,
    send: *const c_void,
    recv: *const c_void,
    count: usize,
    dtype: ncclDataType_t,
    redop: Option<ncclRedOp_t>,
    root_or_peer: Option<c_int>,
    comm: ncclComm_t,
    stream: cudaStream_t,
}

fn call(c: &Coll) -> Option<Call> {
    let info = comms::lookup(c.comm)?;
    let (rank, size) = (info.rank as u64, info.size as u64);
    let count = c.count as u64;
    let dtype = DType::from_nccl(c.dtype);
    let es = dtype.map_or(0, |t| t.size() as u64);
    let root = c.root_or_peer.map(|r| r as u64);
    use CollectiveKind::*;
    let is_root = root == Some(rank);
    let input_len = match c.kind {
        AllReduce | AllGather | Reduce | Send | Gather => Some(count),
        ReduceScatter | AllToAll => Some(count * size),
        Broadcast => is_root.then_some(count),
        Scatter => is_root.then_some(count * size),
        Recv => None,
    };
    let output_len = match c.kind {
        AllReduce | ReduceScatter | Broadcast | Recv | Scatter => Some(count),
        AllGather | AllToAll => Some(count * size),
        Reduce => is_root.then_some(count),
        Gather => is_root.then_some(count * size),
        Send => None,
    };
    let (send, recv) = (c.send as u64, c.recv as u64);
    let in_place = match (input_len, output_len) {
        (Some(i), Some(o)) => plan::overlaps(send, i * es, recv, o * es),
        _ => false,
    };
    let group = thread::with(|t| if t.group_depth > 0 { t.group_id } else { 0 }).unwrap_or(0);
    let mut tensors = Vec::with_capacity(3);
    if let Some(len) = input_len {
        // Taken before the op when the op overwrites it, and inside a group (nothing of the
        // group runs before its end, so the copy at call time sees every input as the group
        // will, whatever the group's other ops write).
        let when = if in_place || group != 0 {
            When::Before
        } else {
            When::After
        };
        tensors.push(plan::vector(
            Role::Input,
            Vector::new(send, dtype, len),
            when,
            true,
        ));
    }
    if let Some(len) = output_len {
        tensors.push(plan::vector(
            Role::Output,
            Vector::new(recv, dtype, len),
            When::After,
            false,
        ));
    }
    let premul = c.redop.and_then(|op| comms::premul(c.comm, op));
    if let Some(p) = premul.filter(|p| p.ptr != 0) {
        tensors.push(plan::vector(
            Role::Alpha,
            Vector::new(p.ptr, DType::from_nccl(p.info.nccl_type), 1),
            When::After,
            true,
        ));
    }
    let op = CollectiveOp {
        kind: c.kind,
        count,
        nccl_type: c.dtype,
        redop: c.redop,
        root_or_peer: c.root_or_peer,
        comm: info.key,
        comm_rank: info.rank,
        comm_size: info.size,
        sendbuff: send,
        recvbuff: recv,
        group,
        premul: premul.map(|p| p.info),
    };
    Some(Call {
        api: c.api,
        op: Op::Collective(op),
        stream: c.stream,
        stream_id: c.stream as u64,
        device: info.device,
        tensors,
    })
}

/// Waits until a non-blocking communicator has launched what was enqueued (bounded by
/// `TTRACE_WAIT_MS`). Whether it succeeded.
fn settle(comm: ncclComm_t) -> bool {
    let Some(f) = real::ncclCommGetAsyncError() else {
        return false;
    };
    let wait = mode::config().map_or(10_000, |c| c.wait_ms);
    let deadline = Instant::now() + Duration::from_millis(wait);
    loop {
        let mut st: ncclResult_t = ncclSuccess;
        // SAFETY: a live communicator and an out-pointer to a local.
        let r = unsafe { f(comm, &mut st) };
        if r != ncclSuccess {
            return false;
        }
        if st != ncclInProgress {
            return st == ncclSuccess;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Completes a snapshot once its op is launched.
fn complete(mut f: InFlight, r: ncclResult_t) {
    let ok = match r {
        ncclSuccess => true,
        ncclInProgress => settle(f.nccl_comm as ncclComm_t),
        _ => false,
    };
    f.nccl_comm = 0;
    engine::finish(f, ok);
}

fn capture(c: Coll, real: impl FnOnce() -> ncclResult_t) -> ncclResult_t {
    let comm = c.comm as usize;
    crate::around(
        || {
            let mut f = engine::begin(call(&c)?)?;
            f.nccl_comm = comm;
            Some(f)
        },
        real,
        |f, r| {
            let in_group = thread::with(|t| t.group_depth > 0).unwrap_or(false);
            let mut f = Some(f);
            if in_group && matches!(r, ncclSuccess | ncclInProgress) {
                // Launched by the outermost ncclGroupEnd: finished there.
                thread::with(|t| t.deferred.extend(f.take()));
            }
            if let Some(f) = f {
                complete(f, r);
            }
        },
    )
}

macro_rules! coll_hook {
    (@export $(#[$m:meta])* $export:ident, $api:ident ( $($a:ident : $t:ty),* ) => $kind:ident {
        send: $send:expr, recv: $recv:expr, count: $count:expr, dtype: $dt:expr,
        redop: $redop:expr, root: $root:expr, comm: $comm:expr, stream: $stream:expr $(,)?
    }) => {
        $(#[$m])*
        #[no_mangle]
        pub unsafe extern "C" fn $export($($a: $t),*) -> ncclResult_t {
            let Some(real) = real::real_of!($export, fn($($t),*) -> ncclResult_t, Nccl) else {
                return MISSING;
            };
            if mode::off(mode::NCCL) {
                // SAFETY: the program's arguments, forwarded unchanged.
                return unsafe { real($($a),*) };
            }
            let c = Coll {
                api: stringify!($api),
                kind: CollectiveKind::$kind,
                send: $send,
                recv: $recv,
                count: $count,
                dtype: $dt,
                redop: $redop,
                root_or_peer: $root,
                comm: $comm,
                stream: $stream,
            };
            // SAFETY: as above.
            capture(c, || unsafe { real($($a),*) })
        }
    };
    // `name / pname(...)`: also NCCL's profiling name of the same function (see the module
    // documentation), recorded under the NCCL name.
    ($(#[$m:meta])* $name:ident / $twin:ident ( $($a:ident : $t:ty),* ) => $kind:ident { $($f:tt)* }) => {
        coll_hook! { @export $(#[$m])* $name, $name($($a: $t),*) => $kind { $($f)* } }
        coll_hook! {
            @export
            #[doc = concat!("`", stringify!($twin), "`: NCCL's profiling name of `", stringify!($name), "`.")]
            $twin, $name($($a: $t),*) => $kind { $($f)* }
        }
    };
    ($(#[$m:meta])* $name:ident ( $($a:ident : $t:ty),* ) => $kind:ident { $($f:tt)* }) => {
        coll_hook! { @export $(#[$m])* $name, $name($($a: $t),*) => $kind { $($f)* } }
    };
}

coll_hook! {
    /// `ncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream)`.
    ncclAllReduce / pncclAllReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t) => AllReduce {
        send: sendbuff, recv: recvbuff.cast_const(), count: count, dtype: datatype,
        redop: Some(op), root: None, comm: comm, stream: stream,
    }
}

coll_hook! {
    /// `ncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream)`.
    ncclAllGather / pncclAllGather(sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t) => AllGather {
        send: sendbuff, recv: recvbuff.cast_const(), count: sendcount, dtype: datatype,
        redop: None, root: None, comm: comm, stream: stream,
    }
}

coll_hook! {
    /// `ncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream)`.
    ncclReduceScatter / pncclReduceScatter(sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t) => ReduceScatter {
        send: sendbuff, recv: recvbuff.cast_const(), count: recvcount, dtype: datatype,
        redop: Some(op), root: None, comm: comm, stream: stream,
    }
}

coll_hook! {
    /// `ncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream)`.
    ncclBroadcast / pncclBroadcast(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) => Broadcast {
        send: sendbuff, recv: recvbuff.cast_const(), count: count, dtype: datatype,
        redop: None, root: Some(root), comm: comm, stream: stream,
    }
}

coll_hook! {
    /// `ncclBcast(buff, count, datatype, root, comm, stream)`: in-place broadcast (NCCL
    /// implements it with `ncclBroadcast`, which then passes through the reentrancy guard).
    ncclBcast / pncclBcast(buff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) => Broadcast {
        send: buff.cast_const(), recv: buff.cast_const(), count: count, dtype: datatype,
        redop: None, root: Some(root), comm: comm, stream: stream,
    }
}

coll_hook! {
    /// `ncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream)`.
    ncclReduce / pncclReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, op: ncclRedOp_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) => Reduce {
        send: sendbuff, recv: recvbuff.cast_const(), count: count, dtype: datatype,
        redop: Some(op), root: Some(root), comm: comm, stream: stream,
    }
}

coll_hook! {
    /// `ncclAlltoAll(sendbuff, recvbuff, count, datatype, comm, stream)` (NCCL 2.28+; `count`
    /// elements per peer).
    ncclAlltoAll / pncclAlltoAll(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t) => AllToAll {
        send: sendbuff, recv: recvbuff.cast_const(), count: count, dtype: datatype,
        redop: None, root: None, comm: comm, stream: stream,
    }
}

coll_hook! {
    /// `ncclGather(sendbuff, recvbuff, count, datatype, root, comm, stream)` (NCCL 2.28+).
    ncclGather / pncclGather(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) => Gather {
        send: sendbuff, recv: recvbuff.cast_const(), count: count, dtype: datatype,
        redop: None, root: Some(root), comm: comm, stream: stream,
    }
}

coll_hook! {
    /// `ncclScatter(sendbuff, recvbuff, count, datatype, root, comm, stream)` (NCCL 2.28+).
    ncclScatter / pncclScatter(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) => Scatter {
        send: sendbuff, recv: recvbuff.cast_const(), count: count, dtype: datatype,
        redop: None, root: Some(root), comm: comm, stream: stream,
    }
}

coll_hook! {
    /// `ncclSend(sendbuff, count, datatype, peer, comm, stream)`.
    ncclSend / pncclSend(sendbuff: *const c_void, count: usize, datatype: ncclDataType_t, peer: c_int, comm: ncclComm_t, stream: cudaStream_t) => Send {
        send: sendbuff, recv: core::ptr::null(), count: count, dtype: datatype,
        redop: None, root: Some(peer), comm: comm, stream: stream,
    }
}

coll_hook! {
    /// `ncclRecv(recvbuff, count, datatype, peer, comm, stream)`.
    ncclRecv / pncclRecv(recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, peer: c_int, comm: ncclComm_t, stream: cudaStream_t) => Recv {
        send: core::ptr::null(), recv: recvbuff.cast_const(), count: count, dtype: datatype,
        redop: None, root: Some(peer), comm: comm, stream: stream,
    }
}

/// One communicator or group entry point: `name(C signature) => |real| what the hook does`,
/// where `real` calls the real function, looked up under the hook's name, with the program's
/// arguments (the hook calls it exactly once). While communicators are not tracked the hook is
/// the real call alone. `name / pname(...)` also makes the hook of NCCL's profiling name (see
/// the module documentation).
macro_rules! comm_hook {
    (@export $(#[$m:meta])* $export:ident ( $($a:ident : $t:ty),* $(,)? ) => |$real:ident| $body:expr) => {
        $(#[$m])*
        #[no_mangle]
        pub unsafe extern "C" fn $export($($a: $t),*) -> ncclResult_t {
            let Some(real) = real::real_of!($export, fn($($t),*) -> ncclResult_t, Nccl) else {
                return MISSING;
            };
            // SAFETY: the program's arguments, forwarded unchanged.
            let $real = || unsafe { real($($a),*) };
            if mode::off(mode::COMMS) {
                return $real();
            }
            $body
        }
    };
    ($(#[$m:meta])* $name:ident / $twin:ident ( $($a:ident : $t:ty),* $(,)? ) => |$real:ident| $body:expr) => {
        comm_hook! { @export $(#[$m])* $name($($a: $t),*) => |$real| $body }
        comm_hook! {
            @export
            #[doc = concat!("`", stringify!($twin), "`: NCCL's profiling name of `", stringify!($name), "`.")]
            $twin($($a: $t),*) => |$real| $body
        }
    };
    ($(#[$m:meta])* $name:ident ( $($a:ident : $t:ty),* $(,)? ) => |$real:ident| $body:expr) => {
        comm_hook! { @export $(#[$m])* $name($($a: $t),*) => |$real| $body }
    };
}

comm_hook! {
    /// `ncclGroupStart()`: one level deeper (the outermost opens a new group number).
    ncclGroupStart / pncclGroupStart() => |real| {
        let r = real();
        if r == ncclSuccess {
            let _ = crate::catch(|| {
                thread::with(|t| {
                    if t.group_depth == 0 {
                        t.group_id = GROUPS.fetch_add(1, Ordering::Relaxed) + 1;
                    }
                    t.group_depth += 1;
                })
            });
        }
        r
    }
}

comm_hook! {
    /// `ncclGroupEnd()`: the outermost one launches the group; the deferred snapshots are
    /// enqueued after it returns.
    ncclGroupEnd / pncclGroupEnd() => |real| {
        let r = real();
        let _ = crate::catch(|| close_group(r, true));
        r
    }
}

comm_hook! {
    /// `ncclGroupSimulateEnd(simInfo)`: closes the group like `ncclGroupEnd`, but NCCL only
    /// estimates the outermost group's time and runs none of its operations, so their deferred
    /// snapshots are dropped (no data moved: nothing to record).
    ncclGroupSimulateEnd / pncclGroupSimulateEnd(simInfo: *mut ncclSimInfo_t) => |real| {
        let r = real();
        let _ = crate::catch(|| close_group(r, false));
        r
    }
}

/// One group level closed with result `r`; the outermost completes the deferred snapshots
/// (`launched`) or drops them (a simulated end).
fn close_group(r: ncclResult_t, launched: bool) {
    let deferred = thread::with(|t| {
        if t.group_depth == 0 {
            return Vec::new();
        }
        t.group_depth -= 1;
        if t.group_depth == 0 {
            std::mem::take(&mut t.deferred)
        } else {
            Vec::new()
        }
    })
    .unwrap_or_default();
    if deferred.is_empty() {
        return;
    }
    // Held while the snapshots complete (none when the tracer itself is inside NCCL).
    let guard = thread::Guard::enter();
    if guard.is_none() || !launched {
        deferred.into_iter().for_each(|f| engine::finish(f, false));
        return;
    }
    // Streamed snapshots wait for the collector to take their chunks, which it can only once
    // the group's other snapshots (earlier tickets) are handed in: those go first.
    let (streamed, plain): (Vec<_>, Vec<_>) = deferred.into_iter().partition(InFlight::is_streamed);
    for f in plain.into_iter().chain(streamed) {
        complete(f, r);
    }
}

/// The current device (where NCCL binds a new communicator).
fn current_device() -> Option<i32> {
    let _e = ErrScope::new();
    crate::cuda::get_device().ok()
}

fn ids_bytes(id: &ncclUniqueId) -> Vec<u8> {
    id.internal.iter().map(|&c| c as u8).collect()
}

/// Runs a communicator-creating call with the reentrancy guard held (NCCL may create
/// communicators through its own exported functions, e.g. `ncclCommInitAll` through
/// `ncclCommInitRank`: those inner calls pass through), then `register` with its result. A call
/// reached from inside another hook only runs.
fn creating<R: Copy>(call: impl FnOnce() -> R, register: impl FnOnce(R)) -> R {
    let Some(_g) = thread::Guard::enter() else {
        return call();
    };
    let r = call();
    register(r);
    r
}

fn after_init(
    r: ncclResult_t,
    comm: *mut ncclComm_t,
    key: u64,
    nranks: c_int,
    rank: c_int,
    api: &'static str,
) {
    if !matches!(r, ncclSuccess | ncclInProgress) || comm.is_null() {
        return;
    }
    let _ = crate::catch(|| {
        // SAFETY: NCCL wrote the new communicator to the program's out-pointer.
        let c = unsafe { *comm };
        identity::joined(rank as u32);
        comms::register(
            c,
            comms::Joined {
                key,
                rank: rank as u32,
                size: nranks as u32,
                device: current_device(),
                parent: None,
                color: None,
                api,
            },
        );
    });
}

comm_hook! {
    /// `ncclCommInitRank(comm, nranks, commId, rank)`: registers the communicator (key: a hash
    /// of the unique id, the same on every member).
    ncclCommInitRank / pncclCommInitRank(
        comm: *mut ncclComm_t,
        nranks: c_int,
        commId: ncclUniqueId,
        rank: c_int,
    ) => |real| {
        let key = comms::key_of_ids(&ids_bytes(&commId));
        creating(real, |r| after_init(r, comm, key, nranks, rank, "ncclCommInitRank"))
    }
}

comm_hook! {
    /// `ncclCommInitRankConfig(comm, nranks, commId, rank, config)`.
    ncclCommInitRankConfig / pncclCommInitRankConfig(
        comm: *mut ncclComm_t,
        nranks: c_int,
        commId: ncclUniqueId,
        rank: c_int,
        config: *mut ncclConfig_t,
    ) => |real| {
        let key = comms::key_of_ids(&ids_bytes(&commId));
        creating(real, |r| {
            after_init(r, comm, key, nranks, rank, "ncclCommInitRankConfig")
        })
    }
}

comm_hook! {
    /// `ncclCommInitRankScalable(newcomm, nranks, myrank, nId, commIds, config)`: the key
    /// hashes every id.
    ncclCommInitRankScalable / pncclCommInitRankScalable(
        newcomm: *mut ncclComm_t,
        nranks: c_int,
        myrank: c_int,
        nId: c_int,
        commIds: *mut ncclUniqueId,
        config: *mut ncclConfig_t,
    ) => |real| {
        let mut bytes = Vec::new();
        if !commIds.is_null() {
            for i in 0..nId.max(0) as usize {
                // SAFETY: the program passes `nId` ids.
                bytes.extend(ids_bytes(unsafe { &*commIds.add(i) }));
            }
        }
        let key = comms::key_of_ids(&bytes);
        creating(real, |r| {
            after_init(r, newcomm, key, nranks, myrank, "ncclCommInitRankScalable")
        })
    }
}

comm_hook! {
    /// `ncclCommInitAll(comm, ndev, devlist)`: one communicator per device in this process.
    ncclCommInitAll / pncclCommInitAll(comm: *mut ncclComm_t, ndev: c_int, devlist: *const c_int) => |real| {
        creating(real, |r| {
            if r != ncclSuccess || comm.is_null() {
                return;
            }
            let _ = crate::catch(|| init_all_registered(comm, ndev, devlist));
        })
    }
}

/// Registers the `ndev` communicators `ncclCommInitAll` wrote to `comm`, one per device of
/// `devlist` (else devices 0..ndev).
fn init_all_registered(comm: *mut ncclComm_t, ndev: c_int, devlist: *const c_int) {
    let key = comms::init_all_key();
    for i in 0..ndev.max(0) as usize {
        // SAFETY: NCCL wrote `ndev` communicators; `devlist`, when given, has `ndev`.
        let (c, dev) = unsafe {
            (
                *comm.add(i),
                if devlist.is_null() {
                    i as c_int
                } else {
                    *devlist.add(i)
                },
            )
        };
        comms::register(
            c,
            comms::Joined {
                key,
                rank: i as u32,
                size: ndev as u32,
                device: Some(dev),
                parent: None,
                color: None,
                api: "ncclCommInitAll",
            },
        );
    }
}

comm_hook! {
    /// `ncclCommSplit(comm, color, key, newcomm, config)`: the new communicator's key hashes
    /// the parent's key, the split's number on the parent and the color.
    ncclCommSplit / pncclCommSplit(
        comm: ncclComm_t,
        color: c_int,
        key: c_int,
        newcomm: *mut ncclComm_t,
        config: *mut ncclConfig_t,
    ) => |real| {
        creating(real, |r| {
            derived(
                r,
                comm,
                newcomm,
                || comms::split_key(comm, color),
                Some(color),
                "ncclCommSplit",
            )
        })
    }
}

comm_hook! {
    /// `ncclCommShrink(comm, excludeRanksList, excludeRanksCount, newcomm, config,
    /// shrinkFlags)`: called by the survivors only; the new communicator's key hashes the
    /// parent's key, the excluded ranks and the number of such shrinks of the parent, the same
    /// on every survivor ([`comms::shrink_key`]).
    ncclCommShrink / pncclCommShrink(
        comm: ncclComm_t,
        excludeRanksList: *mut c_int,
        excludeRanksCount: c_int,
        newcomm: *mut ncclComm_t,
        config: *mut ncclConfig_t,
        shrinkFlags: c_int,
    ) => |real| {
        // Read before the call: the list is the program's, valid for the call.
        let excluded: Vec<i32> = crate::catch(|| {
            if excludeRanksList.is_null() || excludeRanksCount <= 0 {
                return Vec::new();
            }
            // SAFETY: the program passes `excludeRanksCount` ranks.
            unsafe { std::slice::from_raw_parts(excludeRanksList, excludeRanksCount as usize) }
                .to_vec()
        })
        .unwrap_or_default();
        creating(real, |r| {
            derived(
                r,
                comm,
                newcomm,
                || comms::shrink_key(comm, &excluded),
                None,
                "ncclCommShrink",
            )
        })
    }
}

/// Registers the communicator a split (`color`) or shrink of `parent` wrote to `newcomm`. The
/// key is derived on every successful call, a member left out of the new communicator
/// included (`NCCL_SPLIT_NOCOLOR`), so that the parent's counts stay the same on all members.
fn derived(
    r: ncclResult_t,
    parent: ncclComm_t,
    newcomm: *mut ncclComm_t,
    key: impl FnOnce() -> Option<u64>,
    color: Option<c_int>,
    api: &'static str,
) {
    if !matches!(r, ncclSuccess | ncclInProgress) || newcomm.is_null() {
        return;
    }
    let _ = crate::catch(|| {
        let Some(key) = key() else {
            return;
        };
        // SAFETY: NCCL wrote the new communicator (null for NCCL_SPLIT_NOCOLOR).
        let c = unsafe { *newcomm };
        if c.is_null() || color == Some(NCCL_SPLIT_NOCOLOR) {
            return;
        }
        let parent = comms::lookup(parent);
        // A non-blocking split or shrink may still be initialising: wait for it (bounded).
        let rs = comms::rank_and_size(c).or_else(|| {
            settle(c);
            comms::rank_and_size(c)
        });
        if let Some((rank, size)) = rs {
            comms::register(
                c,
                comms::Joined {
                    key,
                    rank,
                    size,
                    device: parent.and_then(|p| p.device),
                    parent: parent.map(|p| p.key),
                    color,
                    api,
                },
            );
        }
    });
}

comm_hook! {
    /// `ncclRedOpCreatePreMulSum(op, scalar, datatype, residence, comm)`: remembers the
    /// operator's factor (a host scalar's value, or a device scalar's address) for the
    /// collectives using it.
    ncclRedOpCreatePreMulSum / pncclRedOpCreatePreMulSum(
        op: *mut ncclRedOp_t,
        scalar: *mut c_void,
        datatype: ncclDataType_t,
        residence: ncclScalarResidence_t,
        comm: ncclComm_t,
    ) => |real| {
        let factor = crate::catch(|| {
            if residence != ncclScalarHostImmediate {
                return None;
            }
            // SAFETY: a host scalar of `datatype`, per NCCL's contract (NCCL reads it too).
            DType::from_nccl(datatype)
                .and_then(|t| unsafe { super::cublas::read_scalar(scalar.cast_const(), t) })
        })
        .flatten();
        let r = real();
        if r == ncclSuccess && !op.is_null() {
            let _ = crate::catch(|| {
                let p = comms::PreMul {
                    info: PreMulSum {
                        nccl_type: datatype,
                        residence,
                        factor,
                    },
                    ptr: if residence == ncclScalarDevice {
                        scalar as u64
                    } else {
                        0
                    },
                };
                // SAFETY: NCCL wrote the new operator's handle.
                comms::add_premul(comm, unsafe { *op }, p);
            });
        }
        r
    }
}

comm_hook! {
    /// `ncclRedOpDestroy(op, comm)`.
    ncclRedOpDestroy / pncclRedOpDestroy(op: ncclRedOp_t, comm: ncclComm_t) => |real| {
        let r = real();
        if r == ncclSuccess {
            let _ = crate::catch(|| comms::forget_premul(comm, op));
        }
        r
    }
}

comm_hook! {
    /// `ncclCommDestroy(comm)`.
    ncclCommDestroy / pncclCommDestroy(comm: ncclComm_t) => |real| {
        let r = real();
        let _ = crate::catch(|| comms::forget(comm));
        r
    }
}

comm_hook! {
    /// `ncclCommAbort(comm)`.
    ncclCommAbort / pncclCommAbort(comm: ncclComm_t) => |real| {
        let r = real();
        let _ = crate::catch(|| comms::forget(comm));
        r
    }
}

/// `ncclResult_t ncclPutSignal(const void* localbuff, size_t count, ncclDataType_t datatype,
/// int peer, ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx, unsigned int
/// flags, ncclComm_t comm, cudaStream_t stream)` (in NCCL 2.30's headers) and its profiling
/// name: a one-sided write into a peer's registered window. Not captured (the bytes land in
/// another rank's memory, with no call there to snapshot them): a gap naming it, its bytes and
/// peer, once the call succeeded.
macro_rules! put_signal_hook {
    (@export $export:ident ( $($a:ident : $t:ty),* $(,)? )
        => ($count:ident, $dtype:ident, $peer:ident, $offset:ident, $stream:ident)) => {
        /// See [`put_signal_hook!`].
        ///
        /// # Safety
        /// The program's arguments, forwarded unchanged.
        #[no_mangle]
        pub unsafe extern "C" fn $export($($a: $t),*) -> ncclResult_t {
            let Some(real) = real::real_of!($export, fn($($t),*) -> ncclResult_t, Nccl) else {
                return MISSING;
            };
            // SAFETY: the program's arguments, forwarded unchanged.
            let run = || unsafe { real($($a),*) };
            if mode::off(mode::NCCL) {
                return run();
            }
            put_signal_gap(($count, $dtype, $peer, $offset), $stream, run)
        }
    };
    ($name:ident / $twin:ident ( $($a:ident : $t:ty),* $(,)? ) => $what:tt) => {
        put_signal_hook! { @export $name($($a: $t),*) => $what }
        put_signal_hook! { @export $twin($($a: $t),*) => $what }
    };
}

/// The gap of a one-sided put ([`put_signal_hook!`]) of `count` elements of `datatype` to
/// `peer` at `offset` in its window, recorded once `run` succeeded.
fn put_signal_gap(
    (count, datatype, peer, offset): (usize, ncclDataType_t, c_int, usize),
    stream: cudaStream_t,
    run: impl FnOnce() -> ncclResult_t,
) -> ncclResult_t {
    crate::around_metadata(
        "ncclPutSignal",
        stream,
        || {
            let size = DType::from_nccl(datatype).map_or(0, |d| d.size() as u64);
            Some(Op::gap(
                GapReason::Unsupported,
                "ncclPutSignal",
                (count as u64).saturating_mul(size),
                format!(
                    "count={count} datatype={datatype} peer={peer} offset={offset}: one-sided \
                     puts into a peer's window are not captured"
                ),
            ))
        },
        run,
        |r| r == ncclSuccess,
    )
}

put_signal_hook! {
    ncclPutSignal / pncclPutSignal(
        localbuff: *const c_void,
        count: usize,
        datatype: ncclDataType_t,
        peer: c_int,
        peerWin: *mut ncclWindow_vidmem,
        peerWinOffset: usize,
        sigIdx: c_int,
        ctx: c_int,
        flags: core::ffi::c_uint,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) => (count, datatype, peer, peerWinOffset, stream)
}
