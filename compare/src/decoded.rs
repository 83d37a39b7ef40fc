//! Decoded tensors kept for what reads them again, within a byte budget: each stored blob
//! is decoded once while its values are held, however many ops, windows, ranks or steps
//! read it (a deduplicated tensor that the next op reads, a reference GEMM output a
//! reduction reads again, a weight the update search reads twice).
//!
//! Values are shared (`Arc`), never copied, between the walk, the window decoded ahead and
//! the tensors whose bytes are the same blob (references, replicas stored alike). The least
//! recently read are dropped first once the budget would be passed; what is dropped is
//! decoded again when read, with the same result (decoding is a pure function of the stored
//! bytes), so the budget changes how often a blob is decoded, never a number of the report.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use ttrace_format::dtype::DType;

use crate::prefetch::TensorAt;

/// A tensor's values as `f32`, shared by every tensor whose bytes they are.
pub type Shared = Arc<Vec<f32>>;

/// What identifies a tensor's bytes in its record: CRC-32, length and element type.
pub type Checked = (u32, u64, DType);

/// One kept tensor.
struct Entry {
    values: Shared,
    checked: Checked,
}

/// Decoded tensors by where they are stored, least recently read dropped first.
pub struct DecodedCache {
    /// By where they are stored, least recently read first.
    entries: lru::LruCache<TensorAt, Entry>,
    /// Entries per shared value (by address): its bytes count once, however many tensors
    /// share it.
    owners: HashMap<usize, u32>,
    bytes: u64,
    budget: u64,
    /// Buffers of values dropped, for the next tensors decoded: no fresh allocation (and
    /// page faults) per tensor.
    spare: Spares,
    spare_bytes: u64,
}

/// Spare buffers by capacity: the smallest that holds a tensor, or the smallest of all, is
/// found without a scan (the demo keeps thousands of small ones).
#[derive(Default)]
struct Spares(BTreeMap<usize, Vec<Vec<f32>>>);

impl Spares {
    /// Takes the smallest buffer of at least `n` values (`None`: the smallest of all).
    fn take(&mut self, n: Option<usize>) -> Option<Vec<f32>> {
        let cap = match n {
            Some(n) => *self.0.range(n..).next()?.0,
            None => *self.0.first_key_value()?.0,
        };
        let list = self.0.get_mut(&cap)?;
        let b = list.pop();
        if list.is_empty() {
            self.0.remove(&cap);
        }
        b
    }

    /// Keeps `b` for [`Spares::take`].
    fn put(&mut self, b: Vec<f32>) {
        self.0.entry(b.capacity()).or_default().push(b);
    }
}

impl DecodedCache {
    /// An empty cache that keeps at most `budget` bytes of values.
    pub fn new(budget: u64) -> DecodedCache {
        DecodedCache {
            entries: lru::LruCache::unbounded(),
            owners: HashMap::new(),
            bytes: 0,
            budget,
            spare: Spares::default(),
            spare_bytes: 0,
        }
    }

    /// An empty buffer for `n` values: a spare one that holds them (the smallest), or a new
    /// one.
    pub fn buffer(&mut self, n: usize) -> Vec<f32> {
        match self.spare.take(Some(n)) {
            Some(b) => {
                self.spare_bytes -= b.capacity() as u64 * 4;
                b
            }
            None => Vec::with_capacity(n),
        }
    }

    /// Keeps the buffer of `values` as a spare when nothing else holds it and the spares
    /// stay within the budget (the largest kept first). Spares are pages already touched: a
    /// tensor decoded into one costs no page faults, where a fresh buffer of a tensor's size
    /// faults in every page. On the large benchmark config, spares up to the budget instead of
    /// an eighth of it took 2-4% less time (two rounds of six and eight alternating runs), peak
    /// memory no higher.
    fn recycle(&mut self, values: Shared) {
        let Ok(mut b) = Arc::try_unwrap(values) else {
            return;
        };
        let bytes = b.capacity() as u64 * 4;
        if bytes == 0 || bytes > self.budget {
            return;
        }
        while self.spare_bytes + bytes > self.budget {
            let Some(dropped) = self.spare.take(None) else {
                break;
            };
            self.spare_bytes -= dropped.capacity() as u64 * 4;
            if dropped.capacity() as u64 * 4 >= bytes {
                // Not worth more than the one dropped: keep that one instead.
                self.spare_bytes += dropped.capacity() as u64 * 4;
                self.spare.put(dropped);
                return;
            }
        }
        b.clear();
        self.spare_bytes += bytes;
        self.spare.put(b);
    }

    /// Keeps at most `bytes` from now on (dropping what is over at the next insertion).
    pub fn set_budget(&mut self, bytes: u64) {
        self.budget = bytes;
    }

    /// The most bytes it keeps.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Bytes of values kept (each shared value once).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether the values of `at` are kept.
    pub fn contains(&self, at: &TensorAt) -> bool {
        self.entries.contains(at)
    }

    /// The values of `at` and what identifies their bytes, marked as just read.
    pub fn get(&mut self, at: &TensorAt) -> Option<(Shared, Checked)> {
        let e = self.entries.get(at)?;
        Some((Arc::clone(&e.values), e.checked))
    }

    /// The values of `at` and what identifies their bytes, leaving what was read last as it
    /// was (for a look from the decoding ahead, which is not a read by the walk).
    pub fn peek(&self, at: &TensorAt) -> Option<(Shared, Checked)> {
        self.entries
            .peek(at)
            .map(|e| (Arc::clone(&e.values), e.checked))
    }

    /// Keeps `values` as those of `at` (whose record gives `checked`), dropping the least
    /// recently read first while the budget would be passed. A value larger than the whole
    /// budget is not kept.
    pub fn insert(&mut self, at: TensorAt, values: Shared, checked: Checked) {
        self.remove(&at);
        let key = Arc::as_ptr(&values) as usize;
        let new_bytes = if self.owners.contains_key(&key) {
            0
        } else {
            values.capacity() as u64 * 4
        };
        if new_bytes > self.budget {
            return;
        }
        while self.bytes + new_bytes > self.budget {
            let Some((_, oldest)) = self.entries.pop_lru() else {
                break;
            };
            self.release(oldest);
        }
        *self.owners.entry(key).or_insert(0) += 1;
        self.bytes += new_bytes;
        self.entries.put(at, Entry { values, checked });
    }

    /// Drops everything kept, spare buffers included.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.owners.clear();
        self.bytes = 0;
        self.spare = Spares::default();
        self.spare_bytes = 0;
    }

    fn remove(&mut self, at: &TensorAt) {
        if let Some(e) = self.entries.pop(at) {
            self.release(e);
        }
    }

    /// Lets go of a kept entry: its values' bytes once no other entry shares them.
    fn release(&mut self, e: Entry) {
        let key = Arc::as_ptr(&e.values) as usize;
        if let Some(n) = self.owners.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                self.owners.remove(&key);
                self.bytes -= e.values.capacity() as u64 * 4;
                self.recycle(e.values);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vals(n: usize) -> Shared {
        Arc::new(vec![1.0; n])
    }

    const BF16: Checked = (7, 8, DType::BF16);

    #[test]
    fn the_least_recently_read_go_first_and_the_budget_holds() {
        let mut c = DecodedCache::new(300);
        c.insert((0, 0, 1, 0), vals(25), BF16); // 100 bytes each
        c.insert((0, 0, 2, 0), vals(25), BF16);
        c.insert((0, 0, 3, 0), vals(25), BF16);
        assert!(c.get(&(0, 0, 1, 0)).is_some()); // seq 2 is now the least recently read
        c.insert((0, 0, 4, 0), vals(25), BF16);
        assert!(!c.contains(&(0, 0, 2, 0)));
        for seq in [1, 3, 4] {
            assert!(c.contains(&(0, 0, seq, 0)), "seq {seq}");
        }
        assert_eq!(c.bytes(), 300);
        // Larger than the budget: not kept, nothing dropped for it.
        c.insert((0, 0, 5, 0), vals(100), BF16);
        assert!(!c.contains(&(0, 0, 5, 0)));
        assert_eq!(c.bytes(), 300);
    }

    #[test]
    fn values_shared_by_several_tensors_count_once_and_stay_while_one_holds_them() {
        let mut c = DecodedCache::new(200);
        let w = vals(25);
        c.insert((0, 0, 1, 0), Arc::clone(&w), BF16);
        c.insert((1, 0, 1, 0), Arc::clone(&w), BF16); // a replica stored alike
        assert_eq!(c.bytes(), 100);
        c.insert((0, 0, 2, 0), vals(25), BF16);
        assert_eq!(c.bytes(), 200);
        // Room for 100 more: the least recently read entries go until it fits, and the
        // shared values' bytes only when their last entry goes.
        c.insert((0, 0, 3, 0), vals(25), BF16);
        assert!(!c.contains(&(0, 0, 1, 0)) && !c.contains(&(1, 0, 1, 0)));
        assert_eq!(c.bytes(), 200);
        let (got, checked) = c.get(&(0, 0, 2, 0)).expect("kept");
        assert_eq!((got.len(), checked), (25, BF16));
        c.clear();
        assert_eq!((c.bytes(), c.contains(&(0, 0, 2, 0))), (0, false));
    }

    #[test]
    fn buffers_of_dropped_values_nothing_else_holds_are_reused() {
        // 200 bytes kept, spares up to as much: two buffers of 100 bytes.
        let mut c = DecodedCache::new(200);
        c.insert((0, 0, 0, 0), vals(25), BF16);
        c.insert((0, 0, 1, 0), vals(25), BF16);
        let held = c.get(&(0, 0, 0, 0)).expect("kept").0; // seq 1 is the least recently read
        c.insert((0, 0, 2, 0), vals(25), BF16); // drops seq 1: a spare
        c.insert((0, 0, 3, 0), vals(25), BF16); // drops seq 0, which is held: no spare
        c.insert((0, 0, 4, 0), vals(25), BF16); // drops seq 2: a spare
        c.insert((0, 0, 5, 0), vals(25), BF16); // drops seq 3: no room for a third spare
        assert!(!c.contains(&(0, 0, 0, 0)) && c.contains(&(0, 0, 5, 0)));
        for _ in 0..2 {
            let b = c.buffer(20);
            assert!(b.is_empty() && b.capacity() >= 25, "a spare is reused");
        }
        assert!(c.buffer(20).capacity() < 25, "only two spares were kept");
        drop(held);
    }
}
