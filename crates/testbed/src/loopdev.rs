//! A file-backed loop device with direct I/O and the BFQ scheduler, for tests and benches that need a real block
//! device without touching the machine's disks.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A loop device on a sparse file in `/var/tmp`, with direct I/O and BFQ; detached and its file removed on drop.
#[derive(Debug)]
pub struct LoopDevice {
    /// `loopN`.
    pub name: String,
    /// `/dev/loopN`.
    pub dev: PathBuf,
    /// `MAJ:MIN`.
    pub devnum: String,
    _backing: tempfile::TempDir,
}

impl LoopDevice {
    /// Creates a `size_mib` MiB loop device and makes a fresh BFQ (default tunables) its scheduler (checked: panics
    /// if BFQ is not active).
    pub fn with_bfq(size_mib: u64) -> Self {
        let backing = tempfile::Builder::new().prefix("ddiskqos-loop-").tempdir_in("/var/tmp").unwrap();
        let file = backing.path().join("disk");
        fs::File::create(&file).unwrap().set_len(size_mib << 20).unwrap();
        let out = Command::new("losetup")
            .args(["--find", "--show", "--direct-io=on"])
            .arg(&file)
            .output()
            .expect("losetup must be installed");
        assert!(out.status.success(), "losetup failed: {}", String::from_utf8_lossy(&out.stderr));
        let dev = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
        let name = dev.file_name().unwrap().to_str().unwrap().to_owned();
        // Built before anything else can fail, so that Drop detaches the device.
        let mut this = Self { name, dev, devnum: String::new(), _backing: backing };
        let sched = Path::new("/sys/block").join(&this.name).join("queue/scheduler");
        // A loop device keeps its queue when detached: with bfq still selected, BFQ's tunables would be what its
        // last user left. Selecting none first gives a fresh BFQ with the kernel's defaults.
        fs::write(&sched, "none").unwrap_or_else(|e| panic!("cannot select none for {}: {e}", this.name));
        fs::write(&sched, "bfq").unwrap_or_else(|e| panic!("cannot select bfq for {}: {e}", this.name));
        let active = fs::read_to_string(&sched).unwrap();
        assert!(active.contains("[bfq]"), "{}: scheduler is {active:?}", this.name);
        this.devnum = fs::read_to_string(Path::new("/sys/block").join(&this.name).join("dev")).unwrap().trim().into();
        this
    }

    /// `/dev/loopN` as text, for command lines and configs.
    pub fn dev_str(&self) -> &str {
        self.dev.to_str().expect("/dev/loopN is UTF-8")
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let status = Command::new("losetup").arg("-d").arg(&self.dev).status();
        if !matches!(status, Ok(s) if s.success()) {
            eprintln!("warning: could not detach {}: {status:?}", self.dev.display());
        }
    }
}
