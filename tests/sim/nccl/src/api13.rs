//! NCCL 2.28-2.30 entry points PyTorch 2.15 imports (the CUDA 13 build only).
//!
//! `ncclAlltoAll` and `ncclGather` are built from the simulator's point-to-point operations in
//! one group, as NCCL defines them. Communicator growth, revocation, suspension and the device
//! API (symmetric windows addressed from kernels, signals) need device code or ranks joining
//! later, which the simulator does not model: they return `ncclInvalidUsage` with a last-error
//! message, never hang.

use core::ffi::{c_int, c_uint, c_void};

use cuda_abi::cudart::cudaStream_t;
use cuda_abi::nccl::*;

use crate::api::{dtype_of, ncclGroupEnd, ncclGroupStart, ncclRecv, ncclSend};
use crate::comm;
use crate::set_last_error;

fn refuse(what: &str) -> ncclResult_t {
    set_last_error(&format!("{what} is not supported by the simulated NCCL"));
    ncclInvalidUsage
}

/// The rank count of a live communicator, or the error for a bad one.
fn ranks(comm: ncclComm_t) -> Result<c_int, ncclResult_t> {
    Ok(comm::lookup(comm)?.nranks as c_int)
}

/// Runs `body` between `ncclGroupStart` and `ncclGroupEnd`, returning the first error.
fn grouped(body: impl FnOnce() -> ncclResult_t) -> ncclResult_t {
    // SAFETY: no arguments.
    let s = unsafe { ncclGroupStart() };
    if s != ncclSuccess {
        return s;
    }
    let r = body();
    // SAFETY: closes the group opened above (even after an error, as NCCL requires).
    let e = unsafe { ncclGroupEnd() };
    if r != ncclSuccess {
        r
    } else {
        e
    }
}

/// `ncclAlltoAll` (NCCL 2.28): block `p` of `sendbuff` goes to rank `p`, block `p` of
/// `recvbuff` comes from rank `p`; blocks are `count` elements.
#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn ncclAlltoAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    let n = match ranks(comm) {
        Ok(n) => n,
        Err(e) => return e,
    };
    let Some(dt) = dtype_of(datatype) else {
        set_last_error("invalid datatype");
        return ncclInvalidArgument;
    };
    let block = count * dt.size();
    grouped(|| {
        for p in 0..n {
            let off = p as usize * block;
            // SAFETY: NCCL's contract: both buffers hold n blocks of `count` elements.
            let (s, r) = unsafe {
                (
                    ncclSend(
                        sendbuff.cast::<u8>().add(off).cast(),
                        count,
                        datatype,
                        p,
                        comm,
                        stream,
                    ),
                    ncclRecv(
                        recvbuff.cast::<u8>().add(off).cast(),
                        count,
                        datatype,
                        p,
                        comm,
                        stream,
                    ),
                )
            };
            if s != ncclSuccess {
                return s;
            }
            if r != ncclSuccess {
                return r;
            }
        }
        ncclSuccess
    })
}

/// `pncclAlltoAll`.
#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn pncclAlltoAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    // SAFETY: same contract.
    unsafe { ncclAlltoAll(sendbuff, recvbuff, count, datatype, comm, stream) }
}

/// `ncclGather` (NCCL 2.28): every rank's `count` elements land in block `rank` of the root's
/// `recvbuff`.
#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn ncclGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    let n = match ranks(comm) {
        Ok(n) => n,
        Err(e) => return e,
    };
    let me = match comm::lookup(comm) {
        Ok(c) => c.rank as c_int,
        Err(e) => return e,
    };
    let Some(dt) = dtype_of(datatype) else {
        set_last_error("invalid datatype");
        return ncclInvalidArgument;
    };
    if root < 0 || root >= n {
        set_last_error("invalid root");
        return ncclInvalidArgument;
    }
    let block = count * dt.size();
    grouped(|| {
        // SAFETY: NCCL's contract for the buffers (recvbuff: n blocks, at the root).
        let s = unsafe { ncclSend(sendbuff, count, datatype, root, comm, stream) };
        if s != ncclSuccess || me != root {
            return s;
        }
        for p in 0..n {
            // SAFETY: as above.
            let r = unsafe {
                ncclRecv(
                    recvbuff.cast::<u8>().add(p as usize * block).cast(),
                    count,
                    datatype,
                    p,
                    comm,
                    stream,
                )
            };
            if r != ncclSuccess {
                return r;
            }
        }
        ncclSuccess
    })
}

/// `pncclGather`.
#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn pncclGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    // SAFETY: same contract.
    unsafe { ncclGather(sendbuff, recvbuff, count, datatype, root, comm, stream) }
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn ncclCommGetUniqueId(
    comm: ncclComm_t,
    _unique_id: *mut ncclUniqueId,
) -> ncclResult_t {
    match ranks(comm) {
        Ok(_) => refuse("ncclCommGetUniqueId (communicator growth)"),
        Err(e) => e,
    }
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn ncclCommGrow(
    comm: ncclComm_t,
    _nranks: c_int,
    _unique_id: *const ncclUniqueId,
    _rank: c_int,
    _newcomm: *mut ncclComm_t,
    _config: *mut ncclConfig_t,
) -> ncclResult_t {
    match ranks(comm) {
        Ok(_) => refuse("ncclCommGrow"),
        Err(e) => e,
    }
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn ncclCommRevoke(comm: ncclComm_t, _flags: c_int) -> ncclResult_t {
    match ranks(comm) {
        Ok(_) => refuse("ncclCommRevoke"),
        Err(e) => e,
    }
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn ncclCommSuspend(comm: ncclComm_t, _flags: c_int) -> ncclResult_t {
    match ranks(comm) {
        Ok(_) => refuse("ncclCommSuspend"),
        Err(e) => e,
    }
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn ncclCommResume(comm: ncclComm_t) -> ncclResult_t {
    match ranks(comm) {
        Ok(_) => refuse("ncclCommResume"),
        Err(e) => e,
    }
}

/// The simulator's communicators hold no device memory of their own: every statistic is 0.
#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn ncclCommMemStats(
    comm: ncclComm_t,
    stat: ncclCommMemStat_t,
    value: *mut u64,
) -> ncclResult_t {
    if let Err(e) = ranks(comm) {
        return e;
    }
    if value.is_null() || stat > 3 {
        set_last_error("invalid statistic or NULL value");
        return ncclInvalidArgument;
    }
    // SAFETY: checked non-NULL out-pointer.
    unsafe { value.write(0) };
    ncclSuccess
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn ncclDevCommCreate(
    comm: ncclComm_t,
    _reqs: *const ncclDevCommRequirements_t,
    _out: *mut ncclDevComm_t,
) -> ncclResult_t {
    match ranks(comm) {
        Ok(_) => refuse("the NCCL device API (ncclDevCommCreate)"),
        Err(e) => e,
    }
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn ncclDevCommDestroy(
    comm: ncclComm_t,
    _dev_comm: *const ncclDevComm_t,
) -> ncclResult_t {
    match ranks(comm) {
        Ok(_) => refuse("the NCCL device API (ncclDevCommDestroy)"),
        Err(e) => e,
    }
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn ncclGetLsaMultimemDevicePointer(
    _window: ncclWindow_t,
    _offset: usize,
    _out: *mut *mut c_void,
) -> ncclResult_t {
    refuse("multimem device pointers")
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn ncclGetPeerDevicePointer(
    _window: ncclWindow_t,
    _offset: usize,
    _peer: c_int,
    _out: *mut *mut c_void,
) -> ncclResult_t {
    refuse("peer device pointers")
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn ncclWinGetUserPtr(
    comm: ncclComm_t,
    _win: ncclWindow_t,
    _out: *mut *mut c_void,
) -> ncclResult_t {
    match ranks(comm) {
        Ok(_) => refuse("ncclWinGetUserPtr"),
        Err(e) => e,
    }
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn ncclPutSignal(
    _localbuff: *const c_void,
    _count: usize,
    _datatype: ncclDataType_t,
    _peer: c_int,
    _peer_win: ncclWindow_t,
    _peer_win_offset: usize,
    _sig_idx: c_int,
    _ctx: c_int,
    _flags: c_uint,
    comm: ncclComm_t,
    _stream: cudaStream_t,
) -> ncclResult_t {
    match ranks(comm) {
        Ok(_) => refuse("one-sided puts (ncclPutSignal)"),
        Err(e) => e,
    }
}

/// `pncclPutSignal`.
#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn pncclPutSignal(
    localbuff: *const c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    peer_win: ncclWindow_t,
    peer_win_offset: usize,
    sig_idx: c_int,
    ctx: c_int,
    flags: c_uint,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    // SAFETY: same contract.
    unsafe {
        ncclPutSignal(
            localbuff,
            count,
            datatype,
            peer,
            peer_win,
            peer_win_offset,
            sig_idx,
            ctx,
            flags,
            comm,
            stream,
        )
    }
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn ncclSignal(
    _peer: c_int,
    _sig_idx: c_int,
    _ctx: c_int,
    _flags: c_uint,
    comm: ncclComm_t,
    _stream: cudaStream_t,
) -> ncclResult_t {
    match ranks(comm) {
        Ok(_) => refuse("signals (ncclSignal)"),
        Err(e) => e,
    }
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn ncclWaitSignal(
    _n_desc: c_int,
    _descs: *mut ncclWaitSignalDesc_t,
    comm: ncclComm_t,
    _stream: cudaStream_t,
) -> ncclResult_t {
    match ranks(comm) {
        Ok(_) => refuse("signals (ncclWaitSignal)"),
        Err(e) => e,
    }
}
