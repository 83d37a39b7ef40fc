//! The exported driver entry points.

use core::ffi::{c_char, c_int, c_uint, c_void};
use std::ffi::CStr;
use std::sync::OnceLock;

use cuda_abi::cudart::CUDART_VERSION;
use cuda_abi::driver::*;

/// The loaded simulated runtime (never loaded here: it is the one the program uses).
pub(crate) fn runtime() -> Option<usize> {
    static H: OnceLock<Option<usize>> = OnceLock::new();
    *H.get_or_init(|| {
        let soname = concat!(env!("SIM_CUDART_SONAME"), "\0");
        // SAFETY: NUL-terminated name; RTLD_NOLOAD only finds an already loaded library.
        let h = unsafe { libc::dlopen(soname.as_ptr().cast(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        (!h.is_null()).then_some(h as usize)
    })
}

/// The runtime's export `name`, as a function pointer of type `F`.
///
/// # Safety
/// `F` must be the C signature of `name`.
pub(crate) unsafe fn rt_fn<F: Copy>(name: &CStr) -> Option<F> {
    let h = runtime()?;
    // SAFETY: a live handle and a NUL-terminated name.
    let p = unsafe { libc::dlsym(h as *mut c_void, name.as_ptr()) };
    // SAFETY: per the caller, F is a function pointer type matching the symbol.
    (!p.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

fn device_count() -> c_int {
    type F = unsafe extern "C" fn(*mut c_int) -> c_uint;
    let mut n = 0;
    // SAFETY: `cudaGetDeviceCount(int*)`.
    match unsafe { rt_fn::<F>(c"cudaGetDeviceCount") } {
        // SAFETY: valid out-pointer.
        Some(f) if unsafe { f(&mut n) } == 0 => n,
        _ => 0,
    }
}

fn current_device() -> c_int {
    type F = unsafe extern "C" fn() -> c_int;
    // SAFETY: `__simcudaCurrentDevice()`.
    unsafe { rt_fn::<F>(c"__simcudaCurrentDevice") }.map_or(0, |f| unsafe { f() })
}

fn check_device(dev: CUdevice) -> Result<(), CUresult> {
    if runtime().is_none() {
        return Err(CUDA_ERROR_NOT_INITIALIZED);
    }
    if dev < 0 || dev >= device_count() {
        return Err(CUDA_ERROR_INVALID_DEVICE);
    }
    Ok(())
}

fn primary_active(dev: CUdevice) -> bool {
    type F = unsafe extern "C" fn(c_int) -> c_int;
    // SAFETY: `__simcudaPrimaryContextActive(int)`.
    unsafe { rt_fn::<F>(c"__simcudaPrimaryContextActive") }.is_some_and(|f| unsafe { f(dev) } != 0)
}

/// Device `dev`'s primary context handle: a distinct non-null token per device.
fn context_of(dev: CUdevice) -> CUcontext {
    (0x1000 + dev as usize) as CUcontext
}

fn device_of(ctx: CUcontext) -> Option<CUdevice> {
    let d = (ctx as usize).checked_sub(0x1000)?;
    (d < device_count() as usize).then_some(d as CUdevice)
}

fn result(r: Result<(), CUresult>) -> CUresult {
    r.err().unwrap_or(CUDA_SUCCESS)
}

/// Writes `v` through a non-null out-pointer.
unsafe fn out<T>(p: *mut T, v: T) -> Result<(), CUresult> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null out-pointer from the caller, as the C API requires.
    unsafe { p.write(v) };
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    if flags != 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if runtime().is_none() {
        // The simulated driver serves the simulated runtime only.
        return CUDA_ERROR_NO_DEVICE;
    }
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    // SAFETY: out-pointer from the caller.
    result(unsafe { out(version, CUDART_VERSION) })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    // SAFETY: out-pointer from the caller.
    result(unsafe { out(count, device_count()) })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    // SAFETY: `device` is the caller's out-pointer (checked for null by `out`).
    result(check_device(ordinal).and_then(|()| unsafe { out(device, ordinal) }))
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    pi: *mut c_int,
    attrib: CUdevice_attribute,
    dev: CUdevice,
) -> CUresult {
    type F = unsafe extern "C" fn(*mut c_int, c_uint, c_int) -> c_uint;
    if let Err(e) = check_device(dev) {
        return e;
    }
    // SAFETY: `cudaDeviceGetAttribute(int*, cudaDeviceAttr, int)`; the driver's and the
    // runtime's attribute enums have the same values, and so do the errors it returns.
    match unsafe { rt_fn::<F>(c"cudaDeviceGetAttribute") } {
        // SAFETY: as above; `pi` is the caller's out-pointer.
        Some(f) => unsafe { f(pi, attrib, dev) },
        None => CUDA_ERROR_NOT_INITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    result(check_device(dev).and_then(|()| {
        if name.is_null() || len <= 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let s = b"NVIDIA H100 80GB HBM3 (ttrace simulated)\0";
        let n = s.len().min(len as usize);
        // SAFETY: the caller's buffer holds `len` bytes; the last byte written is a NUL.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), name, n);
            name.add(n - 1).write(0);
        }
        Ok(())
    }))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: CUdevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CUresult {
    result(check_device(dev).and_then(|()| {
        // SAFETY: out-pointers from the caller.
        unsafe {
            out(flags, 0)?;
            out(active, primary_active(dev) as c_int)
        }
    }))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    type F = unsafe extern "C" fn(c_int) -> c_uint;
    result(check_device(dev).and_then(|()| {
        // SAFETY: `__simcudaPrimaryContextRetain(int)`.
        let f = unsafe { rt_fn::<F>(c"__simcudaPrimaryContextRetain") }
            .ok_or(CUDA_ERROR_NOT_INITIALIZED)?;
        // SAFETY: as above.
        match unsafe { f(dev) } {
            // SAFETY: `pctx` is the caller's out-pointer (checked for null by `out`).
            0 => unsafe { out(pctx, context_of(dev)) },
            e => Err(e),
        }
    }))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    // The runtime keeps its primary contexts for the life of the process, as CUDA's does
    // while the runtime holds a reference.
    result(check_device(dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    if runtime().is_none() {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    let d = current_device();
    let ctx = if primary_active(d) {
        context_of(d)
    } else {
        std::ptr::null_mut()
    };
    // SAFETY: out-pointer from the caller.
    result(unsafe { out(pctx, ctx) })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    type F = unsafe extern "C" fn(c_int) -> c_uint;
    if ctx.is_null() {
        // Unbinding leaves the runtime's current device as it is.
        return CUDA_SUCCESS;
    }
    let Some(d) = device_of(ctx) else {
        return CUDA_ERROR_INVALID_CONTEXT;
    };
    // SAFETY: `cudaSetDevice(int)`.
    match unsafe { rt_fn::<F>(c"cudaSetDevice") } {
        // SAFETY: as above.
        Some(f) => unsafe { f(d) },
        None => CUDA_ERROR_NOT_INITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut CUdevice) -> CUresult {
    if runtime().is_none() {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    // SAFETY: out-pointer from the caller.
    result(unsafe { out(device, current_device()) })
}

/// (code, name, description), NUL-terminated.
const ERRORS: &[(CUresult, &str, &str)] = &[
    (CUDA_SUCCESS, "CUDA_SUCCESS\0", "no error\0"),
    (
        CUDA_ERROR_INVALID_VALUE,
        "CUDA_ERROR_INVALID_VALUE\0",
        "invalid argument\0",
    ),
    (
        CUDA_ERROR_NOT_INITIALIZED,
        "CUDA_ERROR_NOT_INITIALIZED\0",
        "initialization error\0",
    ),
    (
        CUDA_ERROR_NO_DEVICE,
        "CUDA_ERROR_NO_DEVICE\0",
        "no CUDA-capable device is detected\0",
    ),
    (
        CUDA_ERROR_INVALID_DEVICE,
        "CUDA_ERROR_INVALID_DEVICE\0",
        "invalid device ordinal\0",
    ),
    (
        CUDA_ERROR_INVALID_IMAGE,
        "CUDA_ERROR_INVALID_IMAGE\0",
        "device kernel image is invalid\0",
    ),
    (
        CUDA_ERROR_INVALID_CONTEXT,
        "CUDA_ERROR_INVALID_CONTEXT\0",
        "invalid device context\0",
    ),
    (
        CUDA_ERROR_NO_BINARY_FOR_GPU,
        "CUDA_ERROR_NO_BINARY_FOR_GPU\0",
        "no kernel image is available for execution on the device\0",
    ),
    (
        CUDA_ERROR_FILE_NOT_FOUND,
        "CUDA_ERROR_FILE_NOT_FOUND\0",
        "file not found\0",
    ),
    (
        CUDA_ERROR_INVALID_HANDLE,
        "CUDA_ERROR_INVALID_HANDLE\0",
        "invalid resource handle\0",
    ),
    (
        CUDA_ERROR_NOT_FOUND,
        "CUDA_ERROR_NOT_FOUND\0",
        "named symbol not found\0",
    ),
    (
        CUDA_ERROR_NOT_SUPPORTED,
        "CUDA_ERROR_NOT_SUPPORTED\0",
        "operation not supported\0",
    ),
    (
        CUDA_ERROR_UNKNOWN,
        "CUDA_ERROR_UNKNOWN\0",
        "unknown error\0",
    ),
];

fn error_text(error: CUresult, p: *mut *const c_char, name: bool) -> CUresult {
    let hit = ERRORS.iter().find(|e| e.0 == error);
    let s = hit.map_or(std::ptr::null(), |e| {
        if name { e.1 } else { e.2 }.as_ptr().cast::<c_char>()
    });
    // SAFETY: out-pointer from the caller.
    match unsafe { out(p, s) } {
        Err(e) => e,
        Ok(()) if hit.is_none() => CUDA_ERROR_INVALID_VALUE,
        Ok(()) => CUDA_SUCCESS,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, p_str: *mut *const c_char) -> CUresult {
    error_text(error, p_str, false)
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, p_str: *mut *const c_char) -> CUresult {
    error_text(error, p_str, true)
}

/// This library's own handle, for `cuGetProcAddress_v2`.
fn own_handle() -> Option<usize> {
    static H: OnceLock<Option<usize>> = OnceLock::new();
    *H.get_or_init(|| {
        // SAFETY: Dl_info is plain data (pointers and integers): all-zero is a valid value.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: dladdr on one of this library's functions; the name it gives is the file this
        // library was loaded from, reopened with RTLD_NOLOAD (no new load).
        unsafe {
            if libc::dladdr(cuInit as *const c_void, &mut info) == 0 || info.dli_fname.is_null() {
                return None;
            }
            let h = libc::dlopen(info.dli_fname, libc::RTLD_NOW | libc::RTLD_NOLOAD);
            (!h.is_null()).then_some(h as usize)
        }
    })
}

/// The export that serves `symbol`: the per-thread-stream variant of the newest ABI version
/// when asked for (`cuMemcpyHtoD_v2_ptds`), then the newest ABI version this library exports
/// (`_v3`, `_v2`), then the plain name. CUDA picks
/// the version by the caller's `cudaVersion`; this library exports one version of each
/// function, the one CUDA 12 headers name.
fn lookup(symbol: &str, flags: cuuint64_t) -> Option<*mut c_void> {
    let h = own_handle()? as *mut c_void;
    let mut names = Vec::new();
    let versions = ["_v3", "_v2", ""];
    if flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0 {
        for v in versions {
            names.push(format!("{symbol}{v}_ptsz"));
            names.push(format!("{symbol}{v}_ptds"));
        }
    }
    names.extend(versions.iter().map(|v| format!("{symbol}{v}")));
    names.into_iter().find_map(|n| {
        let c = std::ffi::CString::new(n).ok()?;
        // SAFETY: a live handle and a NUL-terminated name.
        let p = unsafe { libc::dlsym(h, c.as_ptr()) };
        (!p.is_null()).then_some(p)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
    status: *mut CUdriverProcAddressQueryResult,
) -> CUresult {
    if symbol.is_null() || pfn.is_null() || cuda_version < 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: NUL-terminated name from the caller.
    let name = unsafe { CStr::from_ptr(symbol) }.to_string_lossy();
    let found = if name.starts_with("cu") {
        lookup(&name, flags)
    } else {
        None
    };
    let (p, st) = match found {
        Some(p) => (p, CU_GET_PROC_ADDRESS_SUCCESS),
        None => (std::ptr::null_mut(), CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND),
    };
    // SAFETY: checked non-null out-pointer; `status` is optional.
    unsafe {
        pfn.write(p);
        if !status.is_null() {
            status.write(st);
        }
    }
    if found.is_some() {
        CUDA_SUCCESS
    } else {
        CUDA_ERROR_NOT_FOUND
    }
}

/// The CUDA 11 ABI of the lookup (no status), which the driver still exports.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
) -> CUresult {
    // SAFETY: the caller's arguments; the status is optional.
    unsafe { cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, std::ptr::null_mut()) }
}

#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(
    _data: *mut c_void,
    _attribute: CUpointer_attribute,
    _ptr: CUdeviceptr,
) -> CUresult {
    // Pointer attributes go through the runtime (`cudaPointerGetAttributes`) in the simulator.
    CUDA_ERROR_NOT_SUPPORTED
}

// ---- Device code: no image can run on the simulated device --------------------------------

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoad(_module: *mut CUmodule, _fname: *const c_char) -> CUresult {
    CUDA_ERROR_NO_BINARY_FOR_GPU
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(
    _module: *mut CUmodule,
    _image: *const c_void,
) -> CUresult {
    CUDA_ERROR_NO_BINARY_FOR_GPU
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    _module: *mut CUmodule,
    _image: *const c_void,
    _num_options: c_uint,
    _options: *mut CUjit_option,
    _option_values: *mut *mut c_void,
) -> CUresult {
    CUDA_ERROR_NO_BINARY_FOR_GPU
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleUnload(_hmod: CUmodule) -> CUresult {
    CUDA_ERROR_INVALID_HANDLE
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    _hfunc: *mut CUfunction,
    _hmod: CUmodule,
    _name: *const c_char,
) -> CUresult {
    CUDA_ERROR_INVALID_HANDLE
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetAttribute(
    _pi: *mut c_int,
    _attrib: CUfunction_attribute,
    _hfunc: CUfunction,
) -> CUresult {
    CUDA_ERROR_INVALID_HANDLE
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncSetAttribute(
    _hfunc: CUfunction,
    _attrib: CUfunction_attribute,
    _value: c_int,
) -> CUresult {
    CUDA_ERROR_INVALID_HANDLE
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncSetCacheConfig(
    _hfunc: CUfunction,
    _config: CUfunc_cache,
) -> CUresult {
    CUDA_ERROR_INVALID_HANDLE
}

#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    _num_blocks: *mut c_int,
    _func: CUfunction,
    _block_size: c_int,
    _dynamic_smem: usize,
) -> CUresult {
    CUDA_ERROR_INVALID_HANDLE
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel(
    _f: CUfunction,
    _grid_x: c_uint,
    _grid_y: c_uint,
    _grid_z: c_uint,
    _block_x: c_uint,
    _block_y: c_uint,
    _block_z: c_uint,
    _shared: c_uint,
    _stream: CUstream,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CUresult {
    CUDA_ERROR_INVALID_HANDLE
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchCooperativeKernel(
    _f: CUfunction,
    _grid_x: c_uint,
    _grid_y: c_uint,
    _grid_z: c_uint,
    _block_x: c_uint,
    _block_y: c_uint,
    _block_z: c_uint,
    _shared: c_uint,
    _stream: CUstream,
    _params: *mut *mut c_void,
) -> CUresult {
    CUDA_ERROR_INVALID_HANDLE
}

#[no_mangle]
pub unsafe extern "C" fn cuLinkCreate_v2(
    _num_options: c_uint,
    _options: *mut CUjit_option,
    _option_values: *mut *mut c_void,
    _state: *mut CUlinkState,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

#[no_mangle]
pub unsafe extern "C" fn cuLinkAddData_v2(
    _state: CUlinkState,
    _type: CUjitInputType,
    _data: *mut c_void,
    _size: usize,
    _name: *const c_char,
    _num_options: c_uint,
    _options: *mut CUjit_option,
    _option_values: *mut *mut c_void,
) -> CUresult {
    CUDA_ERROR_INVALID_HANDLE
}

#[no_mangle]
pub unsafe extern "C" fn cuLinkComplete(
    _state: CUlinkState,
    _cubin: *mut *mut c_void,
    _size: *mut usize,
) -> CUresult {
    CUDA_ERROR_INVALID_HANDLE
}

#[no_mangle]
pub unsafe extern "C" fn cuLinkDestroy(_state: CUlinkState) -> CUresult {
    CUDA_ERROR_INVALID_HANDLE
}

#[no_mangle]
pub unsafe extern "C" fn cuTensorMapEncodeTiled(
    _tensor_map: *mut CUtensorMap_st,
    _data_type: CUtensorMapDataType,
    _rank: cuuint32_t,
    _global_address: *mut c_void,
    _global_dim: *const cuuint64_t,
    _global_strides: *const cuuint64_t,
    _box_dim: *const cuuint32_t,
    _element_strides: *const cuuint32_t,
    _interleave: CUtensorMapInterleave,
    _swizzle: CUtensorMapSwizzle,
    _l2_promotion: CUtensorMapL2promotion,
    _oob_fill: CUtensorMapFloatOOBfill,
) -> CUresult {
    // TMA descriptors feed kernels, which cannot run here.
    CUDA_ERROR_NOT_SUPPORTED
}
