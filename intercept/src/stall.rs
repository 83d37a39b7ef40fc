//! The process's budget of time spent waiting on the daemon (`TTRACE_MAX_STALL_MS`): ring
//! space and the `Hello` answer draw on it. A slow or stopped daemon can delay the program by
//! at most the budget in all; once it is spent, an op whose tensors do not fit at once becomes
//! a gap, and capture resumes by itself when the daemon frees space again.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Microseconds waited so far.
static SPENT_US: AtomicU64 = AtomicU64::new(0);

/// What is left of a budget of `limit_ms`.
pub fn remaining(limit_ms: u64) -> Duration {
    let spent = SPENT_US.load(Ordering::Relaxed);
    Duration::from_micros(limit_ms.saturating_mul(1000).saturating_sub(spent))
}

/// Adds a wait to the spent time.
pub fn charge(waited: Duration) {
    SPENT_US.fetch_add(waited.as_micros() as u64, Ordering::Relaxed);
}

/// Whether the budget is spent.
pub fn spent(limit_ms: u64) -> bool {
    remaining(limit_ms).is_zero()
}
