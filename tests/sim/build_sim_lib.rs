//! Build script shared by the simulated libraries: gives each cdylib the SONAME of the NVIDIA
//! library it stands in for, an `$ORIGIN` RUNPATH (so the libraries find each other the way a
//! pip-installed CUDA does), and a `target/<profile>/sim/<soname>` link to the built file, where
//! programs and tests find the simulated stack by its real file names.
//!
//! `SIM_CUDA_MAJOR=13` builds the CUDA 13 stack (`libcudart.so.13`, `libcublas.so.13`,
//! `libcublasLt.so.13`, NCCL 2.30's `libnccl.so.2`; `cfg(sim_cuda13)` selects CUDA 13's
//! signatures and layouts). Build it in its own target directory, e.g.
//! `SIM_CUDA_MAJOR=13 CARGO_TARGET_DIR=target/cuda13 cargo build --release -p sim-cudart ...`
//! (scripts/build-sim-cuda13.sh).

use std::path::PathBuf;

fn main() {
    println!("cargo:rustc-check-cfg=cfg(sim_cuda13)");
    println!("cargo:rerun-if-changed=../build_sim_lib.rs");
    println!("cargo:rerun-if-env-changed=SIM_CUDA_MAJOR");
    let major = match std::env::var("SIM_CUDA_MAJOR").as_deref() {
        Ok("13") => 13,
        Ok("12") | Err(_) => 12,
        Ok(other) => panic!("SIM_CUDA_MAJOR={other}: the simulated stack is CUDA 12 or 13"),
    };
    if major == 13 {
        println!("cargo:rustc-cfg=sim_cuda13");
    }
    // The sonames of the libraries each one finds at run time (cuBLASLt asks cuBLAS, the
    // driver and the private device interface ask the runtime).
    println!("cargo:rustc-env=SIM_CUBLAS_SONAME=libcublas.so.{major}");
    println!("cargo:rustc-env=SIM_CUDART_SONAME=libcudart.so.{major}");

    let pkg = std::env::var("CARGO_PKG_NAME").expect("cargo sets CARGO_PKG_NAME");
    let (file, soname) = match pkg.as_str() {
        "sim-cudart" => ("libcudart.so", format!("libcudart.so.{major}")),
        "sim-cublas" => ("libcublas.so", format!("libcublas.so.{major}")),
        "sim-cublaslt" => ("libcublasLt.so", format!("libcublasLt.so.{major}")),
        "sim-nccl" => ("libnccl.so", "libnccl.so.2".to_string()),
        "sim-nvtx" => ("libnvToolsExt.so", "libnvToolsExt.so.1".to_string()),
        "sim-driver" => ("libcuda.so", "libcuda.so.1".to_string()),
        // A library crate (no cdylib): only the sonames above.
        "sim-device" => return,
        other => panic!("build_sim_lib.rs does not know package {other}"),
    };
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-rpath,$ORIGIN");
    if pkg == "sim-nccl" {
        // NCCL's calls to its own entry points (a `pnccl` profiling name running the `nccl`
        // one, ncclAlltoAll's group) stay inside it, as in NVIDIA's build: a PMPI-style
        // wrapper that takes `ncclGroupStart` and calls `pncclGroupStart` must not be called
        // back by the simulator (it recursed until the stack overflowed).
        println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
    }

    // OUT_DIR is <target>/<profile>/build/<pkg>-<hash>/out: the profile directory is 3 up.
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let profile_dir = out
        .ancestors()
        .nth(3)
        .expect("OUT_DIR has the usual depth")
        .to_path_buf();
    let sim_dir = profile_dir.join("sim");
    std::fs::create_dir_all(&sim_dir).expect("create target/<profile>/sim");
    let link = sim_dir.join(&soname);
    // A relative link survives moving the target directory; it dangles until the cdylib is linked.
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(PathBuf::from("..").join(file), &link)
        .expect("create the soname link in target/<profile>/sim");
}
