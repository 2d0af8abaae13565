//! The status socket: `ddiskqos-agent status` connects to a Unix socket and the daemon answers with its table as
//! JSON. Root-only (mode 0600), since the table names every container.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};
use tracing::debug;

use crate::daemon::{Command, Status};

/// Binds the socket, replacing a stale one left by a crashed agent.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Answers status requests until the daemon goes away.
pub async fn serve(listener: UnixListener, commands: mpsc::Sender<Command>) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else { continue };
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

/// Renders the table: container, policy, level (1-based, see [`crate::daemon::display_level`]), weight, bytes at
/// level, time at level.
pub fn render(status: &Status) -> String {
    let mut out = format!(
        "actuator: {}{}\n{:<14} {:<24} {:<9} {:>5} {:>6} {:>14} {:>10}\n",
        status.actuator.describe(),
        if status.dry_run { " (dry run)" } else { "" },
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
    }
    out
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).chain(std::iter::once('~')).collect()
    }
}
