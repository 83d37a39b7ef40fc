//! The real CUDA, cuBLAS, cuBLASLt, NCCL and NVTX functions behind the hooks.
//!
//! libttrace.so has no `DT_NEEDED` on any CUDA library (so that it loads into any program,
//! CUDA or not): each function is looked up on its first use with `dlsym(RTLD_NEXT, name)` (the next
//! definition after this library in the global scope), else in a loaded object whose file name
//! is the library's (`libcudart.so*`, any major: found with `dl_iterate_phdr`, reopened with
//! `dlopen(path, RTLD_NOLOAD | RTLD_LAZY)`, which never maps a second copy of a library loaded with `RTLD_LOCAL`). No soname is
//! hard-coded, so one libttrace.so serves CUDA 12 and CUDA 13 programs; the first runtime
//! function resolved logs (at info level) which runtime it attached to. A missing symbol is `None`: the hook returns an error code, never panics.
//!
//! The resolved address is cached in one atomic word per function, so a hook's pass-through
//! path costs that load and the indirect call.

use core::ffi::{c_int, c_uint, c_ulonglong, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use cuda_abi::cublas::*;
use cuda_abi::cublaslt::*;
use cuda_abi::cudart::*;
use cuda_abi::driver::{CUgraph, CUresult};
use cuda_abi::nccl::*;

/// The library a function belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lib {
    Cudart,
    Cublas,
    CublasLt,
    Nccl,
    Nvtx,
    /// The driver, `libcuda.so`.
    Driver,
}

impl Lib {
    /// The file-name stem every version of the library shares: `libcudart.so` matches
    /// `libcudart.so.12`, `libcudart.so.13`, `libcudart.so.13.0.48`, ... No soname (and so no
    /// CUDA major) is written down here: the library found loaded is the one used.
    /// The library whose entry point `name` is, by NVIDIA's prefixes.
    pub fn of(name: &str) -> Option<Lib> {
        Some(if name.starts_with("cublasLt") {
            Lib::CublasLt
        } else if name.starts_with("cublas") {
            Lib::Cublas
        } else if name.starts_with("cuda") {
            Lib::Cudart
        } else if name.starts_with("nccl") || name.starts_with("pnccl") {
            Lib::Nccl
        } else if name.starts_with("nvtx") {
            Lib::Nvtx
        } else if name.starts_with("cu") {
            Lib::Driver
        } else {
            return None;
        })
    }

    fn stem(self) -> &'static str {
        match self {
            Lib::Cudart => "libcudart.so",
            Lib::Cublas => "libcublas.so",
            Lib::CublasLt => "libcublasLt.so",
            Lib::Nccl => "libnccl.so",
            Lib::Nvtx => "libnvToolsExt.so",
            Lib::Driver => "libcuda.so",
        }
    }
}

/// Paths of the loaded objects whose file name is `stem` or `stem.<version>`, in load order.
fn loaded_objects(stem: &str) -> Vec<std::ffi::CString> {
    struct Search<'a> {
        stem: &'a str,
        found: Vec<std::ffi::CString>,
    }
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: dl_iterate_phdr passes a valid info and our `data` back.
        let (info, search) = unsafe { (&*info, &mut *data.cast::<Search<'_>>()) };
        if info.dlpi_name.is_null() {
            return 0;
        }
        // SAFETY: the loader's NUL-terminated path of a loaded object.
        let path = unsafe { core::ffi::CStr::from_ptr(info.dlpi_name) };
        let bytes = path.to_bytes();
        let base = bytes.rsplit(|&b| b == b'/').next().unwrap_or(bytes);
        let stem = search.stem.as_bytes();
        if base == stem || (base.starts_with(stem) && base.get(stem.len()) == Some(&b'.')) {
            search.found.push(path.to_owned());
        }
        0
    }
    let mut search = Search {
        stem,
        found: Vec::new(),
    };
    // SAFETY: `visit` matches dl_iterate_phdr's callback type and only reads what it is given.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut search as *mut Search<'_>).cast()) };
    search.found
}

/// The load address of libttrace.so itself: a lookup that lands here found a hook, not the
/// real function.
fn own_base() -> usize {
    static BASE: AtomicUsize = AtomicUsize::new(0);
    let b = BASE.load(Ordering::Relaxed);
    if b != 0 {
        return b;
    }
    let b = object_base(own_base as *const c_void);
    BASE.store(b, Ordering::Relaxed);
    b
}

/// The load address of the object containing `addr` (0 when none).
fn object_base(addr: *const c_void) -> usize {
    let mut info = core::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr only reads `addr` as a number and fills `info`.
    let ok = unsafe { libc::dladdr(addr, info.as_mut_ptr()) };
    if ok == 0 {
        return 0;
    }
    // SAFETY: dladdr succeeded and filled the struct.
    unsafe { info.assume_init() }.dli_fbase as usize
}

/// The path of the object containing `addr`.
pub fn object_path(addr: usize) -> Option<String> {
    let mut info = core::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr only reads `addr` as a number and fills `info`.
    if unsafe { libc::dladdr(addr as *const c_void, info.as_mut_ptr()) } == 0 {
        return None;
    }
    // SAFETY: dladdr succeeded and filled the struct.
    let f = unsafe { info.assume_init() }.dli_fname;
    if f.is_null() {
        return None;
    }
    // SAFETY: the loader's NUL-terminated path of a loaded object.
    let path = unsafe { core::ffi::CStr::from_ptr(f) };
    Some(path.to_string_lossy().into_owned())
}

/// The return address of the innermost frame on this thread's stack that lies outside
/// libttrace.so: who called the hook running now (`None`: not known, or not on glibc). For
/// hooks that are not on a hot path only (it unwinds the stack).
pub fn caller_outside() -> Option<usize> {
    #[cfg(target_env = "gnu")]
    {
        let mut frames = [core::ptr::null_mut::<c_void>(); 8];
        // SAFETY: glibc fills at most `frames.len()` entries of the buffer and says how many.
        let n = unsafe { libc::backtrace(frames.as_mut_ptr(), frames.len() as c_int) };
        let me = own_base();
        frames
            .iter()
            .take(n.max(0) as usize)
            .map(|&p| p as usize)
            .find(|&a| object_base(a as *const c_void) != me)
    }
    #[cfg(not(target_env = "gnu"))]
    None
}

/// The name of the exported symbol that starts exactly at `addr`, if one does (`dladdr`): what
/// a function pointer handed out by address is called in its library.
pub fn symbol_at(addr: usize) -> Option<std::ffi::CString> {
    let mut info = core::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr only reads `addr` as a number and fills `info`.
    if unsafe { libc::dladdr(addr as *const c_void, info.as_mut_ptr()) } == 0 {
        return None;
    }
    // SAFETY: dladdr succeeded and filled the struct.
    let info = unsafe { info.assume_init() };
    if info.dli_sname.is_null() || info.dli_saddr as usize != addr {
        return None;
    }
    // SAFETY: the loader's NUL-terminated name of a symbol of a loaded object.
    Some(unsafe { core::ffi::CStr::from_ptr(info.dli_sname) }.to_owned())
}

/// Whether `p` lies in libttrace.so (one of its exports: a hook).
pub fn is_own(p: *mut c_void) -> bool {
    !p.is_null() && own_base() != 0 && object_base(p) == own_base()
}

/// Whether `addr` lies in libttrace.so or in a CUDA library: one whose file name is a hooked
/// library's (any version) or the driver's.
pub fn is_cuda_object(addr: usize) -> bool {
    if object_base(addr as *const c_void) == own_base() {
        return true;
    }
    let Some(path) = object_path(addr) else {
        return false;
    };
    let file = path.rsplit('/').next().unwrap_or(&path);
    [
        Lib::Cudart,
        Lib::Cublas,
        Lib::CublasLt,
        Lib::Nccl,
        Lib::Nvtx,
        Lib::Driver,
    ]
    .iter()
    .map(|l| l.stem())
    .any(|stem| file == stem || file.strip_prefix(stem).is_some_and(|r| r.starts_with('.')))
}

/// A handle of libttrace.so itself (null when it cannot be had).
pub fn own_handle() -> *mut c_void {
    let Some(path) = object_path(own_base as *const () as usize) else {
        return core::ptr::null_mut();
    };
    let Ok(path) = std::ffi::CString::new(path) else {
        return core::ptr::null_mut();
    };
    // SAFETY: the path of this loaded library; RTLD_NOLOAD only returns the loaded object.
    unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) }
}

/// Looks `name` (NUL-terminated) up and caches it in `slot`; 0 when it is nowhere.
#[cold]
#[inline(never)]
fn resolve(slot: &AtomicUsize, name: &'static str, lib: Lib) -> usize {
    // SAFETY: the hook macros pass NUL-terminated names.
    let p = find_real(
        unsafe { core::ffi::CStr::from_ptr(name.as_ptr().cast()) },
        lib,
    );
    if p != 0 {
        slot.store(p, Ordering::Release);
        if lib == Lib::Cudart {
            announce_runtime(p);
        }
    }
    p
}

/// The function a hook of `name` calls: the next definition after libttrace.so in the global
/// scope, else the first loaded copy of `lib` that defines it (0 when none).
pub fn find_real(name: &core::ffi::CStr, lib: Lib) -> usize {
    let cname = name.as_ptr();
    let me = own_base();
    let usable = |p: *mut c_void| !p.is_null() && (me == 0 || object_base(p) != me);
    // SAFETY: `cname` is NUL-terminated; RTLD_NEXT searches the objects after this one.
    let mut p = unsafe { libc::dlsym(libc::RTLD_NEXT, cname) };
    if !usable(p) {
        p = core::ptr::null_mut();
        for path in loaded_objects(lib.stem()) {
            // SAFETY: the path of a loaded object; RTLD_NOLOAD only returns an already loaded
            // object (its reference count is bumped and never dropped: the library stays).
            let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
            if h.is_null() {
                continue;
            }
            // SAFETY: a live handle and a NUL-terminated name (the C library's dlsym: a lookup
            // of libttrace.so's own is never redirected).
            let q = unsafe { crate::dlsym::real(h, cname) };
            if usable(q) {
                p = q;
                break;
            }
        }
    }
    p as usize
}

/// The real function `name` (NUL-terminated) of `lib` as `F`, cached in `slot`: for hooks
/// whose C signature is written once, in a hook macro ([`real_of!`]).
///
/// # Safety
/// `F` is the `unsafe extern "C" fn` type of the function `name`.
#[inline(always)]
pub unsafe fn lookup<F: Copy>(slot: &AtomicUsize, name: &'static str, lib: Lib) -> Option<F> {
    const { assert!(core::mem::size_of::<F>() == core::mem::size_of::<usize>()) };
    let p = slot.load(Ordering::Acquire);
    let p = if p != 0 { p } else { resolve(slot, name, lib) };
    // SAFETY: a non-null address of `name`, whose type is `F` per the contract.
    (p != 0).then(|| unsafe { core::mem::transmute_copy::<usize, F>(&p) })
}

/// The real function a hook wraps, by the hook's name and C signature (written once, in the
/// hook's macro): `real_of!(name, fn(T1, T2) -> R, Lib)` is `Option<unsafe extern "C"
/// fn(T1, T2) -> R>`, looked up on first use and cached in a slot of its own.
macro_rules! real_of {
    ($name:ident, fn($($t:ty),* $(,)?) $(-> $r:ty)?, $lib:ident $(,)?) => {{
        type Real = unsafe extern "C" fn($($t),*) $(-> $r)?;
        static SLOT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let name = concat!(stringify!($name), "\0");
        // SAFETY: `Real` is the C signature of the function of that name.
        unsafe { $crate::real::lookup::<Real>(&SLOT, name, $crate::real::Lib::$lib) }
    }};
}
pub(crate) use real_of;

/// Logs, once per process, which CUDA runtime the hooks attached to: its file and the version
/// it reports (`cudaRuntimeGetVersion`), which says which major's ABI the program uses.
#[cold]
fn announce_runtime(any_fn: usize) {
    use std::sync::atomic::AtomicBool;
    static DONE: AtomicBool = AtomicBool::new(false);
    // Swapped before the version query, whose own lookup comes back here.
    if DONE.swap(true, Ordering::AcqRel) {
        return;
    }
    let mut info = core::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr only reads the address as a number and fills `info`.
    let path = if unsafe { libc::dladdr(any_fn as *const c_void, info.as_mut_ptr()) } != 0 {
        // SAFETY: dladdr succeeded; dli_fname is the loader's NUL-terminated path (or null).
        let f = unsafe { info.assume_init() }.dli_fname;
        if f.is_null() {
            "?".to_string()
        } else {
            // SAFETY: as above.
            unsafe { core::ffi::CStr::from_ptr(f) }
                .to_string_lossy()
                .into_owned()
        }
    } else {
        "?".to_string()
    };
    let mut v: c_int = 0;
    let version = match cudaRuntimeGetVersion() {
        // SAFETY: the real cudaRuntimeGetVersion with a valid out-pointer.
        Some(f) if unsafe { f(&mut v) } == cudaSuccess => format!("{}.{}", v / 1000, v % 1000 / 10),
        _ => "unknown".to_string(),
    };
    crate::log::info(&format!(
        "attached to CUDA runtime {path} (version {version})"
    ));
}

/// Declares one accessor per real function: `real::cudaMemcpyAsync()` is the function or
/// `None`.
macro_rules! real_fns {
    ($( $lib:ident: fn $name:ident($($t:ty),* $(,)?) -> $r:ty; )*) => {
        $(
            #[doc = concat!("The real `", stringify!($name), "`, if some loaded library has it.")]
            #[inline(always)]
            pub fn $name() -> Option<unsafe extern "C" fn($($t),*) -> $r> {
                static SLOT: AtomicUsize = AtomicUsize::new(0);
                let p = SLOT.load(Ordering::Acquire);
                let p = if p != 0 {
                    p
                } else {
                    resolve(&SLOT, concat!(stringify!($name), "\0"), Lib::$lib)
                };
                if p == 0 {
                    None
                } else {
                    // SAFETY: `p` is the address of the exported C function of this name,
                    // whose signature NVIDIA's header declares as written here.
                    Some(unsafe {
                        core::mem::transmute::<usize, unsafe extern "C" fn($($t),*) -> $r>(p)
                    })
                }
            }
        )*
    };
}

real_fns! {
    // ---- runtime: used by the tracer (the hooked copies, memsets and launches look theirs up
    // by the signatures in `copy_hook!`, `memset_hook!` and `launch_hook!`) ----
    Cudart: fn cudaMemcpyAsync(*mut c_void, *const c_void, usize, cudaMemcpyKind, cudaStream_t) -> cudaError_t;
    Cudart: fn cudaMemcpy2DAsync(*mut c_void, usize, *const c_void, usize, usize, usize, cudaMemcpyKind, cudaStream_t) -> cudaError_t;
    Cudart: fn cudaGetDevice(*mut c_int) -> cudaError_t;
    Cudart: fn cudaSetDevice(c_int) -> cudaError_t;
    Cudart: fn cudaGetLastError() -> cudaError_t;
    Cudart: fn cudaPeekAtLastError() -> cudaError_t;
    Cudart: fn cudaPointerGetAttributes(*mut cudaPointerAttributes, *const c_void) -> cudaError_t;
    Cudart: fn cudaStreamIsCapturing(cudaStream_t, *mut cudaStreamCaptureStatus) -> cudaError_t;
    Cudart: fn cudaThreadExchangeStreamCaptureMode(*mut cudaStreamCaptureMode) -> cudaError_t;
    Cudart: fn cudaEventCreateWithFlags(*mut cudaEvent_t, c_uint) -> cudaError_t;
    Cudart: fn cudaEventRecord(cudaEvent_t, cudaStream_t) -> cudaError_t;
    Cudart: fn cudaEventQuery(cudaEvent_t) -> cudaError_t;
    Cudart: fn cudaEventSynchronize(cudaEvent_t) -> cudaError_t;
    Cudart: fn cudaHostRegister(*mut c_void, usize, c_uint) -> cudaError_t;
    Cudart: fn cudaRuntimeGetVersion(*mut c_int) -> cudaError_t;
    Cudart: fn cudaGetSymbolAddress(*mut *mut c_void, *const c_void) -> cudaError_t;
    // ---- runtime: CUDA graphs, used by the tracer (intercept/src/graph.rs; the graph hooks look
    // theirs up by the signatures in `graph_hook!`) ----
    // CUDA 12 spelling (every 12.x runtime exports it); CUDA 13 renamed it to the unversioned
    // name with an edge-data parameter (the unversioned CUDA 12 export is CUDA 11's 3 arguments).
    Cudart: fn cudaStreamGetCaptureInfo_v2(cudaStream_t, *mut cudaStreamCaptureStatus, *mut c_ulonglong, *mut cudaGraph_t, *mut *const cudaGraphNode_t, *mut usize) -> cudaError_t;
    Cudart: fn cudaStreamGetCaptureInfo(cudaStream_t, *mut cudaStreamCaptureStatus, *mut c_ulonglong, *mut cudaGraph_t, *mut *const cudaGraphNode_t, *mut *const cudaGraphEdgeData, *mut usize) -> cudaError_t;
    Cudart: fn cudaGraphExecMemcpyNodeSetParams1D(cudaGraphExec_t, cudaGraphNode_t, *mut c_void, *const c_void, usize, cudaMemcpyKind) -> cudaError_t;
    Cudart: fn cudaGraphGetNodes(cudaGraph_t, *mut cudaGraphNode_t, *mut usize) -> cudaError_t;
    Cudart: fn cudaGraphNodeGetType(cudaGraphNode_t, *mut cudaGraphNodeType) -> cudaError_t;
    Cudart: fn cudaGraphDestroy(cudaGraph_t) -> cudaError_t;
    Driver: fn cuGraphDestroy(CUgraph) -> CUresult;
    // ---- runtime: used by the perturbation of a reference run ----
    Cudart: fn cudaStreamSynchronize(cudaStream_t) -> cudaError_t;
    Cudart: fn cudaMallocHost(*mut *mut c_void, usize) -> cudaError_t;
    Cudart: fn cudaFreeHost(*mut c_void) -> cudaError_t;
    Cudart: fn cudaLaunchHostFunc(cudaStream_t, cudaHostFn_t, *mut c_void) -> cudaError_t;

    // ---- cuBLAS ----
    Cublas: fn cublasGetStream_v2(cublasHandle_t, *mut cudaStream_t) -> cublasStatus_t;
    Cublas: fn cublasGetPointerMode_v2(cublasHandle_t, *mut cublasPointerMode_t) -> cublasStatus_t;
    Cublas: fn cublasGetMathMode(cublasHandle_t, *mut cublasMath_t) -> cublasStatus_t;

    // ---- cuBLASLt, used by the tracer (the hook looks its real function up by the signature in
    // `lt_hook!`) ----
    CublasLt: fn cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t, *mut c_void, usize, *mut usize) -> cublasStatus_t;
    CublasLt: fn cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t, cublasLtMatrixLayoutAttribute_t, *mut c_void, usize, *mut usize) -> cublasStatus_t;

    // ---- NCCL, used by the tracer (the collectives', communicators' and groups' hooks look
    // theirs up by the signatures in `coll_hook!` and `comm_hook!`) ----
    Nccl: fn ncclCommCount(ncclComm_t, *mut c_int) -> ncclResult_t;
    Nccl: fn ncclCommUserRank(ncclComm_t, *mut c_int) -> ncclResult_t;
    Nccl: fn ncclCommCuDevice(ncclComm_t, *mut c_int) -> ncclResult_t;
    Nccl: fn ncclCommGetAsyncError(ncclComm_t, *mut ncclResult_t) -> ncclResult_t;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_point_belongs_to_the_library_its_prefix_names() {
        let cases = [
            ("cublasLtMatmul", Some(Lib::CublasLt)),
            ("cublasSgemm_v2", Some(Lib::Cublas)),
            ("cudaMemcpyAsync", Some(Lib::Cudart)),
            ("ncclAllReduce", Some(Lib::Nccl)),
            ("nvtxRangePushA", Some(Lib::Nvtx)),
            ("cuMemcpyHtoDAsync_v2", Some(Lib::Driver)),
            ("malloc", None),
            ("pncclAllReduce", Some(Lib::Nccl)),
            ("pnccl", Some(Lib::Nccl)),
        ];
        for (name, lib) in cases {
            assert_eq!(Lib::of(name), lib, "{name}");
        }
    }

    #[test]
    fn the_c_library_is_not_a_cuda_object() {
        // The rule reads the object's file name: libc is none of the CUDA libraries.
        assert!(!is_cuda_object(libc::malloc as *const () as usize));
        assert!(object_path(libc::malloc as *const () as usize).is_some());
    }
}
