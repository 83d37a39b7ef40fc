//! A load generator for ttraced, standing in for libttrace.so where no GPU (or no intercept)
//! is wanted.
//!
//! * `loadgen publish` — one traced process: connects to `--socket` (or `TTRACE_SOCKET`, as
//!   libttrace.so does), publishes GEMM records with known bytes, then says goodbye or, with
//!   `--hang`, waits to be killed (the crash tests SIGKILL it).
//! * `loadgen bench` — the capture benchmark behind scripts/bench-capture.sh: realistic BF16
//!   activations pushed through a ring into an in-process daemon, compared with a plain memcpy
//!   of the same bytes and with plain zstd at the same level.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, Subcommand};
use ttrace_format::dtype::DType;
use ttrace_format::record::{packed_strides, GemmOp, Op, Record, Role, Tensor};
use ttrace_format::ring;
use ttrace_format::store::Blob;
use ttrace_format::wire::ClientMsg;
use ttraced::test_client::{bf16_pattern, hello, TestClient};

#[derive(Parser)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Publish GEMM records as one traced process.
    Publish {
        /// The daemon's socket [default: $TTRACE_SOCKET].
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Global rank [default: $RANK, else 0].
        #[arg(long)]
        rank: Option<u32>,
        /// [default: $WORLD_SIZE, else 1]
        #[arg(long)]
        world_size: Option<u32>,
        /// Records to publish (0 with --hang: publish until killed).
        #[arg(long, default_value_t = 20)]
        records: u64,
        /// Records per step.
        #[arg(long, default_value_t = 10)]
        per_step: u64,
        /// BF16 elements per tensor.
        #[arg(long, default_value_t = 4096)]
        elems: usize,
        /// After publishing (and the daemon releasing everything), wait to be killed instead of
        /// saying goodbye.
        #[arg(long)]
        hang: bool,
    },
    /// Measure capture throughput and compression.
    Bench {
        /// Bytes pushed through the capture path, in MiB.
        #[arg(long, default_value_t = 2048)]
        total_mib: u64,
        /// Bytes per tensor, in MiB (a record carries --per-record tensors).
        #[arg(long, default_value_t = 8)]
        tensor_mib: u64,
        #[arg(long, default_value_t = 3)]
        per_record: usize,
        /// zstd level.
        #[arg(long, default_value_t = ttraced::DEFAULT_LEVEL, allow_negative_numbers = true)]
        level: i32,
        /// Compression threads of the daemon.
        #[arg(long, default_value_t = ttraced::default_threads())]
        threads: usize,
        /// Ring size in MiB.
        #[arg(long, default_value_t = 256)]
        ring_mib: u64,
        /// The daemon compresses tensors larger than this (KiB) in pieces on several threads
        /// at once; 0: each tensor whole on one thread (as before format 1.4).
        #[arg(long, default_value_t = ttraced::DEFAULT_PIECE_BYTES >> 10)]
        piece_kib: u64,
        /// Element type of the activations: bf16 or f32.
        #[arg(long, default_value = "bf16")]
        dtype: String,
        /// Where the store goes (removed afterwards) [default: the temp directory].
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Only the end-to-end run (no memcpy baseline, no compression comparison): for
        /// profiling the capture path alone.
        #[arg(long)]
        e2e_only: bool,
    },
}

fn main() -> anyhow::Result<()> {
    match Args::parse().cmd {
        Cmd::Publish {
            socket,
            rank,
            world_size,
            records,
            per_step,
            elems,
            hang,
        } => {
            let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse().ok());
            publish(
                socket,
                rank.or_else(|| env("RANK")).unwrap_or(0),
                world_size.or_else(|| env("WORLD_SIZE")).unwrap_or(1),
                records,
                per_step,
                elems,
                hang,
            )
        }
        Cmd::Bench {
            total_mib,
            tensor_mib,
            per_record,
            level,
            threads,
            ring_mib,
            piece_kib,
            dtype,
            dir,
            e2e_only,
        } => bench(BenchArgs {
            total: total_mib << 20,
            tensor: tensor_mib << 20,
            per_record,
            level,
            threads,
            ring: ring_mib << 20,
            piece: piece_kib,
            dtype: match dtype.as_str() {
                "bf16" => DType::BF16,
                "f32" => DType::F32,
                other => anyhow::bail!("--dtype {other}: bf16 or f32"),
            },
            dir,
            e2e_only,
        }),
    }
}

/// A GEMM record of rank/step/seq whose captured tensors (A, B, D) have these bytes.
fn gemm_record(rank: u32, step: u64, seq: u64, dtype: DType, data: &[&[u8]]) -> Record {
    let tensors = data
        .iter()
        .zip([Role::A, Role::B, Role::D].into_iter().cycle())
        .map(|(d, role)| {
            let shape = vec![(d.len() / dtype.size()) as u64];
            Tensor {
                role,
                dtype,
                strides: packed_strides(&shape),
                shape,
                ptr: 0x7f00_0000_0000 + seq * 0x1000,
                nbytes: d.len() as u64,
                captured: true,
                crc32: crc32fast::hash(d),
            }
        })
        .collect();
    Record {
        rank,
        step,
        seq,
        api: "cublasGemmEx".into(),
        op: Op::Gemm(Box::new(GemmOp::plain(64, 64, 64, 14))),
        stream: 0,
        device: 0,
        thread: 1,
        nvtx: vec![],
        kernels_before: vec![],
        tensors,
        t_call_ns: 0,
        t_done_ns: 0,
    }
}

/// The bytes `loadgen publish` sends as tensor `t` of record `seq` of `rank` (tests rebuild
/// them to compare).
pub fn publish_bytes(rank: u32, seq: u64, t: u64, elems: usize) -> Vec<u8> {
    bf16_pattern(elems, (rank as u64) << 40 | seq << 2 | t)
}

fn publish(
    socket: Option<PathBuf>,
    rank: u32,
    world_size: u32,
    records: u64,
    per_step: u64,
    elems: usize,
    hang: bool,
) -> anyhow::Result<()> {
    let socket = socket
        .or_else(|| std::env::var_os("TTRACE_SOCKET").map(PathBuf::from))
        .context("no --socket and no TTRACE_SOCKET")?;
    let mut c = TestClient::connect(&socket, hello(rank, world_size, 4 << 20))
        .with_context(|| format!("connecting to {}", socket.display()))?;
    let mut stdout = std::io::stdout();
    let mut seq_all = 0u64;
    loop {
        let seq = seq_all % per_step.max(1);
        let step = seq_all / per_step.max(1);
        let a = publish_bytes(rank, seq_all, 0, elems);
        let d = publish_bytes(rank, seq_all, 1, elems);
        let mut rec = gemm_record(rank, step, seq, DType::BF16, &[&a, &d]);
        rec.t_call_ns = seq_all;
        c.publish(rec, &[&a, &d])?;
        seq_all += 1;
        if records > 0 && seq_all == records {
            break;
        }
        if seq_all.is_multiple_of(50) {
            // Crash tests wait for this line before killing us mid-stream.
            writeln!(stdout, "published {seq_all}")?;
            stdout.flush()?;
        }
    }
    if !c.wait_drained(Duration::from_secs(30)) {
        anyhow::bail!("the daemon did not release the ring");
    }
    writeln!(stdout, "published {seq_all}")?;
    stdout.flush()?;
    if hang {
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    c.bye(seq_all, 0)?;
    Ok(())
}

struct BenchArgs {
    total: u64,
    tensor: u64,
    per_record: usize,
    level: i32,
    threads: usize,
    ring: u64,
    /// KiB.
    piece: u64,
    dtype: DType,
    dir: Option<PathBuf>,
    e2e_only: bool,
}

/// Activations drawn from normal distributions of varied scale, as `dtype` bytes.
fn activations(bytes: usize, dtype: DType, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut uniform = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let n = bytes / dtype.size();
    let mut out = Vec::with_capacity(bytes);
    // One scale per 1 MiB chunk (layers and tensors differ in magnitude).
    let mut sigma = 1.0f64;
    for i in 0..n {
        if i % (1 << 19) == 0 {
            sigma = 10f64.powf(uniform() * 3.0 - 2.0); // 0.01 .. 10
        }
        // Box–Muller.
        let v =
            sigma * (-2.0 * uniform().ln()).sqrt() * (2.0 * std::f64::consts::PI * uniform()).cos();
        match dtype {
            DType::BF16 => out.extend(half::bf16::from_f64(v).to_le_bytes()),
            _ => out.extend((v as f32).to_le_bytes()),
        }
    }
    out
}

fn gbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

/// CPU time of this process (all threads) and of the calling thread.
fn cpu_times() -> (Duration, Duration) {
    use rustix::time::{clock_gettime, ClockId};
    let get = |clock| {
        let ts = clock_gettime(clock);
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    };
    (get(ClockId::ProcessCPUTime), get(ClockId::ThreadCPUTime))
}

/// CPU seconds the whole machine spent busy so far (all cores, `/proc/stat`).
fn machine_busy() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu: Vec<f64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...: all but idle and iowait.
    let busy: f64 = cpu
        .iter()
        .take(8)
        .enumerate()
        .filter(|&(i, _)| i != 3 && i != 4)
        .map(|(_, v)| v)
        .sum();
    let hz = rustix::param::clock_ticks_per_second();
    Some(busy / hz.max(1) as f64)
}

/// One compression on this thread: (ratio, MB per CPU-second).
fn measure(raw: &[u8], f: impl FnOnce(&[u8]) -> usize) -> (f64, f64) {
    let t = cpu_times().1;
    let stored = f(raw);
    let d = cpu_times().1 - t;
    (
        raw.len() as f64 / stored.max(1) as f64,
        raw.len() as f64 / d.as_secs_f64() / 1e6,
    )
}

fn bench(a: BenchArgs) -> anyhow::Result<()> {
    let load = Load::generate(&a);
    let memcpy = time_memcpy(&load, a.ring);
    let run = capture_end_to_end(&a, &load)?;
    print_end_to_end(&a, &load, memcpy, &run);
    print_goals(&a, &load, &run);
    if a.e2e_only {
        return Ok(());
    }
    compare_compression(&a, &load.pool);
    Ok(())
}

/// The tensors the benchmark pushes: `records` records of `per_record` tensors of `tensor`
/// bytes each, cut round-robin from one pool of generated activations.
struct Load {
    pool: Vec<u8>,
    tensor: u64,
    per_record: usize,
    records: u64,
    /// Bytes pushed in all.
    total: u64,
}

impl Load {
    fn generate(a: &BenchArgs) -> Load {
        let pool_bytes = (a.tensor as usize * a.per_record * 4)
            .min(a.total as usize)
            .max(1 << 20);
        eprintln!(
            "generating {} MiB of {} activations ...",
            pool_bytes >> 20,
            a.dtype.name()
        );
        let records = (a.total / (a.tensor * a.per_record as u64)).max(1);
        Load {
            pool: activations(pool_bytes, a.dtype, 42),
            tensor: a.tensor,
            per_record: a.per_record,
            records,
            total: records * a.tensor * a.per_record as u64,
        }
    }

    /// The bytes of tensor `i` (counted over all records).
    fn chunk(&self, i: u64) -> &[u8] {
        let slots = (self.pool.len() as u64 / self.tensor).max(1);
        let off = ((i % slots) * self.tensor) as usize;
        &self.pool[off..off + self.tensor as usize]
    }

    /// The bytes of tensor `j` of record `r`.
    fn tensor_of(&self, r: u64, j: usize) -> &[u8] {
        self.chunk(r * self.per_record as u64 + j as u64)
    }
}

/// The baseline: a plain memcpy of the same bytes into a ring-sized buffer.
fn time_memcpy(load: &Load, ring: u64) -> Duration {
    let mut dst = vec![0u8; ring as usize];
    dst.iter_mut().step_by(4096).for_each(|b| *b = 1); // fault the pages in first
    let t = Instant::now();
    let mut at = 0usize;
    for i in 0..load.records * load.per_record as u64 {
        let src = load.chunk(i);
        if at + src.len() > dst.len() {
            at = 0;
        }
        dst[at..at + src.len()].copy_from_slice(src);
        at += src.len();
    }
    let elapsed = t.elapsed();
    std::hint::black_box(&dst);
    elapsed
}

/// What the end-to-end run measured.
struct EndToEnd {
    elapsed: Duration,
    summary: ttraced::Summary,
    /// CPU seconds of this process (daemon and producer) per GB captured.
    cpu_all: f64,
    /// CPU seconds of the producer thread per GB captured.
    cpu_producer: f64,
    /// Cores the rest of the machine kept busy meanwhile, when /proc/stat is readable.
    others: Option<f64>,
}

/// End to end: producer -> ring -> daemon (crc check, shuffle + zstd, segment) -> disk.
fn capture_end_to_end(a: &BenchArgs, load: &Load) -> anyhow::Result<EndToEnd> {
    let base = a.dir.clone().unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("ttrace-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut cfg = ttraced::Config::new(dir.join("sock/s"), dir.join("store"));
    cfg.level = a.level;
    cfg.threads = a.threads;
    cfg.piece_bytes = a.piece << 10;
    let h = ttraced::Daemon::start(cfg)?;
    let mut c = TestClient::connect(h.socket(), hello(0, 1, a.ring))?;
    c.wait = Duration::from_secs(60);
    let (cpu0, thread0) = cpu_times();
    let busy0 = machine_busy();
    let t = Instant::now();
    publish_load(&mut c, load, a.dtype)?;
    c.bye(load.records, 0)?;
    let summary = h.finalize(Some(0), Duration::from_secs(60))?;
    let elapsed = t.elapsed();
    let (cpu1, thread1) = cpu_times();
    let busy1 = machine_busy();
    let _ = std::fs::remove_dir_all(&dir);
    let gb = load.total as f64 / 1e9;
    // Whatever else ran meanwhile (other processes, kernel threads such as write-back).
    let others = busy0
        .zip(busy1)
        .map(|(b0, b1)| ((b1 - b0) - (cpu1 - cpu0).as_secs_f64()).max(0.0) / elapsed.as_secs_f64());
    Ok(EndToEnd {
        elapsed,
        summary,
        cpu_all: (cpu1 - cpu0).as_secs_f64() / gb,
        cpu_producer: (thread1 - thread0).as_secs_f64() / gb,
        others,
    })
}

/// The producer's side: each record's tensors copied into a ring slot, then published.
fn publish_load(c: &mut TestClient, load: &Load, dtype: DType) -> anyhow::Result<()> {
    let sizes = vec![load.tensor; load.per_record];
    let (offsets, _) = ring::tensor_offsets(&sizes);
    for r in 0..load.records {
        let slot = c.reserve(&sizes)?;
        {
            let bytes = c.slot_bytes(&slot);
            for (j, &off) in offsets.iter().enumerate() {
                let src = load.tensor_of(r, j);
                // The copy a GPU's DMA engine would make.
                bytes[off as usize..off as usize + src.len()].copy_from_slice(src);
            }
        }
        let datas: Vec<&[u8]> = (0..load.per_record).map(|j| load.tensor_of(r, j)).collect();
        // gemm_record computes each tensor's CRC-32, as the tracer thread does.
        let rec = gemm_record(0, r / 64, r % 64, dtype, &datas);
        c.send(&ClientMsg::Publish {
            record: Box::new(rec),
            slot: Some(slot),
        })?;
    }
    Ok(())
}

fn print_end_to_end(a: &BenchArgs, load: &Load, memcpy: Duration, run: &EndToEnd) {
    let cores = ttraced::default_threads() as f64;
    let total = load.total;
    let s = &run.summary;
    println!(
        "capture benchmark: {} activations (normal, sigma 0.01-10), {} records x {} tensors x {} MiB = {} MiB; zstd level {}, {} daemon threads, {} cores",
        a.dtype.name(),
        load.records,
        a.per_record,
        a.tensor >> 20,
        total >> 20,
        a.level,
        a.threads,
        cores
    );
    println!("end to end (producer copy + crc -> ring -> ttraced: crc check, shuffle + zstd -> segment files):");
    println!(
        "  memcpy of the same bytes       {:>7.2} GB/s",
        gbps(total, memcpy)
    );
    println!(
        "  capture into the store         {:>7.2} GB/s   = {:.3}x memcpy; stored ratio {:.3}x; {} records, {} crc mismatches",
        gbps(total, run.elapsed),
        memcpy.as_secs_f64() / run.elapsed.as_secs_f64(),
        s.bytes_raw as f64 / s.bytes_stored.max(1) as f64,
        s.records,
        s.crc_mismatches
    );
    let (cpu_all, cpu_producer) = (run.cpu_all, run.cpu_producer);
    println!(
        "  CPU per GB captured            {cpu_all:>7.2} s    (producer {cpu_producer:.2} s, of which the copy a GPU would do by DMA)"
    );
    if let Some(others) = run.others {
        println!(
            "  other CPU use during the run   {others:>7.2} cores (load average {})",
            std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .split(' ')
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    println!(
        "  => ceiling on {cores} idle cores     {:>7.2} GB/s   (daemon only, as with a GPU: {:.2} GB/s)",
        cores / cpu_all,
        cores / (cpu_all - cpu_producer).max(1e-9)
    );
}

/// The capture path's goals (1 GB/s end to end, BF16 activations stored 1.2x smaller), met
/// or not by this run.
fn print_goals(a: &BenchArgs, load: &Load, run: &EndToEnd) {
    let e2e_gbps = gbps(load.total, run.elapsed);
    let ratio = run.summary.bytes_raw as f64 / run.summary.bytes_stored.max(1) as f64;
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    println!("capture goals:");
    println!(
        "  >= 1 GB/s end to end           {e2e_gbps:>7.2} GB/s   {} (wall clock on this machine, shared with whatever else runs)",
        verdict(e2e_gbps >= 1.0)
    );
    if a.dtype == DType::BF16 {
        println!(
            "  BF16 activations >= 1.2x       {ratio:>7.3}x       {}",
            verdict(ratio >= 1.2)
        );
    }
}

/// Compression alone, one thread, CPU time, on a sample: plain zstd, the store's blob
/// encoding and the daemon's encoder at several levels, and CRC-32.
fn compare_compression(a: &BenchArgs, pool: &[u8]) {
    let sample = &pool[..pool.len().min(64 << 20)];
    let elem = a.dtype.size();
    println!(
        "compression alone, one thread, {} MiB sample (ratio, MB per CPU-second):",
        sample.len() >> 20
    );
    let show =
        |name: String, (r, mbps): (f64, f64)| println!("  {name:40} {r:>6.3}x {mbps:>7.0} MB/s");
    for level in [a.level, 1, 3] {
        show(
            format!("plain zstd level {level} (no shuffle)"),
            measure(sample, |raw| {
                zstd::bulk::compress(raw, level).map_or(raw.len(), |v| v.len())
            }),
        );
    }
    show(
        "format Blob::encode level 1 (shuffle+zstd)".into(),
        measure(sample, |raw| {
            Blob::encode(raw, elem, 1, &mut Vec::new()).map_or(raw.len(), |b| b.stored.len())
        }),
    );
    let mut levels = vec![a.level, 3, 1, -10, -100, -1000];
    levels.dedup();
    for level in levels {
        let mut enc = ttraced::Encoder::new(level);
        let _ = enc.encode(&sample[..1 << 20], elem); // warm the context
        show(
            format!(
                "ttraced encoder level {level}{}",
                if level == a.level { " (this run)" } else { "" }
            ),
            measure(sample, |raw| {
                enc.encode(raw, elem).map_or(raw.len(), |b| b.stored.len())
            }),
        );
    }
    let t = cpu_times().1;
    std::hint::black_box(crc32fast::hash(sample));
    let d = cpu_times().1 - t;
    println!(
        "  crc32                                     {:>7.0} MB/s",
        sample.len() as f64 / d.as_secs_f64() / 1e6
    );
}
