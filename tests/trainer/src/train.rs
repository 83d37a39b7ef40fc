//! A training run: join the job, build the stage, initialise canonical weights, run the steps,
//! print the losses, dump.

use anyhow::{Context, Result};
use half::bf16;

use crate::bugs::Bug;
use crate::cli::{Config, UsageError};
use crate::comm::{Op, Topology};
use crate::cuda::{load, store, Arena, DType, Graph, Pinned, Stream};
use crate::data;
use crate::gemm::Blas;
use crate::init::canonical;
use crate::kernels::Kernels;
use crate::layers::{Ctx, Dims};
use crate::model::Stage;
use crate::nvtx::Nvtx;
use crate::optimizer;
use crate::params::StageParams;
use crate::schedule;

/// This process's place in the job, from the launcher's environment (torchrun/simrun); a lone
/// process is rank 0 of 1.
struct Job {
    rank: usize,
    world: usize,
    local_rank: usize,
}

fn env_usize(name: &str) -> Result<Option<usize>> {
    match std::env::var(name) {
        Err(_) => Ok(None),
        Ok(v) => v
            .parse()
            .map(Some)
            .with_context(|| format!("{name}={v} is not a number")),
    }
}

fn job() -> Result<Job> {
    let rank = env_usize("RANK")?.unwrap_or(0);
    let world = env_usize("WORLD_SIZE")?.unwrap_or(1);
    let local_rank = env_usize("LOCAL_RANK")?.unwrap_or(rank);
    if std::env::var_os("NCCL_COMM_ID").is_none() {
        if let (Ok(a), Ok(p)) = (std::env::var("MASTER_ADDR"), std::env::var("MASTER_PORT")) {
            // NCCL's bootstrap variable: every rank derives the same unique id from it.
            std::env::set_var("NCCL_COMM_ID", format!("{a}:{p}"));
        }
    }
    Ok(Job {
        rank,
        world,
        local_rank,
    })
}

/// Runs the training described by `cfg`.
pub fn run(cfg: &Config) -> Result<()> {
    let j = job()?;
    let l = cfg.layout;
    if j.world != l.world() {
        return Err(UsageError(format!(
            "the layout tp {} x dp {} x pp {} needs {} ranks, but WORLD_SIZE is {} (run under \
             simrun/torchrun with --nproc-per-node {})",
            l.tp,
            l.dp,
            l.pp,
            l.world(),
            j.world,
            l.world()
        ))
        .into());
    }
    crate::cuda::set_device(j.local_rank)?;
    let topo = Topology::new(j.rank, l)?;
    let s = Stream::new()?;
    let blas = Blas::new(s, cfg.gemm)?;
    let c = Ctx {
        cfg,
        topo: &topo,
        s,
        k: Kernels { s },
        blas: &blas,
        nvtx: Nvtx::new(cfg.nvtx),
        d: Dims::new(cfg),
    };
    let mut arena = Arena::new(s);
    let params = StageParams::new(cfg, topo.me.pp, topo.me.tp);
    let mut st = Stage::new(&c, &mut arena, params)?;
    init_weights(&c, &st)?;

    let d = c.d;
    let m = cfg.micro_batches;
    let mut staging = Pinned::new(m * 2 * d.t * 4)?;
    let mut loss_host = Pinned::new(4)?;
    let prints = topo.last_stage() && topo.me.tp == 0 && topo.me.dp == 0;
    let data_rank = if cfg.bug == Some(Bug::DpDataSliceOverlap) {
        0
    } else {
        topo.me.dp
    };
    // `--cuda-graph`: the forward/backward passes, captured at the first step.
    let mut graph: Option<Graph> = None;
    for step in 0..cfg.steps {
        s.zero(st.flat.grad)?;
        s.zero(st.loss)?;
        {
            let bytes = staging.bytes_mut();
            for mb in 0..m {
                let batch = data::micro_batch(
                    cfg.seed,
                    step,
                    mb,
                    cfg.micro_batch_size,
                    l.dp,
                    data_rank,
                    cfg.model.seq,
                    cfg.model.vocab,
                    cfg.prompt_len,
                );
                let base = mb * 2 * d.t * 4;
                for (i, v) in batch.tokens.iter().chain(&batch.labels).enumerate() {
                    bytes[base + 4 * i..base + 4 * i + 4].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        for mb in 0..m {
            let base = mb * 2 * d.t * 4;
            if topo.first_stage() {
                s.upload(st.acts[mb].tokens, &staging, base)?;
            }
            if topo.last_stage() {
                s.upload(st.acts[mb].labels, &staging, base + d.t * 4)?;
            }
        }
        if cfg.cuda_graph {
            if graph.is_none() {
                graph = Some(Graph::capture(s, || {
                    schedule::forward_backward(&c, &mut st)
                })?);
            }
            if let Some(g) = &graph {
                g.launch(s)?;
            }
        } else {
            schedule::forward_backward(&c, &mut st)?;
        }
        optimizer::step(&c, &st, step)?;
        if topo.last_stage() {
            topo.dp.all_reduce(st.loss, st.loss, Op::Avg, s)?;
            s.download(&mut loss_host, 0, st.loss)?;
        }
        // The staging buffers are reused next step: wait for this step's copies.
        s.sync()?;
        if prints {
            let b = loss_host.bytes();
            let v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            let line = format!("step {step} loss {v}");
            println!("{line}");
            if let Some(dir) = &cfg.dump {
                crate::dump::loss(dir, &line)?;
            }
        }
    }
    if let Some(dir) = &cfg.dump {
        optimizer::gather_masters(&c, &st)?;
        let n = st.params.flat.total;
        let mut host = Pinned::new(n * 4)?;
        if n > 0 {
            s.download(&mut host, 0, st.flat.master.slice(0, n))?;
        }
        s.sync()?;
        let master: Vec<f32> = host
            .bytes()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        crate::dump::weights(dir, j.rank, &st.params, &master)?;
        if j.rank == 0 {
            crate::dump::readme(dir)?;
        }
    }
    s.sync()?;
    Ok(())
}

/// Fills the master and model weights from the canonical tensors. In bf16/fp8 the masters start
/// bf16-rounded, as Megatron's do (they are copied from the bf16 model). A tied copy on the
/// last stage starts at zero and is summed from the first stage, as Megatron synchronises it.
fn init_weights(c: &Ctx, st: &Stage) -> Result<()> {
    let p = &st.params;
    let n = p.flat.total;
    if n == 0 {
        return Ok(());
    }
    let mut host = vec![0f32; n];
    for (i, spec) in p.specs.iter().enumerate() {
        if spec.tied_copy {
            continue;
        }
        let numel: usize = spec.shape.iter().product();
        let full = canonical(c.cfg.seed, &spec.name, numel, spec.init);
        let cols = spec.shape.get(1).copied().unwrap_or(1);
        let shard = p.loads[i].extract(&full, cols);
        let (o, len) = p.range(i);
        for (dst, v) in host[o..o + len].iter_mut().zip(shard) {
            *dst = if c.d.act == DType::BF16 {
                bf16::from_f32(v).to_f32()
            } else {
                v
            };
        }
    }
    let mut pinned = Pinned::new(n * 4)?;
    for (d, v) in pinned.bytes_mut().chunks_exact_mut(4).zip(&host) {
        d.copy_from_slice(&v.to_le_bytes());
    }
    let master = st.flat.master.slice(0, n);
    c.s.upload(master, &pinned, 0)?;
    if c.cfg.model.tied && c.cfg.layout.pp > 1 {
        if let Some(i) = p.find("embedding.word_embeddings.weight") {
            let (o, len) = p.range(i);
            let w = st.flat.master.slice(o, len);
            c.topo.embedding.all_reduce(w, w, Op::Sum, c.s)?;
        }
    }
    let model = st.flat.model.slice(0, n);
    c.s.kernel(move || {
        // SAFETY: stream order; distinct buffers.
        unsafe { store(model, &load(master)) }
    })?;
    // The pinned source must outlive the copy.
    c.s.sync()?;
    Ok(())
}
