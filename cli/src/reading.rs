//! What the reading commands (`ls`, `show`, `stats`, `export`, `fsck`) share: record filters,
//! warnings, and JSON-safe numbers (their progress bar is crate::progress).

use anyhow::{bail, Context};
use clap::Args;
use ttrace_format::config::RangeSet;
use ttrace_format::reader::{Issue, SegmentInfo, Store};
use ttrace_format::record::{Op, Record, Role};

/// Which records and tensors a command looks at.
#[derive(Args, Debug, Clone, Default)]
pub struct FilterArgs {
    /// Only these global ranks: `0,2-3`.
    #[arg(long, value_name = "SET")]
    pub ranks: Option<String>,
    /// Only these steps: `0-3,7`.
    #[arg(long, value_name = "SET")]
    pub steps: Option<String>,
    /// Only these APIs: families (`gemm`, `nccl`, `memcpy`, `gap`), exact names
    /// (`cublasLtMatmul`), or prefixes ending in `*` (`cublasLt*`); comma-separated.
    #[arg(long, value_name = "LIST")]
    pub apis: Option<String>,
    /// Only tensors with these roles (`A`, `B`, `CIn`, `D`, `Bias`, `Input`, `Output`, `Dst`,
    /// ...); comma-separated, any case.
    #[arg(long, value_name = "LIST")]
    pub roles: Option<String>,
}

/// Parsed [`FilterArgs`].
#[derive(Debug, Clone, Default)]
pub struct Filter {
    ranks: Option<RangeSet>,
    steps: Option<RangeSet>,
    apis: Vec<String>,
    roles: Vec<Role>,
}

const ROLES: [Role; 23] = [
    Role::A,
    Role::B,
    Role::CIn,
    Role::D,
    Role::Bias,
    Role::Aux,
    Role::ScaleA,
    Role::ScaleB,
    Role::ScaleC,
    Role::ScaleD,
    Role::AmaxD,
    Role::Alpha,
    Role::Beta,
    Role::Input,
    Role::Output,
    Role::Src,
    Role::Dst,
    Role::ArrayA,
    Role::ArrayB,
    Role::ArrayC,
    Role::BlockScaleA,
    Role::BlockScaleB,
    Role::BlockScaleD,
];

/// The name of a role as records spell it (`CIn`).
pub fn role_name(r: Role) -> String {
    format!("{r:?}")
}

impl FilterArgs {
    /// Parses the sets and lists.
    pub fn parse(&self) -> anyhow::Result<Filter> {
        let set = |s: &Option<String>, what: &str| -> anyhow::Result<Option<RangeSet>> {
            s.as_deref()
                .map(|v| RangeSet::parse(v).with_context(|| format!("--{what}")))
                .transpose()
        };
        let list = |s: &Option<String>| -> Vec<String> {
            s.as_deref()
                .map(|v| {
                    v.split(',')
                        .map(|x| x.trim().to_string())
                        .filter(|x| !x.is_empty())
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut roles = Vec::new();
        for r in list(&self.roles) {
            match ROLES
                .iter()
                .find(|k| role_name(**k).eq_ignore_ascii_case(&r))
            {
                Some(k) => roles.push(*k),
                None => bail!(
                    "--roles: unknown role `{r}` (roles: {})",
                    ROLES.map(role_name).join(", ")
                ),
            }
        }
        let apis = list(&self.apis);
        // A misspelt filter would select nothing and look like an empty store.
        for a in &apis {
            let family = ["gemm", "nccl", "collective", "memcpy", "memset", "gap"]
                .iter()
                .any(|f| a.eq_ignore_ascii_case(f));
            let api = a.starts_with("cu") || a.starts_with("nccl");
            if !family && !api {
                bail!(
                    "--apis: `{a}` is neither a family (gemm, nccl, memcpy, memset, gap) nor a CUDA, \
                     cuBLAS or NCCL API name or prefix (cublasLtMatmul, ncclAllReduce, cublas*)"
                );
            }
        }
        Ok(Filter {
            ranks: set(&self.ranks, "ranks")?,
            steps: set(&self.steps, "steps")?,
            apis,
            roles,
        })
    }
}

impl Filter {
    /// Whether a segment's (rank, step) passes.
    pub fn segment(&self, s: &SegmentInfo) -> bool {
        self.ranks
            .as_ref()
            .is_none_or(|r| r.contains(s.rank as u64))
            && self.steps.as_ref().is_none_or(|r| r.contains(s.step))
    }

    /// Whether a record's API passes.
    pub fn record(&self, r: &Record) -> bool {
        if self.apis.is_empty() {
            return true;
        }
        self.apis.iter().any(|a| {
            let family = match a.to_ascii_lowercase().as_str() {
                "gemm" => Some(matches!(r.op, Op::Gemm(_))),
                "nccl" | "collective" => Some(matches!(r.op, Op::Collective(_))),
                "memcpy" => Some(matches!(r.op, Op::Memcpy(_))),
                "memset" => Some(matches!(r.op, Op::Memset(_))),
                "gap" => Some(matches!(r.op, Op::Gap(_))),
                _ => None,
            };
            family.unwrap_or_else(|| match a.strip_suffix('*') {
                Some(prefix) => r.api.starts_with(prefix),
                None => r.api == *a,
            })
        })
    }

    /// Whether a tensor role passes.
    pub fn role(&self, role: Role) -> bool {
        self.roles.is_empty() || self.roles.contains(&role)
    }

    /// The store's segments that pass.
    pub fn segments<'a>(&self, store: &'a Store) -> Vec<&'a SegmentInfo> {
        store
            .segments()
            .iter()
            .filter(|s| self.segment(s))
            .collect()
    }
}

/// Prints a reader issue as a warning on stderr.
pub fn warn(cmd: &str, issue: &Issue) {
    eprintln!("ttrace {cmd}: warning: {issue}");
}

/// A float as JSON: a number when finite, else the string `nan`, `inf` or `-inf` (JSON has no
/// such numbers).
pub fn json_f64(v: f64) -> serde_json::Value {
    if v.is_finite() {
        serde_json::Number::from_f64(v)
            .map(serde_json::Value::Number)
            .unwrap_or(serde_json::Value::Null)
    } else if v.is_nan() {
        "nan".into()
    } else if v > 0.0 {
        "inf".into()
    } else {
        "-inf".into()
    }
}

/// Compact display of a float for tables: 4 significant digits.
pub fn fmt_f64(v: f64) -> String {
    if v.is_nan() {
        "nan".into()
    } else if v.is_infinite() {
        if v > 0.0 { "inf" } else { "-inf" }.into()
    } else if v == 0.0 {
        "0".into()
    } else if (1e-3..1e5).contains(&v.abs()) {
        let s = format!("{v:.4}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        s.to_string()
    } else {
        format!("{v:.3e}")
    }
}

/// A shape as `[2, 3]`.
pub fn fmt_shape(shape: &[u64]) -> String {
    format!(
        "[{}]",
        shape
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Prints rows as left-aligned columns separated by two spaces.
pub fn print_table(out: &mut impl std::io::Write, rows: &[Vec<String>]) -> std::io::Result<()> {
    let cols = rows.iter().map(|r| r.len()).max().unwrap_or(0);
    let mut width = vec![0usize; cols];
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            width[i] = width[i].max(c.chars().count());
        }
    }
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            if i + 1 == r.len() {
                line.push_str(c);
            } else {
                line.push_str(c);
                line.extend(std::iter::repeat_n(' ', width[i] - c.chars().count() + 2));
            }
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

/// Opens a store, printing its opening issues as warnings.
pub fn open_store(cmd: &str, path: &std::path::Path) -> anyhow::Result<Store> {
    let store = Store::open(path)?;
    for i in store.issues() {
        warn(cmd, i);
    }
    Ok(store)
}
