//! Loading an NVTX tool, as NVIDIA's `libnvToolsExt.so.1` does (and every program compiled
//! with NVTX 3, `nvtx3/nvtxDetail/nvtxInit.h`): on the first call of an entry point, the
//! library named by `NVTX_INJECTION64_PATH` is loaded and its `InitializeInjectionNvtx2` is
//! handed a function that gives out this library's function tables; the tool writes its own
//! functions into the slots it wants. From then on an entry point calls the tool's function
//! in its slot (and returns what it returns), or does nothing when the tool left the slot
//! empty. Without a tool (no variable, a library that cannot be loaded, or an init function
//! that declines), the entry points behave as the crate documentation says.
//!
//! The slots routed to a tool are the push, pop, start, end and mark entry points of the core
//! and domain modules and the domain module's domain creation and string registration (what a
//! range-tracking tool fills); the others keep their simulated behaviour.

use core::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// `NvtxCallbackModule` (`nvtxTypes.h`): the core (v2) API and the domain API.
#[derive(Clone, Copy)]
pub enum Module {
    Core = 1,
    Core2 = 5,
}

// `NvtxCallbackIdCore` (`nvtxTypes.h`).
pub const CORE_MARK_EX: usize = 1;
pub const CORE_MARK_A: usize = 2;
pub const CORE_MARK_W: usize = 3;
pub const CORE_RANGE_START_EX: usize = 4;
pub const CORE_RANGE_START_A: usize = 5;
pub const CORE_RANGE_START_W: usize = 6;
pub const CORE_RANGE_END: usize = 7;
pub const CORE_RANGE_PUSH_EX: usize = 8;
pub const CORE_RANGE_PUSH_A: usize = 9;
pub const CORE_RANGE_PUSH_W: usize = 10;
pub const CORE_RANGE_POP: usize = 11;
/// `NVTX_CBID_CORE_SIZE`.
const CORE_SIZE: usize = 16;
// `NvtxCallbackIdCore2` (`nvtxTypes.h`).
pub const CORE2_DOMAIN_MARK_EX: usize = 1;
pub const CORE2_DOMAIN_RANGE_START_EX: usize = 2;
pub const CORE2_DOMAIN_RANGE_END: usize = 3;
pub const CORE2_DOMAIN_RANGE_PUSH_EX: usize = 4;
pub const CORE2_DOMAIN_RANGE_POP: usize = 5;
pub const CORE2_DOMAIN_REGISTER_STRING_A: usize = 10;
pub const CORE2_DOMAIN_REGISTER_STRING_W: usize = 11;
pub const CORE2_DOMAIN_CREATE_A: usize = 12;
pub const CORE2_DOMAIN_CREATE_W: usize = 13;
/// `NVTX_CBID_CORE2_SIZE`.
const CORE2_SIZE: usize = 16;

/// `NVTX_ETID_CALLBACKS`.
const ETID_CALLBACKS: u32 = 1;

/// The function-pointer slots of each module, by callback id (0 is no id).
static CORE: [AtomicUsize; CORE_SIZE] = [const { AtomicUsize::new(0) }; CORE_SIZE];
static CORE2: [AtomicUsize; CORE2_SIZE] = [const { AtomicUsize::new(0) }; CORE2_SIZE];

/// `NvtxFunctionTable` of a module: the addresses of its slots, and a null after them (as
/// NVTX's tables end, so that a tool reading past the end finds a null).
fn table(slots: &'static [AtomicUsize]) -> Box<[usize]> {
    slots
        .iter()
        .enumerate()
        .map(|(id, s)| if id == 0 { 0 } else { s.as_ptr() as usize })
        .chain([0])
        .collect()
}

/// The tables handed to the tool, made once.
static TABLES: OnceLock<[Box<[usize]>; 2]> = OnceLock::new();

/// `NvtxExportTableCallbacks::GetModuleFunctionTable`.
unsafe extern "C" fn module_function_table(
    module: c_int,
    out_table: *mut *mut *mut usize,
    out_size: *mut c_uint,
) -> c_int {
    let tables = TABLES.get_or_init(|| [table(&CORE), table(&CORE2)]);
    let t = match module {
        m if m == Module::Core as c_int => &tables[0],
        m if m == Module::Core2 as c_int => &tables[1],
        _ => return 0,
    };
    if !out_size.is_null() {
        // SAFETY: the tool's out-parameter. As NVTX: the ids known (the table's length
        // less its trailing null).
        unsafe { *out_size = (t.len() - 1) as c_uint };
    }
    if !out_table.is_null() {
        // SAFETY: the tool's out-parameter; the table lives as long as the process and the
        // tool only writes through its entries, into the slots.
        unsafe { *out_table = t.as_ptr() as *mut *mut usize };
    }
    1
}

/// `struct NvtxExportTableCallbacks` (`nvtxTypes.h`).
#[repr(C)]
struct ExportTableCallbacks {
    struct_size: usize,
    get_module_function_table:
        unsafe extern "C" fn(c_int, *mut *mut *mut usize, *mut c_uint) -> c_int,
}

static CALLBACKS: ExportTableCallbacks = ExportTableCallbacks {
    struct_size: core::mem::size_of::<ExportTableCallbacks>(),
    get_module_function_table: module_function_table,
};

/// `NvtxGetExportTableFunc_t`: the callbacks table, nothing else.
unsafe extern "C" fn export_table(id: u32) -> *const c_void {
    if id == ETID_CALLBACKS {
        (&raw const CALLBACKS).cast()
    } else {
        core::ptr::null()
    }
}

/// Whether a tool is attached, loading it on the first call.
pub fn attached() -> bool {
    static ATTACHED: OnceLock<bool> = OnceLock::new();
    *ATTACHED.get_or_init(load)
}

/// Loads the tool `NVTX_INJECTION64_PATH` names and lets it fill the slots.
fn load() -> bool {
    let Some(path) = std::env::var_os("NVTX_INJECTION64_PATH") else {
        return false;
    };
    let Ok(path) = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()))
    else {
        return false;
    };
    // SAFETY: dlopen and dlsym with NUL-terminated strings; the symbol, when found, is the
    // tool's init function of NVTX's documented type.
    unsafe {
        let lib = libc::dlopen(path.as_ptr(), libc::RTLD_LAZY);
        if lib.is_null() {
            return false;
        }
        let init = libc::dlsym(lib, c"InitializeInjectionNvtx2".as_ptr());
        if init.is_null() {
            return false;
        }
        type Init = unsafe extern "C" fn(unsafe extern "C" fn(u32) -> *const c_void) -> c_int;
        let init: Init = core::mem::transmute::<*mut c_void, Init>(init);
        if init(export_table) == 0 {
            // A tool that declines leaves nothing behind.
            for s in CORE.iter().chain(CORE2.iter()) {
                s.store(0, Ordering::Relaxed);
            }
            return false;
        }
    }
    true
}

/// What slot `id` of `module` holds.
pub enum Slot {
    /// No tool is attached: the library's own behaviour.
    NoTool,
    /// The attached tool left it empty: the call does nothing.
    Empty,
    /// The tool's function, at this address.
    Tool(usize),
}

/// What slot `id` of `module` holds (loading the tool on the first call).
pub fn slot(module: Module, id: usize) -> Slot {
    if !attached() {
        return Slot::NoTool;
    }
    let slots: &[AtomicUsize] = match module {
        Module::Core => &CORE,
        Module::Core2 => &CORE2,
    };
    match slots.get(id).map(|s| s.load(Ordering::Acquire)) {
        Some(f) if f != 0 => Slot::Tool(f),
        _ => Slot::Empty,
    }
}
