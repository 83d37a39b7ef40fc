//! Block scales of MXFP8 / NVFP4 GEMM operands (cuBLASLt `VEC32_UE8M0`, `VEC16_UE4M3`): one
//! scale per `block` consecutive values along K, for each row of the operand's outer dimension
//! (M for A, N for B), stored in cuBLASLt's tiled layout: the `outer x ceil(K/block)` scale
//! matrix padded to 128 rows and 4 columns and cut into 128x4 tiles of 512 bytes, tiles in
//! row-major order, and inside a tile, row `r` and column `c` at `(r % 32) * 16 + (r / 32) * 4
//! + c` (32 groups of 16 bytes, each holding 4 rows' 4 scales).

use crate::dtype::DType;
use crate::record::GemmOp;
use crate::tensor::element_f64;

/// Values per scale: 32 for `VEC32_UE8M0` (mode 2), 16 for `VEC16_UE4M3` (mode 1).
pub fn block_of(mode: u32) -> Option<u64> {
    match mode {
        1 => Some(16),
        2 => Some(32),
        _ => None,
    }
}

/// Bytes of the scales of an operand with `outer` rows and `k` values along K.
pub fn scale_bytes(outer: u64, k: u64, block: u64) -> u64 {
    let up = |v: u64, m: u64| v.div_ceil(m) * m;
    up(outer, 128) * up(k.div_ceil(block), 4)
}

/// Where the scale of row `row`, K-block `kb` is, in an operand whose scales have
/// `k_blocks` columns.
pub fn offset(row: u64, kb: u64, k_blocks: u64) -> u64 {
    let tiles_per_row = k_blocks.div_ceil(4);
    let tile = (row / 128) * tiles_per_row + kb / 4;
    tile * 512 + (row % 32) * 16 + ((row % 128) / 32) * 4 + kb % 4
}

/// Multiplies `values` (an operand as `outer` rows of `k` values, K contiguous: row `i` at
/// `i * k`) by their block scales (`scales`, of `dtype` `F8_E8M0` or `F8_E4M3` for UE4M3, in
/// the tiled layout). `false` (nothing changed) when the scales are too short or of another
/// type.
pub fn apply(
    values: &mut [f32],
    outer: u64,
    k: u64,
    block: u64,
    scales: &[u8],
    dtype: DType,
) -> bool {
    let k_blocks = k.div_ceil(block);
    let fits = scales.len() as u64 >= scale_bytes(outer, k, block)
        && values.len() as u64 == outer * k
        && matches!(dtype, DType::F8_E8M0 | DType::F8_E4M3);
    if !fits {
        return false;
    }
    for row in 0..outer {
        for kb in 0..k_blocks {
            let at = offset(row, kb, k_blocks) as usize;
            let s = element_f64(dtype, scales, at).unwrap_or(f64::NAN) as f32;
            let from = (row * k + kb * block) as usize;
            let to = (row * k + ((kb + 1) * block).min(k)) as usize;
            values[from..to].iter_mut().for_each(|v| *v *= s);
        }
    }
    true
}

/// Dequantizes a block-scaled GEMM operand in place: `values` are the stored A (`is_a`) or B
/// of `g` decoded, `scales` its `BlockScaleA`/`BlockScaleB` bytes of `dtype` (`F8_E8M0`: 32
/// values per scale, `F8_E4M3` (UE4M3): 16). Only K-contiguous operands (A transposed, B not:
/// the layout cuBLASLt's block scaling takes) of one batch entry; `false` otherwise.
pub fn dequantize_operand(
    values: &mut [f32],
    g: &GemmOp,
    is_a: bool,
    scales: &[u8],
    dtype: DType,
) -> bool {
    let block = match dtype {
        DType::F8_E8M0 => 32,
        DType::F8_E4M3 => 16,
        _ => return false,
    };
    let (k_contiguous, outer) = if is_a {
        (g.transa != 0, g.m)
    } else {
        (g.transb == 0, g.n)
    };
    k_contiguous && g.batch == 1 && apply(values, outer, g.k, block, scales, dtype)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scale_of_a_padded_operand_has_its_own_place() {
        // 200 rows (two row tiles), 9 K-blocks (three column tiles).
        let (outer, k, block) = (200u64, 9u64 * 32 - 5, 32u64);
        let kb = k.div_ceil(block);
        let total = scale_bytes(outer, k, block);
        assert_eq!(total, 256 * 12);
        let mut seen = vec![false; total as usize];
        for r in 0..outer {
            for c in 0..kb {
                let o = offset(r, c, kb) as usize;
                assert!(o < seen.len() && !seen[o], "row {r} block {c}");
                seen[o] = true;
            }
        }
        // Row 33, block 2 of the first tile: group 1, slot 1.
        assert_eq!(offset(33, 2, kb), 16 + 4 + 2);
        // Row 130 starts the second row of tiles, three tiles on.
        assert_eq!(offset(130, 5, kb), (3 + 1) * 512 + 2 * 16 + 1);
    }

    #[test]
    fn scales_multiply_their_own_block() {
        let (outer, k, block) = (2u64, 40u64, 32u64);
        let mut scales = vec![127u8; scale_bytes(outer, k, block) as usize];
        scales[offset(0, 1, 2) as usize] = 129; // 4.0
        scales[offset(1, 0, 2) as usize] = 126; // 0.5
        let mut v = vec![1.0f32; 80];
        assert!(apply(&mut v, outer, k, block, &scales, DType::F8_E8M0));
        assert!(v[..32].iter().all(|&x| x == 1.0));
        assert!(v[32..40].iter().all(|&x| x == 4.0));
        assert!(v[40..72].iter().all(|&x| x == 0.5));
        assert!(v[72..].iter().all(|&x| x == 1.0));
        assert!(!apply(
            &mut v,
            outer,
            k,
            block,
            &scales[..10],
            DType::F8_E8M0
        ));
    }
}
