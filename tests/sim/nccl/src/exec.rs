//! Operations and the "kernels" that run them on a stream's worker.
//!
//! An operation is recorded by the API call (arguments validated, device pointers translated)
//! and executed by a [`Task`]: the fused group of operations launched by one (outermost)
//! `ncclGroupEnd`, or a single ungrouped call. A task runs as one kernel on the stream of its
//! first operation; every other stream it touches gets a *join* kernel that waits until the
//! main kernel finished, so each stream sees the results in its own order, as NCCL's stream
//! joins do.
//!
//! Inside a task, operations form *lanes* that progress concurrently (one thread each): all
//! collectives of a communicator (in issue order), and per communicator and peer the sends and
//! the receives. Across tasks, issue order is kept per communicator by sequence numbers
//! assigned at launch, so two kernels of one communicator on different streams never interleave
//! on the shared staging slots, and all ranks pair their operations identically.
//!
//! Collective data path (see `shm.rs`): the buffer is cut into windows that fit the staging
//! slots; per window every rank stages its input, a barrier, the ranks reduce or copy, a
//! barrier. Reductions follow the ring order of `sim_kernels::reduce` whoever computes them, so
//! all ranks obtain the same bits.

use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use cuda_abi::cudart::*;
use cuda_abi::nccl::*;
use sim_device::DevicePtr;
use sim_kernels::dtype::DType;
use sim_kernels::reduce::{self, ReduceOp};

use crate::comm::{lock, Comm};
use crate::shm::{timeout, Fail};

/// What an operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    AllReduce = 1,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    Send,
    Recv,
}

impl Kind {
    /// Whether it is point-to-point.
    pub fn is_p2p(self) -> bool {
        matches!(self, Kind::Send | Kind::Recv)
    }
}

/// The reduction of an operation.
#[derive(Debug, Clone, Copy)]
pub enum Red {
    /// Not a reduction.
    None,
    /// A reduction known at call time.
    Op(ReduceOp),
    /// A PreMulSum whose scalar lives in device memory and is read when the kernel runs.
    DeviceScalar(DevicePtr),
}

/// A buffer of an operation: a translated device range, or the name of an argument that is not
/// device-accessible (the kernel faults on it, as a GPU would).
#[derive(Debug, Clone, Copy)]
pub enum Buf {
    Unused,
    Dev(DevicePtr),
    Bad(&'static str),
}

/// A recorded operation.
pub struct Op {
    pub kind: Kind,
    pub comm: Arc<Comm>,
    /// The `cudaStream_t`, as an address.
    pub stream: usize,
    pub send: Buf,
    pub recv: Buf,
    /// Elements: `count` / `sendcount` / `recvcount` as the API names it.
    pub count: usize,
    pub dtype: DType,
    pub nccl_dtype: ncclDataType_t,
    pub red: Red,
    /// Root (Broadcast, Reduce) or peer (Send, Recv).
    pub peer: usize,
    /// Issue-order sequence number in its lane.
    pub seq: AtomicU64,
}

/// Identity of a lane: (communicator address, 0 = collectives / 1 = sends / 2 = receives, peer).
type LaneKey = (usize, u8, usize);

fn lane_key(op: &Op) -> LaneKey {
    let c = Arc::as_ptr(&op.comm) as usize;
    match op.kind {
        Kind::Send => (c, 1, op.peer),
        Kind::Recv => (c, 2, op.peer),
        _ => (c, 0, 0),
    }
}

/// Assigns the issue-order sequence numbers of `ops` (callers hold the launch lock, so that
/// tasks launched in one order get numbers in that order on every communicator).
pub fn assign_seqs(ops: &[Op]) {
    for (op, seq) in ops.iter().zip(take_seqs(ops)) {
        op.seq.store(seq, Relaxed);
    }
}

/// Takes the next issue-order sequence number of each of `ops` on its communicator (callers
/// hold the launch lock).
fn take_seqs(ops: &[Op]) -> Vec<u64> {
    ops.iter()
        .map(|op| {
            let mut issue = lock(&op.comm.issue);
            let slot = match op.kind {
                Kind::Send => &mut issue.send[op.peer],
                Kind::Recv => &mut issue.recv[op.peer],
                _ => &mut issue.coll,
            };
            *slot += 1;
            *slot - 1
        })
        .collect()
}

#[derive(Default)]
struct TaskSync {
    /// Join kernels that reached their stream position (over all runs).
    arrivals: u64,
    /// Runs of the main kernel that finished.
    released: u64,
    /// Result of the latest finished run.
    result: Option<cudaError_t>,
}

/// A launched group of operations.
pub struct Task {
    ops: Vec<Op>,
    lanes: Vec<Vec<usize>>,
    /// Number of join kernels.
    joins: AtomicU64,
    /// Launched into a graph capture: sequence numbers are taken at every launch of the graph
    /// ([`Task::launched`]), or at the run when no launch gave them.
    captured: bool,
    /// Sequence numbers taken by graph launches whose replay has not run yet, oldest first.
    launches: Mutex<std::collections::VecDeque<Vec<u64>>>,
    sync: Mutex<TaskSync>,
    cv: Condvar,
}

/// Serialises sequence-number assignment with kernel launch.
pub static LAUNCH: Mutex<()> = Mutex::new(());

impl Task {
    /// A task of `ops` (sequence numbers must be assigned).
    pub fn new(ops: Vec<Op>) -> Task {
        let mut keys: Vec<LaneKey> = Vec::new();
        let mut lanes: Vec<Vec<usize>> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            let k = lane_key(op);
            match keys.iter().position(|x| *x == k) {
                Some(l) => lanes[l].push(i),
                None => {
                    keys.push(k);
                    lanes.push(vec![i]);
                }
            }
        }
        Task {
            ops,
            lanes,
            joins: AtomicU64::new(0),
            captured: false,
            launches: Mutex::new(std::collections::VecDeque::new()),
            sync: Mutex::new(TaskSync::default()),
            cv: Condvar::new(),
        }
    }

    /// The distinct streams of the operations, first one first.
    pub fn streams(&self) -> Vec<usize> {
        let mut s: Vec<usize> = Vec::new();
        for op in &self.ops {
            if !s.contains(&op.stream) {
                s.push(op.stream);
            }
        }
        s
    }

    /// Takes the operations' places in their communicators' order now (eager launch).
    pub fn assign_seqs(&self) {
        assign_seqs(&self.ops);
    }

    /// Marks the task as captured into a graph (see `captured`).
    pub fn set_captured(&mut self) {
        self.captured = true;
    }

    /// A graph holding the task was launched: its operations take their places in their
    /// communicators' order now, in launch-call order (as NCCL's graph-captured kernels run in
    /// stream order with the eager ones issued after the launch), for the replay this launch
    /// enqueued.
    pub fn launched(&self) {
        let _l = lock(&LAUNCH);
        let seqs = take_seqs(&self.ops);
        lock(&self.launches).push_back(seqs);
    }

    /// Sets how many join kernels were launched.
    pub fn set_joins(&self, n: u64) {
        self.joins.store(n, Release);
    }

    /// The main kernel's run number `run` (0 first; more on graph replays).
    pub fn run_main(&self, run: u64) -> Result<(), cudaError_t> {
        let joins = self.joins.load(Acquire);
        if joins > 0 {
            let deadline = Instant::now() + timeout();
            let mut g = lock(&self.sync);
            while g.arrivals < joins * (run + 1) {
                let now = Instant::now();
                if now > deadline {
                    return Err(cudaErrorLaunchFailure);
                }
                g = self
                    .cv
                    .wait_timeout(g, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        if run > 0 || self.captured {
            // A graph replay: a new instance of every operation, at the places its launch took
            // (taken now when no launch told it: a graph run by other means).
            let taken = lock(&self.launches).pop_front();
            match taken {
                Some(seqs) => {
                    for (op, seq) in self.ops.iter().zip(seqs) {
                        op.seq.store(seq, Relaxed);
                    }
                }
                None => {
                    let _l = lock(&LAUNCH);
                    assign_seqs(&self.ops);
                }
            }
        }
        let r = self.execute();
        let mut g = lock(&self.sync);
        g.released = run + 1;
        g.result = Some(match r {
            Ok(()) => cudaSuccess,
            Err(e) => e,
        });
        self.cv.notify_all();
        r
    }

    /// A join kernel's run number `run`: reports its stream reached the task and waits until
    /// the main kernel finished; fails like it.
    pub fn run_join(&self, run: u64) -> Result<(), cudaError_t> {
        let deadline = Instant::now() + timeout();
        let mut g = lock(&self.sync);
        g.arrivals += 1;
        self.cv.notify_all();
        while g.released < run + 1 {
            let now = Instant::now();
            if now > deadline {
                return Err(cudaErrorLaunchFailure);
            }
            g = self
                .cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        match g.result {
            Some(cudaSuccess) | None => Ok(()),
            Some(e) => Err(e),
        }
    }

    /// Runs every lane (concurrently when there are several) and returns the first error.
    pub fn execute(&self) -> Result<(), cudaError_t> {
        if self.lanes.len() == 1 {
            return self.run_lane(&self.lanes[0]);
        }
        std::thread::scope(|s| {
            let handles: Vec<_> = self.lanes[1..]
                .iter()
                .map(|lane| s.spawn(move || self.run_lane(lane)))
                .collect();
            let mut r = self.run_lane(&self.lanes[0]);
            for h in handles {
                let lr = h.join().unwrap_or(Err(cudaErrorLaunchFailure));
                if r.is_ok() {
                    r = lr;
                }
            }
            r
        })
    }

    fn run_lane(&self, lane: &[usize]) -> Result<(), cudaError_t> {
        for &i in lane {
            let op = &self.ops[i];
            let comm = &op.comm;
            let seq = op.seq.load(Relaxed);
            let done = match op.kind {
                Kind::Send => &comm.send_done[op.peer],
                Kind::Recv => &comm.recv_done[op.peer],
                _ => &comm.coll_done,
            };
            let r = comm
                .seg
                .wait_until("earlier operations on this communicator", || {
                    if comm.failed() {
                        return Err(Fail::Aborted);
                    }
                    Ok(done.load(Acquire) == seq)
                })
                .and_then(|()| run_op(op));
            match r {
                Ok(()) => {
                    done.store(seq + 1, Release);
                    comm.seg.bump();
                }
                Err(f) => {
                    comm.fail(&f);
                    crate::debug_warn(&format!(
                        "{:?} on rank {} of {} failed: {f}",
                        op.kind, comm.rank, comm.nranks
                    ));
                    return Err(match f {
                        Fail::BadPointer(_) => cudaErrorIllegalAddress,
                        _ => cudaErrorLaunchFailure,
                    });
                }
            }
        }
        Ok(())
    }
}

/// The device range of a buffer, or the kernel's fault.
fn dev(b: Buf, what: &'static str) -> Result<DevicePtr, Fail> {
    match b {
        Buf::Dev(p) => Ok(p),
        Buf::Bad(w) => Err(Fail::BadPointer(w)),
        Buf::Unused => Err(Fail::BadPointer(what)),
    }
}

fn at(p: DevicePtr, off: usize) -> DevicePtr {
    // SAFETY: callers stay inside the range validated by device_access.
    DevicePtr(unsafe { p.0.add(off) })
}

/// Copies `len` bytes between non-overlapping ranges (device memory and the shared segment).
fn copy(src: *const u8, dst: *mut u8, len: usize) {
    // SAFETY: callers pass validated device ranges and slots of the mapping, which never
    // overlap each other; barriers order the accesses of different ranks.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

fn run_op(op: &Op) -> Result<(), Fail> {
    match op.kind {
        Kind::Send => return send(op),
        Kind::Recv => return recv(op),
        _ => {}
    }
    let red = match op.red {
        Red::None => ReduceOp::Sum,
        Red::Op(r) => r,
        Red::DeviceScalar(p) => {
            let mut b = [0u8; 8];
            let s = op.dtype.size();
            // SAFETY: the scalar range (one element) was validated at creation.
            b[..s].copy_from_slice(unsafe { p.slice(s) });
            ReduceOp::PreMulSum(b)
        }
    };
    let c = Coll::new(op)?;
    match op.kind {
        Kind::AllReduce => c.all_reduce(op, red),
        Kind::Broadcast => c.broadcast(op),
        Kind::Reduce => c.reduce(op, red),
        Kind::AllGather => c.all_gather(op),
        Kind::ReduceScatter => c.reduce_scatter(op, red),
        Kind::Send | Kind::Recv => Ok(()),
    }
}

/// State of one collective on one rank.
struct Coll<'a> {
    comm: &'a Comm,
    n: usize,
    rank: usize,
    es: usize,
    slot: usize,
    first_barrier: std::cell::Cell<bool>,
    desc: [u64; 4],
}

impl<'a> Coll<'a> {
    fn new(op: &'a Op) -> Result<Coll<'a>, Fail> {
        let comm = &*op.comm;
        let desc = [
            op.kind as u64 | (op.nccl_dtype as u64) << 8,
            op.count as u64,
            if matches!(op.kind, Kind::Broadcast | Kind::Reduce) {
                op.peer as u64
            } else {
                u64::MAX
            },
            0,
        ];
        let me = comm.seg.entry(comm.rank);
        for (d, v) in me.desc.iter().zip(desc) {
            d.store(v, Relaxed);
        }
        Ok(Coll {
            comm,
            n: comm.nranks,
            rank: comm.rank,
            es: op.dtype.size(),
            slot: comm.seg.layout.slot_bytes,
            first_barrier: std::cell::Cell::new(true),
            desc,
        })
    }

    /// The next collective barrier; after the first one of the operation, checks that every
    /// rank runs the same operation.
    fn barrier(&self) -> Result<(), Fail> {
        let k = self.comm.coll_barriers.fetch_add(1, Relaxed);
        let seg = &self.comm.seg;
        seg.barrier(
            &seg.header().coll_bar,
            k,
            "all ranks to reach the collective",
        )?;
        if self.first_barrier.replace(false) {
            for r in 0..self.n {
                let theirs: Vec<u64> = seg.entry(r).desc.iter().map(|d| d.load(Relaxed)).collect();
                if theirs[..] != self.desc[..] {
                    return Err(Fail::Mismatch(format!(
                        "rank {} runs {} while rank {r} runs {}",
                        self.rank,
                        describe(&self.desc),
                        describe(&theirs)
                    )));
                }
            }
        }
        Ok(())
    }

    fn in_slot(&self, r: usize) -> *mut u8 {
        self.comm.seg.in_slot(r)
    }

    /// Reduces `len` elements at element offset `win` of every rank's input slot (byte offset
    /// `slot_off`) into `dst`, chain starting at `first`.
    fn reduce_into(
        &self,
        red: ReduceOp,
        dtype: DType,
        slot_off: usize,
        len: usize,
        first: usize,
        dst: &mut [u8],
    ) {
        let bytes = len * self.es;
        // SAFETY: every rank staged its input before the barrier; nobody writes the input slots
        // until the next barrier.
        let inputs: Vec<&[u8]> = (0..self.n)
            .map(|r| unsafe { std::slice::from_raw_parts(self.in_slot(r).add(slot_off), bytes) })
            .collect();
        reduce::reduce_chain(dtype, red, &inputs, first, dst);
    }

    fn all_reduce(&self, op: &Op, red: ReduceOp) -> Result<(), Fail> {
        let send = dev(op.send, "sendbuff")?;
        let recv = dev(op.recv, "recvbuff")?;
        let (n, es, count) = (self.n, self.es, op.count);
        let w = self.slot / es;
        let out = self.comm.seg.out_slot();
        let chunk = reduce::ring_chunk_len(count, n);
        let mut start = 0;
        while start < count {
            let len = w.min(count - start);
            copy(at(send, start * es).0, self.in_slot(self.rank), len * es);
            self.barrier()?;
            // This rank computes its share of the window, cut where the ring chunks change.
            let share = len.div_ceil(n);
            let (s0, s1) = (
                (self.rank * share).min(len),
                ((self.rank + 1) * share).min(len),
            );
            let mut i = s0;
            while i < s1 {
                let g = start + i;
                let end = ((g / chunk + 1) * chunk - start).min(s1);
                let first = reduce::allreduce_first_rank(g, count, n);
                // SAFETY: [i, end) of the output slot is written by this rank only.
                let dst =
                    unsafe { std::slice::from_raw_parts_mut(out.add(i * es), (end - i) * es) };
                self.reduce_into(red, op.dtype, i * es, end - i, first, dst);
                i = end;
            }
            self.barrier()?;
            // Every rank copies the whole window out; the next window's first barrier keeps the
            // output slot stable until all copied.
            copy(out, at(recv, start * es).0, len * es);
            start += len;
        }
        Ok(())
    }

    fn broadcast(&self, op: &Op) -> Result<(), Fail> {
        let root = op.peer;
        let send = if self.rank == root {
            Some(dev(op.send, "sendbuff")?)
        } else {
            None
        };
        let recv = dev(op.recv, "recvbuff")?;
        let (es, count) = (self.es, op.count);
        let w = self.slot / es;
        let mut start = 0;
        while start < count {
            let len = w.min(count - start);
            if let Some(send) = send {
                copy(at(send, start * es).0, self.in_slot(root), len * es);
            }
            self.barrier()?;
            copy(self.in_slot(root), at(recv, start * es).0, len * es);
            self.barrier()?;
            start += len;
        }
        Ok(())
    }

    fn reduce(&self, op: &Op, red: ReduceOp) -> Result<(), Fail> {
        let root = op.peer;
        let send = dev(op.send, "sendbuff")?;
        let recv = if self.rank == root {
            Some(dev(op.recv, "recvbuff")?)
        } else {
            None
        };
        let (es, count) = (self.es, op.count);
        let w = self.slot / es;
        let first = reduce::reduce_first_rank(root, self.n);
        let mut start = 0;
        while start < count {
            let len = w.min(count - start);
            copy(at(send, start * es).0, self.in_slot(self.rank), len * es);
            self.barrier()?;
            if let Some(recv) = recv {
                // SAFETY: the root's receive window, validated at the call; written only here.
                let dst = unsafe { at(recv, start * es).slice_mut(len * es) };
                self.reduce_into(red, op.dtype, 0, len, first, dst);
            }
            self.barrier()?;
            start += len;
        }
        Ok(())
    }

    fn all_gather(&self, op: &Op) -> Result<(), Fail> {
        let send = dev(op.send, "sendbuff")?;
        let recv = dev(op.recv, "recvbuff")?;
        let (n, es, count) = (self.n, self.es, op.count);
        let w = self.slot / es;
        let mut start = 0;
        while start < count {
            let len = w.min(count - start);
            copy(at(send, start * es).0, self.in_slot(self.rank), len * es);
            self.barrier()?;
            for r in 0..n {
                copy(
                    self.in_slot(r),
                    at(recv, (r * count + start) * es).0,
                    len * es,
                );
            }
            self.barrier()?;
            start += len;
        }
        Ok(())
    }

    fn reduce_scatter(&self, op: &Op, red: ReduceOp) -> Result<(), Fail> {
        let send = dev(op.send, "sendbuff")?;
        let recv = dev(op.recv, "recvbuff")?;
        let (n, es, count) = (self.n, self.es, op.count);
        // Each slot holds one window of every block.
        let w = (self.slot / es / n).max(1);
        let first = reduce::reduce_scatter_first_rank(self.rank, n);
        let mut start = 0;
        while start < count {
            let len = w.min(count - start);
            for b in 0..n {
                // SAFETY: block b of the slot, [b*w, b*w+len) elements, inside the slot.
                let dst = unsafe { self.in_slot(self.rank).add(b * w * es) };
                copy(at(send, (b * count + start) * es).0, dst, len * es);
            }
            self.barrier()?;
            // SAFETY: this rank's receive window, validated at the call; written only here.
            let dst = unsafe { at(recv, start * es).slice_mut(len * es) };
            self.reduce_into(red, op.dtype, self.rank * w * es, len, first, dst);
            self.barrier()?;
            start += len;
        }
        Ok(())
    }
}

fn describe(d: &[u64]) -> String {
    let kind = match d[0] & 0xff {
        1 => "AllReduce",
        2 => "Broadcast",
        3 => "Reduce",
        4 => "AllGather",
        5 => "ReduceScatter",
        _ => "?",
    };
    let root = if d[2] == u64::MAX {
        String::new()
    } else {
        format!(" root {}", d[2])
    };
    format!("{kind}(count {}, datatype {}{root})", d[1], d[0] >> 8)
}

/// Sends: an 8-byte length header, then the payload, through the mailbox to the peer.
fn send(op: &Op) -> Result<(), Fail> {
    let c = &op.comm;
    let bytes = op.count * op.dtype.size();
    let header = (bytes as u64).to_le_bytes();
    let src = if bytes > 0 {
        let p = dev(op.send, "sendbuff")?;
        // SAFETY: the send range was validated at the call; only read.
        Some(unsafe { p.slice(bytes) })
    } else {
        None
    };
    c.seg.mbox_write(c.rank, op.peer, &header)?;
    if let Some(src) = src {
        c.seg.mbox_write(c.rank, op.peer, src)?;
    }
    Ok(())
}

/// Receives a message and checks its length against the posted receive.
fn recv(op: &Op) -> Result<(), Fail> {
    let c = &op.comm;
    let bytes = op.count * op.dtype.size();
    let dst = if bytes > 0 {
        let p = dev(op.recv, "recvbuff")?;
        // SAFETY: the receive range was validated at the call; written only here.
        Some(unsafe { p.slice_mut(bytes) })
    } else {
        None
    };
    let mut header = [0u8; 8];
    c.seg.mbox_read(op.peer, c.rank, &mut header)?;
    let sent = u64::from_le_bytes(header) as usize;
    if sent != bytes {
        return Err(Fail::Mismatch(format!(
            "rank {} sent {sent} bytes to rank {}, which posted a receive of {bytes} bytes",
            op.peer, c.rank
        )));
    }
    if let Some(dst) = dst {
        c.seg.mbox_read(op.peer, c.rank, dst)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::hash128;
    use crate::shm::tests::lock_env;
    use std::sync::atomic::AtomicU64;

    fn world(tag: &str, n: usize) -> Vec<Arc<Comm>> {
        let key = hash128(&[tag.as_bytes(), &std::process::id().to_le_bytes()]);
        let comms: Vec<Arc<Comm>> = (0..n)
            .map(|r| Comm::arrive(key, n, r, r as i32, true).unwrap())
            .collect();
        for c in &comms {
            c.wait_ready().unwrap();
        }
        comms
    }

    /// Host memory standing in for device memory (the kernel only needs an address).
    fn dp(v: &mut [u8]) -> Buf {
        Buf::Dev(DevicePtr(v.as_mut_ptr()))
    }

    #[allow(clippy::too_many_arguments)]
    fn op(
        kind: Kind,
        comm: &Arc<Comm>,
        send: Buf,
        recv: Buf,
        count: usize,
        dtype: DType,
        red: Red,
        peer: usize,
    ) -> Op {
        Op {
            kind,
            comm: comm.clone(),
            stream: 0,
            send,
            recv,
            count,
            dtype,
            nccl_dtype: 0,
            red,
            peer,
            seq: AtomicU64::new(0),
        }
    }

    /// Runs one task per rank concurrently; returns each rank's result.
    fn run_ranks(tasks: Vec<Vec<Op>>) -> Vec<Result<(), cudaError_t>> {
        std::thread::scope(|s| {
            let hs: Vec<_> = tasks
                .into_iter()
                .map(|ops| {
                    s.spawn(move || {
                        assign_seqs(&ops);
                        Task::new(ops).execute()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    fn fill(dtype: DType, count: usize, seed: usize) -> Vec<u8> {
        let mut v = vec![0u8; count * dtype.size()];
        for i in 0..count {
            let x = ((i * 37 + seed * 101) % 200) as f64 / 16.0 - 6.0;
            dtype.store(&mut v, i, x);
        }
        v
    }

    #[test]
    fn all_reduce_is_ring_ordered_and_identical_on_every_rank() {
        let _g = lock_env();
        // 1 KiB slots: windows of 512 bf16 elements, so 1000 elements take two windows.
        std::env::set_var("SIM_NCCL_SLOT_BYTES", "1024");
        let n = 3;
        let comms = world("allreduce", n);
        let (t, count) = (DType::BF16, 1000);
        let inputs: Vec<Vec<u8>> = (0..n).map(|r| fill(t, count, r)).collect();
        for red in [ReduceOp::Sum, ReduceOp::avg(t, n), ReduceOp::Max] {
            let mut outs: Vec<Vec<u8>> = vec![vec![0u8; count * 2]; n];
            let mut ins = inputs.clone();
            let tasks = (0..n)
                .zip(ins.iter_mut().zip(outs.iter_mut()))
                .map(|(r, (i, o))| {
                    vec![op(
                        Kind::AllReduce,
                        &comms[r],
                        dp(i),
                        dp(o),
                        count,
                        t,
                        Red::Op(red),
                        0,
                    )]
                })
                .collect();
            assert!(run_ranks(tasks).iter().all(|r| r.is_ok()));
            let slices: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
            for e in 0..count {
                let first = reduce::allreduce_first_rank(e, count, n);
                let one: Vec<&[u8]> = slices.iter().map(|s| &s[e * 2..e * 2 + 2]).collect();
                let mut want = [0u8; 2];
                reduce::reduce_chain(t, red, &one, first, &mut want);
                for (r, o) in outs.iter().enumerate() {
                    assert_eq!(&o[e * 2..e * 2 + 2], &want, "{red:?} rank {r} element {e}");
                }
            }
        }
        // In place.
        let mut bufs = inputs.clone();
        let tasks = (0..n)
            .zip(bufs.iter_mut())
            .map(|(r, b)| {
                let p = dp(b);
                vec![op(
                    Kind::AllReduce,
                    &comms[r],
                    p,
                    p,
                    count,
                    t,
                    Red::Op(ReduceOp::Sum),
                    0,
                )]
            })
            .collect();
        assert!(run_ranks(tasks).iter().all(|r| r.is_ok()));
        assert!(bufs.windows(2).all(|w| w[0] == w[1]));
        let sum0: f64 = (0..n).map(|r| t.load(&inputs[r], 0)).sum();
        assert!((t.load(&bufs[0], 0) - sum0).abs() <= 0.1);
    }

    #[test]
    fn gather_scatter_broadcast_reduce_with_chunking_and_in_place() {
        let _g = lock_env();
        std::env::set_var("SIM_NCCL_SLOT_BYTES", "1024");
        let n = 4;
        let comms = world("others", n);
        let (t, count) = (DType::F32, 300);
        let es = 4;
        let inputs: Vec<Vec<u8>> = (0..n).map(|r| fill(t, count * n, r)).collect();
        let slices: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
        let sum = ReduceOp::Sum;

        // All-gather, in place: each rank's input sits at its own block of the output.
        let mut outs: Vec<Vec<u8>> = (0..n)
            .map(|r| {
                let mut o = vec![0u8; count * n * es];
                o[r * count * es..(r + 1) * count * es].copy_from_slice(&inputs[r][..count * es]);
                o
            })
            .collect();
        let tasks = (0..n)
            .zip(outs.iter_mut())
            .map(|(r, o)| {
                let base = o.as_mut_ptr();
                // SAFETY: block r of the output buffer.
                let send = Buf::Dev(DevicePtr(unsafe { base.add(r * count * es) }));
                vec![op(
                    Kind::AllGather,
                    &comms[r],
                    send,
                    Buf::Dev(DevicePtr(base)),
                    count,
                    t,
                    Red::None,
                    0,
                )]
            })
            .collect();
        assert!(run_ranks(tasks).iter().all(|r| r.is_ok()));
        for o in &outs {
            for r in 0..n {
                assert_eq!(
                    &o[r * count * es..(r + 1) * count * es],
                    &inputs[r][..count * es]
                );
            }
        }

        // Reduce-scatter (300 elements per block, 64 per window).
        let mut outs: Vec<Vec<u8>> = vec![vec![0u8; count * es]; n];
        let mut ins = inputs.clone();
        let tasks = (0..n)
            .zip(ins.iter_mut().zip(outs.iter_mut()))
            .map(|(r, (i, o))| {
                vec![op(
                    Kind::ReduceScatter,
                    &comms[r],
                    dp(i),
                    dp(o),
                    count,
                    t,
                    Red::Op(sum),
                    0,
                )]
            })
            .collect();
        assert!(run_ranks(tasks).iter().all(|r| r.is_ok()));
        for (b, o) in outs.iter().enumerate() {
            let block: Vec<&[u8]> = slices
                .iter()
                .map(|s| &s[b * count * es..(b + 1) * count * es])
                .collect();
            let mut want = vec![0u8; count * es];
            reduce::reduce_chain(t, sum, &block, (b + 1) % n, &mut want);
            assert_eq!(o, &want, "block {b}");
        }

        // Broadcast from root 2 and reduce to root 1.
        let mut outs: Vec<Vec<u8>> = vec![vec![0u8; count * es]; n];
        let mut red_outs: Vec<Vec<u8>> = vec![vec![0u8; count * es]; n];
        let mut ins = inputs.clone();
        let tasks = (0..n)
            .zip(ins.iter_mut().zip(outs.iter_mut().zip(red_outs.iter_mut())))
            .map(|(r, (i, (o, ro)))| {
                let recv = if r == 1 { dp(ro) } else { Buf::Unused };
                vec![
                    op(
                        Kind::Broadcast,
                        &comms[r],
                        dp(i),
                        dp(o),
                        count,
                        t,
                        Red::None,
                        2,
                    ),
                    op(
                        Kind::Reduce,
                        &comms[r],
                        dp(i),
                        recv,
                        count,
                        t,
                        Red::Op(sum),
                        1,
                    ),
                ]
            })
            .collect();
        assert!(run_ranks(tasks).iter().all(|r| r.is_ok()));
        for o in &outs {
            assert_eq!(&o[..], &inputs[2][..count * es]);
        }
        let firsts: Vec<&[u8]> = slices.iter().map(|s| &s[..count * es]).collect();
        let mut want = vec![0u8; count * es];
        reduce::reduce_chain(t, sum, &firsts, 2, &mut want);
        assert_eq!(red_outs[1], want);
        assert!(
            red_outs[0].iter().all(|b| *b == 0),
            "only the root receives"
        );
    }

    #[test]
    fn grouped_exchange_larger_than_the_mailbox_does_not_deadlock() {
        let _g = lock_env();
        std::env::set_var("SIM_NCCL_MBOX_BYTES", "256");
        let n = 2;
        let comms = world("p2p", n);
        let count = 10_000;
        let mut ins: Vec<Vec<u8>> = (0..n).map(|r| fill(DType::F32, count, r)).collect();
        let expect = ins.clone();
        let mut outs: Vec<Vec<u8>> = vec![vec![0u8; count * 4]; n];
        let tasks = (0..n)
            .zip(ins.iter_mut().zip(outs.iter_mut()))
            .map(|(r, (i, o))| {
                let peer = 1 - r;
                // Both send first: only concurrent progress avoids a deadlock.
                vec![
                    op(
                        Kind::Send,
                        &comms[r],
                        dp(i),
                        Buf::Unused,
                        count,
                        DType::F32,
                        Red::None,
                        peer,
                    ),
                    op(
                        Kind::Recv,
                        &comms[r],
                        Buf::Unused,
                        dp(o),
                        count,
                        DType::F32,
                        Red::None,
                        peer,
                    ),
                ]
            })
            .collect();
        assert!(run_ranks(tasks).iter().all(|r| r.is_ok()));
        assert_eq!(outs[0], expect[1]);
        assert_eq!(outs[1], expect[0]);
    }

    #[test]
    fn disagreeing_ranks_and_bad_pointers_fail_every_rank() {
        let _g = lock_env();
        let n = 2;
        let comms = world("mismatch", n);
        let mut bufs: Vec<Vec<u8>> = vec![vec![0u8; 80]; n];
        let tasks = (0..n)
            .zip(bufs.iter_mut())
            .map(|(r, b)| {
                let p = dp(b);
                let count = 10 * (r + 1);
                vec![op(
                    Kind::AllReduce,
                    &comms[r],
                    p,
                    p,
                    count,
                    DType::F32,
                    Red::Op(ReduceOp::Sum),
                    0,
                )]
            })
            .collect();
        let res = run_ranks(tasks);
        assert!(
            res.iter().all(|r| *r == Err(cudaErrorLaunchFailure)),
            "{res:?}"
        );
        assert!(comms.iter().all(|c| c.failed()));
        assert_eq!(comms[0].async_error(), ncclInvalidUsage);

        let comms = world("badptr", n);
        let mut bufs: Vec<Vec<u8>> = vec![vec![0u8; 40]; n];
        let tasks = (0..n)
            .zip(bufs.iter_mut())
            .map(|(r, b)| {
                let p = if r == 0 { Buf::Bad("sendbuff") } else { dp(b) };
                vec![op(
                    Kind::AllReduce,
                    &comms[r],
                    p,
                    dp(b),
                    10,
                    DType::F32,
                    Red::Op(ReduceOp::Sum),
                    0,
                )]
            })
            .collect();
        let t0 = Instant::now();
        let res = run_ranks(tasks);
        assert_eq!(res[0], Err(cudaErrorIllegalAddress));
        assert_eq!(res[1], Err(cudaErrorLaunchFailure));
        assert_eq!(comms[1].async_error(), ncclRemoteError);
        assert!(t0.elapsed() < std::time::Duration::from_secs(5));
    }
}
