//! NCCL communicators this process joined: their key (identical on every member), this
//! process's rank in them, their size and device. Each registration is announced to the daemon
//! (`CommInfo`), which joins the members into the run's communicator map.
//!
//! Keys: `InitRank*` hash the `ncclUniqueId`; `Split` hashes the parent's key, the number of
//! splits made on the parent so far and the color (every member splits in the same order);
//! `Shrink` hashes the parent's key, the sorted excluded ranks and the number of shrinks of the
//! parent with that same exclusion made so far (only the survivors call a shrink, so a count of
//! all the parent's shrinks would differ between ranks excluded from different earlier
//! shrinks; every survivor of an exclusion made all its earlier ones); `InitAll` hashes the pid
//! and a per-process counter (all members live in this process).
//!
//! PreMulSum reduction operators (`ncclRedOpCreatePreMulSum`) are remembered per communicator
//! and handle, so that the collectives using one record its factor.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use core::ffi::c_int;

use cuda_abi::nccl::{ncclComm_t, ncclSuccess};
use ttrace_proto::record::PreMulSum;
use ttrace_proto::wire::CommInfo;

use crate::identity::{self, Fnv};
use crate::{real, session, tracer};

/// A communicator as the tracer knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Comm {
    pub key: u64,
    pub rank: u32,
    pub size: u32,
    pub device: Option<i32>,
    splits: u64,
}

/// A PreMulSum operator: its factor as recorded, and where a device-resident scalar lives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PreMul {
    pub info: PreMulSum,
    /// The scalar's device address (`residence` device), else 0.
    pub ptr: u64,
}

static PREMULS: Mutex<Option<HashMap<(usize, u32), PreMul>>> = Mutex::new(None);

fn with_premuls<R>(f: impl FnOnce(&mut HashMap<(usize, u32), PreMul>) -> R) -> R {
    f(PREMULS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new))
}

/// Remembers the PreMulSum operator `op` of `comm` (NCCL reuses destroyed handles: a new one
/// replaces the old).
pub fn add_premul(comm: ncclComm_t, op: u32, p: PreMul) {
    with_premuls(|m| m.insert((comm as usize, op), p));
}

/// The PreMulSum operator `op` of `comm`, if it is one.
pub fn premul(comm: ncclComm_t, op: u32) -> Option<PreMul> {
    if op < cuda_abi::nccl::ncclNumOps {
        return None;
    }
    with_premuls(|m| m.get(&(comm as usize, op)).copied())
}

/// Forgets a destroyed PreMulSum operator.
pub fn forget_premul(comm: ncclComm_t, op: u32) {
    with_premuls(|m| m.remove(&(comm as usize, op)));
}

static COMMS: Mutex<Option<HashMap<usize, Comm>>> = Mutex::new(None);
/// Shrinks made so far per (parent, hash of the excluded ranks).
static SHRINKS: Mutex<Option<HashMap<(usize, u64), u64>>> = Mutex::new(None);
static INIT_ALL_CALLS: AtomicU64 = AtomicU64::new(0);

fn with<R>(f: impl FnOnce(&mut HashMap<usize, Comm>) -> R) -> R {
    f(COMMS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new))
}

fn query(
    f: Option<unsafe extern "C" fn(ncclComm_t, *mut c_int) -> u32>,
    comm: ncclComm_t,
) -> Option<i32> {
    let f = f?;
    let mut v: c_int = 0;
    // SAFETY: a communicator handle the program passed and an out-pointer to a local.
    (unsafe { f(comm, &mut v) } == ncclSuccess).then_some(v)
}

/// The communicator `comm` (asked of NCCL and remembered with a local key when it was created
/// before the tracer saw it).
pub fn lookup(comm: ncclComm_t) -> Option<Comm> {
    if let Some(c) = with(|m| m.get(&(comm as usize)).copied()) {
        if c.device.is_some() {
            return Some(c);
        }
    }
    // Outside the registry's lock: NCCL calls may block.
    let rank = query(real::ncclCommUserRank(), comm)?;
    let size = query(real::ncclCommCount(), comm)?;
    let device = query(real::ncclCommCuDevice(), comm);
    Some(with(|m| {
        let e = m.entry(comm as usize).or_insert(Comm {
            key: Fnv::default()
                .u64(std::process::id() as u64)
                .u64(comm as u64)
                .finish(),
            rank: rank as u32,
            size: size as u32,
            device,
            splits: 0,
        });
        e.rank = rank as u32;
        e.size = size as u32;
        e.device = e.device.or(device);
        *e
    }))
}

/// A communicator this process just joined.
#[derive(Debug, Clone, Copy)]
pub struct Joined {
    pub key: u64,
    pub rank: u32,
    pub size: u32,
    pub device: Option<i32>,
    pub parent: Option<u64>,
    pub color: Option<i32>,
    pub api: &'static str,
}

/// Registers a communicator and announces it.
pub fn register(comm: ncclComm_t, j: Joined) {
    if comm.is_null() {
        return;
    }
    with(|m| {
        m.insert(
            comm as usize,
            Comm {
                key: j.key,
                rank: j.rank,
                size: j.size,
                device: j.device,
                splits: 0,
            },
        )
    });
    if session::get().is_some() {
        tracer::push(tracer::Entry::Comm(CommInfo {
            key: j.key,
            size: j.size,
            rank: j.rank,
            global_rank: identity::joined_as(j.device, j.rank),
            parent: j.parent,
            color: j.color,
            api: j.api.to_string(),
        }));
    }
}

/// The key of a communicator made from unique ids.
pub fn key_of_ids(ids: &[u8]) -> u64 {
    Fnv::default().bytes(ids).finish()
}

/// The key of the next split of `parent` with `color` (counts the split on the parent).
pub fn split_key(parent: ncclComm_t, color: i32) -> Option<u64> {
    let pkey = lookup(parent)?.key;
    let n = with(|m| {
        m.get_mut(&(parent as usize)).map(|c| {
            c.splits += 1;
            c.splits
        })
    })?;
    Some(
        Fnv::default()
            .u64(pkey)
            .u64(n)
            .u64(color as u32 as u64)
            .finish(),
    )
}

/// The key of the next shrink of `parent` without the ranks `excluded` (in any order; counts
/// the shrink on the parent, per exclusion).
pub fn shrink_key(parent: ncclComm_t, excluded: &[i32]) -> Option<u64> {
    let pkey = lookup(parent)?.key;
    let mut ex: Vec<i32> = excluded.to_vec();
    ex.sort_unstable();
    ex.dedup();
    let set = ex
        .iter()
        .fold(Fnv::default().bytes(b"shrink").u64(pkey), |h, &r| {
            h.u64(r as u32 as u64)
        })
        .finish();
    let n = {
        let mut m = SHRINKS.lock().unwrap_or_else(|p| p.into_inner());
        let c = m
            .get_or_insert_with(HashMap::new)
            .entry((parent as usize, set))
            .or_insert(0);
        *c += 1;
        *c
    };
    Some(Fnv::default().u64(set).u64(n).finish())
}

/// The key of the communicators of one `ncclCommInitAll` call.
pub fn init_all_key() -> u64 {
    Fnv::default()
        .u64(std::process::id() as u64)
        .u64(INIT_ALL_CALLS.fetch_add(1, Ordering::Relaxed))
        .finish()
}

/// The rank and size NCCL reports for `comm`.
pub fn rank_and_size(comm: ncclComm_t) -> Option<(u32, u32)> {
    Some((
        query(real::ncclCommUserRank(), comm)? as u32,
        query(real::ncclCommCount(), comm)? as u32,
    ))
}

/// Forgets a destroyed communicator.
pub fn forget(comm: ncclComm_t) {
    with(|m| m.remove(&(comm as usize)));
    if let Some(m) = SHRINKS.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
        m.retain(|(c, _), _| *c != comm as usize);
    }
    with_premuls(|m| m.retain(|(c, _), _| *c != comm as usize));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parent(handle: usize) -> ncclComm_t {
        let c = handle as ncclComm_t;
        register(
            c,
            Joined {
                key: 0x5eed,
                rank: 0,
                size: 4,
                device: Some(0),
                parent: None,
                color: None,
                api: "test",
            },
        );
        c
    }

    #[test]
    fn a_shrink_key_is_the_same_on_every_survivor_whatever_they_shrank_before() {
        // Two members of one 4-rank parent, as two processes would see it: rank 1 takes part
        // in a shrink without rank 3 and then one without rank 0; rank 3, excluded from the
        // first, only in the second (listing the excluded ranks in another order).
        let (r1, r3) = (parent(0x1001), parent(0x3003));
        let first = shrink_key(r1, &[3]).unwrap();
        let on_r1 = shrink_key(r1, &[0, 2]).unwrap();
        let on_r3 = shrink_key(r3, &[2, 0, 2]).unwrap();
        assert_eq!(on_r1, on_r3);
        assert_ne!(first, on_r1);
        // The same exclusion again is another communicator, the same on both.
        assert_eq!(shrink_key(r1, &[0, 2]), shrink_key(r3, &[0, 2]));
        assert_ne!(shrink_key(r1, &[0, 2]), Some(on_r1));
    }
}
