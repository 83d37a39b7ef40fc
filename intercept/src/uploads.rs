//! The host bytes of recent small host-to-device copies, by device destination: where a
//! pointer-array GEMM finds the matrix addresses its device arrays hold without reading the
//! device (which would synchronise, invariant 3).
//!
//! The bytes are those of the host source when the copy was called: what `cudaMemcpy` copies
//! (pageable or pinned), what `cudaMemcpyAsync` copies from pageable memory (staged at the
//! call), and what it copies from pinned memory unless the program rewrites the source before
//! the copy runs. That last assumption, and any device-side write into a remembered range that
//! no hook sees (a kernel), is checked for every use: the GEMM's record also snapshots the
//! device arrays as the op read them, and the tracer compares (tracer.rs).
//!
//! Bounded: at most [`MAX_ENTRIES`] copies and [`MAX_BYTES`] bytes, least recently used first
//! out. A write the hooks see into a remembered range (a later upload, a device-to-device
//! copy) replaces or forgets it.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// The largest copy remembered (pointer arrays of up to 8192 matrices).
pub const MAX_COPY: usize = 64 * 1024;
/// Copies remembered at most.
const MAX_ENTRIES: usize = 1024;
/// Host bytes remembered at most.
const MAX_BYTES: usize = 4 << 20;

/// One remembered copy.
struct Upload {
    bytes: Vec<u8>,
    /// Last use, for eviction.
    used: u64,
}

/// Remembered copies by device start address (ranges never overlap).
#[derive(Default)]
struct Memo {
    by_dst: BTreeMap<u64, Upload>,
    bytes: usize,
    clock: u64,
}

impl Memo {
    /// Forgets every copy overlapping `dst..dst + len`.
    fn forget(&mut self, dst: u64, len: u64) {
        let end = dst.saturating_add(len);
        let hit: Vec<u64> = self
            .by_dst
            .range(..end)
            .rev()
            .take_while(|(start, u)| start.saturating_add(u.bytes.len() as u64) > dst)
            .map(|(start, _)| *start)
            .collect();
        for start in hit {
            if let Some(u) = self.by_dst.remove(&start) {
                self.bytes -= u.bytes.len();
            }
        }
    }

    fn remember(&mut self, dst: u64, bytes: Vec<u8>) {
        self.forget(dst, bytes.len() as u64);
        self.clock += 1;
        self.bytes += bytes.len();
        let used = self.clock;
        self.by_dst.insert(dst, Upload { bytes, used });
        while self.by_dst.len() > MAX_ENTRIES || self.bytes > MAX_BYTES {
            let Some(oldest) = self
                .by_dst
                .iter()
                .min_by_key(|(_, u)| u.used)
                .map(|(k, _)| *k)
            else {
                break;
            };
            if let Some(u) = self.by_dst.remove(&oldest) {
                self.bytes -= u.bytes.len();
            }
        }
    }

    /// The bytes at `ptr..ptr + len` when one remembered copy holds them all.
    fn find(&mut self, ptr: u64, len: u64) -> Option<Vec<u8>> {
        self.clock += 1;
        let clock = self.clock;
        let (start, u) = self.by_dst.range_mut(..=ptr).next_back()?;
        let from = (ptr - start) as usize;
        let to = from.checked_add(usize::try_from(len).ok()?)?;
        let bytes = u.bytes.get(from..to)?.to_vec();
        u.used = clock;
        Some(bytes)
    }
}

static MEMO: Mutex<Option<Memo>> = Mutex::new(None);

fn with<R>(f: impl FnOnce(&mut Memo) -> R) -> R {
    let mut g = MEMO.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(Memo::default))
}

/// Whether a copy of `len` bytes is small enough to remember.
pub fn wanted(len: usize) -> bool {
    len > 0 && len <= MAX_COPY
}

/// Remembers `bytes` as now uploaded to `dst` (a copy that succeeded).
pub fn remember(dst: u64, bytes: Vec<u8>) {
    if dst != 0 && wanted(bytes.len()) {
        with(|m| m.remember(dst, bytes));
    }
}

/// Forgets what was remembered of `dst..dst + len` (the device wrote there).
pub fn forget(dst: u64, len: u64) {
    with(|m| m.forget(dst, len));
}

/// The host bytes last uploaded to `ptr..ptr + len`, if one remembered copy covers them.
pub fn find(ptr: u64, len: u64) -> Option<Vec<u8>> {
    if ptr == 0 || len == 0 {
        return None;
    }
    with(|m| m.find(ptr, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_inside_one_upload_is_found_and_one_across_uploads_is_not() {
        let mut m = Memo::default();
        m.remember(0x1000, (0..48u8).collect());
        m.remember(0x1030, vec![9; 16]);
        // Aarray, Barray, Carray as three parts of one upload.
        assert_eq!(m.find(0x1010, 16), Some((16..32u8).collect()));
        assert_eq!(m.find(0x1000, 48).map(|b| b.len()), Some(48));
        assert_eq!(m.find(0x1030, 16), Some(vec![9; 16]));
        assert_eq!(m.find(0x1028, 16), None, "spans two uploads");
        assert_eq!(m.find(0x0ff8, 8), None, "before any upload");
    }

    #[test]
    fn a_later_write_over_part_of_an_upload_forgets_it() {
        let mut m = Memo::default();
        m.remember(0x1000, vec![1; 64]);
        m.remember(0x2000, vec![2; 64]);
        m.forget(0x1020, 8);
        assert_eq!(m.find(0x1000, 8), None);
        assert_eq!(m.find(0x2000, 8), Some(vec![2; 8]));
        // A new upload over the old range replaces it.
        m.remember(0x1ff0, vec![3; 32]);
        assert_eq!(m.find(0x2000, 8), Some(vec![3; 8]));
        assert_eq!(
            m.find(0x2010, 8),
            None,
            "the rest of the old upload is gone"
        );
        assert_eq!(m.bytes, 32);
    }

    #[test]
    fn memory_is_bounded_and_the_least_recently_used_goes_first() {
        let mut m = Memo::default();
        let each = MAX_COPY;
        let n = MAX_BYTES / each;
        for i in 0..n as u64 {
            m.remember(i << 20, vec![i as u8; each]);
        }
        // Use the first: the second is now the oldest.
        assert!(m.find(0, 8).is_some());
        m.remember((n as u64) << 20, vec![0; each]);
        assert!(m.bytes <= MAX_BYTES);
        assert!(m.find(0, 8).is_some());
        assert_eq!(m.find(1 << 20, 8), None);
        for i in 0..(2 * MAX_ENTRIES) as u64 {
            m.remember((1 << 40) + i * 64, vec![1; 8]);
        }
        assert!(m.by_dst.len() <= MAX_ENTRIES);
    }
}
