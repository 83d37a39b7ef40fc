//! NVTX v2 entry points (`nvToolsExt.h`, `nvToolsExtCudaRt.h`), from `libnvToolsExt.so.1`.
use core::ffi::{c_char, c_int};

use crate::abi::cudart::{cudaEvent_t, cudaStream_t};
use crate::abi::nvtx::*;
use crate::dyn_api;

dyn_api! {
    /// Marks an instant.
    fn nvtxMarkA(message: *const c_char) -> ();
    /// Marks an instant (wide string).
    fn nvtxMarkW(message: *const wchar_t) -> ();
    /// Marks an instant with attributes.
    fn nvtxMarkEx(eventAttrib: *const nvtxEventAttributes_t) -> ();
    /// Marks an instant in a domain.
    fn nvtxDomainMarkEx(domain: nvtxDomainHandle_t, eventAttrib: *const nvtxEventAttributes_t) -> ();
    /// Starts a range that may end on another thread; returns its id.
    fn nvtxRangeStartA(message: *const c_char) -> nvtxRangeId_t;
    /// `nvtxRangeStartA` with a wide string.
    fn nvtxRangeStartW(message: *const wchar_t) -> nvtxRangeId_t;
    /// `nvtxRangeStartA` with attributes.
    fn nvtxRangeStartEx(eventAttrib: *const nvtxEventAttributes_t) -> nvtxRangeId_t;
    /// `nvtxRangeStartEx` in a domain.
    fn nvtxDomainRangeStartEx(domain: nvtxDomainHandle_t, eventAttrib: *const nvtxEventAttributes_t) -> nvtxRangeId_t;
    /// Ends a range started by `nvtxRangeStart*`.
    fn nvtxRangeEnd(id: nvtxRangeId_t) -> ();
    /// Ends a range started by `nvtxDomainRangeStartEx`.
    fn nvtxDomainRangeEnd(domain: nvtxDomainHandle_t, id: nvtxRangeId_t) -> ();
    /// Opens a nested range on this thread; returns its zero-based level.
    fn nvtxRangePushA(message: *const c_char) -> c_int;
    /// `nvtxRangePushA` with a wide string.
    fn nvtxRangePushW(message: *const wchar_t) -> c_int;
    /// `nvtxRangePushA` with attributes.
    fn nvtxRangePushEx(eventAttrib: *const nvtxEventAttributes_t) -> c_int;
    /// `nvtxRangePushEx` in a domain.
    fn nvtxDomainRangePushEx(domain: nvtxDomainHandle_t, eventAttrib: *const nvtxEventAttributes_t) -> c_int;
    /// Closes this thread's innermost range; returns its level (negative when none was open).
    fn nvtxRangePop() -> c_int;
    /// `nvtxRangePop` in a domain.
    fn nvtxDomainRangePop(domain: nvtxDomainHandle_t) -> c_int;
    /// Creates a domain.
    fn nvtxDomainCreateA(name: *const c_char) -> nvtxDomainHandle_t;
    /// Creates a domain (wide-string name).
    fn nvtxDomainCreateW(name: *const wchar_t) -> nvtxDomainHandle_t;
    /// Destroys a domain.
    fn nvtxDomainDestroy(domain: nvtxDomainHandle_t) -> ();
    /// Registers a string for `NVTX_MESSAGE_TYPE_REGISTERED` messages.
    fn nvtxDomainRegisterStringA(domain: nvtxDomainHandle_t, string: *const c_char) -> nvtxStringHandle_t;
    /// `nvtxDomainRegisterStringA` with a wide string.
    fn nvtxDomainRegisterStringW(domain: nvtxDomainHandle_t, string: *const wchar_t) -> nvtxStringHandle_t;
    /// Names a resource (thread, pointer, handle) in a domain.
    fn nvtxDomainResourceCreate(domain: nvtxDomainHandle_t, attribs: *mut nvtxResourceAttributes_t) -> nvtxResourceHandle_t;
    /// Forgets a resource name.
    fn nvtxDomainResourceDestroy(resource: nvtxResourceHandle_t) -> ();
    /// Names a category in a domain.
    fn nvtxDomainNameCategoryA(domain: nvtxDomainHandle_t, category: u32, name: *const c_char) -> ();
    /// Names a category in a domain (wide string).
    fn nvtxDomainNameCategoryW(domain: nvtxDomainHandle_t, category: u32, name: *const wchar_t) -> ();
    /// Names a category of the default domain.
    fn nvtxNameCategoryA(category: u32, name: *const c_char) -> ();
    /// Names a category of the default domain (wide string).
    fn nvtxNameCategoryW(category: u32, name: *const wchar_t) -> ();
    /// Names an OS thread.
    fn nvtxNameOsThreadA(threadId: u32, name: *const c_char) -> ();
    /// Names an OS thread (wide string).
    fn nvtxNameOsThreadW(threadId: u32, name: *const wchar_t) -> ();
    /// Names a CUDA device.
    fn nvtxNameCudaDeviceA(device: c_int, name: *const c_char) -> ();
    /// Names a CUDA device (wide string).
    fn nvtxNameCudaDeviceW(device: c_int, name: *const wchar_t) -> ();
    /// Names a CUDA stream.
    fn nvtxNameCudaStreamA(stream: cudaStream_t, name: *const c_char) -> ();
    /// Names a CUDA stream (wide string).
    fn nvtxNameCudaStreamW(stream: cudaStream_t, name: *const wchar_t) -> ();
    /// Names a CUDA event.
    fn nvtxNameCudaEventA(event: cudaEvent_t, name: *const c_char) -> ();
    /// Names a CUDA event (wide string).
    fn nvtxNameCudaEventW(event: cudaEvent_t, name: *const wchar_t) -> ();
    /// Initializes NVTX explicitly; 0 on success.
    fn nvtxInitialize(initAttrib: *const nvtxInitializationAttributes_t) -> c_int;
}
