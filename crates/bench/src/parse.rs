//! Reading the periodic port statistics of DPDK's `dpdk-testpmd` and of `memnic testpmd`.
//!
//! Both print the same block every stats period (`show port stats`, testpmd's
//! `nic_stats_display`):
//!
//! ```text
//!   ######################## NIC statistics for port 0  ########################
//!   RX-packets: 31199488   RX-missed: 0          RX-bytes:  1996767232
//!   ...
//!   TX-packets: 0          TX-errors: 0          TX-bytes:  0
//! ```
//!
//! The totals printed at stop (`RX-packets: N  RX-dropped: ...`) are not periodic and are not
//! read: the bench takes every figure from the periodic lines, stamped as they arrive.

/// Which counter a run is measured by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    /// `RX-packets` (a receiver's).
    Rx,
    /// `TX-packets` (a sender's, where the ring it fills is the bottleneck's input).
    Tx,
}

/// The cumulative count of `which` on a periodic statistics line; `None` for any other line,
/// garbage included.
pub fn periodic_count(line: &str, which: Counter) -> Option<u64> {
    let (key, beside) = match which {
        Counter::Rx => ("RX-packets:", "RX-missed:"),
        Counter::Tx => ("TX-packets:", "TX-errors:"),
    };
    let rest = line.trim_start().strip_prefix(key)?;
    let mut words = rest.split_whitespace();
    let count = words.next()?.parse().ok()?;
    (words.next()? == beside).then_some(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(text: &str, which: Counter) -> Vec<u64> {
        text.lines()
            .filter_map(|l| periodic_count(l, which))
            .collect()
    }

    #[test]
    fn dpdk_testpmd_memif_server() {
        // Captured from dpdk-testpmd 22.11 (net_memif server, rxonly, --stats-period 1): each
        // block follows a screen-clearing escape; the forward totals at stop read 0 (the memif
        // PMD zeroed its counters when the client left) and must not be taken.
        let text = include_str!("../tests/data/dpdk-memif-server-rxonly.log");
        assert_eq!(
            counts(text, Counter::Rx),
            vec![0, 2_690_208, 31_199_488, 42_273_152]
        );
        assert_eq!(counts(text, Counter::Tx), vec![0, 0, 0, 0]);
    }

    #[test]
    fn memnic_testpmd_host_receiver() {
        let text = include_str!("../tests/data/memnic-host-rxonly.log");
        assert_eq!(
            counts(text, Counter::Rx),
            vec![20_208, 4_100_472, 7_929_241, 12_387_171, 16_393_684, 20_472_573, 24_884_190]
        );
    }

    #[test]
    fn memnic_testpmd_guest_sender() {
        let text = include_str!("../tests/data/memnic-guest-txonly.log");
        assert_eq!(
            counts(text, Counter::Tx),
            vec![4_079_216, 7_917_177, 12_347_907, 16_374_772, 20_450_037]
        );
        // Its receive side counted nothing; the stop totals (TX-dropped) are not read.
        assert_eq!(counts(text, Counter::Rx), vec![0; 5]);
    }

    #[test]
    fn garbage_is_no_count() {
        for l in [
            "",
            "RX-packets:",
            "RX-packets: -5 RX-missed: 0",
            "RX-packets: 12x RX-missed: 0",
            "RX-packets: 99999999999999999999999 RX-missed: 0",
            "RX-packets: 12 RX-dropped: 0 RX-total: 12",
            "RX-packets: 12",
            "  Rx-pps:      1344945          Rx-bps:    688611952",
            "\u{1b}[2J\u{1b}[1;1H",
        ] {
            assert_eq!(periodic_count(l, Counter::Rx), None, "{l:?}");
        }
    }
}
