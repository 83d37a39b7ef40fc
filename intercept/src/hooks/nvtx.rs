//! NVTX hooks: a per-thread stack of open ranges (recorded with every op as `nvtx`) and step
//! marks for `TTRACE_STEP_RULE=nvtx:NAME` (a range push or mark with that name), from the
//! NVTX v2 library's exports interposed here, and from NVTX 3's tool interface
//! ([`crate::nvtx_tool`]).

use core::ffi::{c_char, c_int};
use std::collections::HashMap;
use std::sync::Mutex;

use cuda_abi::nvtx::*;
use ttrace_proto::config::StepRule;

use crate::tracer;
use crate::{mode, real, session, thread};

/// The default domain (the core API's ranges, and a null domain handle's).
pub(crate) const DEFAULT_DOMAIN: nvtxDomainHandle_t = core::ptr::null_mut();

/// `NVTX_NO_PUSH_POP_TRACKING`: what a push or pop returns when the real library is missing.
const MISSING: c_int = NVTX_NO_PUSH_POP_TRACKING;

/// The message of an event attribute structure.
///
/// # Safety
/// `a` is null or a valid `nvtxEventAttributes_t` whose message matches its type.
pub(crate) unsafe fn attr_message(a: *const nvtxEventAttributes_t) -> String {
    if a.is_null() {
        return String::new();
    }
    // SAFETY: per the contract.
    let a = unsafe { &*a };
    match a.messageType as u32 {
        // SAFETY: the message is an ASCII string for this type.
        NVTX_MESSAGE_TYPE_ASCII => unsafe { super::c_string(a.message.ascii) },
        // SAFETY: the message is a wide string for this type.
        NVTX_MESSAGE_TYPE_UNICODE => unsafe { super::wide_string(a.message.unicode) },
        NVTX_MESSAGE_TYPE_REGISTERED => {
            // SAFETY: the message is a string handle for this type.
            let handle = unsafe { a.message.registered };
            crate::nvtx_tool::registered(handle).unwrap_or_else(|| "<registered string>".into())
        }
        _ => String::new(),
    }
}

/// Under `nvtx:NAME`, the other names seen until NAME came, with their counts and the fewest
/// ranges open around them (at most [`SEEN_MAX`] names): what the warning at exit names when
/// NAME never came (a misspelt NAME, a range named otherwise).
static SEEN: Mutex<Option<HashMap<String, Seen>>> = Mutex::new(None);

#[derive(Clone, Copy)]
struct Seen {
    count: u64,
    depth: usize,
}
const SEEN_MAX: usize = 64;

/// NAME, under the `nvtx:NAME` step rule.
fn rule_name() -> Option<&'static str> {
    match &mode::config()?.step_rule {
        StepRule::Nvtx(n) => Some(n),
        _ => None,
    }
}

/// A step mark when `name` is `rule`'s NAME: pushed once a session runs (before it, no step
/// has records), noted as seen either way (a one-step run's only mark may come before its
/// first CUDA call). Until NAME came, the other names are kept for the warning at exit.
fn maybe_mark(rule: &str, name: &str) {
    if rule == name {
        tracer::note_rule_mark();
        if let Some(s) = session::current() {
            tracer::push_mark(s.cfg, false, Some(name.to_string()));
        }
    } else if !tracer::rule_marked() {
        note_seen(name);
    }
}

fn note_seen(name: &str) {
    // Ranges open around it (for a push, before it opens).
    let depth = thread::with(|t| t.range_depth()).unwrap_or(0);
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    let seen = seen.get_or_insert_with(HashMap::new);
    if let Some(s) = seen.get_mut(name) {
        s.count += 1;
        s.depth = s.depth.min(depth);
    } else if seen.len() < SEEN_MAX {
        seen.insert(name.to_string(), Seen { count: 1, depth });
    }
}

/// The NVTX names seen before the `nvtx:NAME` rule's own (all of them when it never came),
/// with their counts: outermost first (a step's range is usually opened around everything
/// else, once a step), then most frequent first, then by name.
pub(crate) fn names_seen() -> Vec<(String, u64)> {
    let seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    let mut names: Vec<(&String, Seen)> = seen.iter().flatten().map(|(n, s)| (n, *s)).collect();
    names.sort_by_key(|&(n, s)| (s.depth, std::cmp::Reverse(s.count), n));
    names
        .into_iter()
        .map(|(n, s)| (n.clone(), s.count))
        .collect()
}

/// A range pushed in `domain` (its handle; the core API's and a null handle are the default
/// domain, 0).
pub(crate) fn pushed(domain: nvtxDomainHandle_t, name: impl FnOnce() -> String) {
    let Some(_g) = thread::Guard::enter() else {
        return;
    };
    let _ = crate::catch(|| {
        let name = name();
        if let Some(rule) = rule_name() {
            maybe_mark(rule, &name);
        }
        thread::with(|t| t.push_range(domain as usize, name));
    });
}

/// A range of `domain` popped.
pub(crate) fn popped(domain: nvtxDomainHandle_t) {
    let Some(_g) = thread::Guard::enter() else {
        return;
    };
    let _ = crate::catch(|| thread::with(|t| t.pop_range(domain as usize)));
}

/// A mark or a start/end range named `name`: a step mark under `nvtx:NAME`, and nothing under
/// the other rules (not even the name's text: such calls keep no stack).
pub(crate) fn marked(name: impl FnOnce() -> String) {
    let Some(_g) = thread::Guard::enter() else {
        return;
    };
    let _ = crate::catch(|| {
        if let Some(rule) = rule_name() {
            maybe_mark(rule, &name());
        }
    });
}

/// One NVTX entry point: `name(C signature) -> return type, else what to return without the
/// real library => what to note while NVTX is on` (no `-> ...` for a `void` function). The
/// real function, looked up under the hook's name, is called exactly once with the program's
/// arguments.
macro_rules! nvtx_hook {
    ($(#[$m:meta])* $name:ident ( $($a:ident : $t:ty),* $(,)? )
        $(-> $r:ty, else $missing:expr)? => $note:expr) => {
        $(#[$m])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) $(-> $r)? {
            let Some(real) = real::real_of!($name, fn($($t),*) $(-> $r)?, Nvtx) else {
                return $($missing)?;
            };
            if mode::off(mode::NVTX) {
                // SAFETY: the program's arguments, forwarded unchanged.
                return unsafe { real($($a),*) };
            }
            $note;
            // The real library may call ttrace's NVTX 3 table entries in turn (it loads
            // tools the same way): noted once, here.
            let _inside = crate::nvtx_tool::InExportHook::enter();
            // SAFETY: the program's arguments, forwarded unchanged.
            unsafe { real($($a),*) }
        }
    };
}

nvtx_hook! {
    /// `int nvtxRangePushA(const char* message)`.
    nvtxRangePushA(message: *const c_char) -> c_int, else MISSING
    // SAFETY: the program's message, NUL-terminated as NVTX requires.
    => pushed(DEFAULT_DOMAIN, || unsafe { super::c_string(message) })
}

nvtx_hook! {
    /// `int nvtxRangePushW(const wchar_t* message)`.
    nvtxRangePushW(message: *const wchar_t) -> c_int, else MISSING
    // SAFETY: the program's message, NUL-terminated as NVTX requires.
    => pushed(DEFAULT_DOMAIN, || unsafe { super::wide_string(message) })
}

nvtx_hook! {
    /// `int nvtxRangePushEx(const nvtxEventAttributes_t* eventAttrib)`.
    nvtxRangePushEx(eventAttrib: *const nvtxEventAttributes_t) -> c_int, else MISSING
    // SAFETY: the program's attribute structure.
    => pushed(DEFAULT_DOMAIN, || unsafe { attr_message(eventAttrib) })
}

nvtx_hook! {
    /// `int nvtxRangePop(void)`.
    nvtxRangePop() -> c_int, else MISSING => popped(DEFAULT_DOMAIN)
}

nvtx_hook! {
    /// `int nvtxDomainRangePushEx(nvtxDomainHandle_t domain, const nvtxEventAttributes_t*
    /// eventAttrib)`: in that domain's stack.
    nvtxDomainRangePushEx(
        domain: nvtxDomainHandle_t,
        eventAttrib: *const nvtxEventAttributes_t,
    ) -> c_int, else MISSING
    // SAFETY: the program's attribute structure.
    => pushed(domain, || unsafe { attr_message(eventAttrib) })
}

nvtx_hook! {
    /// `int nvtxDomainRangePop(nvtxDomainHandle_t domain)`.
    nvtxDomainRangePop(domain: nvtxDomainHandle_t) -> c_int, else MISSING => popped(domain)
}

nvtx_hook! {
    /// `void nvtxMarkA(const char* message)`: a step mark under `nvtx:NAME`.
    nvtxMarkA(message: *const c_char)
    // SAFETY: the program's message, NUL-terminated as NVTX requires.
    => marked(|| unsafe { super::c_string(message) })
}

nvtx_hook! {
    /// `void nvtxMarkEx(const nvtxEventAttributes_t* eventAttrib)`.
    nvtxMarkEx(eventAttrib: *const nvtxEventAttributes_t)
    // SAFETY: the program's attribute structure.
    => marked(|| unsafe { attr_message(eventAttrib) })
}

nvtx_hook! {
    /// `void nvtxMarkW(const wchar_t* message)`.
    nvtxMarkW(message: *const wchar_t)
    // SAFETY: the program's message, NUL-terminated as NVTX requires.
    => marked(|| unsafe { super::wide_string(message) })
}

nvtx_hook! {
    /// `void nvtxDomainMarkEx(nvtxDomainHandle_t domain, const nvtxEventAttributes_t*
    /// eventAttrib)`.
    nvtxDomainMarkEx(domain: nvtxDomainHandle_t, eventAttrib: *const nvtxEventAttributes_t)
    // SAFETY: the program's attribute structure.
    => marked(|| unsafe { attr_message(eventAttrib) })
}

// Start/end ranges are not nested (they may end on another thread) and are not kept in the
// thread's stack; a range started under the rule's name is a step mark, as a push is
// (PyTorch's `torch.cuda.nvtx.range_start`).

nvtx_hook! {
    /// `nvtxRangeId_t nvtxRangeStartA(const char* message)`: a step mark under `nvtx:NAME`.
    nvtxRangeStartA(message: *const c_char) -> nvtxRangeId_t, else 0
    // SAFETY: the program's message, NUL-terminated as NVTX requires.
    => marked(|| unsafe { super::c_string(message) })
}

nvtx_hook! {
    /// `nvtxRangeId_t nvtxRangeStartW(const wchar_t* message)`.
    nvtxRangeStartW(message: *const wchar_t) -> nvtxRangeId_t, else 0
    // SAFETY: the program's message, NUL-terminated as NVTX requires.
    => marked(|| unsafe { super::wide_string(message) })
}

nvtx_hook! {
    /// `nvtxRangeId_t nvtxRangeStartEx(const nvtxEventAttributes_t* eventAttrib)`.
    nvtxRangeStartEx(eventAttrib: *const nvtxEventAttributes_t) -> nvtxRangeId_t, else 0
    // SAFETY: the program's attribute structure.
    => marked(|| unsafe { attr_message(eventAttrib) })
}

nvtx_hook! {
    /// `nvtxRangeId_t nvtxDomainRangeStartEx(nvtxDomainHandle_t domain, const
    /// nvtxEventAttributes_t* eventAttrib)`.
    nvtxDomainRangeStartEx(
        domain: nvtxDomainHandle_t,
        eventAttrib: *const nvtxEventAttributes_t,
    ) -> nvtxRangeId_t, else 0
    // SAFETY: the program's attribute structure.
    => marked(|| unsafe { attr_message(eventAttrib) })
}
