//! The HTML view of a [`CompareReport`]: one self-contained page (inline CSS and JavaScript, no
//! network) with the verdict, the divergence explanation, a plot of error against tolerance
//! along the op sequence per rank, the worst tensors and the runs compared.
//!
//! The static parts are written here, escaped; the plot is drawn in the browser from the report
//! embedded as JSON in a `<script type="application/json" id="report-data">`, with `<`, `>` and
//! `&` written as `\u003c`, `\u003e`, `\u0026` so that no string in it (a module name holding
//! `</script>`) can end the script element. When the plot has drawn, the page's script sets
//! `data-plot="rendered"` on `<body>` and `data-points` (points drawn) on the `<svg id="plot">`;
//! if it throws, `data-plot="error"` and a `.plot-error` element shows the message.

use std::fmt::Write as _;

use super::text::{
    counts, fmt_num, fmt_ratio, kernels_label, layout_label, merge_label, norm_reading, over_label,
    ranks_label, ratio, shape_label, steps_label, tensor_label, where_label, worst_indices,
};
use super::{Cause, CompareReport, Divergence, RunSummary, TensorComparison, Verdict};

/// Rows of the worst-tensors table.
const WORST_ROWS: usize = 12;

/// Renders `report` as a self-contained HTML page ([`write()`] into memory).
pub fn render(report: &CompareReport) -> String {
    let mut page = Vec::new();
    // Writing into memory fails only where a tensor the comparison spilled cannot be read
    // back (the report's own data serializes: plain data with string keys); the page then
    // ends where it stopped, which its script reports, and a warning says why.
    if let Err(e) = write(report, &mut page) {
        tracing::warn!("the HTML page ends early: {e}");
    }
    // Valid UTF-8: JSON is, and the escapes replace ASCII bytes with ASCII.
    String::from_utf8_lossy(&page).into_owned()
}

/// Writes `report` as a self-contained HTML page into `out`: the page around the report's
/// data is made in memory (kilobytes), the data itself (about the JSON report's size: tens of
/// MB for a comparison of many steps) is serialized straight into `out`, never held whole.
pub fn write(report: &CompareReport, out: &mut impl std::io::Write) -> std::io::Result<()> {
    let (before, after) = page(report);
    out.write_all(before.as_bytes())?;
    serde_json::to_writer(ScriptSafe(&mut *out), report).map_err(std::io::Error::other)?;
    out.write_all(after.as_bytes())
}

/// The page before the report's data (embedded as JSON) and after it.
fn page(report: &CompareReport) -> (String, String) {
    let verdict = match report.verdict {
        Verdict::Match => "MATCH",
        Verdict::Divergence => "DIVERGENCE",
    };
    let class = verdict.to_ascii_lowercase();
    let mut h = String::with_capacity(64 * 1024);
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>ttrace compare: {verdict} {}</title>\n<style>{CSS}</style>\n</head>\n\
         <body data-plot=\"pending\">\n",
        esc(&report.run.path)
    );
    let _ = write!(
        h,
        "<header id=\"verdict\" class=\"banner {class}\"><h1>{verdict}</h1>\
         <p>run <b>{}</b> vs reference <b>{}</b> &middot; {} &middot; {} &middot; {}</p></header>\n<main>\n",
        esc(&report.run.path),
        esc(&report.reference.path),
        esc(&layout_label(&report.layout)),
        esc(&report.precision),
        esc(&steps_label(&report.steps)),
    );
    if !report.capture_losses.is_empty() {
        h.push_str(
            "<section id=\"losses\"><h2>Incomplete capture</h2><p>What the capture lost was \
             not compared: a match covers only what was captured.</p><ul>\n",
        );
        for l in &report.capture_losses {
            let _ = writeln!(h, "<li>{}</li>", esc(&l.describe()));
        }
        h.push_str("</ul></section>\n");
    }
    summary(report, &mut h);
    let _ = write!(
        h,
        "<section id=\"plot-section\"><h2>Error against tolerance along the op sequence</h2>\n\
         <p class=\"note\">One point per rank and tensor: its relative error divided by the \
         tensor's tolerance (log scale). Above the line at 1, the tensor is beyond tolerance.</p>\n\
         <div id=\"legend\"></div>\n<div id=\"plot-wrap\"><svg id=\"plot\" \
         xmlns=\"http://www.w3.org/2000/svg\" role=\"img\" aria-label=\"error over tolerance per \
         rank along the op sequence\"></svg><div id=\"tooltip\" hidden></div></div>\n</section>\n"
    );
    worst_table(report, &mut h);
    runs_table(report, &mut h);
    if !report.warnings.is_empty() {
        h.push_str("<section id=\"warnings\"><h2>Warnings</h2><ul>\n");
        for w in &report.warnings {
            let _ = writeln!(h, "<li>{}</li>", esc(w));
        }
        h.push_str("</ul></section>\n");
    }
    h.push_str("</main>\n<script type=\"application/json\" id=\"report-data\">");
    let mut after = String::with_capacity(JS.len() + 64);
    after.push_str("</script>\n<script>");
    after.push_str(JS);
    after.push_str("</script>\n</body>\n</html>\n");
    (h, after)
}

/// JSON written through it is safe inside a `<script>` element: `<`, `>` and `&` (which
/// only occur inside JSON strings, where the `\u` escapes mean the same) become `\u003c`,
/// `\u003e` and `\u0026`.
struct ScriptSafe<W>(W);

impl<W: std::io::Write> std::io::Write for ScriptSafe<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut start = 0;
        for (i, &b) in buf.iter().enumerate() {
            let escape: &[u8] = match b {
                b'<' => b"\\u003c",
                b'>' => b"\\u003e",
                b'&' => b"\\u0026",
                _ => continue,
            };
            self.0.write_all(&buf[start..i])?;
            self.0.write_all(escape)?;
            start = i + 1;
        }
        self.0.write_all(&buf[start..])?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// The divergence explanation, or what a match compared.
fn summary(r: &CompareReport, h: &mut String) {
    match (&r.verdict, &r.first_divergence) {
        (Verdict::Divergence, Some(d)) => divergence(r, d, h),
        (Verdict::Divergence, None) => match r.replica_drift.first() {
            // Every tensor within tolerance, but replicas drifted apart.
            Some(d) => {
                let _ = writeln!(
                    h,
                    "<section id=\"divergence\"><h2>Replicas drifted apart</h2><p>Step {}, {}: {} differs across replicas {:?} (identical in step {}): ranks {:?} drifted; {} replicated tensors drifted in all.</p></section>",
                    d.step,
                    esc(d.nvtx.as_deref().unwrap_or("-")),
                    esc(&d.operand),
                    d.group,
                    d.identical_in,
                    d.ranks,
                    r.replica_drift.len()
                );
            }
            None => h.push_str(
                "<section id=\"divergence\"><p>No first divergence recorded.</p></section>\n",
            ),
        },
        (Verdict::Match, _) => matched(r, h),
    }
    let _ = writeln!(h, "<p class=\"counts\">{}</p>", esc(&counts(r)));
}

/// One row of a facts table.
fn fact(h: &mut String, k: &str, v: &str) {
    let _ = writeln!(h, "<tr><th>{}</th><td>{v}</td></tr>", esc(k));
}

/// The first divergence: where, which tensor, ranks, error, cause, what lies before it.
fn divergence(r: &CompareReport, d: &Divergence, h: &mut String) {
    let t = r.tensors.named(d.tensor);
    let t = t.as_deref();
    let _ = write!(
        h,
        "<section id=\"divergence\"><h2>First tensor beyond tolerance: {}</h2>\n\
         <table class=\"facts\">\n",
        esc(&where_label(d, t))
    );
    if let Some(t) = t {
        fact(
            h,
            "tensor",
            &format!(
                "<b>{}</b> of <code>{}</code> {} {}, {}",
                esc(&t.role),
                esc(&t.api),
                esc(&shape_label(&t.shape)),
                esc(&t.dtype),
                esc(&merge_label(&t.merge))
            ),
        );
    }
    fact(h, "op", &format!("<code>{}</code>", esc(&d.position)));
    fact(h, "ranks", &esc(&ranks_label(d, t)));
    if let Some(t) = t {
        error_facts(r, t, h);
    }
    let cause = match d.cause {
        Cause::Local => "LOCAL",
        Cause::Upstream => "UPSTREAM",
    };
    fact(
        h,
        "cause",
        &format!("<b class=\"warn\">{cause}</b>: {}", esc(&d.explanation)),
    );
    let last_good = match d.last_good.and_then(|i| r.tensors.named(i)) {
        Some(g) => format!(
            "{} at {} eps (tolerance {} eps)",
            esc(&tensor_label(&g)),
            fmt_num(g.error_eps),
            fmt_num(g.tolerance_eps)
        ),
        None => "none: the first compared tensor already differs".to_string(),
    };
    fact(h, "last good", &last_good);
    if !d.kernels_between.is_empty() {
        // The summary names them on one line; the list gives each its own.
        let mut v = format!(
            "<details><summary>{}</summary><ol>",
            esc(&kernels_label(&d.kernels_between, 160))
        );
        for k in &d.kernels_between {
            let _ = write!(v, "<li><code>{}</code></li>", esc(k));
        }
        v.push_str("</ol></details>");
        fact(h, "in between", &v);
    } else if d.cause == Cause::Upstream {
        fact(
            h,
            "in between",
            "no kernel launches logged between the last good tensor and this op",
        );
    }
    h.push_str("</table>\n</section>\n");
}

/// The diverged tensor's error against its tolerance, worst row and norm ratio.
fn error_facts(r: &CompareReport, t: &TensorComparison, h: &mut String) {
    let x = ratio(t.error_eps, t.tolerance_eps);
    let mut v = format!(
        "{} eps vs tolerance {} eps ({}): <b class=\"bad\">{}</b>",
        fmt_num(t.error_eps),
        fmt_num(t.tolerance_eps),
        esc(&t.tolerance_source),
        esc(&over_label(x))
    );
    if let Some(w) = &t.worst_row {
        let _ = write!(
            v,
            "; worst row {} on rank {}: {} eps",
            w.row,
            w.rank,
            fmt_num(w.error_eps)
        );
    }
    fact(h, "error", &v);
    let norm = match norm_reading(t.norm_ratio, &r.layout) {
        Some(reading) => format!(
            "run/reference norm = {}: <b class=\"warn\">{}</b>",
            fmt_ratio(t.norm_ratio),
            esc(&reading)
        ),
        None => format!("run/reference norm = {}", fmt_ratio(t.norm_ratio)),
    };
    fact(h, "norm", &norm);
}

/// A match: how many tensors, and the closest to its tolerance.
fn matched(r: &CompareReport, h: &mut String) {
    let _ = writeln!(
        h,
        "<section id=\"match\"><h2>All {} compared tensors are within tolerance</h2>",
        r.tensors.len()
    );
    if let Some(t) = worst_indices(r).first().and_then(|&i| r.tensors.named(i)) {
        let _ = writeln!(
            h,
            "<p>Largest error/tolerance: <b>{}</b> at {}: {} eps vs tolerance {} eps ({}).</p>",
            fmt_num(ratio(t.error_eps, t.tolerance_eps)),
            esc(&tensor_label(&t)),
            fmt_num(t.error_eps),
            fmt_num(t.tolerance_eps),
            esc(&t.tolerance_source)
        );
    }
    h.push_str("</section>\n");
}

fn worst_table(r: &CompareReport, h: &mut String) {
    let idx = worst_indices(r);
    if idx.is_empty() {
        return;
    }
    h.push_str(
        "<section><h2>Worst tensors</h2>\n<table id=\"worst\" class=\"grid\"><thead><tr>\
         <th>pos</th><th>step</th><th>module</th><th>api</th><th>role</th><th>shape</th>\
         <th>dtype</th><th>error eps</th><th>tolerance eps</th><th>error / tolerance</th>\
         <th>norm ratio</th><th>worst rank</th></tr></thead><tbody>\n",
    );
    for t in idx
        .iter()
        .filter_map(|&i| r.tensors.named(i))
        .take(WORST_ROWS)
    {
        let worst_rank = t
            .ranks
            .iter()
            .max_by(|a, b| {
                let f = |x: f64| if x.is_nan() { f64::INFINITY } else { x };
                f(a.error_eps).total_cmp(&f(b.error_eps))
            })
            .map(|w| format!("{} ({} eps)", w.rank, fmt_num(w.error_eps)))
            .unwrap_or_default();
        let _ = writeln!(
            h,
            "<tr{}><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td>\
             <td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
            if t.diverged {
                " class=\"diverged\""
            } else {
                ""
            },
            t.position,
            t.step,
            esc(t.nvtx.as_deref().unwrap_or("-")),
            esc(&t.api),
            esc(&t.role),
            esc(&shape_label(&t.shape)),
            esc(&t.dtype),
            fmt_num(t.error_eps),
            fmt_num(t.tolerance_eps),
            fmt_num(ratio(t.error_eps, t.tolerance_eps)),
            fmt_ratio(t.norm_ratio),
            esc(&worst_rank),
        );
    }
    h.push_str("</tbody></table></section>\n");
}

fn runs_table(r: &CompareReport, h: &mut String) {
    h.push_str(
        "<section id=\"runs\"><h2>Runs</h2>\n<table class=\"grid\"><thead><tr><th></th>\
         <th>path</th><th>run id</th><th>ranks</th><th>command</th></tr></thead><tbody>\n",
    );
    let mut run_row = |name: &str, s: &RunSummary| {
        let _ = writeln!(
            h,
            "<tr><th>{name}</th><td><code>{}</code></td><td><code>{}</code></td><td>{}</td>\
             <td><code>{}</code></td></tr>",
            esc(&s.path),
            esc(&s.run_id),
            s.world_size,
            esc(&s.command)
        );
    };
    run_row("run", &r.run);
    run_row("reference", &r.reference);
    if let Some(p) = &r.perturbed {
        run_row("perturbed reference", p);
    }
    let l = &r.layout;
    let _ = writeln!(
        h,
        "</tbody></table>\n<table class=\"facts\"><tr><th>layout</th><td>tp {} &middot; dp {} \
         &middot; pp {} (rank order {}, {})</td></tr><tr><th>precision</th><td>{} (epsilon {})\
         </td></tr><tr><th>steps</th><td>{}</td></tr></table>\n</section>",
        l.tp,
        l.dp,
        l.pp,
        esc(if l.order.is_empty() { "-" } else { &l.order }),
        if l.discovered {
            "from the communicator map"
        } else {
            "given with --layout"
        },
        esc(&r.precision),
        r.epsilon,
        esc(&steps_label(&r.steps))
    );
}

/// Escapes text for HTML element content and quoted attributes.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The page's style sheet (assets/report.css; a file, so that editors and linters see CSS).
const CSS: &str = include_str!("assets/report.css");

/// The plot's script (assets/report.js): draws the report embedded as JSON, no network.
const JS: &str = include_str!("assets/report.js");

#[cfg(test)]
mod tests {
    use super::super::text::tests::sample;
    use super::*;

    fn json_in(html: &str) -> &str {
        let open = "<script type=\"application/json\" id=\"report-data\">";
        let start = html.find(open).expect("report data") + open.len();
        let len = html[start..].find("</script>").expect("end of report data");
        &html[start..start + len]
    }

    /// However the JSON's bytes arrive (serde_json writes a string in pieces), every `<`,
    /// `>` and `&` is escaped and nothing else changes.
    #[test]
    fn script_safe_escapes_across_any_split_of_its_input() {
        use std::io::Write as _;
        let text = r#"{"nvtx":"a</script>&b>c","x":1}"#;
        let want = r#"{"nvtx":"a\u003c/script\u003e\u0026b\u003ec","x":1}"#;
        for split in 0..=text.len() {
            let mut out = Vec::new();
            let mut w = ScriptSafe(&mut out);
            w.write_all(&text.as_bytes()[..split]).expect("write");
            w.write_all(&text.as_bytes()[split..]).expect("write");
            assert_eq!(
                String::from_utf8(out).expect("utf-8"),
                want,
                "split at {split}"
            );
        }
        // The page written through a writer is the page rendered.
        let r = sample(Verdict::Divergence);
        let mut page = Vec::new();
        write(&r, &mut page).expect("write");
        assert_eq!(String::from_utf8(page).expect("utf-8"), render(&r));
    }

    #[test]
    fn a_module_name_cannot_break_out_of_the_script_tag() {
        let mut r = sample(Verdict::Divergence);
        let evil = "layers.0</script><script>alert(1)</script><!-- & \u{2028}";
        r.tensors.get_mut(0).expect("a tensor").nvtx = Some(evil.into());
        r.warnings
            .push("</SCRIPT><img src=x onerror=alert(2)>".into());
        let html = render(&r);
        // Exactly the page's own two script elements end.
        assert_eq!(html.to_ascii_lowercase().matches("</script").count(), 2);
        assert_eq!(html.matches("<script").count(), 2);
        assert!(!html.contains("<img"), "unescaped markup in the page");
        assert!(!html.contains("<!--"));
        // The embedded JSON is the report's JSON with only `<`, `>`, `&` spelled as escapes,
        // and reads back with the evil name intact.
        let embedded = json_in(&html);
        assert!(!embedded.contains(['<', '>', '&']));
        let plain = embedded
            .replace("\\u003c", "<")
            .replace("\\u003e", ">")
            .replace("\\u0026", "&");
        assert!(
            plain == serde_json::to_string(&r).unwrap(),
            "embedded JSON differs"
        );
        let back: CompareReport = serde_json::from_str(embedded).expect("valid JSON");
        let first = back.tensors.get(0).expect("a tensor");
        assert_eq!(first.nvtx.as_deref(), Some(evil));
        assert_eq!(back.warnings, r.warnings);
    }

    #[test]
    fn the_page_is_self_contained_and_states_the_verdict() {
        let html = render(&sample(Verdict::Divergence));
        assert!(html.starts_with("<!DOCTYPE html>"));
        for s in ["http:", "https:", "src=", "<link", "@import", "url("] {
            // The SVG namespace URI is an identifier, not a fetch.
            let n = html.matches(s).count()
                - if s == "http:" {
                    html.matches("http://www.w3.org/2000/svg").count()
                } else {
                    0
                };
            assert_eq!(n, 0, "{s:?} in a page that must not fetch anything");
        }
        for s in [
            "<h1>DIVERGENCE</h1>",
            "step 0, micro-batch 1, forward, layers.1.mlp.fc2",
            "412x over tolerance",
            "a tensor scaled by 2 (= tp = dp = pp)",
            "<b class=\"warn\">LOCAL</b>: The GEMM&#39;s output",
            "<table id=\"worst\"",
            "torchrun --nproc-per-node 8 train.py",
            "<svg id=\"plot\"",
            "data-plot=\"pending\"",
        ] {
            assert!(html.contains(s), "missing {s:?}");
        }
        let m = render(&sample(Verdict::Match));
        assert!(m.contains("<h1>MATCH</h1>"));
        assert!(m.contains("All 24 compared tensors are within tolerance"));
        assert!(!m.contains("id=\"divergence\""));
    }
}
