//! Small system helpers: running a command and reading or writing a sysfs/cgroupfs file, with errors that name
//! the command or the file.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

/// Runs `program args...`, returns its stdout; a non-zero exit is an error carrying stderr.
pub fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {program} (is it installed?)"))?;
    if !out.status.success() {
        bail!("{program} {} failed ({}): {}", args.join(" "), out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether `program` can be found on `PATH`.
pub fn have(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
        .unwrap_or(false)
}

/// Reads a small file and trims it.
pub fn read_trim(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(text.trim().to_string())
}

/// Writes `value` to an existing file (never creates one: a missing sysfs/cgroup file is an error).
pub fn write_existing(path: &Path, value: &str) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(false)
        .open(path)
        .with_context(|| format!("cannot open {} for writing", path.display()))?;
    f.write_all(value.as_bytes()).with_context(|| format!("cannot write {value:?} to {}", path.display()))
}

/// `uname -r`.
pub fn kernel_release() -> String {
    read_trim(Path::new("/proc/sys/kernel/osrelease")).unwrap_or_else(|_| "unknown".into())
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Current UTC time as `YYYY-MM-DDTHH:MM:SSZ` (no date crate needed for one timestamp).
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    format_utc(secs)
}

/// Formats seconds since the epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn format_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// `limit` stretched by `DDISKQOS_TIME_SCALE` (1 to 100; the systemd guest, `scripts/guest.sh`, runs under qemu's
/// software emulation and sets 10; unset or out of range: 1), as `testbed::process::patience` stretches the tests'
/// waits: for safety caps on waits (how long before the run gives up), never for a measured figure. Under emulation
/// on a busy host a container's start and the agent's write through systemd took longer than the host's caps (a
/// reader's scope not there 30 s after `docker start`; a weight not there 5 s after the container started).
pub fn patience(limit: std::time::Duration) -> std::time::Duration {
    let scale = std::env::var("DDISKQOS_TIME_SCALE").ok().and_then(|v| v.parse::<u32>().ok());
    limit * scale.filter(|n| (1..=100).contains(n)).unwrap_or(1)
}

/// Unmounts `mnt`, retrying while it is busy, lazily at last.
pub fn unmount(mnt: &Path) -> Result<()> {
    let m = mnt.to_string_lossy();
    for _ in 0..20 {
        if run("umount", &[&m]).is_ok() {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // Still busy (a straggler process): detach it lazily so the loop device can go.
    run("umount", &["-l", &m]).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_formatting() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_utc(1_795_255_261), "2026-11-21T10:01:01Z");
    }

    #[test]
    fn run_reports_failures_with_stderr() {
        assert_eq!(run("sh", &["-c", "echo hi"]).unwrap(), "hi\n");
        let err = run("sh", &["-c", "echo oops >&2; exit 3"]).unwrap_err().to_string();
        assert!(err.contains("oops"), "{err}");
    }

    #[test]
    fn write_existing_never_creates() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("nope");
        assert!(write_existing(&p, "1").is_err());
        assert!(!p.exists());
        std::fs::write(&p, "").unwrap();
        write_existing(&p, "42").unwrap();
        assert_eq!(read_trim(&p).unwrap(), "42");
    }
}
