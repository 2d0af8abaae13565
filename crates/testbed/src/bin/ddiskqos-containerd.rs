//! `ddiskqos-containerd [--systemd] [--] COMMAND [ARG...]`: runs COMMAND beside a throw-away containerd serving CRI
//! v1, started exactly as the real tests start it ([`testbed::containerd::Containerd`]: Debian's containerd with its
//! own config, root, state and socket under /var/tmp, the cgroupfs driver (`--systemd`: runc's `SystemdCgroup`, the
//! driver a kubelet on a systemd host uses; needs systemd as PID 1), host-network pods, and the local sandbox
//! image `ddiskqos-pause:latest` built with the host's Docker if missing and imported into it). COMMAND finds the
//! socket in `DDISKQOS_CRI_SOCKET` (which `ddiskqos-bench --cri-socket` reads). When COMMAND has ended, every pod
//! left is stopped and removed, containerd is stopped and its directory removed (the harness's teardown).
//!
//! COMMAND runs in its own process group: SIGINT, SIGTERM and SIGHUP reach this process, which passes each on to
//! COMMAND once and waits for it (the bench then undoes what it set up), then tears containerd down. Exit status:
//! COMMAND's (128 + signal if a signal ended it). Root needed; used by `scripts/bench-cri.sh`.

use std::process::ExitCode;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use testbed::containerd::{Containerd, Driver};
use tokio::signal::unix::{signal, SignalKind};

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let driver = if args.first().map(String::as_str) == Some("--systemd") {
        args.remove(0);
        Driver::Systemd
    } else {
        Driver::Cgroupfs
    };
    let argv = match args.first().map(String::as_str) {
        Some("--") => &args[1..],
        _ => &args[..],
    };
    let Some((program, rest)) = argv.split_first() else {
        eprintln!("usage: ddiskqos-containerd [--systemd] [--] COMMAND [ARG...]");
        return ExitCode::from(2);
    };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ddiskqos-containerd: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Signal handlers before containerd starts, so that a Ctrl-C during start-up still tears it down.
    let handlers = rt.block_on(async {
        Ok::<_, std::io::Error>((
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
            signal(SignalKind::hangup())?,
        ))
    });
    let (mut int, mut term, mut hup) = match handlers {
        Ok(h) => h,
        Err(e) => {
            eprintln!("ddiskqos-containerd: cannot install signal handlers: {e}");
            return ExitCode::FAILURE;
        }
    };
    let containerd = Containerd::start_with(driver);
    let socket = containerd.socket();
    eprintln!("ddiskqos-containerd: containerd (CRI v1, {driver:?} cgroup driver) answers on {}", socket.display());
    let code = rt.block_on(async {
        let mut child = match tokio::process::Command::new(program)
            .args(rest)
            .env("DDISKQOS_CRI_SOCKET", &socket)
            .process_group(0)
            .spawn()
        {
            Ok(child) => child,
            Err(e) => {
                eprintln!("ddiskqos-containerd: cannot run {program}: {e}");
                return 127;
            }
        };
        let pid = child.id().map(|id| Pid::from_raw(id as i32));
        let pass_on = |sig: Signal| {
            eprintln!("ddiskqos-containerd: {sig}: passed on to {program}, then containerd is torn down");
            if let Some(pid) = pid {
                let _ = kill(pid, sig);
            }
        };
        loop {
            tokio::select! {
                status = child.wait() => {
                    return match status {
                        Ok(s) => s.code().unwrap_or_else(|| 128 + std::os::unix::process::ExitStatusExt::signal(&s).unwrap_or(0)),
                        Err(e) => {
                            eprintln!("ddiskqos-containerd: waiting for {program}: {e}");
                            1
                        }
                    };
                }
                _ = int.recv() => pass_on(Signal::SIGINT),
                _ = term.recv() => pass_on(Signal::SIGTERM),
                _ = hup.recv() => pass_on(Signal::SIGHUP),
            }
        }
    });
    drop(containerd);
    eprintln!("ddiskqos-containerd: containerd stopped and removed");
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
