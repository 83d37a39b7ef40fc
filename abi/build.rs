//! `SIM_CUDA_MAJOR=13` (the CUDA 13 build of the simulated stack, in its own target
//! directory) selects the CUDA 13 layouts with `cfg(sim_cuda13)`; the default is CUDA 12.
fn main() {
    println!("cargo:rustc-check-cfg=cfg(sim_cuda13)");
    println!("cargo:rerun-if-env-changed=SIM_CUDA_MAJOR");
    if std::env::var("SIM_CUDA_MAJOR").is_ok_and(|v| v == "13") {
        println!("cargo:rustc-cfg=sim_cuda13");
    }
}
