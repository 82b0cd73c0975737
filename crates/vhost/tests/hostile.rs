//! An untrusted frontend and an untrusted guest, end to end: raw vhost-user messages written on
//! the socket by hand (wrong sizes, unknown codes, missing and extra fds, bad memory tables,
//! bad ring set-ups, silence, a message cut off), and rings the guest writes badly. Every case
//! has its defined outcome (the connection closed with the reason logged, a chain counted and
//! returned, a ring counted broken and left alone, a frame that waits), and after every case
//! the process is still here and the next frontend is served: a well-behaved rust-vmm
//! `Frontend` connects and moves a frame.

mod common;

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::*;
use memnic_ethdev::{Mbuf, Port, RxQueue};
use memnic_shm::Region;
use memnic_vhost::chain::ChainError;
use memnic_vhost::split::{DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_WRITE};
use memnic_vhost::VhostConfig;
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::VhostBackend;
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

// Request codes (vhost-user spec).
const GET_FEATURES: u32 = 1;
const SET_FEATURES: u32 = 2;
const SET_OWNER: u32 = 3;
const SET_MEM_TABLE: u32 = 5;
const SET_LOG_BASE: u32 = 6;
const SET_LOG_FD: u32 = 7;
const SET_VRING_NUM: u32 = 8;
const SET_VRING_ADDR: u32 = 9;
const SET_VRING_BASE: u32 = 10;
const GET_VRING_BASE: u32 = 11;
const SET_VRING_KICK: u32 = 12;
const SET_VRING_CALL: u32 = 13;
const GET_PROTOCOL_FEATURES: u32 = 15;
const SET_PROTOCOL_FEATURES: u32 = 16;
const SET_VRING_ENABLE: u32 = 18;
const ADD_MEM_REG: u32 = 37;
/// Header flags: version 1, NEED_REPLY.
const V1: u32 = 0x1;
const NEED_REPLY: u32 = 0x8;
/// SET_VRING_KICK/CALL payload bit: no fd.
const NO_FD: u64 = 0x100;
/// Protocol features.
const P_REPLY_ACK: u64 = 1 << 3;
const P_LOG_SHMFD: u64 = 1 << 1;
const P_CONFIGURE_MEM_SLOTS: u64 = 1 << 15;

/// A frontend that writes raw messages.
struct Raw {
    s: UnixStream,
}

impl Raw {
    fn connect(path: &str) -> Raw {
        let s = UnixStream::connect(path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        Raw { s }
    }
    fn header(code: u32, flags: u32, size: u32) -> Vec<u8> {
        let mut b = Vec::with_capacity(12);
        b.extend_from_slice(&code.to_le_bytes());
        b.extend_from_slice(&flags.to_le_bytes());
        b.extend_from_slice(&size.to_le_bytes());
        b
    }
    /// Header (with the size field given) and payload in one write, the fds beside them. A
    /// port that already refused an earlier message of this frontend has shut the connection:
    /// the write then fails, which is left to the caller's look at why it was refused.
    fn msg(&self, code: u32, flags: u32, size: u32, payload: &[u8], fds: &[RawFd]) {
        let mut b = Raw::header(code, flags, size);
        b.extend_from_slice(payload);
        let sent = if fds.is_empty() {
            (&self.s).write_all(&b).map(|()| b.len())
        } else {
            self.s
                .send_with_fds(&[&b[..]], fds)
                .map_err(std::io::Error::from)
        };
        match sent {
            Ok(n) => assert_eq!(n, b.len()),
            Err(e) => assert!(
                matches!(
                    e.kind(),
                    std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
                ),
                "{e}"
            ),
        }
    }
    /// A well-formed request (version 1, the size its payload's).
    fn send(&self, code: u32, payload: &[u8], fds: &[RawFd]) {
        self.msg(code, V1, payload.len() as u32, payload, fds)
    }
    fn reply(&mut self) -> Vec<u8> {
        let mut h = [0u8; 12];
        self.s.read_exact(&mut h).unwrap();
        let size = u32::from_le_bytes(h[8..12].try_into().unwrap());
        let mut b = vec![0u8; size as usize];
        self.s.read_exact(&mut b).unwrap();
        b
    }
    fn reply_u64(&mut self) -> u64 {
        u64::from_le_bytes(self.reply().try_into().unwrap())
    }
    /// Whether the backend closed the connection (replies still queued are skipped).
    fn closed(&mut self) -> bool {
        let mut b = [0u8; 256];
        loop {
            match self.s.read(&mut b) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }
    /// SET_OWNER, GET_FEATURES, SET_FEATURES(VERSION_1 | extra): no REPLY_ACK.
    fn hello(&mut self, extra: u64) {
        self.send(SET_OWNER, &[], &[]);
        self.send(GET_FEATURES, &[], &[]);
        assert!(self.reply_u64() & VERSION_1 != 0);
        self.send(SET_FEATURES, &u64p(VERSION_1 | extra), &[]);
    }
    /// hello with PROTOCOL_FEATURES, then SET_PROTOCOL_FEATURES(`proto`).
    fn hello_protocol(&mut self, proto: u64) {
        self.hello(PROTOCOL_FEATURES);
        self.send(GET_PROTOCOL_FEATURES, &[], &[]);
        let _ = self.reply_u64();
        self.send(SET_PROTOCOL_FEATURES, &u64p(proto), &[]);
    }
    /// The guest's memory as one region at guest-physical 0, frontend address UVA.
    fn mem(&self, g: &Guest) {
        self.send(
            SET_MEM_TABLE,
            &memtable(1, &[(0, SIZE as u64, UVA, 0)]),
            &[g.fd.as_raw_fd()],
        );
    }
}

fn u64p(v: u64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}
fn state(index: u32, num: u32) -> Vec<u8> {
    let mut b = index.to_le_bytes().to_vec();
    b.extend_from_slice(&num.to_le_bytes());
    b
}
/// VhostUserVringAddr: index, flags, desc, used, avail, log.
fn addr(index: u32, desc: u64, used: u64, avail: u64) -> Vec<u8> {
    let mut b = index.to_le_bytes().to_vec();
    b.extend_from_slice(&0u32.to_le_bytes());
    for v in [desc, used, avail, 0] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b
}
fn region(b: &mut Vec<u8>, (gpa, size, uva, off): (u64, u64, u64, u64)) {
    for v in [gpa, size, uva, off] {
        b.extend_from_slice(&v.to_le_bytes());
    }
}
/// VhostUserMemory saying `num` regions, then the regions given.
fn memtable(num: u32, regions: &[(u64, u64, u64, u64)]) -> Vec<u8> {
    let mut b = num.to_le_bytes().to_vec();
    b.extend_from_slice(&0u32.to_le_bytes());
    for r in regions {
        region(&mut b, *r);
    }
    b
}
/// VhostUserSingleMemoryRegion (ADD_MEM_REG).
fn single(r: (u64, u64, u64, u64)) -> Vec<u8> {
    let mut b = 0u64.to_le_bytes().to_vec();
    region(&mut b, r);
    b
}

/// The port under test, its rx queue (the guest's tx virtqueue) and the frontends it has lost.
struct Bench {
    tp: TestPort,
    rxq: Box<dyn RxQueue>,
    got: Vec<Mbuf>,
    lost: u64,
    kick: EventFd,
    _pool: memnic_ethdev::Mempool,
}

impl Bench {
    fn new(tag: &str, timeout: Duration) -> Bench {
        Bench::with(tag, timeout, |_| {})
    }

    /// [`Bench::new`] with more of the port's configuration set by `cfg`.
    fn with(tag: &str, timeout: Duration, cfg: impl FnOnce(&mut VhostConfig)) -> Bench {
        let mut tp = TestPort::new(tag, |c| {
            c.message_timeout = timeout;
            cfg(c);
        });
        let pool = memnic_test_support::pool(tag, 256, 2048);
        let rxq = tp.port.take_rx_queue(0, &pool).unwrap();
        Bench {
            tp,
            rxq,
            got: Vec::new(),
            lost: 0,
            kick: EventFd::new(0).unwrap(),
            _pool: pool,
        }
    }

    /// Runs `queue` (which connects a frontend, queues its first message and lets go of its own
    /// copies of what the message carries) while the port serves another frontend (of another
    /// user, whom our user's closes never make the port refuse), so that
    /// the port cannot take that message before `queue` lets go (the test's close would then
    /// be the last, and wait); the other frontend then hangs up (counted in `lost`: the next
    /// `wait_disconnects` waits for both).
    fn queued_behind_another(&mut self, queue: impl FnOnce(&str) -> Raw) -> Raw {
        // Of another user: never refused for our user's closes.
        let path = self.tp.path.clone();
        let mut hold = memnic_shm::unix::on_a_thread_as_uid(4343, || Raw::connect(&path)).unwrap();
        hold.send(GET_FEATURES, &[], &[]);
        assert!(
            hold.reply_u64() & VERSION_1 != 0,
            "the other frontend is served"
        );
        let raw = queue(&self.tp.path);
        drop(hold);
        self.lost += 1;
        raw
    }

    /// The connection `raw` went through ends: closed by the port, with a reason containing
    /// `want`, the link down; then the next frontend is served.
    fn refused(&mut self, case: &str, mut raw: Raw, want: &str) {
        self.lost += 1;
        let why = self.tp.wait_disconnects(self.lost);
        assert!(
            why.contains(want),
            "{case}: reason {why:?} does not say {want:?}"
        );
        assert!(raw.closed(), "{case}: the connection is closed");
        assert!(!self.tp.port.link().up, "{case}: link down");
        self.next_is_served(case);
    }

    /// Frontend `f` hangs up: the port counts it lost; returns the reason it logged.
    fn hang_up(&mut self, f: Frontend) -> String {
        drop(f);
        self.lost += 1;
        self.tp.wait_disconnects(self.lost)
    }

    /// [`Bench::hang_up`], then the next frontend is served.
    fn hang_up_and_serve_the_next(&mut self, f: Frontend, case: &str) {
        self.hang_up(f);
        self.next_is_served(case);
    }

    /// A well-behaved frontend connects, a frame goes through, it leaves.
    fn next_is_served(&mut self, case: &str) {
        let g = Guest::new();
        let f = frontend(&self.tp.path, &g, &self.kick, false);
        let (a, l) = g.frame(0, 60, 0x77);
        g.desc(0, d(a, l, 0, 0));
        g.offer(0, 0);
        let n = self.got.len();
        poll(&mut *self.rxq, &mut self.got, case, |v| v.len() == n + 1);
        assert_eq!(self.got[n].to_vec(), vec![0x77; 60], "{case}");
        let why = self.hang_up(f);
        assert!(why.contains("peer disconnected"), "{case}: then {why:?}");
    }
}

type Case = (&'static str, &'static str, Box<dyn Fn(&mut Raw, &Guest)>);

fn run_cases(tag: &str, cases: Vec<Case>) {
    let mut b = Bench::new(tag, Duration::from_secs(5));
    let g = Guest::new();
    for (name, want, send) in cases {
        let mut raw = Raw::connect(&b.tp.path);
        send(&mut raw, &g);
        b.refused(name, raw, want);
    }
    assert_eq!(b.tp.port.connects(), b.lost);
}

#[test]
fn malformed_messages_close_the_connection_with_a_reason_and_the_next_frontend_is_served() {
    let inval = "invalid message";
    let cases: Vec<Case> = vec![
        (
            "payload shorter than the request's struct",
            inval,
            Box::new(|r, _| r.send(SET_FEATURES, &[0; 4], &[])),
        ),
        (
            "payload longer than the request's struct",
            inval,
            Box::new(|r, _| r.send(SET_VRING_NUM, &[0; 12], &[])),
        ),
        (
            "a payload on a request that takes none",
            inval,
            Box::new(|r, _| r.send(GET_FEATURES, &[0; 8], &[])),
        ),
        (
            "size field larger than the bytes sent",
            inval,
            Box::new(|r, _| {
                r.hello(0);
                r.msg(SET_VRING_NUM, V1, 8, &[1, 0, 0, 0], &[]);
            }),
        ),
        (
            "size field past the largest message",
            inval,
            Box::new(|r, _| r.msg(SET_MEM_TABLE, V1, 0x1001, &[0; 64], &[])),
        ),
        (
            "an unknown request code",
            inval,
            Box::new(|r, _| r.send(999, &[], &[])),
        ),
        (
            "request code 0",
            inval,
            Box::new(|r, _| r.send(0, &[], &[])),
        ),
        (
            "a request code we do not handle (SET_LOG_FD)",
            inval,
            Box::new(|r, _| r.send(SET_LOG_FD, &u64p(0), &[])),
        ),
        (
            "a request whose protocol feature was not negotiated (SET_LOG_BASE)",
            "inactive protocol operation",
            Box::new(|r, _| r.send(SET_LOG_BASE, &[0; 16], &[])),
        ),
        (
            "version 0",
            inval,
            Box::new(|r, _| r.msg(GET_FEATURES, 0, 0, &[], &[])),
        ),
        (
            "the reply flag on a request",
            inval,
            Box::new(|r, _| r.msg(GET_FEATURES, V1 | 0x4, 0, &[], &[])),
        ),
        (
            "reserved flag bits",
            inval,
            Box::new(|r, _| r.msg(GET_FEATURES, V1 | 0x100, 0, &[], &[])),
        ),
        (
            "features not offered",
            "were not offered",
            Box::new(|r, _| r.send(SET_FEATURES, &u64p(VERSION_1 | 1), &[])),
        ),
        (
            "protocol features not offered",
            "protocol features 0x2 were not offered",
            Box::new(|r, _| r.hello_protocol(P_REPLY_ACK | P_LOG_SHMFD)),
        ),
        (
            "SET_MEM_TABLE without its fd",
            inval,
            Box::new(|r, _| {
                r.hello(0);
                r.send(SET_MEM_TABLE, &memtable(1, &[(0, 4096, UVA, 0)]), &[]);
            }),
        ),
        (
            "SET_VRING_KICK without its fd (and without the no-fd bit)",
            inval,
            Box::new(|r, _| {
                r.hello(0);
                r.send(SET_VRING_KICK, &u64p(1), &[]);
            }),
        ),
        (
            "SET_VRING_KICK with two fds",
            inval,
            Box::new(|r, _| {
                let e = EventFd::new(0).unwrap();
                r.hello(0);
                r.send(SET_VRING_KICK, &u64p(1), &[e.as_raw_fd(), e.as_raw_fd()]);
            }),
        ),
        (
            "SET_VRING_KICK with an fd and the no-fd bit",
            inval,
            Box::new(|r, _| {
                let e = EventFd::new(0).unwrap();
                r.hello(0);
                r.send(SET_VRING_KICK, &u64p(1 | NO_FD), &[e.as_raw_fd()]);
            }),
        ),
        (
            "a kick fd that is not an eventfd (a pipe)",
            "the kick fd",
            Box::new(|r, _| {
                let (_rd, wr) = std::io::pipe().unwrap();
                r.hello(0);
                r.send(SET_VRING_KICK, &u64p(1), &[wr.as_raw_fd()]);
            }),
        ),
        (
            "a call fd that is not an eventfd (a memfd)",
            "the call fd",
            Box::new(|r, g| {
                r.hello(0);
                r.send(SET_VRING_CALL, &u64p(0), &[g.fd.as_raw_fd()]);
            }),
        ),
        (
            "closed after half a header",
            "partial message",
            Box::new(|r, _| {
                (&r.s)
                    .write_all(&Raw::header(GET_FEATURES, V1, 0)[..6])
                    .unwrap();
                r.s.shutdown(std::net::Shutdown::Write).unwrap();
            }),
        ),
        (
            "closed after a header whose payload never came",
            inval,
            Box::new(|r, _| {
                r.hello(0);
                r.msg(SET_VRING_NUM, V1, 8, &[], &[]);
                r.s.shutdown(std::net::Shutdown::Write).unwrap();
            }),
        ),
    ];
    run_cases("hostile-msg", cases);
}

/// A request that takes no fds is refused with them, and the fds are closed (not leaked):
/// the read end of a pipe whose write end we sent sees end of file once the port let go.
#[test]
fn fds_on_a_request_that_takes_none_are_refused_and_closed() {
    let mut b = Bench::new("hostile-fds", Duration::from_secs(5));
    let (mut rd, wr) = std::io::pipe().unwrap();
    let raw = Raw::connect(&b.tp.path);
    raw.send(GET_FEATURES, &[], &[wr.as_raw_fd()]);
    drop(wr);
    b.refused("an fd on GET_FEATURES", raw, "invalid message");
    let mut buf = [0u8; 1];
    assert_eq!(
        rd.read(&mut buf).unwrap(),
        0,
        "the port closed the fd it was sent"
    );
}

/// A descriptor rust-vmm would close on our control thread (here on GET_FEATURES, which takes
/// none) that is a file on a mount no table of ours names (a child's private ramfs: it could
/// as well be FUSE, whose close waits for its server): the message is taken before rust-vmm
/// sees it, the descriptor closed elsewhere, and the frontend dropped with why. The same file
/// as guest memory is refused the same way; the next frontend is served.
#[test]
fn a_file_on_a_mount_no_table_names_is_refused_before_rust_vmm_closes_it() {
    let mut b = Bench::new("hostile-mnt", Duration::from_secs(5));
    let foreign = memnic_test_support::ForeignMountFile::new("vhost");
    let raw = Raw::connect(&b.tp.path);
    raw.send(GET_FEATURES, &[], &[foreign.file.as_raw_fd()]);
    b.refused(
        "a foreign-mount fd on GET_FEATURES",
        raw,
        "on a mount no table names",
    );
    let mut raw = Raw::connect(&b.tp.path);
    raw.hello(0);
    raw.send(
        SET_MEM_TABLE,
        &memtable(1, &[(0, 0x10000, UVA, 0)]),
        &[foreign.file.as_raw_fd()],
    );
    b.refused(
        "a foreign-mount file as guest memory",
        raw,
        "on a mount no table names",
    );
}

/// Descriptors that come with a message's later bytes, where rust-vmm reads them in a second
/// `recvmsg` and closes them on the control thread: the header's first byte alone, then the
/// rest with a socket whose close waits on the frontend (the screen reads the whole header,
/// so it sees it); and a header with an eventfd, its body sent after with such a socket (the
/// peek of the whole message stops at the first descriptors: refused). Each frontend is
/// dropped with why, and the next is served.
#[test]
fn descriptors_past_a_messages_first_bytes_are_screened_too() {
    use memnic_shm::unix::lingering_socket;
    use vmm_sys_util::sock_ctrl_msg::ScmSocket;
    let mut b = Bench::new("hostile-split", Duration::from_secs(5));
    let (ours, theirs) = lingering_socket().unwrap();
    let raw = b.queued_behind_another(|path| {
        let raw = Raw::connect(path);
        let h = Raw::header(GET_FEATURES, V1, 0);
        (&raw.s).write_all(&h[..1]).unwrap();
        let sent = raw.s.send_with_fds(&[&h[1..]], &[ours.as_raw_fd()]);
        assert_eq!(sent.unwrap(), 11);
        drop(ours); // the port's copy is now the last: its close waits
        raw
    });
    b.refused("a header in two pieces", raw, "could stall its close");
    drop(theirs);

    let (ours, theirs) = lingering_socket().unwrap();
    let ev = EventFd::new(0).unwrap();
    let raw = b.queued_behind_another(|path| {
        let raw = Raw::connect(path);
        let h = Raw::header(SET_FEATURES, V1, 8);
        let sent = raw.s.send_with_fds(&[&h[..]], &[ev.as_raw_fd()]);
        assert_eq!(sent.unwrap(), 12);
        let body = u64p(VERSION_1);
        let sent = raw.s.send_with_fds(&[&body[..]], &[ours.as_raw_fd()]);
        assert_eq!(sent.unwrap(), 8);
        drop(ours);
        raw
    });
    b.refused(
        "descriptors on a body sent apart",
        raw,
        "not with its first",
    );
    drop(theirs);
}

/// More descriptors than a request may carry (32 eventfds, then a socket whose close waits on
/// the frontend): rust-vmm's `recvmsg` has room for 32, and the kernel would release the 33rd
/// inside it, on the control thread. The screen takes them all and drops the frontend; the next
/// is served.
#[test]
fn more_descriptors_than_a_request_carries_are_refused_before_rust_vmm_reads_them() {
    use memnic_shm::unix::lingering_socket;
    let mut b = Bench::new("hostile-33", Duration::from_secs(5));
    let (ours, theirs) = lingering_socket().unwrap();
    let evs: Vec<EventFd> = (0..32).map(|_| EventFd::new(0).unwrap()).collect();
    let mut fds: Vec<RawFd> = evs.iter().map(|e| e.as_raw_fd()).collect();
    fds.push(ours.as_raw_fd());
    let raw = b.queued_behind_another(|path| {
        let raw = Raw::connect(path);
        raw.send(GET_FEATURES, &[], &fds);
        drop(ours); // the port's copy is now the last: its close waits
        raw
    });
    b.refused("33 descriptors on GET_FEATURES", raw, "more than the 32");
    drop(theirs);
}

/// A descriptor attached to an out-of-band byte (MSG_OOB): a peek skips such a byte unless the
/// socket keeps it in line, and a plain read (rust-vmm's) drops it, releasing what it carries
/// on the control thread. In line, the screen sees it and refuses the message; the next
/// frontend is served at once, not after the 60-s linger.
#[test]
fn a_descriptor_on_an_out_of_band_byte_is_screened_too() {
    use memnic_shm::unix::{lingering_socket, send_out_of_band};
    let mut b = Bench::new("hostile-oob", Duration::from_secs(5));
    let (ours, theirs) = lingering_socket().unwrap();
    let raw = b.queued_behind_another(|path| {
        let raw = Raw::connect(path);
        send_out_of_band(raw.s.as_fd(), &[ours.as_fd()]).unwrap();
        drop(ours); // the port's copy is now the last: its close waits
        raw.send(GET_FEATURES, &[], &[]);
        raw
    });
    b.refused("an out-of-band byte with a descriptor", raw, "descriptor");
    drop(theirs);
}

/// Our descriptor table full when a message comes with a descriptor whose close waits: the
/// screen's look cannot install every copy (MSG_CTRUNC) and refuses the message, instead of
/// passing it to rust-vmm's read, which would leave the kernel to release that descriptor on
/// the control thread. Whichever refusal the port makes with the few slots left, the next
/// frontend is served at once once the table has room again.
#[test]
fn a_message_whose_descriptors_cannot_be_looked_at_is_refused() {
    use memnic_shm::unix::lingering_socket;
    let mut b = Bench::new("hostile-emfile", Duration::from_secs(5));
    let (ours, theirs) = lingering_socket().unwrap();
    let evs: Vec<EventFd> = (0..4).map(|_| EventFd::new(0).unwrap()).collect();
    let mut hold = Raw::connect(&b.tp.path);
    hold.send(GET_FEATURES, &[], &[]);
    assert!(hold.reply_u64() & VERSION_1 != 0);
    let raw = Raw::connect(&b.tp.path);
    let mut fds: Vec<RawFd> = evs.iter().map(|e| e.as_raw_fd()).collect();
    fds.push(ours.as_raw_fd());
    raw.send(GET_FEATURES, &[], &fds);
    drop(ours); // the port's copy is now the last: its close waits
    drop(evs);
    // Every free slot of our table taken; the held frontend's end frees a few for the port.
    let mut plug = Vec::new();
    while let Ok(f) = std::fs::File::open("/dev/null") {
        plug.push(f);
    }
    drop(hold);
    b.lost += 2;
    let why = b.tp.wait_disconnects(b.lost);
    drop(plug);
    assert!(
        why.contains("could not look at")
            || why.contains("could stall")
            || why.contains("frontend refused"),
        "{why}"
    );
    let mut raw = raw;
    assert!(raw.closed());
    b.next_is_served("after a full table");
    drop(theirs);
}

/// The requests the control thread answers itself (an early SET_VRING_ENABLE, SET_STATUS,
/// GET_STATUS) are screened like the rest: one that carries a descriptor whose close waits on
/// the frontend is refused, and that close is not made on the control thread (the next
/// frontend is served at once, not after the 60-s linger).
#[test]
fn a_request_the_control_thread_answers_itself_is_screened_too() {
    use memnic_shm::unix::lingering_socket;
    let mut b = Bench::new("hostile-own", Duration::from_secs(5));
    let (ours, theirs) = lingering_socket().unwrap();
    let raw = b.queued_behind_another(|path| {
        let raw = Raw::connect(path);
        raw.send(SET_VRING_ENABLE, &state(0, 1), &[ours.as_raw_fd()]);
        drop(ours); // the port's copy is now the last: its close waits
        raw
    });
    b.refused(
        "an early SET_VRING_ENABLE",
        raw,
        "descriptor 0 of a message",
    );
    drop(theirs);
}

/// A frontend that reconnects again and again, each time with a descriptor whose close waits on
/// it (a lingering socket, as a FUSE file whose server does not answer), fills its user's
/// closer threads: the port then refuses new frontends of that user (our descriptor table does
/// not grow with its reconnects) until those closes return, and serves the next one after; a
/// frontend of another user is served meanwhile.
#[test]
fn a_frontend_whose_descriptors_never_close_is_refused_once_its_users_closers_are_full() {
    use memnic_shm::unix::{
        closers_busy, closes_waiting, lingering_socket, on_a_thread_as_uid, Sender, MAX_CLOSERS,
    };
    use std::os::unix::fs::MetadataExt;
    let me = Sender::uid(std::fs::metadata("/proc/self").unwrap().uid());
    let mut b = Bench::new("hostile-closers", Duration::from_secs(5));
    let mut held = Vec::new();
    for _ in 0..MAX_CLOSERS {
        let (ours, theirs) = lingering_socket().unwrap();
        let mut raw = b.queued_behind_another(|path| {
            let raw = Raw::connect(path);
            raw.send(GET_FEATURES, &[], &[ours.as_raw_fd()]);
            drop(ours); // the port's copy is now the last: its close waits
            raw
        });
        b.lost += 1;
        let why = b.tp.wait_disconnects(b.lost);
        assert!(why.contains("descriptor 0 of a message"), "{why}");
        assert!(raw.closed());
        held.push(theirs);
    }
    wait_until("the peeked copies closed", || {
        closes_waiting() == MAX_CLOSERS
    });
    // Refused at once (not left in the backlog, where QEMU would wait with its lock held).
    let mut refused = Raw::connect(&b.tp.path);
    assert!(
        refused.closed(),
        "no frontend is served while every closer waits"
    );
    assert!(b.tp.port.last_reason().unwrap().contains("busy"));
    let mut other = on_a_thread_as_uid(4242, || Raw::connect(&b.tp.path)).unwrap();
    other.send(GET_FEATURES, &[], &[]);
    assert!(
        other.reply_u64() & VERSION_1 != 0,
        "another user's frontend is served"
    );
    drop(other);
    drop(held); // the peer lets go: every close returns
    wait_until("the closes returned", || !closers_busy(me));
    let mut next = Raw::connect(&b.tp.path);
    next.send(GET_FEATURES, &[], &[]);
    assert!(next.reply_u64() & VERSION_1 != 0, "then it is served");
    wait_until("every refused descriptor closed", || closes_waiting() == 0);
}

#[test]
fn bad_memory_tables_are_refused_and_the_next_frontend_is_served() {
    const S: u64 = SIZE as u64;
    let cases: Vec<Case> = vec![
        (
            "more regions than the message may carry (33)",
            "invalid message",
            Box::new(|r, g| {
                r.hello(0);
                let regions: Vec<_> = (0..33).map(|i| (i * S, S, UVA + i * S, 0)).collect();
                r.send(SET_MEM_TABLE, &memtable(33, &regions), &[g.fd.as_raw_fd()]);
            }),
        ),
        (
            "two regions sent, one announced",
            "invalid message",
            Box::new(|r, g| {
                r.hello(0);
                let t = memtable(1, &[(0, S, UVA, 0), (S, S, UVA + S, 0)]);
                r.send(SET_MEM_TABLE, &t, &[g.fd.as_raw_fd()]);
            }),
        ),
        (
            "two regions announced, one sent",
            "invalid message",
            Box::new(|r, g| {
                r.hello(0);
                let t = memtable(2, &[(0, S, UVA, 0)]);
                r.send(SET_MEM_TABLE, &t, &[g.fd.as_raw_fd(), g.fd.as_raw_fd()]);
            }),
        ),
        (
            "one region, two fds",
            "invalid message",
            Box::new(|r, g| {
                r.hello(0);
                let t = memtable(1, &[(0, S, UVA, 0)]);
                r.send(SET_MEM_TABLE, &t, &[g.fd.as_raw_fd(), g.fd.as_raw_fd()]);
            }),
        ),
        (
            "a region of size 0",
            "invalid message",
            Box::new(|r, g| {
                r.hello(0);
                let t = memtable(1, &[(0, 0, UVA, 0)]);
                r.send(SET_MEM_TABLE, &t, &[g.fd.as_raw_fd()]);
            }),
        ),
        (
            "guest_phys_addr + size wraps",
            "invalid message",
            Box::new(|r, g| {
                r.hello(0);
                let t = memtable(1, &[(u64::MAX - 0xfff, S, UVA, 0)]);
                r.send(SET_MEM_TABLE, &t, &[g.fd.as_raw_fd()]);
            }),
        ),
        (
            "userspace_addr + size wraps",
            "invalid message",
            Box::new(|r, g| {
                r.hello(0);
                let t = memtable(1, &[(0, S, u64::MAX - 0xfff, 0)]);
                r.send(SET_MEM_TABLE, &t, &[g.fd.as_raw_fd()]);
            }),
        ),
        (
            "overlapping regions",
            "overlap",
            Box::new(|r, g| {
                r.hello(0);
                let t = memtable(2, &[(0, S, UVA, 0), (S / 2, S, UVA + S, 0)]);
                r.send(SET_MEM_TABLE, &t, &[g.fd.as_raw_fd(), g.fd.as_raw_fd()]);
            }),
        ),
        (
            "regions apart in the guest but overlapping at the frontend's addresses",
            "frontend addresses 0x700000000000 and 0x700000080000 overlap",
            Box::new(|r, g| {
                r.hello(0);
                let t = memtable(2, &[(0, S, UVA, 0), (4 * S, S, UVA + S / 2, 0)]);
                r.send(SET_MEM_TABLE, &t, &[g.fd.as_raw_fd(), g.fd.as_raw_fd()]);
            }),
        ),
        (
            "mmap_offset past the fd's size",
            "fd is 1048576 bytes, but 2097152 bytes are needed",
            Box::new(|r, g| {
                r.hello(0);
                let t = memtable(1, &[(0, S, UVA, S)]);
                r.send(SET_MEM_TABLE, &t, &[g.fd.as_raw_fd()]);
            }),
        ),
        (
            // Checked before anything is mapped: a sparse file of that size would be mapped.
            "regions of more than 16 TiB in all",
            "more than the 0x100000000000 one frontend may map",
            Box::new(|r, g| {
                r.hello(0);
                let t = memtable(2, &[(0, S, UVA, 0), (S, 16 << 40, UVA + S, 0)]);
                r.send(SET_MEM_TABLE, &t, &[g.fd.as_raw_fd(), g.fd.as_raw_fd()]);
            }),
        ),
        (
            "a region larger than its fd",
            "memory region at guest address 0x0",
            Box::new(|r, g| {
                r.hello(0);
                let t = memtable(1, &[(0, 4 * S, UVA, 0)]);
                r.send(SET_MEM_TABLE, &t, &[g.fd.as_raw_fd()]);
            }),
        ),
        (
            "an fd that is not a memfd (a pipe)",
            "memory region at guest address 0x0",
            Box::new(|r, _| {
                let (_rd, wr) = std::io::pipe().unwrap();
                r.hello(0);
                let t = memtable(1, &[(0, 4096, UVA, 0)]);
                r.send(SET_MEM_TABLE, &t, &[wr.as_raw_fd()]);
            }),
        ),
        (
            "ADD_MEM_REG past the slots announced",
            "more than the 32 supported",
            Box::new(|r, _| {
                let m = Region::memfd("hostile-slot", 4096, false).unwrap();
                let fd = m.fd().unwrap().as_raw_fd();
                r.hello_protocol(P_REPLY_ACK | P_CONFIGURE_MEM_SLOTS);
                for i in 0..33u64 {
                    let at = i * 0x10000;
                    let m = single((at, 4096, UVA + at, 0));
                    r.msg(ADD_MEM_REG, V1 | NEED_REPLY, m.len() as u32, &m, &[fd]);
                    let ack = r.reply_u64();
                    assert_eq!(ack == 0, i < 32, "region {i}: ack {ack}");
                }
            }),
        ),
    ];
    run_cases("hostile-mem", cases);
}

/// After hello and the memory table: ring 1 with the given size and addresses (guest-physical
/// offsets from UVA), then base and kick.
fn ring(r: &mut Raw, g: &Guest, num: u32, desc: u64, used: u64, avail: u64) {
    r.hello(0);
    r.mem(g);
    start_ring(r, num, (desc, used, avail), 0);
}

/// Ring 1 with size `num`, its areas at `(desc, used, avail)` from UVA, started at `base`.
fn start_ring(r: &mut Raw, num: u32, (desc, used, avail): (u64, u64, u64), base: u32) {
    r.send(SET_VRING_NUM, &state(1, num), &[]);
    r.send(
        SET_VRING_ADDR,
        &addr(1, UVA + desc, UVA + used, UVA + avail),
        &[],
    );
    r.send(SET_VRING_BASE, &state(1, base), &[]);
    r.send(SET_VRING_KICK, &u64p(1 | NO_FD), &[]);
}

#[test]
fn bad_ring_set_ups_are_refused_and_the_next_frontend_is_served() {
    const S: u64 = SIZE as u64;
    let pow2 = "is not a power of two";
    let cases: Vec<Case> = vec![
        (
            "SET_VRING_NUM 3",
            pow2,
            Box::new(|r, _| r.send(SET_VRING_NUM, &state(1, 3), &[])),
        ),
        (
            "SET_VRING_NUM 0",
            pow2,
            Box::new(|r, _| r.send(SET_VRING_NUM, &state(1, 0), &[])),
        ),
        (
            "SET_VRING_NUM 65536",
            pow2,
            Box::new(|r, _| r.send(SET_VRING_NUM, &state(1, 65536), &[])),
        ),
        (
            "SET_VRING_NUM on ring 2 of 2",
            "ring 2 does not exist",
            Box::new(|r, _| r.send(SET_VRING_NUM, &state(2, 8), &[])),
        ),
        (
            "SET_VRING_ADDR on ring 7",
            "ring 7 does not exist",
            Box::new(|r, _| {
                r.send(
                    SET_VRING_ADDR,
                    &addr(7, UVA, UVA + 0x2000, UVA + 0x1000),
                    &[],
                )
            }),
        ),
        (
            "SET_VRING_BASE on ring 200",
            "ring 200 does not exist",
            Box::new(|r, _| r.send(SET_VRING_BASE, &state(200, 0), &[])),
        ),
        (
            "GET_VRING_BASE on ring 2",
            "ring 2 does not exist",
            Box::new(|r, _| r.send(GET_VRING_BASE, &state(2, 0), &[])),
        ),
        (
            "SET_VRING_KICK on ring 255",
            "ring 255 does not exist",
            Box::new(|r, _| r.send(SET_VRING_KICK, &u64p(255 | NO_FD), &[])),
        ),
        (
            "SET_VRING_ENABLE on ring 5",
            "ring 5 does not exist",
            Box::new(|r, _| {
                r.hello_protocol(P_REPLY_ACK);
                r.send(SET_VRING_ENABLE, &state(5, 1), &[]);
            }),
        ),
        (
            "SET_VRING_BASE 65536",
            "base 65536 does not fit",
            Box::new(|r, _| r.send(SET_VRING_BASE, &state(1, 65536), &[])),
        ),
        (
            "a descriptor table outside mapped memory",
            "the descriptor area",
            Box::new(|r, g| ring(r, g, 8, S, 0x2000, 0x1000)),
        ),
        (
            "a used ring running off the end of memory",
            "the used area",
            Box::new(|r, g| ring(r, g, 8, 0, S - 16, 0x1000)),
        ),
        (
            "an available ring in no region",
            "the available area",
            Box::new(|r, g| ring(r, g, 8, 0, 0x2000, 1 << 40)),
        ),
        (
            "a queue size whose rings do not fit memory",
            "the descriptor area",
            Box::new(|r, g| ring(r, g, 32768, S - 0x10000, 0x2000, 0x1000)),
        ),
        (
            "a misaligned descriptor table",
            "invalid message",
            Box::new(|r, g| ring(r, g, 8, 8, 0x2000, 0x1000)),
        ),
        (
            "a misaligned used ring",
            "invalid message",
            Box::new(|r, g| ring(r, g, 8, 0, 0x2002, 0x1000)),
        ),
        (
            // Every area's address is aligned, but mmap_offset 1 puts it one byte past an
            // aligned offset of our mapping (the queue's first burst panicked on the ring's
            // words, inside the gate, and the port hung).
            "ring areas misaligned in their region's file",
            "which is not 16-byte aligned",
            Box::new(|r, g| {
                r.hello(0);
                let t = memtable(1, &[(0, S - 4096, UVA, 1)]);
                r.send(SET_MEM_TABLE, &t, &[g.fd.as_raw_fd()]);
                start_ring(r, 8, (0, 0x2000, 0x1000), 0);
            }),
        ),
        (
            // The queue's position is a slot of 8; of 2 it would lie past the ring.
            "SET_VRING_NUM of another size on a running packed ring",
            "its size cannot change (8 to 2)",
            Box::new(|r, g| {
                r.hello(RING_PACKED);
                r.mem(g);
                start_ring(r, 8, (0, 0x2000, 0x1000), 0x8000);
                r.send(SET_VRING_NUM, &state(1, 8), &[]);
                r.send(SET_VRING_NUM, &state(1, 2), &[]);
            }),
        ),
        (
            "RING_PACKED turned on under a running split ring",
            "the ring layout (RING_PACKED) cannot change",
            Box::new(|r, g| {
                ring(r, g, 8, 0, 0x2000, 0x1000);
                r.send(SET_FEATURES, &u64p(VERSION_1), &[]);
                r.send(SET_FEATURES, &u64p(VERSION_1 | RING_PACKED), &[]);
            }),
        ),
        (
            "a new memory table that no longer holds the running ring",
            "not inside one memory region",
            Box::new(|r, g| {
                ring(r, g, 8, 0, 0x2000, 0x1000);
                let t = memtable(1, &[(S, S, UVA + S, 0)]);
                r.send(SET_MEM_TABLE, &t, &[g.fd.as_raw_fd()]);
            }),
        ),
    ];
    run_cases("hostile-ring", cases);
}

/// SET_VRING_BASE 65535 (the largest split-ring base) is honoured: the ring starts there and
/// its indices wrap to 0.
#[test]
fn the_largest_ring_base_is_honoured_and_wraps() {
    let mut b = Bench::new("hostile-base", Duration::from_secs(5));
    let g = Guest::new();
    let s = Setup {
        reply_ack: false,
        features: 0,
        vqs: vec![TXQ],
        base: u16::MAX,
    };
    let f = connect(&b.tp.path, &g, &b.kick, &s);
    for (k, idx) in [u16::MAX, 0].into_iter().enumerate() {
        let (a, l) = g.frame(k as u64, 60, k as u8 + 1);
        g.desc(k as u16, d(a, l, 0, 0));
        g.offer(idx, k as u16);
        poll(&mut *b.rxq, &mut b.got, "a frame", |v| v.len() == k + 1);
        assert_eq!(b.got[k].to_vec(), vec![k as u8 + 1; 60]);
        assert_eq!(g.used_idx(), idx.wrapping_add(1));
    }
    assert_eq!(f.get_vring_base(1).unwrap(), 1);
    b.hang_up(f);
}

/// A frontend that connects and says nothing, one that stops inside a header, and one that
/// stops reading our replies: each is dropped after the message timeout, with the reason, and
/// the next frontend is served; one that stops before its payload is dropped sooner (a
/// frontend sends a message in one piece: its body must follow its header at once). (On the old code the
/// first and fourth held the control thread until they left, the second and fourth for ever,
/// with the port unable even to stop.)
#[test]
fn a_silent_or_stalled_frontend_is_dropped_after_the_message_timeout() {
    let mut b = Bench::new("hostile-slow", Duration::from_millis(500));
    let silent = Raw::connect(&b.tp.path);
    b.refused("a silent frontend", silent, "sent nothing within 500ms");

    let half = Raw::connect(&b.tp.path);
    half.send(SET_OWNER, &[], &[]);
    (&half.s)
        .write_all(&Raw::header(GET_FEATURES, V1, 0)[..7])
        .unwrap();
    b.refused("half a header", half, "took longer than 500ms");

    let mut no_payload = Raw::connect(&b.tp.path);
    no_payload.hello(0);
    no_payload.msg(SET_VRING_NUM, V1, 8, &[], &[]);
    b.refused(
        "a payload that never comes",
        no_payload,
        "its header announces 8 bytes of body, 0 came with it",
    );

    // Requests until the socket is full both ways: our replies pile up unread.
    let deaf = Raw::connect(&b.tp.path);
    deaf.s.set_nonblocking(true).unwrap();
    let burst: Vec<u8> = (0..1000)
        .flat_map(|_| Raw::header(GET_FEATURES, V1, 0))
        .collect();
    let mut sent = 0usize;
    loop {
        match (&deaf.s).write(&burst) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                // Full now; the port may still be draining it: once it stops, we are done.
                std::thread::sleep(Duration::from_millis(20));
                match (&deaf.s).write(&burst) {
                    Ok(n) => sent += n,
                    Err(_) => break,
                }
            }
            Err(_) => break, // closed under us: it already timed out
        }
        assert!(
            sent < 1 << 30,
            "the port reads for ever without blocking on its replies"
        );
    }
    deaf.s.set_nonblocking(false).unwrap();
    b.refused(
        "a frontend that does not read its replies",
        deaf,
        "took longer than 500ms",
    );
}

/// A frontend that jams a running ring's call eventfd (clears O_NONBLOCK, which our copy
/// shares, and fills the counter): a call of ours that had looked just before would block its
/// lcore, and every install after it, for ever (`notify_blocking_elsewhere` on the same eventfd stands
/// in for it). The watchdog empties the line, which lets that write through, and drops the
/// frontend; the next one is served.
#[test]
fn a_frontend_that_jams_a_call_eventfd_is_emptied_and_dropped() {
    let mut b = Bench::new("hostile-jam", Duration::from_secs(5));
    let g = Guest::new();
    let mut raw = Raw::connect(&b.tp.path);
    ring(&mut raw, &g, 8, 0, 0x2000, 0x1000);
    let call = memnic_shm::unix::EventFd::new().unwrap();
    raw.send(SET_VRING_CALL, &u64p(1), &[call.as_fd().as_raw_fd()]);
    raw.send(GET_FEATURES, &[], &[]);
    let _ = raw.reply_u64();
    assert!(b.tp.port.link().up, "the ring runs");
    call.jam().unwrap();
    let ours = call.notify_blocking_elsewhere().unwrap();
    assert!(
        ours.returned_within(Duration::from_secs(5)),
        "the watchdog empties a jammed call eventfd"
    );
    b.refused("a jammed call eventfd", raw, "filled a call eventfd");
}

/// The guest moves avail.idx by more than the queue size: the ring is counted broken and not
/// walked (no chain is taken or returned), and stays dropped even once avail.idx is sane
/// again, until the frontend sets the ring up again (GET_VRING_BASE, SET_VRING_BASE,
/// SET_VRING_KICK), which resumes it where it stopped; a new frontend starts afresh.
#[test]
fn an_avail_index_jump_breaks_the_ring_until_it_is_set_up_again() {
    let mut b = Bench::new("hostile-jump", Duration::from_secs(5));
    let g = Guest::new();
    let f = frontend(&b.tp.path, &g, &b.kick, false);
    let (a, l) = g.frame(0, 60, 1);
    g.desc(0, d(a, l, 0, 0));
    g.offer(0, 0);
    poll(&mut *b.rxq, &mut b.got, "a frame", |v| v.len() == 1);

    g.set_avail_idx(1 + Q + 1);
    for _ in 0..10 {
        assert_eq!(b.rxq.rx_burst(&mut b.got, 32), 0);
    }
    assert_eq!(b.tp.port.broken_rings(), 1, "counted once, then left alone");
    assert_eq!(b.rxq.stats().errors, 1);
    assert_eq!(g.used_idx(), 1, "nothing walked or returned");
    assert_eq!(b.tp.port.bad_chains(), 0);

    // Sane again, but the ring stays dropped until it is set up again.
    g.offer(1, 0);
    for _ in 0..10 {
        assert_eq!(b.rxq.rx_burst(&mut b.got, 32), 0);
    }
    assert_eq!(g.used_idx(), 1);
    assert_eq!(f.get_vring_base(1).unwrap(), 1, "it stopped where it was");
    f.set_vring_base(1, 1).unwrap();
    f.set_vring_kick(1, &b.kick).unwrap();
    poll(&mut *b.rxq, &mut b.got, "the frame after set-up", |v| {
        v.len() == 2
    });
    assert_eq!(g.used_idx(), 2);

    // Broken again; the next frontend starts afresh.
    g.set_avail_idx(2 + 3 * Q);
    assert_eq!(b.rxq.rx_burst(&mut b.got, 32), 0);
    assert_eq!(b.tp.port.broken_rings(), 2);
    b.hang_up_and_serve_the_next(f, "after a broken ring");
}

/// The guest's rx virtqueue (our tx queue) with bad chains: each bad one is counted and
/// returned unused (length 0) and the frame goes to the next chain; a chain too small for the
/// frame keeps it waiting (handed back by tx_burst, nothing consumed) until the guest offers
/// room; a chain with no room past the header is refused as empty.
#[test]
fn hostile_rx_chains_are_refused_or_keep_the_frame_waiting() {
    for mrg in [false, true] {
        let tag = if mrg { "hostile-rx-mrg" } else { "hostile-rx" };
        let mut b = Bench::new(tag, Duration::from_secs(5));
        let pool = memnic_test_support::pool(&format!("{tag}-tx"), 64, 2048);
        let mut txq = b.tp.port.take_tx_queue(0, &pool).unwrap();
        let g = Guest::new();
        let s = Setup {
            reply_ack: false,
            features: if mrg { MRG_RXBUF } else { 0 },
            vqs: vec![RXQ, TXQ],
            base: 0,
        };
        let f = connect(&b.tp.path, &g, &b.kick, &s);
        wait_until("link up", || b.tp.port.link().up);
        let frame = |fill: u8| {
            let mut m = pool.alloc().unwrap();
            m.append(100).unwrap().fill(fill);
            vec![m]
        };
        let room = BUF + 0x8000;
        let mut idx = 0u16;
        let mut bad = 0u64;
        let cases = [
            (
                d(room, 2048, DESC_F_WRITE | DESC_F_NEXT, 9),
                "a next index past the queue",
            ),
            (d(room, 2048, 0, 0), "a read-only buffer"),
            (d(1 << 40, 2048, DESC_F_WRITE, 0), "a buffer outside memory"),
        ];
        for (desc, what) in cases {
            g.desc_in(RXQ, 1, desc);
            g.offer_in(RXQ, idx, 1);
            let mut pkts = frame(1);
            assert_eq!(txq.tx_burst(&mut pkts), 0, "{what}: not sent");
            assert_eq!(pkts.len(), 1, "{what}: the frame is handed back");
            bad += 1;
            assert_eq!(b.tp.port.bad_chains(), bad, "{what}: counted");
            assert_eq!(g.used_idx_in(RXQ), idx + 1, "{what}: returned");
            assert_eq!(g.used_elem_in(RXQ, idx), (1, 0), "{what}: unused");
            idx += 1;
        }
        // A head past the queue.
        g.offer_in(RXQ, idx, 200);
        let mut pkts = frame(1);
        assert_eq!(txq.tx_burst(&mut pkts), 0);
        bad += 1;
        assert_eq!(b.tp.port.bad_chains(), bad);
        assert_eq!(
            b.tp.port.last_bad_chain(),
            Some(ChainError::IndexOutOfRange {
                index: 200,
                size: Q
            })
        );
        idx += 1;

        // Too small for the frame: it waits, the chain stays the guest's.
        g.desc_in(RXQ, 2, d(room, (HDR + 50) as u32, DESC_F_WRITE, 0));
        g.offer_in(RXQ, idx, 2);
        for _ in 0..3 {
            assert_eq!(txq.tx_burst(&mut pkts), 0, "too small: waits");
            assert_eq!(pkts.len(), 1);
        }
        assert_eq!(g.used_idx_in(RXQ), idx, "too small: nothing consumed");
        assert_eq!(b.tp.port.bad_chains(), bad, "too small is not bad");
        // The guest gives the chain room: the frame goes.
        g.desc_in(RXQ, 2, d(room, 2048, DESC_F_WRITE, 0));
        assert_eq!(txq.tx_burst(&mut pkts), 1);
        assert!(pkts.is_empty());
        assert_eq!(g.used_elem_in(RXQ, idx), (2, (HDR + 100) as u32));
        let mut got = vec![0u8; 100];
        g.mem
            .read_bytes((room + HDR as u64) as usize, &mut got)
            .unwrap();
        assert_eq!(got, vec![1; 100]);
        idx += 1;

        // A zero-length chain, then a good one.
        g.desc_in(RXQ, 3, d(room, 0, DESC_F_WRITE, 0));
        g.desc_in(RXQ, 4, d(room, 2048, DESC_F_WRITE, 0));
        g.offer_in(RXQ, idx, 3);
        let mut pkts = frame(2);
        assert_eq!(txq.tx_burst(&mut pkts), 0);
        // It can never take a frame, so it is refused (a frame waiting behind it would wait
        // for ever), with or without MRG_RXBUF.
        bad += 1;
        assert_eq!(b.tp.port.last_bad_chain(), Some(ChainError::Empty));
        assert_eq!(g.used_elem_in(RXQ, idx), (3, 0));
        idx += 1;
        if !mrg {
            // Nor can one that holds only the header, without MRG_RXBUF (with it, the frame
            // may go on in the next chain).
            g.desc_in(RXQ, 3, d(room, HDR as u32, DESC_F_WRITE, 0));
            g.offer_in(RXQ, idx, 3);
            assert_eq!(txq.tx_burst(&mut pkts), 0);
            bad += 1;
            assert_eq!(g.used_elem_in(RXQ, idx), (3, 0));
            idx += 1;
        }
        assert_eq!(b.tp.port.bad_chains(), bad);
        g.offer_in(RXQ, idx, 4);
        assert_eq!(txq.tx_burst(&mut pkts), 1, "the next good chain takes it");
        assert_eq!(g.used_idx_in(RXQ), idx + 1);
        idx += 1;
        // A frame of two segments (60 + 40 bytes: short enough for the streamed copy, which
        // takes one segment only) arrives whole.
        let mut m = pool.alloc().unwrap();
        m.append(60).unwrap().fill(7);
        let mut tail = pool.alloc().unwrap();
        tail.append(40).unwrap().fill(8);
        assert!(m.chain(tail).is_ok());
        g.offer_in(RXQ, idx, 4);
        let mut pkts = vec![m];
        assert_eq!(txq.tx_burst(&mut pkts), 1, "a chained frame");
        assert_eq!(g.used_elem_in(RXQ, idx), (4, (HDR + 100) as u32));
        let mut got = vec![0u8; 100];
        g.mem
            .read_bytes((room + HDR as u64) as usize, &mut got)
            .unwrap();
        assert_eq!((&got[..60], &got[60..]), (&[7; 60][..], &[8; 40][..]));
        b.hang_up_and_serve_the_next(f, tag);
        drop(txq);
    }
}

/// A used element is written only where it differs from what the split ring holds (the same
/// element at the same place each lap is left alone): one the guest scribbled on, in its id,
/// its length or both, is written whole again, on the tx ring (length 0) and the rx ring
/// (header and frame), lap after lap.
#[test]
fn a_used_element_the_guest_changed_is_written_again() {
    let mut b = Bench::new("hostile-used-elem", Duration::from_secs(5));
    let pool = memnic_test_support::pool("hostile-used-elem-tx", 64, 2048);
    let mut txq = b.tp.port.take_tx_queue(0, &pool).unwrap();
    let g = Guest::new();
    let s = Setup {
        reply_ack: false,
        features: 0,
        vqs: vec![RXQ, TXQ],
        base: 0,
    };
    let f = connect(&b.tp.path, &g, &b.kick, &s);
    wait_until("link up", || b.tp.port.link().up);
    let room = BUF + 0x8000;
    // What the element holds before each frame: ours from the lap before, or the guest's.
    let scribbles = |want: (u32, u32)| {
        [
            None,
            Some((want.0 ^ 0x40, want.1)),
            Some((want.0, want.1 ^ 0x10_0000)),
            Some((!want.0, !want.1)),
        ]
    };
    for idx in 0..3 * Q {
        let want = (u32::from(idx % Q), 0);
        let scribble = scribbles(want)[idx as usize % 4];
        if let Some(e) = scribble {
            g.set_used_elem_in(TXQ, idx, e);
        }
        g.send(idx, idx % Q, u64::from(idx % Q), 60, idx as u8);
        poll(&mut *b.rxq, &mut b.got, "a frame", |v| v.len() == 1);
        b.got.clear();
        assert_eq!(g.used_idx(), idx + 1);
        assert_eq!(
            g.used_elem_in(TXQ, idx),
            want,
            "tx entry {idx} after {scribble:?}"
        );

        let want = (u32::from(idx % Q), (HDR + 100) as u32);
        let scribble = scribbles(want)[idx as usize % 4];
        if let Some(e) = scribble {
            g.set_used_elem_in(RXQ, idx, e);
        }
        g.desc_in(RXQ, idx % Q, d(room, 2048, DESC_F_WRITE, 0));
        g.offer_in(RXQ, idx, idx % Q);
        let mut pkts = {
            let mut m = pool.alloc().unwrap();
            m.append(100).unwrap().fill(idx as u8);
            vec![m]
        };
        assert_eq!(txq.tx_burst(&mut pkts), 1);
        assert_eq!(g.used_idx_in(RXQ), idx + 1);
        assert_eq!(
            g.used_elem_in(RXQ, idx),
            want,
            "rx entry {idx} after {scribble:?}"
        );
    }
    b.hang_up_and_serve_the_next(f, "hostile-used-elem");
    drop(txq);
}

/// SET_STATUS and GET_STATUS (the STATUS protocol feature, which rust-vmm's handler lacks: the
/// control thread serves them): the status is kept, a broken ring adds NEEDS_RESET, status 0
/// clears it and keeps the memory table (the ring set up again runs), a status that is not a
/// byte closes the connection with a reason, and without STATUS negotiated GET_STATUS is
/// refused.
#[test]
fn device_status_is_kept_reports_a_broken_ring_and_zero_keeps_the_memory() {
    const SET_STATUS: u32 = 39;
    const GET_STATUS: u32 = 40;
    const P_STATUS: u64 = 1 << 16;
    let mut b = Bench::new("hostile-status", Duration::from_secs(5));
    let g = Guest::new();
    let mut raw = Raw::connect(&b.tp.path);
    raw.hello(PROTOCOL_FEATURES);
    raw.send(GET_PROTOCOL_FEATURES, &[], &[]);
    assert!(raw.reply_u64() & P_STATUS != 0, "STATUS offered");
    raw.send(SET_PROTOCOL_FEATURES, &u64p(P_REPLY_ACK | P_STATUS), &[]);
    raw.msg(SET_STATUS, V1 | NEED_REPLY, 8, &u64p(0x0b), &[]);
    assert_eq!(raw.reply_u64(), 0, "acknowledged");
    raw.mem(&g);
    raw.send(SET_VRING_NUM, &state(1, Q as u32), &[]);
    raw.send(
        SET_VRING_ADDR,
        &addr(1, UVA + TXQ.desc, UVA + TXQ.used, UVA + TXQ.avail),
        &[],
    );
    raw.send(SET_VRING_BASE, &state(1, 0), &[]);
    raw.send(SET_VRING_KICK, &u64p(1 | NO_FD), &[]);
    raw.send(SET_VRING_ENABLE, &state(1, 1), &[]);
    raw.send(SET_STATUS, &u64p(0x0f), &[]);
    raw.send(GET_STATUS, &[], &[]);
    assert_eq!(raw.reply_u64(), 0x0f);
    let (a, l) = g.frame(0, 60, 5);
    g.desc(0, d(a, l, 0, 0));
    g.offer(0, 0);
    poll(&mut *b.rxq, &mut b.got, "a frame", |v| v.len() == 1);

    // The guest breaks the ring: the status says the device needs a reset.
    g.set_avail_idx(2 + Q);
    assert_eq!(b.rxq.rx_burst(&mut b.got, 32), 0);
    assert_eq!(b.tp.port.broken_rings(), 1);
    raw.send(GET_STATUS, &[], &[]);
    assert_eq!(raw.reply_u64(), 0x0f | 0x40, "NEEDS_RESET");

    // Status 0 (the driver resets the device) clears NEEDS_RESET; the memory table stays, so
    // a ring set up again runs (QEMU stops the rings after it and never resends the table).
    raw.msg(SET_STATUS, V1 | NEED_REPLY, 8, &u64p(0), &[]);
    assert_eq!(raw.reply_u64(), 0);
    raw.send(GET_STATUS, &[], &[]);
    assert_eq!(raw.reply_u64(), 0);
    raw.send(GET_VRING_BASE, &state(1, 0), &[]);
    assert_eq!(raw.reply(), state(1, 1), "stopped where it got to");
    raw.send(SET_VRING_BASE, &state(1, 1), &[]);
    raw.send(SET_VRING_KICK, &u64p(1 | NO_FD), &[]);
    let (a, l) = g.frame(1, 60, 6);
    g.desc(1, d(a, l, 0, 0));
    g.offer(1, 1);
    poll(&mut *b.rxq, &mut b.got, "a frame after the reset", |v| {
        v.len() == 2
    });

    raw.send(SET_STATUS, &u64p(0x100), &[]);
    b.refused("a status that is not a byte", raw, "is not a byte");

    let mut raw = Raw::connect(&b.tp.path);
    raw.hello(0);
    raw.send(GET_STATUS, &[], &[]);
    b.refused("GET_STATUS without STATUS", raw, "invalid message");
}

// ---- packed rings, end to end ----

/// A packed-ring frontend on the guest's tx virtqueue (our rx queue), with `features` besides
/// RING_PACKED, its first frame through (so the ring is known to be running).
fn packed_tx(
    b: &mut Bench,
    g: &Guest,
    features: u64,
) -> (vhost::vhost_user::Frontend, PackedDriver) {
    let s = Setup {
        reply_ack: false,
        features: RING_PACKED | features,
        vqs: vec![TXQ],
        base: PACKED_START,
    };
    let f = connect(&b.tp.path, g, &b.kick, &s);
    let mut drv = PackedDriver::new(TXQ);
    let (a, l) = g.frame(0, 60, 0x11);
    let head = drv.post(g, 1, &[(a, l, 0)]);
    poll(&mut *b.rxq, &mut b.got, "the first packed frame", |v| {
        v.len() == 1
    });
    assert_eq!(b.got[0].to_vec(), vec![0x11; 60]);
    if features & IN_ORDER == 0 {
        drv.assert_used(g, head, 1, 0, "the first packed frame");
    }
    (f, drv)
}

/// Hostile packed tx chains, each followed by a good frame: every bad chain is counted with
/// its reason and handed back unused (length 0) at its head's slot, with its last slot's id,
/// the used position moving past all its slots (the good frame after it is found and its slot
/// handed back); no frame comes of it. A valid indirect table's frame arrives. Then a chain
/// with NEXT on every slot: the ring is counted broken, nothing is handed back, it stays
/// dropped until the frontend sets it up again where it stopped, and the next frontend is
/// served.
#[test]
fn hostile_packed_tx_chains_are_refused_and_the_next_frame_arrives_whole() {
    let mut b = Bench::new("hostile-packed-tx", Duration::from_secs(5));
    let g = Guest::new();
    let (f, mut drv) = packed_tx(&mut b, &g, INDIRECT_DESC);
    let (a, l) = g.frame(0, 60, 0x22);
    let table = BUF + 0x8000;
    let far = 1u64 << 40;
    const NEXT: u16 = DESC_F_NEXT;
    const IND: u16 = DESC_F_INDIRECT;
    let size = SIZE as u64;
    type Case = (
        &'static str,
        Vec<(u64, u32, u16)>,
        Vec<memnic_vhost::packed::PackedDesc>,
        ChainError,
    );
    let cases: Vec<Case> = vec![
        (
            "a buffer outside every region",
            vec![(far, l, 0)],
            vec![],
            ChainError::Unmapped { addr: far, len: l },
        ),
        (
            "a buffer wrapping the address space",
            vec![(u64::MAX - 15, 64, 0)],
            vec![],
            ChainError::Unmapped {
                addr: u64::MAX - 15,
                len: 64,
            },
        ),
        (
            "a buffer running off the end of guest memory",
            vec![(a, l, NEXT), (size - 16, 64, 0)],
            vec![],
            ChainError::Unmapped {
                addr: size - 16,
                len: 64,
            },
        ),
        (
            "lengths whose sum overflows 32 bits",
            vec![(a, l, NEXT), (a, u32::MAX - 8, NEXT), (a, l, 0)],
            vec![],
            ChainError::Overflow,
        ),
        (
            "a chain shorter than the virtio-net header",
            vec![(a, 5, NEXT), (a, 4, 0)],
            vec![],
            ChainError::ShortHeader(9),
        ),
        (
            "a device-writable buffer in a tx chain",
            vec![(a, l, DESC_F_WRITE)],
            vec![],
            ChainError::WrongDirection("device-writable"),
        ),
        (
            "an indirect table of 20 bytes",
            vec![(table, 20, IND)],
            vec![],
            ChainError::BadIndirectLen(20),
        ),
        (
            "an indirect table longer than the queue",
            vec![(table, 16 * (Q as u32 + 1), IND)],
            vec![],
            ChainError::BadIndirectLen(16 * (Q as u32 + 1)),
        ),
        (
            "an indirect table outside memory",
            vec![(far, 32, IND)],
            vec![],
            ChainError::Unmapped { addr: far, len: 32 },
        ),
        (
            "an indirect descriptor with NEXT",
            vec![(table, 16, IND | NEXT), (a, l, 0)],
            vec![pd(a, l, 0, 0)],
            ChainError::IndirectWithNext,
        ),
        (
            "an indirect table inside an indirect table",
            vec![(table, 32, IND)],
            vec![pd(a, 12, 0, 0), pd(table, 32, 0, IND)],
            ChainError::NestedIndirect,
        ),
        (
            "an indirect table whose buffer is outside memory",
            vec![(table, 32, IND)],
            vec![pd(a, 12, 0, 0), pd(far, 60, 0, 0)],
            ChainError::Unmapped { addr: far, len: 60 },
        ),
    ];
    let mut bad = 0u64;
    let mut frames = b.got.len();
    for (k, (what, bufs, entries, want)) in cases.into_iter().enumerate() {
        for (i, e) in entries.iter().enumerate() {
            g.mem
                .write_bytes((table + 16 * i as u64) as usize, &e.to_bytes())
                .unwrap();
        }
        let id = 100 + k as u16;
        let head = drv.post(&g, id, &bufs);
        assert_eq!(b.rxq.rx_burst(&mut b.got, 32), 0, "{what}: no frame");
        bad += 1;
        assert_eq!(b.tp.port.bad_chains(), bad, "{what}: counted");
        assert_eq!(b.rxq.stats().errors, bad, "{what}: a queue error");
        assert_eq!(b.tp.port.last_bad_chain(), Some(want), "{what}: why");
        drv.assert_used(&g, head, id, 0, what);

        let fill = 0x30 + k as u8;
        let (a2, l2) = g.frame(1, 60 + k, fill);
        let head = drv.post(&g, 7, &[(a2, l2, 0)]);
        assert_eq!(b.rxq.rx_burst(&mut b.got, 32), 1, "{what}: the next frame");
        assert_eq!(b.got[frames].to_vec(), vec![fill; 60 + k], "{what}: whole");
        frames += 1;
        drv.assert_used(&g, head, 7, 0, what);
    }

    // Bad chains between good ones in one burst: the good frames arrive in their order, each
    // whole, and every chain is handed back.
    let mut heads = Vec::new();
    for (i, fill) in [0x51u8, 0, 0x52, 0, 0, 0x53].into_iter().enumerate() {
        let id = 20 + i as u16;
        let bufs = if fill == 0 {
            vec![(far, l, 0)]
        } else {
            let (a, l) = g.frame(3 + i as u64, 60 + i, fill);
            vec![(a, l, 0)]
        };
        heads.push((drv.post(&g, id, &bufs), id));
    }
    assert_eq!(
        b.rxq.rx_burst(&mut b.got, 32),
        3,
        "good frames around bad ones"
    );
    for (i, fill) in [(0, 0x51u8), (2, 0x52), (5, 0x53)] {
        assert_eq!(
            b.got[frames].to_vec(),
            vec![fill; 60 + i],
            "frame {fill:#x}"
        );
        frames += 1;
    }
    bad += 3;
    assert_eq!(b.tp.port.bad_chains(), bad, "the bad ones counted");
    for (head, id) in heads {
        drv.assert_used(&g, head, id, 0, "a mixed burst");
    }

    // A valid indirect table: header and frame in two of its entries.
    let (a2, _) = g.frame(2, 100, 0x44);
    for (i, e) in [pd(a2, HDR as u32, 0, 0), pd(a2 + HDR as u64, 100, 0, 0)]
        .iter()
        .enumerate()
    {
        g.mem
            .write_bytes((table + 16 * i as u64) as usize, &e.to_bytes())
            .unwrap();
    }
    let head = drv.post(&g, 8, &[(table, 32, IND)]);
    assert_eq!(b.rxq.rx_burst(&mut b.got, 32), 1, "a valid indirect table");
    assert_eq!(b.got[frames].to_vec(), vec![0x44; 100]);
    frames += 1;
    drv.assert_used(&g, head, 8, 0, "a valid indirect table");
    assert_eq!(b.tp.port.broken_rings(), 0);

    // NEXT on every slot: no chain ends within the queue.
    let start = (drv.idx, drv.wrap);
    let at = drv.pos();
    let head = drv.post(&g, 9, &vec![(a, l, NEXT); Q as usize]);
    for _ in 0..5 {
        assert_eq!(b.rxq.rx_burst(&mut b.got, 32), 0, "an endless chain");
    }
    assert_eq!(b.tp.port.broken_rings(), 1, "counted once, then left alone");
    assert_eq!(b.tp.port.bad_chains(), bad, "not a bad chain: the ring");
    drv.assert_avail(&g, head, "an endless chain is not handed back");
    // Set up again where it stopped (the driver has made the chain end meanwhile).
    let pos = f.get_vring_base(1).unwrap();
    assert_eq!(pos & 0xffff, at as u32, "it stopped at the endless chain");
    (drv.idx, drv.wrap) = start;
    drv.take_back(&g, Q);
    let head = drv.post(&g, 9, &[(a, l, 0)]);
    f.set_vring_base(1, at).unwrap();
    f.set_vring_kick(1, &b.kick).unwrap();
    poll(&mut *b.rxq, &mut b.got, "the frame after set-up", |v| {
        v.len() == frames + 1
    });
    assert_eq!(b.got[frames].to_vec(), vec![0x22; 60]);
    drv.assert_used(&g, head, 9, 0, "after set-up");
    b.hang_up_and_serve_the_next(f, "after a broken packed ring");
}

/// The guest's packed rx virtqueue (our tx queue) with bad chains, with and without
/// MRG_RXBUF: each is counted with its reason and handed back unused at its head's slot, the
/// frame handed back to us; a good chain after each gets the frame whole (header with
/// num_buffers 1, then the bytes). A chain that never ends breaks the ring.
#[test]
fn hostile_packed_rx_chains_are_refused_and_the_frame_goes_to_the_next_one() {
    for mrg in [false, true] {
        let tag = if mrg {
            "hostile-prx-mrg"
        } else {
            "hostile-prx"
        };
        let mut b = Bench::new(tag, Duration::from_secs(5));
        let pool = memnic_test_support::pool(&format!("{tag}-tx"), 64, 2048);
        let mut txq = b.tp.port.take_tx_queue(0, &pool).unwrap();
        let g = Guest::new();
        let s = Setup {
            reply_ack: false,
            features: RING_PACKED | if mrg { MRG_RXBUF } else { 0 },
            vqs: vec![RXQ, TXQ],
            base: PACKED_START,
        };
        let f = connect(&b.tp.path, &g, &b.kick, &s);
        wait_until("link up", || b.tp.port.link().up);
        let frame = |fill: u8| {
            let mut m = pool.alloc().unwrap();
            m.append(100).unwrap().fill(fill);
            vec![m]
        };
        let mut drv = PackedDriver::new(RXQ);
        let room = BUF + 0x8000;
        const W: u16 = DESC_F_WRITE;
        let far = 1u64 << 40;
        let mut cases = vec![
            (
                "a read-only buffer",
                vec![(room, 2048, 0)],
                ChainError::WrongDirection("device-readable"),
            ),
            (
                "a read-only buffer after a writable one",
                vec![(room, 1024, W | DESC_F_NEXT), (room + 1024, 1024, 0)],
                ChainError::WrongDirection("device-readable"),
            ),
            (
                "a buffer outside memory",
                vec![(far, 2048, W)],
                ChainError::Unmapped {
                    addr: far,
                    len: 2048,
                },
            ),
            (
                "a buffer wrapping the address space",
                vec![(room, 16, W | DESC_F_NEXT), (u64::MAX - 7, 2048, W)],
                ChainError::Unmapped {
                    addr: u64::MAX - 7,
                    len: 2048,
                },
            ),
            ("a zero-length chain", vec![(room, 0, W)], ChainError::Empty),
        ];
        if !mrg {
            // Without MRG_RXBUF a chain that holds only the header can never take a frame.
            cases.push((
                "a chain with room for the header only",
                vec![(room, HDR as u32, W)],
                ChainError::Empty,
            ));
        }
        let mut bad = 0u64;
        for (k, (what, bufs, want)) in cases.into_iter().enumerate() {
            let id = 50 + k as u16;
            let head = drv.post(&g, id, &bufs);
            let mut pkts = frame(k as u8);
            assert_eq!(txq.tx_burst(&mut pkts), 0, "{what}: not sent");
            assert_eq!(pkts.len(), 1, "{what}: the frame is handed back");
            bad += 1;
            assert_eq!(b.tp.port.bad_chains(), bad, "{what}: counted");
            assert_eq!(b.tp.port.last_bad_chain(), Some(want), "{what}: why");
            drv.assert_used(&g, head, id, 0, what);

            // The guest clears its buffer; a good chain gets the frame whole.
            g.mem.write_bytes(room as usize, &[0xee; 2048]).unwrap();
            let head = drv.post(&g, 7, &[(room, 2048, W)]);
            assert_eq!(
                txq.tx_burst(&mut pkts),
                1,
                "{what}: the next chain takes it"
            );
            assert!(pkts.is_empty());
            drv.assert_used(&g, head, 7, (HDR + 100) as u32, what);
            let mut got = vec![0u8; HDR + 100];
            g.mem.read_bytes(room as usize, &mut got).unwrap();
            let mut hdr = [0u8; HDR];
            hdr[10] = 1; // num_buffers
            assert_eq!(got[..HDR], hdr, "{what}: the header");
            assert_eq!(got[HDR..], vec![k as u8; 100], "{what}: the frame");

            // The same buffer again with one byte of our header changed (a header left as we
            // wrote it is not written again; one that differs anywhere is).
            let poke = [3, HDR - 2, HDR - 1][k % 3];
            g.mem.write_bytes(room as usize + poke, &[0x55]).unwrap();
            let head = drv.post(&g, 8, &[(room, 2048, W)]);
            let mut pkts = frame(0x40 + k as u8);
            assert_eq!(txq.tx_burst(&mut pkts), 1, "{what}: the buffer again");
            drv.assert_used(&g, head, 8, (HDR + 100) as u32, what);
            g.mem.read_bytes(room as usize, &mut got).unwrap();
            assert_eq!(got[..HDR], hdr, "{what}: the header, byte {poke} restored");
            assert_eq!(
                got[HDR..],
                vec![0x40 + k as u8; 100],
                "{what}: the frame again"
            );
        }
        assert_eq!(b.tp.port.broken_rings(), 0);

        // NEXT on every slot: the ring is broken, nothing is written or handed back.
        let head = drv.post(&g, 9, &vec![(room, 64, W | DESC_F_NEXT); Q as usize]);
        let mut pkts = frame(9);
        assert_eq!(txq.tx_burst(&mut pkts), 0, "an endless chain");
        assert_eq!(pkts.len(), 1);
        assert_eq!(b.tp.port.broken_rings(), 1);
        assert_eq!(b.tp.port.bad_chains(), bad);
        drv.assert_avail(&g, head, "an endless rx chain is not handed back");
        assert_eq!(txq.tx_burst(&mut pkts), 0, "left alone");
        assert_eq!(b.tp.port.broken_rings(), 1);
        b.hang_up_and_serve_the_next(f, tag);
        drop(txq);
    }
}

/// IN_ORDER on a packed ring (2d326e1): a dequeue burst hands its run of tx chains back as
/// one used descriptor, whose slots must stay within one lap. The driver here makes two
/// chains that share slots: A takes slots 1-7, and B starts at slot 0 in the next lap and
/// runs on through slots 1-7 again (walk_packed follows NEXT without looking at the slots'
/// flags), so A and B together cover 15 slots, nearly two laps. Each burst stops at a lap: the
/// first takes A alone (one used descriptor at slot 1), the second B, a whole lap (one at
/// slot 0, in the next lap), the used position always a slot of the ring, nothing written
/// past the descriptor area; then the ring runs on. (Before the fix the first burst took both and moved
/// the used position to slot 8 of a ring of 8: the next burst panicked in a debug build and
/// wrote past the ring in a release one.)
#[test]
fn a_packed_in_order_burst_stops_at_a_lap_when_chains_run_through_taken_slots() {
    let mut b = Bench::new("hostile-packed-lap", Duration::from_secs(5));
    let g = Guest::new();
    // Bytes just past the descriptor area, which the device must never write.
    let past = (TXQ.desc + 16 * Q as u64) as usize;
    g.mem.write_bytes(past, &[0xcc; 128]).unwrap();
    let (f, mut drv) = packed_tx(&mut b, &g, IN_ORDER);
    drv.assert_used(&g, (0, true), 1, 0, "the first frame");
    assert_eq!(drv.pos(), 0x8001);

    // A: slots 1-7 of lap 1, its frame in slot 1, empty buffers after it.
    let (fa, la) = g.frame(1, 60, 0xa1);
    let mut a = vec![(fa, la, DESC_F_NEXT)];
    a.extend(vec![(fa, 0, DESC_F_NEXT); 5]);
    a.push((fa, 0, 0));
    let head_a = drv.post(&g, 20, &a);
    assert_eq!(head_a, (1, true));
    // B: slot 0 of lap 2, chained on into slots 1-7 (A's, their flags those of lap 1).
    let (fb, lb) = g.frame(2, 60, 0xb2);
    let head_b = drv.post(&g, 21, &[(fb, lb, DESC_F_NEXT)]);
    assert_eq!(head_b, (0, false));

    let n = b.got.len();
    assert_eq!(
        b.rxq.rx_burst(&mut b.got, 32),
        1,
        "the burst stops at a lap: A alone"
    );
    assert_eq!(b.got[n].to_vec(), vec![0xa1; 60]);
    drv.assert_used(&g, head_a, 20, 0, "A: one descriptor for its 7 slots");
    drv.assert_avail(&g, head_b, "B is still the driver's");
    // Our used descriptor at slot 1 ended B there; the driver chains it on again, so B
    // covers slots 0-7: exactly one lap, which one burst may take.
    g.pdesc_in(TXQ, 1, pd(fa, la, 20, DESC_F_NEXT | avail_bits(true)));

    assert_eq!(b.rxq.rx_burst(&mut b.got, 32), 1, "B in the next burst");
    let mut want = vec![0xb2; 60];
    want.extend([0; HDR]);
    want.extend([0xa1; 60]);
    assert_eq!(
        b.got[n + 1].to_vec(),
        want,
        "B: its buffer, then A's slots'"
    );
    // B ended at slot 7 (A's last slot): its id.
    drv.assert_used(&g, head_b, 20, 0, "B: its used descriptor at slot 0, lap 2");
    let mut after = [0u8; 128];
    g.mem.read_bytes(past, &mut after).unwrap();
    assert_eq!(
        after, [0xcc; 128],
        "nothing written past the descriptor area"
    );
    assert_eq!(b.rxq.rx_burst(&mut b.got, 32), 0, "nothing more");
    assert_eq!(b.tp.port.bad_chains(), 0);
    assert_eq!(b.tp.port.broken_rings(), 0);

    // The ring goes on: B's 8 slots took the position to slot 0 of lap 3. (The driver takes
    // back slots 1-7, still marked available in lap 1 = lap 3 since A's and B's used
    // descriptors went in slots 1 and 0.)
    drv.idx = 0;
    drv.wrap = true;
    drv.take_back(&g, Q);
    let (fc, lc) = g.frame(3, 60, 0xc3);
    let head_c = drv.post(&g, 22, &[(fc, lc, 0)]);
    assert_eq!(b.rxq.rx_burst(&mut b.got, 32), 1, "the next frame");
    assert_eq!(b.got[n + 2].to_vec(), vec![0xc3; 60]);
    drv.assert_used(&g, head_c, 22, 0, "the next frame");
    assert_eq!(f.get_vring_base(1).unwrap() & 0xffff, 0x8001);
    b.hang_up_and_serve_the_next(f, "after an in-order burst of two laps");
}

/// IN_ORDER on a packed ring with `rx-hold=1`: a dequeue burst that comes back full holds its run of chains
/// for the next burst, until the run covers half the ring (4 slots of 8 here); a burst that
/// finds the ring dry hands back what is held, and so does a ring stopped (GET_VRING_BASE)
/// while a run is held, so the used position the frontend reads back is the avail position.
/// Each run goes back as one used descriptor at its first slot, with its last chain's id.
#[test]
fn a_packed_in_order_run_is_held_over_full_bursts_and_handed_back() {
    let mut b = Bench::with("hostile-packed-held", Duration::from_secs(5), |c| {
        c.rx_hold = true;
    });
    let g = Guest::new();
    let (f, mut drv) = packed_tx(&mut b, &g, IN_ORDER);
    drv.assert_used(&g, (0, true), 1, 0, "the first frame (a burst not full)");
    let post = |drv: &mut PackedDriver, id: u16| {
        let (a, l) = g.frame(u64::from(id), 60, id as u8);
        drv.post(&g, id, &[(a, l, 0)])
    };
    let heads: Vec<(u16, bool)> = (10..16).map(|id| post(&mut drv, id)).collect();
    let n = b.got.len();
    assert_eq!(b.rxq.rx_burst(&mut b.got, 2), 2);
    drv.assert_avail(&g, heads[0], "a full burst of 2 slots: held");
    assert_eq!(b.rxq.rx_burst(&mut b.got, 2), 2);
    drv.assert_used(&g, heads[0], 13, 0, "4 slots: half the ring, handed back");
    drv.assert_avail(&g, heads[2], "one used descriptor for the run");
    assert_eq!(b.rxq.rx_burst(&mut b.got, 2), 2);
    drv.assert_avail(&g, heads[4], "held again");
    assert_eq!(b.rxq.rx_burst(&mut b.got, 2), 0, "the ring is dry");
    drv.assert_used(&g, heads[4], 15, 0, "a dry ring: handed back");
    let frames: Vec<Vec<u8>> = b.got[n..].iter().map(|m| m.to_vec()).collect();
    let want: Vec<Vec<u8>> = (10..16u8).map(|id| vec![id; 60]).collect();
    assert_eq!(frames, want, "every frame, in order");

    // Slots 7 and 0 (lap 2): held, then the ring stops.
    let h7 = post(&mut drv, 16);
    post(&mut drv, 17);
    assert_eq!(b.rxq.rx_burst(&mut b.got, 2), 2);
    drv.assert_avail(&g, h7, "held at the stop");
    assert_eq!(
        f.get_vring_base(1).unwrap() & 0xffff,
        0x0001,
        "slot 1 of lap 2"
    );
    drv.assert_used(&g, h7, 17, 0, "a stopped ring: handed back");
    assert_eq!(b.tp.port.bad_chains(), 0);
    assert_eq!(b.tp.port.broken_rings(), 0);
    b.hang_up_and_serve_the_next(f, "after a held run");
}

/// By default (`rx-hold=0`, as DPDK): a full in-order burst hands its chains back at once.
#[test]
fn by_default_a_full_in_order_burst_hands_its_run_back_at_once() {
    let mut b = Bench::new("hostile-packed-nohold", Duration::from_secs(5));
    let g = Guest::new();
    let (f, mut drv) = packed_tx(&mut b, &g, IN_ORDER);
    let heads: Vec<(u16, bool)> = (10..13u16)
        .map(|id| {
            let (a, l) = g.frame(u64::from(id), 60, id as u8);
            drv.post(&g, id, &[(a, l, 0)])
        })
        .collect();
    assert_eq!(b.rxq.rx_burst(&mut b.got, 2), 2);
    drv.assert_used(&g, heads[0], 11, 0, "a full burst, handed back");
    drv.assert_avail(&g, heads[2], "not taken yet");
    b.hang_up_and_serve_the_next(f, "without rx-hold");
}

// ---- memory slots (ADD_MEM_REG / REM_MEM_REG) with traffic running ----

/// A region for ADD_MEM_REG / REM_MEM_REG: `size` bytes of `fd` at guest address `gpa`.
fn slot_region(gpa: u64, size: u64, fd: &std::fs::File) -> vhost::VhostUserMemoryRegionInfo {
    vhost::VhostUserMemoryRegionInfo {
        guest_phys_addr: gpa,
        memory_size: size,
        userspace_addr: UVA + 0x1000_0000 + gpa,
        mmap_offset: 0,
        mmap_handle: fd.as_raw_fd(),
    }
}

/// A frontend with REPLY_ACK and CONFIGURE_MEM_SLOTS on the guest's tx virtqueue (every
/// request waits for our answer), its first frame through.
fn mem_slots_frontend(b: &mut Bench, g: &Guest) -> vhost::vhost_user::Frontend {
    let s = Setup {
        reply_ack: true,
        features: 0,
        vqs: vec![TXQ],
        base: 0,
    };
    let slots = vhost::vhost_user::message::VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS;
    let f = connect_with(&b.tp.path, g, &b.kick, &s, slots);
    let (a, l) = g.frame(0, 60, 0x10);
    g.desc(0, d(a, l, 0, 0));
    g.offer(0, 0);
    let n = b.got.len();
    poll(&mut *b.rxq, &mut b.got, "the first frame", |v| {
        v.len() == n + 1
    });
    f
}

/// Memory regions added and removed while a ring runs: (a) a frame whose buffer lives in an
/// added region arrives whole (also one whose header and frame are in different regions);
/// (b) once that region is removed (and its file truncated, so a read would fault) a chain
/// pointing into it is refused, counted and handed back unused, and frames in the remaining
/// region go on; (c) removing the region that holds the ring is acknowledged (the spec says
/// the backend must unmap it, and QEMU sends REM_MEM_REG then ADD_MEM_REG when a region
/// changes, rings running): the ring stops, link down, the guest's chain untouched, until
/// the region comes back, when the ring goes on where it stopped. REM_MEM_REG of a region that
/// does not exist is refused with a reason (the connection closed), and so is ADD_MEM_REG past
/// the slots GET_MAX_MEM_SLOTS announced; the next frontend is served.
#[test]
fn memory_regions_added_and_removed_while_frames_move() {
    let mut b = Bench::new("hostile-memslots", Duration::from_secs(5));
    let g = Guest::new();
    let mut f = mem_slots_frontend(&mut b, &g);
    assert_eq!(f.get_max_mem_slots().unwrap(), 32);
    let mut idx = 1u16;
    let mut frames = b.got.len();

    // (a) A region added while the ring runs: frames in it arrive.
    // A plain file (a memfd is sealed against shrinking), unlinked at once.
    let fd2 = memnic_test_support::unlinked_file(&std::env::temp_dir(), "memslots", 0x10000);
    let r2 = Region::from_fd(fd2.try_clone().unwrap().into(), 0x10000).unwrap();
    const GPA2: u64 = 0x20_0000;
    let reg2 = slot_region(GPA2, 0x10000, &fd2);
    f.add_mem_region(&reg2).unwrap();
    assert!(b.tp.port.link().up);
    let mut bytes = vec![0u8; HDR + 100];
    bytes[HDR..].fill(0x21);
    r2.write_bytes(0x100, &bytes).unwrap();
    g.desc(1, d(GPA2 + 0x100, bytes.len() as u32, 0, 0));
    g.offer(idx, 1);
    idx += 1;
    assert_eq!(
        b.rxq.rx_burst(&mut b.got, 32),
        1,
        "a frame in the new region"
    );
    assert_eq!(b.got[frames].to_vec(), vec![0x21; 100]);
    frames += 1;
    // Header in the first region, frame in the new one.
    g.mem.write_bytes(BUF as usize, &[0; HDR]).unwrap();
    g.desc(2, d(BUF, HDR as u32, DESC_F_NEXT, 3));
    g.desc(3, d(GPA2 + 0x100 + HDR as u64, 100, 0, 0));
    g.offer(idx, 2);
    idx += 1;
    assert_eq!(b.rxq.rx_burst(&mut b.got, 32), 1, "a frame across regions");
    assert_eq!(b.got[frames].to_vec(), vec![0x21; 100]);
    frames += 1;

    // (b) The region removed: a chain into it is refused, never read (the file is cut to
    // nothing, so a read through a mapping left behind would fault).
    f.remove_mem_region(&reg2).unwrap();
    fd2.set_len(0).unwrap();
    g.offer(idx, 1);
    assert_eq!(
        b.rxq.rx_burst(&mut b.got, 32),
        0,
        "a chain into the removed region"
    );
    assert_eq!(b.tp.port.bad_chains(), 1);
    assert_eq!(
        b.tp.port.last_bad_chain(),
        Some(ChainError::Unmapped {
            addr: GPA2 + 0x100,
            len: bytes.len() as u32
        })
    );
    assert_eq!(g.used_idx(), idx + 1, "handed back");
    assert_eq!(g.used_elem_in(TXQ, idx), (1, 0), "unused");
    idx += 1;
    let (a, l) = g.frame(4, 60, 0x22);
    g.desc(4, d(a, l, 0, 0));
    g.offer(idx, 4);
    idx += 1;
    assert_eq!(
        b.rxq.rx_burst(&mut b.got, 32),
        1,
        "frames in region 1 go on"
    );
    assert_eq!(b.got[frames].to_vec(), vec![0x22; 60]);
    frames += 1;

    // (c) The region that holds the ring removed: acknowledged; the ring stops.
    let reg1 = g.region();
    f.remove_mem_region(&reg1)
        .expect("REM_MEM_REG of the ring's region is acknowledged");
    assert!(!b.tp.port.link().up, "no ring runs: link down");
    let (a, l) = g.frame(5, 60, 0x23);
    g.desc(5, d(a, l, 0, 0));
    g.offer(idx, 5);
    for _ in 0..10 {
        assert_eq!(b.rxq.rx_burst(&mut b.got, 32), 0, "the ring is stopped");
    }
    assert_eq!(g.used_idx(), idx, "the chain is left to the guest");
    assert_eq!(b.tp.port.bad_chains(), 1);
    assert_eq!(b.tp.port.broken_rings(), 0);
    // The region comes back: the ring goes on where it stopped.
    f.add_mem_region(&reg1).unwrap();
    assert!(b.tp.port.link().up);
    assert_eq!(b.rxq.rx_burst(&mut b.got, 32), 1, "the waiting frame");
    assert_eq!(b.got[frames].to_vec(), vec![0x23; 60]);
    idx += 1;
    assert_eq!(g.used_idx(), idx);
    assert_eq!(f.get_vring_base(1).unwrap(), idx as u32);

    // REM_MEM_REG of a region that is not there (any more): refused with a reason.
    assert!(f.remove_mem_region(&reg2).is_err());
    b.lost += 1;
    let why = b.tp.wait_disconnects(b.lost);
    assert!(
        why.contains("no memory region at guest address 0x200000"),
        "{why}"
    );
    b.next_is_served("after REM_MEM_REG of a missing region");

    // ADD_MEM_REG past the slots announced, frames moving between the adds.
    let g = Guest::new();
    let mut f = mem_slots_frontend(&mut b, &g);
    let max = f.get_max_mem_slots().unwrap();
    let small = Region::memfd("hostile-memslots-s", 4096, false).unwrap();
    let fds = std::fs::File::from(small.fd().unwrap().try_clone_to_owned().unwrap());
    for i in 1..max {
        f.add_mem_region(&slot_region(GPA2 + i * 0x10000, 4096, &fds))
            .unwrap_or_else(|e| panic!("region {i} of {max}: {e}"));
        // Avail entry i (the first frame was entry 0), descriptor i mod Q.
        let (a, l) = g.frame(i % 8, 60, i as u8);
        g.desc(i as u16 % Q, d(a, l, 0, 0));
        g.offer(i as u16, i as u16 % Q);
        let n = b.got.len();
        assert_eq!(
            b.rxq.rx_burst(&mut b.got, 32),
            1,
            "a frame after region {i}"
        );
        assert_eq!(b.got[n].to_vec(), vec![i as u8; 60]);
    }
    assert!(f
        .add_mem_region(&slot_region(GPA2 + max * 0x10000, 4096, &fds))
        .is_err());
    b.lost += 1;
    let why = b.tp.wait_disconnects(b.lost);
    assert!(why.contains("more than the 32 supported"), "{why}");
    b.next_is_served("after ADD_MEM_REG past the slots");
}

/// Both rings wait for their memory after REM_MEM_REG of the region that holds them; the
/// frontend then stops them one by one (as QEMU does after removing memory): each
/// GET_VRING_BASE is answered with where its ring stopped, though the other ring still cannot
/// be set up, and the connection stays. (It was closed: any ring that could not be set up
/// refused every request.)
#[test]
fn rings_waiting_for_their_memory_do_not_refuse_requests_about_other_rings() {
    let mut b = Bench::new("hostile-wait", Duration::from_secs(5));
    let g = Guest::new();
    let s = Setup {
        reply_ack: true,
        features: 0,
        vqs: vec![TXQ, RXQ],
        base: 0,
    };
    let slots = vhost::vhost_user::message::VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS;
    let mut f = connect_with(&b.tp.path, &g, &b.kick, &s, slots);
    let (a, l) = g.frame(0, 60, 0x31);
    g.desc(0, d(a, l, 0, 0));
    g.offer(0, 0);
    poll(&mut *b.rxq, &mut b.got, "a frame", |v| v.len() == 1);
    let reg = g.region();
    f.remove_mem_region(&reg)
        .expect("acknowledged: the rings wait");
    assert_eq!(f.get_vring_base(1).expect("ring 1 stops"), 1);
    assert_eq!(f.get_vring_base(0).expect("ring 0 stops"), 0);
    assert_eq!(b.tp.port.disconnects(), 0, "the connection stays");
    b.hang_up_and_serve_the_next(f, "after the rings stopped");
}
