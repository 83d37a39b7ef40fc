//! `big`: programs for the streamed-capture and crash-accounting tests
//! (tests/integration/tests/it/capture_streamed.rs, capture_crash.rs) and scripts/bench-big.sh.
//! They know nothing of ttrace.
//!
//! * `copy BYTES`: a host-to-device copy of [`crate::capture::pattern`]`(11, BYTES)`, then the
//!   device-to-host copy back, checked.
//! * `allreduce BYTES` (under simrun): an in-place F32 sum all-reduce of BYTES per rank, of
//!   [`allreduce_input`] values, checked against the exact sum.
//! * `crash abort|exit|segv|kill`: six host-to-device copies of 4 KiB
//!   ([`crate::capture::pattern`]`(i, 4096)`, i = 1..=6) and one 8x8 `cublasSgemm`, then
//!   `abort()`, `_exit(3)`, a write through a null pointer, or `SIGKILL` to itself.
//! * `sigflags`: installs a SIGINT handler without `SA_RESTART` (as Python does, so that a
//!   blocking call returns `EINTR` on Ctrl-C), makes a captured copy, and fails if the action
//!   now in place restarts interrupted calls, or if a thread named `ttrace-tracer` exists and
//!   does not block SIGTERM (a termination request must run its handler on a program thread).

use core::ffi::{c_int, c_void};

use cuda_dyn::abi::cublas::*;
use cuda_dyn::abi::cudart::*;
use cuda_dyn::abi::nccl::*;
use cuda_dyn::cublas::*;
use cuda_dyn::cudart::*;
use cuda_dyn::nccl::*;

use crate::capture::pattern;
use crate::support::{ck, job, nc, stream, world, DevBuf};

/// Entry point: `big SCENARIO [ARGS]`.
pub fn big(args: &[String]) -> Result<(), String> {
    let bytes = || -> Result<usize, String> {
        args.get(1)
            .ok_or("missing BYTES")?
            .parse()
            .map_err(|e| format!("BYTES: {e}"))
    };
    match args.first().map(String::as_str) {
        Some("copy") => copy(bytes()?),
        Some("allreduce") => allreduce(bytes()?),
        Some("crash") => crash(args.get(1).map_or("", String::as_str)),
        Some("sigflags") => sigflags(),
        _ => Err(
            "usage: big copy BYTES | allreduce BYTES | crash abort|exit|segv|kill | sigflags"
                .into(),
        ),
    }
}

/// Element `i` of rank `rank`'s all-reduce input: small integers and halves, so that any
/// summation order gives the exact sum in F32.
pub fn allreduce_input(rank: usize, i: usize) -> f32 {
    (i % 1021) as f32 + rank as f32 * 0.5
}

fn copy(len: usize) -> Result<(), String> {
    let s = stream()?;
    let host = pattern(11, len);
    let d = DevBuf::new(len)?;
    ck!(cudaMemcpyAsync(
        d.ptr,
        host.as_ptr().cast(),
        len,
        cudaMemcpyHostToDevice,
        s
    ));
    if d.download(s)? != host {
        return Err("the device holds other bytes than were copied".into());
    }
    println!("big copy {len} OK");
    Ok(())
}

fn allreduce(len: usize) -> Result<(), String> {
    let j = job()?;
    let comm = world(&j)?;
    let s = stream()?;
    let count = len / 4;
    let input: Vec<u8> = (0..count)
        .flat_map(|i| allreduce_input(j.rank, i).to_le_bytes())
        .collect();
    let x = DevBuf::from_host(&input)?;
    nc!(ncclAllReduce(
        x.ptr,
        x.ptr,
        count,
        ncclFloat32,
        ncclSum,
        comm,
        s
    ));
    let out = x.download(s)?;
    for (i, v) in out.chunks_exact(4).enumerate() {
        let want: f32 = (0..j.n).map(|r| allreduce_input(r, i)).sum();
        let got = f32::from_le_bytes(v.try_into().expect("4 bytes"));
        if got != want {
            return Err(format!("element {i}: {got}, expected {want}"));
        }
    }
    nc!(ncclCommDestroy(comm));
    println!("rank {} of {}: big allreduce {len} OK", j.rank, j.n);
    Ok(())
}

extern "C" {
    fn abort() -> !;
    fn _exit(code: c_int) -> !;
    fn raise(sig: c_int) -> c_int;
}

fn crash(how: &str) -> Result<(), String> {
    if !matches!(how, "abort" | "exit" | "segv" | "kill") {
        return Err(format!("crash {how}: expected abort|exit|segv|kill"));
    }
    let s = stream()?;
    let mut bufs = Vec::new();
    for i in 1..=6u8 {
        let host = pattern(i, 4096);
        let d = DevBuf::new(4096)?;
        ck!(cudaMemcpyAsync(
            d.ptr,
            host.as_ptr().cast(),
            4096,
            cudaMemcpyHostToDevice,
            s
        ));
        ck!(cudaStreamSynchronize(s));
        bufs.push(d);
    }
    let mut h: cublasHandle_t = std::ptr::null_mut();
    // SAFETY: cuBLAS calls with a valid handle pointer and device buffers of 8x8 floats
    // (the copies above: 4 KiB each).
    unsafe {
        if cublasCreate_v2(&mut h) != CUBLAS_STATUS_SUCCESS
            || cublasSetStream_v2(h, s) != CUBLAS_STATUS_SUCCESS
        {
            return Err("cublasCreate failed".into());
        }
        let (alpha, beta) = (1.0f32, 0.0f32);
        let code = cublasSgemm_v2(
            h,
            CUBLAS_OP_N,
            CUBLAS_OP_N,
            8,
            8,
            8,
            &alpha,
            bufs[0].ptr.cast(),
            8,
            bufs[1].ptr.cast(),
            8,
            &beta,
            bufs[2].ptr.cast(),
            8,
        );
        if code != CUBLAS_STATUS_SUCCESS {
            return Err(format!("cublasSgemm returned {code}"));
        }
    }
    // SAFETY: the crash the test asks for; nothing runs after it.
    unsafe {
        match how {
            "abort" => abort(),
            "exit" => _exit(3),
            "segv" => {
                std::ptr::write_volatile(std::ptr::null_mut::<c_void>().cast::<u64>(), 1);
            }
            _ => {
                raise(9);
            }
        }
    }
    Err("still alive after the crash".into())
}

extern "C" fn on_sigint(_: c_int) {}

fn sigflags() -> Result<(), String> {
    // SAFETY: sigaction with a zeroed (valid) action whose handler does nothing.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_sigint as *const () as usize;
        libc::sigemptyset(&mut act.sa_mask);
        if libc::sigaction(libc::SIGINT, &act, std::ptr::null_mut()) != 0 {
            return Err("sigaction failed".into());
        }
    }
    copy(4096)?;
    // SAFETY: reads the current action only.
    let now = unsafe {
        let mut now: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGINT, std::ptr::null(), &mut now);
        now
    };
    if now.sa_flags & libc::SA_RESTART != 0 {
        return Err(format!(
            "SIGINT's action restarts interrupted calls now (sa_flags {:#x})",
            now.sa_flags
        ));
    }
    // The tracer thread (when traced) blocks SIGTERM; it may still be starting.
    let sigterm = 1u64 << (libc::SIGTERM - 1);
    for _ in 0..200 {
        match tracer_sigblk() {
            None => return Ok(()),
            Some(b) if b & sigterm != 0 => return Ok(()),
            Some(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
    }
    Err("the ttrace-tracer thread does not block SIGTERM".into())
}

/// `SigBlk` of the thread named `ttrace-tracer`, if there is one.
fn tracer_sigblk() -> Option<u64> {
    for t in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() != "ttrace-tracer" {
            continue;
        }
        let status = std::fs::read_to_string(t.path().join("status")).ok()?;
        let blk = status.lines().find_map(|l| l.strip_prefix("SigBlk:"))?;
        return u64::from_str_radix(blk.trim(), 16).ok();
    }
    None
}
