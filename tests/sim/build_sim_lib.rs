//! Build script shared by the simulated libraries: gives each cdylib the SONAME of the NVIDIA
//! library it stands in for, an `$ORIGIN` RUNPATH (so the libraries find each other the way a
//! pip-installed CUDA does), and a `target/<profile>/sim/<soname>` link to the built file, where
//! programs and tests find the simulated stack by its real file names.

use std::path::PathBuf;

fn main() {
    let pkg = std::env::var("CARGO_PKG_NAME").expect("cargo sets CARGO_PKG_NAME");
    let (file, soname) = match pkg.as_str() {
        "sim-cudart" => ("libcudart.so", "libcudart.so.12"),
        "sim-cublas" => ("libcublas.so", "libcublas.so.12"),
        "sim-cublaslt" => ("libcublasLt.so", "libcublasLt.so.12"),
        "sim-nccl" => ("libnccl.so", "libnccl.so.2"),
        "sim-nvtx" => ("libnvToolsExt.so", "libnvToolsExt.so.1"),
        "sim-driver" => ("libcuda.so", "libcuda.so.1"),
        other => panic!("build_sim_lib.rs does not know package {other}"),
    };
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
    // The sonames of the libraries each one finds at run time (cuBLASLt asks cuBLAS).
    println!("cargo:rustc-env=SIM_CUBLAS_SONAME=libcublas.so.12");
    println!("cargo:rustc-env=SIM_CUDART_SONAME=libcudart.so.12");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-rpath,$ORIGIN");
    println!("cargo:rerun-if-changed=../build_sim_lib.rs");

    // OUT_DIR is <target>/<profile>/build/<pkg>-<hash>/out: the profile directory is 3 up.
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let profile_dir = out
        .ancestors()
        .nth(3)
        .expect("OUT_DIR has the usual depth")
        .to_path_buf();
    let sim_dir = profile_dir.join("sim");
    std::fs::create_dir_all(&sim_dir).expect("create target/<profile>/sim");
    let link = sim_dir.join(soname);
    // A relative link survives moving the target directory; it dangles until the cdylib is linked.
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(PathBuf::from("..").join(file), &link)
        .expect("create the soname link in target/<profile>/sim");
}
