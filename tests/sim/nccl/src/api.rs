//! The exported C entry points, each with its `pncclX` twin (real NCCL exports both since
//! 2.16: `pncclX` strong, `ncclX` weak). Every body catches panics: a panic never crosses the
//! C boundary, it becomes `ncclInternalError`.

use core::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

use cuda_abi::cudart::cudaStream_t;
use cuda_abi::nccl::*;
use sim_kernels::dtype::DType;
use sim_kernels::reduce::ReduceOp;

use crate::comm::{self, fail_code, Comm, Scalar, UserOp};
use crate::exec::{Buf, Kind, Op, Red};
use crate::group;
use crate::set_last_error;

/// Runs an entry point's body, turning a panic into `ncclInternalError`.
fn ffi(f: impl FnOnce() -> ncclResult_t) -> ncclResult_t {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
        set_last_error("internal error (panic in the simulated NCCL)");
        ncclInternalError
    })
}

/// Like [`ffi`] for bodies that return `Result`.
pub(crate) fn ffi_r(f: impl FnOnce() -> Result<ncclResult_t, ncclResult_t>) -> ncclResult_t {
    ffi(|| f().unwrap_or_else(|e| e))
}

fn invalid(msg: &str) -> ncclResult_t {
    set_last_error(msg);
    ncclInvalidArgument
}

/// The element type of an `ncclDataType_t`.
pub fn dtype_of(t: ncclDataType_t) -> Option<DType> {
    Some(match t {
        ncclInt8 => DType::I8,
        ncclUint8 => DType::U8,
        ncclInt32 => DType::I32,
        ncclUint32 => DType::U32,
        ncclInt64 => DType::I64,
        ncclUint64 => DType::U64,
        ncclFloat16 => DType::F16,
        ncclFloat32 => DType::F32,
        ncclFloat64 => DType::F64,
        ncclBfloat16 => DType::BF16,
        ncclFloat8e4m3 => DType::E4M3,
        ncclFloat8e5m2 => DType::E5M2,
        _ => return None,
    })
}

/// Reads the `blocking` field of a caller's config, honouring its `size` (never the size
/// compiled here). `Ok(None)`: no config or field left undefined.
///
/// # Safety
/// `config` is NULL or points to at least `config->size` readable bytes.
pub(crate) unsafe fn config_blocking(
    config: *const ncclConfig_t,
) -> Result<Option<bool>, ncclResult_t> {
    if config.is_null() {
        return Ok(None);
    }
    let base = config.cast::<u8>();
    // SAFETY: `size` is the first field of every config version.
    let size = unsafe { std::ptr::read_unaligned(base.cast::<usize>()) };
    let magic_off = std::mem::offset_of!(ncclConfig_t, magic);
    if size < magic_off + 4 {
        return Err(invalid("ncclConfig_t is not initialized (size too small)"));
    }
    // SAFETY: within the caller's `size` bytes.
    let magic = unsafe { std::ptr::read_unaligned(base.add(magic_off).cast::<u32>()) };
    if magic != NCCL_CONFIG_MAGIC {
        return Err(invalid(
            "ncclConfig_t is not initialized with NCCL_CONFIG_INITIALIZER (bad magic)",
        ));
    }
    let off = std::mem::offset_of!(ncclConfig_t, blocking);
    if size < off + 4 {
        return Ok(None);
    }
    // SAFETY: within the caller's `size` bytes.
    let v = unsafe { std::ptr::read_unaligned(base.add(off).cast::<c_int>()) };
    match v {
        NCCL_CONFIG_UNDEF_INT => Ok(None),
        0 => Ok(Some(false)),
        1 => Ok(Some(true)),
        _ => Err(invalid("ncclConfig_t.blocking must be 0 or 1")),
    }
}

/// Default of `blocking`: `NCCL_COMM_BLOCKING`, else blocking.
fn env_blocking() -> bool {
    std::env::var("NCCL_COMM_BLOCKING")
        .map(|v| v.trim() != "0")
        .unwrap_or(true)
}

fn init_rank(
    out: *mut ncclComm_t,
    nranks: c_int,
    id: &ncclUniqueId,
    rank: c_int,
    config: *const ncclConfig_t,
) -> Result<ncclResult_t, ncclResult_t> {
    if out.is_null() {
        return Err(invalid("comm is NULL"));
    }
    if nranks < 1 || rank < 0 || rank >= nranks {
        return Err(invalid(&format!("invalid rank {rank} of {nranks}")));
    }
    // SAFETY: per the caller's contract for `config`.
    let blocking = unsafe { config_blocking(config) }?.unwrap_or_else(env_blocking);
    let dev = sim_device::current_device();
    let c = Comm::arrive(
        comm::key_of(id),
        nranks as usize,
        rank as usize,
        dev,
        blocking,
    )
    .map_err(|f| {
        set_last_error(&format!("init of rank {rank} of {nranks}: {f}"));
        fail_code(&f)
    })?;
    finish_init(c, out, blocking)
}

/// Registers a freshly arrived communicator and completes (or defers) its init.
pub(crate) fn finish_init(
    c: Arc<Comm>,
    out: *mut ncclComm_t,
    blocking: bool,
) -> Result<ncclResult_t, ncclResult_t> {
    let h = comm::register(c.clone());
    // SAFETY: `out` was checked non-NULL by the caller.
    unsafe { *out = h };
    if group::in_group() {
        group::defer_init(c);
        return Ok(ncclSuccess);
    }
    if !blocking {
        return Ok(ncclInProgress);
    }
    c.wait_ready().map_err(|f| {
        comm::unregister(h);
        fail_code(&f)
    })?;
    Ok(ncclSuccess)
}

/// A live, healthy communicator.
fn healthy(h: ncclComm_t) -> Result<Arc<Comm>, ncclResult_t> {
    let c = comm::lookup(h)?;
    if c.failed() {
        set_last_error("the communicator failed earlier (see ncclCommGetAsyncError)");
        return Err(c.async_error());
    }
    Ok(c)
}

fn user_red(c: &Comm, op: ncclRedOp_t, datatype: ncclDataType_t) -> Result<Red, ncclResult_t> {
    let u = c
        .user_op(op)
        .ok_or_else(|| invalid(&format!("invalid reduction operation {op}")))?;
    if u.datatype != datatype {
        return Err(invalid(
            "data type supplied to user-created ncclRedOp_t does not match the operation's",
        ));
    }
    Ok(match u.scalar {
        Scalar::Host(b) => Red::Op(ReduceOp::PreMulSum(b)),
        Scalar::Device(p) => Red::DeviceScalar(p),
    })
}

/// Translates a buffer argument of `len` bytes for the kernel.
fn buffer(p: *const c_void, len: usize, name: &'static str) -> Result<Buf, ncclResult_t> {
    if len == 0 {
        return Ok(Buf::Unused);
    }
    match sim_device::device_access(p, len) {
        Some(d) => Ok(Buf::Dev(d)),
        None => {
            let check = std::env::var("NCCL_CHECK_POINTERS")
                .map(|v| v.trim() == "1")
                .unwrap_or(false);
            if check {
                Err(invalid(&format!(
                    "{name} {p:?} is not a valid device pointer"
                )))
            } else {
                // As on a GPU: accepted here, the kernel faults on it.
                Ok(Buf::Bad(name))
            }
        }
    }
}

/// Validates and enqueues one operation (shared by every collective and point-to-point call).
#[allow(clippy::too_many_arguments)]
fn enqueue(
    kind: Kind,
    sendbuff: *const c_void,
    recvbuff: *const c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: Option<ncclRedOp_t>,
    peer: c_int,
    h: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    let r = ffi_r(|| {
        let c = healthy(h)?;
        let dtype =
            dtype_of(datatype).ok_or_else(|| invalid(&format!("invalid data type {datatype}")))?;
        let n = c.nranks;
        let red = match op {
            None => Red::None,
            Some(ncclSum) => Red::Op(ReduceOp::Sum),
            Some(ncclProd) => Red::Op(ReduceOp::Prod),
            Some(ncclMax) => Red::Op(ReduceOp::Max),
            Some(ncclMin) => Red::Op(ReduceOp::Min),
            Some(ncclAvg) => Red::Op(ReduceOp::avg(dtype, n)),
            Some(o) => user_red(&c, o, datatype)?,
        };
        let rooted = matches!(kind, Kind::Broadcast | Kind::Reduce);
        let peer = if rooted || kind.is_p2p() {
            if peer < 0 || peer as usize >= n {
                let what = if rooted { "root" } else { "peer" };
                return Err(invalid(&format!("invalid {what} {peer} (nranks {n})")));
            }
            peer as usize
        } else {
            0
        };
        if count == 0 && !kind.is_p2p() {
            return Ok(ncclSuccess);
        }
        let bytes = count
            .checked_mul(dtype.size())
            .and_then(|b| b.checked_mul(n).map(|_| b))
            .ok_or_else(|| invalid("count too large"))?;
        let me = c.rank;
        let (send_len, recv_len) = match kind {
            Kind::AllReduce => (bytes, bytes),
            Kind::Broadcast => (if me == peer { bytes } else { 0 }, bytes),
            Kind::Reduce => (bytes, if me == peer { bytes } else { 0 }),
            Kind::AllGather => (bytes, bytes * n),
            Kind::ReduceScatter => (bytes * n, bytes),
            Kind::Send => (bytes, 0),
            Kind::Recv => (0, bytes),
        };
        let send = buffer(sendbuff, send_len, "sendbuff")?;
        let recv = buffer(recvbuff, recv_len, "recvbuff")?;
        let o = Op {
            kind,
            comm: c,
            stream: stream as usize,
            send,
            recv,
            count,
            dtype,
            nccl_dtype: datatype,
            red,
            peer,
            seq: Default::default(),
        };
        Ok(group::enqueue(o))
    });
    if r != ncclSuccess {
        group::note_error(r);
    }
    r
}

// ---------------------------------------------------------------------------------------------
// Version, ids, errors

/// `ncclGetVersion`: 22705.
#[no_mangle]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> ncclResult_t {
    ffi(|| {
        if version.is_null() {
            return invalid("version is NULL");
        }
        // SAFETY: non-NULL output pointer from the caller.
        unsafe { *version = NCCL_VERSION_CODE };
        ncclSuccess
    })
}

/// `pncclGetVersion`.
#[no_mangle]
pub unsafe extern "C" fn pncclGetVersion(version: *mut c_int) -> ncclResult_t {
    // SAFETY: same contract.
    unsafe { ncclGetVersion(version) }
}

/// `ncclGetUniqueId`.
#[no_mangle]
pub unsafe extern "C" fn ncclGetUniqueId(uniqueId: *mut ncclUniqueId) -> ncclResult_t {
    ffi(|| {
        if uniqueId.is_null() {
            return invalid("uniqueId is NULL");
        }
        match comm::new_unique_id() {
            Ok(id) => {
                // SAFETY: non-NULL output pointer from the caller.
                unsafe { *uniqueId = id };
                ncclSuccess
            }
            Err(f) => {
                set_last_error(&f.to_string());
                fail_code(&f)
            }
        }
    })
}

/// `pncclGetUniqueId`.
#[no_mangle]
pub unsafe extern "C" fn pncclGetUniqueId(uniqueId: *mut ncclUniqueId) -> ncclResult_t {
    // SAFETY: same contract.
    unsafe { ncclGetUniqueId(uniqueId) }
}

/// `ncclGetErrorString`: NCCL's texts.
#[no_mangle]
pub unsafe extern "C" fn ncclGetErrorString(result: ncclResult_t) -> *const c_char {
    let s: &'static core::ffi::CStr = match result {
        ncclSuccess => c"no error",
        ncclUnhandledCudaError => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        ncclSystemError => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        ncclInternalError => c"internal error - please report this issue to the NCCL developers",
        ncclInvalidArgument => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        ncclInvalidUsage => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        ncclRemoteError => c"remote process exited or there was a network error",
        ncclInProgress => c"NCCL operation in progress",
        _ => c"unknown result code",
    };
    s.as_ptr()
}

/// `pncclGetErrorString`.
#[no_mangle]
pub unsafe extern "C" fn pncclGetErrorString(result: ncclResult_t) -> *const c_char {
    // SAFETY: no pointer arguments.
    unsafe { ncclGetErrorString(result) }
}

/// `ncclGetLastError`: the text of the latest error in this process (`comm` is ignored, as in
/// NCCL).
#[no_mangle]
pub unsafe extern "C" fn ncclGetLastError(comm: ncclComm_t) -> *const c_char {
    let _ = comm;
    crate::last_error_ptr()
}

/// `pncclGetLastError`.
#[no_mangle]
pub unsafe extern "C" fn pncclGetLastError(comm: ncclComm_t) -> *const c_char {
    // SAFETY: `comm` is not dereferenced.
    unsafe { ncclGetLastError(comm) }
}

// ---------------------------------------------------------------------------------------------
// Communicators

/// `ncclCommInitRank`: blocks until all `nranks` ranks joined (unless inside a group).
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRank(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
) -> ncclResult_t {
    ffi_r(|| init_rank(comm, nranks, &commId, rank, std::ptr::null()))
}

/// `pncclCommInitRank`.
#[no_mangle]
pub unsafe extern "C" fn pncclCommInitRank(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
) -> ncclResult_t {
    // SAFETY: same contract.
    unsafe { ncclCommInitRank(comm, nranks, commId, rank) }
}

/// `ncclCommInitRankConfig`: `config->blocking = 0` returns `ncclInProgress`; poll
/// `ncclCommGetAsyncError` until it reports `ncclSuccess`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankConfig(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    ffi_r(|| init_rank(comm, nranks, &commId, rank, config))
}

/// `pncclCommInitRankConfig`.
#[no_mangle]
pub unsafe extern "C" fn pncclCommInitRankConfig(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    // SAFETY: same contract.
    unsafe { ncclCommInitRankConfig(comm, nranks, commId, rank, config) }
}

/// `ncclCommInitRankScalable`: every rank passes the same ids; the first one names the
/// communicator.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankScalable(
    newcomm: *mut ncclComm_t,
    nranks: c_int,
    myrank: c_int,
    nId: c_int,
    commIds: *mut ncclUniqueId,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    ffi_r(|| {
        if nId < 1 || commIds.is_null() {
            return Err(invalid("commIds is NULL or nId < 1"));
        }
        // SAFETY: the caller passes nId >= 1 ids.
        let id = unsafe { *commIds };
        init_rank(newcomm, nranks, &id, myrank, config)
    })
}

/// `pncclCommInitRankScalable`.
#[no_mangle]
pub unsafe extern "C" fn pncclCommInitRankScalable(
    newcomm: *mut ncclComm_t,
    nranks: c_int,
    myrank: c_int,
    nId: c_int,
    commIds: *mut ncclUniqueId,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    // SAFETY: same contract.
    unsafe { ncclCommInitRankScalable(newcomm, nranks, myrank, nId, commIds, config) }
}

/// `ncclCommInitAll`: one process, `ndev` devices, one communicator per device.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitAll(
    comm: *mut ncclComm_t,
    ndev: c_int,
    devlist: *const c_int,
) -> ncclResult_t {
    ffi_r(|| {
        if comm.is_null() {
            return Err(invalid("comm is NULL"));
        }
        if ndev < 1 {
            return Err(invalid(&format!("invalid ndev {ndev}")));
        }
        let n = ndev as usize;
        let devs: Vec<c_int> = if devlist.is_null() {
            (0..ndev).collect()
        } else {
            // SAFETY: the caller passes ndev device numbers.
            unsafe { std::slice::from_raw_parts(devlist, n) }.to_vec()
        };
        if devs.iter().any(|d| *d < 0) {
            return Err(invalid("invalid device in devlist"));
        }
        for (i, d) in devs.iter().enumerate() {
            if devs[..i].contains(d) {
                set_last_error(&format!("duplicate device {d} in devlist"));
                return Err(ncclInvalidUsage);
            }
        }
        // A private id: NCCL_COMM_ID names the multi-process bootstrap, not this one.
        let mut id = ncclUniqueId {
            internal: [0; NCCL_UNIQUE_ID_BYTES],
        };
        let mut r = [0u8; 16];
        // SAFETY: getrandom fills the buffer.
        if unsafe { libc::getrandom(r.as_mut_ptr().cast(), 16, 0) } != 16 {
            set_last_error("getrandom failed");
            return Err(ncclSystemError);
        }
        for (d, s) in id.internal.iter_mut().zip(b"SIMNCCLA".iter().chain(&r)) {
            *d = *s as c_char;
        }
        let key = comm::key_of(&id);
        let mut comms = Vec::with_capacity(n);
        for (i, d) in devs.iter().enumerate() {
            let c = Comm::arrive(key, n, i, *d, true).map_err(|f| {
                set_last_error(&f.to_string());
                fail_code(&f)
            })?;
            comms.push(c);
        }
        for c in &comms {
            c.wait_ready().map_err(|f| fail_code(&f))?;
        }
        for (i, c) in comms.into_iter().enumerate() {
            // SAFETY: the caller's array has room for ndev handles.
            unsafe { *comm.add(i) = comm::register(c) };
        }
        Ok(ncclSuccess)
    })
}

/// `pncclCommInitAll`.
#[no_mangle]
pub unsafe extern "C" fn pncclCommInitAll(
    comm: *mut ncclComm_t,
    ndev: c_int,
    devlist: *const c_int,
) -> ncclResult_t {
    // SAFETY: same contract.
    unsafe { ncclCommInitAll(comm, ndev, devlist) }
}

/// `ncclCommSplit`: a host-side collective over `comm`; `NCCL_SPLIT_NOCOLOR` gives NULL.
#[no_mangle]
pub unsafe extern "C" fn ncclCommSplit(
    comm: ncclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    ffi_r(|| {
        let parent = healthy(comm)?;
        if newcomm.is_null() {
            return Err(invalid("newcomm is NULL"));
        }
        if color < 0 && color != NCCL_SPLIT_NOCOLOR {
            return Err(invalid(&format!("invalid color {color}")));
        }
        // SAFETY: per the caller's contract for `config`.
        let blocking = unsafe { config_blocking(config) }?.unwrap_or(parent.blocking);
        parent.wait_ready().map_err(|f| fail_code(&f))?;
        match parent.split(color, key) {
            Err(f) => Err(parent.fail(&f)),
            Ok(None) => {
                // SAFETY: checked non-NULL.
                unsafe { *newcomm = std::ptr::null_mut() };
                Ok(ncclSuccess)
            }
            Ok(Some((k, n, r))) => {
                let c = Comm::arrive(k, n, r, parent.device, blocking).map_err(|f| {
                    set_last_error(&f.to_string());
                    fail_code(&f)
                })?;
                finish_init(c, newcomm, blocking)
            }
        }
    })
}

/// `pncclCommSplit`.
#[no_mangle]
pub unsafe extern "C" fn pncclCommSplit(
    comm: ncclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    // SAFETY: same contract.
    unsafe { ncclCommSplit(comm, color, key, newcomm, config) }
}

/// `ncclCommFinalize`: waits (bounded) until every operation issued on `comm` completed.
#[no_mangle]
pub unsafe extern "C" fn ncclCommFinalize(comm: ncclComm_t) -> ncclResult_t {
    ffi_r(|| {
        let c = healthy(comm)?;
        c.flush().map_err(|f| c.fail(&f))?;
        Ok(ncclSuccess)
    })
}

/// `pncclCommFinalize`.
#[no_mangle]
pub unsafe extern "C" fn pncclCommFinalize(comm: ncclComm_t) -> ncclResult_t {
    // SAFETY: same contract.
    unsafe { ncclCommFinalize(comm) }
}

/// `ncclCommDestroy`: frees the handle; the shared memory goes once the kernels still using it
/// finished and every rank let go of it.
#[no_mangle]
pub unsafe extern "C" fn ncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
    ffi_r(|| {
        comm::lookup(comm)?;
        comm::unregister(comm);
        Ok(ncclSuccess)
    })
}

/// `pncclCommDestroy`.
#[no_mangle]
pub unsafe extern "C" fn pncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
    // SAFETY: same contract.
    unsafe { ncclCommDestroy(comm) }
}

/// `ncclCommAbort`: fails this rank's pending operations and every peer's (instead of leaving
/// them hanging), then frees the handle.
#[no_mangle]
pub unsafe extern "C" fn ncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
    ffi_r(|| {
        let c = comm::lookup(comm)?;
        c.abort();
        comm::unregister(comm);
        Ok(ncclSuccess)
    })
}

/// `pncclCommAbort`.
#[no_mangle]
pub unsafe extern "C" fn pncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
    // SAFETY: same contract.
    unsafe { ncclCommAbort(comm) }
}

/// Shared by the three small queries.
fn query(comm: ncclComm_t, out: *mut c_int, f: impl FnOnce(&Comm) -> c_int) -> ncclResult_t {
    ffi_r(|| {
        let c = comm::lookup(comm)?;
        if out.is_null() {
            return Err(invalid("output pointer is NULL"));
        }
        // SAFETY: non-NULL output pointer from the caller.
        unsafe { *out = f(&c) };
        Ok(ncclSuccess)
    })
}

/// `ncclCommCount`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t {
    query(comm, count, |c| c.nranks as c_int)
}

/// `pncclCommCount`.
#[no_mangle]
pub unsafe extern "C" fn pncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t {
    // SAFETY: same contract.
    unsafe { ncclCommCount(comm, count) }
}

/// `ncclCommUserRank`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t {
    query(comm, rank, |c| c.rank as c_int)
}

/// `pncclCommUserRank`.
#[no_mangle]
pub unsafe extern "C" fn pncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t {
    // SAFETY: same contract.
    unsafe { ncclCommUserRank(comm, rank) }
}

/// `ncclCommCuDevice`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t {
    query(comm, device, |c| c.device)
}

/// `pncclCommCuDevice`.
#[no_mangle]
pub unsafe extern "C" fn pncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t {
    // SAFETY: same contract.
    unsafe { ncclCommCuDevice(comm, device) }
}

/// `ncclCommGetAsyncError`: `ncclInProgress` while a non-blocking init is pending, then the
/// first asynchronous failure (`ncclRemoteError` after a peer died) or `ncclSuccess`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommGetAsyncError(
    comm: ncclComm_t,
    asyncError: *mut ncclResult_t,
) -> ncclResult_t {
    ffi_r(|| {
        let c = comm::lookup(comm)?;
        if asyncError.is_null() {
            return Err(invalid("asyncError is NULL"));
        }
        let v = match c.poll_ready() {
            Ok(false) => ncclInProgress,
            Ok(true) | Err(_) => c.async_error(),
        };
        // SAFETY: non-NULL output pointer from the caller.
        unsafe { *asyncError = v };
        Ok(ncclSuccess)
    })
}

/// `pncclCommGetAsyncError`.
#[no_mangle]
pub unsafe extern "C" fn pncclCommGetAsyncError(
    comm: ncclComm_t,
    asyncError: *mut ncclResult_t,
) -> ncclResult_t {
    // SAFETY: same contract.
    unsafe { ncclCommGetAsyncError(comm, asyncError) }
}

// ---------------------------------------------------------------------------------------------
// User reduction operators

/// `ncclRedOpCreatePreMulSum`: a sum of the inputs each multiplied by `*scalar` (read now for
/// `ncclScalarHostImmediate`, when the collective runs for `ncclScalarDevice`).
#[no_mangle]
pub unsafe extern "C" fn ncclRedOpCreatePreMulSum(
    op: *mut ncclRedOp_t,
    scalar: *mut c_void,
    datatype: ncclDataType_t,
    residence: ncclScalarResidence_t,
    comm: ncclComm_t,
) -> ncclResult_t {
    ffi_r(|| {
        let c = healthy(comm)?;
        if op.is_null() || scalar.is_null() {
            return Err(invalid("op or scalar is NULL"));
        }
        let dtype =
            dtype_of(datatype).ok_or_else(|| invalid(&format!("invalid data type {datatype}")))?;
        let s = match residence {
            ncclScalarHostImmediate => {
                let mut b = [0u8; 8];
                // SAFETY: a host scalar of the dtype's size, per the caller's contract.
                let src = unsafe { std::slice::from_raw_parts(scalar.cast::<u8>(), dtype.size()) };
                b[..dtype.size()].copy_from_slice(src);
                Scalar::Host(b)
            }
            ncclScalarDevice => match sim_device::device_access(scalar, dtype.size()) {
                Some(p) => Scalar::Device(p),
                None => return Err(invalid("scalar is not a device pointer")),
            },
            _ => return Err(invalid(&format!("invalid scalar residence {residence}"))),
        };
        let h = c.add_user_op(UserOp {
            datatype,
            scalar: s,
        });
        // SAFETY: non-NULL output pointer from the caller.
        unsafe { *op = h };
        Ok(ncclSuccess)
    })
}

/// `pncclRedOpCreatePreMulSum`.
#[no_mangle]
pub unsafe extern "C" fn pncclRedOpCreatePreMulSum(
    op: *mut ncclRedOp_t,
    scalar: *mut c_void,
    datatype: ncclDataType_t,
    residence: ncclScalarResidence_t,
    comm: ncclComm_t,
) -> ncclResult_t {
    // SAFETY: same contract.
    unsafe { ncclRedOpCreatePreMulSum(op, scalar, datatype, residence, comm) }
}

/// `ncclRedOpDestroy`.
#[no_mangle]
pub unsafe extern "C" fn ncclRedOpDestroy(op: ncclRedOp_t, comm: ncclComm_t) -> ncclResult_t {
    ffi_r(|| {
        let c = comm::lookup(comm)?;
        if !c.remove_user_op(op) {
            return Err(invalid(&format!("invalid user reduction operation {op}")));
        }
        Ok(ncclSuccess)
    })
}

/// `pncclRedOpDestroy`.
#[no_mangle]
pub unsafe extern "C" fn pncclRedOpDestroy(op: ncclRedOp_t, comm: ncclComm_t) -> ncclResult_t {
    // SAFETY: same contract.
    unsafe { ncclRedOpDestroy(op, comm) }
}

// ---------------------------------------------------------------------------------------------
// Collectives and point-to-point

/// `ncclReduce`: the reduction lands in `recvbuff` of `root` (NULL allowed elsewhere).
#[no_mangle]
pub unsafe extern "C" fn ncclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    enqueue(
        Kind::Reduce,
        sendbuff,
        recvbuff,
        count,
        datatype,
        Some(op),
        root,
        comm,
        stream,
    )
}

/// `pncclReduce`.
#[no_mangle]
pub unsafe extern "C" fn pncclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    // SAFETY: same contract.
    unsafe { ncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream) }
}

type BroadcastFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    c_int,
    ncclComm_t,
    cudaStream_t,
) -> ncclResult_t;

/// `ncclBcast`: in-place broadcast. Like NCCL, it calls `ncclBroadcast` through the global
/// scope, so an interposed `ncclBroadcast` sees the call too.
#[no_mangle]
pub unsafe extern "C" fn ncclBcast(
    buff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    static TARGET: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let addr = *TARGET.get_or_init(|| {
        // SAFETY: dlsym with a NUL-terminated name.
        unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"ncclBroadcast".as_ptr()) as usize }
    });
    let f: BroadcastFn = if addr == 0 {
        ncclBroadcast
    } else {
        // SAFETY: whatever defines ncclBroadcast in the global scope has NCCL's signature.
        unsafe { std::mem::transmute::<usize, BroadcastFn>(addr) }
    };
    // SAFETY: same contract as ncclBroadcast with sendbuff == recvbuff.
    unsafe { f(buff, buff, count, datatype, root, comm, stream) }
}

/// `pncclBcast`.
#[no_mangle]
pub unsafe extern "C" fn pncclBcast(
    buff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    // SAFETY: same contract.
    unsafe { ncclBcast(buff, count, datatype, root, comm, stream) }
}

/// `ncclBroadcast`.
#[no_mangle]
pub unsafe extern "C" fn ncclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    enqueue(
        Kind::Broadcast,
        sendbuff,
        recvbuff,
        count,
        datatype,
        None,
        root,
        comm,
        stream,
    )
}

/// `pncclBroadcast`.
#[no_mangle]
pub unsafe extern "C" fn pncclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    // SAFETY: same contract.
    unsafe { ncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream) }
}

/// `ncclAllReduce`.
#[no_mangle]
pub unsafe extern "C" fn ncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    enqueue(
        Kind::AllReduce,
        sendbuff,
        recvbuff,
        count,
        datatype,
        Some(op),
        0,
        comm,
        stream,
    )
}

/// `pncclAllReduce`.
#[no_mangle]
pub unsafe extern "C" fn pncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    // SAFETY: same contract.
    unsafe { ncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream) }
}

/// `ncclReduceScatter`: `sendbuff` holds `nranks * recvcount` elements.
#[no_mangle]
pub unsafe extern "C" fn ncclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    enqueue(
        Kind::ReduceScatter,
        sendbuff,
        recvbuff,
        recvcount,
        datatype,
        Some(op),
        0,
        comm,
        stream,
    )
}

/// `pncclReduceScatter`.
#[no_mangle]
pub unsafe extern "C" fn pncclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    // SAFETY: same contract.
    unsafe { ncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream) }
}

/// `ncclAllGather`: `recvbuff` holds `nranks * sendcount` elements.
#[no_mangle]
pub unsafe extern "C" fn ncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    enqueue(
        Kind::AllGather,
        sendbuff,
        recvbuff,
        sendcount,
        datatype,
        None,
        0,
        comm,
        stream,
    )
}

/// `pncclAllGather`.
#[no_mangle]
pub unsafe extern "C" fn pncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    // SAFETY: same contract.
    unsafe { ncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream) }
}

/// `ncclSend`.
#[no_mangle]
pub unsafe extern "C" fn ncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    enqueue(
        Kind::Send,
        sendbuff,
        std::ptr::null(),
        count,
        datatype,
        None,
        peer,
        comm,
        stream,
    )
}

/// `pncclSend`.
#[no_mangle]
pub unsafe extern "C" fn pncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    // SAFETY: same contract.
    unsafe { ncclSend(sendbuff, count, datatype, peer, comm, stream) }
}

/// `ncclRecv`.
#[no_mangle]
pub unsafe extern "C" fn ncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    enqueue(
        Kind::Recv,
        std::ptr::null(),
        recvbuff,
        count,
        datatype,
        None,
        peer,
        comm,
        stream,
    )
}

/// `pncclRecv`.
#[no_mangle]
pub unsafe extern "C" fn pncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    // SAFETY: same contract.
    unsafe { ncclRecv(recvbuff, count, datatype, peer, comm, stream) }
}

/// `ncclGroupStart`.
#[no_mangle]
pub unsafe extern "C" fn ncclGroupStart() -> ncclResult_t {
    ffi(group::start)
}

/// `pncclGroupStart`.
#[no_mangle]
pub unsafe extern "C" fn pncclGroupStart() -> ncclResult_t {
    // SAFETY: no arguments.
    unsafe { ncclGroupStart() }
}

/// `ncclGroupEnd`: launches everything recorded since the outermost `ncclGroupStart`.
#[no_mangle]
pub unsafe extern "C" fn ncclGroupEnd() -> ncclResult_t {
    ffi(group::end)
}

/// `pncclGroupEnd`.
#[no_mangle]
pub unsafe extern "C" fn pncclGroupEnd() -> ncclResult_t {
    // SAFETY: no arguments.
    unsafe { ncclGroupEnd() }
}
