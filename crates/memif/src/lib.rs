//! memif v2.0, the shared-memory packet interface of FD.io VPP and DPDK's `net_memif`
//! (`shared/specs/memif.md`).

#![forbid(unsafe_code)]
