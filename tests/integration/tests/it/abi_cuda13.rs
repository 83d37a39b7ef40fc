//! The CUDA 13 build of the simulated stack (`cfg(sim_cuda13)`, scripts/build-sim-cuda13.sh)
//! against NVIDIA's CUDA 13 headers (CUDA 13.2, cuBLAS 13.4, NCCL 2.30.7; fetched with
//! `scripts/fetch-nvidia-headers.py --cuda 13`): every export and struct, as for CUDA 12 in
//! abi.rs, with a negative control on a signature CUDA 13 changed.

use std::path::PathBuf;
use std::sync::OnceLock;

use integration_tests::abi_check::{
    self, check, is_private, parse_exports, set_cuda_major, AbiTypes, Export, Report,
};
use integration_tests::profile_dir;

fn include_dirs() -> &'static [PathBuf] {
    static DIRS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    DIRS.get_or_init(|| match abi_check::fetch_headers_for(13) {
        Ok(d) => d,
        Err(e) => panic!("cannot get NVIDIA's CUDA 13 headers: {e}"),
    })
}

fn parsed() -> (Vec<Export>, AbiTypes) {
    set_cuda_major(13);
    let repo = abi_check::repo_root();
    let exports = parse_exports(&repo.join("tests/sim")).expect("the simulated libraries parse");
    let abi = AbiTypes::parse(&repo.join("abi/src")).expect("cuda-abi parses");
    (exports, abi)
}

fn run(exports: &[Export], abi: &AbiTypes, tag: &str) -> Report {
    check(
        exports,
        abi,
        include_dirs(),
        &profile_dir().join("abi-check-cuda13"),
        tag,
    )
}

#[test]
fn every_cuda13_export_and_struct_matches_nvidias_cuda13_headers() {
    let (exports, abi) = parsed();
    let public = exports.iter().filter(|e| !is_private(&e.name)).count();
    let report = run(&exports, &abi, "all13");
    eprintln!(
        "abi check (CUDA 13): {}/{} exports, {}/{} structs checked",
        report.exports_checked.len(),
        report.exports_found,
        report.records_checked.len(),
        report.records_found
    );
    assert!(
        report.failures.is_empty(),
        "ABI mismatches with NVIDIA's CUDA 13 headers:\n{}",
        report.describe_failures()
    );
    assert!(report.exports_checked.len() >= public);
    assert_eq!(report.records_checked.len(), report.records_found);
}

#[test]
fn negative_control_cuda12_signatures_fail_against_cuda13_headers() {
    let (mut exports, abi) = parsed();
    // CUDA 12's 6-parameter capture query (no edge data) is not CUDA 13's.
    let e = exports
        .iter_mut()
        .find(|e| e.name == "cudaStreamGetCaptureInfo")
        .expect("export exists");
    let mut inputs: Vec<syn::FnArg> = e.sig.inputs.iter().cloned().collect();
    inputs.remove(5);
    e.sig.inputs = inputs.into_iter().collect();
    let report = run(&exports, &abi, "neg13");
    assert!(
        report.fails_export("cudaStreamGetCaptureInfo"),
        "{}",
        report.describe_failures()
    );
}
