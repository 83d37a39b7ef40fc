//! Device code: module registration (what nvcc's generated host code calls at load time) and
//! kernel launches.
//!
//! The simulator has no device-code images, so a kernel launch fails as it does on a GPU that
//! the binary carries no image for: `cudaErrorNoKernelImageForDevice`, returned and set as the
//! thread's last error, but not sticky (the context stays usable, later copies and GEMMs work).
//! PyTorch turns that into a Python `RuntimeError` and carries on. Registration succeeds and
//! remembers each kernel's name, so that with `SIM_CUDA_LOG_KERNELS=1` every refused launch is
//! logged to stderr naming the kernel.

use core::ffi::{c_char, c_int, c_uint, c_void};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::{Mutex, OnceLock};

use cuda_abi::cudart::*;

use crate::{guard, out, rt};

/// Registered kernels: host stub address -> device function name.
fn kernels() -> &'static Mutex<HashMap<usize, String>> {
    static K: OnceLock<Mutex<HashMap<usize, String>>> = OnceLock::new();
    K.get_or_init(|| Mutex::new(HashMap::new()))
}

/// A launch configuration pushed by `<<<...>>>` and popped by the kernel's host stub.
#[derive(Clone, Copy)]
struct CallConfig {
    grid: dim3,
    block: dim3,
    shared: usize,
    stream: cudaStream_t,
}

thread_local! {
    static CALL_CONFIGS: RefCell<Vec<CallConfig>> = const { RefCell::new(Vec::new()) };
}

/// Whether refused launches are logged (`SIM_CUDA_LOG_KERNELS=1`).
fn log_kernels() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("SIM_CUDA_LOG_KERNELS").is_ok_and(|v| v == "1"))
}

/// The refusal of a launch of `func`, logged when asked for.
pub(crate) fn no_image(func: *const c_void, api: &str) -> Result<(), cudaError_t> {
    rt()?;
    if log_kernels() {
        let name = kernels()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(func as usize))
            .cloned()
            .unwrap_or_else(|| format!("<unregistered kernel at {func:p}>"));
        eprintln!(
            "sim-cudart: {api}: kernel {name} cannot run on the simulated device \
             (cudaErrorNoKernelImageForDevice)"
        );
    }
    Err(cudaErrorNoKernelImageForDevice)
}

/// Registers a fat binary; the handle is what nvcc's code passes back on every later call.
#[no_mangle]
pub unsafe extern "C" fn __cudaRegisterFatBinary(fat_cubin: *mut c_void) -> *mut *mut c_void {
    // One leaked cell per module: modules are registered once, at load time, and the handle
    // must stay valid until `__cudaUnregisterFatBinary`, which programs call at exit.
    Box::into_raw(Box::new(fat_cubin))
}

#[no_mangle]
pub unsafe extern "C" fn __cudaRegisterFatBinaryEnd(_handle: *mut *mut c_void) {}

#[no_mangle]
pub unsafe extern "C" fn __cudaUnregisterFatBinary(_handle: *mut *mut c_void) {
    // Kept: a library unloaded at exit may still have stubs racing with other threads' exit
    // paths; the cell is a few bytes per module.
}

#[no_mangle]
pub unsafe extern "C" fn __cudaInitModule(_handle: *mut *mut c_void) -> c_char {
    1
}

/// Remembers a kernel's device name for its host stub (used to name it in the launch log).
#[no_mangle]
pub unsafe extern "C" fn __cudaRegisterFunction(
    _handle: *mut *mut c_void,
    host_fun: *const c_char,
    _device_fun: *mut c_char,
    device_name: *const c_char,
    _thread_limit: c_int,
    _tid: *mut uint3,
    _bid: *mut uint3,
    _b_dim: *mut dim3,
    _g_dim: *mut dim3,
    _w_size: *mut c_int,
) {
    if device_name.is_null() {
        return;
    }
    // SAFETY: nvcc passes the mangled name as a NUL-terminated string with static lifetime.
    let name = unsafe { CStr::from_ptr(device_name) }
        .to_string_lossy()
        .into_owned();
    kernels()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(host_fun as usize, name);
}

#[no_mangle]
pub unsafe extern "C" fn __cudaRegisterVar(
    _handle: *mut *mut c_void,
    host_var: *mut c_char,
    _device_address: *mut c_char,
    _device_name: *const c_char,
    _ext: c_int,
    size: usize,
    _constant: c_int,
    _global: c_int,
) {
    // A variable's storage is made on each device at its first use, from the host shadow's
    // bytes now (nvcc's registration code passes the shadow, which holds the initialiser).
    crate::api_memory::register_symbol(host_var as *const c_void, size);
}

/// `kernel<<<grid, block, shared, stream>>>` pushes its configuration before calling the stub.
#[no_mangle]
pub unsafe extern "C" fn __cudaPushCallConfiguration(
    grid: dim3,
    block: dim3,
    shared: usize,
    stream: *mut CUstream_st,
) -> c_uint {
    CALL_CONFIGS.with(|c| {
        c.borrow_mut().push(CallConfig {
            grid,
            block,
            shared,
            stream,
        })
    });
    0
}

/// The stub pops the configuration and calls `cudaLaunchKernel` with it.
#[no_mangle]
pub unsafe extern "C" fn __cudaPopCallConfiguration(
    grid: *mut dim3,
    block: *mut dim3,
    shared: *mut usize,
    stream: *mut c_void,
) -> cudaError_t {
    let Some(c) = CALL_CONFIGS.with(|c| c.borrow_mut().pop()) else {
        return cudaErrorInvalidConfiguration;
    };
    guard(|| {
        // SAFETY: out-pointers from nvcc's stub; `stream` points at a `cudaStream_t`.
        unsafe {
            out(grid, c.grid)?;
            out(block, c.block)?;
            out(shared, c.shared)?;
            out(stream.cast::<cudaStream_t>(), c.stream)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaLaunchKernel(
    func: *const c_void,
    _grid: dim3,
    _block: dim3,
    _args: *mut *mut c_void,
    _shared: usize,
    _stream: cudaStream_t,
) -> cudaError_t {
    guard(|| no_image(func, "cudaLaunchKernel"))
}

#[no_mangle]
pub unsafe extern "C" fn cudaLaunchKernel_ptsz(
    func: *const c_void,
    _grid: dim3,
    _block: dim3,
    _args: *mut *mut c_void,
    _shared: usize,
    _stream: cudaStream_t,
) -> cudaError_t {
    guard(|| no_image(func, "cudaLaunchKernel"))
}

#[no_mangle]
pub unsafe extern "C" fn cudaLaunchKernelExC(
    _config: *const cudaLaunchConfig_st,
    func: *const c_void,
    _args: *mut *mut c_void,
) -> cudaError_t {
    guard(|| no_image(func, "cudaLaunchKernelExC"))
}

#[no_mangle]
pub unsafe extern "C" fn cudaLaunchKernelExC_ptsz(
    _config: *const cudaLaunchConfig_st,
    func: *const c_void,
    _args: *mut *mut c_void,
) -> cudaError_t {
    guard(|| no_image(func, "cudaLaunchKernelExC"))
}

/// No image, so no attributes: what CUDA reports for a kernel without an image for the device.
#[no_mangle]
pub unsafe extern "C" fn cudaFuncGetAttributes(
    _attr: *mut cudaFuncAttributes,
    func: *const c_void,
) -> cudaError_t {
    guard(|| no_image(func, "cudaFuncGetAttributes"))
}

#[no_mangle]
pub unsafe extern "C" fn cudaFuncSetAttribute(
    func: *const c_void,
    _attr: cudaFuncAttribute,
    _value: c_int,
) -> cudaError_t {
    guard(|| no_image(func, "cudaFuncSetAttribute"))
}

#[no_mangle]
pub unsafe extern "C" fn cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    _num_blocks: *mut c_int,
    func: *const c_void,
    _block_size: c_int,
    _dynamic_smem: usize,
    _flags: c_uint,
) -> cudaError_t {
    guard(|| {
        no_image(
            func,
            "cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags",
        )
    })
}
