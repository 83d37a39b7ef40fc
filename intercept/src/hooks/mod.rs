//! The exported C functions. Each has NVIDIA's exact signature (enums as raw integers), starts
//! with [`mode::off`](crate::mode::off) and, when it does not capture, is a tail call to the
//! real function. Capturing bodies go through [`around`](crate::around): planning and snapshot
//! code runs under `catch_unwind`, the real function runs exactly once, its return value is
//! returned untouched.
//!
//! Each hook's C signature is written once, as a line of its family's hook macro
//! (`copy_hook!`, `batch_copy_hook!`, `memset_hook!`, `launch_hook!`, `graph_hook!`, the
//! driver's `cu_copy_hook!`, `cu_memset_hook!` and `cu_gap!`, `gemm_hook!`/`blas_gap!` through
//! `cublas_sigs!`, cuBLAS-XT's `xt_gap!`, the legacy cuBLAS API's `legacy_gap!`, `lt_hook!`, `coll_hook!`, `comm_hook!`, `nvtx_hook!`, `entry_point_hook!`): the macro
//! makes the export and looks the real function up under the hook's name with that signature
//! ([`real_of!`](crate::real)); `crate::real`'s table lists only the functions the tracer calls
//! itself. The ABI test (tests/integration/tests/it/intercept_abi.rs) reads the same lines and
//! compiles each signature against NVIDIA's headers.

pub mod api;
pub mod copy_batch;
pub mod cublas;
pub mod cublas_copies;
pub mod cublas_legacy;
pub mod cublas_routines;
pub mod cublaslt;
pub mod cublasxt_routines;
pub mod cudart;
pub mod driver;
pub mod driver_gaps;
pub mod entry_points;
pub mod graph;
pub mod memset;
pub mod nccl;
pub mod nvtx;

use std::ffi::CStr;

use core::ffi::c_char;

/// A C string the program passed, or `""`.
///
/// # Safety
/// `p` is null or NUL-terminated.
pub(crate) unsafe fn c_string(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: per the contract.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// A wide (`wchar_t`) C string the program passed, or `""`; at most 4096 characters.
///
/// # Safety
/// `p` is null or NUL-terminated.
pub(crate) unsafe fn wide_string(p: *const cuda_abi::nvtx::wchar_t) -> String {
    let mut s = String::new();
    if p.is_null() {
        return s;
    }
    for i in 0..4096 {
        // SAFETY: reads up to the terminating NUL, per the contract.
        let c = unsafe { *p.add(i) };
        if c == 0 {
            break;
        }
        s.push(char::from_u32(c as u32).unwrap_or(char::REPLACEMENT_CHARACTER));
    }
    s
}
