//! The snapshot ring: a byte FIFO in a `memfd` that one traced process (the producer) shares
//! with `ttraced` (the consumer).
//!
//! The producer creates the memfd, pins the mapping for DMA (`cudaHostRegister`), and sends the
//! fd to the daemon with its `Hello`. D2H snapshot copies land directly in the ring (the one
//! host copy of invariant 4); record metadata travels over the socket in a `Publish` message
//! naming the slot. Because the daemon holds its own mapping, a producer that crashes loses
//! nothing it had published.
//!
//! Layout: a 4 KiB header, then `capacity` data bytes. Positions are monotonic byte counters
//! (`pos % capacity` is the offset in the data area), so `head - tail` is the bytes in use:
//! * `head` (producer): bytes reserved so far;
//! * `tail` (consumer): bytes released so far;
//! * `released` (consumer): a futex word bumped after every release, which a producer waiting
//!   for space sleeps on;
//! * `taken` (producer): snapshots (records and gaps) handed to its tracer so far;
//! * `dropped` (producer): of those, the ones it chose not to publish (outside `--steps`).
//!
//! The last two let the daemon account for a producer that died, SIGKILL included: what it
//! had taken and neither published nor dropped was lost with it.
//!
//! Slots are reserved and released in order, and never wrap: a slot that does not fit before
//! the end of the data area starts at the next multiple of `capacity`, and the skipped bytes
//! are released with it. Slots are 64-byte aligned. An empty ring starts over at the data
//! area's beginning (the producer releases the bytes it skips): a producer that keeps up with
//! its consumer keeps reusing the same pages ([`Ring::reserve`]). A ring that is not empty never
//! holds free space back: a burst that cannot wait for releases (a CUDA graph replay, an NCCL
//! group, whose first ticket the consumer waits for) gets every free byte.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::FormatError;

/// `b"TTRING01"` as a little-endian integer.
pub const RING_MAGIC: u64 = u64::from_le_bytes(*b"TTRING01");
/// Layout version.
pub const RING_VERSION: u32 = 1;
/// Bytes before the data area.
pub const HEADER_BYTES: usize = 4096;
/// Slot alignment (and of each tensor inside a slot).
pub const ALIGN: u64 = 64;

// Header field offsets (separate cache lines for fields written by different processes).
const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 8;
const OFF_CAPACITY: usize = 16;
const OFF_HEAD: usize = 128;
const OFF_TAIL: usize = 256;
const OFF_RELEASED: usize = 384;
const OFF_TAKEN: usize = 512;
const OFF_DROPPED: usize = 640;

/// Rounds `n` up to the slot alignment.
pub const fn align(n: u64) -> u64 {
    n.div_ceil(ALIGN) * ALIGN
}

/// Where each tensor of a slot starts: tensor `i` at `align(end of tensor i-1)`.
pub fn tensor_offsets(sizes: &[u64]) -> (Vec<u64>, u64) {
    let mut end = 0u64;
    let offsets = sizes.iter().map(|&s| pack(&mut end, s)).collect();
    (offsets, end)
}

/// Where the next tensor of `len` bytes goes in a slot whose tensors so far end at `*end`
/// (at that end, aligned), moving `*end` past it: the one packing rule of
/// [`tensor_offsets`], for callers that place tensors one at a time.
pub fn pack(end: &mut u64, len: u64) -> u64 {
    let at = *end;
    *end = align(at + len);
    at
}

/// Total bytes of a ring mapping with `capacity` data bytes.
pub const fn mapping_bytes(capacity: u64) -> usize {
    HEADER_BYTES + capacity as usize
}

/// A mapped ring. The mapping is owned by the caller (producer or consumer) and must outlive
/// the view.
pub struct Ring {
    base: *mut u8,
    capacity: u64,
}

// SAFETY: all shared state is accessed through atomics or through slots whose ownership the
// FIFO protocol hands from producer to consumer.
unsafe impl Send for Ring {}
// SAFETY: as above.
unsafe impl Sync for Ring {}

/// A reserved slot: `len` bytes at `pos`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Slot {
    /// Monotonic position of the first byte.
    pub pos: u64,
    /// Bytes reserved (a multiple of [`ALIGN`]).
    pub len: u64,
    /// Where the slot ends, counting skipped bytes: what the consumer releases to.
    pub end: u64,
}

impl Ring {
    /// Initialises the header of a fresh mapping (producer side).
    ///
    /// # Safety
    /// `base` points to a writable mapping of at least `mapping_bytes(capacity)` bytes, aligned
    /// to a page, that stays mapped while the returned view lives.
    pub unsafe fn create(base: *mut u8, capacity: u64) -> Result<Ring, FormatError> {
        if capacity < ALIGN * 2 || !capacity.is_multiple_of(ALIGN) {
            return Err(FormatError::Invalid(format!(
                "ring capacity {capacity} is not a multiple of {ALIGN} of at least {}",
                ALIGN * 2
            )));
        }
        // SAFETY: inside the header page of the caller's mapping.
        unsafe {
            std::ptr::write_bytes(base, 0, HEADER_BYTES);
            base.add(OFF_VERSION).cast::<u32>().write(RING_VERSION);
            base.add(OFF_CAPACITY).cast::<u64>().write(capacity);
        }
        let ring = Ring { base, capacity };
        // Written last, with release ordering: a consumer that sees the magic sees the rest.
        ring.atomic64(OFF_MAGIC)
            .store(RING_MAGIC, Ordering::Release);
        Ok(ring)
    }

    /// Opens a mapping made by a producer (consumer side), checking the header.
    ///
    /// # Safety
    /// `base` points to a readable and writable mapping of `len` bytes, aligned to a page, that
    /// stays mapped while the returned view lives.
    pub unsafe fn open(base: *mut u8, len: usize) -> Result<Ring, FormatError> {
        if len < HEADER_BYTES {
            return Err(FormatError::Invalid(format!(
                "ring mapping of {len} bytes has no header"
            )));
        }
        let probe = Ring { base, capacity: 0 };
        if probe.atomic64(OFF_MAGIC).load(Ordering::Acquire) != RING_MAGIC {
            return Err(FormatError::Invalid(
                "ring header has the wrong magic".into(),
            ));
        }
        // SAFETY: inside the header page.
        let (version, capacity) = unsafe {
            (
                base.add(OFF_VERSION).cast::<u32>().read(),
                base.add(OFF_CAPACITY).cast::<u64>().read(),
            )
        };
        if version != RING_VERSION {
            return Err(FormatError::Invalid(format!(
                "ring version {version}, expected {RING_VERSION}"
            )));
        }
        // A capacity below two slots (0 included: every position is taken modulo it) or that
        // does not fit the mapping comes from a hostile or broken producer.
        if capacity < ALIGN * 2
            || !capacity.is_multiple_of(ALIGN)
            || capacity > len.saturating_sub(HEADER_BYTES) as u64
        {
            return Err(FormatError::Invalid(format!(
                "ring capacity {capacity} is not a multiple of {ALIGN} of at least {} that fits \
                 a mapping of {len} bytes",
                ALIGN * 2
            )));
        }
        Ok(Ring { base, capacity })
    }

    fn atomic64(&self, off: usize) -> &AtomicU64 {
        // SAFETY: `off` is an 8-aligned offset inside the header page, which lives as long as
        // `self`; the field is only ever accessed atomically.
        unsafe { AtomicU64::from_ptr(self.base.add(off).cast()) }
    }

    fn atomic32(&self, off: usize) -> &AtomicU32 {
        // SAFETY: as in `atomic64`.
        unsafe { AtomicU32::from_ptr(self.base.add(off).cast()) }
    }

    /// Data bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes reserved so far.
    pub fn head(&self) -> u64 {
        self.atomic64(OFF_HEAD).load(Ordering::Acquire)
    }

    /// Bytes released so far.
    pub fn tail(&self) -> u64 {
        self.atomic64(OFF_TAIL).load(Ordering::Acquire)
    }

    /// Counts a snapshot handed to the producer's tracer (producer).
    pub fn note_taken(&self) {
        self.atomic64(OFF_TAKEN).fetch_add(1, Ordering::Release);
    }

    /// Counts a taken snapshot the producer chose not to publish (producer).
    pub fn note_dropped(&self) {
        self.atomic64(OFF_DROPPED).fetch_add(1, Ordering::Release);
    }

    /// Snapshots the producer took so far (as it says: a count from another process).
    pub fn taken(&self) -> u64 {
        self.atomic64(OFF_TAKEN).load(Ordering::Acquire)
    }

    /// Taken snapshots the producer chose not to publish.
    pub fn dropped(&self) -> u64 {
        self.atomic64(OFF_DROPPED).load(Ordering::Acquire)
    }

    /// Where a slot of `len` bytes reserved now would start and end (without reserving it):
    /// at `head`, or where the part of the data area it would cross ends (`part_end` of an
    /// offset: the end of its part; the data area's end at least is one), so that a slot lies
    /// in one part. `None` when no part can hold it.
    fn place(&self, head: u64, len: u64, part_end: &impl Fn(u64) -> u64) -> Option<(u64, u64)> {
        let mut start = head;
        // Each turn moves on to the next part (or lap): one lap's worth of them at most.
        while start - head <= self.capacity {
            let off = start % self.capacity;
            if off + len > self.capacity {
                start += self.capacity - off;
                continue;
            }
            let end = part_end(off).clamp(off + 1, self.capacity);
            if off + len <= end {
                return Some((start, start + len));
            }
            start += end - off;
        }
        None
    }

    /// Where a slot placed to end at `end` goes instead when that is past the producer's
    /// `front` and the ring is all but idle (the bytes in use, the slot's included, fit in a
    /// quarter of the front): at the next lap's beginning, if that space is free now. A
    /// producer that keeps nearly up with its consumer (a run outside `--steps` copying only
    /// fingerprints) then keeps to the pages it locked, instead of walking on and locking
    /// (faulting in) the next part of a large ring, as an empty ring does
    /// ([`Self::rewind_if_empty`]). The bytes skipped are released with the slot unless the
    /// producer hands them to its consumer on its own (the preload library does, so that a
    /// slot held long does not hold them). Never when the ring is busy: a burst after an
    /// early wrap has to wait for the bytes in use before it to be released instead of taking
    /// free space ahead.
    fn wrap_early(
        &self,
        head: u64,
        len: u64,
        end: u64,
        front: u64,
        part_end: &impl Fn(u64) -> u64,
    ) -> Option<(u64, u64)> {
        let off = head % self.capacity;
        let in_use = head - self.tail();
        let ends_in_front = |e: u64| (e - 1) % self.capacity < front;
        if off == 0 || ends_in_front(end) || in_use + len > front / 4 {
            return None;
        }
        let (start, end) = self.place(head + (self.capacity - off), len, part_end)?;
        (ends_in_front(end) && start % self.capacity == 0 && end - self.tail() <= self.capacity)
            .then_some((start, end))
    }

    /// Moves an empty ring (every reserved byte released) to the data area's beginning, so
    /// that a producer that keeps up with its consumer reuses the same few pages instead of
    /// walking the whole ring: its copies and the consumer's mapping touch (and fault in) only
    /// those. Nothing is in use, so the bytes skipped are released at once. Returns the head.
    fn rewind_if_empty(&self, head: u64) -> u64 {
        let off = head % self.capacity;
        // The tail only grows, up to `head`: a ring seen empty stays empty until the next
        // reservation (callers serialise them), and no consumer holds a slot to release.
        if off == 0 || self.tail() != head {
            return head;
        }
        let start = head + (self.capacity - off);
        self.atomic64(OFF_HEAD).store(start, Ordering::Release);
        self.atomic64(OFF_TAIL).fetch_max(start, Ordering::AcqRel);
        start
    }

    /// Reserves `len` bytes (producer; callers serialise reservations). Waits for space until
    /// `timeout`, then returns `None`. A request larger than the ring is refused at once.
    pub fn reserve(&self, len: u64, timeout: Duration) -> Option<Slot> {
        self.reserve_within(len, timeout, |_| self.capacity, self.capacity)
    }

    /// [`Self::reserve`] of a slot that lies in one part of the data area: `part_end` gives
    /// the end offset of the part an offset is in (the producer's page-locked registrations:
    /// a device copy must not cross from one into the next). A slot that would cross into the
    /// next part starts there; the bytes skipped are released with it. A request no part can
    /// hold is refused at once.
    ///
    /// `front`: the bytes at the data area's beginning the producer prefers (its page-locked
    /// part): a slot that would end past them starts over at the next lap's beginning instead
    /// when the ring is all but idle and that space is free now (`wrap_early`).
    pub fn reserve_within(
        &self,
        len: u64,
        timeout: Duration,
        part_end: impl Fn(u64) -> u64,
        front: u64,
    ) -> Option<Slot> {
        let len = align(len.max(1));
        if len > self.capacity {
            return None;
        }
        let deadline = Instant::now() + timeout;
        let head = self.rewind_if_empty(self.head());
        let (start, end) = self.place(head, len, &part_end)?;
        let (start, end) = self
            .wrap_early(head, len, end, front, &part_end)
            .unwrap_or((start, end));
        loop {
            let seen = self.atomic32(OFF_RELEASED).load(Ordering::Acquire);
            if end - self.tail() <= self.capacity {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            futex_wait(
                self.atomic32(OFF_RELEASED),
                seen,
                (deadline - now).min(Duration::from_millis(50)),
            );
        }
        self.atomic64(OFF_HEAD).store(end, Ordering::Release);
        Some(Slot {
            pos: start,
            len,
            end,
        })
    }

    /// The bytes of a slot, for the producer to fill (through DMA) or the consumer to read.
    ///
    /// # Safety
    /// The caller owns the slot under the FIFO protocol: the producer between `reserve` and
    /// publishing it, the consumer between receiving it and `release`.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slot_bytes(&self, slot: &Slot) -> &mut [u8] {
        let off = (slot.pos % self.capacity) as usize;
        // SAFETY: `place` guarantees the slot lies inside the data area; ownership per contract.
        unsafe {
            std::slice::from_raw_parts_mut(self.base.add(HEADER_BYTES + off), slot.len as usize)
        }
    }

    /// Checks a slot a producer announced before the consumer touches it: it must lie inside
    /// the data area without wrapping and between the released and reserved positions.
    pub fn validate(&self, slot: &Slot) -> Result<(), FormatError> {
        let off = slot.pos % self.capacity;
        let ok = slot.len > 0
            && slot.len.is_multiple_of(ALIGN)
            && off + slot.len <= self.capacity
            && slot.end == slot.pos + slot.len
            && slot.pos >= self.tail()
            && slot.end <= self.head();
        if ok {
            Ok(())
        } else {
            Err(FormatError::Invalid(format!(
                "slot {slot:?} is outside the ring (tail {}, head {}, capacity {})",
                self.tail(),
                self.head(),
                self.capacity
            )))
        }
    }

    /// Releases every byte up to `end` (consumer), waking a producer waiting for space.
    pub fn release_to(&self, end: u64) {
        self.atomic64(OFF_TAIL).fetch_max(end, Ordering::AcqRel);
        self.atomic32(OFF_RELEASED).fetch_add(1, Ordering::AcqRel);
        futex_wake(self.atomic32(OFF_RELEASED));
    }
}

/// The name the ring's memfd shows under `/proc/PID/fd` (`/memfd:ttrace-ring`).
const MEMFD_NAME: &std::ffi::CStr = c"ttrace-ring";

/// Creates the memfd a ring lives in, `len` bytes ([`mapping_bytes`]): close-on-exec (a
/// program the traced process starts does not inherit it) and sealable (the daemon seals it
/// against shrinking, [`crate::fdpass::seal_shrink`]). The one place a ring's memory is made,
/// for libttrace.so and for the daemon's test producer alike.
pub fn create_memfd(len: u64) -> std::io::Result<std::os::fd::OwnedFd> {
    use rustix::fs::{ftruncate, memfd_create, MemfdFlags};
    let fd =
        memfd_create(MEMFD_NAME, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).map_err(|e| {
            std::io::Error::new(e.kind(), format!("memfd_create for the snapshot ring: {e}"))
        })?;
    ftruncate(&fd, len).map_err(|e| {
        std::io::Error::new(e.kind(), format!("cannot size the {len}-byte ring: {e}"))
    })?;
    Ok(fd)
}

/// Sleeps while `*word == seen`, at most `timeout` (spurious wake-ups are fine).
fn futex_wait(word: &AtomicU32, seen: u32, timeout: Duration) {
    let ts = rustix::thread::futex::Timespec {
        tv_sec: timeout.as_secs() as i64,
        tv_nsec: timeout.subsec_nanos().into(),
    };
    // Not FUTEX_PRIVATE: the waker is another process sharing the mapping. A timeout, a
    // changed word or a signal all just end the wait; the caller checks again.
    let _ =
        rustix::thread::futex::wait(word, rustix::thread::futex::Flags::empty(), seen, Some(&ts));
}

/// Wakes every waiter on `word`.
fn futex_wake(word: &AtomicU32) {
    let _ =
        rustix::thread::futex::wake(word, rustix::thread::futex::Flags::empty(), i32::MAX as u32);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(capacity: u64) -> Vec<u64> {
        vec![0u64; mapping_bytes(capacity) / 8]
    }

    /// A ring of `capacity` created in `mem` (the producer's view) and opened (the consumer's).
    fn producer_and_consumer(mem: &mut [u64], capacity: u64) -> (Ring, Ring) {
        let base = mem.as_mut_ptr().cast::<u8>();
        // SAFETY: `mem` is a whole mapping of `capacity` and outlives both views (the tests
        // keep it until they end).
        unsafe {
            (
                Ring::create(base, capacity).expect("create"),
                Ring::open(base, mem.len() * 8).expect("open"),
            )
        }
    }

    /// A header announcing a capacity of 0 (or one larger than the mapping)
    /// is refused at open; it used to pass and divide by zero in the consumer.
    #[test]
    fn a_hostile_capacity_is_refused_at_open() {
        for cap in [0u64, ALIGN, 1 << 40] {
            let mut mem = mapping(1024);
            let base = mem.as_mut_ptr().cast::<u8>();
            // SAFETY: `mem` outlives the views; the capacity field is inside the header.
            let opened = unsafe {
                Ring::create(base, 1024).expect("create");
                base.add(OFF_CAPACITY).cast::<u64>().write(cap);
                Ring::open(base, mem.len() * 8)
            };
            assert!(opened.is_err(), "capacity {cap} accepted");
        }
    }

    #[test]
    fn slots_are_fifo_aligned_and_never_wrap() {
        let mut mem = mapping(1024);
        let (p, c) = producer_and_consumer(&mut mem, 1024);
        let a = p.reserve(100, Duration::ZERO).expect("fits");
        assert_eq!((a.pos, a.len), (0, 128));
        let b = p.reserve(700, Duration::ZERO).expect("fits");
        assert_eq!((b.pos, b.len), (128, 704));
        // 192 bytes left before the end: a 256-byte slot skips to the next lap, after release.
        assert!(
            p.reserve(256, Duration::from_millis(10)).is_none(),
            "no space until released"
        );
        c.validate(&a).expect("a is valid");
        c.release_to(a.end);
        c.validate(&b).expect("b is valid");
        c.release_to(b.end);
        let d = p.reserve(256, Duration::ZERO).expect("fits after release");
        assert_eq!(d.pos, 1024, "started at the next lap instead of wrapping");
        assert_eq!(d.pos % 1024, 0);
        assert!(
            p.reserve(2048, Duration::ZERO).is_none(),
            "larger than the ring"
        );
    }

    /// A producer that keeps nearly up with its consumer stays in the front it prefers (its
    /// page-locked part): past it, the next slot starts over at the next lap's beginning;
    /// with more in flight it walks on (waiting for the front would stall a burst).
    #[test]
    fn an_idle_ring_wraps_early_to_stay_in_its_front() {
        for (in_flight, wraps) in [(1u64, true), (6, false)] {
            let mut mem = mapping(4096);
            let (p, c) = producer_and_consumer(&mut mem, 4096);
            let front = 1024;
            let mut held = std::collections::VecDeque::new();
            // Walk the head to the front's end, `in_flight` slots of 64 bytes in use.
            for _ in 0..16 {
                let s = p
                    .reserve_within(64, Duration::ZERO, |_| 4096, front)
                    .expect("fits");
                held.push_back(s);
                if held.len() > in_flight as usize {
                    let done = held.pop_front().expect("held");
                    c.validate(&done).expect("valid");
                    c.release_to(done.end);
                }
            }
            assert_eq!(p.head() % 4096, front);
            let next = p
                .reserve_within(64, Duration::ZERO, |_| 4096, front)
                .expect("fits");
            let want = if wraps { 4096 } else { front };
            assert_eq!(next.pos, want, "{in_flight} slots in flight");
            c.validate(&next).expect("valid");
            // Without a front preference (`reserve`), the ring never wraps early.
            let far = p.reserve(64, Duration::ZERO).expect("fits");
            assert_eq!(far.pos, next.end);
            // Released in order, the early wrap's skipped bytes with it.
            for s in held.drain(..).chain([next, far]) {
                c.validate(&s).expect("valid");
                c.release_to(s.end);
            }
            assert_eq!(p.tail(), far.end);
        }
    }

    /// A burst right after an early wrap (an NCCL group whose first slot it was: the consumer
    /// cannot release that slot until the group ends) gets every byte but that slot's once
    /// the slots before it and the bytes it skipped are released, as after any slot (the
    /// producer wraps early only when those will be released without it, and hands the
    /// skipped bytes to the consumer on their own: `engine::reserve_polling`).
    #[test]
    fn a_burst_after_an_early_wrap_gets_every_free_byte_once_the_slots_before_are_released() {
        let cap = 1u64 << 16;
        let mut mem = mapping(cap);
        let (p, c) = producer_and_consumer(&mut mem, cap);
        let front = cap / 4;
        let mut prev: Option<Slot> = None;
        while p.head() % cap < front {
            let s = p
                .reserve_within(1024, Duration::ZERO, |_| cap, front)
                .expect("fits");
            if let Some(done) = prev.replace(s) {
                c.release_to(done.end);
            }
        }
        let first = p
            .reserve_within(1024, Duration::ZERO, |_| cap, front)
            .expect("fits");
        assert_eq!(first.pos % cap, 0, "wrapped early");
        c.release_to(prev.expect("a slot before").end);
        // The bytes skipped, released on their own (the producer hands them to the consumer
        // as a slot of their own).
        c.release_to(first.pos);
        let mut got = 0;
        while let Some(s) = p.reserve_within(1024, Duration::ZERO, |_| cap, cap) {
            c.validate(&s).expect("valid");
            got += s.len;
        }
        assert_eq!(got, cap - first.len);
    }

    /// Parts of the data area (the producer's page-locked registrations) are never crossed:
    /// a slot that would cross starts at the next part, the bytes skipped go with it, and a
    /// slot no part can hold is refused.
    #[test]
    fn a_slot_lies_in_one_part_of_the_data_area() {
        let mut mem = mapping(1024);
        let (p, c) = producer_and_consumer(&mut mem, 1024);
        // Parts [0, 256), [256, 512), [512, 1024).
        let part_end = |off: u64| match off {
            0..256 => 256,
            256..512 => 512,
            _ => 1024,
        };
        let a = p
            .reserve_within(192, Duration::ZERO, part_end, 1 << 20)
            .expect("fits");
        assert_eq!((a.pos, a.end), (0, 192));
        // 64 bytes are left in the first part: a 128-byte slot starts at the second.
        let b = p
            .reserve_within(128, Duration::ZERO, part_end, 1 << 20)
            .expect("fits");
        assert_eq!((b.pos, b.end), (256, 384));
        // Too large for the second part's rest and for the second part: the third.
        let d = p
            .reserve_within(320, Duration::ZERO, part_end, 1 << 20)
            .expect("fits");
        assert_eq!((d.pos, d.end), (512, 832));
        for s in [&a, &b, &d] {
            c.validate(s).expect("valid");
        }
        // Releasing a slot releases the bytes skipped before it.
        c.release_to(b.end);
        assert_eq!(c.tail(), 384);
        // No part holds more than 512 bytes: refused at once, even on an empty ring.
        c.release_to(d.end);
        assert!(p
            .reserve_within(576, Duration::ZERO, part_end, 1 << 20)
            .is_none());
        assert!(
            p.reserve(576, Duration::ZERO).is_some(),
            "one part: the whole ring"
        );
    }

    #[test]
    fn an_empty_ring_starts_over_at_the_data_areas_beginning() {
        let mut mem = mapping(1024);
        let (p, c) = producer_and_consumer(&mut mem, 1024);
        let a = p.reserve(100, Duration::ZERO).expect("fits");
        let b = p.reserve(100, Duration::ZERO).expect("fits");
        assert_eq!(b.pos, 128, "a ring in use is filled in order");
        c.release_to(a.end);
        let d = p.reserve(64, Duration::ZERO).expect("fits");
        assert_eq!(d.pos, 256, "still in use (b): no jump");
        c.release_to(d.end);
        // Empty: the next slot goes back to offset 0, and the skipped bytes are released.
        let e = p.reserve(64, Duration::ZERO).expect("fits");
        assert_eq!((e.pos, e.end), (1024, 1088));
        assert_eq!(p.tail(), 1024);
        c.validate(&e).expect("e is valid");
        // SAFETY: the producer owns `e` until it is released.
        let at = unsafe { p.slot_bytes(&e) }.as_ptr();
        let base = mem.as_ptr().cast::<u8>();
        // SAFETY: the first data byte of the mapping.
        assert_eq!(at, unsafe { base.add(HEADER_BYTES) });
        // While `e` is held (a consumer may keep a slot long), the whole rest of the ring is
        // free: nothing skipped is left counted as in use.
        let f = p
            .reserve(896, Duration::ZERO)
            .expect("the rest of the ring but a slot fits");
        assert_eq!(f.pos, 1088);
        c.release_to(f.end);
        // A full-size slot fits an empty ring wherever its head was (here at offset 960).
        let g = p
            .reserve(1024, Duration::ZERO)
            .expect("an empty ring holds a full slot");
        assert_eq!(g.pos, 2048);
    }

    #[test]
    fn the_consumer_rejects_slots_outside_the_ring() {
        let mut mem = mapping(1024);
        let (p, c) = producer_and_consumer(&mut mem, 1024);
        let a = p.reserve(64, Duration::ZERO).expect("fits");
        for bad in [
            Slot {
                pos: 0,
                len: 4096,
                end: 4096,
            },
            Slot {
                pos: 960,
                len: 128,
                end: 1088,
            },
            Slot {
                pos: 64,
                len: 64,
                end: 128,
            },
            Slot {
                pos: 0,
                len: 30,
                end: 30,
            },
        ] {
            assert!(c.validate(&bad).is_err(), "{bad:?}");
        }
        c.validate(&a).expect("the real slot is fine");
    }

    #[test]
    fn open_refuses_a_foreign_mapping() {
        let mut mem = mapping(1024);
        // SAFETY: `mem` outlives the view.
        assert!(unsafe { Ring::open(mem.as_mut_ptr().cast(), mem.len() * 8) }.is_err());
    }

    #[test]
    fn a_waiting_producer_wakes_on_release() {
        let mut mem = mapping(256);
        let base = mem.as_mut_ptr().cast::<u8>();
        // SAFETY: `mem` outlives both views (the thread is joined before it drops).
        let (p, c) = unsafe {
            (
                Ring::create(base, 256).expect("create"),
                Ring::open(base, mem.len() * 8).expect("open"),
            )
        };
        let a = p.reserve(256, Duration::ZERO).expect("fits");
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                c.release_to(a.end);
            });
            let t = Instant::now();
            let b = p
                .reserve(64, Duration::from_secs(5))
                .expect("space after release");
            assert!(t.elapsed() < Duration::from_secs(2));
            assert_eq!(b.pos, 256);
        });
    }

    /// A ring that is not empty never holds free space back: after a trickle of records (each
    /// released once the next is reserved, the last still held), a burst that nothing releases
    /// gets every byte the held slot does not use. (A burst may come from a thread holding a
    /// ticket the consumer waits for, a CUDA graph replay or an NCCL group: it cannot wait for
    /// releases; a ring that had rewound early to reuse its first pages left it a few MiB and
    /// turned graph replays into ring_full gaps.)
    #[test]
    fn a_burst_after_a_trickle_gets_every_free_byte() {
        let cap = 1u64 << 20;
        // Whatever the trickle's length (so wherever in its lap the burst starts).
        for trickle in 1..=300 {
            let mut mem = mapping(cap);
            let (p, c) = producer_and_consumer(&mut mem, cap);
            let mut held: Option<Slot> = None;
            for _ in 0..trickle {
                let s = p.reserve(4096, Duration::ZERO).expect("fits");
                c.validate(&s).expect("valid");
                if let Some(prev) = held.replace(s) {
                    c.release_to(prev.end);
                }
            }
            let held = held.expect("a slot is held");
            let mut got = 0;
            while let Some(s) = p.reserve(4096, Duration::ZERO) {
                c.validate(&s).expect("valid");
                got += s.len;
            }
            assert_eq!(got, cap - held.len, "after a trickle of {trickle}");
        }
    }

    #[test]
    fn tensor_offsets_are_aligned() {
        let (offs, total) = tensor_offsets(&[10, 64, 1]);
        assert_eq!(offs, vec![0, 64, 128]);
        assert_eq!(total, 192);
    }
}
