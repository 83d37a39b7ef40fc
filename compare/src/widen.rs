//! Stored tensor bytes widened to `f32`, whole ([`to_f32_into`]) or block by block as they
//! are decoded ([`F32Widening`]): exact for every float type but F64 (rounded), NaNs made
//! quiet as `half` makes them.

use ttrace_format::dtype::DType;
use ttrace_format::tensor::widen_f32_into;

use crate::CompareError;

/// Decodes packed little-endian `bytes` of `dtype` to `f32` (exact for every float type but
/// F64, which is rounded).
pub fn to_f32(dtype: DType, bytes: &[u8]) -> Result<Vec<f32>, CompareError> {
    let mut out = Vec::new();
    to_f32_into(dtype, bytes, &mut out)?;
    Ok(out)
}

/// [`to_f32`] into `out` (cleared first, its capacity reused).
pub fn to_f32_into(dtype: DType, bytes: &[u8], out: &mut Vec<f32>) -> Result<(), CompareError> {
    out.clear();
    if dtype == DType::F64 {
        out.extend(
            bytes
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f32),
        );
        return Ok(());
    }
    // The common types straight to f32, in one pass (exact, as widening is).
    if let Some(size) = direct_size(dtype) {
        if bytes.len().is_multiple_of(size) {
            widen_direct(dtype, bytes, out);
            return Ok(());
        }
    }
    let mut wide = Vec::new();
    widen_f32_into(dtype, bytes, &mut wide).map_err(|e| CompareError::Record(e.to_string()))?;
    out.extend(
        wide.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
    );
    Ok(())
}

/// The element size of the types [`to_f32_into`] widens in one pass ([`widen_direct`]).
fn direct_size(dtype: DType) -> Option<usize> {
    match dtype {
        DType::F32 => Some(4),
        DType::BF16 | DType::F16 => Some(2),
        _ => None,
    }
}

/// Appends the f32 values of `bytes`, whole elements of a type of [`direct_size`]. Written
/// as loops over the vector's spare capacity, which the compiler vectorizes: through `extend`
/// it called a closure per element, and filling the new values with zeros first cost as much
/// as widening them.
fn widen_direct(dtype: DType, bytes: &[u8], out: &mut Vec<f32>) {
    let Some(size) = direct_size(dtype) else {
        return;
    };
    let n = bytes.len() / size;
    out.reserve(n);
    let new = &mut out.spare_capacity_mut()[..n];
    match dtype {
        DType::F32 => {
            for (o, c) in new.iter_mut().zip(bytes.chunks_exact(4)) {
                o.write(f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
            }
        }
        DType::BF16 => crate::simd::widen_bf16(bytes, new),
        _ => {
            for (o, c) in new.iter_mut().zip(bytes.chunks_exact(2)) {
                o.write(half::f16::from_le_bytes([c[0], c[1]]).to_f32());
            }
        }
    }
    let len = out.len() + n;
    // SAFETY: the `n` values after the old length were all written just above (`bytes` holds
    // `n` whole elements, so the zip ran over all of `new`), and `reserve` made the room.
    unsafe { out.set_len(len) };
}

/// Bytes handed over block by block ([`ttrace_format::reader::RecordView::tensor_blocks`]),
/// regrouped into runs of whole elements: an element cut by a block's end is completed with
/// the next block's first bytes.
pub struct WholeElements {
    size: usize,
    /// The start of an element cut by the last block's end.
    carry: Vec<u8>,
}

impl WholeElements {
    /// Elements of `size` bytes (at least 1).
    pub fn new(size: usize) -> WholeElements {
        WholeElements {
            size: size.max(1),
            carry: Vec::new(),
        }
    }

    /// Hands `run` every whole element of the next `bytes`, in one or two runs.
    pub fn push(&mut self, mut bytes: &[u8], run: &mut impl FnMut(&[u8])) {
        let size = self.size;
        if !self.carry.is_empty() {
            let take = (size - self.carry.len()).min(bytes.len());
            self.carry.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.carry.len() < size {
                return;
            }
            run(&self.carry);
            self.carry.clear();
        }
        let whole = bytes.len() / size * size;
        if whole > 0 {
            run(&bytes[..whole]);
        }
        self.carry.extend_from_slice(&bytes[whole..]);
    }

    /// Bytes of a last element left incomplete (empty when the bytes ended on an element).
    pub fn torn(&self) -> usize {
        self.carry.len()
    }
}

/// A tensor's values widened to f32 block by block as its bytes are decoded
/// ([`ttrace_format::reader::RecordView::tensor_blocks`]): [`to_f32_into`]'s values, without
/// the tensor's bytes in one buffer first. Types other than F32, BF16 and F16 are gathered
/// and widened whole at [`F32Widening::finish`].
pub struct F32Widening<'a> {
    dtype: DType,
    out: &'a mut Vec<f32>,
    pending: Pending,
}

/// What [`F32Widening`] holds between blocks.
enum Pending {
    /// A type widened as it comes ([`direct_size`]).
    Direct(WholeElements),
    /// Every byte, for the other types.
    Gathered(Vec<u8>),
}

impl<'a> F32Widening<'a> {
    /// Widening into `out` (cleared; its capacity is kept).
    pub fn new(dtype: DType, out: &'a mut Vec<f32>) -> F32Widening<'a> {
        out.clear();
        let pending = match direct_size(dtype) {
            Some(size) => Pending::Direct(WholeElements::new(size)),
            None => Pending::Gathered(Vec::new()),
        };
        F32Widening {
            dtype,
            out,
            pending,
        }
    }

    /// The next bytes of the tensor.
    pub fn push(&mut self, bytes: &[u8]) {
        match &mut self.pending {
            Pending::Direct(elements) => {
                let (dtype, out) = (self.dtype, &mut *self.out);
                elements.push(bytes, &mut |run| widen_direct(dtype, run, out));
            }
            Pending::Gathered(all) => all.extend_from_slice(bytes),
        }
    }

    /// Every byte was pushed: the values are in `out`.
    pub fn finish(self) -> Result<(), CompareError> {
        match self.pending {
            Pending::Gathered(all) => to_f32_into(self.dtype, &all, self.out),
            Pending::Direct(elements) if elements.torn() == 0 => Ok(()),
            Pending::Direct(elements) => Err(CompareError::Record(format!(
                "{:?} bytes end in a partial element ({} of {} bytes)",
                self.dtype,
                elements.torn(),
                elements.size
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoding_to_f32_is_exact_for_every_float_type() {
        // Every bit pattern of the 8- and 16-bit types, and a few f32 values.
        for (dtype, bytes) in &float_patterns() {
            let (dtype, bytes) = (*dtype, bytes.as_slice());
            let mut wide = Vec::new();
            widen_f32_into(dtype, bytes, &mut wide).expect("widens");
            let want: Vec<u32> = wide
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let got: Vec<u32> = to_f32(dtype, bytes)
                .expect("decodes")
                .iter()
                .map(|v| v.to_bits())
                .collect();
            assert!(got == want, "{dtype:?} decodes otherwise than it widens");
        }
        assert!(
            to_f32(DType::BF16, &[0]).is_err(),
            "a torn element is an error"
        );
    }

    /// Every bit pattern of the 8- and 16-bit float types, and f32 values (special ones, then
    /// a ramp), as stored bytes.
    fn float_patterns() -> Vec<(DType, Vec<u8>)> {
        let every16: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
        let specials = [0.0f32, -0.0, 1.0, -2.5, 1e-40, f32::INFINITY, f32::NAN];
        let ramp = (0..5000u32).map(|i| i as f32 * 0.37 - 900.0);
        let f32s: Vec<u8> = specials
            .into_iter()
            .chain(ramp)
            .flat_map(f32::to_le_bytes)
            .collect();
        vec![
            (DType::F32, f32s),
            (DType::BF16, every16.clone()),
            (DType::F16, every16),
            (DType::F8_E4M3, (0..=u8::MAX).collect()),
        ]
    }

    /// Widening block by block gives the values of widening the whole, however the bytes are
    /// cut into blocks (an element split across two blocks too), for every float type.
    #[test]
    fn widening_by_blocks_gives_the_values_of_the_whole_wherever_the_blocks_end() {
        for (dtype, bytes) in &float_patterns() {
            let (dtype, bytes) = (*dtype, bytes.as_slice());
            let want: Vec<u32> = to_f32(dtype, bytes)
                .expect("decodes")
                .iter()
                .map(|v| v.to_bits())
                .collect();
            for block in [1, 3, 4, 7, 1000, 4096, bytes.len()] {
                let mut out = vec![1.0f32; 3]; // cleared first
                let mut wide = F32Widening::new(dtype, &mut out);
                bytes.chunks(block).for_each(|b| wide.push(b));
                wide.finish().expect("whole elements");
                let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
                assert!(got == want, "{dtype:?} in blocks of {block}");
            }
        }
        let mut out = Vec::new();
        let mut torn = F32Widening::new(DType::BF16, &mut out);
        torn.push(&[0, 0x3f, 0]);
        assert!(torn.finish().is_err(), "a torn element is an error");
    }

    /// Whole elements come out in order and whole, wherever the blocks cut them.
    #[test]
    fn elements_cut_by_a_block_end_are_whole_again() {
        let bytes: Vec<u8> = (0..60u8).collect();
        for size in [1, 2, 3, 4, 7] {
            for block in [1, 2, 5, 6, 13, 60] {
                let mut elements = WholeElements::new(size);
                let mut runs: Vec<Vec<u8>> = Vec::new();
                for b in bytes.chunks(block) {
                    elements.push(b, &mut |run| runs.push(run.to_vec()));
                }
                assert!(runs.iter().all(|r| !r.is_empty() && r.len() % size == 0));
                let whole = bytes.len() / size * size;
                assert_eq!(
                    runs.concat(),
                    bytes[..whole],
                    "size {size}, blocks of {block}"
                );
                assert_eq!(elements.torn(), bytes.len() - whole);
            }
        }
    }
}
