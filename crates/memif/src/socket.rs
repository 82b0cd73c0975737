//! One listening socket shared by every server interface of this process that names it, as in
//! VPP and DPDK: a client says which interface it wants by the id in its INIT.
//!
//! Whichever interface's control path runs first does the work for all of them: it accepts new
//! clients, greets them with HELLO and reads their first message. A client whose INIT names a
//! registered, free interface is parked for that interface; every other first message is answered
//! with DISCONNECT and a reason (the interface's own handshake checks version, mode and secret).

use std::collections::HashMap;
use std::io::ErrorKind;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use memnic_shm::unix::{
    closers_busy, poll, PeerFds, PollFd, Sender, SeqpacketConn, SeqpacketListener, SocketAddrSpec,
};
use memnic_shm::ShmError;

use crate::msg::{Hello, Init, Msg, Name, APP_NAME};
use crate::port::{CLOSERS_BUSY, GREETINGS_BUSY};

/// Clients greeted but not yet dispatched, all users together; more are dropped (a flood must
/// not exhaust fds).
const MAX_GREETING: usize = 64;
/// Clients of one user (SO_PEERCRED's uid) greeted but not yet dispatched; more are refused
/// with [`GREETINGS_BUSY`], so that one user's silent clients cannot take every place (each
/// holds one until its INIT comes or the greeting times out). It also bounds what one user's
/// connections can hand us before its closes shut the gate: each first message brings up to
/// 253 descriptors (`SeqpacketConn::recv`).
const MAX_GREETING_PER_SENDER: usize = 8;
const MAX_ACCEPT_PER_POLL: usize = 16;

/// What one read from a control connection gave.
pub(crate) enum Read {
    /// Nothing pending (nonblocking socket).
    Nothing,
    /// The peer is gone (EOF or a socket error): drop the connection without a word.
    Closed(String),
    /// A message we refuse: answer DISCONNECT with this reason.
    Bad(&'static str),
    Msg(Msg, PeerFds),
}

/// Reads and decodes one message (with its fds) from a nonblocking control connection.
pub(crate) fn read_msg(conn: &SeqpacketConn) -> Read {
    if closers_busy(conn.sender()) {
        // Reading takes the descriptors a message carries into our table (up to 253), and
        // what our table cannot take the kernel releases inside the read, on this thread: so
        // nothing is read while the peer's user has closes waiting (or everyone has, past the
        // bound in all). A message waiting is refused unread.
        let mut look = [PollFd::readable(conn.as_fd())];
        return match poll(&mut look, Some(Duration::ZERO)) {
            Ok(0) => Read::Nothing,
            _ => Read::Bad(CLOSERS_BUSY),
        };
    }
    let mut buf = [0u8; 256];
    let got = match conn.recv(&mut buf) {
        Ok(g) => g,
        Err(ShmError::WouldBlock { .. }) => return Read::Nothing,
        Err(ShmError::Io { source, .. }) if source.kind() == ErrorKind::WouldBlock => {
            return Read::Nothing
        }
        Err(e) => return Read::Closed(format!("socket error: {e}")),
    };
    if got.is_eof() {
        return Read::Closed("peer closed the connection".into());
    }
    if got.truncated {
        return Read::Bad("Invalid message size");
    }
    let nfds = got.fds.len();
    match Msg::decode(&buf[..got.len]).and_then(|m| m.check_fds(nfds).map(|_| m)) {
        Ok(m) => Read::Msg(m, got.fds),
        Err(e) => Read::Bad(e.reason()),
    }
}

/// A client that sent a good INIT for one of our interfaces, waiting for it.
pub(crate) struct Pending {
    pub conn: SeqpacketConn,
    pub init: Init,
}

struct Interface {
    /// Handshaking or connected: further clients for this id are refused.
    busy: bool,
    ready: Option<Pending>,
    /// How long this interface gives each handshake step.
    step_timeout: Duration,
}

struct State {
    interfaces: HashMap<u32, Interface>,
    greeting: Vec<Greeted>,
}

/// A client greeted, whose INIT has not come yet.
struct Greeted {
    conn: SeqpacketConn,
    since: Instant,
    sender: Sender,
}

impl State {
    /// A greeted client that has not sent its INIT by then is dropped: the shortest handshake
    /// step of the interfaces on this socket (the INIT does not say which one it wants until it
    /// arrives).
    fn greeting_timeout(&self) -> Duration {
        self.interfaces
            .values()
            .map(|i| i.step_timeout)
            .min()
            .unwrap_or(Duration::ZERO)
    }
}

/// A listening socket and the server interfaces registered on it.
pub(crate) struct SharedListener {
    addr: SocketAddrSpec,
    listener: SeqpacketListener,
    state: Mutex<State>,
}

/// Every socket this process listens on, by address.
static OPEN: Mutex<Vec<Weak<SharedListener>>> = Mutex::new(Vec::new());

/// Why an interface could not be registered.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error("interface id {id} is already served on socket {addr}")]
    IdTaken { id: u32, addr: String },
    #[error(transparent)]
    Shm(#[from] ShmError),
}

impl SharedListener {
    /// Registers interface `id` on the socket at `addr`, binding it if this process does not
    /// listen there yet. A client greeted on this socket has `step_timeout` (or the shortest of
    /// the interfaces' timeouts) to send its INIT.
    pub fn register(
        addr: &SocketAddrSpec,
        id: u32,
        step_timeout: Duration,
    ) -> Result<Arc<SharedListener>, RegisterError> {
        let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
        open.retain(|w| w.strong_count() > 0);
        let existing = open
            .iter()
            .filter_map(Weak::upgrade)
            .find(|l| l.addr == *addr);
        let l = match existing {
            Some(l) => l,
            None => {
                let listener = SeqpacketListener::bind_replacing_stale(addr)?;
                listener.set_nonblocking(true)?;
                let l = Arc::new(SharedListener {
                    addr: addr.clone(),
                    listener,
                    state: Mutex::new(State {
                        interfaces: HashMap::new(),
                        greeting: Vec::new(),
                    }),
                });
                open.push(Arc::downgrade(&l));
                l
            }
        };
        let mut st = l.lock();
        if st.interfaces.contains_key(&id) {
            return Err(RegisterError::IdTaken {
                id,
                addr: addr.to_string(),
            });
        }
        st.interfaces.insert(
            id,
            Interface {
                busy: false,
                ready: None,
                step_timeout,
            },
        );
        drop(st);
        Ok(l)
    }

    /// The listening socket: readable when a client connects.
    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.listener)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Interface `id` goes away: a client parked for it is told so.
    pub fn unregister(&self, id: u32) {
        let gone = self.lock().interfaces.remove(&id);
        if let Some(p) = gone.and_then(|i| i.ready) {
            refuse(&p.conn, "interface closed");
        }
    }

    /// Interface `id` is free again (its connection ended).
    pub fn release(&self, id: u32) {
        if let Some(i) = self.lock().interfaces.get_mut(&id) {
            i.busy = false;
        }
    }

    /// Accepts and dispatches what arrived; with `take`, returns a client for `id` if one is
    /// waiting (the interface is then busy until [`release`](Self::release)).
    pub fn poll(&self, id: u32, take: bool) -> Option<Pending> {
        let mut st = self.lock();
        self.accept_new(&mut st);
        dispatch(&mut st);
        if !take {
            return None;
        }
        let i = st.interfaces.get_mut(&id)?;
        let p = i.ready.take()?;
        i.busy = true;
        Some(p)
    }

    fn accept_new(&self, st: &mut State) {
        // A bounded number per call: a flood of connects must not hold the control path here.
        for _ in 0..MAX_ACCEPT_PER_POLL {
            let conn = match self.listener.accept() {
                Ok(c) => c,
                Err(_) => return, // nothing pending (nonblocking) or a transient error
            };
            if st.greeting.len() >= MAX_GREETING || conn.set_nonblocking(true).is_err() {
                continue; // dropped: closes the connection
            }
            let sender = conn.sender();
            if closers_busy(sender) {
                // Descriptors this peer's user sent still wait to close (their servers do not
                // answer): no new peer of that user until they do, so that no peer grows our
                // descriptor table. Other users' peers are taken.
                refuse(&conn, CLOSERS_BUSY);
                continue;
            }
            if st.greeting.iter().filter(|g| g.sender == sender).count() >= MAX_GREETING_PER_SENDER
            {
                refuse(&conn, GREETINGS_BUSY);
                continue;
            }
            let hello = Msg::Hello(Hello::new(Name::truncated(APP_NAME)));
            if conn.send(&hello.encode(), &[]).is_ok() {
                st.greeting.push(Greeted {
                    conn,
                    since: Instant::now(),
                    sender,
                });
            }
        }
    }
}

/// Reads the first message of every greeted client and sends it where it belongs.
fn dispatch(st: &mut State) {
    let waiting = std::mem::take(&mut st.greeting);
    let timeout = st.greeting_timeout();
    for g in waiting {
        let init = match read_msg(&g.conn) {
            Read::Nothing if g.since.elapsed() < timeout => {
                st.greeting.push(g);
                continue;
            }
            Read::Nothing => {
                refuse(&g.conn, "Timeout waiting for INIT");
                continue;
            }
            Read::Closed(_) => continue,
            Read::Bad(reason) => {
                refuse(&g.conn, reason);
                continue;
            }
            Read::Msg(Msg::Init(init), _) => init,
            Read::Msg(..) => {
                refuse(&g.conn, "Unexpected message");
                continue;
            }
        };
        match st.interfaces.get_mut(&init.id) {
            None => refuse(&g.conn, "ID not found"),
            Some(i) if i.busy || i.ready.is_some() => refuse(&g.conn, "Already connected"),
            Some(i) => i.ready = Some(Pending { conn: g.conn, init }),
        }
    }
}

fn refuse(conn: &SeqpacketConn, reason: &str) {
    let _ = conn.send(&Msg::disconnect(reason).encode(), &[]);
}
