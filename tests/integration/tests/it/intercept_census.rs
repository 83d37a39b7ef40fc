//! No silent holes, checked against NVIDIA's headers rather than against a list of our own:
//! every entry point of cuBLAS, cuBLASLt, NCCL, the CUDA runtime and the CUDA driver that moves
//! tensor data is exported by libttrace.so (captured, or recorded as a gap naming it), for the
//! CUDA 12 and the CUDA 13 header sets. What "moves tensor data" means is a rule per library, read off the
//! declarations (docs/capture.md, "What is captured, and what is a gap"):
//! * cuBLAS (`cublas_api.h`): a parameter points to numbers (`float`, `double`, `cuComplex`,
//!   `cuDoubleComplex`, `__half`, `void`, `unsigned char`, `signed char`) and is not a
//!   `workspace`;
//! * the legacy cuBLAS API (`cublas.h`, no handle; libcublas exports it beside `_v2`): a
//!   parameter points to `float`, `double`, `cuComplex` or `cuDoubleComplex` (its `void*` are
//!   `cublasAlloc`'s and `cublasFree`'s allocations);
//! * cuBLAS-XT (`cublasXt.h`, BLAS-3 over several devices): a parameter points to `float`,
//!   `double`, `cuComplex` or `cuDoubleComplex` (its one `void*` is a CPU routine, not data);
//! * cuBLASLt (`cublasLt.h`): a `cudaStream_t` parameter and a `void` data pointer that is not
//!   a `workspace` (work queued on a stream over the program's matrices);
//! * NCCL (`nccl.h`): a `cudaStream_t` parameter and a `void` buffer pointer (the collectives,
//!   point-to-point calls and one-sided puts), under their names and their `pnccl` profiling
//!   names (what a PMPI-style wrapper calls to reach NCCL);
//! * the CUDA runtime (`cuda_runtime_api.h`): `Memcpy` or `Memset` in the name, except the
//!   graph-building API (`cudaGraph*`), which moves nothing itself;
//! * the CUDA driver (`cuda.h`): functions returning `CUresult` with `Memcpy` or `Memset` in
//!   the name, except the graph-building API (`cuGraph*`).
//!
//! The runtime's and the driver's headers are read twice: as most programs see them, and as a
//! program built with per-thread default streams does (`CUDA_API_PER_THREAD_DEFAULT_STREAM`,
//! `nvcc --default-stream per-thread`), which calls the `_ptds`/`_ptsz` spellings.

use std::collections::BTreeSet;
use std::path::PathBuf;

use integration_tests::abi_check::{self, declarations, dynamic_symbols, Declaration};
use integration_tests::profile_dir;

/// Whether a parameter declaration points to numbers (tensor data), a workspace aside.
fn points_to_numbers(p: &str) -> bool {
    const NUMBERS: [&str; 8] = [
        "float",
        "double",
        "cuComplex",
        "cuDoubleComplex",
        "__half",
        "void",
        "unsigned char",
        "signed char",
    ];
    let words: String = p.replace('*', " * ");
    let tokens: Vec<&str> = words.split_whitespace().collect();
    let name = tokens.last().copied().unwrap_or("");
    let base = tokens
        .iter()
        .filter(|t| **t != "const" && **t != "*")
        .copied()
        .collect::<Vec<_>>();
    let base = base[..base.len().saturating_sub(1)].join(" ");
    p.contains('*') && NUMBERS.contains(&base.as_str()) && !name.contains("workspace")
}

fn has_stream(d: &Declaration) -> bool {
    d.params.iter().any(|p| p.starts_with("cudaStream_t "))
}

/// The data-moving entry points of one header set, by library.
fn data_movers(include: &[PathBuf]) -> Vec<(&'static str, Vec<String>)> {
    let decl_as = |header, defines: &[&str], ret, prefix| {
        declarations(include, header, defines, ret, prefix)
            .unwrap_or_else(|e| panic!("{header}: {e}"))
    };
    let decl = |header, ret, prefix| decl_as(header, &[], ret, prefix);
    // The runtime's and the driver's declarations as a program built with per-thread default
    // streams sees them too (their `_ptds`/`_ptsz` spellings), each name once.
    let both_views = |header, ret, prefix| {
        let mut ds = decl(header, ret, prefix);
        let seen: BTreeSet<String> = ds.iter().map(|d| d.name.clone()).collect();
        ds.extend(
            decl_as(header, &["CUDA_API_PER_THREAD_DEFAULT_STREAM"], ret, prefix)
                .into_iter()
                .filter(|d| !seen.contains(&d.name)),
        );
        ds
    };
    let names = |ds: Vec<Declaration>, keep: &dyn Fn(&Declaration) -> bool| -> Vec<String> {
        ds.into_iter().filter(keep).map(|d| d.name).collect()
    };
    let cublas = names(decl("cublas_v2.h", "cublasStatus_t", "cublas"), &|d| {
        d.params.iter().any(|p| points_to_numbers(p))
    });
    // Legacy routines return what they compute (or nothing): every return type of cublas.h.
    let legacy_decls = [
        "void",
        "float",
        "double",
        "int",
        "cuComplex",
        "cuDoubleComplex",
        "cublasStatus_t",
    ]
    .into_iter()
    .flat_map(|ret| decl("cublas.h", ret, "cublas"))
    .collect();
    let legacy = names(legacy_decls, &|d| {
        d.params
            .iter()
            .any(|p| points_to_numbers(p) && !p.contains("void"))
    });
    let xt = names(decl("cublasXt.h", "cublasStatus_t", "cublasXt"), &|d| {
        d.params
            .iter()
            .any(|p| points_to_numbers(p) && !p.contains("void"))
    });
    let lt = names(decl("cublasLt.h", "cublasStatus_t", "cublasLt"), &|d| {
        has_stream(d)
            && d.params
                .iter()
                .any(|p| points_to_numbers(p) && p.contains("void"))
    });
    let mut nccl_decls = decl("nccl.h", "ncclResult_t", "nccl");
    nccl_decls.extend(decl("nccl.h", "ncclResult_t", "pnccl"));
    let nccl = names(nccl_decls, &|d| {
        has_stream(d)
            && d.params
                .iter()
                .any(|p| points_to_numbers(p) && p.contains("void"))
    });
    let cudart = names(
        both_views("cuda_runtime_api.h", "cudaError_t", "cuda"),
        &|d| {
            (d.name.contains("Memcpy") || d.name.contains("Memset"))
                && !d.name.starts_with("cudaGraph")
        },
    );
    let driver = names(both_views("cuda.h", "CUresult", "cu"), &|d| {
        (d.name.contains("Memcpy") || d.name.contains("Memset")) && !d.name.starts_with("cuGraph")
    });
    vec![
        ("cuBLAS", cublas),
        ("the legacy cuBLAS API", legacy),
        ("cuBLAS-XT", xt),
        ("cuBLASLt", lt),
        ("NCCL", nccl),
        ("the CUDA runtime", cudart),
        ("the CUDA driver", driver),
    ]
}

fn exported() -> BTreeSet<String> {
    let lib = profile_dir().join("libttrace.so");
    dynamic_symbols(&lib).expect("nm").into_iter().collect()
}

/// Checks one header set: each library's rule finds its known data movers (the rule is not
/// vacuous) and libttrace.so exports every one.
fn every_data_mover_is_hooked(major: u32, at_least: [(&str, usize, &str); 7]) {
    let include = abi_check::fetch_headers_for(major).unwrap_or_else(|e| panic!("headers: {e}"));
    let exported = exported();
    let mut holes = Vec::new();
    for ((library, movers), (lib2, min, known)) in data_movers(&include).into_iter().zip(at_least) {
        assert_eq!(library, lib2);
        assert!(
            movers.len() >= min && movers.iter().any(|n| n == known),
            "CUDA {major} {library}: the rule finds {} data movers ({known} among them?): {movers:?}",
            movers.len()
        );
        holes.extend(
            movers
                .iter()
                .filter(|n| !exported.contains(*n))
                .map(|n| format!("{library}: {n}")),
        );
    }
    assert!(
        holes.is_empty(),
        "CUDA {major}: entry points that move tensor data and that libttrace.so does not hook \
         (silent holes):\n{}",
        holes.join("\n")
    );
}

#[test]
fn every_entry_point_that_moves_tensor_data_is_hooked_on_cuda_12() {
    every_data_mover_is_hooked(
        12,
        [
            ("cuBLAS", 450, "cublasStrsm_v2"),
            ("the legacy cuBLAS API", 150, "cublasSgemm"),
            ("cuBLAS-XT", 40, "cublasXtSgemm"),
            ("cuBLASLt", 2, "cublasLtMatrixTransform"),
            ("NCCL", 16, "pncclAllReduce"),
            ("the CUDA runtime", 30, "cudaMemcpy2DAsync"),
            ("the CUDA driver", 38, "cuMemcpy3D_v2"),
        ],
    );
}

#[test]
fn every_entry_point_that_moves_tensor_data_is_hooked_on_cuda_13() {
    every_data_mover_is_hooked(
        13,
        [
            ("cuBLAS", 450, "cublasSetMatrixAsync"),
            ("the legacy cuBLAS API", 150, "cublasZtrmm"),
            ("cuBLAS-XT", 40, "cublasXtZtrsm"),
            ("cuBLASLt", 2, "cublasLtMatmul"),
            ("NCCL", 24, "pncclPutSignal"),
            ("the CUDA runtime", 30, "cudaMemcpyBatchAsync"),
            ("the CUDA driver", 40, "cuMemcpyWithAttributesAsync"),
        ],
    );
}

#[test]
fn the_rules_tell_data_from_configuration() {
    // The parameter rule on declarations as NVIDIA writes them.
    for p in [
        "const float* x",
        "float* const Carray[]",
        "const void* const Aarray[]",
        "cuDoubleComplex* C",
        "const unsigned char* A",
        "void* devicePtr",
    ] {
        assert!(points_to_numbers(p), "{p} is tensor data");
    }
    for p in [
        "void* workspace",
        "int* info",
        "cublasHandle_t handle",
        "const char* logFileName",
        "float alpha",
        "cudaStream_t* streamId",
        "int64_t* result",
    ] {
        assert!(!points_to_numbers(p), "{p} is not tensor data");
    }
}
