//! Configurations that cannot work are refused when the port is built, with one sentence,
//! instead of failing later (or, for a secret, failing open).

use memnic_ethdev::Devargs;
use memnic_memif::port::{open, DEVARGS_KEYS};
use memnic_memif::{MemifConfig, MemifPort, Role};

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
