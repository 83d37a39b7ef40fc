//! Pipeline schedule: Megatron's 1F1B (one forward, one backward) with the activations sent
//! forward and their grads sent backward in NCCL groups, as PyTorch's `batch_isend_irecv`
//! issues them. Without pipeline parallelism, each micro-batch runs forward then backward.

use anyhow::Result;

use crate::bugs::Bug;
use crate::comm::P2p;
use crate::layers::Ctx;
use crate::model::Stage;

struct Pipe<'a, 'b> {
    c: &'a Ctx<'b>,
    first: bool,
    last: bool,
    prev: usize,
    next: usize,
}

impl Pipe<'_, '_> {
    fn run(&self, ops: Vec<P2p>) -> Result<()> {
        self.c.topo.pp.p2p(&ops, self.c.s)
    }

    /// The activation this stage sends for micro-batch `mb`.
    fn sent(&self, st: &Stage, mb: usize) -> crate::cuda::Buf {
        let stale = self.c.bug(Bug::PpStaleActivation) && self.first && mb > 0;
        st.acts[if stale { mb - 1 } else { mb }].out
    }

    fn recv_forward(&self, st: &Stage, mb: usize) -> Result<()> {
        if self.first {
            return Ok(());
        }
        self.run(vec![P2p::Recv(st.acts[mb].blocks[0].x, self.prev)])
    }

    fn send_forward(&self, st: &Stage, mb: usize) -> Result<()> {
        if self.last {
            return Ok(());
        }
        self.run(vec![P2p::Send(self.sent(st, mb), self.next)])
    }

    fn send_forward_recv_backward(&self, st: &Stage, fwd: usize, bwd: usize) -> Result<()> {
        if self.last {
            return Ok(());
        }
        self.run(vec![
            P2p::Send(self.sent(st, fwd), self.next),
            P2p::Recv(st.acts[bwd].dout, self.next),
        ])
    }

    fn send_backward_recv_forward(&self, st: &Stage, bwd: usize, fwd: usize) -> Result<()> {
        if self.first {
            return Ok(());
        }
        self.run(vec![
            P2p::Send(st.acts[bwd].dinput, self.prev),
            P2p::Recv(st.acts[fwd].blocks[0].x, self.prev),
        ])
    }

    fn recv_backward(&self, st: &Stage, mb: usize) -> Result<()> {
        if self.last {
            return Ok(());
        }
        self.run(vec![P2p::Recv(st.acts[mb].dout, self.next)])
    }

    fn send_backward(&self, st: &Stage, mb: usize) -> Result<()> {
        if self.first {
            return Ok(());
        }
        self.run(vec![P2p::Send(st.acts[mb].dinput, self.prev)])
    }
}

/// Runs the forward and backward passes of every micro-batch of a step.
pub fn forward_backward(c: &Ctx, st: &mut Stage) -> Result<()> {
    let m = c.cfg.micro_batches;
    let pp = c.cfg.layout.pp;
    if pp == 1 {
        for mb in 0..m {
            st.forward(c, mb)?;
            st.backward(c, mb)?;
        }
        return Ok(());
    }
    let stage = c.topo.me.pp;
    let p = Pipe {
        c,
        first: stage == 0,
        last: stage == pp - 1,
        prev: stage.saturating_sub(1),
        next: stage + 1,
    };
    let warmup = (pp - stage - 1).min(m);
    let steady = m - warmup;
    let (mut f, mut b) = (0, 0);
    for _ in 0..warmup {
        p.recv_forward(st, f)?;
        st.forward(c, f)?;
        p.send_forward(st, f)?;
        f += 1;
    }
    if steady > 0 {
        p.recv_forward(st, f)?;
    }
    for i in 0..steady {
        st.forward(c, f)?;
        p.send_forward_recv_backward(st, f, b)?;
        f += 1;
        st.backward(c, b)?;
        if i + 1 == steady {
            p.send_backward(st, b)?;
        } else {
            p.send_backward_recv_forward(st, b, f)?;
        }
        b += 1;
    }
    for _ in 0..warmup {
        p.recv_backward(st, b)?;
        st.backward(c, b)?;
        p.send_backward(st, b)?;
        b += 1;
    }
    Ok(())
}
