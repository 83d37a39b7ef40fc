//! NVTX ranges under libttrace.so, from programs written only against NVIDIA's headers
//! (tests/integration/c/nvtx3.c): with NVTX 3 header-only, as PyTorch, CUB and every CUDA 13
//! program use it, the ranges reach ttrace only through NVTX's own tool loader
//! (`NVTX_INJECTION64_PATH`, which libttrace.so sets to itself); with the NVTX v2 library
//! (nvtx2.c, CUDA 12), through the interposed exports, and the library, which loads ttrace as
//! its tool as well, must not make each range count twice. Either way every copy's record
//! carries the ranges open around it, and `--step-rule nvtx:NAME` numbers the steps by them. A
//! profiler's tool named before ttrace's still sees every range.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

use crate::intercept_util::*;

/// The ranges open around each of the program's copies, in order: one copy before any range,
/// then per iteration a copy inside step > outer > inner, one inside step > the domain's range,
/// one inside a range named by a registered string within that, and one inside step >
/// x-crossed, a core range opened after a domain range the domain then closed (each copy is a
/// host-to-device and a device-to-host `cudaMemcpy`).
fn expected_ranges() -> Vec<Vec<&'static str>> {
    let mut want = vec![vec![]; 2];
    for _ in 0..3 {
        want.extend(std::iter::repeat_n(vec!["step", "outer", "inner"], 2));
        want.extend(std::iter::repeat_n(vec!["step", "in-domain"], 2));
        want.extend(std::iter::repeat_n(
            vec!["step", "in-domain", "registered-name"],
            2,
        ));
        want.extend(std::iter::repeat_n(vec!["step", "x-crossed"], 2));
    }
    want
}

/// tests/integration/c/`program`.c built for CUDA `major` against the simulated stack `sim`,
/// linked to the runtime (and the NVTX v2 library with `v2`).
/// Each is built once: tests run in parallel, and one rebuilding the file another is starting
/// would make that start fail.
fn nvtx_program(program: &str, major: u32, sim: &std::path::Path, v2: bool) -> Command {
    static BUILT: Mutex<BTreeMap<String, PathBuf>> = Mutex::new(BTreeMap::new());
    let name = format!("{program}{major}");
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    let exe = built.entry(name.clone()).or_insert_with(|| {
        let mut libs = vec![format!("libcudart.so.{major}")];
        if v2 {
            libs.push("libnvToolsExt.so.1".into());
        }
        let libs: Vec<&str> = libs.iter().map(String::as_str).collect();
        integration_tests::c_build::compile_c(&format!("{program}.c"), &name, major, sim, &libs)
    });
    let mut cmd = Command::new(exe);
    cmd.env_remove("LD_LIBRARY_PATH");
    cmd
}

/// The NVTX path of every record, in order.
fn ranges(run: &Run) -> Vec<Vec<&str>> {
    run.records
        .iter()
        .map(|r| r.record.nvtx.iter().map(String::as_str).collect())
        .collect()
}

/// How many records each step holds, by step.
fn records_per_step(run: &Run) -> Vec<(u64, usize)> {
    let mut per: std::collections::BTreeMap<u64, usize> = Default::default();
    for r in &run.records {
        *per.entry(r.record.step).or_default() += 1;
    }
    per.into_iter().collect()
}

/// The value the program's first `nvtxRangePushA` returned (it prints it).
fn first_push(run: &Run, program: &str) -> i32 {
    let out = String::from_utf8_lossy(&run.out.stdout);
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{program}: first push returned ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{program} printed no first push: {out}"))
}

#[test]
fn header_only_nvtx3_ranges_reach_the_records_through_nvtx_s_tool_loader() {
    for (major, sim) in cuda_sims() {
        let what = format!("CUDA {major}");
        let run = run_c(
            nvtx_program("nvtx3", major, &sim, false),
            "nvtx3-c",
            "nvtx3",
            &what,
        );
        assert_eq!(ranges(&run), expected_ranges(), "{what}");
        // What NVTX returns without a tool: the program sees what it saw untraced.
        assert_eq!(first_push(&run, "nvtx3"), -2, "{what}");

        // The ranges and marks the program makes are step boundaries when named.
        let mut cmd = nvtx_program("nvtx3", major, &sim, false);
        cmd.env("TTRACE_STEP_RULE", "nvtx:step");
        let run = run_c(cmd, "nvtx3-steps", "nvtx3", &what);
        assert_eq!(
            records_per_step(&run),
            [(0, 2), (1, 8), (2, 8), (3, 8)],
            "{what}: a step from each `step` range"
        );
        let mut cmd = nvtx_program("nvtx3", major, &sim, false);
        cmd.env("TTRACE_STEP_RULE", "nvtx:after");
        let run = run_c(cmd, "nvtx3-marks", "nvtx3", &what);
        assert_eq!(
            records_per_step(&run),
            [(0, 10), (1, 8), (2, 8)],
            "{what}: a step from each `after` mark"
        );
        assert_starts_and_misses_mark_steps(
            || nvtx_program("nvtx3", major, &sim, false),
            "nvtx3",
            &what,
        );
        // A mark that came only before the first CUDA call (before capture began) is a
        // one-step run's: every record in step 0, and no word of a missing mark.
        let mut cmd = nvtx_program("nvtx3", major, &sim, false);
        cmd.env("TTRACE_STEP_RULE", "nvtx:warm-up");
        let run = run_c(cmd, "nvtx3-warm-up", "nvtx3", &what);
        assert_eq!(records_per_step(&run), [(0, 26)], "{what}");
        let err = String::from_utf8_lossy(&run.out.stderr);
        assert!(
            !err.contains("no NVTX range or mark named"),
            "{what}: {err}"
        );
    }
}

/// `--step-rule nvtx:NAME` with the program's start/end range `started` (PyTorch's
/// `torch.cuda.nvtx.range_start`) numbers the steps as its pushed range `step` does; with a
/// name no range has, the whole run is step 0 and each process says so, naming the ranges it
/// saw instead.
fn assert_starts_and_misses_mark_steps(program: impl Fn() -> Command, name: &str, what: &str) {
    let mut cmd = program();
    cmd.env("TTRACE_STEP_RULE", "nvtx:started");
    let run = run_c(cmd, &format!("{name}-started"), name, what);
    assert_eq!(
        records_per_step(&run),
        [(0, 2), (1, 8), (2, 8), (3, 8)],
        "{what}: a step from each range started as `started`"
    );
    let mut cmd = program();
    cmd.env("TTRACE_STEP_RULE", "nvtx:strated");
    let run = run_c(cmd, &format!("{name}-misspelt"), name, what);
    assert_eq!(records_per_step(&run), [(0, 26)], "{what}");
    let err = String::from_utf8_lossy(&run.out.stderr);
    assert!(
        err.contains("no NVTX range or mark named `strated` was seen: the whole run is step 0")
            && err.contains("(the outermost names seen: `started` (3), `step` (3), `probe` (1),"),
        "{what}: no word of the missing mark: {err}"
    );
    // Kept in the store, and said by `ttrace ls`: read later, the run must not pass for a
    // one-step run.
    let manifest = ttrace_format::store::Manifest::read(&run.store).expect("manifest");
    let missing = "no NVTX range or mark named `strated` was seen";
    assert!(
        manifest
            .ranks
            .iter()
            .all(|r| r.warnings.iter().any(|w| w.contains(missing))),
        "{what}: {:?}",
        manifest.ranks
    );
    let ls = Command::new(integration_tests::bin("ttrace"))
        .arg("ls")
        .arg(&run.store)
        .output()
        .expect("ttrace ls runs");
    let listed = String::from_utf8_lossy(&ls.stdout);
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with("WARNING rank 0 (pid ") && l.contains(missing)),
        "{what}: ttrace ls: {listed}"
    );
}

#[test]
fn the_nvtx_v2_library_loading_ttrace_as_its_tool_counts_each_range_once() {
    let sim = integration_tests::sim_dir();
    let run = run_c(
        nvtx_program("nvtx2", 12, &sim, true),
        "nvtx2-c",
        "nvtx2",
        "NVTX v2",
    );
    // The library attached ttrace as its tool: its push answered with ttrace's value, not
    // with the level the simulated library returns on its own.
    assert_eq!(first_push(&run, "nvtx2"), -2);
    assert_eq!(ranges(&run), expected_ranges());
    assert_starts_and_misses_mark_steps(
        || nvtx_program("nvtx2", 12, &sim, true),
        "nvtx2",
        "NVTX v2",
    );
}

/// The same with NVIDIA's own NVTX v2 library (from the nvidia-nvtx-cu12 wheel, beside its
/// headers; it runs without a GPU): it loads ttrace as its tool from `NVTX_INJECTION64_PATH`
/// as the simulated one does, and a range must still count once, a registered string's still
/// be read back.
#[test]
fn nvidias_nvtx_v2_library_loading_ttrace_as_its_tool_counts_each_range_once() {
    let include = integration_tests::abi_check::fetch_headers_for(12).expect("NVIDIA's headers");
    let nvtx = include
        .iter()
        .find(|d| d.ends_with("nvtx/include"))
        .and_then(|d| d.parent())
        .map(|d| d.join("lib/libnvToolsExt.so.1"))
        .filter(|l| l.is_file())
        .expect("libnvToolsExt.so.1 beside the NVTX headers (scripts/fetch-nvidia-headers.py)");
    // The program's libraries: the simulated runtime and NVIDIA's NVTX library.
    let dir = integration_tests::profile_dir().join("c-nvtx2-nvidia-libs");
    std::fs::create_dir_all(&dir).expect("library directory");
    for (name, target) in [
        (
            "libcudart.so.12",
            integration_tests::sim_dir().join("libcudart.so.12"),
        ),
        ("libnvToolsExt.so.1", nvtx),
    ] {
        let link = dir.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&target, &link).expect("link the library");
    }
    let exe = integration_tests::c_build::compile_c(
        "nvtx2.c",
        "nvtx2nvidia",
        12,
        &dir,
        &["libcudart.so.12", "libnvToolsExt.so.1"],
    );
    let program = || {
        let mut cmd = Command::new(&exe);
        cmd.env_remove("LD_LIBRARY_PATH");
        cmd
    };
    let what = "NVIDIA's NVTX v2 library";
    let run = run_c(program(), "nvtx2-nvidia", "nvtx2", what);
    assert_eq!(ranges(&run), expected_ranges());
    assert_starts_and_misses_mark_steps(program, "nvtx2", what);
}

/// The stand-in profiler tool (tests/integration/c/nvtx_tool.c), built once.
fn profiler_tool() -> PathBuf {
    static TOOL: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    TOOL.get_or_init(|| integration_tests::c_build::compile_preload_c("nvtx_tool.c", "nvtx_tool"))
        .clone()
}

/// What the stand-in profiler tool saw: every push of the program (the probe and three per
/// iteration; two domain pushes per iteration).
const PROFILER_SAW_ALL: &str = "nvtx_tool: 13 pushes, 9 domain pushes";

#[test]
fn a_profilers_nvtx_tool_is_chained_and_both_see_every_range() {
    let sim = integration_tests::sim_dir();
    let mut cmd = nvtx_program("nvtx3", 12, &sim, false);
    // As Nsight Systems names its tool.
    cmd.env("NVTX_INJECTION64_PATH", profiler_tool());
    let run = run_c(cmd, "nvtx3-profiler", "nvtx3", "a profiler's tool");
    assert_eq!(ranges(&run), expected_ranges(), "ttrace saw every range");
    let err = stderr(&run.out);
    assert!(
        err.contains(PROFILER_SAW_ALL),
        "the profiler saw every range: {err}"
    );
    // The program got the profiler's answers (its levels), not ttrace's.
    assert_eq!(first_push(&run, "nvtx3"), 0);

    // The profiler's library also preloaded, before libttrace.so: it exports an
    // `InitializeInjectionNvtx2` of its own, found first in the global scope.
    let mut cmd = nvtx_program("nvtx3", 12, &sim, false);
    cmd.env("NVTX_INJECTION64_PATH", profiler_tool());
    let preload = format!("{}:{}", profiler_tool().display(), libttrace().display());
    let run = traced_command_preloaded(cmd, "nvtx3-profiler-preloaded", &preload);
    assert_ok(&run);
    assert_eq!(ranges(&run), expected_ranges(), "ttrace saw every range");
    let err = stderr(&run.out);
    assert!(
        err.contains(PROFILER_SAW_ALL),
        "the profiler saw every range: {err}"
    );
}

/// A child that inherited `NVTX_INJECTION64_PATH` but not `LD_PRELOAD` loads libttrace.so for
/// NVTX alone: it must stay out of the way there (fill no slot), and hand NVTX to the profiler
/// its parent chained.
#[test]
fn a_process_that_did_not_preload_libttrace_gets_no_nvtx_tool_from_it() {
    let sim = integration_tests::sim_dir();
    let out = nvtx_program("nvtx3", 12, &sim, false)
        .env("NVTX_INJECTION64_PATH", libttrace())
        // As a traced parent that chained a profiler leaves it to its children.
        .env("NVTX_TOOL_BEFORE_TTRACE", profiler_tool())
        .env("TTRACE_LOG", "debug")
        // The profiler's library preloaded (libttrace.so not): it exports the same
        // `InitializeInjectionNvtx2`, and libttrace.so's own references to that name bind to
        // it; whether libttrace.so was preloaded must not be read from that name.
        .env("LD_PRELOAD", profiler_tool())
        .output()
        .expect("nvtx3 runs");
    let (stdout, err) = (String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(
        out.status.success() && stdout.contains("nvtx3: OK"),
        "{stdout}{err}"
    );
    assert!(
        !err.contains("handed its tables over"),
        "libttrace.so took NVTX's slots in a process that did not preload it: {err}"
    );
    assert!(
        err.contains(PROFILER_SAW_ALL),
        "the profiler still saw every range: {err}"
    );
}
