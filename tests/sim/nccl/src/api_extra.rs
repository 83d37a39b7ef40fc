//! NCCL 2.19-2.27 entry points PyTorch imports beyond the collectives: buffer and window
//! registration, `ncclMemAlloc`, `ncclCommShrink` and `ncclGroupSimulateEnd`.
//!
//! Registration is an optimisation hint in NCCL (zero-copy, symmetric kernels): the simulator's
//! collectives work on any device buffer, so registering succeeds with a handle that records
//! the range and deregistering checks the handle. `ncclMemAlloc` allocates device memory from
//! the simulated runtime.

use core::ffi::{c_int, c_void};

use cuda_abi::cudart::*;
use cuda_abi::nccl::*;

use crate::comm;
use crate::group;
use crate::set_last_error;

/// What a registration handle (buffer or window) points at.
struct Registration {
    comm: usize,
    buff: usize,
    size: usize,
}

fn ffi(f: impl FnOnce() -> Result<(), ncclResult_t>) -> ncclResult_t {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|_| {
            set_last_error("internal error (panic in the simulated NCCL)");
            Err(ncclInternalError)
        })
        .map_or_else(|e| e, |()| ncclSuccess)
}

fn invalid(msg: &str) -> ncclResult_t {
    set_last_error(msg);
    ncclInvalidArgument
}

fn register(comm: ncclComm_t, buff: *mut c_void, size: usize) -> Result<*mut c_void, ncclResult_t> {
    comm::lookup(comm)?;
    if buff.is_null() && size > 0 {
        return Err(invalid("buffer is NULL"));
    }
    let r = Box::new(Registration {
        comm: comm as usize,
        buff: buff as usize,
        size,
    });
    Ok(Box::into_raw(r).cast())
}

fn deregister(comm: ncclComm_t, handle: *mut c_void) -> Result<(), ncclResult_t> {
    comm::lookup(comm)?;
    if handle.is_null() {
        return Err(invalid("handle is NULL"));
    }
    // SAFETY: a handle made by `register` (NCCL's contract: deregister what was registered,
    // once); its communicator is checked before it is freed.
    let r = unsafe { Box::from_raw(handle.cast::<Registration>()) };
    if r.comm != comm as usize {
        let _ = Box::into_raw(r);
        return Err(invalid("handle registered with another communicator"));
    }
    let _ = (r.buff, r.size);
    Ok(())
}

/// `ncclCommRegister`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommRegister(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
) -> ncclResult_t {
    ffi(|| {
        if handle.is_null() {
            return Err(invalid("handle is NULL"));
        }
        let h = register(comm, buff, size)?;
        // SAFETY: checked non-NULL out-pointer.
        unsafe { handle.write(h) };
        Ok(())
    })
}

/// `ncclCommDeregister`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommDeregister(comm: ncclComm_t, handle: *mut c_void) -> ncclResult_t {
    ffi(|| deregister(comm, handle))
}

/// `ncclCommWindowRegister` (NCCL 2.27): a window over `[buff, buff+size)`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommWindowRegister(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    win: *mut ncclWindow_t,
    _win_flags: c_int,
) -> ncclResult_t {
    ffi(|| {
        if win.is_null() {
            return Err(invalid("win is NULL"));
        }
        let h = register(comm, buff, size)?;
        // SAFETY: checked non-NULL out-pointer.
        unsafe { win.write(h.cast()) };
        Ok(())
    })
}

/// `ncclCommWindowDeregister`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommWindowDeregister(
    comm: ncclComm_t,
    win: ncclWindow_t,
) -> ncclResult_t {
    ffi(|| deregister(comm, win.cast()))
}

type CudaMalloc = unsafe extern "C" fn(*mut *mut c_void, usize) -> cudaError_t;
type CudaFree = unsafe extern "C" fn(*mut c_void) -> cudaError_t;

/// `ncclMemAlloc`: device memory on the current device (from the simulated runtime directly,
/// as NCCL allocates through the driver, not through the runtime's exports).
#[no_mangle]
pub unsafe extern "C" fn ncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> ncclResult_t {
    ffi(|| {
        if ptr.is_null() {
            return Err(invalid("ptr is NULL"));
        }
        let f = sim_device::runtime_symbol(c"cudaMalloc").ok_or(ncclSystemError)?;
        // SAFETY: the simulated runtime's `cudaMalloc`, with its C signature.
        let malloc = unsafe { std::mem::transmute::<*mut c_void, CudaMalloc>(f) };
        // SAFETY: checked non-NULL out-pointer.
        match unsafe { malloc(ptr, size) } {
            cudaSuccess => Ok(()),
            _ => Err(ncclUnhandledCudaError),
        }
    })
}

/// `ncclMemFree`.
#[no_mangle]
pub unsafe extern "C" fn ncclMemFree(ptr: *mut c_void) -> ncclResult_t {
    ffi(|| {
        let f = sim_device::runtime_symbol(c"cudaFree").ok_or(ncclSystemError)?;
        // SAFETY: the simulated runtime's `cudaFree`, with its C signature.
        let free = unsafe { std::mem::transmute::<*mut c_void, CudaFree>(f) };
        // SAFETY: a pointer from `ncclMemAlloc`, per NCCL's contract.
        match unsafe { free(ptr) } {
            cudaSuccess => Ok(()),
            _ => Err(ncclUnhandledCudaError),
        }
    })
}

/// `ncclCommShrink` (NCCL 2.27): called by the surviving ranks only; they meet on the new
/// communicator (see [`comm::Comm::shrink`]). `NCCL_SHRINK_ABORT` first fails the parent's
/// pending operations, as `ncclCommAbort` would.
#[no_mangle]
pub unsafe extern "C" fn ncclCommShrink(
    comm: ncclComm_t,
    exclude_ranks: *mut c_int,
    exclude_count: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
    shrink_flags: c_int,
) -> ncclResult_t {
    crate::api::ffi_r(|| {
        let parent = comm::lookup(comm)?;
        if newcomm.is_null() {
            return Err(invalid("newcomm is NULL"));
        }
        if exclude_count < 0 || (exclude_count > 0 && exclude_ranks.is_null()) {
            return Err(invalid("invalid excludeRanksList"));
        }
        if shrink_flags & !NCCL_SHRINK_ABORT != 0 {
            return Err(invalid(&format!("invalid shrinkFlags {shrink_flags}")));
        }
        let excluded = if exclude_count == 0 {
            &[][..]
        } else {
            // SAFETY: the caller passes `exclude_count` ranks.
            unsafe { std::slice::from_raw_parts(exclude_ranks, exclude_count as usize) }
        };
        // SAFETY: per the caller's contract for `config`.
        let blocking = unsafe { crate::api::config_blocking(config) }?.unwrap_or(parent.blocking);
        if shrink_flags & NCCL_SHRINK_ABORT != 0 {
            parent.abort();
        }
        let (key, n, r) = parent.shrink(excluded).map_err(|m| invalid(&m))?;
        let c = comm::Comm::arrive(key, n, r, parent.device, blocking).map_err(|f| {
            set_last_error(&f.to_string());
            comm::fail_code(&f)
        })?;
        crate::api::finish_init(c, newcomm, blocking)
    })
}

/// `pncclCommShrink`.
#[no_mangle]
pub unsafe extern "C" fn pncclCommShrink(
    comm: ncclComm_t,
    exclude_ranks: *mut c_int,
    exclude_count: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
    shrink_flags: c_int,
) -> ncclResult_t {
    // SAFETY: same contract.
    unsafe {
        ncclCommShrink(
            comm,
            exclude_ranks,
            exclude_count,
            newcomm,
            config,
            shrink_flags,
        )
    }
}

/// `ncclGroupSimulateEnd`: closes the group without running it and reports an estimate of 0 s
/// (the simulator has no performance model).
#[no_mangle]
pub unsafe extern "C" fn ncclGroupSimulateEnd(info: *mut ncclSimInfo_t) -> ncclResult_t {
    ffi(|| {
        group::simulate_end()?;
        if !info.is_null() {
            // SAFETY: a caller's ncclSimInfo_t; `estimatedTime` exists in every version, and the
            // struct is at least as large as the version the caller's header declared.
            unsafe { (*info).estimatedTime = 0.0 };
        }
        Ok(())
    })
}

/// `pncclGroupSimulateEnd`.
#[no_mangle]
pub unsafe extern "C" fn pncclGroupSimulateEnd(info: *mut ncclSimInfo_t) -> ncclResult_t {
    // SAFETY: same contract.
    unsafe { ncclGroupSimulateEnd(info) }
}
