//! NVTX hooks: a per-thread stack of open ranges (recorded with every op as `nvtx`) and step
//! marks for `TTRACE_STEP_RULE=nvtx:NAME` (a range push or mark with that name), from the
//! NVTX v2 library's exports interposed here, and from NVTX 3's tool interface
//! ([`crate::nvtx_tool`]).

use core::ffi::{c_char, c_int};

use cuda_abi::nvtx::*;
use ttrace_proto::config::StepRule;

use crate::tracer;
use crate::{mode, real, session, thread};

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

/// A step mark when the rule is `nvtx:NAME` and `name` is NAME (only once a session runs:
/// before it, no step has records).
fn maybe_mark(name: &str) {
    let Some(s) = session::current() else {
        return;
    };
    if matches!(&s.cfg.step_rule, StepRule::Nvtx(n) if n == name) {
        tracer::push_mark(s.cfg, false, Some(name.to_string()));
    }
}

pub(crate) fn pushed(name: impl FnOnce() -> String) {
    let Some(_g) = thread::Guard::enter() else {
        return;
    };
    let _ = crate::catch(|| {
        let name = name();
        maybe_mark(&name);
        thread::with(|t| t.push_range(name));
    });
}

pub(crate) fn popped() {
    let Some(_g) = thread::Guard::enter() else {
        return;
    };
    let _ = crate::catch(|| thread::with(|t| t.pop_range()));
}

pub(crate) fn marked(name: impl FnOnce() -> String) {
    let Some(_g) = thread::Guard::enter() else {
        return;
    };
    let _ = crate::catch(|| maybe_mark(&name()));
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
    => pushed(|| unsafe { super::c_string(message) })
}

nvtx_hook! {
    /// `int nvtxRangePushW(const wchar_t* message)`.
    nvtxRangePushW(message: *const wchar_t) -> c_int, else MISSING
    // SAFETY: the program's message, NUL-terminated as NVTX requires.
    => pushed(|| unsafe { super::wide_string(message) })
}

nvtx_hook! {
    /// `int nvtxRangePushEx(const nvtxEventAttributes_t* eventAttrib)`.
    nvtxRangePushEx(eventAttrib: *const nvtxEventAttributes_t) -> c_int, else MISSING
    // SAFETY: the program's attribute structure.
    => pushed(|| unsafe { attr_message(eventAttrib) })
}

nvtx_hook! {
    /// `int nvtxRangePop(void)`.
    nvtxRangePop() -> c_int, else MISSING => popped()
}

nvtx_hook! {
    /// `int nvtxDomainRangePushEx(nvtxDomainHandle_t domain, const nvtxEventAttributes_t*
    /// eventAttrib)`: domain ranges share the thread's stack.
    nvtxDomainRangePushEx(
        domain: nvtxDomainHandle_t,
        eventAttrib: *const nvtxEventAttributes_t,
    ) -> c_int, else MISSING
    // SAFETY: the program's attribute structure.
    => pushed(|| unsafe { attr_message(eventAttrib) })
}

nvtx_hook! {
    /// `int nvtxDomainRangePop(nvtxDomainHandle_t domain)`.
    nvtxDomainRangePop(domain: nvtxDomainHandle_t) -> c_int, else MISSING => popped()
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
