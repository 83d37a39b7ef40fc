//! sim nvToolsExt
