//! `dlsym`, interposed. A program that loads a CUDA library with `dlopen` and takes its entry
//! points with `dlsym(handle, name)` calls them without passing through the global scope,
//! where `LD_PRELOAD` hooks live: JAX's XLA plugin reaches cuBLAS, cuBLASLt, NCCL and the
//! runtime this way (on an H200 a traced JAX matmul left an empty store), and so does Python's
//! `ctypes`. So libttrace.so exports `dlsym` too:
//! * a lookup with an explicit handle of a name libttrace.so hooks returns the hook, when the
//!   function found is the very one the hook itself calls (the copy of the library the hooks
//!   resolve); a lookup that finds another copy (a second cuBLAS of another version, say)
//!   returns that copy, is said on stderr and becomes one `unsupported` gap naming the library
//!   and the function when a session runs ([`crate::lookups`]);
//! * lookups made by the CUDA libraries themselves (their file name is one the hooks serve, or
//!   the driver's) or by libttrace.so are never redirected: a library's own calls are not the
//!   program's (the simulated libraries find their runtime so, as NVIDIA's link theirs);
//! * `RTLD_NEXT` means "the next object after the caller's", which the real `dlsym` reads from
//!   its return address: the exported `dlsym` is a few instructions without a frame that jump
//!   straight to the real one for `RTLD_NEXT`, so it sees the program's return address, and
//!   hand any other lookup, with the caller's address, to [`lookup`].
//!
//! x86-64 only (the entry is written in its assembly); elsewhere `dlsym` is not interposed and
//! such lookups bypass the hooks.

use core::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::real;

/// The C library's `dlsym` (0 until [`init`] or the first lookup).
static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// Looks the C library's `dlsym` up (with `dlvsym`, which is not interposed). Called when the
/// library loads, before the program can ask for `RTLD_NEXT` through the entry.
pub fn init() {
    let _ = real_dlsym();
}

fn real_dlsym() -> Option<DlsymFn> {
    let mut p = REAL_DLSYM.load(Ordering::Acquire);
    if p == 0 {
        for version in [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"] {
            // SAFETY: dlvsym with RTLD_NEXT and NUL-terminated names; it only looks up.
            let q = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
            if !q.is_null() {
                p = q as usize;
                REAL_DLSYM.store(p, Ordering::Release);
                break;
            }
        }
    }
    // SAFETY: a non-null address of the C library's `dlsym`, of type `DlsymFn`.
    (p != 0).then(|| unsafe { core::mem::transmute::<usize, DlsymFn>(p) })
}

/// The C library's `dlsym`, for libttrace.so's own lookups (never redirected). For
/// `RTLD_NEXT` the caller is libttrace.so, as it would be for a direct call.
///
/// # Safety
/// `name` is NUL-terminated; `handle` is `RTLD_DEFAULT`, `RTLD_NEXT` or a live handle.
pub unsafe fn real(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    match real_dlsym() {
        // SAFETY: per the contract.
        Some(f) => unsafe { f(handle, name) },
        None => core::ptr::null_mut(),
    }
}

#[cfg(target_arch = "x86_64")]
mod entry {
    use super::*;

    /// `void* dlsym(void* handle, const char* symbol)`: `RTLD_NEXT` (`(void*)-1`) goes to the
    /// real one by a jump, which keeps the program's return address on the stack (the real
    /// `dlsym` reads it to know whose next object is meant); anything else to [`lookup`]
    /// with that return address as a third argument.
    ///
    /// # Safety
    /// The C contract of `dlsym`.
    #[unsafe(naked)]
    #[no_mangle]
    pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
        core::arch::naked_asm!(
            "cmp rdi, -1",
            "jne 2f",
            "mov rax, qword ptr [rip + {real}]",
            "test rax, rax",
            "jz 2f",
            "jmp rax",
            "2:",
            "mov rdx, qword ptr [rsp]",
            "jmp {lookup}",
            real = sym REAL_DLSYM,
            lookup = sym lookup,
        )
    }
}

/// Every lookup but an `RTLD_NEXT` one made once the real `dlsym` is known: the real lookup,
/// then the hook in its place where [`redirect`] says so.
///
/// # Safety
/// The C contract of `dlsym`; `caller` is an address in the object that called it.
unsafe extern "C" fn lookup(
    handle: *mut c_void,
    name: *const c_char,
    caller: usize,
) -> *mut c_void {
    // SAFETY: the program's arguments.
    let p = unsafe { real(handle, name) };
    if p.is_null() || name.is_null() || handle.is_null() || handle == libc::RTLD_NEXT {
        return p;
    }
    crate::catch(|| redirect(name, p, caller))
        .flatten()
        .unwrap_or(p)
}

/// The hook to hand out for `name`, found as `p` by a lookup `caller` made (`None`: hand `p`).
fn redirect(name: *const c_char, p: *mut c_void, caller: usize) -> Option<*mut c_void> {
    // SAFETY: a NUL-terminated name the program passed (the real dlsym read it too).
    let name_c = unsafe { CStr::from_ptr(name) };
    let lib = real::Lib::of(name_c.to_str().ok()?)?;
    if real::is_cuda_object(caller) {
        return None;
    }
    crate::lookups::hook_for(&[name_c], lib, p, "dlsym")
}
