//! CPUs: pinning the current thread, and which CPUs this process may run on.

use crate::{Result, ShmError};

/// Pins the calling thread to `cpu`.
pub fn pin_current_thread(cpu: usize) -> Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(ShmError::Io {
            op: "pin to",
            what: format!("CPU {cpu}"),
            source: std::io::Error::from_raw_os_error(libc::EINVAL),
        });
    }
    // SAFETY: cpu_set_t is plain data for which all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: cpu < CPU_SETSIZE (checked above), so CPU_SET stays inside `set`.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 means the calling thread; set is a valid cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(ShmError::Io {
            op: "pin to",
            what: format!("CPU {cpu}"),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// The CPUs the calling thread may run on, ascending.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: all-zero is a valid empty cpu_set_t.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is the calling thread; set has the size passed.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect();
    }
    // SAFETY: every index tested is below CPU_SETSIZE.
    (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// The CPU the calling thread is running on now.
pub fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu has no arguments and returns -1 on error.
    let c = unsafe { libc::sched_getcpu() };
    usize::try_from(c).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_to_an_allowed_cpu_and_refuse_a_missing_one() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty());
        let last = *cpus.last().unwrap();
        std::thread::spawn(move || {
            pin_current_thread(last).unwrap();
            assert_eq!(current_cpu(), Some(last));
        })
        .join()
        .unwrap();
        assert!(pin_current_thread(100_000).is_err());
    }
}
