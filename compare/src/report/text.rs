//! The one-screen text view of a [`CompareReport`]: what `ttrace compare` prints.
//!
//! The first line is the verdict with the runs, layout, precision and steps. A divergence
//! follows with the tensor, the ranks, its error against its tolerance, the cause and what lies
//! between it and the last good tensor, then the worst tensors and the counts; warnings come
//! last. The whole fits in about 25 lines however large the run.

use std::borrow::Cow;
use std::fmt::Write as _;

use super::{Cause, CompareReport, Divergence, LayoutSummary, Merge, TensorComparison, Verdict};

/// Rows of the worst-tensors table.
const WORST_ROWS: usize = 6;
/// Warnings printed before "and N more".
const WARNINGS_SHOWN: usize = 2;
/// Width the explanation is wrapped at.
const WRAP: usize = 104;
/// Lines a divergence report aims to fit in.
const SCREEN: usize = 25;

/// `s` with control characters (ESC, CR, BEL, ...) written as `\u{1b}` escapes: names and
/// paths come from the traced program and must not drive the terminal.
pub fn escape_controls(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_string();
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// A copy of `r` whose strings from the trace (paths, commands, APIs, NVTX names, kernel
/// names, explanations, warnings) have their control characters escaped.
fn printable(r: &CompareReport) -> CompareReport {
    let mut r = r.clone();
    let e = |s: &mut String| *s = escape_controls(s);
    for summary in [&mut r.reference, &mut r.run]
        .into_iter()
        .chain(r.perturbed.as_mut())
    {
        e(&mut summary.path);
        e(&mut summary.command);
        e(&mut summary.run_id);
    }
    // The tensors the text names are in memory ([`super::TensorList::get`]).
    for t in r.tensors.in_memory_mut() {
        e(&mut t.api);
        e(&mut t.role);
        if let Some(n) = &mut t.nvtx {
            e(n);
        }
    }
    if let Some(d) = &mut r.first_divergence {
        e(&mut d.explanation);
        e(&mut d.position);
        d.kernels_between.iter_mut().for_each(e);
        for s in [&mut d.pass, &mut d.module].into_iter().flatten() {
            e(s);
        }
    }
    r.warnings.iter_mut().for_each(e);
    for d in &mut r.replica_drift {
        e(&mut d.operand);
        if let Some(n) = &mut d.nvtx {
            e(n);
        }
    }
    for n in &mut r.not_comparable {
        e(&mut n.reason);
        e(&mut n.first);
    }
    for l in &mut r.capture_losses {
        e(&mut l.path);
    }
    r
}

/// Renders `report` as one screen of text; ANSI colors only when `color`. Control
/// characters in names from the trace are escaped.
pub fn render(report: &CompareReport, color: bool) -> String {
    let report = &printable(report);
    let p = Paint(color);
    let mut out = String::new();
    let verdict = match report.verdict {
        Verdict::Match => p.paint("1;32", "MATCH"),
        Verdict::Divergence => p.paint("1;31", "DIVERGENCE"),
    };
    let _ = writeln!(out, "{verdict}  {}", headline(report));
    render_losses(report, &p, &mut out);
    match report.verdict {
        Verdict::Match => render_match(report, &p, &mut out),
        Verdict::Divergence => {
            // The explanation gets the lines the rest leaves of the screen (2 to 5).
            let mut probe = String::new();
            render_divergence(report, &p, 1, &mut probe);
            let rest = probe.lines().count() + 1 + report.warnings.len().min(WARNINGS_SHOWN + 1);
            let budget = SCREEN.saturating_sub(rest) + 1;
            render_divergence(report, &p, budget.clamp(2, 5), &mut out);
        }
    }
    render_drift(report, &p, &mut out);
    let _ = writeln!(out, "{}", counts(report));
    for w in report.warnings.iter().take(WARNINGS_SHOWN) {
        let _ = writeln!(out, "{} {w}", p.paint("33", "warning:"));
    }
    if report.warnings.len() > WARNINGS_SHOWN {
        let _ = writeln!(
            out,
            "{} and {} more (see the JSON or HTML report)",
            p.paint("33", "warning:"),
            report.warnings.len() - WARNINGS_SHOWN
        );
    }
    out
}

/// What the captures lost, right under the verdict: a match of an incomplete capture is not
/// a clean run.
fn render_losses(r: &CompareReport, p: &Paint, out: &mut String) {
    if r.capture_losses.is_empty() {
        return;
    }
    let what = match r.verdict {
        Verdict::Match => "the match covers only what was captured (exit 5)",
        Verdict::Divergence => "a divergence may come from data the capture lost",
    };
    let _ = writeln!(out, "  {} {what}:", p.paint("1;33", "INCOMPLETE CAPTURE"));
    for l in &r.capture_losses {
        let _ = writeln!(out, "    {}", l.describe());
    }
}

/// The first replica drift and how many more, when replicas drifted apart.
fn render_drift(r: &CompareReport, p: &Paint, out: &mut String) {
    let Some(d) = r.replica_drift.first() else {
        return;
    };
    let _ = writeln!(
        out,
        "{} step {}, {}: {} differs across replicas {:?} (identical in step {}): ranks {:?} drifted",
        p.paint("1;31", "replicas drifted apart:"),
        d.step,
        d.nvtx.as_deref().unwrap_or("-"),
        d.operand,
        d.group,
        d.identical_in,
        d.ranks,
    );
    if r.replica_drift.len() > 1 {
        let _ = writeln!(
            out,
            "  and {} more replicated tensors (see the JSON report)",
            r.replica_drift.len() - 1
        );
    }
}

/// Run vs reference, layout, precision and steps, after the verdict.
fn headline(r: &CompareReport) -> String {
    let mut s = format!(
        "run {} ({}) vs reference {} ({})",
        or_dash(&r.run.path),
        plural(u64::from(r.run.world_size), "rank"),
        or_dash(&r.reference.path),
        plural(u64::from(r.reference.world_size), "rank"),
    );
    let _ = write!(
        s,
        " | {} | {} | {}",
        layout_label(&r.layout),
        or_dash(&r.precision),
        steps_label(&r.steps)
    );
    s
}

fn render_match(r: &CompareReport, p: &Paint, out: &mut String) {
    let _ = writeln!(
        out,
        "  all {} within tolerance",
        plural(r.tensors.len() as u64, "compared tensor")
    );
    if let Some(t) = worst_tensor(r) {
        let _ = writeln!(
            out,
            "  largest error/tolerance {} at {}: {} eps vs tolerance {} eps ({})",
            p.paint("1", &fmt_num(ratio(t.error_eps, t.tolerance_eps))),
            tensor_label(&t),
            fmt_num(t.error_eps),
            fmt_num(t.tolerance_eps),
            or_dash(&t.tolerance_source),
        );
    }
    if let Some(source) = &r.perturbed {
        let _ = writeln!(
            out,
            "  tolerances from perturbed reference {}",
            or_dash(&source.path)
        );
    }
}

fn render_divergence(r: &CompareReport, p: &Paint, explain_lines: usize, out: &mut String) {
    let Some(d) = &r.first_divergence else {
        if !r.replica_drift.is_empty() {
            return; // the drift is the divergence: render_drift says it
        }
        let _ = writeln!(out, "  (no first divergence recorded)");
        render_worst(r, p, out);
        return;
    };
    let t = r.tensors.named(d.tensor);
    let t = t.as_deref();
    let _ = writeln!(
        out,
        "{} {}",
        p.paint("1", "first tensor beyond tolerance:"),
        where_label(d, t)
    );
    let label = |s: &str| p.paint("2", &format!("  {s:<11}"));
    if let Some(t) = t {
        let _ = writeln!(
            out,
            "{}{} of {} {} {}, {}",
            label("tensor"),
            p.paint("1", &t.role),
            t.api,
            shape_label(&t.shape),
            t.dtype,
            merge_label(&t.merge)
        );
    }
    let _ = writeln!(out, "{}{}", label("op"), d.position);
    let _ = writeln!(out, "{}{}", label("ranks"), ranks_label(d, t));
    if let Some(t) = t {
        render_error(r, t, p, out);
    }
    let cause = match d.cause {
        Cause::Local => "LOCAL",
        Cause::Upstream => "UPSTREAM",
    };
    let explanation = wrap(&d.explanation, WRAP - 15 - cause.len(), explain_lines);
    for (i, chunk) in explanation.iter().enumerate() {
        if i == 0 {
            let _ = writeln!(out, "{}{}: {chunk}", label("cause"), p.paint("1;33", cause));
        } else {
            let _ = writeln!(out, "{:13}{:w$}{chunk}", "", "", w = cause.len() + 2);
        }
    }
    if explanation.is_empty() {
        let _ = writeln!(out, "{}{}", label("cause"), p.paint("1;33", cause));
    }
    let last_good = match d.last_good.and_then(|i| r.tensors.named(i)) {
        Some(g) => format!(
            "{} at {} eps (tolerance {} eps)",
            tensor_label(&g),
            fmt_num(g.error_eps),
            fmt_num(g.tolerance_eps)
        ),
        None => "none: the first compared tensor already differs".to_string(),
    };
    let _ = writeln!(out, "{}{last_good}", label("last good"));
    if !d.kernels_between.is_empty() {
        let _ = writeln!(
            out,
            "{}{}",
            label("in between"),
            kernels_label(&d.kernels_between, WRAP - 13)
        );
    } else if d.cause == Cause::Upstream {
        let _ = writeln!(
            out,
            "{}no kernel launches logged between the last good tensor and this op",
            label("in between")
        );
    }
    render_worst(r, p, out);
}

/// The diverged tensor's error against its tolerance, worst row and norm ratio.
fn render_error(r: &CompareReport, t: &TensorComparison, p: &Paint, out: &mut String) {
    let label = |s: &str| p.paint("2", &format!("  {s:<11}"));
    let x = ratio(t.error_eps, t.tolerance_eps);
    let over = p.paint("1;31", &over_label(x));
    let mut line = format!(
        "{}{} eps vs tolerance {} eps ({}): {over}",
        label("error"),
        fmt_num(t.error_eps),
        fmt_num(t.tolerance_eps),
        or_dash(&t.tolerance_source),
    );
    if let Some(w) = &t.worst_row {
        let _ = write!(
            line,
            "; worst row {} on rank {}: {} eps",
            w.row,
            w.rank,
            fmt_num(w.error_eps)
        );
    }
    let reading = norm_reading(t.norm_ratio, &r.layout);
    if reading.is_none() {
        let _ = write!(line, "; norm ratio {}", fmt_ratio(t.norm_ratio));
    }
    let _ = writeln!(out, "{line}");
    if let Some(reading) = reading {
        let _ = writeln!(
            out,
            "{}run/reference norm = {}: {}",
            label("norm"),
            fmt_ratio(t.norm_ratio),
            p.paint("1;33", &reading)
        );
    }
}

/// The worst-tensors table.
fn render_worst(r: &CompareReport, p: &Paint, out: &mut String) {
    let rows: Vec<Cow<'_, TensorComparison>> = worst_indices(r)
        .into_iter()
        .filter_map(|i| r.tensors.named(i))
        .take(WORST_ROWS)
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "{}",
        p.paint(
            "1",
            &format!(
                "worst tensors:\n  {:>6} {:>4}  {:<38} {:<20} {:<6} {:>9} {:>9} {:>9}",
                "pos", "step", "module", "api", "role", "error eps", "tol eps", "x tol"
            )
        )
    );
    for t in rows {
        let x = ratio(t.error_eps, t.tolerance_eps);
        let cells = format!(
            "  {:>6} {:>4}  {:<38} {:<20} {:<6} {:>9} {:>9} {:>9}",
            t.position,
            t.step,
            clip_left(t.nvtx.as_deref().unwrap_or("-"), 38),
            clip_right(&t.api, 20),
            clip_left(&t.role, 6),
            fmt_num(t.error_eps),
            fmt_num(t.tolerance_eps),
            fmt_num(x),
        );
        if t.diverged {
            let _ = writeln!(out, "{}", p.paint("31", &cells));
        } else {
            let _ = writeln!(out, "{cells}");
        }
    }
}

/// `compared 812 tensors (3 beyond tolerance); ops: 400 of 410 aligned, 12 unaligned; ...`.
pub(crate) fn counts(r: &CompareReport) -> String {
    let s = &r.stats;
    let beyond = r.tensors.diverged();
    let mut line = format!("compared {}", plural(s.tensors_compared, "tensor"));
    if beyond > 0 {
        let _ = write!(line, " ({beyond} beyond tolerance)");
    }
    let _ = write!(
        line,
        "; reference: {} ops, {} GEMMs with a counterpart; run: {} GEMMs aligned, {} \
         unaligned; {} read in {}",
        s.reference_ops,
        s.reference_gemms_aligned,
        s.aligned_ops,
        s.unaligned_ops,
        fmt_bytes(s.bytes_compared),
        fmt_secs(s.elapsed_s)
    );
    for n in &r.not_comparable {
        let _ = write!(
            line,
            "\nnot comparable: {}: {} (first: {})",
            plural(n.tensors, "tensor"),
            n.reason,
            n.first
        );
    }
    line
}

/// `step 0, micro-batch 1, forward, layers.1.mlp.fc2`.
pub(crate) fn where_label(d: &Divergence, t: Option<&TensorComparison>) -> String {
    let mut parts = vec![format!("step {}", d.step)];
    if let Some(mb) = d.micro_batch {
        parts.push(format!("micro-batch {mb}"));
    }
    if let Some(pass) = &d.pass {
        parts.push(pass.clone());
    }
    match (&d.module, t.and_then(|t| t.nvtx.as_ref())) {
        (Some(m), _) => parts.push(m.clone()),
        (None, Some(n)) => parts.push(n.clone()),
        (None, None) => {
            if let Some(t) = t {
                parts.push(format!("position {} ({})", t.position, t.api));
            }
        }
    }
    parts.join(", ")
}

/// `2, 3 (of 8 holding it; rank 3 worst at 1.2e5 eps)`.
pub(crate) fn ranks_label(d: &Divergence, t: Option<&TensorComparison>) -> String {
    let mut ranks = d.ranks.clone();
    ranks.sort_unstable();
    let shown: Vec<String> = ranks.iter().take(12).map(u32::to_string).collect();
    let mut s = shown.join(", ");
    if ranks.len() > 12 {
        let _ = write!(s, " and {} more", ranks.len() - 12);
    }
    if let Some(t) = t {
        if t.ranks.len() > 1 && t.ranks.iter().all(|r| ranks.contains(&r.rank)) {
            let _ = write!(s, " (all {} holding it", t.ranks.len());
        } else {
            let _ = write!(s, " (of {} holding it", t.ranks.len());
        }
        let worst = t
            .ranks
            .iter()
            .max_by(|a, b| nan_max(a.error_eps).total_cmp(&nan_max(b.error_eps)));
        if let Some(w) = worst {
            let _ = write!(
                s,
                "; worst: rank {} seq {} at {} eps",
                w.rank,
                w.seq,
                fmt_num(w.error_eps)
            );
        }
        s.push(')');
    }
    s
}

/// `pos 41 step 0 forward.mb1/layers.1.mlp.fc1 D (cublasGemmEx)`.
pub(crate) fn tensor_label(t: &TensorComparison) -> String {
    match &t.nvtx {
        Some(n) => format!(
            "pos {} step {} {n} {} ({})",
            t.position, t.step, t.role, t.api
        ),
        None => format!("pos {} step {} {} of {}", t.position, t.step, t.role, t.api),
    }
}

/// Indices of the worst tensors: the report's list, or (if empty) computed from the tensors.
pub(crate) fn worst_indices(r: &CompareReport) -> Vec<usize> {
    if !r.worst.is_empty() {
        return r.worst.clone();
    }
    // Each tensor read once (a spilled one from its file), worst first.
    let mut keyed: Vec<(f64, usize)> = (0..r.tensors.len())
        .map(|i| {
            let x = r.tensors.named(i).map_or(f64::NEG_INFINITY, |t| {
                nan_max(ratio(t.error_eps, t.tolerance_eps))
            });
            (x, i)
        })
        .collect();
    keyed.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut idx: Vec<usize> = keyed.into_iter().map(|(_, i)| i).collect();
    idx.truncate(WORST_ROWS * 2);
    idx
}

fn worst_tensor(r: &CompareReport) -> Option<Cow<'_, TensorComparison>> {
    worst_indices(r).first().and_then(|&i| r.tensors.named(i))
}

/// NaN sorts as the worst.
fn nan_max(x: f64) -> f64 {
    if x.is_nan() {
        f64::INFINITY
    } else {
        x
    }
}

/// error / tolerance, infinite when the tolerance is zero and the error is not.
pub(crate) fn ratio(error: f64, tolerance: f64) -> f64 {
    if tolerance > 0.0 {
        error / tolerance
    } else if error == 0.0 {
        0.0
    } else {
        f64::INFINITY
    }
}

/// `412x over tolerance`.
pub(crate) fn over_label(x: f64) -> String {
    if x.is_nan() {
        "error is NaN (non-finite values)".to_string()
    } else if x.is_infinite() {
        "infinitely over tolerance".to_string()
    } else if x > 1.0 {
        format!("{}x over tolerance", fmt_num(x))
    } else {
        format!("{}x of tolerance", fmt_num(x))
    }
}

/// What a suspicious ‖run‖/‖reference‖ means, or None when it says nothing in particular.
pub(crate) fn norm_reading(norm_ratio: f64, layout: &LayoutSummary) -> Option<String> {
    if !norm_ratio.is_finite() {
        return Some("the run holds NaN or Inf".to_string());
    }
    if norm_ratio < 1e-3 {
        return Some("the run's tensor is (nearly) all zeros".to_string());
    }
    // Factors a parallelism bug scales by: a missing or doubled reduction, a wrong averaging.
    let mut factors: Vec<(u32, Vec<&str>)> = vec![(2, vec![])];
    let sizes = [
        ("tp", layout.tp),
        ("dp", layout.dp),
        ("pp", layout.pp),
        (
            "tp*dp",
            if layout.tp > 1 && layout.dp > 1 {
                layout.tp.saturating_mul(layout.dp)
            } else {
                1
            },
        ),
    ];
    for (name, k) in sizes {
        if k < 2 {
            continue;
        }
        match factors.iter_mut().find(|(f, _)| *f == k) {
            Some((_, names)) => names.push(name),
            None => factors.push((k, vec![name])),
        }
    }
    let close = |a: f64, b: f64| (a / b - 1.0).abs() <= 0.02;
    for (k, names) in &factors {
        let why = if names.is_empty() {
            String::new()
        } else {
            format!(" (= {})", names.join(" = "))
        };
        let k = f64::from(*k);
        if close(norm_ratio, k) {
            return Some(format!("a tensor scaled by {k}{why}"));
        }
        if close(norm_ratio, 1.0 / k) {
            return Some(format!("a tensor divided by {k}{why}"));
        }
    }
    None
}

pub(crate) fn layout_label(l: &LayoutSummary) -> String {
    let mut s = format!("tp{} dp{} pp{}", l.tp, l.dp, l.pp);
    if !l.discovered {
        s.push_str(" (given)");
    }
    s
}

/// `steps 0-3`, `step 2`, `steps 0, 2, 5`, `12 steps (0..40)`.
pub(crate) fn steps_label(steps: &[u64]) -> String {
    match steps {
        [] => "no steps".to_string(),
        [s] => format!("step {s}"),
        _ => {
            let contiguous = steps.windows(2).all(|w| w[1] == w[0] + 1);
            let (first, last) = (steps[0], steps[steps.len() - 1]);
            if contiguous {
                format!("steps {first}-{last}")
            } else if steps.len() <= 6 {
                let v: Vec<String> = steps.iter().map(u64::to_string).collect();
                format!("steps {}", v.join(", "))
            } else {
                format!("{} steps ({first}..{last})", steps.len())
            }
        }
    }
}

/// `[64, 128]`.
pub(crate) fn shape_label(shape: &[u64]) -> String {
    let v: Vec<String> = shape.iter().map(u64::to_string).collect();
    format!("[{}]", v.join(", "))
}

/// How the shards were put together, in words.
pub(crate) fn merge_label(m: &Merge) -> String {
    match m {
        Merge::Replicated => "replicated on every rank holding it".to_string(),
        Merge::Slice { dim, parts, outer } => {
            let mut s = format!("merged from {parts} slices along dim {dim}");
            if *outer > 1 {
                let _ = write!(s, " ({outer} interleaved blocks)");
            }
            s
        }
        Merge::Sum { group_size } => format!("merged as the sum of {group_size} partial shards"),
    }
}

pub(crate) fn kernels_label(kernels: &[String], width: usize) -> String {
    // Consecutive launches of one kernel read as `name x4`.
    let mut runs: Vec<(&str, usize)> = Vec::new();
    for k in kernels {
        match runs.last_mut() {
            Some((name, n)) if *name == k.as_str() => *n += 1,
            _ => runs.push((k, 1)),
        }
    }
    let mut s = format!("{}: ", plural(kernels.len() as u64, "kernel"));
    for (i, (k, n)) in runs.iter().enumerate() {
        let mut name = clip_right(k, 56);
        if *n > 1 {
            let _ = write!(name, " x{n}");
        }
        let rest: usize = runs[i..].iter().map(|r| r.1).sum();
        if i > 0 && s.chars().count() + name.chars().count() + 12 > width {
            let _ = write!(s, ", and {rest} more");
            return s;
        }
        if i > 0 {
            s.push_str(", ");
        }
        s.push_str(&name);
    }
    s
}

/// Compact number: `0.43`, `12.5`, `412`, `1.6e5`, `NaN`.
pub(crate) fn fmt_num(x: f64) -> String {
    if x.is_nan() {
        return "NaN".to_string();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    let a = x.abs();
    if a == 0.0 {
        "0".to_string()
    } else if !(0.01..1e4).contains(&a) {
        format!("{x:.1e}")
    } else if a >= 100.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// A ratio near 1 with enough digits to tell 2.00 from 1.987.
pub(crate) fn fmt_ratio(x: f64) -> String {
    if x.is_finite() && (0.01..1e4).contains(&x.abs()) {
        let s = format!("{x:.3}");
        match s.strip_suffix('0') {
            Some(shorter) => shorter.to_string(),
            None => s,
        }
    } else {
        fmt_num(x)
    }
}

/// `1.5 GiB`, `512 B`.
pub(crate) fn fmt_bytes(b: u64) -> String {
    ttrace_format::units::human_bytes(b, 1)
}

pub(crate) fn fmt_secs(s: f64) -> String {
    if s < 1.0 {
        format!("{:.0} ms", s * 1e3)
    } else {
        format!("{s:.1} s")
    }
}

pub(crate) fn plural(n: u64, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() {
        "-"
    } else {
        s
    }
}

/// Keeps the tail (the most specific part of a module path).
fn clip_left(s: &str, width: usize) -> String {
    let n = s.chars().count();
    if n <= width {
        s.to_string()
    } else {
        let tail: String = s.chars().skip(n - (width - 1)).collect();
        format!("…{tail}")
    }
}

fn clip_right(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        s.to_string()
    } else {
        let head: String = s.chars().take(width - 1).collect();
        format!("{head}…")
    }
}

/// Greedy word wrap into at most `max_lines` lines (the last one ends with `…` if cut).
fn wrap(text: &str, width: usize, max_lines: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut cur = String::new();
    for word in text.split_whitespace() {
        if !cur.is_empty() && cur.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(word);
    }
    if !cur.is_empty() {
        lines.push(cur);
    }
    if lines.len() > max_lines {
        lines.truncate(max_lines);
        if let Some(last) = lines.last_mut() {
            *last = format!("{}…", clip_right(last, width.saturating_sub(1)));
        }
    }
    lines
}

/// ANSI styling, a no-op when color is off.
struct Paint(bool);

impl Paint {
    fn paint(&self, code: &str, s: &str) -> String {
        if self.0 {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::{CompareStats, RankError, RunSummary, WorstRow};
    use super::*;

    /// A tp2/dp2/pp2 run with 24 tensors and a local divergence at the 10th, scaled by 2.
    pub(crate) fn sample(verdict: Verdict) -> CompareReport {
        let layout = LayoutSummary {
            tp: 2,
            dp: 2,
            pp: 2,
            order: "tp-dp-pp".into(),
            discovered: true,
        };
        let diverging = 11;
        let tensors: Vec<TensorComparison> = (0..24)
            .map(|i| {
                let bad = verdict == Verdict::Divergence && i >= diverging;
                let error = if bad { 1.6e5 } else { 3.0 + i as f64 };
                TensorComparison {
                    position: i as u64 / 3,
                    step: 0,
                    ref_seq: i as u64 / 3,
                    api: "cublasGemmEx".into(),
                    role: ["A", "B", "D"][i % 3].into(),
                    nvtx: Some(format!("forward.mb1/layers.{}.mlp.fc2", i / 6)),
                    shape: vec![64, 128],
                    dtype: "BF16".into(),
                    merge: Merge::Sum { group_size: 2 },
                    ranks: (0..4)
                        .map(|r| RankError {
                            rank: r,
                            seq: 17 + i as u64,
                            error_eps: if bad && r >= 2 { error * 1.1 } else { 2.0 },
                        })
                        .collect(),
                    error_eps: error,
                    worst_row: Some(WorstRow {
                        rank: 3,
                        row: 12,
                        error_eps: error * 1.3,
                    }),
                    norm_ratio: if bad { 2.0 } else { 1.0001 },
                    tolerance_eps: 388.0,
                    tolerance_source: "analytic".into(),
                    diverged: bad,
                }
            })
            .collect();
        let mut worst: Vec<usize> = (0..tensors.len()).collect();
        worst.sort_by(|&a, &b| tensors[b].error_eps.total_cmp(&tensors[a].error_eps));
        worst.truncate(8);
        let first_divergence = (verdict == Verdict::Divergence).then(|| Divergence {
            tensor: diverging,
            cause: Cause::Local,
            explanation: "The GEMM's output differs from its own captured inputs multiplied in \
                          f64 by a factor of 2, while its inputs match the reference: the bug \
                          is in this op or the reduction that produced its operand."
                .into(),
            last_good: Some(diverging - 1),
            kernels_between: vec!["void at::native::vectorized_elementwise_kernel<4>".into()],
            ranks: vec![3, 2],
            step: 0,
            micro_batch: Some(1),
            pass: Some("forward".into()),
            module: Some("layers.1.mlp.fc2".into()),
            position: "rank 3 step 0 seq 27: cublasGemmEx m=64 n=128 k=64".into(),
        });
        CompareReport {
            reference: RunSummary {
                path: "runs/ref".into(),
                run_id: "r1".into(),
                command: "python train.py".into(),
                world_size: 1,
            },
            run: RunSummary {
                path: "runs/tp2dp2pp2".into(),
                run_id: "r2".into(),
                command: "torchrun --nproc-per-node 8 train.py".into(),
                world_size: 8,
            },
            perturbed: None,
            layout,
            precision: "bf16".into(),
            epsilon: 0.0078125,
            steps: vec![0, 1],
            verdict,
            first_divergence,
            tensors: tensors.into(),
            worst,
            warnings: vec![
                "rank 5: 2 records unreadable (bad checksum)".into(),
                "rank 6: 12 ops with no counterpart in the reference".into(),
                "rank 7: 1 op with no counterpart in the reference".into(),
            ],
            not_comparable: vec![],
            replica_drift: vec![],
            dp_reduction: None,
            roundoff_jumps: vec![],
            chaotic_steps: vec![],
            capture_losses: vec![],
            stats: CompareStats {
                reference_gemms_aligned: 100,
                reference_ops: 410,
                aligned_ops: 400,
                unaligned_ops: 12,
                tensors_compared: 24,
                bytes_compared: 35_000_000,
                elapsed_s: 1.34,
            },
        }
    }

    #[test]
    fn control_characters_from_the_trace_are_escaped() {
        let mut r = sample(Verdict::Divergence);
        r.run.path = "runs/\u{1b}[2J\u{1b}]0;pwned\u{7}".into();
        if let Some(d) = &mut r.first_divergence {
            d.module = Some("layers.1\r\u{1b}[31m".into());
        }
        for t in r.tensors.in_memory_mut() {
            t.nvtx = Some("forward.mb1/layers.1.mlp.fc2\u{1b}[H".into());
        }
        let text = render(&r, false);
        assert!(!text.contains('\u{1b}') && !text.contains('\r') && !text.contains('\u{7}'));
        assert!(text.contains("runs/\\u{1b}[2J"), "{text}");
    }

    #[test]
    fn divergence_fits_one_screen_with_every_field() {
        let text = render(&sample(Verdict::Divergence), false);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("DIVERGENCE  run runs/tp2dp2pp2 (8 ranks) vs reference runs/ref"),
            "{text}"
        );
        for s in ["tp2 dp2 pp2", "bf16", "steps 0-1"] {
            assert!(lines[0].contains(s), "first line lacks {s:?}: {}", lines[0]);
        }
        for s in [
            "step 0, micro-batch 1, forward, layers.1.mlp.fc2",
            "D of cublasGemmEx [64, 128] BF16, merged as the sum of 2 partial shards",
            "rank 3 step 0 seq 27: cublasGemmEx m=64 n=128 k=64",
            "2, 3 (of 4 holding it",
            "1.6e5 eps vs tolerance 388 eps (analytic): 412x over tolerance",
            "run/reference norm = 2.00: a tensor scaled by 2 (= tp = dp = pp)",
            "LOCAL: The GEMM's output differs",
            "last good",
            "pos 3 step 0 forward.mb1/layers.1.mlp.fc2 B (cublasGemmEx) at 13.0 eps",
            "1 kernel: void at::native::vectorized_elementwise_kernel<4>",
            "worst tensors:",
            "compared 24 tensors (13 beyond tolerance); reference: 410 ops, 100 GEMMs with a \
             counterpart; run: 400 GEMMs aligned",
            "12 unaligned; 33.4 MiB read in 1.3 s",
            "warning: rank 5: 2 records unreadable",
            "warning: and 1 more",
        ] {
            assert!(text.contains(s), "missing {s:?} in\n{text}");
        }
        assert!(lines.len() <= 25, "{} lines:\n{text}", lines.len());
        assert!(!text.contains('\x1b'), "ANSI codes with color off:\n{text}");
        // The worst table has its rows, worst first, and ends before the counts.
        let header = lines.iter().position(|l| l.contains("error eps")).unwrap();
        assert_eq!(
            lines[header + 1 + WORST_ROWS].split_whitespace().next(),
            Some("compared")
        );
    }

    #[test]
    fn color_only_when_asked() {
        let text = render(&sample(Verdict::Divergence), true);
        assert!(text.starts_with("\x1b[1;31mDIVERGENCE\x1b[0m"), "{text:?}");
        assert!(text.contains("\x1b[1;31m412x over tolerance\x1b[0m"));
    }

    #[test]
    fn match_names_what_was_compared_and_the_largest_ratio() {
        let text = render(&sample(Verdict::Match), false);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("MATCH  run runs/tp2dp2pp2"), "{text}");
        assert!(
            text.contains("all 24 compared tensors within tolerance"),
            "{text}"
        );
        // Worst is tensor 23: 26 eps against 388.
        assert!(
            text.contains("largest error/tolerance 0.07 at pos 7 step 0"),
            "{text}"
        );
        assert!(!text.contains("worst tensors"), "{text}");
        assert!(lines.len() <= 8, "{text}");
        assert!(!text.contains('\x1b'));
    }

    #[test]
    fn upstream_without_kernels_and_non_finite_errors_read_plainly() {
        let mut r = sample(Verdict::Divergence);
        let d = r.first_divergence.as_mut().unwrap();
        d.cause = Cause::Upstream;
        d.kernels_between.clear();
        d.last_good = None;
        let t = r
            .tensors
            .get_mut(d.tensor)
            .expect("the divergence's tensor");
        t.error_eps = f64::NAN;
        t.norm_ratio = f64::NAN;
        let text = render(&r, false);
        for s in [
            "UPSTREAM:",
            "no kernel launches logged",
            "NaN eps vs tolerance 388 eps (analytic): error is NaN",
            "the run holds NaN or Inf",
            "none: the first compared tensor already differs",
        ] {
            assert!(text.contains(s), "missing {s:?} in\n{text}");
        }
        assert!(text.lines().count() <= 25, "{text}");
    }

    #[test]
    fn a_long_explanation_takes_the_lines_left_and_repeated_kernels_collapse() {
        let mut r = sample(Verdict::Divergence);
        r.warnings.truncate(1);
        let d = r.first_divergence.as_mut().unwrap();
        d.cause = Cause::Upstream;
        d.explanation = "input B of this cublasGemmEx was already wrong when the op read it: the \
                         bug lies between the last good tensor (A cublasGemmEx of \
                         backward.mb0/output_layer) and this op, in code ttrace does not capture \
                         (kernels, host-side copies, or a missing collective); run/reference \
                         norm = 2.00: the tensor looks scaled by 2"
            .into();
        d.kernels_between = vec!["fn@0x5568".into(); 4];
        d.kernels_between.push("softmax_kernel".into());
        let text = render(&r, false);
        assert!(
            text.contains("5 kernels: fn@0x5568 x4, softmax_kernel"),
            "{text}"
        );
        // Every word of the explanation is there: nothing was cut.
        let shown: Vec<&str> = text.split_whitespace().collect();
        let explanation = &r.first_divergence.as_ref().unwrap().explanation;
        for w in explanation.split_whitespace() {
            assert!(shown.contains(&w), "{w:?} cut from\n{text}");
        }
        assert!(!text.contains('…'), "{text}");
        assert!(text.lines().count() <= 25, "{text}");
        // With many warnings the explanation shrinks, the screen holds.
        let mut r2 = r.clone();
        r2.warnings = vec!["w".into(); 9];
        let text2 = render(&r2, false);
        assert!(text2.lines().count() <= 25, "{text2}");
    }

    #[test]
    fn norm_ratios_read_as_parallel_factors() {
        let l = LayoutSummary {
            tp: 4,
            dp: 8,
            pp: 1,
            order: String::new(),
            discovered: true,
        };
        assert_eq!(norm_reading(1.0003, &l), None);
        assert_eq!(norm_reading(1.3, &l), None);
        assert_eq!(norm_reading(2.01, &l).unwrap(), "a tensor scaled by 2");
        assert_eq!(
            norm_reading(0.25, &l).unwrap(),
            "a tensor divided by 4 (= tp)"
        );
        assert_eq!(
            norm_reading(8.0, &l).unwrap(),
            "a tensor scaled by 8 (= dp)"
        );
        assert_eq!(
            norm_reading(32.1, &l).unwrap(),
            "a tensor scaled by 32 (= tp*dp)"
        );
        assert!(norm_reading(0.0, &l).unwrap().contains("zeros"));
    }

    #[test]
    fn numbers_and_steps_are_compact() {
        assert_eq!(fmt_num(412.4), "412");
        assert_eq!(fmt_num(0.434), "0.43");
        assert_eq!(fmt_num(165_000.0), "1.6e5");
        assert_eq!(fmt_num(0.0), "0");
        assert_eq!(fmt_ratio(2.0), "2.00");
        assert_eq!(fmt_ratio(1.0004), "1.00");
        assert_eq!(fmt_ratio(1.987), "1.987");
        assert_eq!(steps_label(&[3]), "step 3");
        assert_eq!(steps_label(&[0, 2, 5]), "steps 0, 2, 5");
        assert_eq!(
            steps_label(&(0..40).step_by(4).collect::<Vec<_>>()),
            "10 steps (0..36)"
        );
        assert_eq!(over_label(0.5), "0.50x of tolerance");
    }
}
