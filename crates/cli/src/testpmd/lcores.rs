//! `-l/--lcores`: which CPUs run forwarding lcores.
//!
//! Two forms, one option:
//! * a CPU list (`1`, `0-3`, `1,3-4`): every listed CPU runs one forwarding lcore (the control
//!   thread is not pinned and needs no CPU of its own);
//! * DPDK's lcore map (`0@1,1@1`, `2@3`): lcore L runs on CPU C; as in DPDK the lowest lcore is
//!   the main lcore, which here is the (unpinned) control thread, so it forwards only when it is
//!   the only one listed.

/// Parses a CPU list like `0-3,8,10-11` (ascending ranges, no duplicates).
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for item in s.split(',') {
        let item = item.trim();
        let bad = || format!("'{item}' in '{s}' is not a CPU number or range like 2-5");
        let (a, b) = match item.split_once('-') {
            Some((a, b)) => (
                a.parse::<usize>().map_err(|_| bad())?,
                b.parse::<usize>().map_err(|_| bad())?,
            ),
            None => {
                let a = item.parse::<usize>().map_err(|_| bad())?;
                (a, a)
            }
        };
        if b < a {
            return Err(format!("range '{item}' in '{s}' runs backwards"));
        }
        if b - a > 4096 {
            return Err(format!("range '{item}' in '{s}' is too large"));
        }
        for c in a..=b {
            if out.contains(&c) {
                return Err(format!("CPU {c} is listed twice in '{s}'"));
            }
            out.push(c);
        }
    }
    Ok(out)
}

/// The CPUs of the forwarding lcores, in lcore order.
pub fn forwarding_cpus(spec: &str) -> Result<Vec<usize>, String> {
    if !spec.contains('@') {
        return parse_cpu_list(spec).map_err(|e| format!("-l/--lcores: {e}"));
    }
    let mut map: Vec<(usize, usize)> = Vec::new();
    for item in spec.split(',') {
        let bad = || format!("-l/--lcores: '{item}' is not LCORE@CPU (for example 1@1)");
        let (l, c) = item.split_once('@').ok_or_else(bad)?;
        let l: usize = l.trim().parse().map_err(|_| bad())?;
        let c: usize = c
            .trim()
            .trim_start_matches('(')
            .trim_end_matches(')')
            .parse()
            .map_err(|_| bad())?;
        if map.iter().any(|(x, _)| *x == l) {
            return Err(format!("-l/--lcores: lcore {l} is listed twice"));
        }
        map.push((l, c));
    }
    map.sort();
    if map.len() > 1 {
        map.remove(0); // the main lcore: our control thread
    }
    Ok(map.into_iter().map(|(_, c)| c).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(forwarding_cpus("1").unwrap(), [1]);
        assert_eq!(forwarding_cpus("0-2,5").unwrap(), [0, 1, 2, 5]);
        assert_eq!(
            forwarding_cpus("0@1,1@1").unwrap(),
            [1],
            "main lcore 0 is the control thread"
        );
        assert_eq!(forwarding_cpus("0@0,1@1,2@1").unwrap(), [1, 1]);
        assert_eq!(forwarding_cpus("3@1").unwrap(), [1]);
        assert!(forwarding_cpus("1,1").unwrap_err().contains("listed twice"));
        assert!(forwarding_cpus("3-1").unwrap_err().contains("backwards"));
        assert!(forwarding_cpus("x").unwrap_err().contains("'x'"));
        assert!(forwarding_cpus("0@1,0@0")
            .unwrap_err()
            .contains("lcore 0 is listed twice"));
        assert!(forwarding_cpus("1@").is_err());
    }
}
