//! Decoding ahead of the walk, on every core: the tensors the next reference ops will compare
//! (the reference's operands, the perturbed reference's, every shard's) are read, checked
//! against their CRC-32, decompressed and widened to `f32` in parallel, a window of ops at a
//! time, into [`crate::trace::RunTrace`]'s cache, where the walk takes them in its own order.
//! The next [`WINDOWS_AHEAD`] windows are decoded on the thread pool while the walk compares
//! the current one.
//!
//! Decoding is a pure function of the stored bytes, so what the walk sees (and every number
//! of the report) does not depend on the number of threads; only when it is decoded changes.
//! A tensor that cannot be decoded here is left out: the walk reads it again on its own and
//! reports the error where it always did. A window holds at most its byte budget of decoded
//! tensors (at least one op's), and what the walk did not take is dropped with the next one.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use rayon::prelude::*;
use ttrace_format::dedup::BlobReference;
use ttrace_format::reader::{RecordView, Segment};
use ttrace_format::record::{Record, Role};

use crate::align::RefOp;
use crate::decoded::{Checked, DecodedCache, Shared};
use crate::records::RecordRef;
use crate::trace::{gemm, is_float, Decoding, F32Widening, RunTrace};

/// A stored tensor: (rank, step, seq, index in its record).
pub type TensorAt = (u32, u64, u64, usize);

/// A record's wanted tensors within one segment: (seq, tensor indices).
pub type RecordWants = (u64, Vec<usize>);

/// Wanted tensors by segment (rank, step), then by record.
pub type Wants = BTreeMap<(u32, u64), Vec<RecordWants>>;

/// An open segment and the tensors wanted of it.
pub type SegmentWants<'a> = ((u32, u64), &'a Segment, &'a [RecordWants]);

/// The roles an op's comparison reads from a GEMM record: its operands, its output and, when
/// it accumulates, the C its increment is taken from.
fn compared_roles(rec: &Record) -> &'static [Role] {
    match gemm(rec) {
        Some(g) if g.beta.is_some_and(|b| b != 0.0) => &[Role::A, Role::B, Role::D, Role::CIn],
        _ => &[Role::A, Role::B, Role::D],
    }
}

/// The bytes of the increment `D - beta*C` decoding ahead forms for `rec` (an accumulating
/// GEMM; 0 for any other record).
fn increment_bytes(rec: &Record) -> u64 {
    if !compared_roles(rec).contains(&Role::CIn) {
        return 0;
    }
    wanted(rec, &[Role::D]).map(|(_, b)| b).sum()
}

/// The captured float tensors of `rec` with one of `roles`.
fn wanted<'r>(rec: &'r Record, roles: &[Role]) -> impl Iterator<Item = (TensorAt, u64)> + 'r {
    let roles = roles.to_vec();
    rec.tensors
        .iter()
        .enumerate()
        .filter(move |(_, t)| t.captured && is_float(t.dtype) && roles.contains(&t.role))
        .map(move |(i, t)| ((rec.rank, rec.step, rec.seq, i), t.elements() * 4))
}

/// The stores one walk reads, and what it reads of them.
pub struct Walked<'a> {
    /// The reference (world size 1).
    pub reff: &'a RunTrace,
    /// Its rank.
    pub ref_rank: u32,
    /// The run.
    pub run: &'a RunTrace,
    /// The perturbed reference, when given.
    pub pert: Option<&'a RunTrace>,
}

/// The bytes of decoded tensors one window may hold under a `--memory` budget: a
/// twenty-fourth, for three windows (the one compared and the [`WINDOWS_AHEAD`] decoded
/// meanwhile) in an eighth (the rest is for open segments, the op being compared and what the
/// comparison keeps), and at most [`WINDOW_CAP`].
pub fn window_budget(memory: u64) -> u64 {
    (memory / (8 * (WINDOWS_AHEAD as u64 + 1))).min(WINDOW_CAP)
}

/// Windows decoded ahead of the one the walk compares. With one, the walk waited for the
/// next window whenever it was slower to decode than the current one was to compare, while
/// the decoding threads had waited for the walk when it was the other way round; two even
/// that out (the large benchmark config 0.96x the time, docs/compare.md section 6).
pub const WINDOWS_AHEAD: usize = 2;

/// The most bytes of decoded tensors a window holds whatever the budget: larger windows
/// measured slower (a sixteenth of the default budget, 64 MiB, took the demo 1.1x the time;
/// docs/compare.md, section 6), and a window of any size holds at least one op, whose
/// tensors are decoded in parallel.
pub const WINDOW_CAP: u64 = 8 << 20;

/// The bytes of decoded tensors each store keeps ([`crate::decoded`]) under a `--memory`
/// budget, the windows decoded ahead included: an eighth of it (a larger share measured slower: in a
/// process this short every byte kept is a page touched for the first time, and the page
/// faults cost more than the decoding it saves), of which the run's store (every rank) gets
/// half and the reference and the perturbed reference a quarter each, as their mappings.
/// As much again may be held as spare buffers ([`crate::decoded`]).
/// Returns (reference, run, perturbed).
pub fn kept_budgets(memory: u64) -> (u64, u64, u64) {
    let kept = memory / 8;
    (kept / 4, kept / 2, kept / 4)
}

impl Walked<'_> {
    /// Makes what `ahead` decoded the values the walk takes (waiting for it); returns how
    /// many ops it covered.
    pub fn install(&self, ahead: Ahead) -> usize {
        self.reff.install(ahead.reff);
        self.run.install(ahead.run);
        if let (Some(p), Some(d)) = (self.pert, ahead.pert) {
            p.install(d);
        }
        ahead.covered
    }

    /// Starts decoding, on the thread pool, the tensors of the reference ops `ops` (each with
    /// its run shards `(rank, seq)`) from the first on, as many ops as `budget` bytes of `f32`
    /// hold (at least one), while the walk compares the ops before them.
    pub fn start(&self, ops: &[(RefOp, &[(u32, u64)])], budget: u64) -> Ahead {
        let (mut reff, mut run, mut pert) = (Vec::new(), Vec::new(), Vec::new());
        let mut bytes = 0u64;
        let mut covered = 0;
        for &((step, seq), shards) in ops {
            let Some(ref_rec) = self.reff.record(self.ref_rank, step, seq) else {
                covered += 1;
                continue;
            };
            let ref_rec = &*ref_rec;
            let mut op: Vec<(TensorAt, u64, usize)> = Vec::new();
            let roles = compared_roles(ref_rec);
            op.extend(wanted(ref_rec, roles).map(|(t, b)| (t, b, 0)));
            if let Some(p) = self.pert {
                // The perturbed reference's increments are not compared (its C's 1-ulp change
                // says nothing about them): operands and a plain output only.
                let pert_roles: &[Role] = if roles.contains(&Role::CIn) {
                    &[Role::A, Role::B]
                } else {
                    &[Role::A, Role::B, Role::D]
                };
                if let Some(r) = p
                    .record(self.ref_rank, step, seq)
                    .filter(|r| r.api == ref_rec.api)
                {
                    op.extend(wanted(&r, pert_roles).map(|(t, b)| (t, b, 2)));
                }
            }
            for &(rank, s) in shards {
                if let Some(r) = self.run.record(rank, step, s) {
                    op.extend(wanted(&r, compared_roles(&r)).map(|(t, b)| (t, b, 1)));
                }
            }
            // An accumulating GEMM's increment D - beta*C is formed beside its D.
            let increments: u64 = increment_bytes(ref_rec)
                + shards
                    .iter()
                    .filter_map(|&(rank, s)| self.run.record(rank, step, s))
                    .map(|r| increment_bytes(&r))
                    .sum::<u64>();
            let op_bytes: u64 = op.iter().map(|w| w.1).sum::<u64>() + increments;
            if covered > 0 && bytes + op_bytes > budget {
                break;
            }
            bytes += op_bytes;
            covered += 1;
            for (t, _, store) in op {
                match store {
                    0 => reff.push(t),
                    1 => run.push(t),
                    _ => pert.push(t),
                }
            }
        }
        Ahead {
            covered: covered.max(1),
            reff: self.reff.decode_ahead(&reff),
            run: self.run.decode_ahead(&run),
            pert: self.pert.map(|p| p.decode_ahead(&pert)),
        }
    }
}

/// The tensors of a window of ops, being decoded ([`Walked::start`]).
pub struct Ahead {
    /// How many ops the window covers.
    pub(crate) covered: usize,
    reff: Decoding,
    run: Decoding,
    pert: Option<Decoding>,
}

/// The wanted tensors grouped by segment, then by record (each record's frame is read and
/// checked once for all its tensors).
pub fn by_segment(wants: &[TensorAt]) -> Wants {
    let mut out: BTreeMap<(u32, u64), BTreeMap<u64, Vec<usize>>> = BTreeMap::new();
    for &(rank, step, seq, index) in wants {
        let v = out.entry((rank, step)).or_default().entry(seq).or_default();
        if !v.contains(&index) {
            v.push(index);
        }
    }
    out.into_iter()
        .map(|(k, recs)| (k, recs.into_iter().collect()))
        .collect()
}

/// One wanted tensor after the parallel pass.
enum Decoded {
    /// Its values, and what identifies its bytes.
    Values(TensorAt, Shared, Checked),
    /// A tensor whose bytes are another's (a deduplicated tensor's referenced one, or one
    /// stored alike), wanted in this window or kept decoded: its values are that tensor's
    /// when their bytes check alike.
    Alias(TensorAt, TensorAt, Checked),
}

/// Decodes the wanted tensors of open segments in parallel, each record on one thread with
/// buffers reused per thread: `(tensor, f32 values, what identifies its bytes)` of every
/// tensor that decoded cleanly.
///
/// Bytes are decoded once: a deduplicated tensor whose referenced tensor is also wanted, or
/// kept decoded in `kept`, takes that tensor's values when both records give the same
/// CRC-32, length and type (the check the reader makes of a resolved reference: its bytes
/// against the referring record's CRC-32); a tensor whose stored bytes equal those of one
/// decoded before it (data-parallel replicas of a weight, an activation every
/// tensor-parallel rank reads: same codec, length, type, CRC-32 and stored bytes,
/// [`RecordView::same_stored`]) takes its values. Otherwise, or when the tensor it takes
/// its values from did not decode (or is no longer kept), it is left out and the walk reads
/// it on its own.
pub fn decode(
    segments: &[SegmentWants],
    kept: &Mutex<DecodedCache>,
    known: &(dyn Fn((u32, u64), u64) -> Option<RecordRef> + Sync),
) -> Vec<(TensorAt, Shared, Checked)> {
    let jobs: Vec<((u32, u64), &Segment, &RecordWants)> = segments
        .iter()
        .flat_map(|(key, seg, recs)| recs.iter().map(move |r| (*key, *seg, r)))
        .collect();
    // Every record read (its frame checked) in parallel, then what to decode planned in
    // order: the same plan whatever the number of threads.
    let views: Vec<Option<RecordView>> = jobs
        .par_iter()
        .map(|&(key, seg, (seq, _))| {
            // Its metadata was decoded when the store was opened: not again (by its seq when
            // its frame is not where it was).
            known(key, *seq)
                .and_then(|rec| seg.read_at(rec.frame(), &rec))
                .or_else(|| seg.read_seq(*seq))
                .and_then(Result::ok)
        })
        .collect();
    let is_kept = |at: &TensorAt| lock(kept).contains(at);
    let (plan, mut decoded) = plan_decoding(&jobs, &views, &is_kept);
    // A task a tensor, not a record: a window holds few records, some of them with most of
    // its bytes, which one thread would otherwise decode while the other waited.
    let tasks: Vec<(usize, usize)> = plan
        .iter()
        .enumerate()
        .flat_map(|(k, mine)| mine.iter().map(move |&i| (k, i)))
        .collect();
    let values: Vec<Decoded> = tasks
        .par_iter()
        .with_max_len(1)
        .map_init(
            || (Vec::new(), Vec::new()),
            |(scratch, raw), &(k, i)| {
                let mut out = Vec::new();
                let ((rank, step), _, (seq, _)) = jobs[k];
                let Some(view) = &views[k] else {
                    return out;
                };
                {
                    let t = &view.record.tensors[i];
                    let n = usize::try_from(t.elements()).unwrap_or(0);
                    let mut values = lock(kept).buffer(n);
                    let mut wide = F32Widening::new(t.dtype, &mut values);
                    // Widened as the blocks come: the bytes are never in one buffer.
                    let read = view.tensor_blocks(i, scratch, raw, &mut |b| wide.push(b));
                    if read.is_ok() && wide.finish().is_ok() {
                        let at = (rank, step, *seq, i);
                        let checked = (t.crc32, t.nbytes, t.dtype);
                        let values = Arc::new(values);
                        // A reference's values are its target's bytes read as this
                        // tensor's type: kept under the target too, for the next reference
                        // to it (their CRC-32, length and type must agree to take them).
                        if let Some(target) = referenced(view, i, rank, step) {
                            out.push(Decoded::Values(target, Arc::clone(&values), checked));
                        }
                        out.push(Decoded::Values(at, values, checked));
                    }
                }
                out
            },
        )
        .flatten()
        .collect();
    // Decoded: large frames of segments over the budget leave the mapping.
    for view in views.iter().flatten() {
        view.release();
    }
    let aliases = decoded.len();
    decoded.extend(values);
    tracing::debug!(
        tensors = decoded.len(),
        aliases,
        "decoded ahead (aliases: values taken from identical bytes)"
    );
    resolve_aliases(decoded, |at| lock(kept).get(at))
}

/// A cache (decoded tensors, open segments), even when a thread panicked holding it (it
/// holds no invariant a panic breaks beyond what is dropped and decoded or opened again).
pub(crate) fn lock<T>(kept: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    kept.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Which tensors of each record `decode` decodes (indices), and the aliases of the others:
/// deduplicated tensors whose referenced tensor is wanted or kept decoded (`is_kept`), and
/// tensors whose stored bytes equal those of one decoded before them.
fn plan_decoding(
    jobs: &[((u32, u64), &Segment, &RecordWants)],
    views: &[Option<RecordView>],
    is_kept: &dyn Fn(&TensorAt) -> bool,
) -> (Vec<Vec<usize>>, Vec<Decoded>) {
    let wanted: HashSet<TensorAt> = jobs
        .iter()
        .flat_map(|&((rank, step), _, (seq, indices))| {
            indices.iter().map(move |&i| (rank, step, *seq, i))
        })
        .collect();
    let mut plan: Vec<Vec<usize>> = Vec::with_capacity(jobs.len());
    let mut aliases = Vec::new();
    // Tensors to decode by what identifies their bytes: (job, index) of each.
    let mut decoding: HashMap<Checked, Vec<(usize, usize)>> = HashMap::new();
    // Referenced tensors that a reference decoded in this window resolves.
    let mut resolved: HashSet<TensorAt> = HashSet::new();
    for (k, (&((rank, step), _, (seq, indices)), view)) in jobs.iter().zip(views).enumerate() {
        let mut mine = Vec::new();
        if let Some(view) = view {
            for &i in indices {
                let Some(t) = view.record.tensors.get(i) else {
                    continue;
                };
                let at = (rank, step, *seq, i);
                let checked = (t.crc32, t.nbytes, t.dtype);
                if let Some(target) = referenced(view, i, rank, step) {
                    let known = wanted.contains(&target) || resolved.contains(&target);
                    if target != at && (known || is_kept(&target)) {
                        aliases.push(Decoded::Alias(at, target, checked));
                        continue;
                    }
                    resolved.insert(target);
                }
                let same = decoding.get(&checked).and_then(|cands| {
                    cands.iter().find(|&&(j, c)| {
                        views[j].as_ref().is_some_and(|v| v.same_stored(c, view, i))
                    })
                });
                if let Some(&(j, c)) = same {
                    let ((r, s), _, (q, _)) = jobs[j];
                    aliases.push(Decoded::Alias(at, (r, s, *q, c), checked));
                    continue;
                }
                decoding.entry(checked).or_default().push((k, i));
                mine.push(i);
            }
        }
        plan.push(mine);
    }
    (plan, aliases)
}

/// The tensor that tensor `i` of `view` (in segment `rank`, `step`) refers to, when its blob
/// is a reference.
fn referenced(view: &RecordView, i: usize, rank: u32, step: u64) -> Option<TensorAt> {
    if !view.is_reference(i) {
        return None;
    }
    let (_, stored) = view.stored(i).ok()?;
    let r = BlobReference::parse(stored).ok()?;
    Some((rank, step, r.seq, r.tensor as usize))
}

/// The decoded values, aliases given their referenced tensor's values (decoded in this
/// window, else from `kept`) when the bytes match: shared, not copied.
fn resolve_aliases(
    decoded: Vec<Decoded>,
    kept: impl Fn(&TensorAt) -> Option<(Shared, Checked)>,
) -> Vec<(TensorAt, Shared, Checked)> {
    let mut out: Vec<(TensorAt, Shared, Checked)> = Vec::with_capacity(decoded.len());
    let mut index_of: HashMap<TensorAt, usize> = HashMap::new();
    let mut aliases = Vec::new();
    for d in decoded {
        match d {
            Decoded::Values(at, values, checked) => {
                index_of.insert(at, out.len());
                out.push((at, values, checked));
            }
            Decoded::Alias(at, target, checked) => aliases.push((at, target, checked)),
        }
    }
    for (at, target, checked) in aliases {
        let source = match index_of.get(&target) {
            Some(&k) => Some((Arc::clone(&out[k].1), out[k].2)),
            None => kept(&target),
        };
        if let Some((values, c)) = source {
            if c == checked {
                out.push((at, values, checked));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ttrace_format::dtype::DType;

    #[test]
    fn a_deduplicated_tensor_takes_its_referenced_values_only_when_their_bytes_match() {
        let bf16 = |crc: u32| (crc, 8, DType::BF16);
        let kept_values: Shared = Arc::new(vec![5.0, 6.0, 7.0, 8.0]);
        let kept =
            |at: &TensorAt| (*at == (0, 0, 0, 1)).then(|| (Arc::clone(&kept_values), bf16(9)));
        let got = resolve_aliases(
            vec![
                Decoded::Alias((0, 0, 5, 0), (0, 0, 1, 2), bf16(7)),
                Decoded::Values((0, 0, 1, 2), Arc::new(vec![1.0, 2.0, 3.0, 4.0]), bf16(7)),
                // Another CRC-32, another type, a referenced tensor that did not decode (nor
                // is kept): left for the walk to read.
                Decoded::Alias((0, 0, 6, 0), (0, 0, 1, 2), bf16(8)),
                Decoded::Alias((0, 0, 7, 0), (0, 0, 1, 2), (7, 8, DType::F16)),
                Decoded::Alias((0, 0, 8, 0), (0, 0, 3, 0), bf16(7)),
                // A referenced tensor decoded in an earlier window and kept.
                Decoded::Alias((0, 0, 9, 0), (0, 0, 0, 1), bf16(9)),
                Decoded::Alias((0, 0, 10, 0), (0, 0, 0, 1), bf16(7)),
            ],
            kept,
        );
        let mut got: Vec<(TensorAt, Shared, Checked)> = got;
        got.sort_by_key(|g| g.0);
        let at: Vec<TensorAt> = got.iter().map(|g| g.0).collect();
        assert_eq!(at, vec![(0, 0, 1, 2), (0, 0, 5, 0), (0, 0, 9, 0)]);
        assert!(Arc::ptr_eq(&got[0].1, &got[1].1), "shared, not copied");
        assert_eq!(*got[1].1, vec![1.0, 2.0, 3.0, 4.0]);
        assert!(Arc::ptr_eq(&got[2].1, &kept_values));
    }

    #[test]
    fn bytes_stored_alike_are_decoded_once_and_give_the_same_values() {
        use crate::trace::to_f32;
        use ttrace_format::store::{segment_path, Blob, SegmentWriter};
        let dir = std::env::temp_dir().join(format!("ttrace-alike-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        let bf16 = |salt: u16| -> Vec<u8> {
            (0..4096u16)
                .flat_map(|i| half::bf16::from_f32(f32::from(i ^ salt) / 7.0).to_le_bytes())
                .collect()
        };
        let (w, other) = (bf16(0), bf16(5));
        // Rank 0 holds w twice and another tensor, rank 1 holds w (a data-parallel replica).
        for (rank, tensors) in [(0u32, vec![&w, &w, &other]), (1, vec![&w])] {
            let mut seg = SegmentWriter::create(&dir, rank, 0).expect("create");
            for (seq, data) in tensors.into_iter().enumerate() {
                let mut rec = Record::d2h_copy(rank, 0, seq as u64, data);
                rec.tensors[0].dtype = DType::BF16;
                rec.tensors[0].shape = vec![data.len() as u64 / 2];
                let blob = Blob::encode(data, 2, 3, &mut Vec::new()).expect("encode");
                seg.append(&rec, &[blob]).expect("append");
            }
            seg.finish().expect("finish");
        }
        let open = |rank| Segment::open(&segment_path(&dir, rank, 0)).expect("open");
        let (s0, s1) = (open(0), open(1));
        let w0: Vec<RecordWants> = vec![(0, vec![0]), (1, vec![0]), (2, vec![0])];
        let w1: Vec<RecordWants> = vec![(0, vec![0])];
        let segments: Vec<SegmentWants> = vec![((0, 0), &s0, &w0), ((1, 0), &s1, &w1)];

        let jobs: Vec<((u32, u64), &Segment, &RecordWants)> = segments
            .iter()
            .flat_map(|(key, seg, recs)| recs.iter().map(move |r| (*key, *seg, r)))
            .collect();
        let views: Vec<Option<RecordView>> = jobs
            .iter()
            .map(|&(_, seg, (seq, _))| seg.read_seq(*seq).and_then(Result::ok))
            .collect();
        let (plan, aliases) = plan_decoding(&jobs, &views, &|_| false);
        assert_eq!(
            plan,
            vec![vec![0], vec![], vec![0], vec![]],
            "w decoded once"
        );
        let targets: Vec<(TensorAt, TensorAt)> = aliases
            .iter()
            .filter_map(|a| match a {
                Decoded::Alias(at, target, _) => Some((*at, *target)),
                Decoded::Values(..) => None,
            })
            .collect();
        assert_eq!(
            targets,
            vec![((0, 0, 1, 0), (0, 0, 0, 0)), ((1, 0, 0, 0), (0, 0, 0, 0))]
        );

        let mut got = decode(
            &segments,
            &Mutex::new(DecodedCache::new(u64::MAX)),
            &|_, _| None,
        );
        got.sort_by_key(|g| g.0);
        let want_w = to_f32(DType::BF16, &w).expect("widens");
        let want_other = to_f32(DType::BF16, &other).expect("widens");
        let at: Vec<TensorAt> = got.iter().map(|g| g.0).collect();
        assert_eq!(
            at,
            vec![(0, 0, 0, 0), (0, 0, 1, 0), (0, 0, 2, 0), (1, 0, 0, 0)]
        );
        for (at, values, _) in &got {
            let want = if at.2 == 2 { &want_other } else { &want_w };
            assert!(**values == *want, "{at:?}: the values of its own bytes");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn wants_are_grouped_by_segment_and_record_without_repeats() {
        let wants = [
            (1, 0, 7, 2),
            (0, 0, 3, 0),
            (1, 0, 7, 0),
            (1, 0, 7, 2),
            (0, 1, 3, 1),
        ];
        let g = by_segment(&wants);
        let keys: Vec<(u32, u64)> = g.keys().copied().collect();
        assert_eq!(keys, vec![(0, 0), (0, 1), (1, 0)]);
        assert_eq!(g[&(1, 0)], vec![(7, vec![2, 0])]);
        assert_eq!(g[&(0, 0)], vec![(3, vec![0])]);
    }
}
