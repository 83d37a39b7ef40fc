//! `ttrace dump`: every record of a store as JSON lines, with its tensors' bytes as files: what
//! the real-GPU checks (scripts/gpu-check*, check.py) parse. Read through the one segment
//! reader (`reader::Segment`).

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use ttrace_format::reader::Segment;
use ttrace_format::store::Manifest;

/// Print every record of a store as one JSON object per line (debugging aid).
///
/// Each line is the record's metadata plus, per tensor, `crc_ok` (whether the stored bytes
/// match the record's CRC-32) and with --tensors the file its raw little-endian bytes were
/// written to (`r<rank>_s<step>_q<seq>_t<i>.bin`, packed row-major as the record's shape and
/// dtype say). Corrupt frames are reported on stderr and skipped; a tensor that cannot be
/// read (a missing stream file, a reference to a damaged record) gets `crc_ok: false` and
/// `error`.
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct DumpArgs {
    /// The store (a directory written by `ttrace run` or ttraced).
    run: PathBuf,
    /// Also write each captured tensor's bytes into this directory.
    #[arg(long, value_name = "DIR")]
    tensors: Option<PathBuf>,
    /// Only this rank.
    #[arg(long)]
    rank: Option<u32>,
    /// Only this step.
    #[arg(long)]
    step: Option<u64>,
}

/// Runs `ttrace dump`.
pub fn main(a: DumpArgs) -> anyhow::Result<()> {
    let manifest = Manifest::read(&a.run)?;
    if !manifest.finalized {
        eprintln!(
            "ttrace dump: the run was not finalised (its collector died?); reading what is there"
        );
    }
    if let Some(d) = &a.tensors {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let mut segments = Vec::new();
    for rank_dir in std::fs::read_dir(&a.run).with_context(|| a.run.display().to_string())? {
        let rank_dir = rank_dir?.path();
        let is_rank = rank_dir
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("rank"));
        if !is_rank || !rank_dir.is_dir() {
            continue;
        }
        for seg in std::fs::read_dir(&rank_dir)? {
            let seg = seg?.path();
            if seg.extension().is_some_and(|e| e == "seg") {
                segments.push(seg);
            }
        }
    }
    segments.sort();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for seg in segments {
        let r = Segment::open(&seg)?;
        if a.rank.is_some_and(|x| x != r.rank) || a.step.is_some_and(|x| x != r.step) {
            continue;
        }
        for issue in r.issues().iter().filter(|i| i.kind.loses_data()) {
            eprintln!("ttrace dump: {}: {issue}", seg.display());
        }
        for f in r.into_frames() {
            let f = match f {
                Ok(f) => f,
                Err(issue) => {
                    eprintln!("ttrace dump: {}: {issue}", seg.display());
                    continue;
                }
            };
            let mut v = serde_json::to_value(&f.record)?;
            let mut blob = 0;
            for (ti, t) in f.record.tensors.iter().enumerate() {
                if !t.captured {
                    continue;
                }
                let read = f.tensor_bytes(blob);
                blob += 1;
                let jt = &mut v["tensors"][ti];
                // A streamed tensor whose file is gone, a reference to a damaged record: this
                // tensor is bad, the rest of the store is still dumped.
                let bytes = match read {
                    Ok(bytes) => bytes,
                    Err(e) => {
                        eprintln!(
                            "ttrace dump: {}: seq {} tensor {ti}: {e}",
                            seg.display(),
                            f.record.seq
                        );
                        jt["crc_ok"] = false.into();
                        jt["error"] = e.to_string().into();
                        continue;
                    }
                };
                jt["crc_ok"] = (crc32fast::hash(&bytes) == t.crc32).into();
                if let Some(d) = &a.tensors {
                    let name = format!(
                        "r{}_s{}_q{}_t{ti}.bin",
                        f.record.rank, f.record.step, f.record.seq
                    );
                    std::fs::write(d.join(&name), &bytes)?;
                    jt["file"] = name.into();
                }
            }
            serde_json::to_writer(&mut out, &v)?;
            writeln!(out)?;
        }
    }
    Ok(())
}
