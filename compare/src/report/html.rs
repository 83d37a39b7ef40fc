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

/// Renders `report` as a self-contained HTML page.
pub fn render(report: &CompareReport) -> String {
    let verdict = match report.verdict {
        Verdict::Match => "MATCH",
        Verdict::Divergence => "DIVERGENCE",
    };
    let class = verdict.to_ascii_lowercase();
    let mut h = String::with_capacity(64 * 1024 + report.tensors.len() * 400);
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
    h.push_str(&embed_json(report));
    h.push_str("</script>\n<script>");
    h.push_str(JS);
    h.push_str("</script>\n</body>\n</html>\n");
    h
}

/// The report as JSON safe inside a `<script>` element.
fn embed_json(report: &CompareReport) -> String {
    // Serializing plain data with string keys cannot fail; fall back to null all the same,
    // which the page reports as a plot error.
    let json = serde_json::to_string(report).unwrap_or_else(|_| "null".to_string());
    // `<`, `>` and `&` only occur inside JSON strings, where the \u escapes mean the same.
    json.replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
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
    let t = r.tensors.get(d.tensor);
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
    let last_good = match d.last_good.and_then(|i| r.tensors.get(i)) {
        Some(g) => format!(
            "{} at {} eps (tolerance {} eps)",
            esc(&tensor_label(g)),
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
    if let Some(t) = worst_indices(r).first().and_then(|&i| r.tensors.get(i)) {
        let _ = writeln!(
            h,
            "<p>Largest error/tolerance: <b>{}</b> at {}: {} eps vs tolerance {} eps ({}).</p>",
            fmt_num(ratio(t.error_eps, t.tolerance_eps)),
            esc(&tensor_label(t)),
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
        .filter_map(|&i| r.tensors.get(i))
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

const CSS: &str = r##"
:root { color-scheme: light; --bad: #c62828; --good: #2e7d32; --warn: #b26a00; --fg: #1d1d1f; --muted: #666; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg); background: #fafafa; }
main { max-width: 1200px; margin: 0 auto; padding: 0 20px 40px; }
code { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: 12.5px; }
.banner { padding: 14px 20px; color: #fff; }
.banner h1 { margin: 0; font-size: 26px; letter-spacing: 0.04em; }
.banner p { margin: 4px 0 0; opacity: 0.95; }
.banner.divergence { background: var(--bad); }
.banner.match { background: var(--good); }
h2 { font-size: 17px; margin: 22px 0 8px; }
section { overflow-x: auto; background: #fff; border: 1px solid #e3e3e3; border-radius: 6px; padding: 4px 16px 12px; margin-top: 16px; }
table { border-collapse: collapse; }
.facts th { text-align: left; vertical-align: top; padding: 3px 14px 3px 0; color: var(--muted); font-weight: 600; white-space: nowrap; }
.facts td { padding: 3px 0; }
.grid { width: 100%; font-size: 13px; }
.grid th, .grid td { border-bottom: 1px solid #eee; padding: 4px 8px; text-align: left; }
.grid td { white-space: nowrap; }
.grid thead th { background: #f3f3f3; }
.grid td.num { text-align: right; font-variant-numeric: tabular-nums; }
.grid tr.diverged td { color: var(--bad); }
.bad { color: var(--bad); }
.warn { color: var(--warn); }
.counts, .note { color: var(--muted); }
#legend { display: flex; flex-wrap: wrap; gap: 4px 14px; margin: 6px 0; font-size: 12.5px; }
#legend span { cursor: pointer; user-select: none; }
#legend span.off { opacity: 0.35; }
#legend i { display: inline-block; width: 10px; height: 10px; border-radius: 5px; margin-right: 4px; }
#plot-wrap { position: relative; }
#plot { width: 100%; height: auto; display: block; }
#plot .axis line, #plot .grid-line { stroke: #e6e6e6; }
#plot .axis text, #plot .tick { font-size: 11px; fill: var(--muted); }
#plot .step-line { stroke: #bbb; stroke-dasharray: 2 3; }
#plot .tolerance { stroke: var(--fg); stroke-width: 1.2; stroke-dasharray: 6 4; }
#plot .series { fill: none; stroke-width: 4; stroke-linecap: round; }
#plot .marker { stroke: var(--bad); stroke-width: 1.5; stroke-dasharray: 4 3; }
#plot .marker-ring { fill: none; stroke: var(--bad); stroke-width: 2; }
#plot .label { font-size: 11.5px; paint-order: stroke; stroke: #fff; stroke-width: 3px; stroke-linejoin: round; }
#plot .hover { stroke: #888; stroke-width: 1; }
#tooltip { position: absolute; pointer-events: none; background: rgba(255,255,255,0.97); border: 1px solid #ccc; border-radius: 4px; padding: 6px 8px; font-size: 12px; max-width: 460px; box-shadow: 0 2px 6px rgba(0,0,0,0.12); }
.plot-error { margin: 10px 0; padding: 10px; border: 1px solid var(--bad); color: var(--bad); white-space: pre-wrap; font-family: ui-monospace, monospace; }
"##;

const JS: &str = r##"
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var failed = false;
  function fail(e) {
    if (failed) return;
    failed = true;
    document.body.dataset.plot = "error";
    var div = document.createElement("div");
    div.className = "plot-error";
    div.setAttribute("role", "alert");
    div.textContent = "The plot could not be drawn: " + (e && e.stack ? e.stack : String(e));
    var at = document.getElementById("plot-section") || document.body;
    at.appendChild(div);
  }
  window.addEventListener("error", function (ev) { fail(ev.error || ev.message); });
  function el(name, attrs, parent) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function text(parent, x, y, s, attrs) {
    var t = el("text", Object.assign({ x: x, y: y }, attrs || {}), parent);
    t.textContent = s;
    return t;
  }
  function fmt(x) {
    if (x === null || !isFinite(x)) return x === Infinity ? "inf" : "NaN";
    var a = Math.abs(x);
    if (a === 0) return "0";
    if (a < 0.01 || a >= 1e4) return x.toExponential(1).replace("e+", "e");
    if (a >= 100) return x.toFixed(0);
    if (a >= 10) return x.toFixed(1);
    return x.toFixed(2);
  }
  function ratio(err, tol) {
    // null is how JSON carries NaN and Inf: a non-finite error.
    if (err === null || tol === null) return NaN;
    if (tol > 0) return err / tol;
    return err === 0 ? 0 : Infinity;
  }
  var PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#ff9da7", "#bab0ac", "#e15759"];
  function color(i) {
    return i < PALETTE.length ? PALETTE[i] : "hsl(" + ((i * 137.508) % 360).toFixed(0) + ",60%,45%)";
  }

  function draw() {
    var report = JSON.parse(document.getElementById("report-data").textContent);
    if (!report || !Array.isArray(report.tensors)) throw new Error("no report data");
    var tensors = report.tensors;
    var svg = document.getElementById("plot");
    var W = 1100, H = 440, L = 64, R = 96, T = 18, B = 44;
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);

    // Per rank, the points (tensor index, ratio).
    var byRank = new Map();
    var lo = Infinity, hi = 0, pmin = Infinity, pmax = -Infinity;
    tensors.forEach(function (t, i) {
      pmin = Math.min(pmin, t.position);
      pmax = Math.max(pmax, t.position);
      (t.ranks || []).forEach(function (r) {
        var y = ratio(r.error_eps, t.tolerance_eps);
        if (isFinite(y) && y > 0) { lo = Math.min(lo, y); hi = Math.max(hi, y); }
        if (!byRank.has(r.rank)) byRank.set(r.rank, []);
        byRank.get(r.rank).push([i, y]);
      });
    });
    var ranks = Array.from(byRank.keys()).sort(function (a, b) { return a - b; });
    if (!isFinite(pmin)) { pmin = 0; pmax = 1; }
    if (pmin === pmax) { pmin -= 1; pmax += 1; }
    var kLo = isFinite(lo) ? Math.max(-8, Math.min(-1, Math.floor(Math.log10(lo)))) : -2;
    var kHi = hi > 0 ? Math.min(15, Math.max(1, Math.ceil(Math.log10(hi)))) : 1;
    var X = function (p) { return L + (p - pmin) / (pmax - pmin) * (W - L - R); };
    // Non-finite ratios (NaN or Inf errors) get their own band above the top decade.
    var offscale = false;
    tensors.forEach(function (t) {
      (t.ranks || []).forEach(function (r) { if (!isFinite(ratio(r.error_eps, t.tolerance_eps))) offscale = true; });
    });
    var TOP = offscale ? T + 22 : T;
    // Exact matches (error 0) get theirs below the bottom decade.
    var exact = tensors.some(function (t) {
      return (t.ranks || []).some(function (r) { return ratio(r.error_eps, t.tolerance_eps) === 0; });
    });
    var BOT = exact ? H - B - 22 : H - B;
    var Y = function (y) {
      if (!isFinite(y)) return T;
      if (y === 0) return H - B;
      var k = y > 0 ? Math.log10(y) : kLo;
      if (k > kHi) k = kHi;
      if (k < kLo) k = kLo;
      return TOP + (kHi - k) / (kHi - kLo) * (BOT - TOP);
    };

    // Axes: decades on y, round numbers on x, step boundaries.
    var axis = el("g", { class: "axis" }, svg);
    for (var k = kLo; k <= kHi; k++) {
      var y = Y(Math.pow(10, k));
      el("line", { x1: L, x2: W - R, y1: y, y2: y }, axis);
      text(axis, L - 6, y + 4, k === 0 ? "1" : k === 1 ? "10" : k === -1 ? "0.1" : "1e" + k, { "text-anchor": "end" });
    }
    if (exact) {
      el("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "grid-line" }, axis);
      text(axis, L - 6, H - B + 4, "exact", { "text-anchor": "end" });
    }
    if (offscale) {
      el("line", { x1: L, x2: W - R, y1: T, y2: T, class: "grid-line" }, axis);
      text(axis, L - 6, T + 4, "NaN/inf", { "text-anchor": "end" });
    }
    var span = pmax - pmin, raw = span / 8, p10 = Math.pow(10, Math.floor(Math.log10(raw)));
    var stepX = [1, 2, 5, 10].map(function (m) { return m * p10; }).find(function (s) { return s >= raw; }) || raw;
    for (var x = Math.ceil(pmin / stepX) * stepX; x <= pmax; x += stepX) {
      el("line", { x1: X(x), x2: X(x), y1: H - B, y2: H - B + 5 }, axis);
      text(axis, X(x), H - B + 17, String(Math.round(x)), { "text-anchor": "middle" });
    }
    text(axis, (L + W - R) / 2, H - 6, "position in the reference's op sequence", { "text-anchor": "middle" });
    text(axis, 14, (T + H - B) / 2, "error / tolerance", { "text-anchor": "middle", transform: "rotate(-90 14 " + (T + H - B) / 2 + ")" });
    for (var i = 1; i < tensors.length; i++) {
      if (tensors[i].step !== tensors[i - 1].step) {
        var sx = X((tensors[i].position + tensors[i - 1].position) / 2);
        el("line", { class: "step-line", x1: sx, x2: sx, y1: T, y2: H - B }, svg);
        text(svg, sx + 3, TOP + 10, "step " + tensors[i].step, { class: "tick" });
      }
    }
    if (tensors.length) text(svg, X(tensors[0].position) + 3, TOP + 10, "step " + tensors[0].step, { class: "tick" });

    // The tolerance line at 1.
    el("line", { id: "tolerance-line", class: "tolerance", x1: L, x2: W - R, y1: Y(1), y2: Y(1) }, svg);
    text(svg, W - R + 4, Y(1) + 4, "tolerance", { class: "label" });

    // One path per rank, a round dot per point: cheap for a million points.
    var points = 0;
    var legend = document.getElementById("legend");
    ranks.forEach(function (rank, ri) {
      var pts = byRank.get(rank), d = [];
      pts.forEach(function (p) {
        d.push("M" + X(tensors[p[0]].position).toFixed(1) + " " + Y(p[1]).toFixed(1) + "h0");
      });
      points += pts.length;
      var path = el("path", { class: "series", d: d.join(""), stroke: color(ri), "data-rank": rank, "data-points": pts.length }, svg);
      var item = document.createElement("span");
      item.innerHTML = "<i></i>";
      item.firstChild.style.background = color(ri);
      item.appendChild(document.createTextNode("rank " + rank));
      item.title = "show or hide rank " + rank;
      item.addEventListener("click", function () {
        item.classList.toggle("off");
        path.style.display = item.classList.contains("off") ? "none" : "";
      });
      legend.appendChild(item);
    });
    if (!points) text(svg, (L + W - R) / 2, (T + H - B) / 2, "no tensors compared", { "text-anchor": "middle" });

    // The first divergence: a vertical line and a ring on each diverging rank's point.
    var fd = report.first_divergence;
    if (fd && tensors[fd.tensor]) {
      var t = tensors[fd.tensor], mx = X(t.position);
      var g = el("g", { id: "divergence-marker", "data-position": t.position, "data-tensor": fd.tensor }, svg);
      el("line", { class: "marker", x1: mx, x2: mx, y1: T, y2: H - B }, g);
      (t.ranks || []).forEach(function (r) {
        if ((fd.ranks || []).indexOf(r.rank) >= 0) {
          el("circle", { class: "marker-ring", cx: mx, cy: Y(ratio(r.error_eps, t.tolerance_eps)), r: 7 }, g);
        }
      });
      var right = mx > (L + W - R) / 2;
      text(g, mx + (right ? -6 : 6), TOP + 24, "first divergence: pos " + t.position + " " + (t.nvtx || t.api) + " " + t.role,
        { class: "label bad", "text-anchor": right ? "end" : "start", fill: "#c62828" });
    }

    // Hover: the tensors at the nearest position.
    var positions = [], atPos = new Map();
    tensors.forEach(function (t, i) {
      if (!atPos.has(t.position)) { atPos.set(t.position, []); positions.push(t.position); }
      atPos.get(t.position).push(i);
    });
    positions.sort(function (a, b) { return a - b; });
    var tip = document.getElementById("tooltip");
    var hover = el("line", { class: "hover", y1: T, y2: H - B, visibility: "hidden" }, svg);
    svg.addEventListener("mousemove", function (ev) {
      var box = svg.getBoundingClientRect();
      var vx = (ev.clientX - box.left) / box.width * W;
      var p = pmin + (vx - L) / (W - L - R) * (pmax - pmin);
      var a = 0, b = positions.length - 1;
      if (b < 0) return;
      while (a < b) { var m = (a + b) >> 1; if (positions[m] < p) a = m + 1; else b = m; }
      if (a > 0 && Math.abs(positions[a - 1] - p) < Math.abs(positions[a] - p)) a--;
      var pos = positions[a];
      hover.setAttribute("x1", X(pos)); hover.setAttribute("x2", X(pos));
      hover.setAttribute("visibility", "visible");
      var rows = atPos.get(pos).map(function (i) {
        var t = tensors[i], worst = null;
        (t.ranks || []).forEach(function (r) {
          var y = ratio(r.error_eps, t.tolerance_eps);
          if (worst === null || !(y <= worst[1])) worst = [r.rank, y];
        });
        return (t.diverged ? "<b class=\"bad\">" : "<b>") + esc((t.nvtx || "-") + " " + t.role) + "</b> " +
          esc(t.api + " [" + t.shape.join(", ") + "] " + t.dtype) + "<br>error " + fmt(t.error_eps) + " eps, tolerance " +
          fmt(t.tolerance_eps) + " eps: " + fmt(ratio(t.error_eps, t.tolerance_eps)) + "x" +
          (worst ? "; worst rank " + worst[0] + " at " + fmt(worst[1]) + "x" : "");
      });
      tip.innerHTML = "<div>position " + pos + ", step " + tensors[atPos.get(pos)[0]].step + "</div>" + rows.join("<br>");
      tip.hidden = false;
      var left = ev.clientX - box.left + 14;
      tip.style.left = Math.min(left, box.width - 300) + "px";
      tip.style.top = (ev.clientY - box.top + 14) + "px";
    });
    svg.addEventListener("mouseleave", function () { tip.hidden = true; hover.setAttribute("visibility", "hidden"); });

    svg.setAttribute("data-points", points);
    return points;
  }
  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", "\"": "&quot;", "'": "&#39;" }[c];
    });
  }
  try {
    draw();
    if (!failed) document.body.dataset.plot = "rendered";
  } catch (e) {
    fail(e);
  }
})();
"##;

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

    #[test]
    fn a_module_name_cannot_break_out_of_the_script_tag() {
        let mut r = sample(Verdict::Divergence);
        let evil = "layers.0</script><script>alert(1)</script><!-- & \u{2028}";
        r.tensors[0].nvtx = Some(evil.into());
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
        assert_eq!(back.tensors[0].nvtx.as_deref(), Some(evil));
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
