//! Capture configuration, passed from `ttrace run` (or the user's shell, with the bare
//! preload) to every traced process through the environment (children inherit it, whatever
//! launcher sits in between). `TTRACE=0`, `TTRACE_OUT`, `TTRACE_JOB`, `TTRACE_LEVEL` and the
//! collector's variables are read by libttrace.so itself (docs/capture.md).
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `TTRACE_SOCKET` | the daemon's socket; unset: the user's collector, started on demand (docs/capture.md) | — |
//! | `TTRACE_APIS` | families to capture: `memcpy`, `gemm`, `nccl` (comma-separated) | all |
//! | `TTRACE_STEPS` | steps to capture: `0-3,7` | all |
//! | `TTRACE_RANKS` | global ranks to capture: `0,2-3` | all |
//! | `TTRACE_MAX_TENSOR_BYTES` | per-tensor cap; larger tensors keep metadata only | 268435456 |
//! | `TTRACE_INPUTS` | capture op inputs (GEMM A/B/C, collective inputs): `1`/`0` | 1 |
//! | `TTRACE_KERNELS` | record kernel launch names: `1`/`0` | 1 |
//! | `TTRACE_RING_BYTES` | snapshot ring per process; `auto` (or 0): [`auto_ring_bytes`] of the memory the process may use | auto |
//! | `TTRACE_WAIT_MS` | how long capture waits for ring space before recording a gap | 10000 |
//! | `TTRACE_MAX_STALL_MS` | the most a process waits on the daemon over its whole run (ring space, `Hello`); once spent, what does not fit at once is a gap | 30000 |
//! | `TTRACE_STEP_RULE` | `auto`, `nvtx:NAME` (a range or mark named NAME starts a step), `api` (`ttrace_step()` only) | auto |
//! | `TTRACE_LOG` | `error`, `warn`, `info`, `debug` (read by the library's logger itself, not part of this configuration) | warn |
//! | `TTRACE_DEDUP` | store identical tensor bytes of a (rank, step) once (format 1.3 references): `1`/`0` | 1 |
//! | `TTRACE_PERTURB` | seed of a perturbed reference run: every GEMM output (F32/F16/BF16) gets ±1 ulp noise | off |

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::FormatError;

/// An inclusive set of integers written as `0-3,7`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeSet(pub Vec<(u64, u64)>);

impl RangeSet {
    /// Parses `0-3,7`; empty means nothing.
    pub fn parse(s: &str) -> Result<RangeSet, FormatError> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let bad = || FormatError::Invalid(format!("`{part}` in `{s}` is not N or N-M"));
            let (a, b) = match part.split_once('-') {
                Some((a, b)) => (
                    a.trim().parse().map_err(|_| bad())?,
                    b.trim().parse().map_err(|_| bad())?,
                ),
                None => {
                    let v = part.parse().map_err(|_| bad())?;
                    (v, v)
                }
            };
            if a > b {
                return Err(bad());
            }
            out.push((a, b));
        }
        Ok(RangeSet(out))
    }

    /// The runs of consecutive values in `values`, in their order: `[0, 1, 2, 5]` is `0-2,5`.
    pub fn of_values(values: impl IntoIterator<Item = u64>) -> RangeSet {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for v in values {
            match runs.last_mut() {
                Some((_, b)) if b.checked_add(1) == Some(v) => *b = v,
                _ => runs.push((v, v)),
            }
        }
        RangeSet(runs)
    }

    pub fn contains(&self, v: u64) -> bool {
        self.0.iter().any(|&(a, b)| a <= v && v <= b)
    }

    /// Each range as text, `N` or `N-M`, joined by `sep`.
    pub fn join(&self, sep: &str) -> String {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|&(a, b)| {
                if a == b {
                    a.to_string()
                } else {
                    format!("{a}-{b}")
                }
            })
            .collect();
        parts.join(sep)
    }
}

impl std::str::FromStr for RangeSet {
    type Err = FormatError;

    fn from_str(s: &str) -> Result<RangeSet, FormatError> {
        RangeSet::parse(s)
    }
}

impl std::fmt::Display for RangeSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.join(","))
    }
}

/// Families of ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    Memcpy,
    Gemm,
    Nccl,
}

impl Family {
    pub const ALL: [Family; 3] = [Family::Memcpy, Family::Gemm, Family::Nccl];

    pub fn name(self) -> &'static str {
        match self {
            Family::Memcpy => "memcpy",
            Family::Gemm => "gemm",
            Family::Nccl => "nccl",
        }
    }

    /// Parses a comma-separated list (`memcpy,gemm`), sorted and without repeats (empty:
    /// capture nothing).
    pub fn parse_list(s: &str) -> Result<Vec<Family>, FormatError> {
        let mut fams = s
            .split(',')
            .map(str::trim)
            .filter(|f| !f.is_empty())
            .map(str::parse)
            .collect::<Result<Vec<Family>, _>>()?;
        fams.sort();
        fams.dedup();
        Ok(fams)
    }
}

impl std::str::FromStr for Family {
    type Err = FormatError;

    fn from_str(s: &str) -> Result<Family, FormatError> {
        Family::ALL
            .into_iter()
            .find(|x| x.name() == s.trim())
            .ok_or_else(|| {
                FormatError::Invalid(format!("unknown family `{s}` (memcpy, gemm, nccl)"))
            })
    }
}

/// How steps are numbered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepRule {
    /// No code change: see docs/format.md, "Step numbering".
    Auto,
    /// An NVTX range push or mark with this exact name starts a new step.
    Nvtx(String),
    /// Only `ttrace_step()` (include/ttrace.h) starts a new step.
    Api,
}

impl std::str::FromStr for StepRule {
    type Err = FormatError;

    /// `auto`, `api` or `nvtx:NAME`.
    fn from_str(s: &str) -> Result<StepRule, FormatError> {
        match s.trim() {
            "auto" => Ok(StepRule::Auto),
            "api" => Ok(StepRule::Api),
            t if t.len() > 5 && t.starts_with("nvtx:") => Ok(StepRule::Nvtx(t[5..].to_string())),
            _ => Err(FormatError::Invalid(format!(
                "`{s}`: expected auto, api or nvtx:NAME"
            ))),
        }
    }
}

impl std::fmt::Display for StepRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StepRule::Auto => f.write_str("auto"),
            StepRule::Api => f.write_str("api"),
            StepRule::Nvtx(n) => write!(f, "nvtx:{n}"),
        }
    }
}

/// Everything a traced process needs to know about what to capture.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureConfig {
    pub socket: Option<String>,
    pub families: Vec<Family>,
    pub steps: Option<RangeSet>,
    pub ranks: Option<RangeSet>,
    pub max_tensor_bytes: u64,
    pub inputs: bool,
    pub kernels: bool,
    /// Bytes of each process's snapshot ring; 0: `auto` ([`auto_ring_bytes`]).
    pub ring_bytes: u64,
    pub wait_ms: u64,
    /// The most a process waits on the daemon in all (ring space and its `Hello`); once spent,
    /// an op whose tensors do not fit at once becomes a `RingFull` gap, and capture resumes as
    /// soon as space is free. Absent from manifests written before it existed.
    #[serde(default = "default_max_stall_ms")]
    pub max_stall_ms: u64,
    pub step_rule: StepRule,
    /// A perturbed reference run (`TTRACE_PERTURB`): the seed of the round-off-sized noise
    /// added to every GEMM output (the last mantissa bit of each F32/F16/BF16 element flipped
    /// with probability 1/2). `None`: the program's numbers are left alone. Absent from
    /// manifests written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub perturb: Option<u64>,
    /// Identical tensor bytes of a (rank, step) are stored once, later ones as references
    /// (format 1.3, `TTRACE_DEDUP`; the collector does it). Absent from manifests written
    /// before it existed (read as on).
    #[serde(default = "default_dedup")]
    pub dedup: bool,
}

fn default_dedup() -> bool {
    true
}

impl Default for CaptureConfig {
    fn default() -> Self {
        CaptureConfig {
            socket: None,
            families: Family::ALL.to_vec(),
            steps: None,
            ranks: None,
            max_tensor_bytes: 64 << 30,
            inputs: true,
            kernels: true,
            ring_bytes: 0,
            wait_ms: 10_000,
            max_stall_ms: default_max_stall_ms(),
            step_rule: StepRule::Auto,
            perturb: None,
            dedup: true,
        }
    }
}

fn default_max_stall_ms() -> u64 {
    30_000
}

fn flag(name: &str, v: &str) -> Result<bool, FormatError> {
    match v.trim() {
        "1" | "true" | "on" | "yes" => Ok(true),
        "0" | "false" | "off" | "no" => Ok(false),
        _ => Err(FormatError::Invalid(format!("{name}={v}: expected 1 or 0"))),
    }
}

/// The smallest ring `auto` gives a process (the default of earlier versions).
pub const AUTO_RING_MIN: u64 = 256 << 20;
/// The largest ring `auto` gives a process.
pub const AUTO_RING_MAX: u64 = 1 << 30;

/// The snapshot ring of a process under `TTRACE_RING_BYTES=auto`: 1/64 of the memory it may
/// use (`memory`: the host's, or its cgroup's limit when lower) shared by the traced processes
/// on the node (`local_procs`), within [`AUTO_RING_MIN`]..=[`AUTO_RING_MAX`].
///
/// Why larger than the minimum where memory allows: a record's slot stays taken until its
/// tensors are stored, so the ring bounds how much capture work is in flight. On an H200 a
/// 1 GiB ring captured a 1.1 GB-a-step bf16 model 1.5x faster than 256 MiB (scripts/gpu-bench.sh).
/// The ring is pinned host memory, hence a small share of it, divided among the node's ranks.
pub fn auto_ring_bytes(memory: u64, local_procs: u64) -> u64 {
    (memory / 64 / local_procs.max(1)).clamp(AUTO_RING_MIN, AUTO_RING_MAX)
}

fn number(name: &str, v: &str) -> Result<u64, FormatError> {
    v.trim()
        .parse()
        .map_err(|_| FormatError::Invalid(format!("{name}={v}: expected a number")))
}

impl CaptureConfig {
    /// Reads the configuration from `vars` (e.g. `std::env::vars()`); unknown `TTRACE_*`
    /// variables are ignored, malformed known ones are errors naming the variable.
    pub fn from_vars<I: IntoIterator<Item = (String, String)>>(
        vars: I,
    ) -> Result<CaptureConfig, FormatError> {
        let mut c = CaptureConfig::default();
        for (k, v) in vars {
            match k.as_str() {
                "TTRACE_SOCKET" => c.socket = Some(v).filter(|s| !s.is_empty()),
                "TTRACE_APIS" => {
                    c.families = Family::parse_list(&v)
                        .map_err(|e| FormatError::Invalid(format!("{k}: {e}")))?
                }
                "TTRACE_STEPS" => {
                    c.steps = Some(
                        RangeSet::parse(&v)
                            .map_err(|e| FormatError::Invalid(format!("{k}: {e}")))?,
                    )
                }
                "TTRACE_RANKS" => {
                    c.ranks = Some(
                        RangeSet::parse(&v)
                            .map_err(|e| FormatError::Invalid(format!("{k}: {e}")))?,
                    )
                }
                "TTRACE_MAX_TENSOR_BYTES" => c.max_tensor_bytes = number(&k, &v)?,
                "TTRACE_INPUTS" => c.inputs = flag(&k, &v)?,
                "TTRACE_KERNELS" => c.kernels = flag(&k, &v)?,
                "TTRACE_DEDUP" => c.dedup = flag(&k, &v)?,
                "TTRACE_RING_BYTES" if v.trim() == "auto" => c.ring_bytes = 0,
                "TTRACE_RING_BYTES" => c.ring_bytes = number(&k, &v)?,
                "TTRACE_WAIT_MS" => c.wait_ms = number(&k, &v)?,
                "TTRACE_MAX_STALL_MS" => c.max_stall_ms = number(&k, &v)?,
                "TTRACE_STEP_RULE" => {
                    c.step_rule = v
                        .parse()
                        .map_err(|e| FormatError::Invalid(format!("{k}={v}: {e}")))?
                }
                "TTRACE_PERTURB" => {
                    c.perturb = Some(v.trim().parse().map_err(|_| {
                        FormatError::Invalid(format!(
                            "TTRACE_PERTURB={v}: expected a seed (an unsigned 64-bit number)"
                        ))
                    })?)
                }
                _ => {}
            }
        }
        Ok(c)
    }

    /// The environment that reproduces this configuration (what `ttrace run` exports).
    pub fn to_vars(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        if let Some(s) = &self.socket {
            m.insert("TTRACE_SOCKET".into(), s.clone());
        }
        let fams: Vec<&str> = self.families.iter().map(|f| f.name()).collect();
        m.insert("TTRACE_APIS".into(), fams.join(","));
        if let Some(s) = &self.steps {
            m.insert("TTRACE_STEPS".into(), s.to_string());
        }
        if let Some(r) = &self.ranks {
            m.insert("TTRACE_RANKS".into(), r.to_string());
        }
        m.insert(
            "TTRACE_MAX_TENSOR_BYTES".into(),
            self.max_tensor_bytes.to_string(),
        );
        m.insert("TTRACE_INPUTS".into(), (self.inputs as u8).to_string());
        m.insert("TTRACE_KERNELS".into(), (self.kernels as u8).to_string());
        m.insert("TTRACE_DEDUP".into(), (self.dedup as u8).to_string());
        m.insert("TTRACE_RING_BYTES".into(), self.ring_bytes.to_string());
        m.insert("TTRACE_WAIT_MS".into(), self.wait_ms.to_string());
        m.insert("TTRACE_MAX_STALL_MS".into(), self.max_stall_ms.to_string());
        m.insert("TTRACE_STEP_RULE".into(), self.step_rule.to_string());
        if let Some(seed) = self.perturb {
            m.insert("TTRACE_PERTURB".into(), seed.to_string());
        }
        m
    }

    /// Whether `family` is captured.
    pub fn captures(&self, family: Family) -> bool {
        self.families.contains(&family)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configuration_round_trips_through_the_environment() {
        let c = CaptureConfig {
            socket: Some("/tmp/x.sock".into()),
            families: vec![Family::Gemm, Family::Nccl],
            steps: Some(RangeSet(vec![(0, 3), (7, 7)])),
            ranks: Some(RangeSet(vec![(1, 1)])),
            max_tensor_bytes: 1024,
            inputs: false,
            kernels: false,
            ring_bytes: 1 << 20,
            wait_ms: 5,
            max_stall_ms: 7,
            step_rule: StepRule::Nvtx("train_step".into()),
            perturb: Some(u64::MAX),
            dedup: false,
        };
        assert_eq!(CaptureConfig::from_vars(c.to_vars()).expect("parses"), c);
        let plain = CaptureConfig::default();
        assert!(!plain.to_vars().contains_key("TTRACE_PERTURB"));
        assert_eq!(
            CaptureConfig::from_vars(plain.to_vars()).expect("parses"),
            plain
        );
    }

    #[test]
    fn manifests_without_perturb_still_read() {
        let mut v = serde_json::to_value(CaptureConfig::default()).expect("serialises");
        assert!(v.get("perturb").is_none(), "not written when off: {v}");
        v.as_object_mut().expect("object").remove("perturb");
        let c: CaptureConfig = serde_json::from_value(v).expect("reads");
        assert_eq!(c.perturb, None);
        let on = CaptureConfig {
            perturb: Some(7),
            ..CaptureConfig::default()
        };
        let back: CaptureConfig =
            serde_json::from_value(serde_json::to_value(&on).expect("serialises")).expect("reads");
        assert_eq!(back.perturb, Some(7));
    }

    #[test]
    fn malformed_values_name_the_variable() {
        for (k, v) in [
            ("TTRACE_STEPS", "3-1"),
            ("TTRACE_STEPS", "x"),
            ("TTRACE_APIS", "gemm,cudnn"),
            ("TTRACE_INPUTS", "maybe"),
            ("TTRACE_RING_BYTES", "-1"),
            ("TTRACE_STEP_RULE", "nvtx:"),
            ("TTRACE_PERTURB", "-1"),
            ("TTRACE_PERTURB", "yes"),
            ("TTRACE_PERTURB", ""),
        ] {
            let e = CaptureConfig::from_vars([(k.to_string(), v.to_string())]).expect_err(v);
            assert!(e.to_string().contains(k), "{e}");
        }
    }

    /// `auto` sizes the ring from the memory a process may use, shared by the node's
    /// processes, never below the old default nor above 1 GiB.
    #[test]
    fn the_auto_ring_grows_with_memory_and_shrinks_with_processes_per_node() {
        const G: u64 = 1 << 30;
        assert_eq!(auto_ring_bytes(24 * G, 1), 384 << 20);
        assert_eq!(auto_ring_bytes(24 * G, 4), AUTO_RING_MIN);
        assert_eq!(auto_ring_bytes(2048 * G, 8), AUTO_RING_MAX);
        assert_eq!(auto_ring_bytes(128 * G, 8), 256 << 20);
        assert_eq!(auto_ring_bytes(0, 0), AUTO_RING_MIN);
        let auto = |v: &str| {
            CaptureConfig::from_vars([("TTRACE_RING_BYTES".to_string(), v.to_string())])
                .expect("reads")
                .ring_bytes
        };
        assert_eq!((auto("auto"), auto("0"), auto("4096")), (0, 0, 4096));
        assert_eq!(CaptureConfig::default().ring_bytes, 0, "auto by default");
    }

    #[test]
    fn range_sets() {
        let r = RangeSet::parse("0-3, 7").expect("parses");
        assert!(r.contains(0) && r.contains(3) && r.contains(7));
        assert!(!r.contains(4) && !r.contains(8));
        assert_eq!(r.to_string(), "0-3,7");
    }

    #[test]
    fn consecutive_values_make_one_range_each_run() {
        let r = RangeSet::of_values([0, 1, 2, 5, 7, 8]);
        assert_eq!(r, RangeSet(vec![(0, 2), (5, 5), (7, 8)]));
        assert_eq!(r.join(", "), "0-2, 5, 7-8");
        assert_eq!(RangeSet::of_values([]), RangeSet(vec![]));
        assert_eq!(
            RangeSet::of_values([u64::MAX, 0]).to_string(),
            format!("{},0", u64::MAX)
        );
    }
}
