//! Alignment, shard merging, numerics and localization behind `ttrace compare` (issue 6), and
//! the reference-free consistency checks behind `ttrace check` (issue 7, [`check`]).

pub mod check;
