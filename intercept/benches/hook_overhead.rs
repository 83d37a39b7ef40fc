//! What a hook costs when it does not capture: ns per call of libttrace.so's export versus the
//! bare real function, in the same process, with `TTRACE=0` (every hook passes through). Goal: at most 20 ns of overhead per call.
//!
//! The real functions are the simulated NVTX and NCCL (`target/<profile>/sim`, built with
//! `cargo build --release -p sim-nvtx -p sim-nccl`), chosen because they are cheap: a few
//! nanoseconds of real work make the hook's own cost visible. Each case runs a tight loop of
//! call pairs several times and keeps the fastest run.
//!
//! `cargo bench -p ttrace-intercept --bench hook_overhead`

use std::ffi::{c_char, c_int, c_void, CString};
use std::path::{Path, PathBuf};
use std::time::Instant;

const PAIRS: u32 = 2_000_000;
const RUNS: usize = 7;

/// `target/<profile>`: where the benchmark binary's `deps/` lives.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("own path");
    exe.ancestors()
        .nth(2)
        .expect("target/<profile>/deps")
        .to_path_buf()
}

fn open(path: &Path, flags: c_int) -> *mut c_void {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a NUL-terminated path; the handle stays open for the whole benchmark.
    let h = unsafe { libc::dlopen(c.as_ptr(), flags) };
    if h.is_null() {
        // SAFETY: dlerror returns a NUL-terminated message after a failed dlopen.
        let e = unsafe { std::ffi::CStr::from_ptr(libc::dlerror()) };
        eprintln!("cannot load {}: {e:?}", path.display());
        eprintln!("build first: cargo build --release -p ttrace-intercept -p sim-nvtx -p sim-nccl");
        std::process::exit(1);
    }
    h
}

fn sym(h: *mut c_void, name: &str) -> *mut c_void {
    let c = CString::new(name).expect("name");
    // SAFETY: a live handle and a NUL-terminated name.
    let p = unsafe { libc::dlsym(h, c.as_ptr()) };
    assert!(!p.is_null(), "{name} not found");
    p
}

/// Fastest of `RUNS` runs of `PAIRS` iterations of `f`, in ns per call (two calls per pair).
fn ns_per_call(mut f: impl FnMut()) -> f64 {
    (0..RUNS)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..PAIRS {
                f();
            }
            t.elapsed().as_nanos() as f64 / (2.0 * PAIRS as f64)
        })
        .fold(f64::INFINITY, f64::min)
}

type Push = unsafe extern "C" fn(*const c_char) -> c_int;
type Pop = unsafe extern "C" fn() -> c_int;
type Group = unsafe extern "C" fn() -> u32;
/// A case: its name, the loop body on the real functions, the same through the hooks.
type Case = (&'static str, Box<dyn FnMut()>, Box<dyn FnMut()>);

fn main() {
    // This measures hooks that do not capture: the library as a pure pass-through. Set
    // before any hook runs (the mode is read once, at the first hook).
    std::env::set_var("TTRACE", "0");
    let dir = profile_dir();
    let sim = dir.join("sim");
    let nvtx = open(
        &sim.join("libnvToolsExt.so.1"),
        libc::RTLD_NOW | libc::RTLD_GLOBAL,
    );
    let nccl = open(
        &sim.join("libnccl.so.2"),
        libc::RTLD_NOW | libc::RTLD_GLOBAL,
    );
    let lib = [
        dir.join("libttrace.so"),
        dir.join("deps").join("libttrace.so"),
    ]
    .into_iter()
    .find(|p| p.exists())
    .unwrap_or_else(|| dir.join("libttrace.so"));
    let ttrace = open(&lib, libc::RTLD_NOW | libc::RTLD_LOCAL);

    // SAFETY: the symbols have these C signatures (nvToolsExt.h, nccl.h).
    let (push_real, pop_real, push_hook, pop_hook) = unsafe {
        (
            std::mem::transmute::<*mut c_void, Push>(sym(nvtx, "nvtxRangePushA")),
            std::mem::transmute::<*mut c_void, Pop>(sym(nvtx, "nvtxRangePop")),
            std::mem::transmute::<*mut c_void, Push>(sym(ttrace, "nvtxRangePushA")),
            std::mem::transmute::<*mut c_void, Pop>(sym(ttrace, "nvtxRangePop")),
        )
    };
    // SAFETY: as above.
    let (gs_real, ge_real, gs_hook, ge_hook) = unsafe {
        (
            std::mem::transmute::<*mut c_void, Group>(sym(nccl, "ncclGroupStart")),
            std::mem::transmute::<*mut c_void, Group>(sym(nccl, "ncclGroupEnd")),
            std::mem::transmute::<*mut c_void, Group>(sym(ttrace, "ncclGroupStart")),
            std::mem::transmute::<*mut c_void, Group>(sym(ttrace, "ncclGroupEnd")),
        )
    };
    let msg = c"bench".as_ptr();
    // Warm up: the first hook call reads the configuration and resolves the real function.
    // SAFETY: balanced push/pop and group start/end with valid arguments.
    unsafe {
        push_hook(msg);
        pop_hook();
        gs_hook();
        ge_hook();
    }
    let cases: [Case; 2] = [
        (
            "nvtxRangePushA + nvtxRangePop",
            // SAFETY: balanced push/pop with a NUL-terminated message.
            Box::new(move || unsafe {
                std::hint::black_box(push_real(msg));
                std::hint::black_box(pop_real());
            }),
            // SAFETY: as above, through the hooks.
            Box::new(move || unsafe {
                std::hint::black_box(push_hook(msg));
                std::hint::black_box(pop_hook());
            }),
        ),
        (
            "ncclGroupStart + ncclGroupEnd",
            // SAFETY: an empty group.
            Box::new(move || unsafe {
                std::hint::black_box(gs_real());
                std::hint::black_box(ge_real());
            }),
            // SAFETY: as above, through the hooks.
            Box::new(move || unsafe {
                std::hint::black_box(gs_hook());
                std::hint::black_box(ge_hook());
            }),
        ),
    ];
    println!("hook overhead, capture off ({PAIRS} pairs x {RUNS} runs, fastest run):");
    let mut worst: f64 = 0.0;
    for (name, mut real, mut hooked) in cases {
        let r = ns_per_call(&mut real);
        let h = ns_per_call(&mut hooked);
        worst = worst.max(h - r);
        println!(
            "  {name:<32} real {r:6.2} ns/call   hooked {h:6.2} ns/call   overhead {:+6.2} ns",
            h - r
        );
    }
    println!(
        "worst overhead {worst:.2} ns/call (goal <= 20 ns): {}",
        if worst <= 20.0 { "ok" } else { "OVER" }
    );
}
