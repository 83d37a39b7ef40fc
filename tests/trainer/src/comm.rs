//! Topology and communicators: which TP/DP/PP coordinates a global rank has, and the NCCL
//! groups built from the world communicator with `ncclCommSplit`.
//!
//! Ranks enumerate the parallel dimensions in `--order`, fastest first (Megatron's default
//! tp-dp-pp: TP neighbours are adjacent ranks). Collectives over a group of one rank are skipped,
//! as Megatron skips them, so the world-size-1 reference issues no NCCL collective at all.

use core::ffi::c_int;

use anyhow::{anyhow, bail, Result};
use cuda_dyn::abi::nccl::*;
use cuda_dyn::nccl::*;

use crate::cli::{Dim, Layout};
use crate::cuda::{Buf, Stream};

fn nccl_error(code: ncclResult_t) -> String {
    // SAFETY: plain queries returning static strings.
    let (s, last) = unsafe {
        (
            ncclGetErrorString(code),
            ncclGetLastError(std::ptr::null_mut()),
        )
    };
    let text = |p: *const core::ffi::c_char| {
        if p.is_null() {
            String::new()
        } else {
            // SAFETY: NUL-terminated strings owned by NCCL.
            unsafe { std::ffi::CStr::from_ptr(p) }
                .to_string_lossy()
                .into_owned()
        }
    };
    format!(
        "ncclResult {code} ({}; last error: {})",
        text(s),
        text(last)
    )
}

/// Fails with the call and NCCL's error text unless it returned `ncclSuccess`.
macro_rules! nccl {
    ($e:expr) => {{
        // SAFETY: an NCCL call with a live communicator and device buffers of the counts passed.
        let code = unsafe { $e };
        if code != ncclSuccess {
            return Err(anyhow!("{} returned {}", stringify!($e), nccl_error(code)));
        }
    }};
}

/// A rank's coordinates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Coords {
    /// Tensor-parallel rank.
    pub tp: usize,
    /// Data-parallel rank.
    pub dp: usize,
    /// Pipeline stage.
    pub pp: usize,
}

impl Layout {
    fn size_of(&self, d: Dim) -> usize {
        match d {
            Dim::Tp => self.tp,
            Dim::Dp => self.dp,
            Dim::Pp => self.pp,
        }
    }

    /// The coordinates of global rank `r`.
    pub fn coords(&self, r: usize) -> Coords {
        let mut c = Coords {
            tp: 0,
            dp: 0,
            pp: 0,
        };
        let mut rest = r;
        for d in self.order.0 {
            let n = self.size_of(d);
            let v = rest % n;
            rest /= n;
            match d {
                Dim::Tp => c.tp = v,
                Dim::Dp => c.dp = v,
                Dim::Pp => c.pp = v,
            }
        }
        c
    }

    /// The global rank at `c`.
    pub fn rank_of(&self, c: Coords) -> usize {
        let mut r = 0;
        for d in self.order.0.iter().rev() {
            let v = match d {
                Dim::Tp => c.tp,
                Dim::Dp => c.dp,
                Dim::Pp => c.pp,
            };
            r = r * self.size_of(*d) + v;
        }
        r
    }
}

/// A communicator of a group (None when the group has one rank).
#[derive(Debug, Clone, Copy)]
pub struct Comm {
    raw: Option<usize>,
    /// Ranks in the group.
    pub size: usize,
    /// This rank's index in the group.
    pub rank: usize,
}

/// Reduction operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Sum.
    Sum,
    /// Average (NCCL's pre-multiplied sum).
    Avg,
    /// Maximum.
    Max,
}

impl Op {
    fn raw(self) -> ncclRedOp_t {
        match self {
            Op::Sum => ncclSum,
            Op::Avg => ncclAvg,
            Op::Max => ncclMax,
        }
    }
}

impl Comm {
    fn handle(&self) -> ncclComm_t {
        self.raw.unwrap_or(0) as ncclComm_t
    }

    /// Whether the group has more than one rank (so collectives run).
    pub fn active(&self) -> bool {
        self.raw.is_some() && self.size > 1
    }

    /// In-place or out-of-place all-reduce (`send` and `recv` of equal length).
    pub fn all_reduce(&self, send: Buf, recv: Buf, op: Op, s: Stream) -> Result<()> {
        if !self.active() {
            if send != recv {
                s.copy(recv, send)?;
            }
            return Ok(());
        }
        if send.len != recv.len || send.dt != recv.dt {
            bail!("all-reduce of mismatched buffers");
        }
        nccl!(ncclAllReduce(
            send.ptr(),
            recv.ptr(),
            send.len,
            send.dt.nccl(),
            op.raw(),
            self.handle(),
            s.raw()
        ));
        Ok(())
    }

    /// Reduce-scatter: `send` holds `size` chunks of `recv.len` elements.
    pub fn reduce_scatter(&self, send: Buf, recv: Buf, op: Op, s: Stream) -> Result<()> {
        if send.len != recv.len * self.size {
            bail!(
                "reduce-scatter of {} elements into {} x {}",
                send.len,
                self.size,
                recv.len
            );
        }
        if !self.active() {
            return s.copy(recv, send);
        }
        nccl!(ncclReduceScatter(
            send.ptr(),
            recv.ptr(),
            recv.len,
            send.dt.nccl(),
            op.raw(),
            self.handle(),
            s.raw()
        ));
        Ok(())
    }

    /// All-gather: `recv` receives `size` chunks of `send.len` elements, in group-rank order.
    pub fn all_gather(&self, send: Buf, recv: Buf, s: Stream) -> Result<()> {
        if recv.len != send.len * self.size {
            bail!(
                "all-gather of {} x {} into {}",
                self.size,
                send.len,
                recv.len
            );
        }
        if !self.active() {
            return s.copy(recv, send);
        }
        nccl!(ncclAllGather(
            send.ptr(),
            recv.ptr(),
            send.len,
            send.dt.nccl(),
            self.handle(),
            s.raw()
        ));
        Ok(())
    }

    /// Point-to-point operations issued together, as PyTorch's `batch_isend_irecv` does
    /// (one NCCL group).
    pub fn p2p(&self, ops: &[P2p], s: Stream) -> Result<()> {
        if ops.is_empty() {
            return Ok(());
        }
        if !self.active() {
            bail!("point-to-point on a group of one rank");
        }
        nccl!(ncclGroupStart());
        for op in ops {
            match *op {
                P2p::Send(b, peer) => nccl!(ncclSend(
                    b.ptr(),
                    b.len,
                    b.dt.nccl(),
                    peer as c_int,
                    self.handle(),
                    s.raw()
                )),
                P2p::Recv(b, peer) => nccl!(ncclRecv(
                    b.ptr(),
                    b.len,
                    b.dt.nccl(),
                    peer as c_int,
                    self.handle(),
                    s.raw()
                )),
            }
        }
        nccl!(ncclGroupEnd());
        Ok(())
    }
}

/// One point-to-point operation: buffer and peer (group rank).
#[derive(Debug, Clone, Copy)]
pub enum P2p {
    /// Send the buffer to the peer.
    Send(Buf, usize),
    /// Receive into the buffer from the peer.
    Recv(Buf, usize),
}

/// This rank's place in the job and its communicators.
pub struct Topology {
    /// Global rank.
    pub rank: usize,
    /// The layout.
    pub layout: Layout,
    /// This rank's coordinates.
    pub me: Coords,
    /// Every rank.
    pub world: Comm,
    /// Ranks that differ only in TP rank.
    pub tp: Comm,
    /// Ranks that differ only in DP rank.
    pub dp: Comm,
    /// Ranks that differ only in pipeline stage.
    pub pp: Comm,
    /// First and last stage with the same TP and DP rank (tied embeddings; pp > 1 only).
    pub embedding: Comm,
    /// Every rank of this pipeline stage (TP x DP): the FP8 amax reduction group.
    pub amax: Comm,
}

impl Topology {
    /// Joins the world communicator (bootstrap from `NCCL_COMM_ID`) and splits the groups.
    pub fn new(rank: usize, layout: Layout) -> Result<Topology> {
        let n = layout.world();
        let me = layout.coords(rank);
        let mut id = ncclUniqueId {
            internal: [0; NCCL_UNIQUE_ID_BYTES],
        };
        nccl!(ncclGetUniqueId(&mut id));
        let mut world: ncclComm_t = std::ptr::null_mut();
        nccl!(ncclCommInitRank(&mut world, n as c_int, id, rank as c_int));
        let world_comm = Comm {
            raw: Some(world as usize),
            size: n,
            rank,
        };
        // Each split is collective over the world: every rank makes the same calls in order.
        let split = |color: Option<usize>, key: usize, size: usize| -> Result<Comm> {
            let mut c: ncclComm_t = std::ptr::null_mut();
            let col = color.map_or(NCCL_SPLIT_NOCOLOR, |c| c as c_int);
            nccl!(ncclCommSplit(
                world,
                col,
                key as c_int,
                &mut c,
                std::ptr::null_mut()
            ));
            Ok(Comm {
                raw: (!c.is_null()).then_some(c as usize),
                size,
                rank: key,
            })
        };
        let (tp, dp, pp) = (layout.tp, layout.dp, layout.pp);
        let tp_c = split(Some(me.dp + dp * me.pp), me.tp, tp)?;
        let dp_c = split(Some(me.tp + tp * me.pp), me.dp, dp)?;
        let pp_c = split(Some(me.tp + tp * me.dp), me.pp, pp)?;
        let edge = me.pp == 0 || me.pp == pp - 1;
        let emb = if pp > 1 {
            split(
                edge.then_some(me.tp + tp * me.dp),
                usize::from(me.pp != 0),
                2,
            )?
        } else {
            Comm {
                raw: None,
                size: 1,
                rank: 0,
            }
        };
        let amax = split(Some(me.pp), me.tp + tp * me.dp, tp * dp)?;
        Ok(Topology {
            rank,
            layout,
            me,
            world: world_comm,
            tp: tp_c,
            dp: dp_c,
            pp: pp_c,
            embedding: emb,
            amax,
        })
    }

    /// Whether this rank runs the first pipeline stage.
    pub fn first_stage(&self) -> bool {
        self.me.pp == 0
    }
    /// Whether this rank runs the last pipeline stage.
    pub fn last_stage(&self) -> bool {
        self.me.pp == self.layout.pp - 1
    }
}
