//! Flushing before the process dies: on a catchable fatal signal (SIGABRT, SIGSEGV, SIGBUS,
//! SIGFPE, SIGILL, SIGTERM, SIGINT, SIGHUP, SIGQUIT) and on `_exit`/`_Exit`, the tracer first
//! publishes the snapshots already taken (bounded), then the program's own handler runs, or the
//! default action with the same signal: the program's exit status and signal dispositions are
//! what they would have been. What still cannot be published (SIGKILL, a drain out of time) is
//! counted by the daemon from the ring header (`ranks[].unpublished` in the manifest).
//!
//! Handlers are installed when capture starts, chaining whatever the program had installed
//! before; a signal the program ignores is left alone. A handler the program installs later
//! replaces ours (its exit path through `exit` still drains through `atexit`).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use crate::{session, tracer};

/// The signals whose default action ends the process and that a handler can catch.
const SIGNALS: [libc::c_int; 9] = [
    libc::SIGABRT,
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGILL,
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
];

/// How long a dying process lets the tracer publish (a crash should not hang).
const GRACE: Duration = Duration::from_secs(2);

/// The program's actions, by signal, as they were before ours.
static PREVIOUS: OnceLock<Vec<(libc::c_int, libc::sigaction)>> = OnceLock::new();
/// The drain ran (once per process).
static DRAINED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// This thread is the tracer's: a handler running on it cannot wait for the drain.
    static TRACER: Cell<bool> = const { Cell::new(false) };
}

/// Termination requests a process receives as a whole (the kernel picks a thread to run the
/// handler on).
const REQUESTS: [libc::c_int; 4] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT];

/// Called by the tracer thread as it starts. It blocks the termination requests, so that their
/// handler runs on one of the program's threads: run on the tracer's, it would wait for the
/// drain that this very thread has to do, and publish nothing. A fault in the tracer thread
/// itself skips the drain (see [`on_signal`]).
pub fn tracer_thread() {
    TRACER.with(|t| t.set(true));
    // SAFETY: builds a signal set and blocks it for the calling thread only.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in REQUESTS {
            libc::sigaddset(&mut set, sig);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Publishes what was taken, once, if this process owns the session; `dying`: of a signal.
fn drain(dying: bool) {
    // The pid first: a `vfork` child shares this memory and must leave the flag alone.
    if session::current().is_none_or(|s| s.pid != std::process::id()) {
        return;
    }
    if !DRAINED.swap(true, Ordering::AcqRel) {
        if dying {
            tracer::shutdown_dying(GRACE);
        } else {
            tracer::shutdown(GRACE);
        }
    }
}

/// Installs the handlers (once, when capture starts).
pub fn install() {
    let mut previous = Vec::new();
    for sig in SIGNALS {
        // SAFETY: sigaction is plain data: all-zero is a valid value.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: sigaction with a null new action only reads the current one into `old`.
        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } != 0 {
            continue;
        }
        if old.sa_sigaction == libc::SIG_IGN {
            continue;
        }
        // SAFETY: an all-zero sigaction is valid; the fields are set below.
        let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
        new.sa_sigaction = on_signal as *const () as usize;
        // The program's own flags and mask, so that its handler, called from ours, runs as it
        // asked: without SA_RESTART (Python's SIGINT), a blocking call returns EINTR and the
        // program sees the signal at once; with SA_RESTART forced, Ctrl-C would wait for it.
        new.sa_flags = libc::SA_SIGINFO
            | (old.sa_flags & (libc::SA_ONSTACK | libc::SA_RESTART | libc::SA_NODEFER));
        new.sa_mask = old.sa_mask;
        // SAFETY: our handler replaces the action.
        let ok = unsafe { libc::sigaction(sig, &new, std::ptr::null_mut()) == 0 };
        if ok {
            previous.push((sig, old));
        }
    }
    let _ = PREVIOUS.set(previous);
}

/// The handler: drain, then what the program would have done.
extern "C" fn on_signal(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let Some(old) = PREVIOUS
        .get()
        .and_then(|p| p.iter().find(|(s, _)| *s == sig).map(|(_, a)| *a))
    else {
        return;
    };
    let handler = old.sa_sigaction;
    // A fault or an abort ends the process whatever handler the program has (one that prints
    // a stack trace, then dies); a termination request the program handles may be survived
    // (Python's SIGINT is an exception), so capture goes on and its exit path drains.
    let fault = matches!(
        sig,
        libc::SIGSEGV | libc::SIGBUS | libc::SIGFPE | libc::SIGILL | libc::SIGABRT
    );
    // On the tracer thread (a fault of its own) nobody else can drain.
    let on_tracer = TRACER.try_with(Cell::get).unwrap_or(true);
    if (fault || handler == libc::SIG_DFL) && !on_tracer {
        // Best effort from a signal handler: the tracer's locks are only held briefly, and
        // a dying program would lose everything anyway. No panic crosses this frame.
        let _ = std::panic::catch_unwind(|| drain(true));
    }
    if handler == libc::SIG_DFL {
        // SAFETY: restores the default action, then makes sure it happens: a fault returns
        // to the faulting instruction and faults again; a sent signal (kill, raise, abort) is
        // sent again, delivered once this handler returns (it is blocked meanwhile).
        unsafe {
            libc::sigaction(sig, &old, std::ptr::null_mut());
            let sent = info.is_null() || (*info).si_code <= 0;
            if sent {
                libc::raise(sig);
            }
        }
    } else if handler != libc::SIG_IGN {
        // SAFETY: the program's own handler, called as the kernel would have called it.
        unsafe {
            if old.sa_flags & libc::SA_SIGINFO != 0 {
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    std::mem::transmute(handler);
                f(sig, info, ctx);
            } else {
                let f: extern "C" fn(libc::c_int) = std::mem::transmute(handler);
                f(sig);
            }
        }
    }
}

type ExitFn = unsafe extern "C" fn(libc::c_int) -> !;

/// The next definition of `name` (libc's).
fn next_exit(name: &std::ffi::CStr) -> Option<ExitFn> {
    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name; the symbol, if found, is the
    // C library's `void _exit(int)`.
    unsafe {
        let p = libc::dlsym(libc::RTLD_NEXT, name.as_ptr());
        (!p.is_null()).then(|| std::mem::transmute::<*mut libc::c_void, ExitFn>(p))
    }
}

/// Publishes what was taken, then exits with `status` through the C library's `name`
/// (`_exit` or `_Exit`, which do the same), else the raw system call.
fn drain_and_exit(name: &std::ffi::CStr, status: libc::c_int) -> ! {
    let _ = std::panic::catch_unwind(|| drain(false));
    match next_exit(name) {
        // SAFETY: the C library's `_exit` or `_Exit`, with the program's status.
        Some(f) => unsafe { f(status) },
        // SAFETY: the raw system call, when no C library is found (cannot happen in practice).
        None => unsafe {
            libc::syscall(libc::SYS_exit_group, status);
            std::process::abort()
        },
    }
}

/// `_exit(status)`: publishes what was taken, then exits as asked.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: libc::c_int) -> ! {
    drain_and_exit(c"_exit", status)
}

/// `_Exit(status)`: as [`_exit`].
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn _Exit(status: libc::c_int) -> ! {
    drain_and_exit(c"_Exit", status)
}
