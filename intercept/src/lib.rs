//! Hooks and the snapshot engine of libttrace.so (issue 4).
