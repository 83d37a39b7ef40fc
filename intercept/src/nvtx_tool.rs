//! NVTX 3's tool interface: how ranges reach ttrace from programs that use NVTX header-only.
//!
//! NVTX 3 (every CUDA 13 program, and most CUDA 12 ones: PyTorch, CUB, Transformer Engine)
//! compiles the NVTX calls into the program as static functions that call through a table of
//! function pointers; no `nvtxRangePushA` is ever exported, so an interposed export (the v2
//! hooks in [`crate::hooks::nvtx`]) never sees them. On its first NVTX call each such module reads
//! `NVTX_INJECTION64_PATH`, `dlopen`s that library, and calls its `InitializeInjectionNvtx2`
//! with a function that hands out the module's tables; the tool writes its own functions into
//! the slots it wants (`nvtx3/nvtxDetail/nvtxInit.h`, `nvtxImpl.h`, `nvtxTypes.h`). NVIDIA's
//! NVTX v2 library (`libnvToolsExt.so.1`) loads a tool the same way.
//!
//! libttrace.so offers itself: at load it sets `NVTX_INJECTION64_PATH` to its own path
//! (`lib.rs`; a tool named there before, a profiler's, moves to [`NEXT_TOOL_VAR`] and is
//! chained), and [`InitializeInjectionNvtx2`] fills the push, pop, range start and mark slots
//! of the core and domain modules with functions that keep the thread's range stack and the
//! `nvtx:NAME` step marks exactly as the v2 hooks do, then call the chained tool's function.
//! They return its answer, or what NVTX returns without a tool (`NVTX_NO_PUSH_POP_TRACKING`,
//! range id 0): the program sees the values it would see untraced. It also takes the domain module's string
//! registration (`nvtxDomainRegisterString{A,W}`: nvtx3.hpp's `registered_string_in`, CCCL's
//! range names), so that a range named by a registered string is recorded under its text.
//!
//! A call of an interposed v2 export reaches the v2 library, which calls ttrace's table entry
//! in turn: the v2 hook has already noted it, so the table entry leaves it alone
//! ([`InExportHook`]).

use core::ffi::{c_char, c_int, c_uint, c_void};
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::sync::OnceLock;

use cuda_abi::nvtx::{
    nvtxDomainHandle_t, nvtxEventAttributes_t, nvtxRangeId_t, nvtxStringHandle_t, wchar_t,
    NVTX_NO_PUSH_POP_TRACKING,
};

use crate::hooks::nvtx::{attr_message, marked, popped, pushed, DEFAULT_DOMAIN};
use crate::hooks::{c_string, wide_string};
use crate::mode;

/// `NvtxExportTableID`'s `NVTX_ETID_CALLBACKS` (`nvtxTypes.h`).
const NVTX_ETID_CALLBACKS: u32 = 1;
/// `NvtxCallbackModule`'s `NVTX_CB_MODULE_CORE`: the v2 core API.
const NVTX_CB_MODULE_CORE: c_int = 1;
/// `NvtxCallbackModule`'s `NVTX_CB_MODULE_CORE2`: the domain API.
const NVTX_CB_MODULE_CORE2: c_int = 5;

// `NvtxCallbackIdCore` (`nvtxTypes.h`).
const NVTX_CBID_CORE_MARK_EX: usize = 1;
const NVTX_CBID_CORE_MARK_A: usize = 2;
const NVTX_CBID_CORE_MARK_W: usize = 3;
const NVTX_CBID_CORE_RANGE_START_EX: usize = 4;
const NVTX_CBID_CORE_RANGE_START_A: usize = 5;
const NVTX_CBID_CORE_RANGE_START_W: usize = 6;
const NVTX_CBID_CORE_RANGE_PUSH_EX: usize = 8;
const NVTX_CBID_CORE_RANGE_PUSH_A: usize = 9;
const NVTX_CBID_CORE_RANGE_PUSH_W: usize = 10;
const NVTX_CBID_CORE_RANGE_POP: usize = 11;
// `NvtxCallbackIdCore2` (`nvtxTypes.h`).
const NVTX_CBID_CORE2_DOMAIN_MARK_EX: usize = 1;
const NVTX_CBID_CORE2_DOMAIN_RANGE_START_EX: usize = 2;
const NVTX_CBID_CORE2_DOMAIN_RANGE_PUSH_EX: usize = 4;
const NVTX_CBID_CORE2_DOMAIN_RANGE_POP: usize = 5;
const NVTX_CBID_CORE2_DOMAIN_REGISTER_STRING_A: usize = 10;
const NVTX_CBID_CORE2_DOMAIN_REGISTER_STRING_W: usize = 11;
const NVTX_CBID_CORE2_DOMAIN_CREATE_A: usize = 12;
const NVTX_CBID_CORE2_DOMAIN_CREATE_W: usize = 13;

/// `NvtxFunctionPointer`: an uncallable function pointer, cast to the slot's own type.
type FunctionPointer = Option<unsafe extern "C" fn()>;

/// `NvtxFunctionTable`: an array of pointers to a module's function-pointer slots.
type FunctionTable = *mut *mut FunctionPointer;

/// `NvtxGetExportTableFunc_t`.
type GetExportTable = Option<unsafe extern "C" fn(export_table_id: u32) -> *const c_void>;

/// `struct NvtxExportTableCallbacks` (`nvtxTypes.h`).
#[repr(C)]
struct ExportTableCallbacks {
    struct_size: usize,
    get_module_function_table: Option<
        unsafe extern "C" fn(
            module: c_int,
            out_table: *mut FunctionTable,
            out_size: *mut c_uint,
        ) -> c_int,
    >,
}

/// Modules (each library or program compiled with NVTX 3, and v2 libraries) that handed
/// ttrace their tables.
static MODULES: AtomicU32 = AtomicU32::new(0);

thread_local! {
    static IN_EXPORT_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as inside an interposed NVTX v2 export while it calls the real
/// one, so that the real library's call of ttrace's table entries is not counted twice.
pub(crate) struct InExportHook(bool);

impl InExportHook {
    /// Enters (restored when dropped: a nested call keeps the outer mark).
    pub(crate) fn enter() -> InExportHook {
        InExportHook(IN_EXPORT_HOOK.try_with(|c| c.replace(true)).unwrap_or(true))
    }
}

impl Drop for InExportHook {
    fn drop(&mut self) {
        let _ = IN_EXPORT_HOOK.try_with(|c| c.set(self.0));
    }
}

/// The environment variable that names the tool `NVTX_INJECTION64_PATH` named before this
/// library took its place (lib.rs): that tool is loaded here and chained. Not a `TTRACE_*`
/// name: those are capture settings, which `ttrace run` does not pass on from its own
/// environment, and this one must reach every process of the tree.
pub(crate) const NEXT_TOOL_VAR: &str = "NVTX_TOOL_BEFORE_TTRACE";

/// Module indices into [`NEXT`]: the core module and the domain module.
const CORE: usize = 0;
const CORE2: usize = 1;
/// Slots of a module (ids below NVTX's `NVTX_CBID_CORE_SIZE` / `NVTX_CBID_CORE2_SIZE`, both 16).
const IDS: usize = 16;

/// The chained tool's function in each slot ttrace takes, by module and id (0: none): what it
/// wrote there before ttrace wrote its own. The same for every module (a tool's functions are
/// its own, whichever module hands it its tables).
static NEXT: [[AtomicUsize; IDS]; 2] = [
    [const { AtomicUsize::new(0) }; IDS],
    [const { AtomicUsize::new(0) }; IDS],
];

/// The chained tool's function for slot `id` of `module`, as the slot's type `F`.
///
/// # Safety
/// `F` is the NVTX function pointer type of that slot.
unsafe fn next<F: Copy>(module: usize, id: usize) -> Option<F> {
    const { assert!(core::mem::size_of::<F>() == core::mem::size_of::<usize>()) };
    let f = NEXT[module][id].load(Ordering::Acquire);
    // SAFETY: a non-zero value is the address the chained tool wrote into a slot of type `F`
    // (the contract): a function pointer of that type.
    (f != 0).then(|| unsafe { core::mem::transmute_copy::<usize, F>(&f) })
}

/// `NvtxInitializeInjectionNvtxFunc_t`.
type InitializeInjection = unsafe extern "C" fn(GetExportTable) -> c_int;

/// The chained tool's init function: the library [`NEXT_TOOL_VAR`] names, loaded once (not
/// this library itself, and none when it cannot be loaded: as NVTX without ttrace, which
/// would not have loaded it either).
fn next_tool() -> Option<InitializeInjection> {
    static NEXT_TOOL: OnceLock<Option<usize>> = OnceLock::new();
    let f = *NEXT_TOOL.get_or_init(|| {
        let path = std::env::var_os(NEXT_TOOL_VAR)?;
        let canonical = std::fs::canonicalize(&path).ok();
        if canonical.is_some() && canonical == crate::own_path() {
            return None;
        }
        let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()))
            .ok()?;
        // SAFETY: dlopen with a NUL-terminated path, as NVTX's loader would have.
        let lib = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY) };
        if lib.is_null() {
            crate::log::warn(&format!(
                "the NVTX tool {} (NVTX_INJECTION64_PATH before ttrace) cannot be loaded",
                path.to_string_lossy()
            ));
            return None;
        }
        // SAFETY: a lookup in that library by a NUL-terminated name.
        let init = unsafe { crate::dlsym::real(lib, c"InitializeInjectionNvtx2".as_ptr()) };
        (!init.is_null()).then_some(init as usize)
    });
    // SAFETY: the address of the tool's `InitializeInjectionNvtx2`, of NVTX's documented type.
    f.map(|f| unsafe { core::mem::transmute::<usize, InitializeInjection>(f) })
}

/// Runs `note` for a table entry the program called directly (not from within an interposed
/// v2 export) while NVTX is tracked.
fn from_table(note: impl FnOnce()) {
    if IN_EXPORT_HOOK.try_with(Cell::get).unwrap_or(true) || mode::off(mode::NVTX) {
        return;
    }
    note();
}

/// Calls the chained tool's function for slot `$id` of `$module` (type `$ty`) with `$args`,
/// or evaluates `$none` when no tool is chained there.
macro_rules! chained {
    ($module:expr, $id:expr, $ty:ty, ($($arg:expr),*), $none:expr) => {
        // SAFETY: `$ty` is the slot's NVTX type; the program's arguments, forwarded unchanged.
        match unsafe { next::<$ty>($module, $id) } {
            // SAFETY: the chained tool's function, of the slot's type.
            Some(f) => unsafe { f($($arg),*) },
            None => $none,
        }
    };
}

type Msg = unsafe extern "C" fn(*const c_char) -> c_int;
type Wide = unsafe extern "C" fn(*const wchar_t) -> c_int;
type Attr = unsafe extern "C" fn(*const nvtxEventAttributes_t) -> c_int;
type Pop = unsafe extern "C" fn() -> c_int;
type MarkMsg = unsafe extern "C" fn(*const c_char);
type MarkWide = unsafe extern "C" fn(*const wchar_t);
type MarkAttr = unsafe extern "C" fn(*const nvtxEventAttributes_t);
type DomainMark = unsafe extern "C" fn(nvtxDomainHandle_t, *const nvtxEventAttributes_t);
type StartMsg = unsafe extern "C" fn(*const c_char) -> nvtxRangeId_t;
type StartWide = unsafe extern "C" fn(*const wchar_t) -> nvtxRangeId_t;
type StartAttr = unsafe extern "C" fn(*const nvtxEventAttributes_t) -> nvtxRangeId_t;
type DomainStart =
    unsafe extern "C" fn(nvtxDomainHandle_t, *const nvtxEventAttributes_t) -> nvtxRangeId_t;
type DomainPush = unsafe extern "C" fn(nvtxDomainHandle_t, *const nvtxEventAttributes_t) -> c_int;
type DomainPop = unsafe extern "C" fn(nvtxDomainHandle_t) -> c_int;
type RegisterMsg = unsafe extern "C" fn(nvtxDomainHandle_t, *const c_char) -> nvtxStringHandle_t;
type RegisterWide = unsafe extern "C" fn(nvtxDomainHandle_t, *const wchar_t) -> nvtxStringHandle_t;
type CreateMsg = unsafe extern "C" fn(*const c_char) -> nvtxDomainHandle_t;
type CreateWide = unsafe extern "C" fn(*const wchar_t) -> nvtxDomainHandle_t;

const NO_TRACKING: c_int = NVTX_NO_PUSH_POP_TRACKING;

/// One slot ttrace takes: `name(C parameters) -> return type` for slot `id` of `module`, which
/// notes `note` when the program called it directly, then calls the chained tool's function
/// for the slot (returning its answer), else returns `none`.
macro_rules! tool_entry {
    ($name:ident ( $($a:ident : $t:ty),* ) $(-> $r:ty)?, $module:ident[$id:ident] else $none:expr
        => $note:expr) => {
        unsafe extern "C" fn $name($($a: $t),*) $(-> $r)? {
            from_table(|| $note);
            chained!($module, $id, unsafe extern "C" fn($($t),*) $(-> $r)?, ($($a),*), $none)
        }
    };
}

tool_entry!(range_push_a(message: *const c_char) -> c_int,
    CORE[NVTX_CBID_CORE_RANGE_PUSH_A] else NO_TRACKING
    // SAFETY: the program's message, NUL-terminated as NVTX requires.
    => pushed(DEFAULT_DOMAIN, || unsafe { c_string(message) }));
tool_entry!(range_push_w(message: *const wchar_t) -> c_int,
    CORE[NVTX_CBID_CORE_RANGE_PUSH_W] else NO_TRACKING
    // SAFETY: the program's message, NUL-terminated as NVTX requires.
    => pushed(DEFAULT_DOMAIN, || unsafe { wide_string(message) }));
tool_entry!(range_push_ex(attrib: *const nvtxEventAttributes_t) -> c_int,
    CORE[NVTX_CBID_CORE_RANGE_PUSH_EX] else NO_TRACKING
    // SAFETY: the program's attribute structure.
    => pushed(DEFAULT_DOMAIN, || unsafe { attr_message(attrib) }));
tool_entry!(range_pop() -> c_int, CORE[NVTX_CBID_CORE_RANGE_POP] else NO_TRACKING
    => popped(DEFAULT_DOMAIN));
tool_entry!(mark_a(message: *const c_char), CORE[NVTX_CBID_CORE_MARK_A] else ()
    // SAFETY: the program's message, NUL-terminated as NVTX requires.
    => marked(|| unsafe { c_string(message) }));
tool_entry!(mark_w(message: *const wchar_t), CORE[NVTX_CBID_CORE_MARK_W] else ()
    // SAFETY: the program's message, NUL-terminated as NVTX requires.
    => marked(|| unsafe { wide_string(message) }));
tool_entry!(mark_ex(attrib: *const nvtxEventAttributes_t), CORE[NVTX_CBID_CORE_MARK_EX] else ()
    // SAFETY: the program's attribute structure.
    => marked(|| unsafe { attr_message(attrib) }));
tool_entry!(domain_mark_ex(domain: nvtxDomainHandle_t, attrib: *const nvtxEventAttributes_t),
    CORE2[NVTX_CBID_CORE2_DOMAIN_MARK_EX] else ()
    // SAFETY: the program's attribute structure.
    => marked(|| unsafe { attr_message(attrib) }));
// Start/end ranges are not kept (not nested, and they may end on another thread); a range
// started under the rule's name is a step mark, as with the v2 hooks. Without a tool NVTX
// returns range id 0.
tool_entry!(range_start_a(message: *const c_char) -> nvtxRangeId_t,
    CORE[NVTX_CBID_CORE_RANGE_START_A] else 0
    // SAFETY: the program's message, NUL-terminated as NVTX requires.
    => marked(|| unsafe { c_string(message) }));
tool_entry!(range_start_w(message: *const wchar_t) -> nvtxRangeId_t,
    CORE[NVTX_CBID_CORE_RANGE_START_W] else 0
    // SAFETY: the program's message, NUL-terminated as NVTX requires.
    => marked(|| unsafe { wide_string(message) }));
tool_entry!(range_start_ex(attrib: *const nvtxEventAttributes_t) -> nvtxRangeId_t,
    CORE[NVTX_CBID_CORE_RANGE_START_EX] else 0
    // SAFETY: the program's attribute structure.
    => marked(|| unsafe { attr_message(attrib) }));
tool_entry!(domain_range_start_ex(domain: nvtxDomainHandle_t, attrib: *const nvtxEventAttributes_t)
    -> nvtxRangeId_t, CORE2[NVTX_CBID_CORE2_DOMAIN_RANGE_START_EX] else 0
    // SAFETY: the program's attribute structure.
    => marked(|| unsafe { attr_message(attrib) }));
// Each domain's ranges are a stack of their own, as with the v2 hooks.
tool_entry!(domain_range_push_ex(domain: nvtxDomainHandle_t, attrib: *const nvtxEventAttributes_t)
    -> c_int, CORE2[NVTX_CBID_CORE2_DOMAIN_RANGE_PUSH_EX] else NO_TRACKING
    // SAFETY: the program's attribute structure.
    => pushed(domain, || unsafe { attr_message(attrib) }));
tool_entry!(domain_range_pop(domain: nvtxDomainHandle_t) -> c_int,
    CORE2[NVTX_CBID_CORE2_DOMAIN_RANGE_POP] else NO_TRACKING => popped(domain));

/// Strings registered through ttrace's table entries, by the handle handed out for each (a
/// range whose message is a registered string names it by its handle).
static REGISTERED: Mutex<Option<HashMap<usize, String>>> = Mutex::new(None);

/// Handles (strings, domains) ttrace hands out itself, counted (never null; scaled to look
/// like aligned pointers, never dereferenced).
static OWN_HANDLES: AtomicUsize = AtomicUsize::new(0);

/// A handle of ttrace's own (never null).
fn own_handle() -> usize {
    (OWN_HANDLES.fetch_add(1, Ordering::Relaxed) + 1) * 16
}

/// Registers the program's string `text` under the chained tool's handle `theirs` when it gave
/// one, else under a handle of ttrace's own, and returns that handle (null only when the
/// registration failed: NVTX's answer without a tool).
fn register(theirs: nvtxStringHandle_t, text: impl FnOnce() -> String) -> nvtxStringHandle_t {
    crate::catch(|| {
        let handle = if theirs.is_null() {
            own_handle()
        } else {
            theirs as usize
        };
        let mut reg = REGISTERED.lock().unwrap_or_else(|p| p.into_inner());
        reg.get_or_insert_with(HashMap::new).insert(handle, text());
        handle as nvtxStringHandle_t
    })
    .unwrap_or(core::ptr::null_mut())
}

/// The text of a string registered through ttrace's table entries, if `handle` is one of theirs
/// (a handle from the v2 library's own registry, with no tool attached, is not).
pub(crate) fn registered(handle: nvtxStringHandle_t) -> Option<String> {
    let reg = REGISTERED.lock().unwrap_or_else(|p| p.into_inner());
    reg.as_ref()?.get(&(handle as usize)).cloned()
}

/// A domain handle: the chained tool's when it gave one, else one of ttrace's own. Without a
/// tool NVTX hands out null, the default domain, for every domain, and each domain's ranges
/// must be a stack of their own (`thread.rs`): CCCL's ranges around CUB algorithms, in domain
/// `CCCL`, must not close the program's.
fn domain_handle(theirs: nvtxDomainHandle_t) -> nvtxDomainHandle_t {
    if theirs.is_null() {
        own_handle() as nvtxDomainHandle_t
    } else {
        theirs
    }
}

/// A slot that hands out a handle: `name(C parameters) -> handle type` for slot `id` of the
/// domain module, which asks the chained tool first (`theirs`: its handle, or null) and
/// returns `make`.
macro_rules! handle_entry {
    ($name:ident ( $($a:ident : $t:ty),* ) -> $r:ty, $id:ident, $theirs:ident => $make:expr) => {
        unsafe extern "C" fn $name($($a: $t),*) -> $r {
            let $theirs = chained!(
                CORE2,
                $id,
                unsafe extern "C" fn($($t),*) -> $r,
                ($($a),*),
                core::ptr::null_mut()
            );
            $make
        }
    };
}

handle_entry!(domain_register_string_a(domain: nvtxDomainHandle_t, string: *const c_char)
    -> nvtxStringHandle_t, NVTX_CBID_CORE2_DOMAIN_REGISTER_STRING_A, theirs
    // SAFETY: the program's string, NUL-terminated as NVTX requires.
    => register(theirs, || unsafe { c_string(string) }));
handle_entry!(domain_register_string_w(domain: nvtxDomainHandle_t, string: *const wchar_t)
    -> nvtxStringHandle_t, NVTX_CBID_CORE2_DOMAIN_REGISTER_STRING_W, theirs
    // SAFETY: the program's string, NUL-terminated as NVTX requires.
    => register(theirs, || unsafe { wide_string(string) }));
handle_entry!(domain_create_a(name: *const c_char) -> nvtxDomainHandle_t,
    NVTX_CBID_CORE2_DOMAIN_CREATE_A, theirs => domain_handle(theirs));
handle_entry!(domain_create_w(name: *const wchar_t) -> nvtxDomainHandle_t,
    NVTX_CBID_CORE2_DOMAIN_CREATE_W, theirs => domain_handle(theirs));

/// A function pointer `f` as the table's uncallable pointer type.
///
/// # Safety
/// `F` is a function pointer type: the one NVTX calls the slot through.
unsafe fn erased<F: Copy>(f: F) -> FunctionPointer {
    const { assert!(core::mem::size_of::<F>() == core::mem::size_of::<unsafe extern "C" fn()>()) };
    // SAFETY: `F` is a function pointer (the contract), of a function pointer's size (checked
    // at compile time): only the pointer's type changes.
    Some(unsafe { core::mem::transmute_copy::<F, unsafe extern "C" fn()>(&f) })
}

/// The slots ttrace fills in one module.
struct ModuleSlots {
    /// NVTX's module number.
    module: c_int,
    /// Its index into [`NEXT`].
    index: usize,
    /// (callback id, ttrace's function).
    entries: Vec<(usize, FunctionPointer)>,
}

/// The slots ttrace fills, by module.
fn slots() -> [ModuleSlots; 2] {
    /// A slot's id and ttrace's function for it, of the slot's own type.
    macro_rules! entry {
        ($id:expr, $f:expr, $ty:ty) => {
            (
                $id,
                // SAFETY: `$ty` is the slot's NVTX function pointer type.
                unsafe { erased::<$ty>($f) },
            )
        };
    }
    [
        ModuleSlots {
            module: NVTX_CB_MODULE_CORE,
            index: CORE,
            entries: vec![
                entry!(NVTX_CBID_CORE_RANGE_PUSH_A, range_push_a, Msg),
                entry!(NVTX_CBID_CORE_RANGE_PUSH_W, range_push_w, Wide),
                entry!(NVTX_CBID_CORE_RANGE_PUSH_EX, range_push_ex, Attr),
                entry!(NVTX_CBID_CORE_RANGE_POP, range_pop, Pop),
                entry!(NVTX_CBID_CORE_MARK_A, mark_a, MarkMsg),
                entry!(NVTX_CBID_CORE_MARK_W, mark_w, MarkWide),
                entry!(NVTX_CBID_CORE_MARK_EX, mark_ex, MarkAttr),
                entry!(NVTX_CBID_CORE_RANGE_START_A, range_start_a, StartMsg),
                entry!(NVTX_CBID_CORE_RANGE_START_W, range_start_w, StartWide),
                entry!(NVTX_CBID_CORE_RANGE_START_EX, range_start_ex, StartAttr),
            ],
        },
        ModuleSlots {
            module: NVTX_CB_MODULE_CORE2,
            index: CORE2,
            entries: vec![
                entry!(
                    NVTX_CBID_CORE2_DOMAIN_RANGE_PUSH_EX,
                    domain_range_push_ex,
                    DomainPush
                ),
                entry!(
                    NVTX_CBID_CORE2_DOMAIN_RANGE_POP,
                    domain_range_pop,
                    DomainPop
                ),
                entry!(NVTX_CBID_CORE2_DOMAIN_MARK_EX, domain_mark_ex, DomainMark),
                entry!(
                    NVTX_CBID_CORE2_DOMAIN_RANGE_START_EX,
                    domain_range_start_ex,
                    DomainStart
                ),
                entry!(
                    NVTX_CBID_CORE2_DOMAIN_REGISTER_STRING_A,
                    domain_register_string_a,
                    RegisterMsg
                ),
                entry!(
                    NVTX_CBID_CORE2_DOMAIN_REGISTER_STRING_W,
                    domain_register_string_w,
                    RegisterWide
                ),
                entry!(NVTX_CBID_CORE2_DOMAIN_CREATE_A, domain_create_a, CreateMsg),
                entry!(NVTX_CBID_CORE2_DOMAIN_CREATE_W, domain_create_w, CreateWide),
            ],
        },
    ]
}

/// Whether this copy of libttrace.so is the one the process resolves its symbols to (it was
/// preloaded). A process that only inherited `NVTX_INJECTION64_PATH` (a child started
/// without `LD_PRELOAD`) loads it privately for NVTX alone: there it fills nothing, and NVTX
/// runs as without a tool.
fn preloaded() -> bool {
    // The program's global scope (dlopen(NULL)), where preloaded libraries are: a lookup with
    // RTLD_DEFAULT from here would search this library's own scope too, and always find it.
    // SAFETY: dlopen(NULL) only returns the main program's handle.
    let global = unsafe { libc::dlopen(core::ptr::null(), libc::RTLD_LAZY) };
    if global.is_null() {
        return false;
    }
    // A name only this library exports (its C API). Not `InitializeInjectionNvtx2`: another
    // tool preloaded may export it too, and this library's own references to its exported
    // names bind to the first definition in the global scope (it is not linked
    // -Bsymbolic), so the comparison would hold wherever that tool is preloaded.
    // SAFETY: a lookup in that scope by a NUL-terminated name.
    let found = unsafe { crate::dlsym::real(global, c"ttrace_step".as_ptr()) };
    // SAFETY: the handle dlopen(NULL) returned above, closed once.
    unsafe { libc::dlclose(global) };
    std::ptr::eq(
        found.cast_const().cast(),
        crate::hooks::api::ttrace_step as *const (),
    )
}

/// NVTX's tool entry point (`NvtxInitializeInjectionNvtxFunc_t`), called once by each module
/// that loads ttrace through `NVTX_INJECTION64_PATH`: lets the tool that variable named before
/// ttrace (a profiler: [`NEXT_TOOL_VAR`]) fill the module's slots first, then takes the push,
/// pop, mark and string-registration slots, its functions calling the other tool's. Returns 1,
/// or the other tool's answer where NVTX is not to be tracked (capture off with `TTRACE=0`,
/// or this library not preloaded: then it takes no slot, and without another tool NVTX makes
/// every call a no-op, as without a tool; accepting keeps NVTX from unloading a library that
/// registered fork handlers and thread-locals). 0 only for tables it cannot read.
///
/// # Safety
/// `get_export_table` is NVTX's export-table function for the calling module.
#[no_mangle]
pub unsafe extern "C" fn InitializeInjectionNvtx2(get_export_table: GetExportTable) -> c_int {
    let Some(get) = get_export_table else {
        return 0;
    };
    let other = next_tool();
    if !preloaded() || !mode::enabled() || mode::off(mode::NVTX) {
        // SAFETY: the other tool's init function, with NVTX's own argument.
        return other.map_or(1, |init| unsafe { init(get_export_table) });
    }
    // SAFETY: NVTX's own function, with a table id it defines.
    let table = unsafe { get(NVTX_ETID_CALLBACKS) }.cast::<ExportTableCallbacks>();
    if table.is_null() {
        return 0;
    }
    // SAFETY: NVTX hands out its callbacks table, which starts with its own size.
    let size = unsafe { (*table).struct_size };
    if size < core::mem::size_of::<ExportTableCallbacks>() {
        return 0;
    }
    // SAFETY: the table is at least as large as the structure (checked just above).
    let Some(module_table) = (unsafe { (*table).get_module_function_table }) else {
        return 0;
    };
    /// A slot ttrace takes, with what it held before any tool wrote to it.
    struct Taken {
        slot: *mut FunctionPointer,
        index: usize,
        id: usize,
        before: usize,
        ours: FunctionPointer,
    }
    let read = |slot: *mut FunctionPointer| {
        // SAFETY: a non-null slot NVTX handed out: a function pointer, readable as an address.
        unsafe { *slot.cast::<usize>() }
    };
    let mut taken: Vec<Taken> = Vec::new();
    for m in slots() {
        let (mut slots, mut count): (FunctionTable, c_uint) = (core::ptr::null_mut(), 0);
        // SAFETY: NVTX's function, with a module it defines and two out-parameters.
        if unsafe { module_table(m.module, &mut slots, &mut count) } == 0 || slots.is_null() {
            continue;
        }
        for (id, ours) in m.entries {
            // `count` is the number of callback ids the module knows (its table holds one
            // more entry, a null, at the end); an older NVTX may know fewer.
            if id >= count as usize || id >= IDS {
                continue;
            }
            // SAFETY: `id` is within the module's table (checked above); each entry points to
            // the module's function-pointer slot for that id, or is null.
            let slot = unsafe { *slots.add(id) };
            if !slot.is_null() {
                let before = read(slot);
                taken.push(Taken {
                    slot,
                    index: m.index,
                    id,
                    before,
                    ours,
                });
            }
        }
    }
    if let Some(init) = other {
        // SAFETY: the other tool's init function, with NVTX's own argument.
        if unsafe { init(get_export_table) } == 0 {
            // It declined: as NVTX would, nothing of it stays in the slots ttrace takes.
            for t in &taken {
                // SAFETY: the slot is NVTX's, handed to the tools to write during this call.
                unsafe { *t.slot.cast::<usize>() = t.before };
            }
        }
    }
    for t in &taken {
        let now = read(t.slot);
        if now != 0 && now != t.before {
            // The first module's wins (a tool's functions are the same for every module).
            let _ =
                NEXT[t.index][t.id].compare_exchange(0, now, Ordering::AcqRel, Ordering::Relaxed);
        }
        // SAFETY: the slot is NVTX's, handed to the tools to write during this call.
        unsafe { *t.slot = t.ours };
    }
    if taken.is_empty() {
        return 1;
    }
    let n = MODULES.fetch_add(1, Ordering::Relaxed) + 1;
    crate::log::debug(&format!(
        "NVTX 3 tool interface: a module handed its tables over ({n} so far)"
    ));
    1
}
