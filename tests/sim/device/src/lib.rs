//! The simulated runtime's private "kernel launch" interface, as seen by the simulated cuBLAS,
//! cuBLASLt and NCCL.
//!
//! Real cuBLAS and NCCL link the CUDA runtime statically and launch kernels through the driver:
//! a tracer that interposes the exported `cuda*` symbols never sees their internal work. The
//! simulated libraries keep that property by reaching the device (the simulated
//! `libcudart.so.12`, which owns memory, streams and events) through three private exports,
//! resolved with a handle `dlsym` that `LD_PRELOAD` does not interpose:
//!
//! * `__simcudaLaunch(stream, work, user)`: enqueue a kernel on a stream;
//! * `__simcudaDeviceAccess(ptr, len)`: the host address where device code reads `[ptr, ptr+len)`;
//! * `__simcudaCurrentDevice()`: the calling thread's current device.
//!
//! # Kernel contract
//! A kernel is a `SimWorkFn` and a `user` pointer. The runtime calls `work(user, SIM_WORK_RUN)`
//! on the stream's worker thread when the stream reaches it (zero or more times: a captured
//! graph replays it on every launch) and `work(user, SIM_WORK_DROP)` exactly once, last, to free
//! `user`. A nonzero return from a run is a `cudaError_t` that becomes the context's sticky error
//! (as a faulting kernel does on a GPU). A kernel captured into a graph also gets
//! `work(user, SIM_WORK_LAUNCHED)` on the launching thread at each `cudaGraphLaunch` of it,
//! before that replay is enqueued ([`launch_graphable`]; a no-op for [`launch`]'s kernels),
//! possibly while an earlier replay of it runs.

use core::ffi::{c_int, c_void};
use std::sync::{Mutex, OnceLock};

use cuda_abi::cudart::*;

/// `action` for a kernel run.
pub const SIM_WORK_RUN: c_int = 0;
/// `action` for the final release of a kernel's state.
pub const SIM_WORK_DROP: c_int = 1;
/// `action` on the launching thread when a graph holding the kernel is launched
/// (`cudaGraphLaunch`), once per launch and before that run is enqueued, in the graph's node
/// order: work that takes a place in an order shared with eager work (NCCL's per-communicator
/// sequence numbers) takes it then, as the launch call orders it.
pub const SIM_WORK_LAUNCHED: c_int = 2;

/// A kernel: see the crate documentation.
pub type SimWorkFn = unsafe extern "C" fn(user: *mut c_void, action: c_int) -> cudaError_t;
/// `__simcudaLaunch`.
pub type SimLaunchFn =
    unsafe extern "C" fn(stream: cudaStream_t, work: SimWorkFn, user: *mut c_void) -> cudaError_t;
/// `__simcudaDeviceAccess`.
pub type SimDeviceAccessFn = unsafe extern "C" fn(ptr: *const c_void, len: usize) -> *mut c_void;
/// `__simcudaCurrentDevice`.
pub type SimCurrentDeviceFn = unsafe extern "C" fn() -> c_int;

/// Names of the private exports, NUL-terminated.
pub const LAUNCH_SYMBOL: &[u8] = b"__simcudaLaunch\0";
pub const DEVICE_ACCESS_SYMBOL: &[u8] = b"__simcudaDeviceAccess\0";
pub const CURRENT_DEVICE_SYMBOL: &[u8] = b"__simcudaCurrentDevice\0";

struct Runtime {
    /// The `dlopen` handle of the simulated runtime (kept open for the process).
    handle: usize,
    launch: SimLaunchFn,
    device_access: SimDeviceAccessFn,
    current_device: SimCurrentDeviceFn,
}

fn runtime() -> Option<&'static Runtime> {
    static RT: OnceLock<Option<Runtime>> = OnceLock::new();
    RT.get_or_init(|| {
        // SAFETY: dlopen/dlsym with NUL-terminated names; RTLD_NOLOAD finds the copy the program
        // already loaded (by any path), else the RUNPATH ($ORIGIN) of this library finds ours.
        unsafe {
            let name = concat!(env!("SIM_CUDART_SONAME"), "\0").as_ptr().cast();
            let mut h = libc::dlopen(name, libc::RTLD_NOW | libc::RTLD_NOLOAD);
            if h.is_null() {
                h = libc::dlopen(name, libc::RTLD_NOW | libc::RTLD_GLOBAL);
            }
            if h.is_null() {
                return None;
            }
            let sym = |n: &[u8]| libc::dlsym(h, n.as_ptr().cast());
            let (l, d, c) = (
                sym(LAUNCH_SYMBOL),
                sym(DEVICE_ACCESS_SYMBOL),
                sym(CURRENT_DEVICE_SYMBOL),
            );
            if l.is_null() || d.is_null() || c.is_null() {
                return None;
            }
            Some(Runtime {
                handle: h as usize,
                launch: std::mem::transmute::<*mut c_void, SimLaunchFn>(l),
                device_access: std::mem::transmute::<*mut c_void, SimDeviceAccessFn>(d),
                current_device: std::mem::transmute::<*mut c_void, SimCurrentDeviceFn>(c),
            })
        }
    })
    .as_ref()
}

/// The simulated runtime's export `name` (looked up in the runtime itself, so an `LD_PRELOAD`
/// library does not interpose it: a library's internal use of the runtime stays invisible to
/// a tracer, as with real libraries that link it statically).
pub fn runtime_symbol(name: &core::ffi::CStr) -> Option<*mut c_void> {
    let rt = runtime()?;
    // SAFETY: a live dlopen handle and a NUL-terminated name.
    let p = unsafe { libc::dlsym(rt.handle as *mut c_void, name.as_ptr()) };
    (!p.is_null()).then_some(p)
}

/// Whether the simulated runtime could be reached (false when a real `libcudart.so.12` is
/// loaded, or none at all).
pub fn available() -> bool {
    runtime().is_some()
}

/// A host address at which device code may read and write device memory. `Send` because a
/// kernel runs on the stream's worker thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevicePtr(pub *mut u8);
// SAFETY: the pointee is device memory, whose lifetime and synchronisation the stream model
// governs; the pointer itself is only an address.
unsafe impl Send for DevicePtr {}
// SAFETY: as above.
unsafe impl Sync for DevicePtr {}

impl DevicePtr {
    /// The bytes `[0, len)`.
    ///
    /// # Safety
    /// The range must have been validated by [`device_access`] with at least `len` bytes, and
    /// no other kernel may write it concurrently.
    pub unsafe fn slice<'a>(self, len: usize) -> &'a [u8] {
        // SAFETY: per the caller's contract.
        unsafe { std::slice::from_raw_parts(self.0, len) }
    }
    /// The bytes `[0, len)`, mutable.
    ///
    /// # Safety
    /// As [`DevicePtr::slice`], and no other reference to the range may be live.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut<'a>(self, len: usize) -> &'a mut [u8] {
        // SAFETY: per the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.0, len) }
    }
}

/// The host address where device code accesses `[ptr, ptr+len)`: device memory, or pinned
/// host memory (mapped, as UVA makes it). `None` for pageable host memory, unknown pointers
/// or ranges that leave their allocation: a GPU would fault on them.
// The runtime only looks the address up; it never dereferences it.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn device_access(ptr: *const c_void, len: usize) -> Option<DevicePtr> {
    let rt = runtime()?;
    // SAFETY: the runtime validates the range and returns null when it is not accessible.
    let p = unsafe { (rt.device_access)(ptr, len) };
    (!p.is_null()).then_some(DevicePtr(p.cast()))
}

/// The calling thread's current device, or 0 when no simulated runtime is loaded.
pub fn current_device() -> c_int {
    // SAFETY: a plain query.
    runtime().map_or(0, |rt| unsafe { (rt.current_device)() })
}

/// A kernel's work: what it runs, and what it does when a graph holding it is launched. The
/// two may be called at once (a launch while an earlier replay runs): each has its own lock.
struct Kernel {
    run: Mutex<Box<dyn FnMut() -> Result<(), cudaError_t> + Send>>,
    launched: Option<Mutex<Box<dyn FnMut() + Send>>>,
}

unsafe extern "C" fn trampoline(user: *mut c_void, action: c_int) -> cudaError_t {
    let k = user.cast::<Kernel>();
    if action == SIM_WORK_DROP {
        // SAFETY: `user` came from Box::into_raw in `launch`, and DROP is the last call.
        drop(unsafe { Box::from_raw(k) });
        return cudaSuccess;
    }
    // SAFETY: `user` lives until DROP, which comes after every other call.
    let k = unsafe { &*k };
    // A panic must not cross the C boundary: it becomes a launch failure.
    let r = if action == SIM_WORK_LAUNCHED {
        let Some(f) = &k.launched else {
            return cudaSuccess;
        };
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            (f.lock().unwrap_or_else(|p| p.into_inner()))();
            Ok(())
        }))
    } else {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            (k.run.lock().unwrap_or_else(|p| p.into_inner()))()
        }))
    };
    match r {
        Ok(Ok(())) => cudaSuccess,
        Ok(Err(e)) => e,
        Err(_) => cudaErrorLaunchFailure,
    }
}

/// Enqueues `kernel` on `stream` (0 = legacy default stream, `cudaStreamPerThread` = the calling
/// thread's). Returns the runtime's status; `cudaErrorInitializationError` when no simulated
/// runtime is loaded.
// The stream handle is only looked up by the runtime, never dereferenced.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn launch<F>(stream: cudaStream_t, kernel: F) -> cudaError_t
where
    F: FnMut() -> Result<(), cudaError_t> + Send + 'static,
{
    launch_kernel(stream, Box::new(kernel), None)
}

/// [`launch`], with `launched` called on the launching thread at each launch of a graph the
/// kernel was captured into ([`SIM_WORK_LAUNCHED`]).
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn launch_graphable<F, L>(stream: cudaStream_t, kernel: F, launched: L) -> cudaError_t
where
    F: FnMut() -> Result<(), cudaError_t> + Send + 'static,
    L: FnMut() + Send + 'static,
{
    launch_kernel(stream, Box::new(kernel), Some(Box::new(launched)))
}

/// Hands a kernel's work to the runtime ([`launch`], [`launch_graphable`]).
fn launch_kernel(
    stream: cudaStream_t,
    run: Box<dyn FnMut() -> Result<(), cudaError_t> + Send>,
    launched: Option<Box<dyn FnMut() + Send>>,
) -> cudaError_t {
    let Some(rt) = runtime() else {
        return cudaErrorInitializationError;
    };
    let boxed = Box::new(Kernel {
        run: Mutex::new(run),
        launched: launched.map(Mutex::new),
    });
    // SAFETY: the runtime takes ownership of `user` and releases it through `trampoline`.
    unsafe { (rt.launch)(stream, trampoline, Box::into_raw(boxed).cast()) }
}
