//! NUMA topology and testpmd's placement rules (work in progress).
#![forbid(unsafe_code)]
