//! nvtx entry points.
#[allow(unused_imports)]
use crate::abi::nvtx::*;
