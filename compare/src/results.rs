//! The results of a comparison as the walk and the reductions find them ([`Pending`]): held in
//! memory up to their share of `--memory`, the rest written to a spill file
//! ([`crate::spill`]) as they come, with only what ordering them, finding the first
//! divergence and the worst tensors needs kept in memory (an [`Entry`], a few tens of bytes
//! each). A comparison of many steps then holds its results within a budget, where they
//! were about 0.7 KB a tensor compared.
//!
//! A spill file that cannot be made (no `TMPDIR`, no room for a new file) loses nothing: the
//! results from then on are held in memory, and a warning says so once. One that fails once
//! written to (a full `TMPDIR`) is an error at once ([`CompareError::Results`]): results
//! written before may still have been in its buffer, so the comparison cannot go on without
//! them.

use serde::{Deserialize, Serialize};

use crate::comparison::{Pending, Position};
use crate::partition::{EntryAt, PendingEntry, PendingList};
use crate::report::{Listed, TensorComparison, TensorList};
use crate::spill::{Slot, SpillFile, SpillWriter};
use crate::CompareError;

/// What is kept in memory of one result.
#[derive(Debug, Clone, Copy)]
struct Entry {
    key: Position,
    diverged: bool,
    /// Error over tolerance (what orders the worst tensors).
    ratio: f64,
    at: At,
}

#[derive(Debug, Clone, Copy)]
enum At {
    Memory(usize),
    /// In spill file `.0` (an index into the results' files).
    Spilled(usize, Slot),
}

/// A result as the spill file holds it.
#[derive(Deserialize)]
struct Spilled {
    entry: PendingEntry,
    cmp: TensorComparison,
}

/// The comparison of a result the spill file holds (its entry skipped): what the report's
/// tensors read ([`crate::report::TensorList`]).
#[derive(Deserialize)]
pub(crate) struct SpilledComparison {
    pub(crate) cmp: TensorComparison,
}

/// [`Spilled`], written.
#[derive(Serialize)]
struct SpilledRef<'a> {
    entry: PendingEntry,
    cmp: &'a TensorComparison,
}

/// The results found so far, in the order found.
pub(crate) struct Results {
    entries: Vec<Entry>,
    memory: Vec<Option<Pending>>,
    /// Bytes held in `memory` (estimated, [`approx_bytes`]).
    held: u64,
    /// Past this, results are spilled.
    budget: u64,
    /// Spill files: the one these results are written to, and those of results absorbed,
    /// in the order they came.
    files: Vec<SpillWriter>,
    /// Which of `files` these results are written to, once there is one.
    writing: Option<usize>,
    /// The spill file could not be made: everything is held from then on.
    spill_failed: bool,
}

/// The share of `--memory` the results of the walk, and as much those of the reductions
/// (which run beside it), are held within: a thirty-second each (32 MiB under the default
/// budget, by [`approx_bytes`]; see [`crate::engine::mapping_budgets`]).
pub(crate) fn results_budget(memory: u64) -> u64 {
    memory / 32
}

impl Results {
    /// No results yet; at most `budget` bytes of them held in memory.
    pub(crate) fn new(budget: u64) -> Results {
        Results {
            entries: Vec::new(),
            memory: Vec::new(),
            held: 0,
            budget,
            files: Vec::new(),
            writing: None,
            spill_failed: false,
        }
    }

    /// Whether there is none.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Adds a result. An error when the spill file, once made, cannot be written: the
    /// comparison stops there (see the module's doc).
    pub(crate) fn push(&mut self, p: Pending) -> Result<(), CompareError> {
        let cmp = &p.cmp;
        let ratio = cmp.error_eps / cmp.tolerance_eps.max(f64::MIN_POSITIVE);
        let (key, diverged) = (p.key, cmp.diverged);
        let bytes = approx_bytes(&p);
        if self.held.saturating_add(bytes) > self.budget && !self.spill_failed {
            match self.spill_file() {
                Ok(file) => {
                    let slot = self.files[file]
                        .append(&SpilledRef {
                            entry: p.entry(),
                            cmp: &p.cmp,
                        })
                        .map_err(CompareError::Results)?;
                    self.entries.push(Entry {
                        key,
                        diverged,
                        ratio,
                        at: At::Spilled(file, slot),
                    });
                    return Ok(());
                }
                Err(e) => {
                    tracing::warn!(
                        "the comparison's results could not be written to a temporary file \
                         ({e}): they are held in memory from now on, beyond --memory"
                    );
                    self.spill_failed = true;
                }
            }
        }
        self.held += bytes;
        self.entries.push(Entry {
            key,
            diverged,
            ratio,
            at: At::Memory(self.memory.len()),
        });
        self.memory.push(Some(p));
        Ok(())
    }

    /// The spill file these results are written to, made on first use.
    fn spill_file(&mut self) -> std::io::Result<usize> {
        if let Some(file) = self.writing {
            return Ok(file);
        }
        self.files.push(SpillWriter::new()?);
        Ok(*self.writing.insert(self.files.len() - 1))
    }

    /// Adds every result of `other` after those of `self`, in its order: its spill files
    /// become files of `self` (nothing is read or written again), what it holds in memory is
    /// held by `self` (each within its own share).
    pub(crate) fn absorb(&mut self, other: Results) {
        let (files, memory) = (self.files.len(), self.memory.len());
        self.entries.extend(other.entries.into_iter().map(|mut e| {
            e.at = match e.at {
                At::Memory(m) => At::Memory(memory + m),
                At::Spilled(f, slot) => At::Spilled(files + f, slot),
            };
            e
        }));
        self.files.extend(other.files);
        self.memory.extend(other.memory);
        self.held += other.held;
    }

    /// The results in execution order (by key; found order among equal keys).
    pub(crate) fn into_sorted(mut self) -> Result<Sorted, CompareError> {
        self.entries.sort_by_key(|e| e.key);
        let files = self
            .files
            .into_iter()
            .map(SpillWriter::finish)
            .collect::<std::io::Result<Vec<SpillFile>>>()
            .map_err(CompareError::Results)?;
        Ok(Sorted {
            entries: self.entries,
            memory: self.memory,
            files,
        })
    }
}

/// Results in their final order, read (or taken) by index.
pub(crate) struct Sorted {
    entries: Vec<Entry>,
    memory: Vec<Option<Pending>>,
    files: Vec<SpillFile>,
}

impl Sorted {
    /// How many.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The key of result `i`.
    pub(crate) fn key(&self, i: usize) -> Position {
        self.entries[i].key
    }

    /// Whether result `i` is beyond its tolerance.
    pub(crate) fn diverged(&self, i: usize) -> bool {
        self.entries[i].diverged
    }

    /// Error over tolerance of result `i`.
    pub(crate) fn ratio(&self, i: usize) -> f64 {
        self.entries[i].ratio
    }

    /// Result `i`, a copy.
    pub(crate) fn read(&self, i: usize) -> Result<Pending, CompareError> {
        match self.entries[i].at {
            At::Memory(m) => self.memory[m].clone().ok_or_else(|| taken(i)),
            At::Spilled(f, slot) => self.read_spilled(f, slot),
        }
    }

    fn read_spilled(&self, file: usize, slot: Slot) -> Result<Pending, CompareError> {
        let file = self.files.get(file).ok_or_else(|| {
            CompareError::Results(std::io::Error::other("a result spilled to no file"))
        })?;
        let s: Spilled = file.read(slot).map_err(CompareError::Results)?;
        Ok(Pending::from_entry(s.cmp, s.entry))
    }

    /// The report's tensors, in this order, each with its position: those held moved into
    /// the list, those spilled left where they are (read back when wanted, but for those at
    /// `pin`, which the report names); with `entries`, what a partial report keeps of each,
    /// in the same order, those of spilled results left in the spill files too
    /// ([`PendingList`]).
    pub(crate) fn into_tensors(
        mut self,
        entries: Option<&mut PendingList>,
        pin: impl IntoIterator<Item = usize>,
    ) -> Result<TensorList, CompareError> {
        let mut items = Vec::with_capacity(self.entries.len());
        let mut entry_items = Vec::with_capacity(if entries.is_some() {
            self.entries.len()
        } else {
            0
        });
        let mut held = Vec::new();
        let mut diverged = 0;
        for i in 0..self.entries.len() {
            let e = self.entries[i];
            diverged += usize::from(e.diverged);
            match e.at {
                At::Memory(m) => {
                    let mut p = self.memory[m].take().ok_or_else(|| taken(i))?;
                    if entries.is_some() {
                        entry_items.push(EntryAt::Held(p.entry()));
                    }
                    p.cmp.position = i as u64;
                    items.push(Listed::Memory(held.len()));
                    held.push(p.cmp);
                }
                At::Spilled(f, slot) => {
                    if entries.is_some() {
                        entry_items.push(EntryAt::Spilled(f, slot));
                    }
                    items.push(Listed::Spilled(f, slot));
                }
            }
        }
        if let Some(out) = entries {
            *out = PendingList::from_parts(self.files.clone(), entry_items);
        }
        TensorList::from_parts(self.files, items, held, diverged, pin)
            .map_err(CompareError::Results)
    }
}

fn taken(i: usize) -> CompareError {
    CompareError::Results(std::io::Error::other(format!(
        "result {i} was taken already"
    )))
}

/// What holding `p` in memory costs, estimated from its parts (the struct, its strings'
/// and vectors' heap blocks; allocator overhead left out).
fn approx_bytes(p: &Pending) -> u64 {
    let t = &p.cmp;
    let strings = t.api.len()
        + t.role.len()
        + t.nvtx.as_ref().map_or(0, String::len)
        + t.dtype.len()
        + t.tolerance_source.len()
        + p.param_note.as_ref().map_or(0, String::len);
    let vectors = 8 * t.shape.len()
        + std::mem::size_of::<crate::report::RankError>() * t.ranks.len()
        + 16 * p.shards.len();
    (std::mem::size_of::<Pending>() + strings + vectors) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::combine::Merge;

    fn pending(key: Position, diverged: bool, error: f64) -> Pending {
        Pending {
            key,
            cmp: TensorComparison {
                position: 0,
                step: key.0,
                ref_seq: key.1,
                api: "cublasGemmEx".into(),
                role: "D".into(),
                nvtx: Some(format!("forward/layer{}", key.1)),
                shape: vec![4, 8],
                dtype: "bf16".into(),
                merge: Merge::Replicated,
                ranks: Vec::new(),
                error_eps: error,
                worst_row: None,
                norm_ratio: 1.0,
                tolerance_eps: 2.0,
                tolerance_source: "analytic".into(),
                diverged,
            },
            shards: vec![(0, key.1), (1, key.1)],
            ref_op: (key.0, key.1),
            is_collective: false,
            param_note: None,
        }
    }

    /// The results in order, each as (key, its comparison as JSON).
    fn contents(s: &Sorted) -> Vec<(Position, String)> {
        (0..s.len())
            .map(|i| {
                let p = s.read(i).expect("readable");
                let json = serde_json::to_string(&p.cmp).expect("json");
                (p.key, json)
            })
            .collect()
    }

    /// The report's tensors made of `s`, as JSON, and what a partial report keeps of each, as
    /// the JSON it is written as (those of spilled results read back from the spill files).
    fn tensors(s: Sorted) -> (bool, Vec<String>, String) {
        let mut entries = PendingList::default();
        let list = s.into_tensors(Some(&mut entries), [0, 7]).expect("tensors");
        let json = list
            .iter()
            .map(|t| serde_json::to_string(&*t.expect("read back")).expect("json"))
            .collect();
        let entries_json = serde_json::to_string(&entries).expect("entries written");
        // Read as a partial report is read: the same entries, all in memory.
        let read: PendingList = serde_json::from_str(&entries_json).expect("entries read");
        assert!(read == entries && read.len() == list.len());
        // Those of spilled results stay in the spill files: not held a second time.
        assert_eq!(list.is_spilled(), entries.spilled() > 0, "{entries:?}");
        (list.is_spilled(), json, entries_json)
    }

    #[test]
    fn results_past_the_budget_are_spilled_and_read_back_the_same_in_order() {
        // Keys out of order, as the walk and the reductions find them.
        let keys: Vec<Position> = (0..200u64)
            .map(|i| ((i * 7) % 5, (i * 13) % 41, (i % 3) as u32))
            .collect();
        let make = |budget| {
            let mut r = Results::new(budget);
            for (n, &k) in keys.iter().enumerate() {
                r.push(pending(k, n % 17 == 0, n as f64 / 10.0))
                    .expect("held or spilled");
            }
            r
        };
        let held = make(u64::MAX).into_sorted().expect("sorted");
        assert!(held.files.is_empty());
        let spilled = make(4096).into_sorted().expect("sorted");
        assert!(
            !spilled.files.is_empty(),
            "a budget of 4 KiB holds a few results only"
        );
        for i in 0..held.len() {
            assert_eq!(held.key(i), spilled.key(i));
            assert_eq!(held.diverged(i), spilled.diverged(i));
            assert_eq!(held.ratio(i).to_bits(), spilled.ratio(i).to_bits());
        }
        let keys_sorted: Vec<Position> = (0..held.len()).map(|i| held.key(i)).collect();
        assert!(keys_sorted.windows(2).all(|w| w[0] <= w[1]));
        let a = contents(&held);
        assert_eq!(a, contents(&spilled));
        assert_eq!(a.len(), 200);
        // The report's tensors: the same in either case, each at its position, those spilled
        // read from where the results were written.
        let (was_spilled, held_json, held_entries) = tensors(held);
        assert!(!was_spilled);
        let (was_spilled, spilled_json, spilled_entries) = tensors(spilled);
        assert!(was_spilled);
        assert_eq!(held_json, spilled_json);
        // What a partial report keeps: the same, whether held or left in the spill files.
        assert_eq!(held_entries, spilled_entries);
        assert!(held_entries.contains("\"shards\":[[0,"), "{held_entries}");
        assert!(held_json[7].contains("\"position\":7"), "{}", held_json[7]);
    }

    #[test]
    fn absorbed_results_follow_in_their_order() {
        let mut walk = Results::new(0);
        let mut reductions = Results::new(u64::MAX);
        walk.push(pending((0, 5, 0), false, 1.0)).expect("spilled");
        reductions
            .push(pending((0, 5, 0), true, 3.0))
            .expect("held");
        reductions
            .push(pending((0, 1, 0), false, 1.0))
            .expect("held");
        walk.absorb(reductions);
        let s = walk.into_sorted().expect("sorted");
        // Equal keys keep the order found: the walk's first.
        assert_eq!(
            (0..3)
                .map(|i| (s.key(i), s.diverged(i)))
                .collect::<Vec<_>>(),
            vec![((0, 1, 0), false), ((0, 5, 0), false), ((0, 5, 0), true)]
        );
        // Spilled on both sides (two files, each read where it was written), or held: the
        // same tensors.
        let both = |budget: u64| {
            let (mut walk, mut reductions) = (Results::new(budget), Results::new(budget));
            for n in 0..20u64 {
                walk.push(pending((n % 4, n, 0), n == 9, n as f64))
                    .expect("pushed");
                reductions
                    .push(pending((n % 4, n, 1), false, 1.0))
                    .expect("pushed");
            }
            walk.absorb(reductions);
            walk.into_sorted().expect("sorted")
        };
        let spilled = both(0);
        assert_eq!(spilled.files.len(), 2);
        assert_eq!(tensors(spilled).1, tensors(both(u64::MAX)).1);
    }

    #[test]
    fn a_spill_file_that_cannot_be_written_stops_the_comparison_at_once() {
        // A spill file on a full disk: `/dev/full` refuses every write (ENOSPC).
        let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
            return; // not Linux
        };
        let mut r = Results::new(0);
        r.files.push(SpillWriter::on(full));
        r.writing = Some(0);
        // The writer buffers a MiB: the error comes when it first writes, and is not held
        // back to the end (nor are the results held in memory instead, as if nothing was lost).
        let failed = (0..100_000u64)
            .map(|n| r.push(pending((0, n, 0), false, 1.0)))
            .position(|pushed| pushed.is_err());
        let Some(n) = failed else {
            panic!("no push failed on a full disk");
        };
        assert!(n > 0, "the first results fit the writer's buffer");
        assert!(r.memory.is_empty(), "nothing was held instead of spilled");
        let e = r
            .push(pending((0, 1 << 40, 0), false, 1.0))
            .expect_err("still failing");
        assert!(e.to_string().contains("TMPDIR"), "{e}");
    }

    #[test]
    fn a_report_reads_back_a_spilled_tensor_it_did_not_pin() {
        let mut r = Results::new(0);
        for n in 0..10u64 {
            r.push(pending((0, n, 0), n == 3, n as f64))
                .expect("spilled");
        }
        let list = r
            .into_sorted()
            .expect("sorted")
            .into_tensors(None, [3])
            .expect("tensors");
        assert!(list.is_spilled());
        assert!(list.get(5).is_none(), "only the pinned tensor is in memory");
        let t = list.named(5).expect("read back from the spill file");
        assert_eq!(t.position, 5);
        assert_eq!(list.named(3).expect("pinned").position, 3);
        assert!(list.named(10).is_none(), "past the end");
    }
}
