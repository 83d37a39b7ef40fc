//! Speed of the simulated GEMM engine, as a ratio to a plain triple loop over the same f32
//! operands in the same process (the engine also converts types, honours layouts and fixes the
//! accumulation order, so the ratio says what that costs or saves).
//!
//! `cargo bench -p sim-kernels --bench gemm`

use std::time::Instant;

use sim_kernels::dtype::DType;
use sim_kernels::gemm::{gemm, Buffers, CInput, Compute, Gemm};

fn operand(t: DType, count: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let mut x = seed | 1;
    let mut bytes = vec![0u8; count * t.size()];
    let mut vals = Vec::with_capacity(count);
    for i in 0..count {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let v = t.round(((x >> 40) as f64 / (1u64 << 24) as f64) - 0.5);
        t.store(&mut bytes, i, v);
        vals.push(v as f32);
    }
    (bytes, vals)
}

/// Column-major `D = A·B` with a naive loop: the baseline.
fn naive(m: usize, n: usize, k: usize, a: &[f32], b: &[f32], d: &mut [f32]) {
    for j in 0..n {
        for i in 0..m {
            let mut acc = 0f32;
            for p in 0..k {
                acc += a[p * m + i] * b[j * k + p];
            }
            d[j * m + i] = acc;
        }
    }
}

fn best_of<F: FnMut()>(reps: usize, mut f: F) -> f64 {
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    println!("shape            dtype  engine GFLOP/s  naive GFLOP/s  engine/naive");
    for (m, n, k, t) in [
        (256, 256, 256, DType::F32),
        (512, 512, 512, DType::BF16),
        (64, 64, 4096, DType::BF16),
        (128, 512, 64, DType::BF16),
    ] {
        let g = Gemm::simple(m, n, k, t, DType::F32, Compute::F32);
        let (a, af) = operand(t, m * k, 1);
        let (b, bf) = operand(t, k * n, 2);
        let mut d = vec![0u8; g.d_bytes()];
        let engine = best_of(3, || {
            let bufs = Buffers {
                a: &a,
                b: &b,
                c: CInput::None,
                d: &mut d,
                bias: None,
                aux: None,
                bgrad: None,
            };
            gemm(&g, bufs).expect("the benchmark's GEMM is valid");
        });
        let mut df = vec![0f32; m * n];
        let base = best_of(3, || naive(m, n, k, &af, &bf, &mut df));
        let flop = 2.0 * (m * n * k) as f64;
        println!(
            "{:<16} {:<6} {:>14.2} {:>14.2} {:>13.2}",
            format!("{m}x{n}x{k}"),
            format!("{t:?}"),
            flop / engine / 1e9,
            flop / base / 1e9,
            base / engine
        );
    }
}
