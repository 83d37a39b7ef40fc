//! libttrace.so: the capture library of ttrace, loaded with `LD_PRELOAD` into every process of
//! a training job.
//!
//! It interposes the CUDA runtime's copies and kernel launches, cuBLAS and cuBLASLt GEMMs,
//! NCCL collectives, point-to-point and communicator calls, and NVTX ranges. Until the first
//! intercepted call it does nothing; then, when `TTRACE_SOCKET` names a `ttraced`, every
//! selected op is snapshotted into a page-locked shared ring on the op's own stream and
//! published to the daemon by a tracer thread. Without `TTRACE_SOCKET` every hook only calls
//! the real function.
//!
//! Layout (unsafe and FFI stay in small modules):
//! * `real`: the real functions (`dlsym(RTLD_NEXT)`, else the already loaded soname);
//! * `hooks/*`: the exported C functions, thin and typed, one module per library;
//! * `mode`: the one atomic word a hook reads before passing through;
//! * [`plan`]: which tensors an op has and how to copy them packed (pure);
//! * `engine`: reserving ring slots, enqueuing copies and events around the real call;
//! * `graph`: ops captured into CUDA graphs, snapshotted at every replay (`hooks/graph`);
//! * `tracer`: the ticket FIFO and the tracer thread (completion, CRC, step/seq, publish);
//! * [`steps`]: the step rule (pure); `prefilter`: the step and rank selection applied before
//!   the snapshot work; `session`: ring, daemon connection (through `ttrace_proto::producer`,
//!   the one producer client, imported here as `client`);
//! * `cuda`: the runtime calls the tracer makes; `comms`: the communicator registry;
//! * `perturb`: the perturbed reference run (`TTRACE_PERTURB`): ±1 ulp noise on GEMM outputs.
//!
//! Invariants (docs/guarantees.md): a hook returns exactly what the real function returned; a
//! fault disables capture with one log line and a `TracerFault` gap; no panic crosses the C
//! boundary; no device synchronisation (except in a perturbed reference run, which waits for
//! each GEMM's output to add noise to it on the host); no lock held across a CUDA call; a
//! forked child passes everything through.

// Items' docs link the private items they rest on: read with `cargo doc --document-private-items`.
#![allow(rustdoc::private_intra_doc_links)]

pub mod plan;
pub mod steps;

// The daemon connection is the producer client shared with the daemon's tests.
use ttrace_proto::producer as client;
mod collector;
mod comms;
mod cuda;
mod dlsym;
mod engine;
mod fatal;
mod fingerprint;
mod graph;
mod hooks;
mod identity;
mod log;
mod lookups;
mod mode;
mod nvtx_tool;
mod perturb;
mod prefilter;
mod real;
mod session;
mod stall;
mod thread;
mod tracer;
mod uploads;

use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};
use std::panic::{catch_unwind, AssertUnwindSafe};

use ttrace_proto::record::{GapReason, Op};

/// Disables capture for good: one log line and a `TracerFault` gap (only the first fault).
pub(crate) fn fault(api: &'static str, detail: String) {
    if !mode::disable() {
        return;
    }
    log::error(&format!("capture disabled: {api}: {detail}"));
    if session::current().is_some() {
        let meta = engine::meta(
            api,
            Op::gap(GapReason::TracerFault, api.to_string(), 0, detail),
            0,
            -1,
        );
        tracer::push(tracer::Entry::Gap(Box::new(meta)));
    }
}

/// Runs tracer code, turning a panic into a fault (never unwinding into C).
pub(crate) fn catch<T>(f: impl FnOnce() -> T) -> Option<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => Some(v),
        Err(_) => {
            fault("ttrace", "internal error (panic) in a hook".into());
            None
        }
    }
}

/// The capturing path of a hook: `prepare` plans the snapshot and begins it (one op's, or a
/// batch's several), `call` runs the real function exactly once, `done` completes the
/// snapshot with the result. Reentrant calls (from inside the tracer, or a library calling
/// another hooked function) only `call`.
pub(crate) fn around<P, R: Copy>(
    prepare: impl FnOnce() -> Option<P>,
    call: impl FnOnce() -> R,
    done: impl FnOnce(P, R),
) -> R {
    let Some(_guard) = thread::Guard::enter() else {
        return call();
    };
    let f = catch(prepare).flatten();
    let r = call();
    if let Some(f) = f {
        let _ = catch(|| done(f, r));
    }
    r
}

/// [`around`] for an op recorded without tensors (a memset, the gap of an entry point ttrace
/// does not capture): `op` on `stream`, planned before the real call (`None`: nothing to
/// record), recorded in call order once `succeeded` says the call did.
pub(crate) fn around_metadata<R: Copy>(
    api: &'static str,
    stream: cuda_abi::cudart::cudaStream_t,
    op: impl FnOnce() -> Option<ttrace_proto::record::Op>,
    call: impl FnOnce() -> R,
    succeeded: impl FnOnce(R) -> bool,
) -> R {
    around(
        || {
            engine::begin(engine::Call {
                api,
                op: op()?,
                stream,
                stream_id: stream as u64,
                device: None,
                tensors: Vec::new(),
            })
        },
        call,
        |f, r| engine::finish(f, succeeded(r)),
    )
}

/// [`around`] for a GEMM: the snapshot is planned only when GEMMs are captured, and `perturb`
/// (a perturbed reference run) runs after the real call and before `done` enqueues the
/// snapshot of its outputs, so the store holds the output the program goes on with.
pub(crate) fn around_gemm<R: Copy>(
    prepare: impl FnOnce() -> Option<engine::InFlight>,
    call: impl FnOnce() -> R,
    perturb: impl FnOnce(R),
    done: impl FnOnce(engine::InFlight, R),
) -> R {
    let Some(_guard) = thread::Guard::enter() else {
        return call();
    };
    let f = if mode::on(mode::GEMM) {
        catch(prepare).flatten()
    } else {
        None
    };
    let r = call();
    if mode::on(mode::PERTURB) {
        let _ = catch(|| perturb(r));
    }
    if let Some(f) = f {
        let _ = catch(|| done(f, r));
    }
    r
}

extern "C" fn in_fork_child() {
    mode::disable_in_child();
}

extern "C" fn on_load() {
    // SAFETY: registers an async-signal-safe child handler (two atomic stores); besides the
    // lookup of the real dlsym below, nothing else happens at load time: the loader runs this before the program's own constructors, when
    // neither std's runtime nor CUDA may be ready.
    unsafe {
        libc::pthread_atfork(None, None, Some(in_fork_child));
    }
    // The C library's dlsym, before the program can ask for `RTLD_NEXT` through ours.
    dlsym::init();
    offer_nvtx_tool();
}

/// Names this library as the process's NVTX tool (`NVTX_INJECTION64_PATH`), unless capture is
/// off (`TTRACE=0`): NVTX 3 reaches a tool only that way (nvtx_tool.rs). A tool named there
/// already (a profiler: Nsight Systems sets it) is moved to `NVTX_TOOL_BEFORE_TTRACE`, and
/// chained: it still gets every range. Done at load, before any NVTX call reads it; both
/// variables are inherited by child processes (one that does not preload this library gets
/// the other tool alone from it).
fn offer_nvtx_tool() {
    const VAR: &std::ffi::CStr = c"NVTX_INJECTION64_PATH";
    if !mode::enabled() {
        return;
    }
    let Some(path) = own_path() else {
        return;
    };
    // SAFETY: getenv with a NUL-terminated name; at load time no other thread changes the
    // environment. The value is copied before the environment changes.
    let named = unsafe { libc::getenv(VAR.as_ptr()) };
    if !named.is_null() {
        // SAFETY: getenv's value, NUL-terminated.
        let named = unsafe { std::ffi::CStr::from_ptr(named) }.to_owned();
        let named_path = std::path::Path::new(std::ffi::OsStr::from_bytes(named.to_bytes()));
        if std::fs::canonicalize(named_path).is_ok_and(|p| p == path) {
            return; // a parent process that preloads this library named it
        }
        let next = std::ffi::CString::new(nvtx_tool::NEXT_TOOL_VAR).expect("no NUL");
        // SAFETY: NUL-terminated strings; 0: a tool already moved there by a parent stays.
        unsafe { libc::setenv(next.as_ptr(), named.as_ptr(), 0) };
    }
    let Ok(path) = std::ffi::CString::new(path.into_os_string().into_vec()) else {
        return;
    };
    // SAFETY: both strings are NUL-terminated.
    unsafe { libc::setenv(VAR.as_ptr(), path.as_ptr(), 1) };
}

/// The canonical path of this library, as the loader found it (absolute: NVTX loads it on
/// its first call, maybe after the program changed its working directory).
pub(crate) fn own_path() -> Option<std::path::PathBuf> {
    // SAFETY: an all-zero Dl_info is valid; dladdr fills it for an address inside a loaded
    // object (this function's own code) and leaves it alone otherwise.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    let here = own_path as *const libc::c_void;
    // SAFETY: `here` is an address in this library; `info` lives across the call.
    if unsafe { libc::dladdr(here, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr set dli_fname to a NUL-terminated path owned by the loader.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    let path = std::path::PathBuf::from(std::ffi::OsString::from_vec(name.to_bytes().to_vec()));
    Some(std::fs::canonicalize(&path).unwrap_or(path))
}

/// Runs [`on_load`] when the library is loaded.
#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;
