//! Reliability of `ttrace run` and the manifest: secrets, scheduler signals, option validation,
//! inherited TTRACE_* variables, a command that never ran (docs/guarantees.md).

use crate::reliability_util;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use reliability_util::*;
use ttrace_format::store::Manifest;

const LIMIT: Duration = Duration::from_secs(120);

/// Credentials in the environment are redacted in the manifest (and so in
/// `ls --env`), unless allowed by name; the manifest is not readable by others.
#[test]
fn secrets_in_the_environment_are_redacted() {
    let dir = TempDir::new("rel-secrets");
    let run = |store: &str, extra: &[&str]| {
        let mut c = ttrace(dir.path());
        c.args(["run", "-q", "--out", store])
            .args(extra)
            .args(["--", "true"])
            .env("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI")
            .env("HF_TOKEN", "hf_abcdef")
            .env("DATABASE_URL", "postgres://me:hunter2@db/x")
            .env("PLAIN_SETTING", "visible");
        let out = output_within(&mut c, LIMIT);
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        Manifest::read(&dir.path().join(store)).expect("manifest")
    };
    let m = run("st", &[]);
    assert_eq!(m.env["AWS_SECRET_ACCESS_KEY"], "<redacted>");
    assert_eq!(m.env["HF_TOKEN"], "<redacted>");
    assert_eq!(m.env["DATABASE_URL"], "postgres://me:<redacted>@db/x");
    assert_eq!(m.env["PLAIN_SETTING"], "visible");
    let body = std::fs::read_to_string(dir.path().join("st/manifest.json")).expect("read");
    for secret in ["wJalrXUtnFEMI", "hf_abcdef", "hunter2"] {
        assert!(!body.contains(secret), "{secret} is in the manifest");
    }
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(dir.path().join("st/manifest.json"))
            .expect("stat")
            .permissions(),
    );
    assert_eq!(mode & 0o077, 0, "manifest mode {mode:o}");
    let mut ls = ttrace(dir.path());
    ls.args(["ls", "--env", "st"]);
    let out = output_within(&mut ls, LIMIT);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("hf_abcdef"));
    let m = run("st2", &["--env-allow", "HF_TOKEN"]);
    assert_eq!(m.env["HF_TOKEN"], "hf_abcdef", "allowed by name");
    assert_eq!(m.env["AWS_SECRET_ACCESS_KEY"], "<redacted>");
}

/// `ttrace run` with a command that prints `ready` once its traps are set.
fn started(dir: &Path, store: &str, script: &str) -> std::process::Child {
    let mut child = ttrace(dir)
        .args(["run", "--out", store, "--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ttrace starts");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().expect("stdout"))
        .read_line(&mut line)
        .expect("reads");
    assert_eq!(line.trim(), "ready");
    child
}

/// SIGHUP, SIGUSR1 (Slurm's pre-timeout signal), SIGUSR2 and SIGQUIT sent to
/// `ttrace run` reach the command; ttrace survives them, finalizes the store and removes its
/// socket.
#[test]
fn scheduler_signals_are_forwarded_and_the_store_finalized() {
    let dir = TempDir::new("rel-signals");
    for (sig, name, code) in [
        (libc::SIGHUP, "HUP", 41),
        (libc::SIGUSR1, "USR1", 42),
        (libc::SIGUSR2, "USR2", 43),
        (libc::SIGQUIT, "QUIT", 44),
    ] {
        let store = format!("st-{name}");
        let script = format!("trap 'exit {code}' {name}; echo ready; while :; do sleep 0.05; done");
        let mut child = started(dir.path(), &store, &script);
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(child.id() as i32, sig) };
        let st = wait_at_most(&mut child, LIMIT);
        assert_eq!(st.code(), Some(code), "SIG{name}: {st:?}");
        let m = Manifest::read(&dir.path().join(&store)).expect("manifest");
        assert!(m.finalized, "SIG{name}: the store is finalized");
        assert_eq!(m.exit_code, Some(code));
        let sock = Path::new(&m.env["TTRACE_SOCKET"]).to_path_buf();
        assert!(!sock.exists(), "SIG{name}: the socket is removed");
        assert!(
            !sock.parent().expect("dir").exists(),
            "SIG{name}: its directory too"
        );
    }
}

/// Options out of range are refused with a message naming them, before anything is
/// created.
#[test]
fn out_of_range_options_are_refused_before_anything_starts() {
    let dir = TempDir::new("rel-options");
    for (opt, value) in [
        ("--linger", "18446744073709551615"),
        ("--threads", "100000"),
        ("--threads", "0"),
        ("--ring-bytes", "1"),
        ("--wait-ms", "18446744073709551615"),
    ] {
        let mut c = ttrace(dir.path());
        c.args(["run", "--out", "st", opt, value, "--", "true"]);
        let out = output_within(&mut c, LIMIT);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{opt} {value}: {}",
            describe(&out)
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(opt), "{opt}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(!dir.path().join("st").exists(), "{opt}: no store left");
    }
}

/// TTRACE_* variables from the shell are not silently passed on while the manifest
/// records other settings: they are named and kept from the command, whose environment is
/// the manifest's.
#[test]
fn inherited_ttrace_variables_never_diverge_from_the_manifest() {
    use std::os::unix::ffi::OsStrExt;
    let dir = TempDir::new("rel-inherit");
    let mut c = ttrace(dir.path());
    c.args([
        "run",
        "--out",
        "st",
        "--",
        "sh",
        "-c",
        "env | grep ^TTRACE_ | sort",
    ])
    .env("TTRACE_STEPS", "5-6")
    .env("TTRACE_MAX_TENSOR_BYTES", "1")
    .env(
        std::ffi::OsStr::from_bytes(b"TTRACE_RANKS"),
        std::ffi::OsStr::from_bytes(b"\xff\xfe"),
    );
    let out = output_within(&mut c, LIMIT);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for k in ["TTRACE_STEPS", "TTRACE_RANKS"] {
        assert!(stderr.contains(&format!("ignoring {k}")), "{k}: {stderr}");
    }
    let child_env: Vec<(String, String)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert!(
        !child_env
            .iter()
            .any(|(k, _)| k == "TTRACE_STEPS" || k == "TTRACE_RANKS"),
        "{child_env:?}"
    );
    let m = Manifest::read(&dir.path().join("st")).expect("manifest");
    assert!(m.config.steps.is_none());
    for (k, v) in &child_env {
        assert_eq!(
            m.env.get(k),
            Some(v),
            "{k}: the command's value is the manifest's"
        );
    }
    assert_eq!(m.env["TTRACE_MAX_TENSOR_BYTES"], (64u64 << 30).to_string());
}

/// A command that could not be started leaves no store behind, so the same `--out`
/// works once it is fixed.
#[test]
fn a_command_that_never_ran_leaves_no_store() {
    let dir = TempDir::new("rel-notrun");
    let mut c = ttrace(dir.path());
    c.args(["run", "--out", "st", "--", "/nonexistent/cmd"]);
    let out = output_within(&mut c, LIMIT);
    assert_eq!(out.status.code(), Some(127), "{}", describe(&out));
    assert!(!dir.path().join("st").exists(), "{}", describe(&out));
    let mut c = ttrace(dir.path());
    c.args(["run", "-q", "--out", "st", "--", "true"]);
    let out = output_within(&mut c, LIMIT);
    assert_eq!(
        out.status.code(),
        Some(0),
        "the retry works: {}",
        describe(&out)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    // One cause, said once (anyhow's chain printed the io error twice).
    let mut c = ttrace(dir.path());
    c.args(["run", "--out", "st", "--", "true"]);
    let out = output_within(&mut c, LIMIT);
    let again = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{again}");
    assert_eq!(again.matches("not empty").count(), 1, "{again}");
    let _ = stderr;
}

/// A reading command's `--apis` that names nothing known is an error, not an empty
/// success.
#[test]
fn an_unknown_api_filter_is_an_error() {
    let dir = TempDir::new("rel-apis");
    let mut c = ttrace(dir.path());
    c.args(["run", "-q", "--out", "st", "--"])
        .arg(loadgen())
        .args(["publish", "--records", "3"]);
    let out = output_within(&mut c, LIMIT);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let mut c = ttrace(dir.path());
    c.args([
        "export",
        "st",
        "--format",
        "safetensors",
        "--apis",
        "foo",
        "--out",
        "x",
    ]);
    let out = output_within(&mut c, LIMIT);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--apis"));
    let mut c = ttrace(dir.path());
    c.args([
        "export",
        "st",
        "--format",
        "safetensors",
        "--apis",
        "gemm",
        "--out",
        "x",
    ]);
    let out = output_within(&mut c, LIMIT);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
}
