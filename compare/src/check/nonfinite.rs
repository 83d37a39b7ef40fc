//! The first NaN or Inf: in which op, on which rank, and whether it came in through the op's
//! inputs or was produced by it.

use serde::Serialize;
use ttrace_format::reader::RecordView;
use ttrace_format::record::{Op, Role};
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

/// The first non-finite element of tensor `i`: (index, value, count).
fn first_bad(view: &RecordView<'_>, i: usize) -> Result<Option<(u64, f64, u64)>, FormatError> {
    let t = &view.record.tensors[i];
    if !t.dtype.is_float() || !view.is_captured(i) {
        return Ok(None);
    }
    let data = view.tensor(i)?;
    let mut first = None;
    let mut count = 0u64;
    for e in 0..data.len() {
        let v = data.get_f64(e).unwrap_or(0.0);
        if !v.is_finite() {
            count += 1;
            first.get_or_insert((e as u64, v));
        }
    }
    Ok(first.map(|(e, v)| (e, v, count)))
}

/// The non-finite value of one record, inputs first (`None`: all finite). Copies are bytes
/// without a type and are skipped.
pub fn scan(view: &RecordView<'_>) -> Result<Option<NonFinite>, FormatError> {
    if matches!(view.record.op, Op::Memcpy(_) | Op::Gap(_)) {
        return Ok(None);
    }
    let tensors = &view.record.tensors;
    let order = (0..tensors.len())
        .filter(|&i| is_input(tensors[i].role))
        .chain((0..tensors.len()).filter(|&i| !is_input(tensors[i].role)));
    for i in order {
        if let Some((index, v, count)) = first_bad(view, i)? {
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
