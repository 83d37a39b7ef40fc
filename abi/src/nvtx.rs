//! (to be filled by the nvtx work)
