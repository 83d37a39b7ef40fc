//! Per-thread state of the capturing path: the reentrancy guard, NVTX ranges, kernel launches
//! since the last captured op, and NCCL group depth with the snapshots deferred to the
//! outermost `ncclGroupEnd`. None of it is touched by a hook that does not capture.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::engine::InFlight;

/// Kernel names kept per thread between captured ops (older ones are counted, not kept).
const MAX_KERNELS: usize = 256;

thread_local! {
    // `const`, no destructor: usable during thread teardown, when a
    // hooked call can still come from another thread-local's destructor.
    static IN_TRACER: Cell<bool> = const { Cell::new(false) };
    static STATE: RefCell<ThreadState> = RefCell::new(ThreadState::default());
}

/// Marks the thread as inside the tracer: hooks reached meanwhile (a library calling another
/// hooked function, the tracer's own work) pass through.
pub struct Guard(());

impl Guard {
    /// `None` when the thread is already inside the tracer.
    pub fn enter() -> Option<Guard> {
        IN_TRACER
            .try_with(|c| {
                if c.get() {
                    None
                } else {
                    c.set(true);
                    Some(Guard(()))
                }
            })
            .ok()
            .flatten()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = IN_TRACER.try_with(|c| c.set(false));
    }
}

/// No NVTX ranges, shared (an empty `Arc<[String]>` is an allocation of its own).
pub fn no_ranges() -> Arc<[String]> {
    static NONE: std::sync::OnceLock<Arc<[String]>> = std::sync::OnceLock::new();
    NONE.get_or_init(|| Arc::from([])).clone()
}

/// What a thread remembers between hooks.
#[derive(Default)]
pub struct ThreadState {
    tid: u64,
    /// Open NVTX ranges, outermost first, with their domain (its handle; 0 for the default
    /// domain, which the core API's ranges are in).
    nvtx: Vec<(usize, String)>,
    /// `nvtx` as records share it, until a range opens or closes.
    nvtx_shared: Option<Arc<[String]>>,
    /// Shared names: a launch costs no allocation once its kernel was named.
    kernels: VecDeque<Arc<str>>,
    kernels_dropped: u64,
    names: HashMap<usize, Arc<str>, rustc_hash::FxBuildHasher>,
    /// `ncclGroupStart` nesting.
    pub group_depth: u32,
    /// Group number of the current outermost group.
    pub group_id: u64,
    /// Snapshots waiting for the outermost `ncclGroupEnd`.
    pub deferred: Vec<InFlight>,
    /// The oldest ticket a hook of this thread holds unpushed while it begins more snapshots
    /// before its one real call (a batch of copies): no ring space can come before it is
    /// handed in.
    pub holding: Option<u64>,
}

impl ThreadState {
    /// Opens an NVTX range in `domain`.
    pub fn push_range(&mut self, domain: usize, name: String) {
        self.nvtx.push((domain, name));
        self.nvtx_shared = None;
    }

    /// Closes the innermost NVTX range of `domain`: NVTX keeps a stack per thread and domain,
    /// so a domain's pop closes its own range even when another domain's opened after it is
    /// still open (a library's ranges interleaved with the program's). Nothing when the
    /// domain has none open.
    pub fn pop_range(&mut self, domain: usize) {
        if let Some(i) = self.nvtx.iter().rposition(|(d, _)| *d == domain) {
            self.nvtx.remove(i);
            self.nvtx_shared = None;
        }
    }

    /// How many NVTX ranges are open on the thread (every domain's).
    pub fn range_depth(&self) -> usize {
        self.nvtx.len()
    }

    /// The open NVTX ranges, outermost first (in the order they opened, whatever their
    /// domains), shared by the records taken inside them (one allocation per range change,
    /// not per record).
    pub fn ranges(&mut self) -> Arc<[String]> {
        self.nvtx_shared
            .get_or_insert_with(|| self.nvtx.iter().map(|(_, n)| n.clone()).collect())
            .clone()
    }

    /// The OS thread id.
    pub fn tid(&mut self) -> u64 {
        if self.tid == 0 {
            self.tid = crate::identity::gettid();
        }
        self.tid
    }

    /// Notes a kernel launch (`addr` named by `name` on first sight).
    pub fn launched(&mut self, addr: usize, name: impl FnOnce() -> String) {
        let n = self
            .names
            .entry(addr)
            .or_insert_with(|| Arc::from(name()))
            .clone();
        if self.kernels.len() == MAX_KERNELS {
            self.kernels.pop_front();
            self.kernels_dropped += 1;
        }
        self.kernels.push_back(n);
    }

    /// The kernel launches since the previous captured op (and forgets them).
    pub fn take_kernels(&mut self) -> Vec<Arc<str>> {
        if self.kernels.is_empty() && self.kernels_dropped == 0 {
            return Vec::new();
        }
        let mut v = Vec::with_capacity(self.kernels.len() + 1);
        if self.kernels_dropped > 0 {
            v.push(Arc::from(format!(
                "... {} earlier launches",
                self.kernels_dropped
            )));
            self.kernels_dropped = 0;
        }
        v.extend(self.kernels.drain(..));
        v
    }

    /// Forgets the kernel launches since the previous captured op (for a record that is not
    /// stored: nothing is allocated).
    pub fn forget_kernels(&mut self) {
        self.kernels.clear();
        self.kernels_dropped = 0;
    }
}

/// Runs `f` on the thread's state (`None` during thread teardown or a nested borrow).
pub fn with<R>(f: impl FnOnce(&mut ThreadState) -> R) -> Option<R> {
    STATE
        .try_with(|s| s.try_borrow_mut().ok().map(|mut s| f(&mut s)))
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_domain_pop_closes_that_domains_innermost_range() {
        let mut t = ThreadState::default();
        t.push_range(0, "step".into());
        t.push_range(7, "library".into());
        t.push_range(0, "program".into());
        t.pop_range(7);
        assert_eq!(&*t.ranges(), ["step", "program"]);
        t.pop_range(7);
        assert_eq!(
            &*t.ranges(),
            ["step", "program"],
            "nothing open in domain 7"
        );
        t.pop_range(0);
        assert_eq!(&*t.ranges(), ["step"]);
    }
}
