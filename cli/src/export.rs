//! `ttrace export RUN --format safetensors|npy --out DIR`: captured tensors as files that
//! PyTorch, numpy and other tools load.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use serde::Serialize;
use ttrace_format::dtype::DType;
use ttrace_format::reader::{Segment, SegmentInfo, Store};
use ttrace_format::record::Record;
use ttrace_format::tensor::{widen_f32_into, widens_to_f32_exactly};

use crate::progress::Progress;
use crate::reading::{open_store, role_name, Filter, FilterArgs};
use crate::units::human;

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// One `.safetensors` file per (rank, step); every dtype kept exactly (BF16, F16, F8_E4M3,
    /// F8_E5M2 included).
    Safetensors,
    /// One `.npy` file per tensor; BF16 and FP8 need --widen.
    Npy,
}

/// Export captured tensors to safetensors or npy files.
///
/// safetensors: one file per rank and step, `DIR/rank00001_step000003.safetensors`, every
/// dtype kept exactly as captured. npy: one file per tensor,
/// `DIR/rank00001/step000003/seq000017.cublasLtMatmul.D.npy`; numpy has no BF16 or FP8, so
/// those are refused unless --widen converts them to float32 (exact: every BF16/FP8 value is
/// a float32).
///
/// Tensor names say rank, step, seq, API, role and NVTX path:
/// `rank1/step3/seq17/cublasLtMatmul/D@train/layers.0/mlp`. DIR/index.json lists every
/// exported tensor with its file, name, record identity, dtype, shape and CRC-32.
///
/// Bytes are exactly the captured ones, packed row-major as the record's shape says (GEMM
/// operands column-major as cuBLAS holds them: a rows x cols matrix has shape [cols, rows]).
/// Damaged records are skipped with a warning; the rest is exported.
///
/// Examples:
///
///   ttrace export runs/tp2 --format safetensors --out /tmp/tp2
///
///   ttrace export runs/tp2 --format npy --widen --steps 0 --apis gemm --roles D --out /tmp/d
///
///   python -c "from safetensors.numpy import load_file; print(load_file('/tmp/tp2/rank00000_step000000.safetensors').keys())"
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct ExportArgs {
    /// The store.
    run: PathBuf,
    /// Output format.
    #[arg(long, value_enum)]
    format: Format,
    /// Output directory (created; must be empty unless --force).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    #[command(flatten)]
    filter: FilterArgs,
    /// npy: convert BF16, F8_E4M3 and F8_E5M2 tensors to float32 instead of refusing them.
    #[arg(long)]
    widen: bool,
    /// Write into a non-empty directory (replacing files of the same names).
    #[arg(long)]
    force: bool,
    /// Parallel writers (default: the CPUs available).
    #[arg(long, value_name = "N")]
    jobs: Option<usize>,
    /// Machine-readable summary (one JSON object on stdout).
    #[arg(long)]
    json: bool,
}

/// One exported tensor, as DIR/index.json lists it.
#[derive(Debug, Clone, Serialize)]
struct Exported {
    name: String,
    /// Relative to DIR.
    file: String,
    rank: u32,
    step: u64,
    seq: u64,
    api: String,
    role: String,
    nvtx: Vec<String>,
    /// As captured.
    dtype: &'static str,
    /// As written (differs only when widened).
    file_dtype: &'static str,
    shape: Vec<u64>,
    nbytes: u64,
    crc32: u32,
}

/// One tensor to export from a segment.
#[derive(Debug, Clone)]
struct Item {
    frame: usize,
    tensor: usize,
    name: String,
    dtype: DType,
    shape: Vec<u64>,
    nbytes: u64,
}

/// A tensor's name: `rank1/step3/seq17/cublasLtMatmul/D@train/layers.0/mlp`.
pub fn tensor_name(r: &Record, tensor: usize) -> String {
    let t = &r.tensors[tensor];
    let mut s = format!(
        "rank{}/step{}/seq{}/{}/{}",
        r.rank,
        r.step,
        r.seq,
        r.api,
        role_name(t.role)
    );
    if r.tensors.iter().filter(|x| x.role == t.role).count() > 1 {
        s.push_str(&format!("#{tensor}"));
    }
    if !r.nvtx.is_empty() {
        s.push('@');
        s.push_str(&r.nvtx.join("/"));
    }
    s
}

/// A file-name-safe form of a client-supplied string (API names come from the traced
/// process): ASCII letters, digits, `_` and `-`, at most 64 characters.
fn safe(s: &str) -> String {
    let mut o: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if o.is_empty() {
        o.push('_');
    }
    o
}

/// The numpy `descr` of a dtype numpy holds.
fn npy_descr(d: DType) -> Option<&'static str> {
    Some(match d {
        DType::F64 => "<f8",
        DType::F32 => "<f4",
        DType::F16 => "<f2",
        DType::I64 => "<i8",
        DType::I32 => "<i4",
        DType::I16 => "<i2",
        DType::I8 => "|i1",
        DType::U64 => "<u8",
        DType::U32 => "<u4",
        DType::U16 => "<u2",
        DType::U8 => "|u1",
        DType::BOOL => "|b1",
        DType::BF16 | DType::F8_E4M3 | DType::F8_E5M2 | DType::F8_E8M0 | DType::F4_E2M1X2 => {
            return None
        }
    })
}

/// An `.npy` version 1.0 header (padded so the data starts 64-byte aligned).
fn npy_header(descr: &str, shape: &[u64]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    let unpadded = 10 + dict.len() + 1;
    dict.extend(std::iter::repeat_n(
        ' ',
        unpadded.next_multiple_of(64) - unpadded,
    ));
    dict.push('\n');
    let mut h = Vec::with_capacity(10 + dict.len());
    h.extend_from_slice(b"\x93NUMPY\x01\x00");
    h.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    h.extend_from_slice(dict.as_bytes());
    h
}

fn st_dtype(d: DType) -> safetensors::Dtype {
    use safetensors::Dtype as S;
    match d {
        DType::F64 => S::F64,
        DType::F32 => S::F32,
        DType::F16 => S::F16,
        DType::BF16 => S::BF16,
        DType::F8_E4M3 => S::F8_E4M3,
        DType::F8_E5M2 => S::F8_E5M2,
        DType::I64 => S::I64,
        DType::I32 => S::I32,
        DType::I16 => S::I16,
        DType::I8 => S::I8,
        DType::U64 => S::U64,
        DType::U32 => S::U32,
        DType::U16 => S::U16,
        DType::U8 => S::U8,
        DType::BOOL => S::BOOL,
        DType::F8_E8M0 => S::F8_E8M0,
        // safetensors' F4 counts 4-bit values: see `st_shape`.
        DType::F4_E2M1X2 => S::F4,
    }
}

/// A tensor's shape as safetensors counts it: packed FP4 pairs are two values each (the
/// innermost dimension doubled).
fn st_shape(d: DType, shape: &[u64]) -> Vec<usize> {
    let mut s: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
    if let Some(last) = s.last_mut() {
        *last *= d.values_per_element();
    }
    s
}

/// What exporting one segment produced.
#[derive(Default)]
struct SegmentResult {
    exported: Vec<Exported>,
    bytes: u64,
    warnings: Vec<String>,
}

/// Decodes tensors for the safetensors writer, which asks for each tensor's bytes in turn.
struct Decoder<'a> {
    seg: &'a Segment,
    /// Frames whose CRC was checked.
    verified: RefCell<HashSet<usize>>,
    scratch: RefCell<Vec<u8>>,
    /// Items that failed, with why.
    failed: RefCell<Vec<(usize, String)>>,
    progress: &'a Progress,
}

impl Decoder<'_> {
    /// The bytes of item `k` (zeros of the right length when it fails: the failure is noted
    /// and the file rewritten without it).
    fn bytes(&self, k: usize, it: &Item) -> Vec<u8> {
        let res = (|| -> Result<Vec<u8>, String> {
            let first = !self.verified.borrow().contains(&it.frame);
            let v = if first {
                let v = self.seg.read(it.frame).map_err(|i| i.to_string())?;
                self.verified.borrow_mut().insert(it.frame);
                self.progress.inc(v.frame_len);
                v
            } else {
                self.seg.read_meta(it.frame).map_err(|i| i.to_string())?
            };
            let mut out = Vec::with_capacity(it.nbytes as usize);
            v.tensor_bytes_into(it.tensor, &mut self.scratch.borrow_mut(), &mut out)
                .map_err(|e| e.to_string())?;
            Ok(out)
        })();
        match res {
            Ok(b) => b,
            Err(why) => {
                self.failed.borrow_mut().push((k, why));
                vec![0u8; it.nbytes as usize]
            }
        }
    }
}

/// A tensor as the safetensors writer sees it: bytes decoded when it asks.
struct LazyTensor<'a> {
    k: usize,
    item: &'a Item,
    shape: Vec<usize>,
    dec: &'a Decoder<'a>,
}

impl safetensors::View for LazyTensor<'_> {
    fn dtype(&self) -> safetensors::Dtype {
        st_dtype(self.item.dtype)
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Owned(self.dec.bytes(self.k, self.item))
    }
    fn data_len(&self) -> usize {
        self.item.nbytes as usize
    }
}

/// Lists the tensors of `seg` that pass `filter` (metadata only, no checksum yet).
fn plan(seg: &Segment, filter: &Filter, warnings: &mut Vec<String>) -> Vec<Item> {
    let mut items = Vec::new();
    for i in 0..seg.len() {
        let v = match seg.read_meta(i) {
            Ok(v) => v,
            Err(issue) => {
                warnings.push(issue.to_string());
                continue;
            }
        };
        let r = &v.record;
        if !filter.record(r) {
            continue;
        }
        for (t, tensor) in r.tensors.iter().enumerate() {
            if !v.is_captured(t) || !filter.role(tensor.role) {
                continue;
            }
            // The shape must account for the bytes, or no reader could use the file.
            let elems: Option<u64> = tensor.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            if elems.and_then(|e| e.checked_mul(tensor.dtype.size() as u64)) != Some(tensor.nbytes)
            {
                warnings.push(format!(
                    "rank {} step {} seq {} {} {:?}: shape {:?} of {} does not hold {} bytes; skipped",
                    r.rank,
                    r.step,
                    r.seq,
                    r.api,
                    tensor.role,
                    tensor.shape,
                    tensor.dtype.name(),
                    tensor.nbytes
                ));
                continue;
            }
            items.push(Item {
                frame: i,
                tensor: t,
                name: tensor_name(r, t),
                dtype: tensor.dtype,
                shape: tensor.shape.clone(),
                nbytes: tensor.nbytes,
            });
        }
    }
    items
}

fn exported(seg: &Segment, it: &Item, file: String, file_dtype: DType) -> Option<Exported> {
    let v = seg.read_meta(it.frame).ok()?;
    let r = &v.record;
    let t = &r.tensors[it.tensor];
    Some(Exported {
        name: it.name.clone(),
        file,
        rank: r.rank,
        step: r.step,
        seq: r.seq,
        api: r.api.clone(),
        role: role_name(t.role),
        nvtx: r.nvtx.clone(),
        dtype: t.dtype.name(),
        file_dtype: file_dtype.name(),
        shape: t.shape.clone(),
        nbytes: t.nbytes,
        crc32: t.crc32,
    })
}

/// Writes one safetensors file for the segment.
fn export_safetensors(
    store: &Store,
    seg: &Segment,
    items: Vec<Item>,
    out: &Path,
    progress: &Progress,
) -> anyhow::Result<SegmentResult> {
    let mut res = SegmentResult::default();
    let file = safetensors_file(seg.rank, seg.step);
    let path = out.join(&file);
    let mut items = items;
    let mut meta = HashMap::new();
    meta.insert("ttrace.format".to_string(), "1".to_string());
    meta.insert("ttrace.rank".to_string(), seg.rank.to_string());
    meta.insert("ttrace.step".to_string(), seg.step.to_string());
    if let Some(m) = store.manifest() {
        meta.insert("ttrace.run_id".to_string(), m.run_id.clone());
    }
    // Decoding failures (a damaged record) only show while writing: then the file is
    // written again without the failed tensors.
    for _attempt in 0..2 {
        let dec = Decoder {
            seg,
            verified: RefCell::new(HashSet::new()),
            scratch: RefCell::new(Vec::new()),
            failed: RefCell::new(Vec::new()),
            progress,
        };
        let views: Vec<(String, LazyTensor<'_>)> = items
            .iter()
            .enumerate()
            .map(|(k, it)| {
                (
                    it.name.clone(),
                    LazyTensor {
                        k,
                        item: it,
                        shape: st_shape(it.dtype, &it.shape),
                        dec: &dec,
                    },
                )
            })
            .collect();
        safetensors::serialize_to_file(views, Some(meta.clone()), &path)
            .with_context(|| format!("writing {}", path.display()))?;
        let failed = dec.failed.into_inner();
        if failed.is_empty() {
            for it in &items {
                res.bytes += it.nbytes;
                if let Some(e) = exported(seg, it, file.clone(), it.dtype) {
                    res.exported.push(e);
                }
            }
            return Ok(res);
        }
        let bad: BTreeSet<usize> = failed.iter().map(|f| f.0).collect();
        for (_, why) in failed {
            res.warnings.push(format!("{why}; not exported"));
        }
        items = items
            .into_iter()
            .enumerate()
            .filter(|(k, _)| !bad.contains(k))
            .map(|(_, it)| it)
            .collect();
    }
    bail!("{}: tensors kept failing to decode", path.display())
}

/// The safetensors file of a segment's tensors, in the output directory.
fn safetensors_file(rank: u32, step: u64) -> String {
    format!("rank{rank:05}_step{step:06}.safetensors")
}

/// The directory of a segment's npy files, in the output directory.
fn npy_dir(rank: u32, step: u64) -> String {
    format!("rank{rank:05}/step{step:06}")
}

/// Writes one npy file per item of the segment.
fn export_npy(
    seg: &Segment,
    items: Vec<Item>,
    out: &Path,
    widen: bool,
    progress: &Progress,
) -> anyhow::Result<SegmentResult> {
    let mut res = SegmentResult::default();
    let rel_dir = npy_dir(seg.rank, seg.step);
    let dir = out.join(&rel_dir);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    let (mut scratch, mut raw, mut wide) = (Vec::new(), Vec::new(), Vec::new());
    let mut verified = HashSet::new();
    for it in &items {
        let read = if verified.contains(&it.frame) {
            seg.read_meta(it.frame)
        } else {
            seg.read(it.frame)
        };
        let v = match read {
            Ok(v) => v,
            Err(issue) => {
                res.warnings.push(format!("{issue}; not exported"));
                continue;
            }
        };
        if verified.insert(it.frame) {
            progress.inc(v.frame_len);
        }
        if let Err(e) = v.tensor_bytes_into(it.tensor, &mut scratch, &mut raw) {
            res.warnings.push(format!("{e}; not exported"));
            continue;
        }
        let (descr, data, file_dtype) = match npy_descr(it.dtype) {
            Some(d) => (d, &raw, it.dtype),
            None if widen && widens_to_f32_exactly(it.dtype) => {
                wide.clear();
                widen_f32_into(it.dtype, &raw, &mut wide)?;
                ("<f4", &wide, DType::F32)
            }
            None => bail!(
                "{}: {} cannot be held by .npy (use --widen or --format safetensors)",
                it.name,
                it.dtype.name()
            ),
        };
        let r = &v.record;
        let file = format!(
            "{rel_dir}/seq{:06}.{}.{}{}.npy",
            r.seq,
            safe(&r.api),
            role_name(r.tensors[it.tensor].role),
            if r.tensors
                .iter()
                .filter(|x| x.role == r.tensors[it.tensor].role)
                .count()
                > 1
            {
                format!("{}", it.tensor)
            } else {
                String::new()
            }
        );
        let path = out.join(&file);
        let mut f = std::io::BufWriter::new(
            std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?,
        );
        f.write_all(&npy_header(descr, &it.shape))?;
        f.write_all(data)?;
        f.flush()
            .with_context(|| format!("writing {}", path.display()))?;
        res.bytes += data.len() as u64;
        if let Some(e) = exported(seg, it, file, file_dtype) {
            res.exported.push(e);
        }
    }
    Ok(res)
}

/// What `ttrace export` wrote (its `--json` output).
#[derive(Serialize)]
struct ExportSummary {
    out: PathBuf,
    format: String,
    files: usize,
    tensors: usize,
    bytes: u64,
    index: PathBuf,
    warnings: Vec<String>,
}

/// Runs `ttrace export`.
pub fn main(a: ExportArgs) -> anyhow::Result<()> {
    let store = open_store("export", &a.run)?;
    let filter = a.filter.parse()?;
    let segs: Vec<&SegmentInfo> = filter.segments(&store);
    if segs.is_empty() {
        bail!(
            "{}: no segment matches the rank and step filters (ranks {:?})",
            a.run.display(),
            store.ranks()
        );
    }
    check_out_dir(&a.out, a.force)?;
    if a.format == Format::Npy && !a.widen {
        refuse_narrow_npy(&store, &segs, &filter)?;
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&a.out)
        .with_context(|| format!("creating {}", a.out.display()))?;
    let results = export_segments(&a, &store, &segs, &filter)?;
    let mut all = Vec::new();
    let mut warnings = Vec::new();
    let mut bytes = 0u64;
    let mut failed_segments = 0;
    for (k, r) in results {
        match r {
            Ok(mut r) => {
                bytes += r.bytes;
                all.append(&mut r.exported);
                warnings.append(&mut r.warnings);
            }
            Err(e) => {
                failed_segments += 1;
                warnings.push(format!(
                    "rank {} step {}: {e:#}; nothing exported from it",
                    segs[k].rank, segs[k].step
                ));
            }
        }
    }
    let index = a.out.join("index.json");
    // Whole or not at all, as the reports are (a full disk leaves no truncated index).
    crate::report_out::json(&index, &all)?;
    let summary = ExportSummary {
        out: a.out.clone(),
        format: format!("{:?}", a.format).to_lowercase(),
        files: all
            .iter()
            .map(|e| e.file.as_str())
            .collect::<BTreeSet<_>>()
            .len(),
        tensors: all.len(),
        bytes,
        index,
        warnings,
    };
    if a.json {
        let mut out = std::io::stdout().lock();
        serde_json::to_writer_pretty(&mut out, &summary)?;
        writeln!(out)?;
    } else {
        for w in &summary.warnings {
            eprintln!("ttrace export: warning: {w}");
        }
        println!(
            "exported {} tensors ({}) into {} file(s) in {} (list: {})",
            summary.tensors,
            human(summary.bytes),
            summary.files,
            summary.out.display(),
            summary.index.display()
        );
    }
    if failed_segments == segs.len() {
        bail!("nothing could be exported");
    }
    Ok(())
}

/// Refuses an output directory that holds something, unless `force`.
fn check_out_dir(out: &Path, force: bool) -> anyhow::Result<()> {
    if !out.exists() {
        return Ok(());
    }
    let non_empty = std::fs::read_dir(out)
        .with_context(|| format!("reading {}", out.display()))?
        .next()
        .is_some();
    if non_empty && !force {
        bail!(
            "{} is not empty (pass --force to write into it)",
            out.display()
        );
    }
    Ok(())
}

/// npy: refuses what numpy cannot hold before anything is written.
fn refuse_narrow_npy(store: &Store, segs: &[&SegmentInfo], filter: &Filter) -> anyhow::Result<()> {
    let mut narrow: Vec<String> = Vec::new();
    let mut count = 0usize;
    for info in segs {
        let Ok(seg) = store.open_segment(info.rank, info.step) else {
            continue;
        };
        for it in plan(&seg, filter, &mut Vec::new()) {
            if npy_descr(it.dtype).is_none() {
                count += 1;
                if narrow.len() < 3 {
                    narrow.push(format!("{} ({})", it.name, it.dtype.name()));
                }
            }
        }
    }
    if count > 0 {
        bail!(
            ".npy cannot hold BF16, F8_E4M3 or F8_E5M2, and {count} selected tensor(s) are: {}{}.\n\
             Use --format safetensors (keeps them exactly), --widen (converts them to float32, \
             exactly), or filter them out (--apis, --roles).",
            narrow.join(", "),
            if count > narrow.len() { ", ..." } else { "" }
        );
    }
    Ok(())
}

/// Exports each segment on its own thread (at most `--jobs`); the results in segment order.
fn export_segments(
    a: &ExportArgs,
    store: &Store,
    segs: &[&SegmentInfo],
    filter: &Filter,
) -> anyhow::Result<Vec<(usize, anyhow::Result<SegmentResult>)>> {
    let total: u64 = segs.iter().map(|s| s.bytes).sum();
    let progress = Progress::bytes(total, "exporting");
    let jobs = a
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, segs.len());
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<(usize, anyhow::Result<SegmentResult>)>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(info) = segs.get(k) else { break };
                let r = export_segment(a, store, info, filter, &progress);
                if let Ok(mut v) = results.lock() {
                    v.push((k, r));
                }
            });
        }
    });
    progress.finish();
    let mut results = results
        .into_inner()
        .map_err(|_| anyhow::anyhow!("a writer thread panicked"))?;
    results.sort_by_key(|r| r.0);
    Ok(results)
}

/// Exports one segment's selected tensors; its reader warnings come first in the result's.
fn export_segment(
    a: &ExportArgs,
    store: &Store,
    info: &SegmentInfo,
    filter: &Filter,
    progress: &Progress,
) -> anyhow::Result<SegmentResult> {
    let seg = store.open_segment(info.rank, info.step)?;
    let mut warnings: Vec<String> = seg.issues().iter().map(|i| i.to_string()).collect();
    let items = plan(&seg, filter, &mut warnings);
    let mut res = if items.is_empty() {
        SegmentResult::default()
    } else {
        let written = match a.format {
            Format::Safetensors => export_safetensors(store, &seg, items, &a.out, progress),
            Format::Npy => export_npy(&seg, items, &a.out, a.widen, progress),
        };
        match written {
            Ok(r) => r,
            Err(e) => {
                // Nothing of a segment that failed stays: no truncated file, and none the
                // index would not list.
                let _ = match a.format {
                    Format::Safetensors => {
                        std::fs::remove_file(a.out.join(safetensors_file(seg.rank, seg.step)))
                    }
                    Format::Npy => std::fs::remove_dir_all(a.out.join(npy_dir(seg.rank, seg.step))),
                };
                return Err(e);
            }
        }
    };
    warnings.append(&mut res.warnings);
    res.warnings = warnings;
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// safetensors counts FP4 in 4-bit values: a packed pair tensor of `[3, 8]` bytes is
    /// `F4 [3, 16]`, whose size safetensors computes as the same 24 bytes.
    #[test]
    fn packed_fp4_is_exported_as_f4_with_its_values_counted() {
        assert_eq!(st_dtype(DType::F4_E2M1X2), safetensors::Dtype::F4);
        assert_eq!(st_shape(DType::F4_E2M1X2, &[3, 8]), vec![3, 16]);
        assert_eq!(st_shape(DType::F8_E8M0, &[512]), vec![512]);
        let data = vec![0u8; 24];
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F4, vec![3, 16], &data);
        assert!(view.is_ok(), "{view:?}");
    }

    #[test]
    fn npy_headers_are_aligned_and_well_formed() {
        for shape in [vec![], vec![7], vec![2, 3], vec![4, 5, 6]] {
            let h = npy_header("<f4", &shape);
            assert_eq!(h.len() % 64, 0);
            assert_eq!(&h[..8], b"\x93NUMPY\x01\x00");
            assert_eq!(u16::from_le_bytes([h[8], h[9]]) as usize, h.len() - 10);
            assert_eq!(*h.last().expect("newline"), b'\n');
        }
        let h = String::from_utf8_lossy(&npy_header("<f2", &[7])).into_owned();
        assert!(h.contains("'shape': (7,)"), "{h}");
        let h = String::from_utf8_lossy(&npy_header("|u1", &[])).into_owned();
        assert!(h.contains("'shape': ()"), "{h}");
    }

    #[test]
    fn file_names_keep_only_safe_characters() {
        assert_eq!(safe("cublasLtMatmul"), "cublasLtMatmul");
        assert_eq!(safe("../../etc/passwd"), "______etc_passwd");
        assert_eq!(safe(""), "_");
        assert_eq!(safe(&"x".repeat(100)).len(), 64);
    }
}
