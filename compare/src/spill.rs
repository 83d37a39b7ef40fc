//! An append-only temporary file of serialized items, read back by position: where a
//! comparison of many steps puts its results instead of holding them all in memory
//! ([`crate::results`], [`crate::report::TensorList`]).
//!
//! The file is unlinked from the start (`tempfile::tempfile`, in `TMPDIR`): nothing is left
//! behind however the process ends, and no other user can open it by name.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Writes the items of a list that lies partly in spill files as one JSON array, each read
/// back in turn (`items`, `len` of them): an item that cannot be read back fails the whole.
pub(crate) fn serialize_read_back<S, T, R>(
    s: S,
    len: usize,
    items: impl Iterator<Item = std::io::Result<R>>,
) -> Result<S::Ok, S::Error>
where
    S: serde::Serializer,
    T: Serialize + ?Sized,
    R: std::ops::Deref<Target = T>,
{
    use serde::ser::{Error as _, SerializeSeq};
    let mut seq = s.serialize_seq(Some(len))?;
    for item in items {
        let item = item.map_err(|e| {
            S::Error::custom(format!(
                "the comparison's results could not be read back: {e}"
            ))
        })?;
        seq.serialize_element(&*item)?;
    }
    seq.end()
}

/// Whether two lists that lie partly in spill files hold equal items in the same order (a
/// list that cannot be read back equals none).
pub(crate) fn equal_read_back<T: PartialEq + ?Sized, R: std::ops::Deref<Target = T>>(
    (a_len, a): (usize, impl Iterator<Item = std::io::Result<R>>),
    (b_len, b): (usize, impl Iterator<Item = std::io::Result<R>>),
) -> bool {
    a_len == b_len
        && a.zip(b)
            .all(|(x, y)| matches!((x, y), (Ok(x), Ok(y)) if *x == *y))
}

/// Where one item lies in its spill file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// Byte offset of its JSON.
    pub offset: u64,
    /// Length of its JSON.
    pub len: u32,
}

/// A spill file being written.
pub struct SpillWriter {
    out: BufWriter<File>,
    offset: u64,
}

impl SpillWriter {
    /// A new, empty spill file.
    pub fn new() -> std::io::Result<SpillWriter> {
        Ok(SpillWriter {
            out: BufWriter::with_capacity(1 << 20, tempfile::tempfile()?),
            offset: 0,
        })
    }

    /// A spill file written to `file` (the tests' full disk).
    #[cfg(test)]
    pub fn on(file: File) -> SpillWriter {
        SpillWriter {
            out: BufWriter::with_capacity(1 << 20, file),
            offset: 0,
        }
    }

    /// Appends `item` (as compact JSON) and says where it lies.
    pub fn append(&mut self, item: &impl Serialize) -> std::io::Result<Slot> {
        let bytes = serde_json::to_vec(item)?;
        let len = u32::try_from(bytes.len())
            .map_err(|_| std::io::Error::other("an item of more than 4 GiB"))?;
        self.out.write_all(&bytes)?;
        let slot = Slot {
            offset: self.offset,
            len,
        };
        self.offset += u64::from(len);
        Ok(slot)
    }

    /// The file, every item written out, for reading.
    pub fn finish(self) -> std::io::Result<SpillFile> {
        let file = self.out.into_inner().map_err(|e| e.into_error())?;
        Ok(SpillFile {
            file: Arc::new(file),
        })
    }
}

/// A spill file written, read by slot (shared: clones read the same file).
#[derive(Debug, Clone)]
pub struct SpillFile {
    file: Arc<File>,
}

impl SpillFile {
    /// The item at `slot`.
    pub fn read<T: DeserializeOwned>(&self, slot: Slot) -> std::io::Result<T> {
        let mut buf = vec![0u8; slot.len as usize];
        self.file.read_exact_at(&mut buf, slot.offset)?;
        serde_json::from_slice(&buf).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "a spilled result at byte {} does not read back: {e}",
                    slot.offset
                ),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_read_back_as_written_in_any_order() {
        let mut w = SpillWriter::new().expect("a temporary file");
        let items: Vec<(u32, String, f64)> = (0..100)
            .map(|i| {
                (
                    i,
                    format!("item {i}").repeat(i as usize % 7),
                    f64::from(i) / 3.0,
                )
            })
            .collect();
        let slots: Vec<Slot> = items
            .iter()
            .map(|it| w.append(it).expect("append"))
            .collect();
        let f = w.finish().expect("finish");
        for i in (0..100).rev().step_by(3) {
            let back: (u32, String, f64) = f.read(slots[i]).expect("read");
            assert_eq!(back, items[i]);
        }
        // A slot that does not hold an item is an error, not a wrong item.
        let bad = Slot {
            offset: slots[5].offset + 1,
            len: slots[5].len,
        };
        assert!(f.read::<(u32, String, f64)>(bad).is_err());
    }
}
