//! The compared tensors of a report ([`CompareReport::tensors`](super::CompareReport)), in
//! execution order: held in memory, or, for a comparison whose results outgrew their share of
//! `--memory`, partly left in the spill files the comparison wrote them to
//! ([`crate::results`]) with only the tensors the report names (its first divergence, the
//! last good tensor before it, the worst ones) read back into memory. Written as a JSON
//! array either way.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::TensorComparison;
use crate::results::SpilledComparison;
use crate::spill::{Slot, SpillFile};

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
    files: Vec<SpillFile>,
    /// Where each tensor is.
    items: Vec<Listed>,
    /// The tensors held (those the comparison held in memory).
    held: Vec<TensorComparison>,
    /// Tensors of the spill files read back into memory (those the report names), by index.
    pinned: BTreeMap<usize, TensorComparison>,
    /// How many are beyond their tolerance.
    diverged: usize,
}

/// Where one tensor of a partly spilled list is.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Listed {
    /// In the list's held tensors, at this index.
    Memory(usize),
    /// In spill file `.0`, as the comparison's results write them
    /// ([`crate::results`]: the comparison and what a partial report keeps of it).
    Spilled(usize, Slot),
}

impl TensorList {
    /// How many tensors.
    pub fn len(&self) -> usize {
        match &*self.0 {
            Repr::Memory(v) => v.len(),
            Repr::Spilled(s) => s.items.len(),
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
    /// those held and those read back when it was made (the report's first divergence, last
    /// good tensor and worst tensors). [`TensorList::read`] reads any.
    pub fn get(&self, i: usize) -> Option<&TensorComparison> {
        match &*self.0 {
            Repr::Memory(v) => v.get(i),
            Repr::Spilled(s) => match s.items.get(i)? {
                Listed::Memory(m) => s.held.get(*m),
                Listed::Spilled(..) => s.pinned.get(&i),
            },
        }
    }

    /// [`TensorList::get`], mutable.
    pub fn get_mut(&mut self, i: usize) -> Option<&mut TensorComparison> {
        match Arc::make_mut(&mut self.0) {
            Repr::Memory(v) => v.get_mut(i),
            Repr::Spilled(s) => match s.items.get(i)? {
                Listed::Memory(m) => s.held.get_mut(*m),
                Listed::Spilled(..) => s.pinned.get_mut(&i),
            },
        }
    }

    /// Every tensor in memory ([`TensorList::get`]), mutable.
    pub fn in_memory_mut(&mut self) -> Box<dyn Iterator<Item = &mut TensorComparison> + '_> {
        match Arc::make_mut(&mut self.0) {
            Repr::Memory(v) => Box::new(v.iter_mut()),
            Repr::Spilled(s) => Box::new(s.held.iter_mut().chain(s.pinned.values_mut())),
        }
    }

    /// The tensor at `i`, read back from its spill file if it is not in memory.
    pub fn read(&self, i: usize) -> std::io::Result<Cow<'_, TensorComparison>> {
        if let Some(t) = self.get(i) {
            return Ok(Cow::Borrowed(t));
        }
        match &*self.0 {
            Repr::Spilled(s) => match s.items.get(i) {
                Some(&Listed::Spilled(f, slot)) => {
                    read_spilled(&s.files, f, slot, i).map(Cow::Owned)
                }
                _ => Err(out_of_range(i)),
            },
            Repr::Memory(_) => Err(out_of_range(i)),
        }
    }

    /// The tensor at `i` for a report's text or page: [`TensorList::read`], a tensor that
    /// cannot be read back said as a warning (naming it and why) and left out.
    pub fn named(&self, i: usize) -> Option<Cow<'_, TensorComparison>> {
        match self.read(i) {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!("compared tensor {i} is left out of the report's text: {e}");
                None
            }
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

/// Tensor `i` of the list, at `slot` of spill file `file`, with its position.
fn read_spilled(
    files: &[SpillFile],
    file: usize,
    slot: Slot,
    i: usize,
) -> std::io::Result<TensorComparison> {
    let f = files.get(file).ok_or_else(|| out_of_range(i))?;
    let mut t = f.read::<SpilledComparison>(slot)?.cmp;
    t.position = i as u64;
    Ok(t)
}

impl TensorList {
    /// A list of `items`, in order, `held` in memory or spilled to `files` (`diverged` of them
    /// beyond their tolerance), the spilled ones at `pin` read back into memory.
    pub(crate) fn from_parts(
        files: Vec<SpillFile>,
        items: Vec<Listed>,
        held: Vec<TensorComparison>,
        diverged: usize,
        pin: impl IntoIterator<Item = usize>,
    ) -> std::io::Result<TensorList> {
        if files.is_empty() {
            // Nothing spilled: every item is held, in order.
            return Ok(held.into());
        }
        let mut pinned = BTreeMap::new();
        for i in pin {
            if let Some(&Listed::Spilled(f, slot)) = items.get(i) {
                pinned.insert(i, read_spilled(&files, f, slot, i)?);
            }
        }
        Ok(TensorList(Arc::new(Repr::Spilled(Spilled {
            files,
            items,
            held,
            pinned,
            diverged,
        }))))
    }
}

impl Serialize for TensorList {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        crate::spill::serialize_read_back(s, self.len(), self.iter())
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
        crate::spill::equal_read_back((self.len(), self.iter()), (other.len(), other.iter()))
    }
}

impl std::fmt::Debug for TensorList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &*self.0 {
            Repr::Memory(v) => f.debug_list().entries(v).finish(),
            Repr::Spilled(s) => write!(
                f,
                "TensorList {{ {} tensors, {} held, {} read back }}",
                s.items.len(),
                s.held.len(),
                s.pinned.len()
            ),
        }
    }
}
