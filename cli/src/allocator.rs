//! What the process tells its allocator (mimalloc, the global allocator of `ttrace`).

/// mimalloc's `mi_option_purge_delay` (its `mi_option_e` in `mimalloc.h` of the v3 sources
/// libmimalloc-sys builds, which does not name it): how long freed memory is kept before it is
/// given back to the system, `-1` for never.
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Leaves the memory freed so far to the kernel when the process exits, instead of mimalloc
/// giving it back page range by page range (`madvise`) in its exit handler, one thread, after
/// the work is done: 3-5% of a comparison's samples (the demo and the large benchmark
/// config, perf), for memory the kernel takes back at exit anyway. Called just before
/// `exit`; until then memory is purged as usual.
pub fn keep_freed_memory_until_exit() {
    // SAFETY: sets one of mimalloc's options (an atomic store); any value is valid for it.
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, -1) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_option_is_the_purge_delay() {
        // Its default is 1000 (milliseconds; v3's options.c) unless the environment says
        // otherwise; another option at this index (a mimalloc whose options moved) has
        // another default.
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            // SAFETY: reads one of mimalloc's options.
            let delay = unsafe { libmimalloc_sys::mi_option_get(PURGE_DELAY) };
            assert_eq!(delay, 1000);
        }
    }
}
