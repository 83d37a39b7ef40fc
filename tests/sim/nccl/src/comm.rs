//! Communicators: unique ids, bootstrap (join), splits, the handle registry, error state.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use core::ffi::c_int;
use cuda_abi::nccl::*;
use sim_device::DevicePtr;

use crate::shm::{timeout, Fail, Segment};

/// Locks a mutex, ignoring poisoning (a panicking kernel must not wedge the library).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// 128-bit hash of byte strings (two FNV-1a lanes with a final avalanche), used to name
/// segments. Not cryptographic: ids only need to be distinct.
pub fn hash128(parts: &[&[u8]]) -> [u8; 16] {
    let mut a: u64 = 0xcbf2_9ce4_8422_2325;
    let mut b: u64 = 0x8422_2325_cbf2_9ce4;
    for p in parts {
        for &x in p.iter().chain((p.len() as u64).to_le_bytes().iter()) {
            a = (a ^ x as u64).wrapping_mul(0x0000_0100_0000_01b3);
            b = (b ^ x as u64)
                .wrapping_mul(0x0000_0100_0000_01b3)
                .rotate_left(5);
        }
    }
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&mix(a ^ b.rotate_left(17)).to_le_bytes());
    out[8..].copy_from_slice(&mix(b ^ a.rotate_left(29)).to_le_bytes());
    out
}

/// Tag at the start of every id this library makes.
const ID_TAG: &[u8; 8] = b"SIMNCCL\0";

/// A new unique id. With `NCCL_COMM_ID` ("host:port" of the bootstrap root, as in real NCCL)
/// the id is derived from it, the user and the number of ids this process made before, so that
/// every rank computes the same id without an out-of-band channel; otherwise it is random.
pub fn new_unique_id() -> Result<ncclUniqueId, Fail> {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let mut bytes = [0u8; NCCL_UNIQUE_ID_BYTES];
    bytes[..8].copy_from_slice(ID_TAG);
    let n = CALLS.fetch_add(1, Relaxed);
    match std::env::var("NCCL_COMM_ID") {
        Ok(addr) if !addr.is_empty() => bytes = id_from_comm_id(&addr, n),
        _ => {
            let mut r = [0u8; 16];
            // SAFETY: getrandom fills the 16-byte buffer (blocking only before the pool is
            // initialised at boot).
            let got = unsafe { libc::getrandom(r.as_mut_ptr().cast(), r.len(), 0) };
            if got != r.len() as isize {
                return Err(Fail::System("getrandom failed".into()));
            }
            bytes[8..24].copy_from_slice(&r);
        }
    }
    let mut id = ncclUniqueId {
        internal: [0; NCCL_UNIQUE_ID_BYTES],
    };
    for (d, s) in id.internal.iter_mut().zip(bytes) {
        *d = s as _;
    }
    Ok(id)
}

/// The bytes of the `n`-th id a process derives from `NCCL_COMM_ID` = `addr`.
pub fn id_from_comm_id(addr: &str, n: u64) -> [u8; NCCL_UNIQUE_ID_BYTES] {
    let mut bytes = [0u8; NCCL_UNIQUE_ID_BYTES];
    bytes[..8].copy_from_slice(ID_TAG);
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let key = hash128(&[addr.as_bytes(), &uid.to_le_bytes(), &n.to_le_bytes()]);
    bytes[8..24].copy_from_slice(&key);
    // The address in clear, for whoever looks at the bytes (real ids hold a sockaddr).
    let a = addr.as_bytes();
    let k = a.len().min(NCCL_UNIQUE_ID_BYTES - 25);
    bytes[24..24 + k].copy_from_slice(&a[..k]);
    bytes
}

/// The segment key of a unique id: a hash of all its bytes, so any id (even one a program made
/// up) names a communicator.
pub fn key_of(id: &ncclUniqueId) -> [u8; 16] {
    let bytes: Vec<u8> = id.internal.iter().map(|c| *c as u8).collect();
    hash128(&[b"id", &bytes])
}

/// Scalar of a user-created PreMulSum operator.
#[derive(Debug, Clone, Copy)]
pub enum Scalar {
    /// Read at creation (`ncclScalarHostImmediate`): bytes in the dtype.
    Host([u8; 8]),
    /// Read when the collective runs (`ncclScalarDevice`).
    Device(DevicePtr),
}

/// A user-created reduction operator.
#[derive(Debug, Clone, Copy)]
pub struct UserOp {
    pub datatype: ncclDataType_t,
    pub scalar: Scalar,
}

/// Issue-order sequence numbers, assigned when operations launch.
#[derive(Debug, Default)]
pub struct Issue {
    pub coll: u64,
    pub send: Vec<u64>,
    pub recv: Vec<u64>,
}

/// A communicator (one rank of it, in this process).
pub struct Comm {
    pub rank: usize,
    pub nranks: usize,
    pub device: c_int,
    pub key: [u8; 16],
    pub seg: Segment,
    pub blocking: bool,
    /// First asynchronous failure (`ncclSuccess` while healthy).
    async_err: AtomicU32,
    ready: AtomicBool,
    init_start: Instant,
    pub issue: Mutex<Issue>,
    /// Completed collectives / sends / receives (per peer), in issue order.
    pub coll_done: AtomicU64,
    pub send_done: Vec<AtomicU64>,
    pub recv_done: Vec<AtomicU64>,
    /// Collective barriers this rank passed (only the collective holding the turn uses it).
    pub coll_barriers: AtomicU64,
    splits: AtomicU64,
    /// Shrinks made so far, per excluded set.
    shrinks: Mutex<HashMap<Vec<usize>, u64>>,
    user_ops: Mutex<Vec<Option<UserOp>>>,
}

impl Comm {
    /// Opens the segment of `key` and registers as `rank`: the non-blocking half of
    /// `ncclCommInitRank` (see [`Comm::wait_ready`]).
    pub fn arrive(
        key: [u8; 16],
        nranks: usize,
        rank: usize,
        device: c_int,
        blocking: bool,
    ) -> Result<Arc<Comm>, Fail> {
        let seg = Segment::open(&key, nranks, Instant::now() + timeout())?;
        seg.register(rank, device)?;
        Ok(Arc::new(Comm {
            rank,
            nranks,
            device,
            key,
            seg,
            blocking,
            async_err: AtomicU32::new(ncclSuccess),
            ready: AtomicBool::new(false),
            init_start: Instant::now(),
            issue: Mutex::new(Issue {
                coll: 0,
                send: vec![0; nranks],
                recv: vec![0; nranks],
            }),
            coll_done: AtomicU64::new(0),
            send_done: (0..nranks).map(|_| AtomicU64::new(0)).collect(),
            recv_done: (0..nranks).map(|_| AtomicU64::new(0)).collect(),
            coll_barriers: AtomicU64::new(0),
            splits: AtomicU64::new(0),
            shrinks: Mutex::new(HashMap::new()),
            user_ops: Mutex::new(Vec::new()),
        }))
    }

    /// Waits until every rank joined (the blocking half of init).
    pub fn wait_ready(&self) -> Result<(), Fail> {
        if self.ready.load(Acquire) {
            return Ok(());
        }
        let r = self
            .seg
            .wait_until("all ranks to join the communicator", || {
                Ok(self.seg.is_ready())
            });
        match r {
            Ok(()) => {
                self.seg.release_file();
                self.ready.store(true, Release);
                Ok(())
            }
            Err(f) => {
                self.fail(&f);
                Err(f)
            }
        }
    }

    /// Non-blocking readiness check for non-blocking communicators: `Ok(true)` once every rank
    /// joined.
    pub fn poll_ready(&self) -> Result<bool, Fail> {
        if self.ready.load(Acquire) {
            return Ok(true);
        }
        let r = if self.seg.is_ready() {
            self.seg.release_file();
            self.ready.store(true, Release);
            Ok(true)
        } else if self.seg.aborted() {
            Err(Fail::Aborted)
        } else if let Some(f) = self.seg.dead_peer() {
            Err(f)
        } else if self.init_start.elapsed() > timeout() {
            Err(Fail::Timeout("all ranks to join the communicator"))
        } else {
            Ok(false)
        };
        if let Err(f) = &r {
            self.fail(f);
        }
        r
    }

    /// Whether init completed.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Acquire)
    }

    /// The first asynchronous error, `ncclSuccess` if none.
    pub fn async_error(&self) -> ncclResult_t {
        self.async_err.load(Acquire)
    }

    /// Whether the communicator failed.
    pub fn failed(&self) -> bool {
        self.async_error() != ncclSuccess
    }

    /// Records a failure: the communicator's async error, the last-error text, and the shared
    /// abort flag so that every peer fails fast instead of waiting. Returns the NCCL code.
    pub fn fail(&self, f: &Fail) -> ncclResult_t {
        let code = fail_code(f);
        if self
            .async_err
            .compare_exchange(ncclSuccess, code, AcqRel, Acquire)
            .is_ok()
        {
            crate::set_last_error(&format!("rank {} of {}: {f}", self.rank, self.nranks));
        }
        self.seg.set_abort();
        self.async_error()
    }

    /// `ncclCommAbort`: fail locally and tell the peers.
    pub fn abort(&self) {
        let _ = self
            .async_err
            .compare_exchange(ncclSuccess, ncclRemoteError, AcqRel, Acquire);
        self.seg.set_abort();
    }

    /// Whether every operation issued so far completed (for `ncclCommFinalize`).
    pub fn quiescent(&self) -> bool {
        let issue = lock(&self.issue);
        issue.coll == self.coll_done.load(Acquire)
            && (0..self.nranks).all(|p| {
                issue.send[p] == self.send_done[p].load(Acquire)
                    && issue.recv[p] == self.recv_done[p].load(Acquire)
            })
    }

    /// Waits until every issued operation completed (bounded), as `ncclCommFinalize` flushes.
    pub fn flush(&self) -> Result<(), Fail> {
        self.seg.wait_until("issued operations to complete", || {
            if self.failed() {
                return Err(Fail::Aborted);
            }
            Ok(self.quiescent())
        })
    }

    /// The host-side collective of `ncclCommSplit`: exchanges (colour, key) over the split
    /// barrier (separate from the data path, which a running kernel may be using) and returns
    /// the new communicator's (key, nranks, rank), or `None` for `NCCL_SPLIT_NOCOLOR`. Ranks
    /// of one colour are ordered by (key, parent rank).
    pub fn split(
        &self,
        color: c_int,
        key: c_int,
    ) -> Result<Option<([u8; 16], usize, usize)>, Fail> {
        let k = self.splits.fetch_add(1, AcqRel);
        let seg = &self.seg;
        let me = seg.entry(self.rank);
        me.split_color.store(color, Relaxed);
        me.split_key.store(key, Relaxed);
        let bar = &seg.header().split_bar;
        seg.barrier(bar, 2 * k, "all ranks to call ncclCommSplit")?;
        let all: Vec<(c_int, c_int)> = (0..self.nranks)
            .map(|r| {
                let e = seg.entry(r);
                (e.split_color.load(Relaxed), e.split_key.load(Relaxed))
            })
            .collect();
        // Nobody may overwrite its colour before everyone read them.
        seg.barrier(bar, 2 * k + 1, "all ranks to read the split colours")?;
        if color == NCCL_SPLIT_NOCOLOR {
            return Ok(None);
        }
        let mut members: Vec<(c_int, usize)> = all
            .iter()
            .enumerate()
            .filter(|(_, (c, _))| *c == color)
            .map(|(r, (_, key))| (*key, r))
            .collect();
        members.sort();
        let pos = members
            .iter()
            .position(|(_, r)| *r == self.rank)
            .ok_or_else(|| Fail::System("split: this rank is not in its own colour".into()))?;
        let new_key = hash128(&[b"split", &self.key, &k.to_le_bytes(), &color.to_le_bytes()]);
        Ok(Some((new_key, members.len(), pos)))
    }

    /// The new communicator of `ncclCommShrink` without the ranks `excluded`: its (key,
    /// nranks, rank). Only the survivors call it, so there is no exchange over the parent: they
    /// meet on the new communicator, whose key every survivor derives alike from the parent's
    /// key, the excluded set and the number of shrinks with that set made on the parent so far
    /// (a count of all the parent's shrinks would differ on a survivor that was excluded from
    /// an earlier one). Survivors keep their parent order.
    pub fn shrink(&self, excluded: &[c_int]) -> Result<([u8; 16], usize, usize), String> {
        let mut ex: Vec<usize> = Vec::with_capacity(excluded.len());
        for &r in excluded {
            if r < 0 || r as usize >= self.nranks {
                return Err(format!("excluded rank {r} outside 0..{}", self.nranks));
            }
            ex.push(r as usize);
        }
        ex.sort_unstable();
        ex.dedup();
        if ex.contains(&self.rank) {
            return Err(format!("rank {} excludes itself", self.rank));
        }
        let pos = (0..self.rank).filter(|r| !ex.contains(r)).count();
        let n = self.nranks - ex.len();
        let k = {
            let mut counts = lock(&self.shrinks);
            let c = counts.entry(ex.clone()).or_insert(0);
            *c += 1;
            *c - 1
        };
        let list: Vec<u8> = ex.iter().flat_map(|r| (*r as u64).to_le_bytes()).collect();
        let key = hash128(&[b"shrink", &self.key, &k.to_le_bytes(), &list]);
        Ok((key, n, pos))
    }

    /// Registers a user PreMulSum operator; returns its `ncclRedOp_t`.
    pub fn add_user_op(&self, op: UserOp) -> ncclRedOp_t {
        let mut ops = lock(&self.user_ops);
        let ix = match ops.iter().position(|o| o.is_none()) {
            Some(i) => {
                ops[i] = Some(op);
                i
            }
            None => {
                ops.push(Some(op));
                ops.len() - 1
            }
        };
        ncclNumOps + ix as ncclRedOp_t
    }

    /// The user operator `op`, if it exists.
    pub fn user_op(&self, op: ncclRedOp_t) -> Option<UserOp> {
        let ix = op.checked_sub(ncclNumOps)? as usize;
        lock(&self.user_ops).get(ix).copied().flatten()
    }

    /// Destroys the user operator `op`; false if it does not exist.
    pub fn remove_user_op(&self, op: ncclRedOp_t) -> bool {
        let Some(ix) = op.checked_sub(ncclNumOps) else {
            return false;
        };
        let mut ops = lock(&self.user_ops);
        match ops.get_mut(ix as usize) {
            Some(slot @ Some(_)) => {
                *slot = None;
                true
            }
            _ => false,
        }
    }
}

/// The NCCL result a failure is reported as.
pub fn fail_code(f: &Fail) -> ncclResult_t {
    match f {
        Fail::PeerDead { .. } | Fail::Aborted => ncclRemoteError,
        Fail::Timeout(_) | Fail::System(_) => ncclSystemError,
        Fail::Mismatch(_) => ncclInvalidUsage,
        Fail::BadPointer(_) => ncclUnhandledCudaError,
    }
}

/// Live communicators by handle. A handle is the address of the `Comm`, valid while registered.
static REGISTRY: Mutex<Option<HashMap<usize, Arc<Comm>>>> = Mutex::new(None);

/// Makes a handle for `comm`.
pub fn register(comm: Arc<Comm>) -> ncclComm_t {
    let h = Arc::as_ptr(&comm) as ncclComm_t;
    lock(&REGISTRY)
        .get_or_insert_with(HashMap::new)
        .insert(h as usize, comm);
    h
}

/// The communicator of a handle (`ncclInvalidArgument` for NULL or unknown handles).
pub fn lookup(h: ncclComm_t) -> Result<Arc<Comm>, ncclResult_t> {
    if h.is_null() {
        crate::set_last_error("comm is NULL");
        return Err(ncclInvalidArgument);
    }
    lock(&REGISTRY)
        .as_ref()
        .and_then(|m| m.get(&(h as usize)).cloned())
        .ok_or_else(|| {
            crate::set_last_error("invalid or destroyed communicator");
            ncclInvalidArgument
        })
}

/// Forgets a handle; the communicator lives on while kernels use it.
pub fn unregister(h: ncclComm_t) -> Option<Arc<Comm>> {
    lock(&REGISTRY).as_mut()?.remove(&(h as usize))
}

/// How long a blocking init may take before it gives up (for tests).
pub fn init_deadline() -> Duration {
    timeout()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::tests::lock_env;

    fn key(tag: &str) -> [u8; 16] {
        hash128(&[tag.as_bytes(), &std::process::id().to_le_bytes()])
    }

    #[test]
    fn ids_from_nccl_comm_id_are_deterministic_and_random_ones_differ() {
        let _g = lock_env();
        std::env::remove_var("NCCL_COMM_ID");
        let a = key_of(&new_unique_id().unwrap());
        let b = key_of(&new_unique_id().unwrap());
        assert_ne!(a, b);
        // Another process with the same NCCL_COMM_ID and the same number of earlier calls
        // computes the same id: the derivation depends on nothing else.
        std::env::set_var("NCCL_COMM_ID", "127.0.0.1:29500");
        let id = new_unique_id().unwrap();
        let id2 = new_unique_id().unwrap();
        std::env::remove_var("NCCL_COMM_ID");
        let bytes: Vec<u8> = id.internal.iter().map(|c| *c as u8).collect();
        let n = (0..1000)
            .find(|n| id_from_comm_id("127.0.0.1:29500", *n)[..] == bytes[..])
            .expect("the id is derived from NCCL_COMM_ID");
        let bytes2: Vec<u8> = id2.internal.iter().map(|c| *c as u8).collect();
        assert_eq!(id_from_comm_id("127.0.0.1:29500", n + 1)[..], bytes2[..]);
        assert_ne!(bytes, bytes2, "successive ids differ");
        assert_eq!(&bytes[24..39], b"127.0.0.1:29500");
    }

    /// `n` ranks of a fresh communicator named after `tag`, all arrived and ready.
    fn ready_comms(tag: &str, n: usize) -> Vec<Arc<Comm>> {
        let k = key(tag);
        let comms: Vec<Arc<Comm>> = (0..n)
            .map(|r| Comm::arrive(k, n, r, r as c_int, true).unwrap())
            .collect();
        for c in &comms {
            c.wait_ready().unwrap();
        }
        comms
    }

    #[test]
    fn init_waits_for_all_ranks_and_split_orders_by_key() {
        let _g = lock_env();
        let comms = ready_comms("split", 4);
        // Even/odd split with keys reversing the order.
        let res: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter()
                .map(|c| {
                    s.spawn(move || {
                        let color = if c.rank == 3 {
                            NCCL_SPLIT_NOCOLOR
                        } else {
                            (c.rank % 2) as c_int
                        };
                        c.split(color, -(c.rank as c_int)).unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let (k0, n0, r0) = res[0].unwrap();
        let (k2, n2, r2) = res[2].unwrap();
        let (k1, n1, r1) = res[1].unwrap();
        assert!(res[3].is_none());
        assert_eq!((n0, n2, n1), (2, 2, 1));
        // Keys -0 and -2: rank 2 comes first.
        assert_eq!((r2, r0, r1), (0, 1, 0));
        assert_eq!(k0, k2);
        assert_ne!(k0, k1);
    }

    #[test]
    fn a_shrink_meets_on_one_key_whatever_each_survivor_shrank_before() {
        let _g = lock_env();
        let comms = ready_comms("shrink", 4);
        // Ranks 0..3 shrink without rank 3, then ranks 1..4 without rank 0 (listed in another
        // order by rank 3, which took no part in the first).
        let first: Vec<_> = (0..3).map(|r| comms[r].shrink(&[3]).unwrap()).collect();
        assert!(first.iter().all(|s| s.0 == first[0].0 && s.1 == 3));
        let second: Vec<_> = (1..4)
            .map(|r| {
                let ex: &[c_int] = if r == 3 { &[0, 0] } else { &[0] };
                comms[r].shrink(ex).unwrap()
            })
            .collect();
        assert_eq!(
            second.iter().map(|s| (s.0, s.1, s.2)).collect::<Vec<_>>(),
            (0..3).map(|p| (second[0].0, 3, p)).collect::<Vec<_>>()
        );
        assert_ne!(first[0].0, second[0].0);
    }
}
