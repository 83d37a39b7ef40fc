//! Device memory and the pointer registry.
//!
//! Device memory lives in one `memfd` mapped twice: once `PROT_NONE` at the addresses handed to
//! the program (so a host dereference of a device pointer faults, exactly as on a GPU, and a
//! tracer that reads a device buffer directly is caught), and once read-write at a hidden
//! "shadow" address where kernels, copies and collectives touch it. Translating a device pointer
//! is an offset; validating it is one ordered-map lookup. Freed ranges are punched out of the
//! memfd so memory returns to the system.
//!
//! Pinned host memory (`cudaMallocHost`, `cudaHostAlloc`, `cudaHostRegister`) is ordinary host
//! memory recorded in a second map: it is device-accessible (mapped, as UVA makes it), while
//! pageable memory is not.

use std::collections::BTreeMap;
use std::sync::RwLock;

use core::ffi::c_void;

/// Virtual size reserved for all simulated devices' memory (sparse: only touched pages cost RAM).
const ARENA_BYTES: usize = 64 << 30;
/// Allocation granularity and alignment (CUDA guarantees at least 256 bytes).
const ALIGN: usize = 512;

/// One live device allocation.
#[derive(Debug, Clone, Copy)]
pub struct DeviceAlloc {
    /// Bytes requested.
    pub size: usize,
    /// Device the allocation belongs to.
    pub device: i32,
}

/// One pinned or registered host range.
#[derive(Debug, Clone, Copy)]
pub struct HostRange {
    pub size: usize,
    /// Device current when it was pinned (what `cudaPointerGetAttributes` reports).
    pub device: i32,
    /// Allocated by the runtime (`cudaMallocHost`/`cudaHostAlloc`), as opposed to registered.
    pub owned: bool,
}

/// What a pointer is, as far as the runtime knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PointerKind {
    /// Inside a device allocation starting at `base`.
    Device { base: usize, device: i32 },
    /// Inside pinned/registered host memory starting at `base`.
    Pinned { base: usize, device: i32 },
    /// Anything else: pageable host memory or garbage.
    Pageable,
}

/// The device heap: arena, allocator and registries.
pub struct Heap {
    memfd: i32,
    dev_base: usize,
    shadow_base: usize,
    /// Free ranges of the arena, offset -> length, coalesced.
    free: RwLock<BTreeMap<usize, usize>>,
    /// Live device allocations by start address.
    allocs: RwLock<BTreeMap<usize, DeviceAlloc>>,
    /// Pinned host ranges by start address.
    pinned: RwLock<BTreeMap<usize, HostRange>>,
}

/// Errors of heap operations, mapped to `cudaError_t` by the API layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeapError {
    OutOfMemory,
    NotAllocated,
    AlreadyRegistered,
    NotRegistered,
    System,
}

impl Heap {
    /// Reserves the arena. Fails only when the system refuses the mappings.
    pub fn new() -> Result<Heap, HeapError> {
        // SAFETY: plain syscalls; every result is checked before use.
        unsafe {
            let fd = libc::memfd_create(c"sim-cuda-device-memory".as_ptr(), libc::MFD_CLOEXEC);
            if fd < 0 {
                return Err(HeapError::System);
            }
            if libc::ftruncate(fd, ARENA_BYTES as libc::off_t) != 0 {
                libc::close(fd);
                return Err(HeapError::System);
            }
            let dev = libc::mmap(
                std::ptr::null_mut(),
                ARENA_BYTES,
                libc::PROT_NONE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                fd,
                0,
            );
            let shadow = libc::mmap(
                std::ptr::null_mut(),
                ARENA_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                fd,
                0,
            );
            if dev == libc::MAP_FAILED || shadow == libc::MAP_FAILED {
                libc::close(fd);
                return Err(HeapError::System);
            }
            let mut free = BTreeMap::new();
            // Offset 0 is never handed out, so no allocation starts at the arena's first byte
            // (keeps "pointer one past an allocation" from aliasing the next one's start).
            free.insert(ALIGN, ARENA_BYTES - ALIGN);
            Ok(Heap {
                memfd: fd,
                dev_base: dev as usize,
                shadow_base: shadow as usize,
                free: RwLock::new(free),
                allocs: RwLock::new(BTreeMap::new()),
                pinned: RwLock::new(BTreeMap::new()),
            })
        }
    }

    /// Allocates `size` bytes of device memory on `device`. A zero size gives a null pointer,
    /// as in CUDA.
    pub fn alloc(&self, size: usize, device: i32) -> Result<*mut c_void, HeapError> {
        if size == 0 {
            return Ok(std::ptr::null_mut());
        }
        let len = size
            .checked_next_multiple_of(ALIGN)
            .ok_or(HeapError::OutOfMemory)?;
        let off = {
            let mut free = self.free.write().map_err(|_| HeapError::System)?;
            let (&off, &flen) = free
                .iter()
                .find(|(_, &l)| l >= len)
                .ok_or(HeapError::OutOfMemory)?;
            free.remove(&off);
            if flen > len {
                free.insert(off + len, flen - len);
            }
            off
        };
        let addr = self.dev_base + off;
        self.allocs
            .write()
            .map_err(|_| HeapError::System)?
            .insert(addr, DeviceAlloc { size, device });
        Ok(addr as *mut c_void)
    }

    /// Frees the allocation that starts at `ptr`.
    pub fn free(&self, ptr: *mut c_void) -> Result<(), HeapError> {
        let addr = ptr as usize;
        let a = self
            .allocs
            .write()
            .map_err(|_| HeapError::System)?
            .remove(&addr)
            .ok_or(HeapError::NotAllocated)?;
        let off = addr - self.dev_base;
        let len = a.size.next_multiple_of(ALIGN);
        self.release_pages(off, len);
        let mut free = self.free.write().map_err(|_| HeapError::System)?;
        let (mut start, mut l) = (off, len);
        if let Some((&p, &pl)) = free.range(..off).next_back() {
            if p + pl == off {
                free.remove(&p);
                start = p;
                l += pl;
            }
        }
        if let Some(&nl) = free.get(&(off + len)) {
            free.remove(&(off + len));
            l += nl;
        }
        free.insert(start, l);
        Ok(())
    }

    /// Returns whole pages of a freed range to the system (they read as zero afterwards).
    fn release_pages(&self, off: usize, len: usize) {
        const PAGE: usize = 4096;
        let start = off.next_multiple_of(PAGE);
        let end = (off + len) / PAGE * PAGE;
        if end > start {
            // SAFETY: the range lies inside the memfd and belongs to no live allocation.
            unsafe {
                libc::fallocate(
                    self.memfd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    start as libc::off_t,
                    (end - start) as libc::off_t,
                );
            }
        }
    }

    /// Classifies `ptr`.
    pub fn classify(&self, ptr: *const c_void) -> PointerKind {
        let addr = ptr as usize;
        if addr >= self.dev_base && addr < self.dev_base + ARENA_BYTES {
            if let Ok(allocs) = self.allocs.read() {
                if let Some((&base, a)) = allocs.range(..=addr).next_back() {
                    if addr < base + a.size.max(1) {
                        return PointerKind::Device {
                            base,
                            device: a.device,
                        };
                    }
                }
            }
            return PointerKind::Pageable;
        }
        if let Ok(pinned) = self.pinned.read() {
            if let Some((&base, r)) = pinned.range(..=addr).next_back() {
                if addr < base + r.size {
                    return PointerKind::Pinned {
                        base,
                        device: r.device,
                    };
                }
            }
        }
        PointerKind::Pageable
    }

    /// The host address where device code accesses `[ptr, ptr+len)`, if the whole range lies in
    /// one device allocation or one pinned range.
    pub fn device_access(&self, ptr: *const c_void, len: usize) -> Option<*mut u8> {
        let addr = ptr as usize;
        match self.classify(ptr) {
            PointerKind::Device { base, .. } => {
                let size = self.allocs.read().ok()?.get(&base)?.size;
                (addr.checked_add(len)? <= base + size)
                    .then(|| (addr - self.dev_base + self.shadow_base) as *mut u8)
            }
            PointerKind::Pinned { base, .. } => {
                self.pinned_holds(base, ptr, len).then_some(addr as *mut u8)
            }
            PointerKind::Pageable => None,
        }
    }

    /// Whether the pinned range starting at `base` was registered (`cudaHostRegister`), not
    /// allocated by the runtime.
    pub fn registered(&self, base: usize) -> bool {
        self.pinned
            .read()
            .ok()
            .and_then(|p| p.get(&base).map(|r| !r.owned))
            .unwrap_or(false)
    }

    /// Whether `[ptr, ptr+len)` lies in the pinned range starting at `base` (one
    /// [`Self::classify`] found `ptr` in).
    pub fn pinned_holds(&self, base: usize, ptr: *const c_void, len: usize) -> bool {
        let size = self
            .pinned
            .read()
            .ok()
            .and_then(|p| p.get(&base).map(|r| r.size));
        size.is_some_and(|size| {
            (ptr as usize)
                .checked_add(len)
                .is_some_and(|end| end <= base + size)
        })
    }

    /// Size of the device allocation starting exactly at `ptr`.
    pub fn alloc_size(&self, ptr: *const c_void) -> Option<usize> {
        self.allocs
            .read()
            .ok()?
            .get(&(ptr as usize))
            .map(|a| a.size)
    }

    /// Records a pinned host range.
    pub fn pin(
        &self,
        ptr: *mut c_void,
        size: usize,
        device: i32,
        owned: bool,
    ) -> Result<(), HeapError> {
        let addr = ptr as usize;
        let mut pinned = self.pinned.write().map_err(|_| HeapError::System)?;
        let overlaps_prev = pinned
            .range(..=addr)
            .next_back()
            .is_some_and(|(&b, r)| addr < b + r.size);
        let overlaps_next = pinned.range(addr..addr + size.max(1)).next().is_some();
        if overlaps_prev || overlaps_next {
            return Err(HeapError::AlreadyRegistered);
        }
        pinned.insert(
            addr,
            HostRange {
                size,
                device,
                owned,
            },
        );
        Ok(())
    }

    /// Forgets the pinned range starting at `ptr`; returns it.
    pub fn unpin(&self, ptr: *mut c_void) -> Result<HostRange, HeapError> {
        self.pinned
            .write()
            .map_err(|_| HeapError::System)?
            .remove(&(ptr as usize))
            .ok_or(HeapError::NotRegistered)
    }

    /// Bytes of device memory in use on `device`.
    pub fn used(&self, device: i32) -> usize {
        self.allocs.read().map_or(0, |a| {
            a.values()
                .filter(|x| x.device == device)
                .map(|x| x.size)
                .sum()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_pointers_translate_inside_their_allocation_only() {
        let h = Heap::new().expect("arena");
        let p = h.alloc(1000, 0).expect("alloc");
        let q = h.alloc(1000, 1).expect("alloc");
        assert_ne!(p, q);
        assert!(h.device_access(p, 1000).is_some());
        assert!(h.device_access(p, 1001).is_none(), "one byte past the end");
        let mid = (p as usize + 10) as *const c_void;
        assert!(matches!(
            h.classify(mid),
            PointerKind::Device { device: 0, .. }
        ));
        assert!(matches!(
            h.classify(q),
            PointerKind::Device { device: 1, .. }
        ));
        // Writes through the shadow are visible at the same offset.
        let s = h.device_access(p, 8).expect("shadow");
        // SAFETY: inside a live allocation.
        unsafe { s.write(42) };
        let again = h.device_access(p, 1).expect("shadow");
        // SAFETY: as above.
        assert_eq!(unsafe { again.read() }, 42);
        h.free(p).expect("free");
        assert!(
            h.device_access(p, 1).is_none(),
            "freed memory is not accessible"
        );
        assert_eq!(h.free(p), Err(HeapError::NotAllocated), "double free");
    }

    #[test]
    fn freed_ranges_coalesce_and_are_reused() {
        let h = Heap::new().expect("arena");
        let a = h.alloc(4096, 0).expect("a");
        let b = h.alloc(4096, 0).expect("b");
        h.free(a).expect("free a");
        h.free(b).expect("free b");
        let c = h.alloc(8192, 0).expect("c");
        assert_eq!(
            c, a,
            "the two freed neighbours were merged and reused first-fit"
        );
    }

    #[test]
    fn pinned_ranges_are_identity_mapped_and_exclusive() {
        let h = Heap::new().expect("arena");
        let mut buf = vec![0u8; 64];
        let p = buf.as_mut_ptr().cast::<c_void>();
        assert!(
            h.device_access(p, 64).is_none(),
            "pageable memory is not device-accessible"
        );
        h.pin(p, 64, 0, false).expect("pin");
        assert_eq!(h.device_access(p, 64), Some(buf.as_mut_ptr()));
        assert_eq!(h.pin(p, 8, 0, false), Err(HeapError::AlreadyRegistered));
        h.unpin(p).expect("unpin");
        assert_eq!(h.unpin(p).err(), Some(HeapError::NotRegistered));
    }
}
