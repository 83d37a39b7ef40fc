//! The first NaN or Inf: in which op, on which rank, and whether it came in through the op's
//! inputs or was produced by it.

use std::collections::HashMap;

use serde::Serialize;
use ttrace_format::codec::Codec;
use ttrace_format::dedup::BlobReference;
use ttrace_format::dtype::DType;
use ttrace_format::reader::RecordView;
use ttrace_format::record::{Op, Role};
use ttrace_format::tensor::TensorData;
use ttrace_format::FormatError;

use crate::check::report::{Finding, FindingKind};

/// Where a non-finite value first appeared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// An input of the op already held it (it was made by work the tracer does not see, e.g.
    /// an elementwise kernel, or by an op that was not captured).
    Inputs,
    /// Every input was finite; the op produced it.
    Produced,
}

/// The first non-finite value of a rank.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NonFinite {
    pub rank: u32,
    pub step: u64,
    pub seq: u64,
    pub api: String,
    /// NVTX ranges open at the call, outermost first.
    pub nvtx: Vec<String>,
    pub t_call_ns: u64,
    pub origin: Origin,
    /// The tensor holding it (`A`, `Input`, `D`, ...).
    pub role: String,
    /// Element index, and the value (`NaN`, `inf`, `-inf`).
    pub index: u64,
    pub value: String,
    /// How many elements of that tensor are not finite.
    pub count: u64,
}

impl NonFinite {
    /// Whether a collective's output holds it while its own inputs are finite: it most likely
    /// came from another member's input.
    pub fn via_collective(&self) -> bool {
        self.origin == Origin::Produced && self.api.starts_with("nccl")
    }

    /// The finding it makes.
    pub fn to_finding(&self) -> Finding {
        let how = match self.origin {
            Origin::Inputs => "came in through the op's input",
            Origin::Produced if self.via_collective() => {
                "arrived through the collective (this rank's input is finite) in"
            }
            Origin::Produced => "was produced by the op (its inputs are finite) in",
        };
        Finding {
            kind: FindingKind::NonFinite,
            step: self.step,
            ranks: vec![self.rank],
            op: format!(
                "rank {} step {} seq {} {}",
                self.rank, self.step, self.seq, self.api
            ),
            module: self.nvtx.last().cloned().unwrap_or_default(),
            detail: format!(
                "first non-finite value: {} at element {} of {} ({} non-finite); it {how} {}",
                self.value, self.index, self.role, self.count, self.role
            ),
        }
    }
}

/// Whether a role is read by the op (as opposed to written).
fn is_input(role: Role) -> bool {
    !matches!(role, Role::D | Role::Aux | Role::Output | Role::AmaxD)
}

/// The exponent bits of each float type read by its bits ([`first_bad`]): all of them set,
/// the value is infinite or NaN.
const BF16_EXPONENT: u16 = 0x7f80;
const F16_EXPONENT: u16 = 0x7c00;
const F32_EXPONENT: u32 = 0x7f80_0000;
const F64_EXPONENT: u64 = 0x7ff0_0000_0000_0000;

/// What a scan of one segment reuses from tensor to tensor: the buffers of
/// [`RecordView::tensor_bytes_into`], and the tensors it found finite.
#[derive(Default)]
pub struct ScanBuffers {
    scratch: Vec<u8>,
    whole: Vec<u8>,
    /// The tensors of the segment scanned so far and found finite, by (seq, index): what
    /// identifies their bytes (CRC-32, length, type).
    finite: HashMap<(u64, usize), (u32, u64, DType)>,
}

impl ScanBuffers {
    /// Whether tensor `i` of `view` was decoded and checked by the scan (found finite), or is
    /// a reference to such a tensor that reads the same bytes ([`ScanBuffers::scanned_alike`]).
    pub fn checked(&self, view: &RecordView<'_>, i: usize) -> bool {
        self.finite.contains_key(&(view.record.seq, i)) || self.scanned_alike(view, i)
    }

    /// Whether tensor `i` of `view` is a deduplicated tensor whose bytes are those of a
    /// tensor of its segment already scanned and found finite, read as the same type: its
    /// record gives the same CRC-32, length and type as the referenced one's (the check a
    /// resolved reference passes), so decoding it would scan the same bytes again.
    fn scanned_alike(&self, view: &RecordView<'_>, i: usize) -> bool {
        let Ok((Codec::Reference, stored)) = view.stored(i) else {
            return false;
        };
        let Ok(r) = BlobReference::parse(stored) else {
            return false;
        };
        let t = &view.record.tensors[i];
        self.finite.get(&(r.seq, r.tensor as usize)) == Some(&(t.crc32, t.nbytes, t.dtype))
    }

    /// Decodes tensor `i` of `view` into the buffers (checked as
    /// [`RecordView::tensor_bytes_into`] checks it); its bytes until the next call.
    pub fn decode(&mut self, view: &RecordView<'_>, i: usize) -> Result<&[u8], FormatError> {
        view.tensor_bytes_into(i, &mut self.scratch, &mut self.whole)?;
        Ok(&self.whole)
    }
}

/// The first non-finite element of tensor `i`: (index, value, count).
fn first_bad(
    view: &RecordView<'_>,
    i: usize,
    buffers: &mut ScanBuffers,
) -> Result<Option<(u64, f64, u64)>, FormatError> {
    let t = &view.record.tensors[i];
    if !t.dtype.is_float() || !view.is_captured(i) {
        return Ok(None);
    }
    // The usual float types by their bits, in the decoded bytes themselves (into buffers
    // reused from tensor to tensor): a typed copy of every tensor took a sixth of a check's
    // time on the hidden-32 trainer.
    if matches!(t.dtype, DType::BF16 | DType::F16 | DType::F32 | DType::F64) {
        let whole = buffers.decode(view, i)?;
        if !whole.len().is_multiple_of(t.dtype.size()) {
            // Not a whole number of elements: the error a typed copy says.
            return TensorData::from_le_bytes(t.dtype, whole).map(|_| None);
        }
        return Ok(by_bits(t.dtype, whole).flatten());
    }
    // The other float types (FP8, FP4, ...) by their values widened to f64.
    let data = view.tensor(i)?;
    let bad = |e: usize| !data.get_f64(e).unwrap_or(0.0).is_finite();
    let count = (0..data.len()).filter(|&e| bad(e)).count();
    let first = (0..data.len()).find(|&e| bad(e));
    Ok(first.map(|e| (e as u64, data.get_f64(e).unwrap_or(0.0), count as u64)))
}

/// The first non-finite element of a BF16, F16, F32 or F64 tensor's little-endian `bytes`,
/// by its bits (exponent all ones): (index, value, count); `None` for another type.
fn by_bits(dtype: DType, bytes: &[u8]) -> Option<Option<(u64, f64, u64)>> {
    let elem = match dtype {
        DType::BF16 | DType::F16 => 2,
        DType::F32 => 4,
        DType::F64 => 8,
        _ => return None,
    };
    let halves = || {
        bytes
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
    };
    let (count, first) = match dtype {
        DType::BF16 => non_finite_bits(halves(), BF16_EXPONENT),
        DType::F16 => non_finite_bits(halves(), F16_EXPONENT),
        DType::F32 => non_finite_bits(
            bytes
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            F32_EXPONENT,
        ),
        _ => non_finite_bits(
            bytes
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])),
            F64_EXPONENT,
        ),
    };
    Some(first.map(|k| {
        let mut b = [0u8; 8];
        b[..elem].copy_from_slice(&bytes[k * elem..(k + 1) * elem]);
        let bits = u64::from_le_bytes(b);
        let value = match dtype {
            DType::BF16 => half::bf16::from_bits(bits as u16).to_f64(),
            DType::F16 => half::f16::from_bits(bits as u16).to_f64(),
            DType::F32 => f64::from(f32::from_bits(bits as u32)),
            _ => f64::from_bits(bits),
        };
        (k as u64, value, count as u64)
    }))
}

/// How many of the elements `bits` have every bit of `exponent` set (infinite or NaN), and
/// the first: counted in one pass the compiler vectorizes, looked for only when there is one.
fn non_finite_bits<T>(bits: impl Iterator<Item = T> + Clone, exponent: T) -> (usize, Option<usize>)
where
    T: Copy + PartialEq + std::ops::BitAnd<Output = T>,
{
    let count = bits.clone().filter(|&b| b & exponent == exponent).count();
    let first = (count > 0)
        .then(|| bits.clone().position(|b| b & exponent == exponent))
        .flatten();
    (count, first)
}

/// The non-finite value of one record, inputs first (`None`: all finite). Copies are bytes
/// without a type and are skipped.
pub fn scan(
    view: &RecordView<'_>,
    buffers: &mut ScanBuffers,
) -> Result<Option<NonFinite>, FormatError> {
    if matches!(view.record.op, Op::Memcpy(_) | Op::Gap(_)) {
        return Ok(None);
    }
    let tensors = &view.record.tensors;
    let order = (0..tensors.len())
        .filter(|&i| is_input(tensors[i].role))
        .chain((0..tensors.len()).filter(|&i| !is_input(tensors[i].role)));
    for i in order {
        if buffers.scanned_alike(view, i) {
            continue;
        }
        let found = first_bad(view, i, buffers)?;
        if found.is_none() && view.is_captured(i) {
            let t = &tensors[i];
            buffers
                .finite
                .insert((view.record.seq, i), (t.crc32, t.nbytes, t.dtype));
        }
        if let Some((index, v, count)) = found {
            let r = &view.record;
            return Ok(Some(NonFinite {
                rank: r.rank,
                step: r.step,
                seq: r.seq,
                api: r.api.clone(),
                nvtx: r.nvtx.clone(),
                t_call_ns: r.t_call_ns,
                origin: if is_input(tensors[i].role) {
                    Origin::Inputs
                } else {
                    Origin::Produced
                },
                role: format!("{:?}", tensors[i].role),
                index,
                value: format!("{v}"),
                count,
            }));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exponent_test_is_widening_to_f64_for_every_float_type() {
        // Every BF16 and F16 bit pattern: non-finite by its bits exactly when its f64 is.
        for b in 0..=u16::MAX {
            let bf = half::bf16::from_bits(b);
            assert_eq!(
                b & BF16_EXPONENT == BF16_EXPONENT,
                !bf.to_f64().is_finite(),
                "bf16 {b:#06x}"
            );
            let f = half::f16::from_bits(b);
            assert_eq!(
                b & F16_EXPONENT == F16_EXPONENT,
                !f.to_f64().is_finite(),
                "f16 {b:#06x}"
            );
        }
        // F32 and F64: the edges of each exponent range, both signs, quiet and signalling NaNs.
        let f64s = [
            0.0f64,
            1.5,
            f64::MAX,
            f64::MIN_POSITIVE,
            5e-324,
            f64::INFINITY,
            f64::NAN,
            f64::from_bits(0x7ff0_0000_0000_0001),
            f64::from_bits(0x7fef_ffff_ffff_ffff),
        ];
        for v in f64s.into_iter().flat_map(|v| [v, -v]) {
            let b = v.to_bits();
            assert_eq!(
                b & F64_EXPONENT == F64_EXPONENT,
                !v.is_finite(),
                "f64 {v:e}"
            );
            let w = v as f32;
            let b = w.to_bits();
            assert_eq!(
                b & F32_EXPONENT == F32_EXPONENT,
                !w.is_finite(),
                "f32 {w:e}"
            );
        }
        let signalling = f32::from_bits(0x7f80_0001);
        assert_eq!(signalling.to_bits() & F32_EXPONENT, F32_EXPONENT);
    }

    #[test]
    fn the_count_and_the_first_non_finite_element_are_found() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        let some = bits(&[1.0, 2.0, f32::INFINITY, 0.0, f32::NAN, -3.0]);
        assert_eq!(
            non_finite_bits(some.iter().copied(), F32_EXPONENT),
            (2, Some(2))
        );
        let none = bits(&[1.0, -0.0, f32::MAX]);
        assert_eq!(
            non_finite_bits(none.iter().copied(), F32_EXPONENT),
            (0, None)
        );
        // F64 by its own mask: a value f32 would overflow to infinity is finite here.
        let wide: Vec<u64> = [1e300, f64::NEG_INFINITY, -1e-320, f64::NAN]
            .iter()
            .map(|x| x.to_bits())
            .collect();
        assert_eq!(
            non_finite_bits(wide.iter().copied(), F64_EXPONENT),
            (2, Some(1))
        );
    }

    #[test]
    fn the_decoded_bytes_give_the_first_non_finite_element_its_value_and_the_count() {
        let bf16: Vec<u8> = [1.0f32, -2.0, f32::NEG_INFINITY, 3.0, f32::NAN]
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect();
        assert_eq!(
            by_bits(DType::BF16, &bf16),
            Some(Some((2, f64::NEG_INFINITY, 2)))
        );
        let f16: Vec<u8> = [0.5f32, 65504.0, f32::INFINITY]
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect();
        assert_eq!(by_bits(DType::F16, &f16), Some(Some((2, f64::INFINITY, 1))));
        let f32s: Vec<u8> = [f32::MAX, f32::INFINITY, 1.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(
            by_bits(DType::F32, &f32s),
            Some(Some((1, f64::INFINITY, 1)))
        );
        let f64s: Vec<u8> = [f64::MAX, -0.0, f64::MIN_POSITIVE]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(by_bits(DType::F64, &f64s), Some(None));
        // NaN's value is NaN: compared by its bits.
        let nan: Vec<u8> = f32::NAN.to_le_bytes().to_vec();
        let (index, value, count) = by_bits(DType::F32, &nan).flatten().unwrap();
        assert_eq!((index, count), (0, 1));
        assert!(value.is_nan());
        // Other types are not read by their bits.
        assert_eq!(by_bits(DType::F8_E4M3, &[0x7f]), None);
    }
}
