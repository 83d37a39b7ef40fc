//! The compared tensors of a report ([`CompareReport::tensors`](super::CompareReport)), in
//! execution order: held in memory, or, for a comparison whose results outgrew their share of
//! `--memory`, in a spill file ([`crate::spill`]) with only the tensors the report names
//! (its first divergence, the last good tensor before it, the worst ones) read back into
//! memory. Written as a JSON array either way.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use serde::ser::{Error as _, SerializeSeq};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::TensorComparison;
use crate::spill::{Slot, SpillFile, SpillWriter};

/// A report's compared tensors (cheap to clone: a spilled list shares its file).
#[derive(Clone)]
pub struct TensorList(Arc<Repr>);

#[derive(Clone)]
enum Repr {
    Memory(Vec<TensorComparison>),
    Spilled(Spilled),
}

#[derive(Clone)]
struct Spilled {
    file: SpillFile,
    slots: Vec<Slot>,
    /// The tensors read back into memory (those the report names), by index.
    pinned: BTreeMap<usize, TensorComparison>,
    /// How many are beyond their tolerance.
    diverged: usize,
}

impl TensorList {
    /// How many tensors.
    pub fn len(&self) -> usize {
        match &*self.0 {
            Repr::Memory(v) => v.len(),
            Repr::Spilled(s) => s.slots.len(),
        }
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the list lies in a spill file.
    pub fn is_spilled(&self) -> bool {
        matches!(&*self.0, Repr::Spilled(_))
    }

    /// The tensor at `i` if it is in memory: any of a list held in memory; of a spilled list,
    /// those read back when it was made (the report's first divergence, last good tensor
    /// and worst tensors). [`TensorList::read`] reads any.
    pub fn get(&self, i: usize) -> Option<&TensorComparison> {
        match &*self.0 {
            Repr::Memory(v) => v.get(i),
            Repr::Spilled(s) => s.pinned.get(&i),
        }
    }

    /// [`TensorList::get`], mutable.
    pub fn get_mut(&mut self, i: usize) -> Option<&mut TensorComparison> {
        match Arc::make_mut(&mut self.0) {
            Repr::Memory(v) => v.get_mut(i),
            Repr::Spilled(s) => s.pinned.get_mut(&i),
        }
    }

    /// Every tensor in memory ([`TensorList::get`]), mutable.
    pub fn in_memory_mut(&mut self) -> Box<dyn Iterator<Item = &mut TensorComparison> + '_> {
        match Arc::make_mut(&mut self.0) {
            Repr::Memory(v) => Box::new(v.iter_mut()),
            Repr::Spilled(s) => Box::new(s.pinned.values_mut()),
        }
    }

    /// The tensor at `i`, read back from the spill file if it is not in memory.
    pub fn read(&self, i: usize) -> std::io::Result<Cow<'_, TensorComparison>> {
        match &*self.0 {
            Repr::Memory(v) => v.get(i).map(Cow::Borrowed).ok_or_else(|| out_of_range(i)),
            Repr::Spilled(s) => match s.pinned.get(&i) {
                Some(t) => Ok(Cow::Borrowed(t)),
                None => {
                    let slot = *s.slots.get(i).ok_or_else(|| out_of_range(i))?;
                    s.file.read(slot).map(Cow::Owned)
                }
            },
        }
    }

    /// Every tensor in order ([`TensorList::read`]).
    pub fn iter(&self) -> impl Iterator<Item = std::io::Result<Cow<'_, TensorComparison>>> {
        (0..self.len()).map(|i| self.read(i))
    }

    /// How many are beyond their tolerance.
    pub fn diverged(&self) -> usize {
        match &*self.0 {
            Repr::Memory(v) => v.iter().filter(|t| t.diverged).count(),
            Repr::Spilled(s) => s.diverged,
        }
    }

    /// The tensors, all in memory.
    pub fn into_vec(self) -> std::io::Result<Vec<TensorComparison>> {
        let list = match Arc::try_unwrap(self.0) {
            Ok(Repr::Memory(v)) => return Ok(v),
            Ok(spilled) => TensorList(Arc::new(spilled)),
            Err(shared) => TensorList(shared),
        };
        list.iter().map(|t| t.map(Cow::into_owned)).collect()
    }
}

fn out_of_range(i: usize) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::NotFound,
        format!("no compared tensor {i}"),
    )
}

impl From<Vec<TensorComparison>> for TensorList {
    fn from(v: Vec<TensorComparison>) -> TensorList {
        TensorList(Arc::new(Repr::Memory(v)))
    }
}

impl Default for TensorList {
    fn default() -> TensorList {
        Vec::new().into()
    }
}

/// Builds a [`TensorList`] in order: in memory, or in a spill file.
pub struct TensorListBuilder {
    out: Building,
    diverged: usize,
}

enum Building {
    Memory(Vec<TensorComparison>),
    Spill(SpillWriter, Vec<Slot>),
}

impl TensorListBuilder {
    /// A list held in memory.
    pub fn in_memory() -> TensorListBuilder {
        TensorListBuilder {
            out: Building::Memory(Vec::new()),
            diverged: 0,
        }
    }

    /// A list written to a new spill file.
    pub fn spilled() -> std::io::Result<TensorListBuilder> {
        Ok(TensorListBuilder {
            out: Building::Spill(SpillWriter::new()?, Vec::new()),
            diverged: 0,
        })
    }

    /// Adds the next tensor.
    pub fn push(&mut self, t: TensorComparison) -> std::io::Result<()> {
        self.diverged += usize::from(t.diverged);
        match &mut self.out {
            Building::Memory(v) => v.push(t),
            Building::Spill(w, slots) => slots.push(w.append(&t)?),
        }
        Ok(())
    }

    /// The list, with the tensors at `pin` (those a report names) read back into memory.
    pub fn finish(self, pin: impl IntoIterator<Item = usize>) -> std::io::Result<TensorList> {
        match self.out {
            Building::Memory(v) => Ok(v.into()),
            Building::Spill(w, slots) => {
                let file = w.finish()?;
                let mut pinned = BTreeMap::new();
                for i in pin {
                    if let Some(&slot) = slots.get(i) {
                        pinned.insert(i, file.read(slot)?);
                    }
                }
                Ok(TensorList(Arc::new(Repr::Spilled(Spilled {
                    file,
                    slots,
                    pinned,
                    diverged: self.diverged,
                }))))
            }
        }
    }
}

impl Serialize for TensorList {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.len()))?;
        for t in self.iter() {
            let t = t.map_err(|e| {
                S::Error::custom(format!(
                    "the comparison's results could not be read back: {e}"
                ))
            })?;
            seq.serialize_element(&*t)?;
        }
        seq.end()
    }
}

impl<'de> Deserialize<'de> for TensorList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<TensorList, D::Error> {
        Vec::<TensorComparison>::deserialize(d).map(TensorList::from)
    }
}

impl PartialEq for TensorList {
    /// Equal tensors in the same order (a list that cannot be read back equals none).
    fn eq(&self, other: &TensorList) -> bool {
        self.len() == other.len()
            && self
                .iter()
                .zip(other.iter())
                .all(|(a, b)| matches!((a, b), (Ok(a), Ok(b)) if a == b))
    }
}

impl std::fmt::Debug for TensorList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &*self.0 {
            Repr::Memory(v) => f.debug_list().entries(v).finish(),
            Repr::Spilled(s) => write!(
                f,
                "TensorList {{ spilled: {} tensors, {} in memory }}",
                s.slots.len(),
                s.pinned.len()
            ),
        }
    }
}
