//! `memnic testpmd -i`: testpmd's prompt, with line editing and history.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use memnic_fwd::{report, FwdMode};
use memnic_shm::unix::EventFd;

use super::{config_fwd, finish_prompt, Session};

const HELP: &str =
    "commands: start | start tx_first | stop | show port stats all | show port xstats all|N | \
clear port stats all | show config fwd | set fwd MODE | help | quit";

/// One prompt command; returns false to quit.
fn command(s: &mut Session, line: &str) -> bool {
    let words: Vec<&str> = line.split_whitespace().collect();
    let say = |s: &Session, m: &str| s.out.line(m);
    match words.as_slice() {
        [] => {}
        ["quit"] | ["exit"] => return false,
        ["help"] => say(s, HELP),
        ["start"] | ["start", "tx_first"] => {
            let tx_first = words.len() == 2;
            // Read before the lcores take their streams away.
            let config = config_fwd(&s.engine);
            match s.engine.start(tx_first) {
                Ok(()) => say(s, &config),
                Err(e) => say(s, &format!("Packet forwarding already started: {e}")),
            }
        }
        ["stop"] => match s.engine.stop() {
            Ok(()) => {
                let ports = s.meter.ports(&s.engine);
                say(s, &report::fwd_stats(&ports));
                super::warn_capture_errors(s);
                say(s, "Done.");
            }
            Err(_) => say(s, "Packet forwarding not started"),
        },
        ["show", "port", "stats", "all"] => {
            for p in s.meter.ports(&s.engine) {
                say(s, &report::nic_stats(&p));
            }
        }
        ["show", "port", "xstats", which] => {
            let ports = s.meter.ports(&s.engine);
            let chosen: Vec<_> = match *which {
                "all" => ports.iter().collect(),
                n => match n.parse::<u16>() {
                    Ok(id) => ports.iter().filter(|p| p.port == id).collect(),
                    Err(_) => {
                        say(s, &format!("Bad arguments: '{line}'. {HELP}"));
                        return true;
                    }
                },
            };
            if chosen.is_empty() {
                say(s, &format!("Invalid port {which}"));
            }
            for p in chosen {
                say(s, &report::nic_xstats(p));
            }
        }
        ["clear", "port", "stats", "all"] => {
            s.meter.clear(&mut s.engine);
            say(s, "  NIC statistics cleared for all ports");
        }
        ["show", "config", "fwd"] => say(s, &config_fwd(&s.engine)),
        ["set", "fwd", m] => match m.parse::<FwdMode>() {
            Ok(mode) => match s.engine.set_mode(mode) {
                Ok(()) => say(s, &format!("Set {mode} packet forwarding mode")),
                Err(_) => say(s, "Please stop forwarding first"),
            },
            Err(e) => say(s, &e),
        },
        _ => say(s, &format!("Bad arguments: '{line}'. {HELP}")),
    }
    true
}

/// The prompt loop. A service thread does the ports' control-path work meanwhile.
pub fn run(
    s: Session,
    auto_start: bool,
    tx_first: bool,
    stop: Arc<AtomicBool>,
) -> Result<(), String> {
    let started = Instant::now();
    let s = Arc::new(Mutex::new(s));
    let done = Arc::new(AtomicBool::new(false));
    // Ends the service thread's sleep after each command (which may have changed the ports),
    // and at the end.
    let waker = Arc::new(EventFd::new().map_err(|e| format!("cannot start the prompt: {e}"))?);
    let service = {
        let (s, done, stop, waker) = (s.clone(), done.clone(), stop.clone(), waker.clone());
        std::thread::spawn(move || {
            let mut pace = super::Pace::default();
            // Relaxed: plain flags.
            while !done.load(Relaxed) && !stop.load(Relaxed) {
                pace.settle();
                // The ports' control descriptors, duplicated: the sleep is outside the lock.
                let (sleep, fds) = {
                    let mut g = s.lock().unwrap_or_else(|p| p.into_inner());
                    g.engine.service();
                    let fds: Vec<OwnedFd> = g
                        .engine
                        .control_fds()
                        .iter()
                        .filter_map(|fd| fd.try_clone_to_owned().ok())
                        .collect();
                    (super::control_sleep(&g.engine), fds)
                };
                let mut on: Vec<BorrowedFd<'_>> = fds.iter().map(|fd| fd.as_fd()).collect();
                on.push(waker.as_fd());
                memnic_fwd::wait_readable(&on, sleep);
                let _ = waker.drain();
            }
        })
    };
    if auto_start {
        let mut g = s.lock().unwrap_or_else(|p| p.into_inner());
        command(&mut g, if tx_first { "start tx_first" } else { "start" });
    }
    let mut rl =
        rustyline::DefaultEditor::new().map_err(|e| format!("cannot start the prompt: {e}"))?;
    loop {
        if stop.load(Relaxed) {
            break;
        }
        match rl.readline("testpmd> ") {
            Ok(line) => {
                let _ = rl.add_history_entry(line.as_str());
                let mut g = s.lock().unwrap_or_else(|p| p.into_inner());
                let go_on = command(&mut g, line.trim());
                drop(g);
                let _ = waker.notify();
                if !go_on {
                    break;
                }
            }
            // Ctrl-C, Ctrl-D or the end of piped input: leave like `quit`.
            Err(_) => break,
        }
    }
    done.store(true, Relaxed);
    let _ = waker.notify();
    let _ = service.join();
    let mut g = s.lock().unwrap_or_else(|p| p.into_inner());
    finish_prompt(&mut g, started.elapsed())?;
    g.out.line("Bye...");
    Ok(())
}
