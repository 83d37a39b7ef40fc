//! Functions a program looks up by name instead of linking them: `dlsym(handle, name)`
//! ([`crate::dlsym`]), the driver's `cuGetProcAddress` and the runtime's
//! `cudaGetDriverEntryPoint` ([`crate::hooks::entry_points`]). Such a lookup hands the program a
//! pointer that never passes through the global scope, where `LD_PRELOAD` hooks live, so the
//! pointer found is checked against the hooks:
//! * when it is the very function a hook of one of the looked-up names calls
//!   ([`real::find_real`]), the program is handed the hook instead;
//! * when a hook of such a name exists but calls another function (another copy of the library,
//!   another ABI version, a per-thread-stream variant the hooks do not serve), the program keeps
//!   what it found, the lookup is said on stderr and becomes one `unsupported` gap naming the
//!   function when a session runs ([`report`]): calls through that pointer are not captured,
//!   and the store says so.

use core::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::real;

/// The hook to hand out in place of `p`, which a lookup (`via`: `dlsym`, `cuGetProcAddress`,
/// ...) found for any of `names` (the spellings the function may have, in the order they are
/// tried; all of `lib`); `None`: hand out `p` itself (no hook serves these names, or a hook's
/// function is not `p`: then also a gap, [`bypassed`]).
pub(crate) fn hook_for(
    names: &[&CStr],
    lib: real::Lib,
    p: *mut c_void,
    via: &'static str,
) -> Option<*mut c_void> {
    if real::is_own(p) {
        // Found through another of the hooks (a lookup that calls another lookup).
        return None;
    }
    let mut hooked = None;
    for &name in names {
        let Some(hook) = own_export(name) else {
            continue;
        };
        if real::find_real(name, lib) == p as usize {
            return Some(hook);
        }
        hooked.get_or_insert(name);
    }
    if let Some(name) = hooked {
        bypassed(via, name, p);
    }
    None
}

/// libttrace.so's export `name`, if it has one (a hook).
fn own_export(name: &CStr) -> Option<*mut c_void> {
    static OWN: OnceLock<usize> = OnceLock::new();
    let h = *OWN.get_or_init(|| real::own_handle() as usize);
    if h == 0 {
        return None;
    }
    // SAFETY: libttrace.so's own handle and a NUL-terminated name.
    let p = unsafe { crate::dlsym::real(h as *mut c_void, name.as_ptr()) };
    real::is_own(p).then_some(p)
}

/// A lookup that was handed a function the hooks do not call.
struct Bypass {
    via: &'static str,
    name: String,
    /// The object the function found lies in.
    lib: String,
}

/// Lookups handed a function other than the hooks', each said once.
static BYPASSED: Mutex<Vec<Bypass>> = Mutex::new(Vec::new());
/// How many of [`BYPASSED`] were recorded as gaps.
static REPORTED: AtomicUsize = AtomicUsize::new(0);

fn bypassed(via: &'static str, name: &CStr, p: *mut c_void) {
    let b = Bypass {
        via,
        name: name.to_string_lossy().into_owned(),
        lib: real::object_path(p as usize).unwrap_or_else(|| "?".into()),
    };
    let mut all = BYPASSED.lock().unwrap_or_else(|e| e.into_inner());
    if all
        .iter()
        .any(|o| (o.via, &o.name, &o.lib) == (b.via, &b.name, &b.lib))
    {
        return;
    }
    crate::log::warn(&b.detail());
    crate::session::announce(&b.detail());
    all.push(b);
}

impl Bypass {
    fn detail(&self) -> String {
        let Bypass { via, name, lib } = self;
        format!(
            "{name} was looked up with {via} and found in {lib}: a copy of the library other \
             than the one ttrace's hooks call, or another version of the function; its calls \
             through that lookup are not captured"
        )
    }
}

/// Records the lookups not redirected since the last report as `unsupported` gaps (with a
/// session running: at its start and when it ends).
pub fn report() {
    use ttrace_proto::record::{GapReason, Op};
    let all = BYPASSED.lock().unwrap_or_else(|e| e.into_inner());
    let from = REPORTED.swap(all.len(), Ordering::AcqRel);
    for b in all.iter().skip(from) {
        let op = Op::gap(GapReason::Unsupported, &b.name, 0, b.detail());
        let m = crate::engine::meta(b.via, op, 0, 0);
        crate::tracer::push(crate::tracer::Entry::Gap(Box::new(m)));
    }
}
