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

/// The port a periodic statistics block is for (its `NIC statistics for port K` heading);
/// `None` for any other line.
pub fn block_port(line: &str) -> Option<usize> {
    let rest = line.split_once("NIC statistics for port ")?.1;
    let digits: &str = &rest[..rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len())];
    digits.parse().ok()
}

/// The cumulative counts of a process with several ports (a MEMNIC scaling run): each port's
/// latest, and their sum, which is what a stamp carries.
#[derive(Debug, Default)]
pub struct PortCounts {
    /// The port of the block being read (0 until a heading says otherwise).
    port: usize,
    rx: Vec<u64>,
    tx: Vec<u64>,
}

impl PortCounts {
    /// Reads one line; returns the sum over ports of `which` when the line updated it.
    pub fn read(&mut self, line: &str, which: Counter) -> Option<u64> {
        if let Some(p) = block_port(line) {
            // A port number past any real testpmd's is garbage: keep the sums bounded.
            if p < 1024 {
                self.port = p;
            }
            return None;
        }
        let count = periodic_count(line, which)?;
        let per_port = match which {
            Counter::Rx => &mut self.rx,
            Counter::Tx => &mut self.tx,
        };
        if per_port.len() <= self.port {
            per_port.resize(self.port + 1, 0);
        }
        per_port[self.port] = count;
        Some(per_port.iter().fold(0u64, |a, &c| a.saturating_add(c)))
    }
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
    fn several_ports_are_summed() {
        let text = "\
  ######################## NIC statistics for port 0  ########################
  RX-packets: 100        RX-missed: 0          RX-bytes:  6400
  TX-packets: 0          TX-errors: 0          TX-bytes:  0
  ######################## NIC statistics for port 1  ########################
  RX-packets: 40         RX-missed: 0          RX-bytes:  2560
  TX-packets: 0          TX-errors: 0          TX-bytes:  0
  ######################## NIC statistics for port 0  ########################
  RX-packets: 250        RX-missed: 0          RX-bytes:  16000
  ######################## NIC statistics for port 1  ########################
  RX-packets: 90         RX-missed: 0          RX-bytes:  5760
";
        let mut c = PortCounts::default();
        let sums: Vec<u64> = text
            .lines()
            .filter_map(|l| c.read(l, Counter::Rx))
            .collect();
        // Each line stamps the sum of every port's latest count.
        assert_eq!(sums, [100, 140, 290, 340]);
        assert_eq!(block_port("NIC statistics for port 12  ###"), Some(12));
        assert_eq!(block_port("NIC statistics for port x"), None);
        assert_eq!(block_port("RX-packets: 1 RX-missed: 0"), None);
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
