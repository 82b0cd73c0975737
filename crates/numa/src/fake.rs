//! A fake sysfs tree in a temporary directory, removed on drop (tests only).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

pub(crate) struct FakeSysfs {
    root: PathBuf,
}

impl FakeSysfs {
    pub(crate) fn new() -> FakeSysfs {
        // Relaxed: the counter only has to hand out distinct numbers.
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let root = std::env::temp_dir().join(format!(
            "memnic-numa-sysfs-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        FakeSysfs { root }
    }

    /// Two nodes: CPUs 0-3 on node 0, 4-7 on node 1.
    pub(crate) fn two_nodes() -> FakeSysfs {
        let fake = FakeSysfs::new();
        fake.file("devices/system/node/online", "0-1\n");
        fake.file("devices/system/node/node0/cpulist", "0-3\n");
        fake.file("devices/system/node/node1/cpulist", "4-7\n");
        fake.file("devices/system/cpu/online", "0-7\n");
        fake
    }

    pub(crate) fn file(&self, rel: &str, content: &str) {
        let path = self.root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }

    pub(crate) fn root(&self) -> &Path {
        &self.root
    }
}

impl Drop for FakeSysfs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
