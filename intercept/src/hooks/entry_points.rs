//! Driver functions handed out by address: `cuGetProcAddress` (the driver) and
//! `cudaGetDriverEntryPoint[ByVersion]` (the runtime) return a pointer to the driver function
//! of a name, which the program then calls without passing through the global scope, where the
//! hooks live. NVIDIA's Python bindings (`cuda.bindings`) reach every driver function this way,
//! and PyTorch reaches some. Each hook calls the real lookup once, with the program's
//! arguments, and returns what it returned; when the pointer found is the function a driver
//! hook calls, the program gets the hook instead ([`crate::lookups`]), so a copy made through
//! it is captured like a linked one; a function the hooks serve under another version or
//! per-thread-stream spelling is a gap naming it. Lookups made by a CUDA library itself (the
//! caller's file name, as for `dlsym`) are left as found: the runtime resolves the driver's
//! functions through `cuGetProcAddress`, whether it takes that from its own handle (then it
//! does not come here) or from the global scope, and its copies are the runtime calls the
//! program made, captured as such.

use core::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr};
use std::ffi::CString;

use cuda_abi::cudart::{cudaDriverEntryPointQueryResult, cudaError_t};
use cuda_abi::driver::*;

use super::driver::{MISSING, SUCCESS};
use crate::real::{self, Lib};

/// `cudaEnableLegacyStream` and `cudaEnablePerThreadDefaultStream` (`cudaGetDriverEntryPoint`'s
/// flags; `cudaEnableDefault` is 0).
const CUDA_ENABLE_LEGACY_STREAM: c_ulonglong = 1;
const CUDA_ENABLE_PER_THREAD_DEFAULT_STREAM: c_ulonglong = 2;
/// `cudaSuccess`.
const CUDA_SUCCESS_RT: cudaError_t = 0;

/// The exported names that may be the function the driver hands out for `symbol` (a base
/// name, such as `cuMemcpyHtoD`): the per-thread-stream spellings of each ABI version when
/// they were asked for (`cuMemcpyHtoD_v2_ptds`), then the ABI versions newest first, then the
/// name itself.
fn spellings(symbol: &str, per_thread: bool) -> Vec<CString> {
    const VERSIONS: [&str; 3] = ["_v3", "_v2", ""];
    let mut names = Vec::with_capacity(9);
    if per_thread {
        for v in VERSIONS {
            names.push(format!("{symbol}{v}_ptsz"));
            names.push(format!("{symbol}{v}_ptds"));
        }
    }
    names.extend(VERSIONS.iter().map(|v| format!("{symbol}{v}")));
    names
        .into_iter()
        .filter_map(|n| CString::new(n).ok())
        .collect()
}

/// After a successful lookup of `symbol` that wrote `*pfn`: the hook in its place where one
/// calls that very function (found by the exported name at that address, else by the
/// spellings of `symbol`).
///
/// # Safety
/// `symbol` is null or NUL-terminated; `pfn` is null or the caller's out-pointer the lookup
/// just wrote.
unsafe fn hand_out(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    per_thread: bool,
    via: &'static str,
) {
    if symbol.is_null() || pfn.is_null() {
        return;
    }
    crate::catch(|| {
        // SAFETY: NUL-terminated per the contract (the real lookup read it too).
        let name = unsafe { CStr::from_ptr(symbol) }.to_str().ok()?;
        // SAFETY: the out-pointer the real lookup wrote, per the contract.
        let found = unsafe { pfn.read() };
        if found.is_null() || !name.starts_with("cu") {
            return None;
        }
        // A CUDA library's own lookup is not the program's (as for `dlsym`): NVIDIA's runtime
        // finds the driver's functions so, and its copies are captured as runtime calls.
        if real::caller_outside().is_some_and(real::is_cuda_object) {
            return None;
        }
        // The exported symbol the driver handed out, when the pointer is one (NVIDIA's
        // driver hands out its exports), then the spellings the base name may stand for.
        let mut names: Vec<CString> = real::symbol_at(found as usize).into_iter().collect();
        names.extend(spellings(name, per_thread));
        let names: Vec<&CStr> = names.iter().map(CString::as_c_str).collect();
        let hook = crate::lookups::hook_for(&names, Lib::Driver, found, via)?;
        // SAFETY: the same out-pointer; the hook has the C signature of the function found.
        unsafe { pfn.write(hook) };
        Some(())
    });
}

/// `CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t
/// flags, CUdriverProcAddressQueryResult* symbolStatus)`: what CUDA 12+ headers call
/// `cuGetProcAddress`.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cudaVersion: c_int,
    flags: cuuint64_t,
    symbolStatus: *mut CUdriverProcAddressQueryResult,
) -> CUresult {
    let Some(real) = real::real_of!(
        cuGetProcAddress_v2,
        fn(
            *const c_char,
            *mut *mut c_void,
            c_int,
            cuuint64_t,
            *mut CUdriverProcAddressQueryResult,
        ) -> CUresult,
        Driver
    ) else {
        return MISSING;
    };
    // SAFETY: the program's arguments, forwarded unchanged.
    let rc = unsafe { real(symbol, pfn, cudaVersion, flags, symbolStatus) };
    if rc == SUCCESS {
        let per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
        // SAFETY: the lookup succeeded: it wrote `*pfn`.
        unsafe { hand_out(symbol, pfn, per_thread, "cuGetProcAddress") };
    }
    rc
}

/// `CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t
/// flags)`: the CUDA 11 ABI, which the driver still exports.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cudaVersion: c_int,
    flags: cuuint64_t,
) -> CUresult {
    let Some(real) = real::real_of!(
        cuGetProcAddress,
        fn(*const c_char, *mut *mut c_void, c_int, cuuint64_t) -> CUresult,
        Driver
    ) else {
        return MISSING;
    };
    // SAFETY: the program's arguments, forwarded unchanged.
    let rc = unsafe { real(symbol, pfn, cudaVersion, flags) };
    if rc == SUCCESS {
        let per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
        // SAFETY: the lookup succeeded: it wrote `*pfn`.
        unsafe { hand_out(symbol, pfn, per_thread, "cuGetProcAddress") };
    }
    rc
}

/// Whether a runtime lookup with `flags` asks for the per-thread default stream's spellings
/// (`ptsz`: the program was built with per-thread default streams, whose `cudaEnableDefault`
/// means that).
fn runtime_per_thread(flags: c_ulonglong, ptsz: bool) -> bool {
    flags & CUDA_ENABLE_PER_THREAD_DEFAULT_STREAM != 0
        || (ptsz && flags & CUDA_ENABLE_LEGACY_STREAM == 0)
}

/// One runtime lookup hook: `name(C signature) => (symbol, out-pointer, flags, per-thread
/// spelling)`, the first three naming its parameters.
macro_rules! entry_point_hook {
    ($(#[$m:meta])* $name:ident ( $($a:ident : $t:ty),* $(,)? )
        => ($symbol:ident, $out:ident, $flags:ident, $ptsz:expr)) => {
        $(#[$m])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> cudaError_t {
            let Some(real) = real::real_of!($name, fn($($t),*) -> cudaError_t, Cudart) else {
                return crate::cuda::MISSING;
            };
            // SAFETY: the program's arguments, forwarded unchanged.
            let rc = unsafe { real($($a),*) };
            if rc == CUDA_SUCCESS_RT {
                let per_thread = runtime_per_thread($flags, $ptsz);
                // SAFETY: the lookup succeeded: it wrote `*funcPtr` (null when not found).
                unsafe { hand_out($symbol, $out, per_thread, "cudaGetDriverEntryPoint") };
            }
            rc
        }
    };
}

entry_point_hook! {
    /// `cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** funcPtr, unsigned long
    /// long flags, cudaDriverEntryPointQueryResult* driverStatus)`.
    cudaGetDriverEntryPoint(
        symbol: *const c_char,
        funcPtr: *mut *mut c_void,
        flags: c_ulonglong,
        driverStatus: *mut cudaDriverEntryPointQueryResult,
    ) => (symbol, funcPtr, flags, false)
}

entry_point_hook! {
    /// `cudaGetDriverEntryPoint` of a program built with per-thread default streams.
    cudaGetDriverEntryPoint_ptsz(
        symbol: *const c_char,
        funcPtr: *mut *mut c_void,
        flags: c_ulonglong,
        driverStatus: *mut cudaDriverEntryPointQueryResult,
    ) => (symbol, funcPtr, flags, true)
}

entry_point_hook! {
    /// `cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** funcPtr,
    /// unsigned int cudaVersion, unsigned long long flags, cudaDriverEntryPointQueryResult*
    /// driverStatus)`.
    cudaGetDriverEntryPointByVersion(
        symbol: *const c_char,
        funcPtr: *mut *mut c_void,
        cudaVersion: c_uint,
        flags: c_ulonglong,
        driverStatus: *mut cudaDriverEntryPointQueryResult,
    ) => (symbol, funcPtr, flags, false)
}

entry_point_hook! {
    /// `cudaGetDriverEntryPointByVersion` of a program built with per-thread default streams.
    cudaGetDriverEntryPointByVersion_ptsz(
        symbol: *const c_char,
        funcPtr: *mut *mut c_void,
        cudaVersion: c_uint,
        flags: c_ulonglong,
        driverStatus: *mut cudaDriverEntryPointQueryResult,
    ) => (symbol, funcPtr, flags, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_name_is_tried_as_each_export_that_may_serve_it() {
        let names = |s, pt| -> Vec<String> {
            spellings(s, pt)
                .into_iter()
                .map(|c| c.into_string().unwrap())
                .collect()
        };
        assert_eq!(
            names("cuMemcpyHtoD", false),
            ["cuMemcpyHtoD_v3", "cuMemcpyHtoD_v2", "cuMemcpyHtoD"]
        );
        assert_eq!(
            names("cuMemcpyAsync", true),
            [
                "cuMemcpyAsync_v3_ptsz",
                "cuMemcpyAsync_v3_ptds",
                "cuMemcpyAsync_v2_ptsz",
                "cuMemcpyAsync_v2_ptds",
                "cuMemcpyAsync_ptsz",
                "cuMemcpyAsync_ptds",
                "cuMemcpyAsync_v3",
                "cuMemcpyAsync_v2",
                "cuMemcpyAsync"
            ]
        );
    }

    #[test]
    fn the_runtime_asks_for_per_thread_spellings_as_its_flags_and_build_say() {
        assert!(!runtime_per_thread(0, false));
        assert!(runtime_per_thread(
            CUDA_ENABLE_PER_THREAD_DEFAULT_STREAM,
            false
        ));
        assert!(runtime_per_thread(0, true));
        assert!(!runtime_per_thread(CUDA_ENABLE_LEGACY_STREAM, true));
    }
}
