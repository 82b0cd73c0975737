//! Configurations that cannot work are refused when the port is built, with one sentence,
//! instead of failing later (or, for a secret, failing open).

use memnic_ethdev::{Devargs, Port};
use memnic_memif::port::{open, DEVARGS_KEYS};
use memnic_memif::{MemifConfig, MemifPort, Role};
use memnic_pktbuf::{Mempool, PoolConfig};

fn sock(tag: &str) -> String {
    format!("/tmp/memif-startup-{tag}-{}.sock", std::process::id())
}

fn with_secret(role: Role, sock: &str, secret: &str) -> MemifConfig {
    MemifConfig {
        secret: Some(secret.to_string()),
        ..MemifConfig::new(role, sock)
    }
}

#[test]
fn an_unusable_secret_is_a_start_up_error() {
    let s = sock("secret");
    for role in [Role::Server, Role::Client] {
        for (secret, says) in [
            ("x".repeat(24), "24 bytes"),
            ("a\0b".to_string(), "NUL"),
            (String::new(), "empty memif secret"),
        ] {
            let e = MemifPort::new("p", with_secret(role, &s, &secret))
                .err()
                .unwrap_or_else(|| panic!("{role:?}: secret {secret:?} was taken"));
            let e = e.to_string();
            assert!(e.contains(says), "{role:?}, {secret:?}: {e}");
            assert!(
                !e.contains(&secret) || secret.is_empty(),
                "{e} shows the secret"
            );
        }
    }
    // The longest that fits is fine (a server binds its socket).
    let ok = MemifPort::new("p", with_secret(Role::Server, &s, &"y".repeat(23)));
    assert!(ok.is_ok(), "{:?}", ok.err());
    drop(ok);
    let _ = std::fs::remove_file(&s);
    // The same through devargs, as a user gives it.
    let a = Devargs::parse(
        &format!("memif0,role=server,socket={s},secret={}", "z".repeat(30)),
        DEVARGS_KEYS,
    )
    .unwrap();
    let e = open(&a).err().expect("a 30-byte secret was taken");
    assert!(e.to_string().contains("30 bytes"), "{e}");
    let a = Devargs::parse(
        &format!("memif0,role=client,socket={s},secret="),
        DEVARGS_KEYS,
    )
    .unwrap();
    let e = open(&a).err().expect("an empty secret was taken");
    assert!(e.to_string().contains("empty memif secret"), "{e}");
}

/// rsize 14 and bsize 65536: one queue pair needs a region 0 of 2 GiB and some; two would pass
/// the 4 GiB that memif's 32-bit descriptor offsets reach, and are refused when the second pair
/// is set up, not at connect time.
#[test]
fn a_client_whose_region_0_would_pass_4_gib_is_refused_at_start_up() {
    let mut c = MemifConfig::new(Role::Client, sock("4gib"));
    c.log2_ring_size = 14;
    c.bsize = 65_536;
    let mut port = MemifPort::new("c", c).unwrap();
    let mut pc = PoolConfig::new("g", 64);
    pc.huge = false;
    let pool = Mempool::new(&pc).unwrap();
    let _pair0 = (
        port.take_rx_queue(0, &pool).unwrap(),
        port.take_tx_queue(0, &pool).unwrap(),
    );
    let e = port
        .take_rx_queue(1, &pool)
        .err()
        .expect("a second queue pair was taken");
    let e = e.to_string();
    assert!(e.contains("4 GiB") && e.contains("region 0"), "{e}");
    // The refused queue was not taken: a port with one pair still lays out.
    assert!(port.take_tx_queue(1, &pool).is_err());
    // And a configuration that cannot fit even one pair is refused when built.
    let mut c = MemifConfig::new(Role::Client, sock("4gib"));
    c.bsize = u32::MAX;
    let e = MemifPort::new("c", c)
        .err()
        .expect("a 4 GiB buffer was taken");
    assert!(e.to_string().contains("4 GiB"), "{e}");
}
