//! The status socket: `ddiskqos-agent status` connects to a Unix socket and the daemon answers with its table as
//! JSON. Root-only (mode 0600), since the table names every container.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};
use tracing::debug;

use crate::daemon::{Command, Status};

/// Binds the socket, replacing a stale socket left by a crashed agent (never anything else: a file or directory at
/// the path is an error). A directory it creates is 0700; the socket is 0600.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)?,
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket: not replacing it", path.display()),
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Answers status requests until the task is dropped, within [`crate::ops::limits::CONTROL`]'s bounds. Each client is
/// answered in its own task: the daemon hands the table over and goes on, so a client that reads nothing delays
/// nobody (it is dropped at its deadline).
pub async fn serve(listener: UnixListener, commands: mpsc::Sender<Command>) {
    crate::ops::limits::serve(listener, crate::ops::limits::CONTROL, "control", move |mut stream, conn| {
        let commands = commands.clone();
        // A status client sends nothing: connecting is its request, answered from now on, never closed for another.
        conn.busy();
        async move {
            let (tx, rx) = oneshot::channel();
            if commands.send(Command::Status(tx)).await.is_err() {
                return;
            }
            let Ok(status) = rx.await else { return };
            let body = serde_json::to_vec(&status).expect("serializable");
            if let Err(e) = stream.write_all(&body).await {
                debug!(error = %e, "status client went away");
            }
        }
    })
    .await
}

/// Client side: fetches the table from a running agent.
pub async fn fetch(path: &Path) -> Result<Status, String> {
    let mut s = UnixStream::connect(path)
        .await
        .map_err(|e| format!("cannot connect to {} (is the agent running?): {e}", path.display()))?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.map_err(|e| format!("reading {}: {e}", path.display()))?;
    serde_json::from_slice(&buf).map_err(|e| format!("bad answer from {}: {e}", path.display()))
}

/// A setting's value for the table: io.cost lines without their device number, cut to 40 characters.
fn short(value: &str) -> String {
    let v = value.split_once(' ').filter(|(dev, _)| dev.contains(':')).map_or(value, |(_, rest)| rest);
    if v.is_empty() {
        "(none)".into()
    } else {
        truncate(v, 40)
    }
}

/// Renders the table: container, policy, level (1-based, see [`crate::daemon::display_level`]), weight, bytes at
/// level, time at level; on cgroup v2 under each container one line per device (what governs it, the file written
/// and the weight in force there), then every device the agent looked at, with the fix where no weight acts; then
/// every device setting the agent made (original, set, read back now) and the managed devices it left alone.
pub fn render(status: &Status) -> String {
    let mut out = format!(
        "actuator: {}{}\n{:<14} {:<24} {:<9} {:>5} {:>6} {:>14} {:>10}\n",
        status.actuator.describe(),
        match (status.dry_run, status.saves_held) {
            (true, _) => " (dry run)",
            (false, true) => " (HELD: the state file cannot be saved; originals put back, no weight changed)",
            (false, false) => "",
        },
        "CONTAINER",
        "NAME",
        "POLICY",
        "LEVEL",
        "WEIGHT",
        "BYTES@LEVEL",
        "TIME@LEVEL"
    );
    for r in &status.containers {
        out.push_str(&format!(
            "{:<14} {:<24} {:<9} {:>5} {:>6} {:>14} {:>9.1}s\n",
            r.id,
            truncate(&r.name, 24),
            r.policy,
            r.level.map_or("-".into(), |l| l.to_string()),
            r.weight.map_or("-".into(), |w| w.to_string()),
            r.bytes_at_level,
            r.seconds_at_level
        ));
        if let Some(cap) = &r.cap {
            let each = |bps: Option<u64>| bps.map_or("-".to_string(), |b| format!("{:.1} MiB/s", b as f64 / 1048576.0));
            out.push_str(&format!(
                "  capped at the bottom: read {}, write {}\n",
                each(cap.read_bps),
                each(cap.write_bps)
            ));
        }
        for d in &r.devices {
            let weights = if d.weights.is_empty() && d.governor == "none" {
                "no weight acts on this device".to_string()
            } else if d.weights.is_empty() {
                "not read back yet".to_string()
            } else {
                let each: Vec<String> = d.weights.iter().map(|w| format!("{} {}", w.file, w.effective)).collect();
                each.join(", ")
            };
            out.push_str(&format!(
                "  device {:<18} {:<12} {weights}\n",
                device_name(&d.device, d.disk.as_deref()),
                d.governor
            ));
        }
    }
    if !status.devices.is_empty() {
        out.push_str("DEVICES (cgroup v2)\n");
        for d in &status.devices {
            let scheduler = d.scheduler.as_deref().unwrap_or("?");
            let line = match (&d.fix, d.governor.as_str()) {
                (Some(fix), _) => format!("NO WEIGHT ACTS (scheduler {scheduler}, io.cost off). Fix: {fix}"),
                (None, "bfq") => format!("io.bfq.weight acts (scheduler {scheduler})"),
                (None, "io-cost") => format!("io.weight acts (io.cost enabled; scheduler {scheduler})"),
                (None, _) => format!("io.bfq.weight and io.weight act (scheduler {scheduler}, io.cost enabled)"),
            };
            out.push_str(&format!("  {:<25} {:<12} {line}\n", device_name(&d.device, d.disk.as_deref()), d.governor));
            if let Some(e) = &d.error {
                out.push_str(&format!("  {:<25} {:<12} ({e})\n", "", ""));
            }
        }
    }
    if !status.device_settings.is_empty() || !status.devices_left.is_empty() {
        out.push_str(&format!(
            "DEVICE SETTINGS (put back at stop)\n  {:<10} {:<18} {:<14} {:<14} {:<14} {}\n",
            "DEVICE", "SETTING", "ORIGINAL", "SET", "NOW", "BY"
        ));
        for r in &status.device_settings {
            let now = match (&r.now, r.as_set()) {
                (None, _) => "UNREADABLE".to_string(),
                (Some(n), true) => short(n),
                (Some(n), false) => format!("{} (CHANGED)", short(n)),
            };
            out.push_str(&format!(
                "  {:<10} {:<18} {:<14} {:<14} {:<14} {}\n",
                r.device,
                r.setting,
                short(&r.original),
                short(&r.set),
                now,
                r.by
            ));
        }
        for (device, why) in &status.devices_left {
            out.push_str(&format!("  {device:<10} left as it is: {why}\n"));
        }
    }
    out
}

/// `7:3 (loop3)`, or `7:3` when the disk is unknown.
fn device_name(device: &str, disk: Option<&str>) -> String {
    match disk {
        Some(disk) => format!("{device} ({disk})"),
        None => device.to_string(),
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).chain(std::iter::once('~')).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::blockdev::tune::SettingRow;
    use crate::config::ActuatorMode;
    use crate::daemon::{Actuator, PolicyKind, StatusRow};

    /// A table far larger than a socket buffer (about 2 MB of JSON).
    fn big_status() -> Status {
        let row = |i: usize| StatusRow {
            id: format!("{i:012x}"),
            name: format!("container-with-a-rather-long-name-{i}-{}", "x".repeat(150)),
            policy: PolicyKind::Managed,
            level: Some(1),
            weight: Some(1000),
            bytes_at_level: 0,
            seconds_at_level: 0.0,
            cap: None,
            devices: vec![],
        };
        Status {
            actuator: Actuator { configured: ActuatorMode::Auto, in_use: None },
            dry_run: false,
            containers: (0..8000).map(row).collect(),
            saves_held: false,
            devices: vec![],
            device_settings: vec![],
            devices_left: vec![],
        }
    }

    #[tokio::test]
    async fn a_client_that_reads_nothing_delays_no_other_and_the_daemon_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/agent.sock");
        let listener = bind(&path).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(std::fs::metadata(dir.path().join("sub")).unwrap().permissions().mode() & 0o777, 0o700);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let (tx, mut rx) = mpsc::channel(16);
        tokio::spawn(serve(listener, tx));
        // The "daemon": answers every request at once and counts them.
        let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = answered.clone();
        tokio::spawn(async move {
            while let Some(Command::Status(reply)) = rx.recv().await {
                let _ = reply.send(big_status());
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
        let idle = UnixStream::connect(&path).await.unwrap(); // connects, reads nothing
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = std::time::Instant::now();
        let status = tokio::time::timeout(Duration::from_secs(3), fetch(&path)).await.expect("answered").unwrap();
        assert_eq!(status.containers.len(), 8000);
        assert!(started.elapsed() < Duration::from_secs(3));
        assert_eq!(answered.load(std::sync::atomic::Ordering::SeqCst), 2, "the daemon answered both");
        drop(idle);
    }

    #[test]
    fn render_shows_each_device_of_a_container_and_the_fix_where_no_weight_acts() {
        use crate::daemon::{DeviceRow, DeviceSummary, FileWeight};
        let device = |dev: &str, disk: &str, governor: &str, weights: &[(&str, u32)]| DeviceRow {
            device: dev.into(),
            disk: Some(disk.into()),
            governor: governor.into(),
            weights: weights.iter().map(|(f, v)| FileWeight { file: (*f).into(), effective: *v }).collect(),
        };
        let summary = |dev: &str, disk: &str, sched: &str, governor: &str, fix: Option<&str>| DeviceSummary {
            device: dev.into(),
            disk: Some(disk.into()),
            scheduler: Some(sched.into()),
            governor: governor.into(),
            fix: fix.map(Into::into),
            error: None,
        };
        let status = Status {
            actuator: Actuator { configured: ActuatorMode::Auto, in_use: None },
            dry_run: false,
            containers: vec![StatusRow {
                id: "0123456789ab".into(),
                name: "heavy".into(),
                policy: PolicyKind::Managed,
                level: Some(4),
                weight: Some(10),
                bytes_at_level: 1,
                seconds_at_level: 2.0,
                cap: Some(qos_core::Cap { read_bps: Some(133 << 20), write_bps: None }),
                devices: vec![
                    device("7:3", "loop3", "bfq", &[("io.bfq.weight", 10)]),
                    device("7:4", "loop4", "io-cost", &[("io.weight", 10)]),
                    device("7:5", "loop5", "none", &[]),
                ],
            }],
            saves_held: false,
            devices: vec![
                summary("7:3", "loop3", "bfq", "bfq", None),
                summary("7:4", "loop4", "none", "io-cost", None),
                summary("7:5", "loop5", "none", "none", Some("FIX-IT")),
            ],
            device_settings: vec![
                setting("loop3", "timeout_sync", "124", "8", Some("8")),
                setting("loop3", "max_budget", "0", "256", Some("64")),
                setting("loop3", "strict_guarantees", "0", "1", None),
                setting(
                    "loop4",
                    "io.cost.qos",
                    "7:4 enable=0 ctrl=auto",
                    "7:4 enable=1 ctrl=user rpct=95.00",
                    Some("7:4 enable=1 ctrl=user rpct=95.00 rlat=2000"),
                ),
            ],
            devices_left: vec![("vda".into(), "it backs the root filesystem".into())],
        };
        let text = render(&status);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[2].starts_with("0123456789ab"), "{text}");
        let has = |parts: &[&str]| lines.iter().any(|l| parts.iter().all(|p| l.contains(p)));
        assert!(has(&["device 7:3 (loop3)", "bfq", "io.bfq.weight 10"]), "{text}");
        assert!(has(&["capped at the bottom: read 133.0 MiB/s, write -"]), "{text}");
        assert!(has(&["device 7:4 (loop4)", "io-cost", "io.weight 10"]), "{text}");
        assert!(has(&["device 7:5 (loop5)", "none", "no weight acts"]), "{text}");
        assert!(has(&["7:5 (loop5)", "NO WEIGHT ACTS", "Fix: FIX-IT"]), "{text}");
        assert!(has(&["7:4 (loop4)", "io.weight acts"]), "{text}");
        assert_eq!(text.matches("Fix:").count(), 1, "{text}");
        // The device settings: original, set, read back now; a change behind the agent's back and an unreadable
        // setting are flagged; io.cost lines without their device number; the devices left alone, with why.
        assert!(has(&["DEVICE SETTINGS (put back at stop)"]), "{text}");
        let words = |l: &&str| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        let row = |setting: &str| lines.iter().find(|l| l.contains(setting)).map(words).unwrap_or_default();
        assert_eq!(row("timeout_sync"), ["loop3", "timeout_sync", "124", "8", "8", "protect"], "{text}");
        assert_eq!(row("max_budget"), ["loop3", "max_budget", "0", "256", "64", "(CHANGED)", "protect"], "{text}");
        assert!(has(&["strict_guarantees", "UNREADABLE"]), "{text}");
        assert!(has(&["loop4", "io.cost.qos", "enable=0 ctrl=auto", "enable=1 ctrl=user"]), "{text}");
        assert!(!has(&["io.cost.qos", "(CHANGED)"]), "every word set is there: {text}");
        assert!(has(&["vda", "left as it is: it backs the root filesystem"]), "{text}");
    }

    fn setting(device: &str, key: &str, original: &str, set: &str, now: Option<&str>) -> SettingRow {
        SettingRow {
            device: device.into(),
            setting: key.into(),
            original: original.into(),
            set: set.into(),
            now: now.map(Into::into),
            by: "protect".into(),
        }
    }

    #[test]
    fn bind_replaces_a_stale_socket_but_never_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        std::fs::write(&path, "someone's file").unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let _guard = rt.enter();
        let err = bind(&path).unwrap_err();
        assert!(err.to_string().contains("not a socket"), "{err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "someone's file");
        std::fs::remove_file(&path).unwrap();
        drop(bind(&path).unwrap()); // leaves a stale socket behind
        drop(bind(&path).expect("a stale socket is replaced"));
    }
}
