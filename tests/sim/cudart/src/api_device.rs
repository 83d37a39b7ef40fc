//! Device management, versions and errors.

use core::ffi::{c_char, c_int};

use cuda_abi::cudart::*;

use crate::{errors, guard, out, rt};

/// Memory each simulated device reports.
const DEVICE_MEMORY: usize = 16 << 30;
/// What the simulated device says it is (Hopper-class, so FP8 paths are enabled).
const DEVICE_NAME: &[u8] = b"NVIDIA H100 (ttrace simulated)";
const SM_COUNT: c_int = 132;

#[no_mangle]
pub unsafe extern "C" fn cudaGetDeviceCount(count: *mut c_int) -> cudaError_t {
    // SAFETY: out-pointer from the caller.
    guard(|| unsafe { out(count, rt()?.device_count()) })
}

#[no_mangle]
pub unsafe extern "C" fn cudaSetDevice(device: c_int) -> cudaError_t {
    guard(|| rt()?.set_current_device(device))
}

#[no_mangle]
pub unsafe extern "C" fn cudaGetDevice(device: *mut c_int) -> cudaError_t {
    // SAFETY: out-pointer from the caller.
    guard(|| unsafe { out(device, rt()?.current_device()) })
}

fn properties(device: c_int) -> Result<cudaDeviceProp, cudaError_t> {
    let r = rt()?;
    if device < 0 || device >= r.device_count() {
        return Err(cudaErrorInvalidDevice);
    }
    let mut p = cudaDeviceProp::default();
    for (dst, &src) in p.name.iter_mut().zip(DEVICE_NAME) {
        *dst = src as c_char;
    }
    p.uuid.bytes[0] = device as c_char;
    p.totalGlobalMem = DEVICE_MEMORY;
    p.sharedMemPerBlock = 48 << 10;
    p.regsPerBlock = 65536;
    p.warpSize = 32;
    p.memPitch = usize::MAX / 2;
    p.maxThreadsPerBlock = 1024;
    p.maxThreadsDim = [1024, 1024, 64];
    p.maxGridSize = [i32::MAX, 65535, 65535];
    #[cfg(not(sim_cuda13))]
    {
        p.clockRate = 1_980_000;
    }
    p.totalConstMem = 64 << 10;
    p.major = 9;
    p.minor = 0;
    p.textureAlignment = 512;
    p.texturePitchAlignment = 32;
    #[cfg(not(sim_cuda13))]
    {
        p.deviceOverlap = 1;
    }
    p.multiProcessorCount = SM_COUNT;
    p.canMapHostMemory = 1;
    p.concurrentKernels = 1;
    p.pciBusID = device + 1;
    p.asyncEngineCount = 2;
    p.unifiedAddressing = 1;
    #[cfg(not(sim_cuda13))]
    {
        p.memoryClockRate = 2_619_000;
    }
    p.memoryBusWidth = 5120;
    p.l2CacheSize = 50 << 20;
    p.maxThreadsPerMultiProcessor = 2048;
    p.streamPrioritiesSupported = 1;
    p.sharedMemPerMultiprocessor = 228 << 10;
    p.regsPerMultiprocessor = 65536;
    p.hostRegisterSupported = 1;
    p.memoryPoolsSupported = 1;
    p.maxBlocksPerMultiProcessor = 32;
    Ok(p)
}

/// CUDA 12's name for the current struct (CUDA 13 dropped the `_v2` export).
#[cfg(not(sim_cuda13))]
#[no_mangle]
pub unsafe extern "C" fn cudaGetDeviceProperties_v2(
    prop: *mut cudaDeviceProp,
    device: c_int,
) -> cudaError_t {
    // SAFETY: out-pointer from the caller.
    guard(|| unsafe { out(prop, properties(device)?) })
}

/// Pre-12.0 binaries import the unversioned name (same struct layout in CUDA 12); in CUDA 13
/// it is the only name, with CUDA 13's struct.
#[no_mangle]
pub unsafe extern "C" fn cudaGetDeviceProperties(
    prop: *mut cudaDeviceProp,
    device: c_int,
) -> cudaError_t {
    // SAFETY: out-pointer from the caller.
    guard(|| unsafe { out(prop, properties(device)?) })
}

#[no_mangle]
pub unsafe extern "C" fn cudaDeviceGetAttribute(
    value: *mut c_int,
    attr: cudaDeviceAttr,
    device: c_int,
) -> cudaError_t {
    guard(|| {
        let p = properties(device)?;
        let v = match attr {
            1 => p.maxThreadsPerBlock,
            10 => p.warpSize,
            16 => p.multiProcessorCount,
            31 => p.concurrentKernels,
            33 => p.pciBusID,
            38 => p.l2CacheSize,
            41 => p.unifiedAddressing,
            75 => p.major,
            76 => p.minor,
            115 => p.memoryPoolsSupported,
            // Attributes the simulator does not model read as 0 (unsupported feature).
            a if a < 200 => 0,
            _ => return Err(cudaErrorInvalidValue),
        };
        // SAFETY: out-pointer from the caller.
        unsafe { out(value, v) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaDeviceCanAccessPeer(
    can: *mut c_int,
    device: c_int,
    peer: c_int,
) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        let n = r.device_count();
        if !(0..n).contains(&device) || !(0..n).contains(&peer) {
            return Err(cudaErrorInvalidDevice);
        }
        // SAFETY: out-pointer from the caller.
        unsafe { out(can, (device != peer) as c_int) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaDeviceSynchronize() -> cudaError_t {
    guard(|| {
        let r = rt()?;
        r.check_capture_safe()?;
        r.synchronize_device(r.current_device());
        errors::sticky()
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemGetInfo(free: *mut usize, total: *mut usize) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        let used = r.heap.used(r.current_device());
        // SAFETY: out-pointers from the caller.
        unsafe {
            out(free, DEVICE_MEMORY.saturating_sub(used))?;
            out(total, DEVICE_MEMORY)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaDriverGetVersion(version: *mut c_int) -> cudaError_t {
    // SAFETY: out-pointer from the caller. Answers without initialising, as the real one does.
    guard(|| unsafe { out(version, CUDART_VERSION) })
}

#[no_mangle]
pub unsafe extern "C" fn cudaRuntimeGetVersion(version: *mut c_int) -> cudaError_t {
    // SAFETY: out-pointer from the caller.
    guard(|| unsafe { out(version, CUDART_VERSION) })
}

#[no_mangle]
pub unsafe extern "C" fn cudaGetLastError() -> cudaError_t {
    errors::take_last()
}

#[no_mangle]
pub unsafe extern "C" fn cudaPeekAtLastError() -> cudaError_t {
    errors::peek_last()
}

#[no_mangle]
pub unsafe extern "C" fn cudaGetErrorString(error: cudaError_t) -> *const c_char {
    errors::string(error)
}

#[no_mangle]
pub unsafe extern "C" fn cudaGetErrorName(error: cudaError_t) -> *const c_char {
    errors::name(error)
}
