//! Simulated `libnvToolsExt.so.1`: the NVTX v2 entry points of `nvToolsExt.h` and
//! `nvToolsExtCudaRt.h`, doing nothing but returning what a range-tracking tool returns.
//!
//! A tracer interposes these (by `LD_PRELOAD`) to learn about markers and ranges, e.g. a step
//! boundary named by an NVTX range; the library itself only has to exist with the right ABI and
//! return values:
//! * `nvtxRangePush*` returns the zero-based nesting level of the range it opens (per thread and
//!   per domain), `nvtxRangePop` the level of the range it closes, or a negative value when the
//!   thread has no open range;
//! * `nvtxRangeStart*` returns a process-wide unique nonzero `nvtxRangeId_t`;
//! * `nvtxDomainCreate*`, `nvtxDomainRegisterString*` and `nvtxDomainResourceCreate` return
//!   unique non-null handles (never dereferenced: they are opaque to the caller).
//!
//! Environment: `SIM_NVTX_NO_TOOL=1` behaves instead like NVIDIA's library with no tool
//! attached (the usual case outside a profiler): push and pop return
//! `NVTX_NO_PUSH_POP_TRACKING` (-2), range starts return 0, handles are null. A tracer must
//! work in both modes. `NVTX_INJECTION64_PATH` attaches a tool as NVIDIA's library does
//! ([`tool`]): the push, pop, start, end and mark entry points, domain creation and string
//! registration then call the tool's functions.
#![allow(clippy::missing_safety_doc)]

use core::ffi::{c_char, c_int};
use std::cell::RefCell;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

use cuda_abi::cudart::{cudaEvent_t, cudaStream_t};
use cuda_abi::nvtx::*;

pub mod tool;
use tool::{Module, Slot};

/// The body of an entry point a tool may take: the attached tool's function in slot `$id` of
/// `$module` (of the entry point's own C type) called with the program's arguments, `$empty`
/// when the tool left the slot empty, `$own` without a tool, `$panic` if any of it panics.
macro_rules! routed {
    ($module:ident[$id:ident] fn($($t:ty),*) $(-> $r:ty)?, ($($arg:expr),*),
        empty $empty:expr, own $own:expr, panic $panic:expr) => {
        guard($panic, || match tool::slot(Module::$module, tool::$id) {
            // SAFETY: the tool wrote this address into the slot, whose NVTX type is the entry
            // point's own; the program's arguments, forwarded unchanged.
            Slot::Tool(f) => unsafe {
                core::mem::transmute::<usize, unsafe extern "C" fn($($t),*) $(-> $r)?>(f)($($arg),*)
            },
            Slot::Empty => $empty,
            Slot::NoTool => $own,
        })
    };
}

/// Whether a range-tracking tool is simulated (the default), see the crate documentation.
fn tracking() -> bool {
    static TRACKING: OnceLock<bool> = OnceLock::new();
    *TRACKING
        .get_or_init(|| !std::env::var("SIM_NVTX_NO_TOOL").is_ok_and(|v| !v.is_empty() && v != "0"))
}

/// Runs `f`, turning a panic into `fallback`: a panic must not unwind into C.
fn guard<R>(fallback: R, f: impl FnOnce() -> R) -> R {
    std::panic::catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

/// Next `nvtxRangeId_t`; 0 is never handed out (it is the "no tool" value).
static NEXT_RANGE_ID: AtomicU64 = AtomicU64::new(1);
/// Next handle number; handles are `number * 16` so that they look like aligned pointers.
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(1);

thread_local! {
    /// Open push/pop ranges of this thread, per domain (the default domain is 0).
    static DEPTH: RefCell<HashMap<usize, c_int>> = RefCell::new(HashMap::new());
}

/// Opens a push/pop range in `domain` on this thread; returns its zero-based level.
fn push(domain: usize, tracking: bool) -> c_int {
    if !tracking {
        return NVTX_NO_PUSH_POP_TRACKING;
    }
    DEPTH
        .try_with(|d| {
            let mut d = d.borrow_mut();
            let depth = d.entry(domain).or_insert(0);
            let level = *depth;
            *depth = depth.saturating_add(1);
            level
        })
        .unwrap_or(-1)
}

/// Closes the innermost push/pop range of `domain` on this thread; returns its level, or -1
/// when none is open.
fn pop(domain: usize, tracking: bool) -> c_int {
    if !tracking {
        return NVTX_NO_PUSH_POP_TRACKING;
    }
    DEPTH
        .try_with(|d| {
            let mut d = d.borrow_mut();
            match d.get_mut(&domain) {
                Some(depth) if *depth > 0 => {
                    *depth -= 1;
                    *depth
                }
                _ => -1,
            }
        })
        .unwrap_or(-1)
}

/// A fresh range id (0 without a tool).
fn start(tracking: bool) -> nvtxRangeId_t {
    if !tracking {
        return 0;
    }
    NEXT_RANGE_ID.fetch_add(1, Ordering::Relaxed)
}

/// A fresh opaque handle (null without a tool).
fn handle<T>(tracking: bool) -> *mut T {
    if !tracking {
        return std::ptr::null_mut();
    }
    let n = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed);
    // An integer disguised as a pointer, never dereferenced (by us or by callers: opaque).
    n.wrapping_mul(16) as *mut T
}

// ---- markers -----------------------------------------------------------------------------

/// `void nvtxMarkA(const char* message)`.
#[no_mangle]
pub unsafe extern "C" fn nvtxMarkA(message: *const c_char) {
    routed!(Core[CORE_MARK_A] fn(*const c_char), (message), empty (), own (), panic ())
}

/// `void nvtxMarkW(const wchar_t* message)`.
#[no_mangle]
pub unsafe extern "C" fn nvtxMarkW(message: *const wchar_t) {
    routed!(Core[CORE_MARK_W] fn(*const wchar_t), (message), empty (), own (), panic ())
}

/// `void nvtxMarkEx(const nvtxEventAttributes_t* eventAttrib)`.
#[no_mangle]
pub unsafe extern "C" fn nvtxMarkEx(eventAttrib: *const nvtxEventAttributes_t) {
    routed!(Core[CORE_MARK_EX] fn(*const nvtxEventAttributes_t), (eventAttrib), empty (), own (), panic ())
}

/// `void nvtxDomainMarkEx(nvtxDomainHandle_t domain, const nvtxEventAttributes_t* eventAttrib)`.
#[no_mangle]
pub unsafe extern "C" fn nvtxDomainMarkEx(
    domain: nvtxDomainHandle_t,
    eventAttrib: *const nvtxEventAttributes_t,
) {
    routed!(Core2[CORE2_DOMAIN_MARK_EX] fn(nvtxDomainHandle_t, *const nvtxEventAttributes_t), (domain, eventAttrib), empty (), own (), panic ())
}

// ---- start/end ranges --------------------------------------------------------------------

/// `nvtxRangeId_t nvtxRangeStartA(const char* message)`.
#[no_mangle]
pub unsafe extern "C" fn nvtxRangeStartA(message: *const c_char) -> nvtxRangeId_t {
    routed!(Core[CORE_RANGE_START_A] fn(*const c_char) -> nvtxRangeId_t, (message), empty 0, own start(tracking()), panic 0)
}

/// `nvtxRangeId_t nvtxRangeStartW(const wchar_t* message)`.
#[no_mangle]
pub unsafe extern "C" fn nvtxRangeStartW(message: *const wchar_t) -> nvtxRangeId_t {
    routed!(Core[CORE_RANGE_START_W] fn(*const wchar_t) -> nvtxRangeId_t, (message), empty 0, own start(tracking()), panic 0)
}

/// `nvtxRangeId_t nvtxRangeStartEx(const nvtxEventAttributes_t* eventAttrib)`.
#[no_mangle]
pub unsafe extern "C" fn nvtxRangeStartEx(
    eventAttrib: *const nvtxEventAttributes_t,
) -> nvtxRangeId_t {
    routed!(Core[CORE_RANGE_START_EX] fn(*const nvtxEventAttributes_t) -> nvtxRangeId_t, (eventAttrib), empty 0, own start(tracking()), panic 0)
}

/// `nvtxRangeId_t nvtxDomainRangeStartEx(nvtxDomainHandle_t, const nvtxEventAttributes_t*)`.
#[no_mangle]
pub unsafe extern "C" fn nvtxDomainRangeStartEx(
    domain: nvtxDomainHandle_t,
    eventAttrib: *const nvtxEventAttributes_t,
) -> nvtxRangeId_t {
    routed!(Core2[CORE2_DOMAIN_RANGE_START_EX] fn(nvtxDomainHandle_t, *const nvtxEventAttributes_t) -> nvtxRangeId_t, (domain, eventAttrib), empty 0, own start(tracking()), panic 0)
}

/// `void nvtxRangeEnd(nvtxRangeId_t id)`.
#[no_mangle]
pub unsafe extern "C" fn nvtxRangeEnd(id: nvtxRangeId_t) {
    routed!(Core[CORE_RANGE_END] fn(nvtxRangeId_t), (id), empty (), own (), panic ())
}

/// `void nvtxDomainRangeEnd(nvtxDomainHandle_t domain, nvtxRangeId_t id)`.
#[no_mangle]
pub unsafe extern "C" fn nvtxDomainRangeEnd(domain: nvtxDomainHandle_t, id: nvtxRangeId_t) {
    routed!(Core2[CORE2_DOMAIN_RANGE_END] fn(nvtxDomainHandle_t, nvtxRangeId_t), (domain, id), empty (), own (), panic ())
}

// ---- push/pop ranges ---------------------------------------------------------------------

/// `int nvtxRangePushA(const char* message)`: the level of the new range.
#[no_mangle]
pub unsafe extern "C" fn nvtxRangePushA(message: *const c_char) -> c_int {
    routed!(Core[CORE_RANGE_PUSH_A] fn(*const c_char) -> c_int, (message), empty NVTX_NO_PUSH_POP_TRACKING, own push(0, tracking()), panic -1)
}

/// `int nvtxRangePushW(const wchar_t* message)`: the level of the new range.
#[no_mangle]
pub unsafe extern "C" fn nvtxRangePushW(message: *const wchar_t) -> c_int {
    routed!(Core[CORE_RANGE_PUSH_W] fn(*const wchar_t) -> c_int, (message), empty NVTX_NO_PUSH_POP_TRACKING, own push(0, tracking()), panic -1)
}

/// `int nvtxRangePushEx(const nvtxEventAttributes_t* eventAttrib)`: the level of the new range.
#[no_mangle]
pub unsafe extern "C" fn nvtxRangePushEx(eventAttrib: *const nvtxEventAttributes_t) -> c_int {
    routed!(Core[CORE_RANGE_PUSH_EX] fn(*const nvtxEventAttributes_t) -> c_int, (eventAttrib), empty NVTX_NO_PUSH_POP_TRACKING, own push(0, tracking()), panic -1)
}

/// `int nvtxDomainRangePushEx(nvtxDomainHandle_t, const nvtxEventAttributes_t*)`: the level of
/// the new range in that domain (null is the default domain).
#[no_mangle]
pub unsafe extern "C" fn nvtxDomainRangePushEx(
    domain: nvtxDomainHandle_t,
    eventAttrib: *const nvtxEventAttributes_t,
) -> c_int {
    routed!(Core2[CORE2_DOMAIN_RANGE_PUSH_EX] fn(nvtxDomainHandle_t, *const nvtxEventAttributes_t) -> c_int, (domain, eventAttrib), empty NVTX_NO_PUSH_POP_TRACKING, own push(domain as usize, tracking()), panic -1)
}

/// `int nvtxRangePop(void)`: the level of the range closed, negative when none was open.
#[no_mangle]
pub unsafe extern "C" fn nvtxRangePop() -> c_int {
    routed!(Core[CORE_RANGE_POP] fn() -> c_int, (), empty NVTX_NO_PUSH_POP_TRACKING, own pop(0, tracking()), panic -1)
}

/// `int nvtxDomainRangePop(nvtxDomainHandle_t domain)`: as `nvtxRangePop`, in that domain.
#[no_mangle]
pub unsafe extern "C" fn nvtxDomainRangePop(domain: nvtxDomainHandle_t) -> c_int {
    routed!(Core2[CORE2_DOMAIN_RANGE_POP] fn(nvtxDomainHandle_t) -> c_int, (domain), empty NVTX_NO_PUSH_POP_TRACKING, own pop(domain as usize, tracking()), panic -1)
}

// ---- domains, strings, resources, names ---------------------------------------------------

/// `nvtxDomainHandle_t nvtxDomainCreateA(const char* name)`.
#[no_mangle]
pub unsafe extern "C" fn nvtxDomainCreateA(name: *const c_char) -> nvtxDomainHandle_t {
    routed!(Core2[CORE2_DOMAIN_CREATE_A] fn(*const c_char) -> nvtxDomainHandle_t, (name), empty std::ptr::null_mut(), own handle(tracking()), panic std::ptr::null_mut())
}

/// `nvtxDomainHandle_t nvtxDomainCreateW(const wchar_t* name)`.
#[no_mangle]
pub unsafe extern "C" fn nvtxDomainCreateW(name: *const wchar_t) -> nvtxDomainHandle_t {
    routed!(Core2[CORE2_DOMAIN_CREATE_W] fn(*const wchar_t) -> nvtxDomainHandle_t, (name), empty std::ptr::null_mut(), own handle(tracking()), panic std::ptr::null_mut())
}

/// `void nvtxDomainDestroy(nvtxDomainHandle_t domain)`.
#[no_mangle]
pub unsafe extern "C" fn nvtxDomainDestroy(_domain: nvtxDomainHandle_t) {}

/// `nvtxStringHandle_t nvtxDomainRegisterStringA(nvtxDomainHandle_t, const char*)`.
#[no_mangle]
pub unsafe extern "C" fn nvtxDomainRegisterStringA(
    domain: nvtxDomainHandle_t,
    string: *const c_char,
) -> nvtxStringHandle_t {
    routed!(Core2[CORE2_DOMAIN_REGISTER_STRING_A] fn(nvtxDomainHandle_t, *const c_char) -> nvtxStringHandle_t, (domain, string), empty std::ptr::null_mut(), own handle(tracking()), panic std::ptr::null_mut())
}

/// `nvtxStringHandle_t nvtxDomainRegisterStringW(nvtxDomainHandle_t, const wchar_t*)`.
#[no_mangle]
pub unsafe extern "C" fn nvtxDomainRegisterStringW(
    domain: nvtxDomainHandle_t,
    string: *const wchar_t,
) -> nvtxStringHandle_t {
    routed!(Core2[CORE2_DOMAIN_REGISTER_STRING_W] fn(nvtxDomainHandle_t, *const wchar_t) -> nvtxStringHandle_t, (domain, string), empty std::ptr::null_mut(), own handle(tracking()), panic std::ptr::null_mut())
}

/// `nvtxResourceHandle_t nvtxDomainResourceCreate(nvtxDomainHandle_t, nvtxResourceAttributes_t*)`.
#[no_mangle]
pub unsafe extern "C" fn nvtxDomainResourceCreate(
    _domain: nvtxDomainHandle_t,
    _attribs: *mut nvtxResourceAttributes_t,
) -> nvtxResourceHandle_t {
    guard(std::ptr::null_mut(), || handle(tracking()))
}

/// `void nvtxDomainResourceDestroy(nvtxResourceHandle_t resource)`.
#[no_mangle]
pub unsafe extern "C" fn nvtxDomainResourceDestroy(_resource: nvtxResourceHandle_t) {}

/// `void nvtxDomainNameCategoryA(nvtxDomainHandle_t, uint32_t category, const char* name)`.
#[no_mangle]
pub unsafe extern "C" fn nvtxDomainNameCategoryA(
    _domain: nvtxDomainHandle_t,
    _category: u32,
    _name: *const c_char,
) {
}

/// `void nvtxDomainNameCategoryW(nvtxDomainHandle_t, uint32_t category, const wchar_t* name)`.
#[no_mangle]
pub unsafe extern "C" fn nvtxDomainNameCategoryW(
    _domain: nvtxDomainHandle_t,
    _category: u32,
    _name: *const wchar_t,
) {
}

/// `void nvtxNameCategoryA(uint32_t category, const char* name)`.
#[no_mangle]
pub unsafe extern "C" fn nvtxNameCategoryA(_category: u32, _name: *const c_char) {}

/// `void nvtxNameCategoryW(uint32_t category, const wchar_t* name)`.
#[no_mangle]
pub unsafe extern "C" fn nvtxNameCategoryW(_category: u32, _name: *const wchar_t) {}

/// `void nvtxNameOsThreadA(uint32_t threadId, const char* name)`.
#[no_mangle]
pub unsafe extern "C" fn nvtxNameOsThreadA(_threadId: u32, _name: *const c_char) {}

/// `void nvtxNameOsThreadW(uint32_t threadId, const wchar_t* name)`.
#[no_mangle]
pub unsafe extern "C" fn nvtxNameOsThreadW(_threadId: u32, _name: *const wchar_t) {}

/// `void nvtxNameCudaDeviceA(int device, const char* name)` (`nvToolsExtCudaRt.h`).
#[no_mangle]
pub unsafe extern "C" fn nvtxNameCudaDeviceA(_device: c_int, _name: *const c_char) {}

/// `void nvtxNameCudaDeviceW(int device, const wchar_t* name)` (`nvToolsExtCudaRt.h`).
#[no_mangle]
pub unsafe extern "C" fn nvtxNameCudaDeviceW(_device: c_int, _name: *const wchar_t) {}

/// `void nvtxNameCudaStreamA(cudaStream_t stream, const char* name)` (`nvToolsExtCudaRt.h`).
#[no_mangle]
pub unsafe extern "C" fn nvtxNameCudaStreamA(_stream: cudaStream_t, _name: *const c_char) {}

/// `void nvtxNameCudaStreamW(cudaStream_t stream, const wchar_t* name)` (`nvToolsExtCudaRt.h`).
#[no_mangle]
pub unsafe extern "C" fn nvtxNameCudaStreamW(_stream: cudaStream_t, _name: *const wchar_t) {}

/// `void nvtxNameCudaEventA(cudaEvent_t event, const char* name)` (`nvToolsExtCudaRt.h`).
#[no_mangle]
pub unsafe extern "C" fn nvtxNameCudaEventA(_event: cudaEvent_t, _name: *const c_char) {}

/// `void nvtxNameCudaEventW(cudaEvent_t event, const wchar_t* name)` (`nvToolsExtCudaRt.h`).
#[no_mangle]
pub unsafe extern "C" fn nvtxNameCudaEventW(_event: cudaEvent_t, _name: *const wchar_t) {}

/// `int nvtxInitialize(const nvtxInitializationAttributes_t* initAttrib)`: 0 (`NVTX_SUCCESS`).
#[no_mangle]
pub unsafe extern "C" fn nvtxInitialize(
    _initAttrib: *const nvtxInitializationAttributes_t,
) -> c_int {
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_pop_levels_nest_per_thread() {
        // SAFETY: these entry points never dereference their arguments.
        unsafe {
            assert_eq!(nvtxRangePushA(c"outer".as_ptr()), 0);
            assert_eq!(nvtxRangePushEx(&nvtxEventAttributes_t::default()), 1);
            // Another thread starts at level 0 and cannot pop this thread's ranges.
            std::thread::spawn(|| {
                assert_eq!(nvtxRangePop(), -1);
                assert_eq!(nvtxRangePushW([0].as_ptr()), 0);
                assert_eq!(nvtxRangePop(), 0);
            })
            .join()
            .expect("thread");
            assert_eq!(nvtxRangePushA(std::ptr::null()), 2);
            assert_eq!(nvtxRangePop(), 2);
            assert_eq!(nvtxRangePop(), 1);
            assert_eq!(nvtxRangePop(), 0);
            assert!(nvtxRangePop() < 0, "no open range");
            assert_eq!(nvtxRangePushA(c"again".as_ptr()), 0);
            assert_eq!(nvtxRangePop(), 0);
        }
    }

    #[test]
    fn domains_have_their_own_levels() {
        // SAFETY: these entry points never dereference their arguments.
        unsafe {
            let a = nvtxDomainCreateA(c"a".as_ptr());
            let b = nvtxDomainCreateA(c"b".as_ptr());
            assert!(!a.is_null() && !b.is_null() && a != b);
            let attr = nvtxEventAttributes_t::default();
            assert_eq!(nvtxDomainRangePushEx(a, &attr), 0);
            assert_eq!(nvtxDomainRangePushEx(a, &attr), 1);
            assert_eq!(nvtxDomainRangePushEx(b, &attr), 0);
            // The null domain is the default one, shared with nvtxRangePush*.
            assert_eq!(nvtxDomainRangePushEx(std::ptr::null_mut(), &attr), 0);
            assert_eq!(nvtxRangePop(), 0);
            assert_eq!(nvtxDomainRangePop(b), 0);
            assert_eq!(nvtxDomainRangePop(a), 1);
            assert_eq!(nvtxDomainRangePop(a), 0);
            assert!(nvtxDomainRangePop(a) < 0);
            nvtxDomainDestroy(a);
            nvtxDomainDestroy(b);
        }
    }

    #[test]
    fn range_ids_are_unique_and_nonzero() {
        let ids: Vec<nvtxRangeId_t> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    // SAFETY: these entry points never dereference their arguments.
                    unsafe {
                        (0..100)
                            .map(|_| nvtxRangeStartA(c"r".as_ptr()))
                            .collect::<Vec<_>>()
                    }
                })
            })
            .flat_map(|t| t.join().expect("thread"))
            .collect();
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ids.len(), "ids are unique");
        assert!(!sorted.contains(&0));
    }

    #[test]
    fn without_a_tool_the_untracked_values_come_back() {
        assert_eq!(push(0, false), NVTX_NO_PUSH_POP_TRACKING);
        assert_eq!(pop(0, false), NVTX_NO_PUSH_POP_TRACKING);
        assert_eq!(start(false), 0);
        assert!(handle::<nvtxDomainHandle>(false).is_null());
    }
}
