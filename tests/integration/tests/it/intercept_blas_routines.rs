//! cuBLAS beyond its GEMMs, and cuBLASLt's matrix transform, under libttrace.so: a program
//! written only against NVIDIA's headers (tests/integration/c/blas_more.c) moves tensors with
//! cuBLAS's helper copies, which are captured as the copies they are (their own API name, the
//! bytes that reached or left the device, the stream), and computes with level-1 routines,
//! `cublasSgeam`, `cublasLtMatrixTransform` and cuBLAS-XT's `cublasXtSgemm`, which are not
//! captured: each is a gap naming it on the stream it ran on (XT's, which works on streams of
//! its own and returns when done, on the legacy default stream). The program checks every result, so a hook that forwarded an
//! argument wrongly (geam has 13, most of them on the stack) fails it. A refused call records
//! nothing.

use crate::intercept_util;

use intercept_util::*;
use ttrace_format::record::{CopyDirection, GapReason, Op};

fn f32_bytes(v: impl IntoIterator<Item = f32>) -> Vec<u8> {
    v.into_iter().flat_map(f32::to_le_bytes).collect()
}

/// tests/integration/c/`program`.c built against CUDA `major`'s headers and linked by soname
/// to the runtime and cuBLAS (and cuBLASLt with `lt`) of the simulated stack `sim`: the
/// command that runs it there.
fn blas_program(
    major: u32,
    sim: &std::path::Path,
    program: &str,
    lt: bool,
) -> std::process::Command {
    let mut libs = vec![
        format!("libcudart.so.{major}"),
        format!("libcublas.so.{major}"),
    ];
    if lt {
        libs.push(format!("libcublasLt.so.{major}"));
    }
    let libs: Vec<&str> = libs.iter().map(String::as_str).collect();
    let exe = integration_tests::c_build::compile_c(
        &format!("{program}.c"),
        &format!("{program}{major}"),
        major,
        sim,
        &libs,
    );
    let mut cmd = std::process::Command::new(&exe);
    cmd.env_remove("LD_LIBRARY_PATH");
    cmd
}

#[test]
fn helper_copies_are_captured_and_other_routines_are_gaps_naming_them() {
    for (major, sim) in cuda_sims() {
        let cmd = blas_program(major, &sim, "blas_more", true);
        let (run, s) = run_c_program(cmd, "blas-more-c", "blas_more", &format!("CUDA {major}"));

        // What the program put: the 5 x 3 block of a (lda 7), every second element of v, the
        // doubles of m64.
        let a = |i: usize| i as f32 * 0.25 - 1.0;
        let block = f32_bytes((0..3).flat_map(|c| (0..5).map(move |r| a(c * 7 + r))));
        let every_second = f32_bytes((0..10).map(|i| 100.0 + (2 * i) as f32));
        let doubles: Vec<u8> = (0..8)
            .flat_map(|i| (-2.0 + i as f64).to_le_bytes())
            .collect();
        use CopyDirection::*;
        let copies: Vec<(&str, CopyDirection, u64, &[u8])> = run
            .records
            .iter()
            .filter(|r| r.record.api.starts_with("cublas"))
            .filter_map(|r| match &r.record.op {
                Op::Memcpy(m) => Some((
                    r.record.api.as_str(),
                    m.direction,
                    r.record.stream,
                    r.bytes.first().and_then(|b| b.as_deref()).unwrap_or(&[]),
                )),
                _ => None,
            })
            .collect();
        assert_eq!(
            copies,
            vec![
                ("cublasSetMatrixAsync", HostToDevice, s, &block[..]),
                ("cublasGetMatrixAsync", DeviceToHost, s, &block[..]),
                ("cublasSetVector", HostToDevice, 0, &every_second[..]),
                ("cublasGetVector", DeviceToHost, 0, &every_second[..]),
                ("cublasSetMatrix_64", HostToDevice, 0, &doubles[..]),
            ],
            "CUDA {major}: the helper copies, in call order (the refused one not among them)"
        );

        let gaps = gap_records(&run);
        let named: Vec<(&str, GapReason, u64)> = gaps.iter().map(|g| (g.0, g.1, g.2)).collect();
        use GapReason::Unsupported;
        assert_eq!(
            named,
            vec![
                ("cublasSaxpy_v2", Unsupported, s),
                ("cublasSdot_v2", Unsupported, s),
                ("cublasSgeam", Unsupported, s),
                ("cublasLtMatrixTransform", Unsupported, s),
                ("cublasXtSgemm", Unsupported, 0),
            ],
            "CUDA {major}: one gap per uncaptured call, on the stream it ran on"
        );
        assert!(
            gaps[3].3.starts_with("C 4x3"),
            "CUDA {major}: the transform's gap names its output: {}",
            gaps[3].3
        );
        assert_eq!(
            run.summary.gaps, 5,
            "CUDA {major}: the run is not clean: {:?}",
            run.summary
        );
    }
}

/// The legacy cuBLAS API (tests/integration/c/blas_legacy.c, written against `cublas.h`): its
/// routines are not captured, and each call is a gap naming it on the legacy default stream,
/// whatever its outcome (only `cublasGetError`, which clears it, knows) and whatever the stream
/// it is placed on says (during another stream's capture); the hook hands back
/// what the routine returns (`cublasSdot`'s value, checked by the program) and the copies the
/// two APIs share are captured.
#[test]
fn legacy_cublas_routines_are_gaps_naming_them() {
    for (major, sim) in cuda_sims() {
        let cmd = blas_program(major, &sim, "blas_legacy", false);
        let (run, s) = run_c_program(
            cmd,
            "blas-legacy-c",
            "blas_legacy",
            &format!("CUDA {major}"),
        );
        assert_eq!(s, 0);
        let gaps = gap_records(&run);
        let named: Vec<(&str, GapReason, u64)> = gaps.iter().map(|g| (g.0, g.1, g.2)).collect();
        use GapReason::Unsupported;
        assert_eq!(
            named,
            vec![
                ("cublasSscal", Unsupported, 0),
                ("cublasSdot", Unsupported, 0),
                ("cublasSgemm", Unsupported, 0),
                ("cublasSdot", Unsupported, 0),
            ],
            "CUDA {major}: one gap per legacy call, in call order (the last during a capture, \
             when the legacy stream cannot be queried)"
        );
        let copies: Vec<&str> = run
            .records
            .iter()
            .filter(|r| matches!(r.record.op, Op::Memcpy(_)))
            .map(|r| r.record.api.as_str())
            .collect();
        assert_eq!(
            copies,
            [
                "cublasSetVector",
                "cublasSetVector",
                "cublasSetVector",
                "cublasGetVector"
            ],
            "CUDA {major}: the shared helper copies are captured"
        );
    }
}
