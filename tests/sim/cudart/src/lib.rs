//! sim cudart
