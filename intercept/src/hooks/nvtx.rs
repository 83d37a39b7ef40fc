//! NVTX hooks: a per-thread stack of open ranges (recorded with every op as `nvtx`) and step
//! marks for `TTRACE_STEP_RULE=nvtx:NAME` (a range push or mark with that name).

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
unsafe fn attr_message(a: *const nvtxEventAttributes_t) -> String {
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
        NVTX_MESSAGE_TYPE_REGISTERED => "<registered string>".into(),
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

fn pushed(name: impl FnOnce() -> String) {
    let Some(_g) = thread::Guard::enter() else {
        return;
    };
    let _ = crate::catch(|| {
        let name = name();
        maybe_mark(&name);
        thread::with(|t| t.nvtx.push(name));
    });
}

fn popped() {
    let Some(_g) = thread::Guard::enter() else {
        return;
    };
    let _ = crate::catch(|| thread::with(|t| t.nvtx.pop()));
}

fn marked(name: impl FnOnce() -> String) {
    let Some(_g) = thread::Guard::enter() else {
        return;
    };
    let _ = crate::catch(|| maybe_mark(&name()));
}

/// `int nvtxRangePushA(const char* message)`.
#[no_mangle]
pub unsafe extern "C" fn nvtxRangePushA(message: *const c_char) -> c_int {
    let Some(real) = real::nvtxRangePushA() else {
        return MISSING;
    };
    if !mode::off(mode::NVTX) {
        // SAFETY: NVTX messages are NUL-terminated.
        pushed(|| unsafe { super::c_string(message) });
    }
    // SAFETY: the program's argument, forwarded unchanged.
    unsafe { real(message) }
}

/// `int nvtxRangePushW(const wchar_t* message)`.
#[no_mangle]
pub unsafe extern "C" fn nvtxRangePushW(message: *const wchar_t) -> c_int {
    let Some(real) = real::nvtxRangePushW() else {
        return MISSING;
    };
    if !mode::off(mode::NVTX) {
        // SAFETY: NVTX messages are NUL-terminated.
        pushed(|| unsafe { super::wide_string(message) });
    }
    // SAFETY: the program's argument, forwarded unchanged.
    unsafe { real(message) }
}

/// `int nvtxRangePushEx(const nvtxEventAttributes_t* eventAttrib)`.
#[no_mangle]
pub unsafe extern "C" fn nvtxRangePushEx(eventAttrib: *const nvtxEventAttributes_t) -> c_int {
    let Some(real) = real::nvtxRangePushEx() else {
        return MISSING;
    };
    if !mode::off(mode::NVTX) {
        // SAFETY: the program's attribute structure.
        pushed(|| unsafe { attr_message(eventAttrib) });
    }
    // SAFETY: the program's argument, forwarded unchanged.
    unsafe { real(eventAttrib) }
}

/// `int nvtxRangePop(void)`.
#[no_mangle]
pub unsafe extern "C" fn nvtxRangePop() -> c_int {
    let Some(real) = real::nvtxRangePop() else {
        return MISSING;
    };
    if !mode::off(mode::NVTX) {
        popped();
    }
    // SAFETY: no arguments.
    unsafe { real() }
}

/// `int nvtxDomainRangePushEx(nvtxDomainHandle_t domain, const nvtxEventAttributes_t*
/// eventAttrib)`: domain ranges share the thread's stack.
#[no_mangle]
pub unsafe extern "C" fn nvtxDomainRangePushEx(
    domain: nvtxDomainHandle_t,
    eventAttrib: *const nvtxEventAttributes_t,
) -> c_int {
    let Some(real) = real::nvtxDomainRangePushEx() else {
        return MISSING;
    };
    if !mode::off(mode::NVTX) {
        // SAFETY: the program's attribute structure.
        pushed(|| unsafe { attr_message(eventAttrib) });
    }
    // SAFETY: the program's arguments, forwarded unchanged.
    unsafe { real(domain, eventAttrib) }
}

/// `int nvtxDomainRangePop(nvtxDomainHandle_t domain)`.
#[no_mangle]
pub unsafe extern "C" fn nvtxDomainRangePop(domain: nvtxDomainHandle_t) -> c_int {
    let Some(real) = real::nvtxDomainRangePop() else {
        return MISSING;
    };
    if !mode::off(mode::NVTX) {
        popped();
    }
    // SAFETY: the program's argument, forwarded unchanged.
    unsafe { real(domain) }
}

/// `void nvtxMarkA(const char* message)`: a step mark under `nvtx:NAME`.
#[no_mangle]
pub unsafe extern "C" fn nvtxMarkA(message: *const c_char) {
    let Some(real) = real::nvtxMarkA() else {
        return;
    };
    if !mode::off(mode::NVTX) {
        // SAFETY: NVTX messages are NUL-terminated.
        marked(|| unsafe { super::c_string(message) });
    }
    // SAFETY: the program's argument, forwarded unchanged.
    unsafe { real(message) }
}

/// `void nvtxMarkEx(const nvtxEventAttributes_t* eventAttrib)`.
#[no_mangle]
pub unsafe extern "C" fn nvtxMarkEx(eventAttrib: *const nvtxEventAttributes_t) {
    let Some(real) = real::nvtxMarkEx() else {
        return;
    };
    if !mode::off(mode::NVTX) {
        // SAFETY: the program's attribute structure.
        marked(|| unsafe { attr_message(eventAttrib) });
    }
    // SAFETY: the program's argument, forwarded unchanged.
    unsafe { real(eventAttrib) }
}
