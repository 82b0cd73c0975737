//! Static builds of this workspace's programs for a guest's initramfs, which has no C library:
//! the host's gnu target with `-C target-feature=+crt-static` (glibc's static libraries come with
//! libc6-dev; no musl target is needed), in a target directory of their own so the normal build
//! is not invalidated. `cargo build` runs each time: cargo rebuilds what changed and does
//! nothing when the binary is up to date.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{err, run, target_dir, GuestError};

/// The target the static binaries are built for (the host's).
pub const STATIC_TARGET: &str = "x86_64-unknown-linux-gnu";

/// Where the static builds go: `guest-static/` in the workspace's target directory.
pub fn static_target_dir() -> PathBuf {
    target_dir().join("guest-static")
}

/// Builds program `bin` of workspace package `package` as a static executable and returns its
/// path, after checking that it asks for no program interpreter ([`is_static`]).
///
/// The dev profile, without debug information and stripped (a smaller initramfs to pack and
/// unpack) and without incremental state (a build made once); its opt-levels are the
/// workspace's. The first build compiles every dependency once
/// more (about half a minute here); later ones are cargo's no-op check.
pub fn static_binary(package: &str, bin: &str) -> Result<PathBuf, GuestError> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    // RUSTFLAGS reach only the target's crates (with --target, build scripts and proc macros
    // are built without them, as they must be: those are loaded by the compiler). Flags the
    // caller's environment sets are kept; the encoded form would override RUSTFLAGS.
    let mut flags = std::env::var("RUSTFLAGS").unwrap_or_default();
    flags.push_str(" -C target-feature=+crt-static");
    let dir = static_target_dir();
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&workspace)
        .args([
            "build",
            "-q",
            "-p",
            package,
            "--bin",
            bin,
            "--target",
            STATIC_TARGET,
        ])
        .arg("--target-dir")
        .arg(&dir)
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env("RUSTFLAGS", flags.trim())
        .env("CARGO_INCREMENTAL", "0")
        .env("CARGO_PROFILE_DEV_DEBUG", "0")
        .env("CARGO_PROFILE_DEV_STRIP", "symbols");
    run(cmd, &format!("cargo build (static {bin} for the guest)"))?;
    let path = dir.join(STATIC_TARGET).join("debug").join(bin);
    if !is_static(&path)? {
        return Err(err(format!(
            "{} is not a static executable (it names a program interpreter): is libc6-dev \
             (glibc's static libraries) installed?",
            path.display()
        )));
    }
    Ok(path)
}

/// Whether the ELF executable at `path` runs without a dynamic loader: it has no `PT_INTERP`
/// program header (a static-pie still has `PT_DYNAMIC`, for relocating itself).
pub fn is_static(path: &Path) -> Result<bool, GuestError> {
    const PT_INTERP: u32 = 3;
    let elf =
        std::fs::read(path).map_err(|e| err(format!("cannot read {}: {e}", path.display())))?;
    let bad = || {
        err(format!(
            "{} is not a 64-bit little-endian ELF file",
            path.display()
        ))
    };
    // e_ident: magic, ELFCLASS64 (2), ELFDATA2LSB (1).
    if elf.get(..6) != Some(b"\x7fELF\x02\x01".as_slice()) {
        return Err(bad());
    }
    let u16_at = |o: usize| {
        elf.get(o..o + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
    };
    let u64_at = |o: usize| {
        elf.get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    };
    let phoff = u64_at(0x20)
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(bad)?;
    let (phentsize, phnum) = (u16_at(0x36).ok_or_else(bad)?, u16_at(0x38).ok_or_else(bad)?);
    for i in 0..phnum {
        let at = phoff
            .checked_add(i.checked_mul(phentsize).ok_or_else(bad)?)
            .ok_or_else(bad)?;
        let p_type = elf
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or_else(bad)?;
        if p_type == PT_INTERP {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 64-bit ELF header with program headers of `types` (56 bytes each, after the header).
    fn elf(types: &[u32]) -> Vec<u8> {
        let mut f = vec![0u8; 64 + 56 * types.len()];
        f[..6].copy_from_slice(b"\x7fELF\x02\x01");
        f[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        f[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        f[0x38..0x3a].copy_from_slice(&(types.len() as u16).to_le_bytes());
        for (i, t) in types.iter().enumerate() {
            f[64 + 56 * i..68 + 56 * i].copy_from_slice(&t.to_le_bytes());
        }
        f
    }

    fn check(name: &str, bytes: &[u8]) -> Result<bool, GuestError> {
        let p = std::env::temp_dir().join(format!("static-bin-{name}-{}", std::process::id()));
        std::fs::write(&p, bytes).unwrap();
        let r = is_static(&p);
        let _ = std::fs::remove_file(&p);
        r
    }

    #[test]
    fn an_executable_with_an_interpreter_is_not_static() {
        // PT_LOAD, PT_DYNAMIC: a static-pie; PT_PHDR, PT_INTERP, ...: a dynamic executable.
        assert!(check("static-pie", &elf(&[1, 1, 2])).unwrap());
        assert!(!check("dynamic", &elf(&[6, 3, 1, 2])).unwrap());
        // This test program is linked dynamically.
        assert!(!is_static(&std::env::current_exe().unwrap()).unwrap());
    }

    #[test]
    fn garbage_and_cut_short_program_headers_are_errors() {
        assert!(check("text", b"#!/bin/sh\n").is_err());
        let mut cut = elf(&[1, 3]);
        cut.truncate(64 + 56 + 2);
        assert!(check("cut", &cut).is_err());
    }
}
