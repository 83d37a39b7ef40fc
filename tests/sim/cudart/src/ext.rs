//! The private exports the simulated cuBLAS, cuBLASLt and NCCL use to reach the device (see the
//! `sim-device` crate for the contract). Their `__sim` names keep them out of every NVIDIA header
//! and out of the ABI check.

use core::ffi::{c_int, c_void};

use cuda_abi::cudart::*;

use crate::{guard, rt, Op};

/// Action codes of the kernel contract (mirrors `sim_device::SIM_WORK_*`).
const RUN: c_int = 0;
const DROP: c_int = 1;
const LAUNCHED: c_int = 2;

type WorkFn = unsafe extern "C" fn(user: *mut c_void, action: c_int) -> cudaError_t;

/// Owns a launched kernel's state: runs it on request, releases it exactly once on drop.
struct Kernel {
    work: WorkFn,
    user: *mut c_void,
}
// SAFETY: the kernel contract says the state is used only by the runtime, one run at a time;
// a launch notice may come while a run is in progress, which the contract allows.
unsafe impl Send for Kernel {}
// SAFETY: as above: runs are never concurrent with each other (a stream runs one op at a time,
// a graph's replays are ops of one stream), and the contract allows a launch notice beside one.
unsafe impl Sync for Kernel {}

impl Kernel {
    fn run(&self) -> Result<(), cudaError_t> {
        // SAFETY: per the kernel contract.
        match unsafe { (self.work)(self.user, RUN) } {
            cudaSuccess => Ok(()),
            e => Err(e),
        }
    }

    /// A graph holding the kernel was launched (the contract's `SIM_WORK_LAUNCHED`).
    fn launched(&self) {
        // SAFETY: per the kernel contract. A failure here has nowhere to go: the run that
        // follows reports it.
        unsafe { (self.work)(self.user, LAUNCHED) };
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
        if s.capture().is_some() {
            crate::errors::sticky()?;
            // Captured: the kernel is told of every launch of its graph, on the launching
            // thread (run and hook share it; the last of them to go releases it).
            let kernel = std::sync::Arc::new(k.take().ok_or(cudaErrorUnknown)?);
            let hook = kernel.clone();
            let op: Op = Box::new(move || kernel.run());
            let launched: crate::streams::LaunchHook = Box::new(move || hook.launched());
            return r.capture_hooked_node(
                &s,
                cudaGraphNodeTypeKernel,
                crate::streams::NodeBody::Op(std::sync::Mutex::new(op)),
                Some(launched),
            );
        }
        let kernel = k.take().ok_or(cudaErrorUnknown)?;
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
