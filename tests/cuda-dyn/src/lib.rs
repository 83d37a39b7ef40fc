//! CUDA runtime, cuBLAS, cuBLASLt, NCCL and NVTX entry points, resolved at run time.
//!
//! Test programs and the fixture trainer call the CUDA stack through this crate, the way
//! PyTorch's pip wheels do: the libraries are loaded by soname with `RTLD_GLOBAL` and every
//! entry point is looked up in the global scope (`dlsym(RTLD_DEFAULT, ...)`), so that an
//! `LD_PRELOAD` library interposes each call exactly as it would in a real framework. The same
//! program runs on NVIDIA's libraries or on the simulated ones in `target/<profile>/sim`.
//!
//! Each module declares its functions with [`dyn_api!`]; a function is resolved on its first
//! call. A missing library or symbol is a broken installation: the program stops with a message
//! naming it.

use core::ffi::{c_char, c_void};
use std::path::PathBuf;
use std::sync::OnceLock;

pub mod cublas;
pub mod cublaslt;
pub mod cudart;
pub mod driver;
pub mod nccl;
pub mod nvtx;

pub use cuda_abi as abi;

/// Sonames of the libraries, in load order.
pub const LIBRARIES: [&str; 5] = [
    "libcudart.so.12",
    "libcublasLt.so.12",
    "libcublas.so.12",
    "libnccl.so.2",
    "libnvToolsExt.so.1",
];

/// Libraries loaded only when a program first calls into them (by the same search as
/// [`LIBRARIES`]): the driver, which the runtime opens itself and most programs never call.
pub const LAZY_LIBRARIES: [&str; 1] = ["libcuda.so.1"];

/// Where to look when the dynamic linker's search path has no CUDA libraries: `$CUDA_DYN_LIB_DIR`,
/// then `sim/` next to the executable and one directory up (where cargo leaves test binaries).
fn fallback_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("CUDA_DYN_LIB_DIR") {
        dirs.push(PathBuf::from(d));
    }
    if let Ok(exe) = std::env::current_exe() {
        for anc in exe.ancestors().skip(1).take(2) {
            dirs.push(anc.join("sim"));
        }
    }
    dirs
}

/// Loads every library once (by soname, else from the fallback directories). Returns the
/// libraries that could not be loaded.
pub fn load_libraries() -> &'static [String] {
    static MISSING: OnceLock<Vec<String>> = OnceLock::new();
    MISSING.get_or_init(|| load_all(&LIBRARIES))
}

/// Loads [`LAZY_LIBRARIES`] once; returns those that could not be loaded.
fn load_lazy_libraries() -> &'static [String] {
    static MISSING: OnceLock<Vec<String>> = OnceLock::new();
    MISSING.get_or_init(|| load_all(&LAZY_LIBRARIES))
}

fn load_all(libs: &[&str]) -> Vec<String> {
    let mut missing = Vec::new();
    for lib in libs {
        let mut loaded = dlopen_global(lib);
        for d in fallback_dirs() {
            if loaded {
                break;
            }
            loaded = dlopen_global(&d.join(lib).to_string_lossy());
        }
        if !loaded {
            missing.push(lib.to_string());
        }
    }
    missing
}

fn dlopen_global(path: &str) -> bool {
    let Ok(c) = std::ffi::CString::new(path) else {
        return false;
    };
    // SAFETY: a NUL-terminated path; the handle is kept for the life of the process.
    !unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) }.is_null()
}

/// Resolves `name` (NUL-terminated) in the global scope, where `LD_PRELOAD` comes first
/// (loading [`LAZY_LIBRARIES`] when the eager ones do not define it).
#[doc(hidden)]
pub fn resolve(name: &'static str) -> *mut c_void {
    load_libraries();
    let lookup = || {
        // SAFETY: `name` is NUL-terminated by the macro.
        unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr().cast::<c_char>()) }
    };
    let mut p = lookup();
    if p.is_null() {
        load_lazy_libraries();
        p = lookup();
    }
    if p.is_null() {
        let shown = name.trim_end_matches('\0');
        eprintln!(
            "cuda-dyn: `{shown}` not found; missing libraries: {:?} {:?} (set CUDA_DYN_LIB_DIR or LD_LIBRARY_PATH)",
            load_libraries(),
            load_lazy_libraries()
        );
        std::process::exit(127);
    }
    p
}

/// Declares C entry points resolved on first call:
/// `dyn_api! { fn cudaMalloc(ptr: *mut *mut c_void, size: usize) -> cudaError_t; }`.
#[macro_export]
macro_rules! dyn_api {
    ($( $(#[$m:meta])* fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty ; )*) => {
        $(
            $(#[$m])*
            #[allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]
            pub unsafe fn $name($($arg: $ty),*) -> $ret {
                type F = unsafe extern "C" fn($($ty),*) -> $ret;
                static SLOT: ::std::sync::OnceLock<usize> = ::std::sync::OnceLock::new();
                let addr = *SLOT.get_or_init(|| $crate::resolve(concat!(stringify!($name), "\0")) as usize);
                // SAFETY: the symbol has the C signature declared here (checked by the ABI test).
                let f: F = unsafe { ::std::mem::transmute::<usize, F>(addr) };
                // SAFETY: the caller upholds the C function's contract, as for a direct call.
                unsafe { f($($arg),*) }
            }
        )*
    };
}
