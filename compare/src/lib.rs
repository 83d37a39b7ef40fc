//! Alignment, shard merging, numerics and localization behind `ttrace compare` (issue 6).
