//! Who this process is: its global rank (from the launcher's environment, else the rank of the
//! first communicator it joins), world size, local rank, host, command line; and the stable
//! hash communicator keys are made of.
//!
//! A process that drives several GPUs (`ncclCommInitAll`, or a thread per device with
//! `ncclCommInitRank`) is several ranks: each device is named by its rank in the first
//! communicator joined on it (the world, in every framework), and its records carry that rank.
//! A launcher's rank names a process until it has joined communicators on a second device.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

use ttrace_proto::config::CaptureConfig;
use ttrace_proto::wire::JobInfo;

const UNKNOWN: u32 = u32::MAX;
/// Rank learned from the first communicator when the environment named none.
static COMM_RANK: AtomicU32 = AtomicU32::new(UNKNOWN);

fn env_u32(names: &[&str]) -> Option<u32> {
    names
        .iter()
        .find_map(|n| std::env::var(n).ok()?.trim().parse().ok())
}

/// The global rank from the launcher (torchrun, Open MPI, Slurm, PMI), if any.
pub fn env_rank() -> Option<u32> {
    static RANK: OnceLock<Option<u32>> = OnceLock::new();
    *RANK.get_or_init(|| env_u32(&["RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK"]))
}

/// The global rank: the launcher's, else the first communicator's, else 0.
pub fn rank() -> u32 {
    env_rank().unwrap_or_else(|| match COMM_RANK.load(Ordering::Relaxed) {
        UNKNOWN => 0,
        r => r,
    })
}

/// Called when this process joins a communicator as `rank`: without a launcher rank, the first
/// communicator (the world, in every framework) names the process.
pub fn joined(rank: u32) {
    let _ = COMM_RANK.compare_exchange(UNKNOWN, rank, Ordering::Relaxed, Ordering::Relaxed);
}

/// The rank of each device the process joined a communicator on (first communicator wins).
static DEVICE_RANKS: Mutex<BTreeMap<i32, u32>> = Mutex::new(BTreeMap::new());
/// Whether communicators were joined on more than one device.
static MULTI_DEVICE: AtomicBool = AtomicBool::new(false);

/// Called when this process joins a communicator as `rank` on `device`: the first communicator
/// joined on a device names it. Returns the global rank that device's records carry.
pub fn joined_as(device: Option<i32>, comm_rank: u32) -> u32 {
    if let Some(d) = device {
        let mut m = DEVICE_RANKS.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(d).or_insert(comm_rank);
        if m.len() > 1 {
            MULTI_DEVICE.store(true, Ordering::Relaxed);
        }
    }
    device.map_or_else(rank, rank_of_device)
}

/// The global rank of records made on `device`: the rank of the first communicator joined on
/// it when the launcher named no rank or the process drives several devices (see the module's
/// documentation), else the process's [`rank`]. Without a launcher rank this does not depend on
/// which device's communicator registered first, so threads racing to join are named alike in
/// every run.
pub fn rank_of_device(device: i32) -> u32 {
    if env_rank().is_some() && !MULTI_DEVICE.load(Ordering::Relaxed) {
        return rank();
    }
    DEVICE_RANKS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&device)
        .copied()
        .unwrap_or_else(rank)
}

/// The rank records made on `device` carry, when it can no longer change: the device joined a
/// communicator, and either the launcher named no rank or the process drives several devices.
/// `None` otherwise (the process-wide launcher rank is applied when capture starts).
pub fn settled_rank(device: i32) -> Option<u32> {
    if env_rank().is_some() && !MULTI_DEVICE.load(Ordering::Relaxed) {
        return None;
    }
    DEVICE_RANKS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&device)
        .copied()
}

/// World size from the launcher (1 when none says).
pub fn world_size() -> u32 {
    env_u32(&[
        "WORLD_SIZE",
        "OMPI_COMM_WORLD_SIZE",
        "SLURM_NTASKS",
        "PMI_SIZE",
    ])
    .unwrap_or(1)
}

/// Processes of the job on this node, from the launcher (1 when none says).
pub fn local_world_size() -> u32 {
    env_u32(&[
        "LOCAL_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "SLURM_NTASKS_PER_NODE",
        "MPI_LOCALNRANKS",
    ])
    .unwrap_or(1)
}

/// Local rank from the launcher (0 when none says).
pub fn local_rank() -> u32 {
    env_u32(&[
        "LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "SLURM_LOCALID",
        "MPI_LOCALRANKID",
    ])
    .unwrap_or(0)
}

/// Whether `TTRACE_RANKS` selects this process (a process without a launcher rank is selected:
/// its rank is not known yet).
pub fn rank_selected(c: &CaptureConfig) -> bool {
    match (&c.ranks, env_rank()) {
        (Some(set), Some(r)) => set.contains(r as u64),
        _ => true,
    }
}

/// The host name.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    if !ok {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The executable and its arguments, from /proc (no `std::env::args` in a preloaded library).
pub fn exe_and_argv() -> (String, Vec<String>) {
    let exe = std::fs::read_link("/proc/self/exe")
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let argv = std::fs::read("/proc/self/cmdline")
        .map(|b| split_cmdline(&b))
        .unwrap_or_default();
    (exe, argv)
}

/// Variables a launcher sets in every rank: their presence means the parent process is the
/// job's launcher (torchrun's agent, mpirun's daemon, simrun).
const LAUNCHER_VARS: [&str; 6] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "MASTER_PORT",
];

/// A process as the job rules see it: its pid, start time (clock ticks since boot, from
/// `/proc/PID/stat`: with the pid, unique for the machine's uptime) and short name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcId {
    pub pid: u32,
    pub start: u64,
    pub name: String,
}

impl ProcId {
    /// Reads `/proc/PID/stat` (`None` when the process is gone or unreadable).
    pub fn of(pid: u32) -> Option<ProcId> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `pid (comm) state ppid ...`: comm may hold spaces and parentheses, so split at the
        // last `)`; starttime is field 22, the 20th after comm.
        let open = stat.find('(')?;
        let close = stat.rfind(')')?;
        let name = stat.get(open + 1..close)?.to_string();
        let start = stat
            .get(close + 1..)?
            .split_whitespace()
            .nth(19)?
            .parse()
            .ok()?;
        Some(ProcId { pid, start, name })
    }
}

/// The job this process belongs to, from its launcher's environment (see [`job_from`]).
pub fn job() -> JobInfo {
    static JOB: OnceLock<JobInfo> = OnceLock::new();
    JOB.get_or_init(|| {
        let me = ProcId::of(std::process::id()).unwrap_or(ProcId {
            pid: std::process::id(),
            start: 0,
            name: "process".into(),
        });
        // SAFETY: getppid has no arguments and cannot fail.
        let ppid = unsafe { libc::getppid() } as u32;
        let parent = ProcId::of(ppid);
        job_from(&|k| std::env::var(k).ok(), &me, parent.as_ref())
    })
    .clone()
}

/// The job rules, first match wins:
/// 1. `TTRACE_JOB` (`ttrace run` sets it; a user can name a job);
/// 2. Slurm: `SLURM_JOB_ID` and `SLURM_STEP_ID`;
/// 3. MPI: `PMIX_NAMESPACE` (Open MPI 5, PMIx launchers), `OMPI_MCA_ess_base_jobid`;
/// 4. torchrun: `TORCHELASTIC_RUN_ID` (not its default `none`) and the restart count;
/// 5. a launcher's rank variables (`RANK`, `WORLD_SIZE`, ...): the parent process (pid and
///    start time);
/// 6. none: this process (pid and start time), so that a traced process and the ranks it
///    starts itself are one job.
pub fn job_from(
    var: &dyn Fn(&str) -> Option<String>,
    me: &ProcId,
    parent: Option<&ProcId>,
) -> JobInfo {
    let get = |k: &str| {
        var(k)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    let job = |id: String, label: String, source: &str| JobInfo {
        id,
        label,
        source: source.into(),
    };
    if let Some(j) = get("TTRACE_JOB") {
        return job(format!("ttrace:{j}"), j, "TTRACE_JOB");
    }
    if let Some(j) = get("SLURM_JOB_ID") {
        let step = get("SLURM_STEP_ID").unwrap_or_else(|| "batch".into());
        return job(
            format!("slurm:{j}.{step}"),
            format!("slurm-{j}.{step}"),
            "slurm",
        );
    }
    if let Some(ns) = get("PMIX_NAMESPACE").or_else(|| get("OMPI_MCA_ess_base_jobid")) {
        return job(format!("mpi:{ns}"), format!("mpi-{ns}"), "mpi");
    }
    if let Some(r) = get("TORCHELASTIC_RUN_ID").filter(|r| r != "none") {
        let restart = get("TORCHELASTIC_RESTART_COUNT").unwrap_or_else(|| "0".into());
        let short: String = r
            .chars()
            .rev()
            .take(12)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        return job(
            format!("torchrun:{r}:{restart}"),
            format!("torchrun-{short}-r{restart}"),
            "torchrun",
        );
    }
    // A launcher's ranks are the launcher's job; a process that traces and starts its own
    // ranks (e.g. `mp.spawn`) has the same id as they do.
    if let Some(p) = parent.filter(|_| LAUNCHER_VARS.iter().any(|k| get(k).is_some())) {
        return job(
            format!("proc:{}@{}", p.pid, p.start),
            format!("{}-{}", p.name, p.pid),
            "launcher",
        );
    }
    job(
        format!("proc:{}@{}", me.pid, me.start),
        format!("{}-{}", me.name, me.pid),
        "process",
    )
}

/// The job's command line as this process sees it: its launcher's (the parent) when it runs
/// under one, else its own.
pub fn job_command(job: &JobInfo) -> Vec<String> {
    let (_, argv) = exe_and_argv();
    if job.source == "process" {
        return argv;
    }
    // SAFETY: getppid has no arguments and cannot fail.
    let ppid = unsafe { libc::getppid() };
    std::fs::read(format!("/proc/{ppid}/cmdline"))
        .map(|b| split_cmdline(&b))
        .ok()
        .filter(|a| !a.is_empty())
        .unwrap_or(argv)
}

fn split_cmdline(b: &[u8]) -> Vec<String> {
    b.split(|&c| c == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// The calling thread's OS id.
pub fn gettid() -> u64 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u64 }
}

/// FNV-1a, 64 bits: a hash every rank computes identically (communicator keys must agree
/// across processes, so no per-process random seed).
#[derive(Debug, Clone, Copy)]
pub struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    /// Mixes `bytes` in.
    pub fn bytes(mut self, bytes: &[u8]) -> Fnv {
        for &b in bytes {
            self.0 ^= b as u64;
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
        self
    }

    /// Mixes a number in (little-endian bytes).
    pub fn u64(self, v: u64) -> Fnv {
        self.bytes(&v.to_le_bytes())
    }

    /// The hash.
    pub fn finish(self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    const ME: ProcId = ProcId {
        pid: 4242,
        start: 77,
        name: String::new(),
    };

    fn launcher() -> ProcId {
        ProcId {
            pid: 100,
            start: 5,
            name: "torchrun".into(),
        }
    }

    #[test]
    fn a_job_is_named_by_the_most_specific_launcher_variables() {
        let p = launcher();
        let j = job_from(
            &env(&[("TTRACE_JOB", "abc"), ("SLURM_JOB_ID", "9")]),
            &ME,
            Some(&p),
        );
        assert_eq!(
            (j.id.as_str(), j.source.as_str()),
            ("ttrace:abc", "TTRACE_JOB")
        );
        let j = job_from(
            &env(&[("SLURM_JOB_ID", "9"), ("SLURM_STEP_ID", "2"), ("RANK", "1")]),
            &ME,
            Some(&p),
        );
        assert_eq!(
            (j.id.as_str(), j.label.as_str()),
            ("slurm:9.2", "slurm-9.2")
        );
        let j = job_from(
            &env(&[
                ("PMIX_NAMESPACE", "prterun-h-1@1"),
                ("OMPI_COMM_WORLD_RANK", "0"),
            ]),
            &ME,
            Some(&p),
        );
        assert_eq!(j.id, "mpi:prterun-h-1@1");
        let j = job_from(
            &env(&[
                ("TORCHELASTIC_RUN_ID", "r1"),
                ("TORCHELASTIC_RESTART_COUNT", "2"),
                ("RANK", "3"),
            ]),
            &ME,
            Some(&p),
        );
        assert_eq!(j.id, "torchrun:r1:2");
    }

    #[test]
    fn ranks_of_one_launcher_share_a_job_and_a_lone_process_is_its_own() {
        let p = launcher();
        let vars = [
            ("TORCHELASTIC_RUN_ID", "none"),
            ("RANK", "0"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "29500"),
        ];
        let a = job_from(&env(&vars), &ME, Some(&p));
        let other = ProcId { pid: 4243, ..ME };
        let b = job_from(&env(&vars), &other, Some(&p));
        assert_eq!(a, b, "two ranks of one torchrun");
        assert_eq!(a.id, "proc:100@5");
        assert_eq!(a.label, "torchrun-100");
        let later = ProcId {
            start: 6,
            ..launcher()
        };
        assert_ne!(
            job_from(&env(&vars), &ME, Some(&later)).id,
            a.id,
            "a reused pid is another job"
        );
        let alone = job_from(&env(&[]), &ME, Some(&p));
        assert_eq!(
            (alone.id.as_str(), alone.source.as_str()),
            ("proc:4242@77", "process")
        );
        let spawned = job_from(&env(&[("RANK", "1")]), &other, Some(&ME));
        assert_eq!(
            spawned.id, alone.id,
            "ranks a traced process starts share its job"
        );
    }

    #[test]
    fn this_process_reads_its_own_start_time() {
        let me = ProcId::of(std::process::id()).expect("/proc/self/stat");
        assert!(me.start > 0 && !me.name.is_empty(), "{me:?}");
        assert_eq!(ProcId::of(std::process::id()), Some(me));
    }

    #[test]
    fn fnv_matches_the_reference_vectors() {
        assert_eq!(Fnv::default().finish(), 0xcbf29ce484222325);
        assert_eq!(Fnv::default().bytes(b"a").finish(), 0xaf63dc4c8601ec8c);
        assert_eq!(Fnv::default().bytes(b"foobar").finish(), 0x85944171f73967e8);
    }
}
