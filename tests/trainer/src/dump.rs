//! `--dump DIR`: the losses and the final fp32 master weights, as shards of canonical tensors.
//!
//! Files:
//! * `losses.txt`: one line per step, `step <n> loss <value>`, exactly as printed on stdout
//!   (written by the rank that prints).
//! * `weights.rank<R>.tsv` and `weights.rank<R>.f32`, one pair per global rank R: every
//!   parameter the rank holds, as a block of its canonical (unsharded) tensor. Each TSV line
//!   after the `#` header is `name shape rows cols offset count` (tab-separated): the canonical
//!   name (a tied copy uses the embedding's), the full shape (`128x64`, or `64` for a vector),
//!   the row range `r0:r1` and column range `c0:c1` of the block (`-` for a vector), and where
//!   its `count` values start in the `.f32` file (byte offset); values are little-endian f32,
//!   row-major within the block. Replicas (DP ranks, TP copies of norms, tied copies) each
//!   write their own block, so a reader can both assemble every tensor and check that replicas
//!   agree. Under ZeRO-1 the masters are all-gathered over DP first.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};

use crate::params::StageParams;

/// The `README` written next to the files (global rank 0).
pub const README: &str = "\
Trainer dump.
losses.txt: one line per step, `step <n> loss <value>`, as printed on stdout.
weights.rank<R>.tsv / weights.rank<R>.f32, one pair per global rank R: the final fp32 master
weights the rank holds, each as a block of a canonical (unsharded) tensor. TSV columns after the
`#` header: name, full shape (`128x64`, or `64` for a vector), rows `r0:r1`, columns `c0:c1`
(`-` for a vector), byte offset of the block in the .f32 file, element count. Values are
little-endian f32, row-major within the block. Replicas (DP ranks, TP copies of norms, the
tied embedding on the first and last stage) each write their block.
";

/// Writes the `README`.
pub fn readme(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let p = dir.join("README");
    std::fs::write(&p, README).with_context(|| format!("writing {}", p.display()))
}

/// Appends a step's loss line to `losses.txt`.
pub fn loss(dir: &Path, line: &str) -> Result<()> {
    use std::io::Write;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let p = dir.join("losses.txt");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&p)
        .with_context(|| format!("opening {}", p.display()))?;
    writeln!(f, "{line}").with_context(|| format!("writing {}", p.display()))?;
    Ok(())
}

/// Writes rank `rank`'s master weights (`master`: the whole flat buffer, host copy).
pub fn weights(dir: &Path, rank: usize, params: &StageParams, master: &[f32]) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut tsv = String::from("# name\tshape\trows\tcols\toffset\tcount\n");
    let mut bin: Vec<u8> = Vec::new();
    for (i, p) in params.specs.iter().enumerate() {
        let (o, n) = params.range(i);
        let sh = params.shards[i];
        let (shape, cols) = if p.shape.len() == 1 {
            (p.shape[0].to_string(), "-".to_string())
        } else {
            (
                format!("{}x{}", p.shape[0], p.shape[1]),
                format!("{}:{}", sh.c0, sh.c1),
            )
        };
        let _ = writeln!(
            tsv,
            "{}\t{shape}\t{}:{}\t{cols}\t{}\t{n}",
            p.name,
            sh.r0,
            sh.r1,
            bin.len()
        );
        for v in &master[o..o + n] {
            bin.extend_from_slice(&v.to_le_bytes());
        }
    }
    let tsv_path = dir.join(format!("weights.rank{rank}.tsv"));
    let bin_path = dir.join(format!("weights.rank{rank}.f32"));
    std::fs::write(&tsv_path, tsv).with_context(|| format!("writing {}", tsv_path.display()))?;
    std::fs::write(&bin_path, bin).with_context(|| format!("writing {}", bin_path.display()))?;
    Ok(())
}
