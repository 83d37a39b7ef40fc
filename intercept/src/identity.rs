//! Who this process is: its global rank (from the launcher's environment, else the rank of the
//! first communicator it joins), world size, local rank, host, command line; and the stable
//! hash communicator keys are made of.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use ttrace_format::config::CaptureConfig;

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
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default();
    (exe, argv)
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

    #[test]
    fn fnv_matches_the_reference_vectors() {
        assert_eq!(Fnv::default().finish(), 0xcbf29ce484222325);
        assert_eq!(Fnv::default().bytes(b"a").finish(), 0xaf63dc4c8601ec8c);
        assert_eq!(Fnv::default().bytes(b"foobar").finish(), 0x85944171f73967e8);
    }
}
