//! The private exports the simulated cuBLAS, cuBLASLt and NCCL use to reach the device (see the
//! `sim-device` crate for the contract). Their `__sim` names keep them out of every NVIDIA header
//! and out of the ABI check.

use core::ffi::{c_int, c_void};

use cuda_abi::cudart::*;

use crate::{guard, rt, Op};

/// Action codes of the kernel contract (mirrors `sim_device::SIM_WORK_*`).
const RUN: c_int = 0;
const DROP: c_int = 1;

type WorkFn = unsafe extern "C" fn(user: *mut c_void, action: c_int) -> cudaError_t;

/// Owns a launched kernel's state: runs it on request, releases it exactly once on drop.
struct Kernel {
    work: WorkFn,
    user: *mut c_void,
}
// SAFETY: the kernel contract says the state is used only by the runtime, one call at a time.
unsafe impl Send for Kernel {}

impl Kernel {
    fn run(&mut self) -> Result<(), cudaError_t> {
        // SAFETY: per the kernel contract.
        match unsafe { (self.work)(self.user, RUN) } {
            cudaSuccess => Ok(()),
            e => Err(e),
        }
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        // SAFETY: per the kernel contract, DROP comes last and once.
        unsafe { (self.work)(self.user, DROP) };
    }
}

/// Enqueues a kernel on `stream` (recorded instead when the stream is capturing).
#[no_mangle]
pub unsafe extern "C" fn __simcudaLaunch(
    stream: cudaStream_t,
    work: WorkFn,
    user: *mut c_void,
) -> cudaError_t {
    let mut k = Some(Kernel { work, user });
    guard(|| {
        let r = rt()?;
        let s = r.stream(stream, false)?;
        let mut kernel = k.take().ok_or(cudaErrorUnknown)?;
        let op: Op = Box::new(move || kernel.run());
        r.submit(&s, Vec::new(), op).map(|_| ())
    })
    // On an error before submission, `k` still owns the kernel and releases it here.
}

/// The host address where device code accesses `[ptr, ptr+len)`, or null.
#[no_mangle]
pub unsafe extern "C" fn __simcudaDeviceAccess(ptr: *const c_void, len: usize) -> *mut c_void {
    rt().ok()
        .and_then(|r| r.heap.device_access(ptr, len))
        .map_or(std::ptr::null_mut(), |p| p.cast())
}

/// The calling thread's current device.
#[no_mangle]
pub unsafe extern "C" fn __simcudaCurrentDevice() -> c_int {
    rt().map_or(0, |r| r.current_device())
}
