//! A real Linux guest in QEMU for tests (`shared/peers/qemu.md`): Debian's cloud kernel, an
//! initramfs of busybox-static, the virtio-net modules and the test's own `/init`, and
//! `qemu-system-x86_64 -accel tcg` pinned to one CPU with its serial console on stdout, so a
//! test waits for the marker lines its `/init` prints ([`Child::wait_for_line`]).
//!
//! ```no_run
//! use memnic_test_support::guest::{self, Image, Qemu};
//! let kernel = guest::kernel().unwrap_or_else(|e| panic!("{e}"));
//! let init = guest::init_script("load_modules\nresult \"GUEST-RESULT ok\"\n");
//! let image = Image::new(&kernel, &init).build("demo").unwrap_or_else(|e| panic!("{e}"));
//! let mut vm = Qemu::new(&kernel, &image).cpu(1).spawn();
//! vm.wait_for_line("GUEST-RESULT", std::time::Duration::from_secs(60));
//! ```
//!
//! The kernel comes from the package `linux-image-cloud-amd64` (the package it depends on,
//! fetched with `apt-get download` and unpacked with `dpkg-deb -x` into `target/guest/`, once;
//! nothing goes into /boot). Everything else a test needs goes in through [`Image::file`] (a
//! static build of one of our programs: [`static_binary`]) and [`Qemu::arg`] (or
//! [`Qemu::ivshmem`] for a shared-memory PCI device).

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{Child, Stdin};

mod static_bin;
pub use static_bin::{is_static, static_binary, static_target_dir, STATIC_TARGET};

/// The meta package whose dependency names the current cloud kernel.
pub const KERNEL_META: &str = "linux-image-cloud-amd64";

/// The modules a virtio-net guest loads, in load order (each after what it needs).
pub const VIRTIO_NET_MODULES: [&str; 8] = [
    "virtio_ring",
    "virtio",
    "virtio_pci_modern_dev",
    "virtio_pci_legacy_dev",
    "virtio_pci",
    "failover",
    "net_failover",
    "virtio_net",
];

/// The busybox the initramfs runs (package busybox-static: one static binary).
pub const BUSYBOX: &str = "/bin/busybox";

/// Why a guest could not be prepared: one sentence that says what to do.
#[derive(Debug)]
pub struct GuestError(String);

impl fmt::Display for GuestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for GuestError {}

fn err(msg: String) -> GuestError {
    GuestError(msg)
}

/// Runs `cmd` to completion; its output, or a sentence naming it and what it said.
fn run(mut cmd: Command, what: &str) -> Result<Vec<u8>, GuestError> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| err(format!("cannot run {what} ({e}): is it installed?")))?;
    if !out.status.success() {
        return Err(err(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(out.stdout)
}

/// The workspace's target directory: `$CARGO_TARGET_DIR`, else `target/`.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"))
}

/// Where prepared kernels and images live: `$MEMNIC_GUEST_DIR`, else `guest/` in the
/// workspace's target directory.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("MEMNIC_GUEST_DIR") {
        return PathBuf::from(d);
    }
    target_dir().join("guest")
}

/// An unpacked guest kernel: its image and its module tree (with `modules.dep`).
#[derive(Clone, Debug)]
pub struct Kernel {
    pub version: String,
    pub vmlinuz: PathBuf,
    /// `lib/modules/VERSION`.
    pub modules: PathBuf,
}

impl Kernel {
    /// The path of module `name` (as `lsmod` spells it) in the module tree, from `modules.dep`.
    pub fn module(&self, name: &str) -> Result<PathBuf, GuestError> {
        let dep = self.modules.join("modules.dep");
        let text = std::fs::read_to_string(&dep)
            .map_err(|e| err(format!("cannot read {}: {e}", dep.display())))?;
        text.lines()
            .filter_map(|l| l.split_once(':').map(|(path, _)| path))
            .find(|path| {
                let file = path.rsplit('/').next().unwrap_or(path);
                let stem = file.split(".ko").next().unwrap_or(file);
                stem.replace('-', "_") == name
            })
            .map(|p| self.modules.join(p))
            .ok_or_else(|| {
                err(format!(
                    "kernel {} has no module {name} in {}",
                    self.version,
                    dep.display()
                ))
            })
    }

    /// The version of the kernel image in `dir/boot`, if there is one.
    fn in_dir_version(dir: &Path) -> Option<String> {
        std::fs::read_dir(dir.join("boot"))
            .ok()?
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .find_map(|n| n.strip_prefix("vmlinuz-").map(str::to_string))
    }

    /// The kernel unpacked in `dir` (a `dpkg-deb -x` tree), if it holds one.
    fn in_dir(dir: &Path) -> Option<Kernel> {
        let boot = std::fs::read_dir(dir.join("boot")).ok()?;
        let vmlinuz = boot.filter_map(|e| e.ok()).map(|e| e.path()).find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        })?;
        let version = vmlinuz.file_name()?.to_str()?["vmlinuz-".len()..].to_string();
        let modules = dir.join("lib/modules").join(&version);
        modules.join("modules.dep").exists().then_some(Kernel {
            version,
            vmlinuz,
            modules,
        })
    }
}

/// The kernel package [`KERNEL_META`] depends on now (`apt-cache depends`).
fn kernel_package() -> Result<String, GuestError> {
    let mut cmd = Command::new("apt-cache");
    cmd.args(["depends", KERNEL_META]);
    let out = run(cmd, &format!("apt-cache depends {KERNEL_META}"))?;
    String::from_utf8_lossy(&out)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends:"))
        .map(|p| p.trim().to_string())
        .find(|p| p.starts_with("linux-image-"))
        .ok_or_else(|| {
            err(format!(
                "apt-cache names no linux-image package for {KERNEL_META}: run apt-get update, \
                 or unpack a cloud kernel .deb with dpkg-deb -x into {}/kernel-NAME",
                cache_dir().display()
            ))
        })
}

/// The guest kernel, fetched and unpacked into [`cache_dir`] the first time (`apt-get
/// download` of the package [`KERNEL_META`] depends on, `dpkg-deb -x`, `busybox depmod`). A
/// kernel already unpacked there is used as it is, so later runs need no package sources.
pub fn kernel() -> Result<Kernel, GuestError> {
    let cache = cache_dir();
    std::fs::create_dir_all(&cache)
        .map_err(|e| err(format!("cannot create {}: {e}", cache.display())))?;
    // One test process unpacks; parallel ones wait for it here.
    let lock_path = cache.join("kernel.lock");
    let lock = std::fs::File::create(&lock_path)
        .map_err(|e| err(format!("cannot create {}: {e}", lock_path.display())))?;
    lock.lock()
        .map_err(|e| err(format!("cannot lock {}: {e}", lock_path.display())))?;
    if let Some(k) = cached_kernel(&cache) {
        return Ok(k);
    }
    let package = kernel_package()?;
    let dir = cache.join(format!("kernel-{package}"));
    let work = cache.join(format!("download-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(work.join("root"))
        .map_err(|e| err(format!("cannot create {}: {e}", work.display())))?;
    let mut cmd = Command::new("apt-get");
    cmd.args(["download", &package]).current_dir(&work);
    run(cmd, &format!("apt-get download {package}")).map_err(|e| {
        err(format!(
            "cannot fetch the guest kernel ({e}); run `apt-get download {package}` where the \
             package sources can be reached and unpack it with `dpkg-deb -x` into {}",
            dir.display()
        ))
    })?;
    let deb = std::fs::read_dir(&work)
        .map_err(|e| err(format!("cannot list {}: {e}", work.display())))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or_else(|| err(format!("apt-get download {package} left no .deb")))?;
    let mut cmd = Command::new("dpkg-deb");
    cmd.arg("-x").arg(&deb).arg(work.join("root"));
    run(cmd, "dpkg-deb -x")?;
    // The package has no modules.dep (its postinst runs depmod) and the host may have no kmod.
    let version = Kernel::in_dir_version(&work.join("root"))
        .ok_or_else(|| err(format!("{} holds no boot/vmlinuz-*", deb.display())))?;
    let mut cmd = Command::new(BUSYBOX);
    cmd.args(["depmod", "-b"])
        .arg(work.join("root"))
        .arg(&version);
    run(cmd, "busybox depmod (package busybox-static)")?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(work.join("root"), &dir)
        .map_err(|e| err(format!("cannot move the kernel to {}: {e}", dir.display())))?;
    let _ = std::fs::remove_dir_all(&work);
    Kernel::in_dir(&dir).ok_or_else(|| err(format!("{} holds no usable kernel", dir.display())))
}

/// The newest kernel already unpacked in `cache` (`kernel-*` directories).
fn cached_kernel(cache: &Path) -> Option<Kernel> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(cache)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("kernel-"))
        })
        .collect();
    dirs.sort();
    dirs.iter().rev().find_map(|d| Kernel::in_dir(d))
}

/// Shell functions every `/init` made by [`init_script`] has:
///
/// * `load_modules`: insmod every module of the image, in [`Image::modules`] order;
/// * `result LINE`: print LINE on the console (the test waits for it), then power off;
/// * `restart LINE`: the same, then reboot (`reboot -f`): with [`Qemu::allow_reboot`] the
///   machine resets and boots the same kernel and initramfs again, else QEMU exits;
/// * `ask LINE`: print LINE, then read the test's one-line answer from the console into
///   `$ANSWER` (the test sends it with [`Child::send`](crate::Child::send) to a guest started
///   with [`Qemu::console_input`]); no answer within 60 s is a `result "GUEST-ERROR ..."`.
///
/// Before the caller's script runs, /proc, /sys and /dev are mounted (with a tmpfs on
/// /dev/shm, for POSIX shared memory), busybox's applets are on PATH, and the kernel's
/// messages stay off the console (`dmesg -n 1`).
pub const PRELUDE: &str = r#"/bin/busybox mkdir -p /proc /sys /dev /tmp /sbin /usr/bin /usr/sbin
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sys /sys
/bin/busybox mount -t devtmpfs dev /dev
/bin/busybox mkdir -p /dev/shm
/bin/busybox mount -t tmpfs shm /dev/shm
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
dmesg -n 1
load_modules() {
    for m in $(cat /modules); do insmod "/lib/modules/$m.ko" || echo "GUEST-ERROR insmod $m"; done
}
result() {
    sync
    echo "$*"
    poweroff -f
}
restart() {
    sync
    echo "$*"
    reboot -f
}
ask() {
    echo "$*"
    read -t 60 -r ANSWER || result "GUEST-ERROR no answer on the console within 60 s"
}
"#;

/// A `/init` for [`Image`]: the busybox shebang the kernel needs, [`PRELUDE`], then `body`.
pub fn init_script(body: &str) -> String {
    format!("#!/bin/busybox sh\n{PRELUDE}{body}\n")
}

/// What goes into a guest's initramfs.
pub struct Image<'a> {
    kernel: &'a Kernel,
    init: String,
    modules: Vec<String>,
    files: Vec<(String, Vec<u8>, u32)>,
}

impl<'a> Image<'a> {
    /// busybox-static, the [`VIRTIO_NET_MODULES`] and `init` (its first line must be
    /// `#!/bin/busybox sh`: see [`init_script`]).
    pub fn new(kernel: &'a Kernel, init: &str) -> Image<'a> {
        Image {
            kernel,
            init: init.to_string(),
            modules: VIRTIO_NET_MODULES.iter().map(|m| m.to_string()).collect(),
            files: Vec::new(),
        }
    }

    /// The modules to ship (and `load_modules` to load), in load order, instead of the
    /// virtio-net set.
    pub fn modules(mut self, names: &[&str]) -> Self {
        self.modules = names.iter().map(|m| m.to_string()).collect();
        self
    }

    /// One more file at `path` (absolute, inside the guest) with `mode` (0o755 for a program:
    /// a static binary runs as it is).
    pub fn file(mut self, path: &str, contents: &[u8], mode: u32) -> Self {
        self.files.push((
            path.trim_start_matches('/').to_string(),
            contents.to_vec(),
            mode,
        ));
        self
    }

    /// Writes `NAME.cpio.gz` (newc, gzip) into [`cache_dir`] and returns its path.
    pub fn build(&self, name: &str) -> Result<PathBuf, GuestError> {
        let cache = cache_dir();
        let stage = cache.join(format!("stage-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&stage);
        let res = self.build_in(&stage, &cache.join(format!("{name}.cpio.gz")));
        let _ = std::fs::remove_dir_all(&stage);
        res
    }

    fn build_in(&self, stage: &Path, out: &Path) -> Result<PathBuf, GuestError> {
        let put = |rel: &str, data: &[u8], mode: u32| -> Result<(), GuestError> {
            use std::os::unix::fs::PermissionsExt;
            let p = stage.join(rel);
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| err(format!("cannot create {}: {e}", parent.display())))?;
            }
            std::fs::write(&p, data)
                .map_err(|e| err(format!("cannot write {}: {e}", p.display())))?;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))
                .map_err(|e| err(format!("cannot chmod {}: {e}", p.display())))
        };
        if !self.init.starts_with("#!/bin/busybox sh\n") {
            return Err(err(
                "the guest's /init must start with `#!/bin/busybox sh` (the kernel cannot run \
                 it otherwise): make it with guest::init_script"
                    .into(),
            ));
        }
        let busybox = std::fs::read(BUSYBOX).map_err(|e| {
            err(format!(
                "cannot read {BUSYBOX} ({e}): apt-get install busybox-static"
            ))
        })?;
        put("bin/busybox", &busybox, 0o755)?;
        put("init", self.init.as_bytes(), 0o755)?;
        for m in &self.modules {
            let src = self.kernel.module(m)?;
            let data = std::fs::read(&src)
                .map_err(|e| err(format!("cannot read {}: {e}", src.display())))?;
            put(&format!("lib/modules/{m}.ko"), &data, 0o644)?;
        }
        put(
            "modules",
            (self.modules.join("\n") + "\n").as_bytes(),
            0o644,
        )?;
        for (path, data, mode) in &self.files {
            put(path, data, *mode)?;
        }
        // busybox cpio reads the names from stdin, as cpio does.
        let list = run(
            {
                let mut c = Command::new(BUSYBOX);
                c.args(["find", "."]).current_dir(stage);
                c
            },
            "busybox find",
        )?;
        let mut cpio = Command::new(BUSYBOX)
            .args(["cpio", "-o", "-H", "newc"])
            .current_dir(stage)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| err(format!("cannot run busybox cpio: {e}")))?;
        let mut stdin = cpio.stdin.take().expect("piped stdin");
        let feeder = std::thread::spawn(move || stdin.write_all(&list));
        let archive = cpio
            .wait_with_output()
            .map_err(|e| err(format!("busybox cpio failed: {e}")))?;
        let _ = feeder.join();
        if !archive.status.success() || archive.stdout.is_empty() {
            return Err(err(format!("busybox cpio failed ({})", archive.status)));
        }
        let tmp = out.with_extension(format!("tmp{}", std::process::id()));
        let file = std::fs::File::create(&tmp)
            .map_err(|e| err(format!("cannot create {}: {e}", tmp.display())))?;
        let mut gzip = Command::new("gzip")
            .arg("-1")
            .stdin(Stdio::piped())
            .stdout(file)
            .spawn()
            .map_err(|e| err(format!("cannot run gzip: {e}")))?;
        gzip.stdin
            .take()
            .expect("piped stdin")
            .write_all(&archive.stdout)
            .map_err(|e| err(format!("gzip: {e}")))?;
        let st = gzip.wait().map_err(|e| err(format!("gzip: {e}")))?;
        if !st.success() {
            return Err(err(format!("gzip failed ({st})")));
        }
        std::fs::rename(&tmp, out)
            .map_err(|e| err(format!("cannot move {}: {e}", tmp.display())))?;
        Ok(out.to_path_buf())
    }
}

/// A `qemu-system-x86_64 -accel tcg` command line (QEMU 7.2 here: see `shared/peers/qemu.md`).
pub struct Qemu {
    kernel: PathBuf,
    initrd: PathBuf,
    memory_mb: u32,
    shared_memory: bool,
    cpu: Option<u32>,
    append: String,
    reboot: bool,
    console_input: bool,
    args: Vec<String>,
}

impl Qemu {
    /// 256 MiB of guest memory on a shared memfd (a vhost-user backend maps it), no reboot
    /// (the guest's poweroff, panic or reboot ends QEMU), the console on stdout.
    pub fn new(kernel: &Kernel, initrd: &Path) -> Qemu {
        Qemu {
            kernel: kernel.vmlinuz.clone(),
            initrd: initrd.to_path_buf(),
            memory_mb: 256,
            shared_memory: true,
            cpu: None,
            append: String::new(),
            reboot: false,
            console_input: false,
            args: Vec::new(),
        }
    }

    pub fn memory_mb(mut self, mb: u32) -> Self {
        self.memory_mb = mb;
        self
    }

    /// Private guest memory instead of the shared memfd.
    pub fn private_memory(mut self) -> Self {
        self.shared_memory = false;
        self
    }

    /// Runs QEMU under `taskset -c CPU`.
    pub fn cpu(mut self, cpu: u32) -> Self {
        self.cpu = Some(cpu);
        self
    }

    /// More kernel command line (`memnic.x=y`, read back from /proc/cmdline by `/init`).
    pub fn append(mut self, extra: &str) -> Self {
        self.append.push(' ');
        self.append.push_str(extra);
        self
    }

    /// A guest reboot restarts the guest (no `-no-reboot`); a poweroff still ends QEMU.
    pub fn allow_reboot(mut self) -> Self {
        self.reboot = true;
        self
    }

    /// The console's input is a pipe the test writes lines to ([`Child::send`](crate::Child::send):
    /// the answers to `/init`'s `ask`), instead of /dev/null.
    pub fn console_input(mut self) -> Self {
        self.console_input = true;
        self
    }

    /// Any more QEMU arguments (`-device ivshmem-plain,...`, `-object ...`).
    pub fn arg(mut self, a: &str) -> Self {
        self.args.push(a.to_string());
        self
    }

    /// A virtio-net NIC on a vhost-user socket at `sock` (QEMU is its client), with `,vectors=0`:
    /// QEMU 7.2 segfaults with vhost-user under TCG when the device uses MSI-X, so it uses
    /// INTx. `id` names the chardev and netdev; `mac` the NIC's address.
    pub fn vhost_user_nic(self, id: &str, sock: &str, mac: &str) -> Self {
        self.vhost_user_nic_with(id, sock, mac, "")
    }

    /// [`Qemu::vhost_user_nic`] with more `virtio-net-pci` properties (`opts`, each with a
    /// leading comma: `,packed=on` for packed virtqueues).
    pub fn vhost_user_nic_with(self, id: &str, sock: &str, mac: &str, opts: &str) -> Self {
        self.arg("-chardev")
            .arg(&format!("socket,id=c{id},path={sock}"))
            .arg("-netdev")
            .arg(&format!("vhost-user,id=n{id},chardev=c{id},vhostforce=on"))
            .arg("-device")
            .arg(&format!(
                "virtio-net-pci,netdev=n{id},mac={mac},vectors=0{opts}"
            ))
    }

    /// An `ivshmem-plain` PCI device (vendor 0x1af4, device 0x1110) whose BAR2 is the file
    /// at `path` (`size_mb` MiB, a power of two), shared with the host: a MEMNIC region in
    /// /dev/shm. In the guest it is `/sys/bus/pci/devices/<BDF>/resource2`, to be mmapped
    /// (read() on it fails). `id` names the memory backend.
    pub fn ivshmem(self, id: &str, path: &Path, size_mb: u32) -> Self {
        self.arg("-object")
            .arg(&format!(
                "memory-backend-file,id={id},share=on,mem-path={},size={size_mb}M",
                path.display()
            ))
            .arg("-device")
            .arg(&format!("ivshmem-plain,memdev={id}"))
    }

    /// The command line, program first.
    pub fn command_line(&self) -> Vec<String> {
        let mut v: Vec<String> = Vec::new();
        if let Some(cpu) = self.cpu {
            v.extend(["taskset".into(), "-c".into(), cpu.to_string()]);
        }
        let mem = self.memory_mb;
        v.extend(
            [
                "qemu-system-x86_64",
                "-accel",
                "tcg",
                "-nodefaults",
                "-display",
                "none",
                "-serial",
                "stdio",
                "-monitor",
                "none",
            ]
            .map(String::from),
        );
        v.extend(["-m".into(), mem.to_string()]);
        if self.shared_memory {
            v.extend([
                "-object".into(),
                format!("memory-backend-memfd,id=mem,size={mem}M,share=on"),
                "-machine".into(),
                "q35,memory-backend=mem".into(),
            ]);
        } else {
            v.extend(["-machine".into(), "q35".into()]);
        }
        if !self.reboot {
            v.push("-no-reboot".into());
        }
        v.extend(["-kernel".into(), self.kernel.display().to_string()]);
        v.extend(["-initrd".into(), self.initrd.display().to_string()]);
        v.extend([
            "-append".into(),
            format!("console=ttyS0 quiet panic=-1{}", self.append),
        ]);
        v.extend(self.args.iter().cloned());
        v
    }

    /// Starts QEMU; the guest's console is the child's stdout (QEMU's own errors its stderr).
    pub fn spawn(&self) -> Child {
        let line = self.command_line();
        let mut cmd = Command::new(&line[0]);
        cmd.args(&line[1..]);
        let stdin = if self.console_input {
            Stdin::Pipe
        } else {
            Stdin::Null
        };
        Child::spawn(cmd, stdin)
    }
}
