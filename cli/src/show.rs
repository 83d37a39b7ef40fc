//! `ttrace show RUN --rank R --step S [--seq N]`: the ops a rank ran in a step, with the
//! statistics of every tensor; with `--seq`, one record in full with a preview of its
//! tensors. `ttrace stats RUN`: per (rank, step) totals of non-finite values and where they
//! first appear.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use serde::Serialize;
use serde_json::{json, Value};
use ttrace_format::reader::{Issue, RecordView, Segment};
use ttrace_format::record::{MemsetOp, Op, Record, Tensor};
use ttrace_format::tensor::{stats, Stats, TensorData};

use crate::progress::Progress;
use crate::reading::{
    fmt_f64, fmt_shape, json_f64, open_store, print_table, role_name, warn, Filter, FilterArgs,
};
use crate::units::human;

/// Show the ops one rank ran in one step: seq, API, NVTX path, stream, communicator, and per
/// tensor its role, dtype, shape, min/max/mean/absmax and NaN/Inf counts. With --seq, one
/// record in full (every parameter, kernels launched before it, timings) and a preview of
/// each tensor's values.
///
/// Statistics are over the finite values; NaN and Inf are counted apart. GEMM operands are
/// stored as cuBLAS holds them (column-major: a rows x cols matrix has the row-major shape
/// [cols, rows]); previews show the stored layout.
///
/// Examples:
///
///   ttrace show runs/tp2 --rank 1 --step 0
///
///   ttrace show runs/tp2 --rank 1 --step 0 --seq 17 --preview 16
///
///   ttrace show runs/tp2 --rank 0 --step 2 --apis nccl --json
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct ShowArgs {
    /// The store.
    run: PathBuf,
    /// Global rank.
    #[arg(long)]
    rank: u32,
    /// Step.
    #[arg(long)]
    step: u64,
    /// One record, in full, with tensor previews.
    #[arg(long)]
    seq: Option<u64>,
    /// Only these APIs: families (`gemm`, `nccl`, `memcpy`, `gap`), exact names, or
    /// `prefix*`.
    #[arg(long, value_name = "LIST")]
    apis: Option<String>,
    /// Values per row in previews (rows: a quarter of it, at least 2).
    #[arg(long, default_value_t = 8, value_name = "N")]
    preview: usize,
    /// Skip tensor statistics (metadata only: fast on large steps).
    #[arg(long)]
    no_stats: bool,
    /// Machine-readable output (one JSON object on stdout).
    #[arg(long)]
    json: bool,
}

/// The shape a memset sets, as `[depth, height, width]` without the dimensions of 1 (a 1-D
/// memset is `[bytes]`).
fn memset_shape(m: &MemsetOp) -> Vec<u64> {
    let dims = [m.depth, m.height, m.width];
    let first = dims.iter().position(|&d| d != 1).unwrap_or(2);
    dims[first..].to_vec()
}

/// One op's communicator column: `key r/size`.
fn comm_of(r: &Record) -> String {
    match &r.op {
        Op::Collective(c) => format!("{:x} {}/{}", c.comm, c.comm_rank, c.comm_size),
        _ => "-".into(),
    }
}

fn stats_json(s: &Stats) -> Value {
    let f = |v: Option<f64>| v.map_or(Value::Null, json_f64);
    json!({
        "elements": s.elements,
        "min": f(s.min),
        "max": f(s.max),
        "mean": f(s.mean),
        "absmax": f(s.absmax),
        "nan": s.nan,
        "inf": s.inf,
    })
}

/// Statistics of tensor `t` of `v`, or why there are none.
fn tensor_stats(
    v: &RecordView<'_>,
    t: usize,
    scratch: &mut Vec<u8>,
    buf: &mut Vec<u8>,
) -> Result<Stats, String> {
    let tensor = &v.record.tensors[t];
    if !v.is_captured(t) {
        return Err("not captured".into());
    }
    v.tensor_bytes_into(t, scratch, buf)
        .map_err(|e| e.to_string())?;
    stats(tensor.dtype, buf).map_err(|e| e.to_string())
}

fn tensor_row_json(v: &RecordView<'_>, t: usize, st: &Result<Stats, String>) -> Value {
    let tensor: &Tensor = &v.record.tensors[t];
    let mut j = json!({
        "role": role_name(tensor.role),
        "dtype": tensor.dtype.name(),
        "shape": tensor.shape,
        "nbytes": tensor.nbytes,
        "captured": tensor.captured,
        "stored_bytes": v.stored_len(t),
        "crc32": tensor.crc32,
    });
    match st {
        Ok(s) => j["stats"] = stats_json(s),
        Err(why) if tensor.captured => j["error"] = why.clone().into(),
        Err(_) => {}
    }
    j
}

/// Runs `ttrace show`.
pub fn main(a: ShowArgs) -> anyhow::Result<()> {
    let store = open_store("show", &a.run)?;
    let Some(_) = store.segment_info(a.rank, a.step) else {
        let have: Vec<String> = store
            .segments()
            .iter()
            .filter(|s| s.rank == a.rank)
            .map(|s| s.step.to_string())
            .collect();
        if have.is_empty() {
            bail!(
                "{}: no records of rank {} (ranks: {:?})",
                a.run.display(),
                a.rank,
                store.ranks()
            );
        }
        bail!(
            "{}: rank {} has no step {} (steps: {})",
            a.run.display(),
            a.rank,
            a.step,
            have.join(",")
        );
    };
    let seg = store.open_segment(a.rank, a.step)?;
    if !a.json {
        for i in seg.issues() {
            warn("show", i);
        }
    }
    match a.seq {
        Some(seq) => show_one(&a, &seg, seq),
        None => show_table(&a, &seg),
    }
}

/// The table rows of one record: its gap reason (if a gap), then a row per tensor with its
/// statistics (`st`, one per tensor); the record's columns on its first row only.
fn table_rows(r: &Record, st: &[Result<Stats, String>]) -> Vec<Vec<String>> {
    let head = vec![
        r.seq.to_string(),
        r.api.clone(),
        if r.nvtx.is_empty() {
            "-".into()
        } else {
            r.nvtx.join("/")
        },
        format!("{:#x}", r.stream),
        comm_of(r),
    ];
    let mut rows = Vec::new();
    if let Op::Gap(g) = &r.op {
        // The reason only: the detail is in `--seq`.
        let reason = serde_json::to_value(g.reason)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let mut row = head.clone();
        row.push(format!("gap:{reason}"));
        rows.push(row);
    }
    if let Op::Memset(m) = &r.op {
        // No tensor: the bytes written are the value over the extent.
        let mut row = head.clone();
        row.extend(["set".into(), "u8".into(), fmt_shape(&memset_shape(m))]);
        row.extend(std::iter::repeat_n("-".to_string(), 6));
        row.push(format!("memset to {:#04x}", m.value));
        rows.push(row);
    }
    let opt = |v: Option<f64>| v.map_or("-".into(), fmt_f64);
    for (t, (tensor, st)) in r.tensors.iter().zip(st).enumerate() {
        let mut row = if t == 0 {
            head.clone()
        } else {
            vec![String::new(); head.len()]
        };
        row.push(role_name(tensor.role));
        row.push(tensor.dtype.name().into());
        row.push(fmt_shape(&tensor.shape));
        match st {
            Ok(s) => row.extend([
                opt(s.min),
                opt(s.max),
                opt(s.mean),
                opt(s.absmax),
                s.nan.to_string(),
                s.inf.to_string(),
            ]),
            Err(why) => {
                row.extend(std::iter::repeat_n("-".to_string(), 6));
                row.push(why.clone());
            }
        }
        rows.push(row);
    }
    rows
}

/// One record of `show --json`'s list, with its tensors' statistics (`st`).
fn record_json(v: &RecordView<'_>, st: &[Result<Stats, String>]) -> Value {
    let r = &v.record;
    let tensors: Vec<Value> = st
        .iter()
        .enumerate()
        .map(|(t, st)| tensor_row_json(v, t, st))
        .collect();
    json!({
        "seq": r.seq,
        "api": r.api,
        "nvtx": r.nvtx,
        "stream": r.stream,
        "device": r.device,
        "thread": r.thread,
        "op": r.op,
        "t_call_ns": r.t_call_ns,
        "t_done_ns": r.t_done_ns,
        "tensors": tensors,
    })
}

fn show_table(a: &ShowArgs, seg: &Segment) -> anyhow::Result<()> {
    let filter = FilterArgs {
        apis: a.apis.clone(),
        ..FilterArgs::default()
    }
    .parse()?;
    let progress = Progress::bytes(seg.file_len(), "reading");
    let (mut scratch, mut buf) = (Vec::new(), Vec::new());
    let mut rows = vec![[
        "seq", "api", "nvtx", "stream", "comm", "role", "dtype", "shape", "min", "max", "mean",
        "absmax", "nan", "inf", "note",
    ]
    .map(String::from)
    .to_vec()];
    let mut records_json = Vec::new();
    let mut problems = Vec::new();
    for i in 0..seg.len() {
        progress.inc(seg.frames()[i].frame_len);
        let read = if a.no_stats {
            seg.read_meta(i)
        } else {
            seg.read(i)
        };
        let v = match read {
            Ok(v) => v,
            Err(issue) => {
                if !a.json {
                    // Details go to stderr with the other warnings.
                    let seq = match issue.seq {
                        Some(ttrace_format::reader::SeqHint::Exact(s)) => s.to_string(),
                        Some(h) => h.to_string(),
                        None => "?".into(),
                    };
                    rows.push(vec![seq, "UNREADABLE".into()]);
                }
                problems.push(*issue);
                continue;
            }
        };
        if !filter.record(&v.record) {
            continue;
        }
        let st: Vec<Result<Stats, String>> = (0..v.record.tensors.len())
            .map(|t| {
                if a.no_stats {
                    Err("skipped".into())
                } else {
                    tensor_stats(&v, t, &mut scratch, &mut buf)
                }
            })
            .collect();
        rows.extend(table_rows(&v.record, &st));
        records_json.push(record_json(&v, &st));
    }
    progress.finish();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if a.json {
        let v = json!({
            "rank": seg.rank,
            "step": seg.step,
            "records": records_json,
            "issues": seg.issues().iter().chain(&problems).collect::<Vec<_>>(),
        });
        serde_json::to_writer_pretty(&mut out, &v)?;
        writeln!(out)?;
        return Ok(());
    }
    for p in &problems {
        warn("show", p);
    }
    writeln!(
        out,
        "rank {} step {}: {} records ({})",
        seg.rank,
        seg.step,
        seg.len(),
        human(seg.file_len())
    )?;
    print_table(&mut out, &rows)?;
    Ok(())
}

/// A tensor's statistics and the preview of its values (None when they could not be read).
type TensorDetail = (Result<Stats, String>, Option<Vec<Vec<f64>>>);

/// `show --seq`'s text: the record's fields, its kernels, then each tensor's statistics and
/// preview.
fn write_record_text(
    out: &mut impl Write,
    v: &RecordView<'_>,
    tensors: &[TensorDetail],
) -> anyhow::Result<()> {
    let r = &v.record;
    writeln!(
        out,
        "rank {} step {} seq {}: {}",
        r.rank, r.step, r.seq, r.api
    )?;
    writeln!(
        out,
        "nvtx     {}",
        if r.nvtx.is_empty() {
            "-".into()
        } else {
            r.nvtx.join(" / ")
        }
    )?;
    writeln!(
        out,
        "stream   {:#x}  device {}  thread {}",
        r.stream, r.device, r.thread
    )?;
    writeln!(
        out,
        "time     called {} ns, done +{} ns",
        r.t_call_ns,
        r.t_done_ns.saturating_sub(r.t_call_ns)
    )?;
    let op = serde_json::to_value(&r.op)?;
    if let Value::Object(m) = &op {
        let parts: Vec<String> = m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => format!("{k}={s}"),
                // Addresses and communicator keys read better in hex.
                Value::Number(n)
                    if ["comm", "sendbuff", "recvbuff", "dst", "src"].contains(&k.as_str()) =>
                {
                    n.as_u64()
                        .map_or_else(|| format!("{k}={n}"), |x| format!("{k}={x:#x}"))
                }
                other => format!("{k}={other}"),
            })
            .collect();
        writeln!(out, "op       {}", parts.join(" "))?;
    }
    if !r.kernels_before.is_empty() {
        writeln!(
            out,
            "kernels launched since the previous captured op ({}):",
            r.kernels_before.len()
        )?;
        for k in &r.kernels_before {
            writeln!(out, "  {k}")?;
        }
    }
    for (t, (st, pv)) in tensors.iter().enumerate() {
        let tensor = &r.tensors[t];
        writeln!(out)?;
        write!(
            out,
            "{} {} {} ({} bytes",
            role_name(tensor.role),
            tensor.dtype.name(),
            fmt_shape(&tensor.shape),
            tensor.nbytes
        )?;
        if let Some(s) = v.stored_len(t) {
            write!(out, ", {s} stored")?;
        }
        writeln!(out, ", ptr {:#x})", tensor.ptr)?;
        match st {
            Ok(s) => {
                let opt = |v: Option<f64>| v.map_or("-".into(), fmt_f64);
                writeln!(
                    out,
                    "  min {}  max {}  mean {}  absmax {}  nan {}  inf {}",
                    opt(s.min),
                    opt(s.max),
                    opt(s.mean),
                    opt(s.absmax),
                    s.nan,
                    s.inf
                )?;
            }
            Err(why) => writeln!(out, "  ({why})")?,
        }
        if let Some(pv) = pv {
            for row in pv {
                let cells: Vec<String> =
                    row.iter().map(|&x| format!("{:>11}", fmt_f64(x))).collect();
                writeln!(out, "  {}", cells.join(" "))?;
            }
        }
    }
    Ok(())
}

/// Up to `rows x cols` values of the last two dimensions (first index of the others).
fn preview(data: &TensorData, shape: &[u64], cols: usize) -> Vec<Vec<f64>> {
    let cols = cols.max(1);
    let rows_max = (cols / 4).max(2);
    let (nrows, ncols) = match shape.len() {
        0 => (1, 1),
        1 => (1, shape[0] as usize),
        n => (shape[n - 2] as usize, shape[n - 1] as usize),
    };
    let mut out = Vec::new();
    if shape.len() <= 1 {
        // A vector: wrap it over a few rows.
        let n = ncols.min(cols * rows_max);
        let vals: Vec<f64> = (0..n).filter_map(|i| data.get_f64(i)).collect();
        return vals.chunks(cols).map(|c| c.to_vec()).collect();
    }
    for r in 0..nrows.min(rows_max) {
        let row: Vec<f64> = (0..ncols.min(cols))
            .filter_map(|c| data.get_f64(r * ncols + c))
            .collect();
        out.push(row);
    }
    out
}

fn show_one(a: &ShowArgs, seg: &Segment, seq: u64) -> anyhow::Result<()> {
    let v = match seg.read_seq(seq) {
        Some(Ok(v)) => v,
        Some(Err(issue)) => bail!("{issue}"),
        None => {
            let last = seg.frames().last().map(|f| f.seq);
            bail!(
                "rank {} step {} has no record with seq {seq} ({} records{})",
                seg.rank,
                seg.step,
                seg.len(),
                last.map_or(String::new(), |l| format!(", last seq {l}"))
            )
        }
    };
    let r = &v.record;
    let mut tensors = Vec::new();
    let (mut scratch, mut buf) = (Vec::new(), Vec::new());
    for t in 0..r.tensors.len() {
        let st = tensor_stats(&v, t, &mut scratch, &mut buf);
        let pv = if st.is_ok() {
            TensorData::from_le_bytes(r.tensors[t].dtype, &buf)
                .ok()
                .map(|d| preview(&d, &r.tensors[t].shape, a.preview))
        } else {
            None
        };
        tensors.push((st, pv));
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if a.json {
        let ts: Vec<Value> = tensors
            .iter()
            .enumerate()
            .map(|(t, (st, pv))| {
                let mut j = tensor_row_json(&v, t, st);
                if let Some(pv) = pv {
                    j["preview"] = pv
                        .iter()
                        .map(|row| row.iter().map(|&x| json_f64(x)).collect::<Vec<_>>())
                        .collect::<Vec<_>>()
                        .into();
                }
                j
            })
            .collect();
        let mut rec = serde_json::to_value(r).context("record")?;
        rec["tensors"] = ts.into();
        serde_json::to_writer_pretty(&mut out, &rec)?;
        writeln!(out)?;
        return Ok(());
    }
    write_record_text(&mut out, &v, &tensors)
}

/// Per (rank, step), over the floating-point tensors: records, tensors and elements read, NaN
/// and Inf counts, the largest finite absolute value, and the first record (in host order) whose tensors hold a NaN or Inf —
/// where to start looking when a run diverged.
///
/// Examples:
///
///   ttrace stats runs/tp2
///
///   ttrace stats runs/tp2 --steps 3 --apis gemm --roles D --json
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct StatsArgs {
    /// The store.
    run: PathBuf,
    #[command(flatten)]
    filter: FilterArgs,
    /// Machine-readable output (one JSON object on stdout).
    #[arg(long)]
    json: bool,
}

/// Runs `ttrace stats`.
pub fn stats_main(a: StatsArgs) -> anyhow::Result<()> {
    let store = open_store("stats", &a.run)?;
    let filter = a.filter.parse()?;
    let segs = filter.segments(&store);
    let total: u64 = segs.iter().map(|s| s.bytes).sum();
    let progress = Progress::bytes(total, "reading");
    let mut segments = Vec::new();
    let mut issues = Vec::new();
    for info in segs {
        match store.open_segment(info.rank, info.step) {
            Ok(seg) => segments.push(segment_stats(&seg, &filter, &progress, &mut issues)),
            Err(e) => {
                progress.println(&format!("ttrace stats: warning: {e}"));
                progress.inc(info.bytes);
            }
        }
    }
    progress.finish();
    let mut out = std::io::stdout().lock();
    if a.json {
        serde_json::to_writer_pretty(&mut out, &json!({ "segments": segments, "issues": issues }))?;
        writeln!(out)?;
        return Ok(());
    }
    for i in &issues {
        warn("stats", i);
    }
    let mut rows = vec![[
        "rank",
        "step",
        "records",
        "tensors",
        "elements",
        "nan",
        "inf",
        "absmax",
        "first non-finite",
    ]
    .map(String::from)
    .to_vec()];
    rows.extend(segments.iter().map(SegmentStats::row));
    print_table(&mut out, &rows)?;
    Ok(())
}

/// `ttrace stats` of one (rank, step), over its floating-point tensors.
#[derive(Serialize)]
struct SegmentStats {
    rank: u32,
    step: u64,
    records: u64,
    tensors: u64,
    elements: u64,
    nan: u64,
    inf: u64,
    /// The largest finite absolute value.
    #[serde(serialize_with = "json_f64_opt")]
    absmax: Option<f64>,
    first_non_finite: Option<FirstNonFinite>,
}

/// The first record (host order) with a NaN or Inf in a tensor.
#[derive(Serialize)]
struct FirstNonFinite {
    seq: u64,
    api: String,
    role: String,
    nvtx: Vec<String>,
    nan: u64,
    inf: u64,
}

fn json_f64_opt<S: serde::Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&v.map(json_f64), s)
}

impl SegmentStats {
    /// Its row of the text table.
    fn row(&self) -> Vec<String> {
        let first = self.first_non_finite.as_ref().map_or("-".to_string(), |f| {
            format!("seq {} {} {} ({})", f.seq, f.api, f.role, f.nvtx.join("/"))
        });
        vec![
            self.rank.to_string(),
            self.step.to_string(),
            self.records.to_string(),
            self.tensors.to_string(),
            self.elements.to_string(),
            self.nan.to_string(),
            self.inf.to_string(),
            self.absmax.map_or("-".into(), fmt_f64),
            first,
        ]
    }
}

/// Reads every record of `seg` the filter keeps; unreadable records go to `issues`.
fn segment_stats(
    seg: &Segment,
    filter: &Filter,
    progress: &Progress,
    issues: &mut Vec<Issue>,
) -> SegmentStats {
    issues.extend(seg.issues().iter().cloned());
    let (mut scratch, mut buf) = (Vec::new(), Vec::new());
    let mut out = SegmentStats {
        rank: seg.rank,
        step: seg.step,
        records: 0,
        tensors: 0,
        elements: 0,
        nan: 0,
        inf: 0,
        absmax: None,
        first_non_finite: None,
    };
    for i in 0..seg.len() {
        progress.inc(seg.frames()[i].frame_len);
        let v = match seg.read(i) {
            Ok(v) => v,
            Err(issue) => {
                issues.push(*issue);
                continue;
            }
        };
        if !filter.record(&v.record) {
            continue;
        }
        out.records += 1;
        for (t, tensor) in v.record.tensors.iter().enumerate() {
            // Floating-point tensors only: copied bytes (U8) and integers have no NaN.
            if !filter.role(tensor.role) || !v.is_captured(t) || !tensor.dtype.is_float() {
                continue;
            }
            let s = match tensor_stats(&v, t, &mut scratch, &mut buf) {
                Ok(s) => s,
                Err(why) => {
                    progress.println(&format!("ttrace stats: warning: {why}"));
                    continue;
                }
            };
            out.tensors += 1;
            out.elements += s.elements;
            out.nan += s.nan;
            out.inf += s.inf;
            if let Some(m) = s.absmax {
                out.absmax = Some(out.absmax.map_or(m, |a| a.max(m)));
            }
            if out.first_non_finite.is_none() && s.nan + s.inf > 0 {
                out.first_non_finite = Some(FirstNonFinite {
                    seq: v.record.seq,
                    api: v.record.api.clone(),
                    role: role_name(tensor.role),
                    nvtx: v.record.nvtx.clone(),
                    nan: s.nan,
                    inf: s.inf,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ttrace_format::dtype::DType;

    #[test]
    fn previews_take_the_top_left_corner() {
        let bytes: Vec<u8> = (0..60u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let d = TensorData::from_le_bytes(DType::F32, &bytes).expect("f32");
        let p = preview(&d, &[3, 4, 5], 3);
        assert_eq!(p, vec![vec![0.0, 1.0, 2.0], vec![5.0, 6.0, 7.0]]);
        let p = preview(&d, &[60], 4);
        assert_eq!(p, vec![vec![0.0, 1.0, 2.0, 3.0], vec![4.0, 5.0, 6.0, 7.0]]);
    }
}
