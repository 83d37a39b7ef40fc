//! Comparing beyond one machine: `ttrace compare --partition I/N` compares a deterministic
//! share of the steps and writes a partial report; `ttrace report merge` joins the partial
//! reports into the report one whole run gives.
//!
//! The unit of work is a step. Each step is judged on its own in every comparison (what
//! decides how a tensor is judged is learnt anew at each step; only placement hints, which
//! say where to look first, carry over: see `hints::Memory`), so a step's verdict is the
//! same whether a partition compares it alone or a whole run compares it after the others. What spans steps is decided at the merge, which reads the stores'
//! metadata again: the order of the comparisons, the first divergence and its localization
//! (the last good tensor may lie in another partition), and replica drift (a weight's copies
//! in one step against the first step they were identical in).
//!
//! The split depends only on the stores: the steps are cut into N contiguous runs of about
//! equal bytes ([`assign`]); a step is never split (its placements need every rank: shards
//! must tile the reference, partial sums need their group), so with more partitions than
//! steps, or one step far larger than the others, some partitions get no step.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use ttrace_format::config::RangeSet;

use crate::engine::{CompareOptions, DpScale, Position};
use crate::report::{CompareReport, LayoutSummary, RunSummary};
use crate::spill::{Slot, SpillFile};
use crate::CompareError;

/// Version of the partial report's `partition` object; a merge reads only its own.
pub const SCHEMA: u32 = 2;

/// The ttrace version that writes partial reports; a merge joins only its own version's.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Exit status of a partition whose share matched (never 0: a share is not the run).
pub const EXIT_PARTIAL_MATCH: i32 = 3;

/// Exit status of a partition whose share diverged.
pub const EXIT_PARTIAL_DIVERGENCE: i32 = 4;

/// Partition `index` of `count` (1-based, as on the command line).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partition {
    /// Which partition, 1 to `count`.
    pub index: u32,
    /// How many partitions share the work.
    pub count: u32,
}

impl Partition {
    /// Parses `I/N` with 1 <= I <= N.
    pub fn parse(s: &str) -> Result<Partition, String> {
        let bad = || format!("`{s}`: expected I/N with 1 <= I <= N, e.g. 2/8");
        let (i, n) = s.trim().split_once('/').ok_or_else(bad)?;
        let index: u32 = i.trim().parse().map_err(|_| bad())?;
        let count: u32 = n.trim().parse().map_err(|_| bad())?;
        if index == 0 || index > count {
            return Err(bad());
        }
        Ok(Partition { index, count })
    }
}

impl std::fmt::Display for Partition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// The partition (1 to `count`) that owns each unit, given the units' weights in run order:
/// unit i goes to the partition its weight's midpoint falls in when the total weight is cut
/// into `count` equal parts. Owners never decrease along the units (each partition owns a
/// contiguous run of steps), every unit has exactly one owner, and the result depends only
/// on the weights.
pub fn assign(units: &[(u64, u64)], count: u32) -> Vec<u32> {
    let count = u128::from(count.max(1));
    // A unit without bytes still counts, so that it has a place of its own.
    let weight = |w: u64| u128::from(w.max(1));
    let total: u128 = units.iter().map(|&(_, w)| weight(w)).sum();
    let mut before = 0u128;
    units
        .iter()
        .map(|&(_, w)| {
            let mid2 = 2 * before + weight(w);
            before += weight(w);
            let part = (mid2 * count / (2 * total.max(1))).min(count - 1);
            part as u32 + 1
        })
        .collect()
}

/// What a partial report keeps of a comparison besides the comparison itself: what the merge
/// needs to order it among the other partitions' and to localize it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingEntry {
    /// Execution-order key: (step, reference seq, sub-order within the op).
    pub key: Position,
    /// The run ops (rank, seq) behind its shards.
    pub shards: Vec<(u32, u64)>,
    /// The reference op (step, seq).
    pub ref_op: (u64, u64),
    /// A reduction's output, compared through the GEMM output it reduces.
    pub is_collective: bool,
    /// The op was called with other scalars than the reference's.
    pub param_note: Option<String>,
}

/// The [`PendingEntry`] of each comparison of a partial report, in the order of its tensors:
/// those of comparisons held in memory, and those of comparisons spilled past their share of
/// `--memory`, left in the spill files the comparison wrote them to and read back one at a
/// time as the report is written ([`crate::results`]), so that a partition's report holds no
/// more of them than it holds comparisons. Written as a JSON array either way; read as one.
#[derive(Clone, Default)]
pub struct PendingList {
    files: Vec<SpillFile>,
    items: Vec<EntryAt>,
}

/// Where one entry of a [`PendingList`] is.
#[derive(Clone)]
pub(crate) enum EntryAt {
    /// In memory.
    Held(PendingEntry),
    /// In spill file `.0` of the list, with its comparison.
    Spilled(usize, Slot),
}

/// An entry as the spill files hold it (its comparison skipped).
#[derive(Deserialize)]
struct SpilledEntry {
    entry: PendingEntry,
}

impl PendingList {
    /// A list of `items`, in order, the spilled ones in `files`.
    pub(crate) fn from_parts(files: Vec<SpillFile>, items: Vec<EntryAt>) -> PendingList {
        PendingList { files, items }
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// How many lie in the spill files (not held in memory).
    pub fn spilled(&self) -> usize {
        self.items
            .iter()
            .filter(|e| matches!(e, EntryAt::Spilled(..)))
            .count()
    }

    /// Every entry in order, those spilled read back.
    pub fn iter(
        &self,
    ) -> impl Iterator<Item = std::io::Result<std::borrow::Cow<'_, PendingEntry>>> + '_ {
        self.items.iter().map(|at| match at {
            EntryAt::Held(e) => Ok(std::borrow::Cow::Borrowed(e)),
            &EntryAt::Spilled(f, slot) => {
                spilled(&self.files, f, slot).map(std::borrow::Cow::Owned)
            }
        })
    }
}

/// The entry at `slot` of spill file `f` of `files`.
fn spilled(files: &[SpillFile], f: usize, slot: Slot) -> std::io::Result<PendingEntry> {
    let file = files.get(f).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("no spill file {f} for a partial report's entry"),
        )
    })?;
    file.read::<SpilledEntry>(slot).map(|s| s.entry)
}

impl From<Vec<PendingEntry>> for PendingList {
    fn from(v: Vec<PendingEntry>) -> PendingList {
        PendingList {
            files: Vec::new(),
            items: v.into_iter().map(EntryAt::Held).collect(),
        }
    }
}

impl IntoIterator for PendingList {
    type Item = std::io::Result<PendingEntry>;
    type IntoIter = Box<dyn Iterator<Item = std::io::Result<PendingEntry>>>;

    /// Every entry in order, those spilled read back.
    fn into_iter(self) -> Self::IntoIter {
        let files = self.files;
        Box::new(self.items.into_iter().map(move |at| match at {
            EntryAt::Held(e) => Ok(e),
            EntryAt::Spilled(f, slot) => spilled(&files, f, slot),
        }))
    }
}

impl Serialize for PendingList {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        crate::spill::serialize_read_back(s, self.len(), self.iter())
    }
}

impl<'de> Deserialize<'de> for PendingList {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<PendingList, D::Error> {
        Vec::<PendingEntry>::deserialize(d).map(PendingList::from)
    }
}

impl PartialEq for PendingList {
    /// Equal entries in the same order (a list that cannot be read back equals none).
    fn eq(&self, other: &PendingList) -> bool {
        crate::spill::equal_read_back((self.len(), self.iter()), (other.len(), other.iter()))
    }
}

impl std::fmt::Debug for PendingList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PendingList {{ {} entries, {} spilled }}",
            self.items.len(),
            self.spilled()
        )
    }
}

/// The options of a partitioned comparison (every partition must use the same).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartialOptions {
    /// The reference store, as an absolute path (the merge may run elsewhere).
    pub reference: String,
    /// The run's store, absolute.
    pub run: String,
    /// The perturbed reference, absolute.
    pub perturbed: Option<String>,
    /// `--steps`, as inclusive ranges.
    pub steps: Option<Vec<(u64, u64)>>,
    /// `--layout`.
    pub layout: Option<LayoutSummary>,
    /// `--dp-reduction-scale`.
    pub dp_reduction_scale: Option<DpScale>,
    /// `--memory` (may differ between partitions: it changes no result).
    pub memory: Option<u64>,
}

/// An absolute path for `p` (as given when it cannot be resolved).
fn absolute(p: &Path) -> String {
    std::fs::canonicalize(p)
        .unwrap_or_else(|_| p.to_path_buf())
        .display()
        .to_string()
}

impl PartialOptions {
    /// The options of a comparison of `reference` and `run`.
    pub fn of(reference: &Path, run: &Path, opts: &CompareOptions) -> PartialOptions {
        PartialOptions {
            reference: absolute(reference),
            run: absolute(run),
            perturbed: opts.perturbed.as_deref().map(absolute),
            steps: opts.steps.clone(),
            layout: opts.layout.clone(),
            dp_reduction_scale: opts.dp_reduction_scale,
            memory: opts.memory,
        }
    }

    /// Back to the comparison's options.
    fn compare_options(&self) -> CompareOptions {
        CompareOptions {
            steps: self.steps.clone(),
            layout: self.layout.clone(),
            perturbed: self.perturbed.as_ref().map(Into::into),
            dp_reduction_scale: self.dp_reduction_scale,
            memory: self.memory,
        }
    }

    /// The first option (other than `--memory`) that differs from `other`'s, by name.
    fn differs_from(&self, other: &PartialOptions) -> Option<&'static str> {
        if self.reference != other.reference {
            Some("the reference store's path")
        } else if self.run != other.run {
            Some("the run's store path")
        } else if self.perturbed != other.perturbed {
            Some("--perturbed")
        } else if self.steps != other.steps {
            Some("--steps")
        } else if self.layout != other.layout {
            Some("--layout")
        } else if self.dp_reduction_scale != other.dp_reduction_scale {
            Some("--dp-reduction-scale")
        } else {
            None
        }
    }
}

/// One step of the split: which partition owns it and how much work it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unit {
    /// The step.
    pub step: u64,
    /// Its weight: the bytes its records' tensors hold in the reference and the run.
    pub bytes: u64,
    /// The partition (1-based) that compares it.
    pub partition: u32,
}

/// What a partition's report holds besides the usual report (JSON key `partition`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Partial {
    /// [`SCHEMA`] of the writer.
    pub schema: u32,
    /// [`VERSION`] of the writer.
    pub version: String,
    /// This partition.
    pub index: u32,
    /// Of how many.
    pub count: u32,
    /// The whole split: every step of the comparison in run order, with its owner.
    pub units: Vec<Unit>,
    /// The steps this partition compared (those of `units` it owns).
    pub covered: Vec<u64>,
    /// The options every partition must share.
    pub options: PartialOptions,
    /// Per entry of the report's `tensors`, in the same order: what the merge needs.
    pub pending: PendingList,
    /// The warnings of the tensors this partition compared (the report's `warnings` adds
    /// those of the whole comparison, which every partition repeats).
    pub walk_warnings: Vec<String>,
    /// Records read when the partition opened the stores that could not be read again
    /// (their segment changed since), by store (`reference`, `run`, `perturbed`), line and
    /// how many records the line is for: the merge, which does not read them, says and
    /// counts them as the whole run would.
    #[serde(default)]
    pub late_unreadable: Vec<(String, String, u64)>,
}

impl Partial {
    /// The partial of partition `part`, which compared `covered` out of `units`.
    pub fn new(
        part: Partition,
        units: Vec<Unit>,
        covered: Vec<u64>,
        options: PartialOptions,
        pending: PendingList,
        (walk_warnings, late_unreadable): (Vec<String>, Vec<(String, String, u64)>),
    ) -> Partial {
        Partial {
            schema: SCHEMA,
            version: VERSION.to_string(),
            index: part.index,
            count: part.count,
            units,
            covered,
            options,
            pending,
            walk_warnings,
            late_unreadable,
        }
    }
}

/// A partition's report: the report of its share of the steps plus what a merge needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartialReport {
    /// The comparison of this share, in the whole-run schema.
    #[serde(flatten)]
    pub report: CompareReport,
    /// The partition and what a merge needs.
    pub partition: Partial,
}

impl PartialReport {
    /// [`EXIT_PARTIAL_MATCH`] or [`EXIT_PARTIAL_DIVERGENCE`]: a share never exits 0, which
    /// would read as a clean run.
    pub fn exit_code(&self) -> i32 {
        match self.report.verdict {
            crate::report::Verdict::Match => EXIT_PARTIAL_MATCH,
            crate::report::Verdict::Divergence => EXIT_PARTIAL_DIVERGENCE,
        }
    }

    /// `partition 2/4: steps 3-5 of 0-9` (or `no step`).
    pub fn label(&self) -> String {
        let p = &self.partition;
        let all: Vec<u64> = p.units.iter().map(|u| u.step).collect();
        format!(
            "partition {}/{}: {} of {}",
            p.index,
            p.count,
            steps_label(&p.covered),
            steps_label(&all)
        )
    }
}

/// `steps 0-2, 5` / `step 3` / `no step`.
pub fn steps_label(steps: &[u64]) -> String {
    let text = RangeSet::of_values(steps.iter().copied()).join(", ");
    match steps.len() {
        0 => "no step".to_string(),
        1 => format!("step {text}"),
        _ => format!("steps {text}"),
    }
}

/// Why partial reports cannot be merged (each names the file and the problem).
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    /// A partial report is unreadable or does not fit the others.
    #[error("{file}: {problem}")]
    File {
        /// The partial report.
        file: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The partitions together do not cover every step.
    #[error("{0}")]
    Missing(String),
    /// The stores could not be read again.
    #[error(transparent)]
    Compare(#[from] CompareError),
}

fn problem(file: &str, problem: impl Into<String>) -> MergeError {
    MergeError::File {
        file: file.to_string(),
        problem: problem.into(),
    }
}

/// Reads a partial report, refusing a whole-run report and another version's partial.
pub fn read(path: &Path) -> Result<PartialReport, MergeError> {
    let file = path.display().to_string();
    // Parsed whole once; only a file that does not parse is looked at again, for what says
    // whose report it is: a whole-run report or another version's is refused as such, not
    // as a parse error.
    let parsed = parse(path);
    let (schema, version) = match &parsed {
        Ok(p) => (
            Some(u64::from(p.partition.schema)),
            p.partition.version.clone(),
        ),
        Err(parse_error) => {
            let (schema, version) = whose(path, &file)?;
            if (schema, version.as_deref()) == (Some(u64::from(SCHEMA)), Some(VERSION)) {
                // This version's partial, damaged: the parse error says where.
                return Err(problem(&file, parse_error.to_string()));
            }
            (schema, version.unwrap_or_else(|| "?".into()))
        }
    };
    if schema != Some(u64::from(SCHEMA)) || version != VERSION {
        return Err(problem(
            &file,
            format!(
                "written by ttrace {version} (partial schema {}); this is ttrace {VERSION} \
                 (schema {SCHEMA}): run every partition and the merge with one version",
                schema.map_or("?".to_string(), |s| s.to_string())
            ),
        ));
    }
    parsed
}

/// The partial schema and the ttrace version a report file says it was written with
/// (reading nothing else of it); a whole-run report (no `partition`) or a file that is not
/// JSON is refused.
fn whose(path: &Path, file: &str) -> Result<(Option<u64>, Option<String>), MergeError> {
    #[derive(Deserialize)]
    struct Probe {
        partition: Option<ProbePartition>,
    }
    #[derive(Deserialize)]
    struct ProbePartition {
        schema: Option<u64>,
        version: Option<String>,
    }
    let reader = std::fs::File::open(path)
        .map(std::io::BufReader::new)
        .map_err(|e| problem(file, e.to_string()))?;
    let probe: Probe = serde_json::from_reader(reader)
        .map_err(|e| problem(file, format!("not a JSON report ({e})")))?;
    let Some(part) = probe.partition else {
        return Err(problem(
            file,
            "a whole-run report, not a partition's (written without --partition I/N)",
        ));
    };
    Ok((part.schema, part.version))
}

/// A partial report's file parsed (whatever version wrote it: [`read`] checks that).
fn parse(path: &Path) -> Result<PartialReport, MergeError> {
    let file = path.display().to_string();
    let reader = std::fs::File::open(path)
        .map(std::io::BufReader::new)
        .map_err(|e| problem(&file, e.to_string()))?;
    serde_json::from_reader(reader)
        .map_err(|e| problem(&file, format!("not a partial compare report ({e})")))
}

/// A partial report opened for merging ([`open`]): all it says of its comparison but its
/// comparisons (the report's `tensors` and the partial's `pending` are left empty), which
/// the merge reads again from the file when it comes to this partition: a merge holds one
/// partition's comparisons at a time, not every partition's.
pub struct PartialFile {
    /// The file, as named.
    pub file: String,
    path: std::path::PathBuf,
    /// The report, without its comparisons.
    pub head: PartialReport,
    /// Its comparisons and pending entries (one per comparison in an intact report).
    counts: (usize, usize),
}

/// Opens a partial report for merging ([`read`], its comparisons then dropped).
pub fn open(path: &Path) -> Result<PartialFile, MergeError> {
    let mut head = read(path)?;
    let counts = (head.report.tensors.len(), head.partition.pending.len());
    head.report.tensors = crate::report::TensorList::default();
    head.partition.pending = PendingList::default();
    Ok(PartialFile {
        file: path.display().to_string(),
        path: path.to_path_buf(),
        head,
        counts,
    })
}

impl PartialFile {
    /// The whole partial report, read again: refused when the file changed since it was
    /// opened (another partition, version, comparison or split, or another number of
    /// comparisons; a rewrite with the same results of the same comparison is the same).
    fn read_whole(&self) -> Result<PartialReport, MergeError> {
        let whole = parse(&self.path)?;
        let (w, h) = (&whole.partition, &self.head.partition);
        let counts = (whole.report.tensors.len(), w.pending.len());
        let same = counts == self.counts
            && (w.schema, &w.version, w.index, &w.covered)
                == (h.schema, &h.version, h.index, &h.covered)
            && same_comparison(&self.file, &whole, &self.file, &self.head).is_ok();
        if !same {
            return Err(problem(
                &self.file,
                "changed while the partial reports were merged",
            ));
        }
        Ok(whole)
    }
}

/// Checks that `parts` (opened by [`open`]) are the partitions of one comparison covering
/// every step once, then joins them into the whole run's report, reading each partition's
/// comparisons in turn.
pub fn merge(mut parts: Vec<PartialFile>) -> Result<CompareReport, MergeError> {
    let Some(first) = parts.first() else {
        return Err(MergeError::Missing("no partial report to merge".into()));
    };
    for p in &parts[1..] {
        same_comparison(&p.file, &p.head, &first.file, &first.head)?;
    }
    // What the merge needs of the first.
    let first = &first.head;
    let head = Head {
        count: first.partition.count,
        units: first.partition.units.clone(),
        options: first.partition.options.clone(),
        summaries: (
            first.report.reference.clone(),
            first.report.run.clone(),
            first.report.perturbed.clone(),
        ),
    };
    each_step_once(&parts, &head)?;
    parts.sort_by_key(|p| p.head.partition.index);
    let opts = head.options.compare_options();
    let (summaries, all_steps) = (
        head.summaries,
        head.units.iter().map(|u| u.step).collect::<Vec<u64>>(),
    );
    let reference = Path::new(&head.options.reference).to_path_buf();
    let run = Path::new(&head.options.run).to_path_buf();
    // Each partition's comparisons read when the merge comes to it, and dropped after.
    let whole = parts.iter().map(|p| {
        p.read_whole()
            .map_err(|e| CompareError::Invalid(e.to_string()))
    });
    let mut report = crate::engine::merged(&reference, &run, &opts, whole)?;
    if report.steps != all_steps || report.run.run_id != summaries.1.run_id {
        return Err(MergeError::Missing(format!(
            "the stores changed since the partitions ran: {} now holds {} where the \
             partitions split {}",
            head.options.run,
            steps_label(&report.steps),
            steps_label(&all_steps)
        )));
    }
    // The paths as the partitions were given them (the merge opened them absolute).
    (report.reference, report.run, report.perturbed) = summaries;
    Ok(report)
}

/// Every step of the split is covered once: by its owner, and by the steps each file says
/// it compared; no partition is given twice and none is missing.
fn each_step_once(parts: &[PartialFile], head: &Head) -> Result<(), MergeError> {
    // Each step once: by its owner, and by the steps each file says it compared.
    let mut by_step: BTreeMap<u64, &str> = BTreeMap::new();
    let mut by_index: BTreeMap<u32, &str> = BTreeMap::new();
    for p in parts {
        let (file, q) = (&p.file, &p.head.partition);
        if let Some(other) = by_index.insert(q.index, file) {
            return Err(problem(
                file,
                format!("partition {}/{} is also in {other}", q.index, q.count),
            ));
        }
        let owned: Vec<u64> = q
            .units
            .iter()
            .filter(|u| u.partition == q.index)
            .map(|u| u.step)
            .collect();
        if owned != q.covered || p.counts.0 != p.counts.1 {
            return Err(problem(
                file,
                format!(
                    "partition {}/{} compared {} where the split gives it {}",
                    q.index,
                    q.count,
                    steps_label(&q.covered),
                    steps_label(&owned)
                ),
            ));
        }
        for &s in &q.covered {
            if let Some(other) = by_step.insert(s, file) {
                return Err(problem(
                    file,
                    format!("step {s} is also covered by {other}"),
                ));
            }
        }
    }
    let missing: Vec<&Unit> = head
        .units
        .iter()
        .filter(|u| !by_step.contains_key(&u.step))
        .collect();
    if !missing.is_empty() {
        let steps: Vec<u64> = missing.iter().map(|u| u.step).collect();
        let mut owners: Vec<String> = missing
            .iter()
            .map(|u| format!("{}/{}", u.partition, head.count))
            .collect();
        owners.dedup();
        return Err(MergeError::Missing(format!(
            "{} not covered: partition{} {} missing",
            steps_label(&steps),
            if owners.len() == 1 { "" } else { "s" },
            owners.join(", ")
        )));
    }
    Ok(())
}

/// What a merge keeps of the first partial report.
struct Head {
    count: u32,
    units: Vec<Unit>,
    options: PartialOptions,
    /// Reference, run and perturbed reference, with their paths as the partitions got them.
    summaries: (RunSummary, RunSummary, Option<RunSummary>),
}

/// Refuses a partial of another comparison than `first`'s.
fn same_comparison(
    file: &str,
    p: &PartialReport,
    first_file: &str,
    first: &PartialReport,
) -> Result<(), MergeError> {
    let ids = |r: &PartialReport| {
        (
            r.report.reference.run_id.clone(),
            r.report.run.run_id.clone(),
            r.report.perturbed.as_ref().map(|s| s.run_id.clone()),
        )
    };
    if ids(p) != ids(first) {
        return Err(problem(
            file,
            format!(
                "compares run {} against reference {}, {first_file} run {} against \
                 reference {}: partials of different runs",
                p.report.run.run_id,
                p.report.reference.run_id,
                first.report.run.run_id,
                first.report.reference.run_id
            ),
        ));
    }
    let (q, h) = (&p.partition, &first.partition);
    if q.count != h.count {
        return Err(problem(
            file,
            format!(
                "partition {}/{}, but {first_file} is one of {} partitions",
                q.index, q.count, h.count
            ),
        ));
    }
    if let Some(what) = q.options.differs_from(&h.options) {
        return Err(problem(
            file,
            format!("compared with another {what} than {first_file}"),
        ));
    }
    if q.units != h.units {
        return Err(problem(
            file,
            format!(
                "split other steps than {first_file} (the stores changed between the \
                 partitions)"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_parse_one_based() {
        assert_eq!(
            Partition::parse("2/4").expect("valid"),
            Partition { index: 2, count: 4 }
        );
        assert_eq!(Partition::parse(" 1/1 ").expect("valid").to_string(), "1/1");
        for bad in ["0/4", "5/4", "2", "a/b", "1/0"] {
            assert!(Partition::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_unit_has_one_owner_in_contiguous_runs() {
        for n in 1..=9u32 {
            for units in [
                vec![(0, 10), (1, 10), (2, 10), (3, 10)],
                vec![(0, 100), (1, 1), (2, 1), (3, 1), (4, 1)],
                vec![(5, 0)],
                (0..37).map(|s| (s, 1 + s * 7 % 11)).collect::<Vec<_>>(),
            ] {
                let owners = assign(&units, n);
                assert_eq!(owners.len(), units.len());
                assert!(owners.iter().all(|&o| (1..=n).contains(&o)), "{owners:?}");
                assert!(owners.windows(2).all(|w| w[0] <= w[1]), "{owners:?}");
                // Deterministic: the same weights give the same split.
                assert_eq!(owners, assign(&units, n));
            }
        }
    }

    #[test]
    fn equal_steps_are_shared_equally_and_heavy_steps_get_partitions_of_their_own() {
        let equal: Vec<(u64, u64)> = (0..8).map(|s| (s, 5)).collect();
        assert_eq!(assign(&equal, 4), vec![1, 1, 2, 2, 3, 3, 4, 4]);
        assert_eq!(assign(&equal, 1), vec![1; 8]);
        // One step as heavy as the others together: it is a partition's whole share.
        let heavy = [(0, 40), (1, 10), (2, 10), (3, 10), (4, 10)];
        assert_eq!(assign(&heavy, 2), vec![1, 2, 2, 2, 2]);
        // More partitions than steps: each step its own, some partitions empty.
        assert_eq!(assign(&[(0, 1), (1, 1)], 4), vec![2, 4]);
    }

    #[test]
    fn step_labels_name_runs() {
        assert_eq!(steps_label(&[]), "no step");
        assert_eq!(steps_label(&[3]), "step 3");
        assert_eq!(steps_label(&[0, 1, 2, 5]), "steps 0-2, 5");
    }
}
