//! The HTML report of `ttrace compare`, opened in headless Chromium: the plot draws one point per
//! (tensor, rank), marks the first divergence above the tolerance line, and shows no error; a
//! module name holding `</script>` injects nothing; a broken report shows its error in the page.
//!
//! Needs Chromium (`apt-get install chromium`, or `$CHROMIUM` naming the binary); CI installs it,
//! so its absence fails the test rather than skipping it.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ttrace_compare::report::{
    html, Cause, CompareReport, CompareStats, Divergence, LayoutSummary, Merge, RankError,
    RunSummary, TensorComparison, Verdict, WorstRow,
};

/// A module name that would end the JSON's script element if it were not escaped.
const EVIL: &str = "layers.0</script><b id=\"injected\">x</b><script>";

/// Finds Chromium or fails the test with how to install it.
fn chromium() -> PathBuf {
    if let Some(p) = std::env::var_os("CHROMIUM").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for name in ["chromium", "chromium-browser"] {
        for dir in std::env::split_paths(&path) {
            let p = dir.join(name);
            if p.is_file() {
                return p;
            }
        }
    }
    panic!(
        "Chromium is required by this test (it renders the HTML report headless) and was not \
         found as `chromium` or `chromium-browser` on PATH, nor in $CHROMIUM. Install it with \
         `sudo apt-get install -y chromium` (Debian/Ubuntu; .ci/run does this in CI) or set \
         CHROMIUM=/path/to/chrome."
    );
}

/// Renders `html` in headless Chromium and returns the DOM after the page's scripts ran.
fn dump_dom(html: &str, name: &str) -> String {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("compare_html");
    std::fs::create_dir_all(&dir).unwrap();
    let page = dir.join(format!("{name}.html"));
    std::fs::write(&page, html).unwrap();
    let out_path = dir.join(format!("{name}.dom"));
    let err_path = dir.join(format!("{name}.stderr"));
    let profile = dir.join(format!("profile-{name}-{}", std::process::id()));
    let url = format!("file://{}", page.canonicalize().unwrap().display());
    let bin = chromium();
    let mut child = Command::new(&bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-dev-shm-usage",
            "--no-first-run",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--dump-dom")
        .arg(&url)
        .stdin(Stdio::null())
        .stdout(File::create(&out_path).unwrap())
        .stderr(File::create(&err_path).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish within 120 s on {url}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = std::fs::remove_dir_all(&profile);
    let dom = std::fs::read_to_string(&out_path).unwrap();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    assert!(
        status.success() && dom.contains("</html>"),
        "chromium failed ({status}) on {url}:\n{}",
        tail(&stderr, 3000)
    );
    dom
}

fn tail(s: &str, n: usize) -> &str {
    let mut i = s.len().saturating_sub(n);
    while !s.is_char_boundary(i) {
        i += 1;
    }
    &s[i..]
}

/// The DOM without the contents of its script elements (the JSON and the code mention the
/// names the checks look for).
fn without_scripts(dom: &str) -> String {
    let mut out = String::new();
    let mut rest = dom;
    while let Some(i) = rest.find("<script") {
        out.push_str(&rest[..i]);
        let j = rest[i..].find("</script>").expect("script element ends") + i;
        rest = &rest[j + "</script>".len()..];
    }
    out.push_str(rest);
    out
}

/// The opening tags of elements carrying `marker` (e.g. `class="series"`), each as text.
fn tags_with<'a>(dom: &'a str, marker: &str) -> Vec<&'a str> {
    let mut tags = Vec::new();
    let mut from = 0;
    while let Some(k) = dom[from..].find(marker) {
        let at = from + k;
        let start = dom[..=at].rfind('<').unwrap();
        let end = at + dom[at..].find('>').unwrap();
        tags.push(&dom[start..=end]);
        from = end;
    }
    tags
}

fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=\"");
    let i = tag.find(&key)? + key.len();
    let j = tag[i..].find('"')? + i;
    Some(&tag[i..j])
}

/// The points of a series path: `M x y h0` per point.
fn points_of(d: &str) -> Vec<(f64, f64)> {
    d.split('M')
        .filter(|s| !s.is_empty())
        .map(|s| {
            let s = s
                .strip_suffix("h0")
                .unwrap_or_else(|| panic!("point {s:?}"));
            let (x, y) = s.split_once(' ').unwrap();
            (x.parse().unwrap(), y.parse().unwrap())
        })
        .collect()
}

/// xorshift: reproducible spread of errors without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Log-uniform in [lo, hi).
    fn log_uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo * (hi / lo).powf(self.next())
    }
}

/// A tp2/dp2/pp2 run over 2 steps of 2 micro-batches and 4 layers (2 per stage): 576 tensors,
/// each held by the 4 ranks (tp x dp) of its stage. With `diverge`, layer 2's fc2 output in
/// step 0, micro-batch 1, forward is off by 2x on ranks 4 and 5 and everything after it on
/// those ranks is wrong too (one error is NaN, serialized as null).
fn realistic(diverge: bool) -> CompareReport {
    let (tp, dp, pp) = (2u32, 2u32, 2u32);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut tensors = Vec::new();
    let mut position = 0u64;
    let mut first: Option<usize> = None;
    let mut seq = [0u64; 8];
    for step in 0..2u64 {
        let mut ref_seq = 0u64;
        for pass in ["forward", "backward"] {
            for mb in 0..2u32 {
                let layers: Vec<u32> = if pass == "forward" {
                    (0..4).collect()
                } else {
                    (0..4).rev().collect()
                };
                for layer in layers {
                    let stage = layer / 2;
                    let ops: &[&str] = if pass == "forward" {
                        &["attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"]
                    } else {
                        &[
                            "mlp.fc2.dgrad",
                            "mlp.fc2.wgrad",
                            "mlp.fc1.dgrad",
                            "mlp.fc1.wgrad",
                            "attn.proj.dgrad",
                            "attn.proj.wgrad",
                            "attn.qkv.dgrad",
                            "attn.qkv.wgrad",
                        ]
                    };
                    for op in ops {
                        let holders: Vec<u32> = (0..dp)
                            .flat_map(|d| (0..tp).map(move |t| t + tp * d + tp * dp * stage))
                            .collect();
                        let module = if step == 0 && layer == 0 && *op == "attn.qkv" {
                            EVIL.to_string()
                        } else {
                            format!("layers.{layer}.{op}")
                        };
                        for role in ["A", "B", "D"] {
                            let index = tensors.len();
                            let trigger = diverge
                                && first.is_none()
                                && step == 0
                                && pass == "forward"
                                && mb == 1
                                && layer == 2
                                && *op == "mlp.fc2"
                                && role == "D";
                            if trigger {
                                first = Some(index);
                            }
                            let bad_after = first.is_some_and(|f| index >= f);
                            let tolerance = rng.log_uniform(150.0, 600.0);
                            let ranks: Vec<RankError> = holders
                                .iter()
                                .map(|&rank| {
                                    seq[rank as usize] += 1;
                                    let wrong = bad_after && (rank == 4 || rank == 5);
                                    let error_eps = if wrong && index == first.unwrap() + 7 {
                                        f64::NAN
                                    } else if wrong {
                                        rng.log_uniform(2e4, 3e5)
                                    } else {
                                        rng.log_uniform(0.3, 90.0)
                                    };
                                    RankError {
                                        rank,
                                        seq: seq[rank as usize],
                                        error_eps,
                                    }
                                })
                                .collect();
                            let error_eps =
                                ranks.iter().map(|r| r.error_eps).fold(0.0, |a: f64, e| {
                                    if a.is_nan() || e.is_nan() {
                                        f64::NAN
                                    } else {
                                        a.max(e)
                                    }
                                });
                            tensors.push(TensorComparison {
                                position,
                                step,
                                ref_seq,
                                api: if *op == "mlp.fc2" {
                                    "cublasLtMatmul".into()
                                } else {
                                    "cublasGemmEx".into()
                                },
                                role: role.into(),
                                nvtx: Some(format!("{pass}.mb{mb}/{module}")),
                                shape: vec![256, 512],
                                dtype: "BF16".into(),
                                merge: if role == "D" && op.ends_with("proj") {
                                    Merge::Sum { group_size: tp }
                                } else {
                                    Merge::Slice {
                                        dim: 1,
                                        parts: u64::from(tp),
                                        outer: 1,
                                    }
                                },
                                ranks,
                                error_eps,
                                worst_row: Some(WorstRow {
                                    rank: holders[0],
                                    row: 3,
                                    error_eps: error_eps * 1.5,
                                }),
                                norm_ratio: if bad_after { 2.0 } else { 1.0 + 1e-4 },
                                tolerance_eps: tolerance,
                                tolerance_source: "analytic".into(),
                                diverged: bad_after,
                            });
                        }
                        position += 1;
                        ref_seq += 1;
                    }
                }
            }
        }
    }
    let ratio = |t: &TensorComparison| {
        let x = t.error_eps / t.tolerance_eps;
        if x.is_nan() {
            f64::INFINITY
        } else {
            x
        }
    };
    let mut worst: Vec<usize> = (0..tensors.len()).collect();
    worst.sort_by(|&a, &b| ratio(&tensors[b]).total_cmp(&ratio(&tensors[a])));
    worst.truncate(8);
    let first_divergence = first.map(|f| Divergence {
        tensor: f,
        cause: Cause::Local,
        explanation: "Recomputed in f64 from its own captured inputs, this GEMM's output is 2x \
                      the reference while its inputs match: the row-parallel partial sums were \
                      reduced twice."
            .into(),
        last_good: Some(f - 1),
        kernels_between: vec![],
        ranks: vec![4, 5],
        step: 0,
        micro_batch: Some(1),
        pass: Some("forward".into()),
        module: Some("layers.2.mlp.fc2".into()),
        position: format!(
            "rank 4 step 0 seq {}: cublasLtMatmul m=256 n=512 k=1024",
            tensors[f].ranks[0].seq
        ),
    });
    let n = tensors.len() as u64;
    CompareReport {
        reference: RunSummary {
            path: "runs/ref-1gpu".into(),
            run_id: "ref".into(),
            command: "python train.py --tp 1".into(),
            world_size: 1,
        },
        run: RunSummary {
            path: "runs/tp2-dp2-pp2".into(),
            run_id: "run".into(),
            command: "torchrun --nproc-per-node 8 train.py --tp 2 --pp 2".into(),
            world_size: 8,
        },
        perturbed: None,
        layout: LayoutSummary {
            tp,
            dp,
            pp,
            order: "tp-dp-pp".into(),
            discovered: true,
        },
        precision: "bf16".into(),
        epsilon: 0.0078125,
        steps: vec![0, 1],
        verdict: if diverge {
            Verdict::Divergence
        } else {
            Verdict::Match
        },
        first_divergence,
        tensors: tensors.into(),
        worst,
        warnings: vec!["rank 6: 3 ops with no counterpart in the reference".into()],
        not_comparable: vec![],
        replica_drift: vec![],
        dp_reduction: None,
        roundoff_jumps: vec![],
        chaotic_steps: vec![],
        capture_losses: vec![],
        stats: CompareStats {
            reference_ops: n / 3,
            reference_gemms_aligned: n / 3,
            aligned_ops: n / 3 * 4,
            unaligned_ops: 3,
            tensors_compared: n,
            bytes_compared: n * 256 * 512 * 2 * 2,
            elapsed_s: 2.5,
        },
    }
}

/// A rank and the (x, y) of its points in SVG coordinates.
type Series = (u32, Vec<(f64, f64)>);

/// Checks a rendered page; returns the series paths' points per rank and the tolerance line's y.
fn check_rendered(report: &CompareReport, dom: &str) -> (Vec<Series>, f64) {
    let body = tags_with(dom, "<body")[0];
    assert_eq!(attr(body, "data-plot"), Some("rendered"), "{body}");
    let visible = without_scripts(dom);
    if let Some(i) = visible.find("class=\"plot-error\"") {
        panic!(
            "the page shows an error: {}",
            &visible[i..(i + 2000).min(visible.len())]
        );
    }
    let verdict = match report.verdict {
        Verdict::Match => "<h1>MATCH</h1>",
        Verdict::Divergence => "<h1>DIVERGENCE</h1>",
    };
    assert!(visible.contains(verdict));
    assert!(
        !visible.contains("<b id=\"injected\">"),
        "a module name injected markup"
    );

    let tensors = report.tensors.clone().into_vec().expect("the tensors read");
    let expected: usize = tensors.iter().map(|t| t.ranks.len()).sum();
    let svg = tags_with(&visible, "<svg id=\"plot\"")[0];
    assert_eq!(
        attr(svg, "data-points"),
        Some(expected.to_string().as_str())
    );
    // Every counted point is drawn: one dot per (tensor, rank), a path per rank.
    let mut series = Vec::new();
    for tag in tags_with(&visible, "class=\"series\"") {
        let rank: u32 = attr(tag, "data-rank").unwrap().parse().unwrap();
        let pts = points_of(attr(tag, "d").unwrap());
        let held = tensors
            .iter()
            .filter(|t| t.ranks.iter().any(|r| r.rank == rank))
            .count();
        assert_eq!(pts.len(), held, "rank {rank}");
        series.push((rank, pts));
    }
    let mut ranks: Vec<u32> = series.iter().map(|s| s.0).collect();
    ranks.sort_unstable();
    assert_eq!(ranks, (0..8).collect::<Vec<_>>());
    assert_eq!(series.iter().map(|s| s.1.len()).sum::<usize>(), expected);
    let tol = tags_with(&visible, "id=\"tolerance-line\"")[0];
    let tol_y: f64 = attr(tol, "y1").unwrap().parse().unwrap();
    (series, tol_y)
}

#[test]
fn divergence_report_plots_every_rank_and_marks_the_first_divergence() {
    let report = realistic(true);
    assert!(report.tensors.len() >= 300);
    let d = report.first_divergence.clone().unwrap();
    let html = html::render(&report);
    let dom = dump_dom(&html, "divergence");
    let (series, tol_y) = check_rendered(&report, &dom);
    let visible = without_scripts(&dom);
    let tensors = report.tensors.clone().into_vec().expect("the tensors read");

    // The marker stands at the diverging tensor's position, with a ring per diverging rank.
    let t = report
        .tensors
        .get(d.tensor)
        .expect("the divergence's tensor");
    let marker = tags_with(&visible, "id=\"divergence-marker\"");
    assert_eq!(marker.len(), 1);
    assert_eq!(
        attr(marker[0], "data-position"),
        Some(t.position.to_string().as_str())
    );
    assert_eq!(
        visible.matches("class=\"marker-ring\"").count(),
        d.ranks.len()
    );
    assert!(visible.contains(&format!("first divergence: pos {}", t.position)));

    // Log scale with 1 at the tolerance line: ranks 4 and 5 go above it (smaller y) from
    // the divergence on, the healthy ranks never do.
    for (rank, pts) in &series {
        let above = pts.iter().filter(|p| p.1 < tol_y).count();
        if *rank == 4 || *rank == 5 {
            let after = tensors
                .iter()
                .enumerate()
                .filter(|(i, t)| *i >= d.tensor && t.ranks.iter().any(|r| r.rank == *rank))
                .count();
            assert_eq!(above, after, "rank {rank}");
        } else {
            assert_eq!(above, 0, "rank {rank}");
        }
    }

    // The explanation and the worst tensors are in the page.
    for s in [
        "step 0, micro-batch 1, forward, layers.2.mlp.fc2",
        "a tensor scaled by 2",
        "reduced twice",
        "<table id=\"worst\"",
        "torchrun --nproc-per-node 8 train.py --tp 2 --pp 2",
    ] {
        assert!(visible.contains(s), "missing {s:?}");
    }
}

#[test]
fn match_report_plots_everything_below_tolerance() {
    let report = realistic(false);
    let dom = dump_dom(&html::render(&report), "match");
    let (series, tol_y) = check_rendered(&report, &dom);
    let visible = without_scripts(&dom);
    assert!(!visible.contains("divergence-marker"));
    assert!(visible.contains(&format!(
        "All {} compared tensors are within tolerance",
        report.tensors.len()
    )));
    for (rank, pts) in &series {
        assert!(
            pts.iter().all(|p| p.1 > tol_y),
            "rank {rank} above tolerance"
        );
    }
}

#[test]
fn a_broken_report_shows_its_error_in_the_page() {
    let html = html::render(&realistic(false));
    let open = "<script type=\"application/json\" id=\"report-data\">";
    let start = html.find(open).unwrap() + open.len();
    let end = start + html[start..].find("</script>").unwrap();
    let broken = format!("{}{{\"tensors\": 5}}{}", &html[..start], &html[end..]);
    let dom = dump_dom(&broken, "broken");
    let body = tags_with(&dom, "<body")[0];
    assert_eq!(attr(body, "data-plot"), Some("error"), "{body}");
    let visible = without_scripts(&dom);
    assert!(
        visible.contains("class=\"plot-error\"") && visible.contains("no report data"),
        "{}",
        tail(&visible, 2000)
    );
}
