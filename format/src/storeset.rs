//! Several stores, one run: the stores the nodes of one job wrote (each node's `ttrace run`
//! files its own ranks) read together as one [`Store`].
//!
//! A directory that is not a store itself (no `manifest.json`, no `rankNNNNN/`) but holds
//! stores is opened as their union by [`Store::open`]; [`open_set`] takes a list. The stores
//! must be of one job ([`job_of`]: the launcher's job their manifests' environments name),
//! hold disjoint ranks, and together hold every rank of the world
//! that the capture was asked for (`--ranks`); otherwise opening fails with one message
//! naming the stores and the ranks.
//!
//! The union's manifest is the first store's (by path) for what every node shares (command,
//! configuration, job, run id) with the ranks, communicator members, losses of all of them;
//! `finalized` only when every store is; the exit code the first non-zero one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::reader::{Issue, SegmentInfo, Store};
use crate::store::Manifest;
use crate::FormatError;

/// Whether `dir` looks like a store: a manifest or a rank directory in it.
fn is_store(dir: &Path) -> bool {
    if crate::store::manifest_path(dir).is_file() {
        return true;
    }
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("rank"))
                .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
        })
    })
}

/// The stores directly inside `dir` (sorted by path), when `dir` is not a store itself.
pub fn members(dir: &Path) -> Vec<PathBuf> {
    if is_store(dir) {
        return Vec::new();
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .filter(|p| is_store(p))
        .collect();
    out.sort();
    out
}

/// Opens the stores `roots` (of one job, disjoint ranks) as one store rooted at `root`.
pub fn open_set(root: &Path, roots: &[PathBuf]) -> Result<Store, FormatError> {
    let mut stores = Vec::with_capacity(roots.len());
    for r in roots {
        stores.push(Store::open(r)?);
    }
    let Some(first) = stores.first() else {
        return Err(FormatError::Invalid(format!(
            "{}: not a ttrace store, and holds none",
            root.display()
        )));
    };
    let first_root = first.root().to_path_buf();
    let mut manifest: Option<Manifest> = None;
    let mut owner: BTreeMap<u32, PathBuf> = BTreeMap::new();
    let mut segments: Vec<SegmentInfo> = Vec::new();
    let mut issues: Vec<Issue> = Vec::new();
    for s in &stores {
        let Some(m) = s.manifest() else {
            return Err(FormatError::Invalid(format!(
                "{}: a store of the set {} has no readable manifest: which job it belongs to \
                 is unknown (`ttrace fsck --repair` rebuilds it)",
                s.root().display(),
                root.display()
            )));
        };
        // One rank, one store: by the manifest's ranks and by the segments present.
        let mut ranks: Vec<u32> = m.ranks.iter().map(|r| r.rank).collect();
        ranks.extend(s.ranks());
        ranks.sort_unstable();
        ranks.dedup();
        for rank in ranks {
            if let Some(other) = owner.insert(rank, s.root().to_path_buf()) {
                return Err(FormatError::Invalid(format!(
                    "{}: rank {rank} is in both {} and {}: stores of a set hold disjoint \
                     ranks (the same node's store given twice, or two runs?)",
                    root.display(),
                    other.display(),
                    s.root().display()
                )));
            }
        }
        segments.extend(s.segments().iter().cloned());
        issues.extend(s.issues().iter().cloned());
        manifest = Some(match manifest {
            None => m.clone(),
            Some(u) => join(root, u, &first_root, m, s.root())?,
        });
    }
    let Some(mut manifest) = manifest else {
        return Err(FormatError::Invalid(format!(
            "{}: no store",
            root.display()
        )));
    };
    manifest.ranks.sort_by_key(|r| r.rank);
    missing_ranks(root, &manifest, &owner)?;
    segments.sort_by_key(|s| (s.rank, s.step));
    Ok(Store::from_parts(
        root.to_path_buf(),
        Some(manifest),
        segments,
        issues,
        roots.to_vec(),
    ))
}

/// The manifest of the union so far (`u`, starting with the store at `first`) joined with
/// the manifest `m` of the store at `path`, refusing a store of another job.
fn join(
    root: &Path,
    mut u: Manifest,
    first: &Path,
    m: &Manifest,
    path: &Path,
) -> Result<Manifest, FormatError> {
    if job_of(&u) != job_of(m) {
        return Err(FormatError::Invalid(format!(
            "{}: {} is of {} but {} of {}: a set holds the stores of one job",
            root.display(),
            path.display(),
            job_of(m),
            first.display(),
            job_of(&u)
        )));
    }
    u.ranks.extend(m.ranks.iter().cloned());
    for c in &m.comms {
        match u.comms.iter_mut().find(|e| e.key == c.key) {
            Some(e) => {
                // Each node knows the members on its own ranks: fill in the others.
                if e.members.len() < c.members.len() {
                    e.members.resize(c.members.len(), None);
                }
                for (slot, member) in e.members.iter_mut().zip(&c.members) {
                    if slot.is_none() {
                        *slot = *member;
                    }
                }
            }
            None => u.comms.push(c.clone()),
        }
    }
    u.lost.extend(m.lost.iter().cloned());
    u.finalized &= m.finalized;
    if u.exit_code.is_none_or(|c| c == 0) && m.exit_code.is_some_and(|c| c != 0) {
        u.exit_code = m.exit_code;
    }
    u.created_unix_ns = u.created_unix_ns.min(m.created_unix_ns);
    Ok(u)
}

/// The job a store belongs to, as the launcher that started its node's `ttrace run` named
/// it (the variables the manifest's environment recorded, by the rules the tracer uses for
/// its own processes): Slurm's job and step, an MPI namespace, torchrun's rendezvous id. Each
/// node's `ttrace run` names its own collector's job, so that id joins stores only when no
/// launcher is named (stores of one collector), then the run id.
pub fn job_of(m: &Manifest) -> String {
    let get = |k: &str| {
        m.env
            .get(k)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    if let Some(j) = get("SLURM_JOB_ID") {
        let step = get("SLURM_STEP_ID").unwrap_or_else(|| "batch".into());
        return format!("slurm job {j}.{step}");
    }
    if let Some(ns) = get("PMIX_NAMESPACE").or_else(|| get("OMPI_MCA_ess_base_jobid")) {
        return format!("MPI job {ns}");
    }
    if let Some(r) = get("TORCHELASTIC_RUN_ID").filter(|r| r != "none") {
        let restart = get("TORCHELASTIC_RESTART_COUNT").unwrap_or_else(|| "0".into());
        return format!("torchrun rendezvous {r} (restart {restart})");
    }
    match &m.job {
        Some(j) => format!("job {}", j.id),
        None => format!("run {}", m.run_id),
    }
}

/// Refuses a set that lacks ranks of the world the capture was asked for (a node's store
/// not given).
fn missing_ranks(
    root: &Path,
    m: &Manifest,
    owner: &BTreeMap<u32, PathBuf>,
) -> Result<(), FormatError> {
    let world = m.ranks.iter().map(|r| r.world_size).max().unwrap_or(0);
    let wanted = |r: u32| {
        m.config
            .ranks
            .as_ref()
            .is_none_or(|set| set.contains(u64::from(r)))
    };
    let missing: Vec<u32> = (0..world)
        .filter(|&r| wanted(r) && !owner.contains_key(&r))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(FormatError::Invalid(format!(
        "{}: ranks {} of the world's {world} are in no store of the set (a node's store not \
         given?)",
        root.display(),
        ranges(&missing)
    )))
}

/// `0-3, 7`.
fn ranges(v: &[u32]) -> String {
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for &r in v {
        match runs.last_mut() {
            Some((_, b)) if *b + 1 == r => *b = r,
            _ => runs.push((r, r)),
        }
    }
    runs.iter()
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}
