//! The `ddiskqos-agent` binary from the outside (no root, no Docker): `check-config` on good and bad files,
//! `--help`, shell completions and man pages (and `scripts/gen-completions.sh`), `status` and `run` failing
//! clearly, the example config in `deploy/`, and the systemd notify protocol (READY, WATCHDOG, STOPPING) of a real
//! agent run in cgroup-dir mode on a fixture cgroup tree.

use std::io::Read;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use qos_agent::config::AgentConfig;
use qos_agent::priority::SessionGroup;

use crate::AGENT as BIN;

fn agent(args: &[&str]) -> Output {
    Command::new(BIN).args(args).env_remove("DDISKQOS_CONFIG").env_remove("NOTIFY_SOCKET").output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Writes `text` to `<dir>/<name>` and returns the path as a string.
fn file(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

// ----- check-config -----

#[test]
fn check_config_accepts_a_good_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = file(
        dir.path(),
        "good.toml",
        "sample_interval = \"250ms\"\n[mlfq]\nboost_after = \"5s\"\nlevels = [ { weight = 1000, threshold = \
         \"4MiB\" }, { weight = 100, threshold = \"64MiB\" } ]\n",
    );
    let out = agent(&["check-config", "--syntax-only", &path]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{path}: ok\n"));
    // The same file through --config.
    let out = agent(&["-c", &path, "check-config", "--syntax-only"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn check_config_checks_the_host_as_run_does() {
    let dir = tempfile::tempdir().unwrap();
    // The same file that `run` refuses for its missing Docker socket (see below) is refused here too.
    let cfg = run_config(dir.path(), "[docker]\nsocket = \"/nonexistent.sock\"", "");
    let out = agent(&["check-config", &cfg]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("docker.socket") && stderr(&out).contains("/nonexistent.sock"), "{}", stderr(&out));
    // A cgroup-dir config over a fixture root passes, and says what it could not check.
    let cfg = run_config(dir.path(), "runtime = \"cgroup-dir\"\n[metrics]\nenabled = true", "parent = \"pods\"");
    let out = agent(&["check-config", &cfg]);
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(stdout.starts_with(&format!("{cfg}: ok\n")), "{stdout}");
    assert!(stdout.contains("not checked") && stdout.contains("metrics.listen"), "{stdout}");
    // A control socket path that is someone's file: refused, and the file is left alone.
    std::fs::write(dir.path().join("precious"), "data").unwrap();
    let text = std::fs::read_to_string(&cfg).unwrap().replace("agent.sock", "precious");
    let cfg = file(dir.path(), "precious.toml", &text);
    for args in [vec!["check-config", cfg.as_str()], vec!["-c", cfg.as_str(), "run"]] {
        let out = agent(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("control_socket"), "{args:?}: {}", stderr(&out));
    }
    assert_eq!(std::fs::read_to_string(dir.path().join("precious")).unwrap(), "data");
}

#[test]
fn a_huge_garbage_config_gives_a_bounded_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = file(dir.path(), "garbage.toml", &"x".repeat(1 << 20));
    let out = agent(&["check-config", &path]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stderr.len() < 8_000, "{} bytes of error", out.stderr.len());
    assert!(stderr(&out).contains("garbage.toml"), "{}", stderr(&out));
}

#[test]
fn check_config_rejects_bad_files_naming_the_field_and_the_value() {
    let dir = tempfile::tempdir().unwrap();
    // (file name, content, what stderr must name)
    let cases: &[(&str, &str, &[&str])] = &[
        ("unknown-key.toml", "sample_intervall = \"1s\"\n", &["unknown field", "sample_intervall"]),
        ("unknown-nested.toml", "[mlfq]\nboost = \"1s\"\n", &["unknown field", "boost"]),
        ("malformed.toml", "runtime = \"docker\n", &["TOML parse error", "line 1"]),
        (
            "decreasing.toml",
            "[mlfq]\nlevels = [ { weight = 1000, threshold = \"8MiB\" }, { weight = 200, threshold = \"2MiB\" } ]\n",
            &["mlfq.levels[1].threshold", "2MiB", "8MiB"],
        ),
        ("weight0.toml", "[mlfq]\nlevels = [ { weight = 0, threshold = \"8MiB\" } ]\n", &["weight", "0", "1..=1000"]),
        (
            "weight1001.toml",
            "[mlfq]\nlevels = [ { weight = 1001, threshold = \"8MiB\" } ]\n",
            &["weight", "1001", "1..=1000"],
        ),
        ("zero-duration.toml", "[mlfq]\nboost_after = \"0s\"\n", &["mlfq.boost_after", "0", "greater than zero"]),
        ("bad-interval.toml", "sample_interval = \"fast\"\n", &["sample_interval", "\"fast\""]),
        ("tiny-interval.toml", "sample_interval = \"1ms\"\n", &["sample_interval", "1ms", "10ms"]),
        ("bad-budget.toml", "cpu_budget = \"0.8\"\n", &["cpu_budget", "\"0.8\"", "percentage"]),
        ("zero-budget.toml", "cpu_budget = \"0%\"\n", &["cpu_budget", "\"0%\"", "more than 0%"]),
        ("cgroup-dir.toml", "runtime = \"cgroup-dir\"\n", &["cgroup.parent", "\"\"", "cgroup-dir"]),
        ("relative-state.toml", "state_file = \"state.json\"\n", &["state_file", "state.json", "absolute"]),
        ("bad-actuator.toml", "actuator = \"magic\"\n", &["actuator", "magic"]),
    ];
    for (name, text, needles) in cases {
        let path = file(dir.path(), name, text);
        let out = agent(&["check-config", &path]);
        let err = stderr(&out);
        assert!(!out.status.success(), "{name} accepted");
        assert_eq!(out.status.code(), Some(1), "{name}");
        assert!(out.stdout.is_empty(), "{name}: nothing on stdout");
        assert!(err.contains(&path), "{name}: the file is named: {err}");
        for n in *needles {
            assert!(err.contains(n), "{name}: {n:?} not in: {err}");
        }
        // Said once: an error that shows its cause in its message must not get the cause appended again.
        assert!(err.matches("invalid config").count() <= 1, "{name}: repeated: {err}");
        assert!(err.matches("TOML parse error").count() <= 1, "{name}: repeated: {err}");
    }
}

#[test]
fn check_config_on_a_missing_file_names_it_once() {
    let out = agent(&["check-config", "/nonexistent/agent.toml"]);
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(err.contains("/nonexistent/agent.toml"), "{err}");
    assert_eq!(err.matches("No such file").count(), 1, "{err}");
}

#[test]
fn check_config_needs_a_file() {
    let out = agent(&["check-config"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("needs a file"), "{}", stderr(&out));
}

#[test]
fn command_line_overrides_are_validated_too() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = run_config(dir.path(), "", "");
    let out = agent(&["-c", &cfg, "--sample-interval", "1ms", "run"]);
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(err.contains("sample_interval") && err.contains("1ms"), "{err}");
    let out = agent(&["--sample-interval", "soon"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("soon"), "{}", stderr(&out));
}

// ----- help, status -----

#[test]
fn help_lists_the_commands_and_options() {
    let out = agent(&["--help"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "run",
        "check-config",
        "status",
        "completions",
        "man",
        "--config",
        "--dry-run",
        "--actuator",
        "--sample-interval",
    ] {
        assert!(text.contains(needle), "{needle} missing from --help:\n{text}");
    }
    let out = agent(&["status", "--help"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("--socket"));
}

#[test]
fn status_without_an_agent_names_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("agent.sock");
    let out = agent(&["status", "--socket", sock.to_str().unwrap()]);
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(err.contains(sock.to_str().unwrap()) && err.contains("is the agent running"), "{err}");
    // The socket of the config file is used when --socket is not given.
    let cfg = run_config(dir.path(), "", "");
    let out = agent(&["-c", &cfg, "status"]);
    assert!(stderr(&out).contains(&format!("{}/agent.sock", dir.path().display())), "{}", stderr(&out));
}

// ----- completions, man pages -----

/// Every visible subcommand, as the completions and the man pages must name them.
const SUBCOMMANDS: [&str; 8] = ["run", "check-config", "iocost", "status", "state", "devices", "completions", "man"];

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn completions_are_written_for_each_shell_and_bash_completes_the_subcommands() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = agent(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {}", stderr(&out));
        let script = stdout(&out);
        for sub in SUBCOMMANDS {
            assert!(script.contains(sub), "{shell} script lacks {sub}:\n{script}");
        }
    }
    assert!(stdout(&agent(&["completions", "zsh"])).starts_with("#compdef ddiskqos-agent\n"));
    assert!(stdout(&agent(&["completions", "fish"])).contains("complete -c ddiskqos-agent "));
    let bash = stdout(&agent(&["completions", "bash"]));
    assert!(bash.contains(" ddiskqos-agent\n") && bash.contains("complete -F _ddiskqos__agent"), "{bash}");
    // Loaded into bash: `ddiskqos-agent st<TAB>` offers state and status, `state <TAB>` its subcommands.
    let dir = tempfile::tempdir().unwrap();
    let script = file(dir.path(), "ddiskqos-agent", &bash);
    let complete = |words: &str| {
        let probe = format!(
            "source {script}; COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); \
             _ddiskqos__agent ddiskqos-agent \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; \
             printf '%s\\n' \"${{COMPREPLY[@]}}\" | sort | tr '\\n' ' '"
        );
        let out = Command::new("bash").args(["--norc", "-c", &probe]).output().unwrap();
        assert!(out.status.success(), "{words}: {}", stderr(&out));
        stdout(&out).trim().to_string()
    };
    assert_eq!(complete("ddiskqos-agent st"), "state status");
    // Past the first word too (clap_complete gets this wrong for a hyphenated name unless fixed up: see main.rs).
    assert_eq!(complete("ddiskqos-agent state ''"), "--config --help -c -h help reset show");
    assert_eq!(complete("ddiskqos-agent state reset --t"), "--to");
    assert_eq!(complete("ddiskqos-agent completions f"), "fish");
}

#[test]
fn completions_for_an_unknown_shell_fail_naming_it() {
    let out = agent(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("invalid value 'tcsh'") && err.contains("bash, elvish, fish, powershell, zsh"), "{err}");
    assert!(out.stdout.is_empty());
    let out = agent(&["completions"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// The lines of a page with roff's escaped hyphens plain (`ddiskqos\-agent` is `ddiskqos-agent`).
fn unescaped(page: &str) -> String {
    page.replace("\\-", "-")
}

#[test]
fn man_page_is_roff_naming_every_subcommand_and_one_page_each_is_written_on_request() {
    let out = agent(&["man"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let page = stdout(&out);
    // clap_mangen defines a string for the apostrophe (two lines, `.ie`/`.el`) before the title; `.TH` is the first
    // macro after them.
    let first = page.lines().find(|l| !l.starts_with(".ie ") && !l.starts_with(".el ")).unwrap();
    assert!(first.starts_with(".TH ddiskqos-agent 1 "), "{first}");
    assert!(page.lines().take(2).all(|l| l.starts_with(".ie ") || l.starts_with(".el ")), "{page}");
    let text = unescaped(&page);
    for section in [".SH NAME", ".SH SYNOPSIS", ".SH OPTIONS", ".SH SUBCOMMANDS"] {
        assert!(text.contains(section), "{section} missing:\n{text}");
    }
    for sub in SUBCOMMANDS {
        assert!(text.contains(&format!("ddiskqos-agent-{sub}(1)")), "{sub} missing:\n{text}");
    }
    assert!(!text.contains("ddiskqos-agent-help(1)"), "{text}");
    assert!(text.contains("DDISKQOS_CONFIG"), "the environment variable is documented");

    // --dir: the top page (the same bytes) and one per subcommand, nested ones too, each titled by its full name.
    let dir = tempfile::tempdir().unwrap();
    let out = agent(&["man", "--dir", dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let mut pages: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    pages.sort();
    let mut expected: Vec<String> = SUBCOMMANDS.iter().map(|s| format!("ddiskqos-agent-{s}.1")).collect();
    expected.extend(
        [
            "ddiskqos-agent.1",
            "ddiskqos-agent-state-show.1",
            "ddiskqos-agent-state-reset.1",
            "ddiskqos-agent-devices-restore.1",
        ]
        .map(String::from),
    );
    expected.sort();
    assert_eq!(pages, expected);
    let printed: Vec<String> = stdout(&out).lines().map(String::from).collect();
    assert_eq!(printed.len(), expected.len(), "{printed:?}");
    assert_eq!(printed[0], dir.path().join("ddiskqos-agent.1").to_str().unwrap());
    assert_eq!(std::fs::read_to_string(dir.path().join("ddiskqos-agent.1")).unwrap(), page);
    let reset = unescaped(&std::fs::read_to_string(dir.path().join("ddiskqos-agent-state-reset.1")).unwrap());
    assert!(reset.contains(".TH ddiskqos-agent-state-reset 1 ") && reset.contains("--children-of"), "{reset}");
    // A directory that does not exist: an error naming it.
    let out = agent(&["man", "--dir", "/nonexistent/man1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("/nonexistent/man1"), "{}", stderr(&out));
}

#[test]
fn man_renders_the_pages_without_warnings() {
    let on_path =
        |p: &str| std::env::var_os("PATH").is_some_and(|v| std::env::split_paths(&v).any(|d| d.join(p).is_file()));
    if !on_path("man") {
        // Not required: the pages' roff is checked above; only the rendering needs man-db.
        eprintln!("SKIPPED cli::man_renders_the_pages_without_warnings: needs man on PATH");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    assert!(agent(&["man", "--dir", dir.path().to_str().unwrap()]).status.success());
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let page = entry.unwrap().path();
        let out = Command::new("man")
            .args(["--warnings", "-E", "UTF-8", "-P", "cat", "-l"])
            .arg(&page)
            .env("MANWIDTH", "100")
            .env("LC_ALL", "C.UTF-8")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}: {}", page.display(), stderr(&out));
        assert_eq!(stderr(&out), "", "{}: warnings", page.display());
        let text = stdout(&out);
        let name = page.file_stem().unwrap().to_str().unwrap();
        assert!(text.starts_with(&format!("{name}(1)")), "{}:\n{text}", page.display());
        assert!(text.contains("NAME") && text.contains("SYNOPSIS"), "{text}");
        if name == "ddiskqos-agent" {
            assert!(text.contains("SUBCOMMANDS") && text.contains("ddiskqos-agent-check-config(1)"), "{text}");
        }
    }
}

#[test]
fn gen_completions_script_writes_the_package_layout_reproducibly() {
    let script = workspace_root().join("scripts/gen-completions.sh");
    let run = |out: &Path| {
        let o = Command::new(&script).arg(out).env("DDISKQOS_AGENT", BIN).output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
    };
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    run(a.path());
    run(b.path());
    let files = |root: &Path| -> Vec<String> {
        let mut found = Vec::new();
        let mut dirs = vec![root.to_path_buf()];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    dirs.push(p);
                } else {
                    found.push(p.strip_prefix(root).unwrap().to_str().unwrap().to_string());
                }
            }
        }
        found.sort();
        found
    };
    let got = files(a.path());
    for want in [
        "usr/share/bash-completion/completions/ddiskqos-agent",
        "usr/share/zsh/vendor-completions/_ddiskqos-agent",
        "usr/share/fish/vendor_completions.d/ddiskqos-agent.fish",
        "usr/share/man/man1/ddiskqos-agent.1.gz",
        "usr/share/man/man1/ddiskqos-agent-status.1.gz",
        "usr/share/man/man1/ddiskqos-agent-state-reset.1.gz",
    ] {
        assert!(got.iter().any(|f| f == want), "{want} missing: {got:?}");
    }
    assert_eq!(got.len(), 3 + 12, "{got:?}");
    // gzip -9n: the same binary gives the same bytes (no name, no time stamp), and the page is the agent's.
    assert_eq!(got, files(b.path()));
    for f in &got {
        assert_eq!(std::fs::read(a.path().join(f)).unwrap(), std::fs::read(b.path().join(f)).unwrap(), "{f}");
    }
    let gz = a.path().join("usr/share/man/man1/ddiskqos-agent.1.gz");
    let out = Command::new("gzip").arg("-dc").arg(&gz).output().unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), stdout(&agent(&["man"])));
    let bash = std::fs::read_to_string(a.path().join("usr/share/bash-completion/completions/ddiskqos-agent")).unwrap();
    assert_eq!(bash, stdout(&agent(&["completions", "bash"])));
    // Without a binary: usage, exit 2.
    let o = Command::new(&script).arg(a.path()).env_remove("DDISKQOS_AGENT").output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

// ----- run -----

/// A config whose state file, control socket and cgroup root (a fixture directory) are in `dir`; `top` and
/// `cgroup` are added to the top level and to `[cgroup]`.
fn run_config(dir: &Path, top: &str, cgroup: &str) -> String {
    let root = dir.join("cgroup");
    std::fs::create_dir_all(root.join("pods")).unwrap();
    std::fs::write(root.join("cgroup.procs"), "").unwrap(); // what makes it a cgroup directory to the agent
    let text = format!(
        "state_file = \"{d}/state.json\"\ncontrol_socket = \"{d}/agent.sock\"\n{top}\n\
         [cgroup]\nroot = \"{r}\"\n{cgroup}\n",
        d = dir.display(),
        r = root.display()
    );
    file(dir, "agent.toml", &text)
}

fn wait_with_timeout(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("the agent did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn run_with_a_missing_docker_socket_fails_fast_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = run_config(dir.path(), "", "");
    let start = Instant::now();
    let mut child = Command::new(BIN)
        .args(["-c", &cfg, "--docker-socket", "/nonexistent.sock", "run"])
        .env_remove("NOTIFY_SOCKET")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_with_timeout(&mut child, Duration::from_secs(10));
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(!status.success());
    assert!(start.elapsed() < Duration::from_secs(5), "took {:?}", start.elapsed());
    assert!(err.contains("/nonexistent.sock"), "{err}");
    assert!(!err.contains('\u{1b}'), "no terminal colour codes when stderr is not a terminal: {err:?}");
}

// ----- deploy/ -----

#[test]
fn example_config_is_valid_and_equals_the_defaults() {
    let path = workspace_root().join("deploy/agent.toml");
    let cfg = AgentConfig::load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(cfg, AgentConfig::default(), "deploy/agent.toml must show the defaults");
    let out = agent(&["check-config", "--syntax-only", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Every line is either a comment, blank, or a key of the schema (no key left out by a typo).
    let text = std::fs::read_to_string(&path).unwrap();
    for key in
        ["runtime", "sample_interval", "cpu_budget", "actuator", "dry_run", "state_file", "control_socket", "[docker]"]
    {
        assert!(text.contains(key), "{key} not documented in deploy/agent.toml");
    }
    for key in [
        "[cgroup]",
        "[devices]",
        "protect",
        "opt_out",
        "bfq_tunables",
        "[metrics]",
        "[mlfq]",
        "boost_after",
        "idle_promote_after",
        "levels",
    ] {
        assert!(text.contains(key), "{key} not documented in deploy/agent.toml");
    }
    for key in [
        "cgroup_root",
        "state_dirs",
        "[policy]",
        "trusted_namespaces",
        "max_pinned_weight",
        "classes",
        "exclude_namespaces",
        "exclude_static_pods",
        "exclude_pod_labels",
        "docker_labels",
    ] {
        assert!(text.contains(key), "{key} not documented in deploy/agent.toml");
    }
}

#[test]
fn example_unit_runs_the_paths_it_installs() {
    let unit = std::fs::read_to_string(workspace_root().join("deploy/ddiskqos-agent.service")).unwrap();
    for line in [
        "Type=notify",
        "NotifyAccess=main",
        "ExecStartPre=/usr/local/bin/ddiskqos-agent check-config /etc/ddiskqos/agent.toml",
        "ExecStart=/usr/local/bin/ddiskqos-agent -c /etc/ddiskqos/agent.toml",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "Restart=on-failure",
        "RuntimeDirectory=ddiskqos",
        "ProtectSystem=strict",
        "After=docker.service",
        // One counter file per container: 1024 descriptors are too few on a busy host (see the unit's comment).
        "LimitNOFILE=65536",
    ] {
        assert!(unit.lines().any(|l| l.trim() == line), "missing {line:?}");
    }
    let rw = unit.lines().find(|l| l.starts_with("ReadWritePaths=")).expect("ReadWritePaths");
    assert!(rw.contains("/sys/fs/cgroup") && rw.contains("/run/ddiskqos"), "{rw}");
    // ProtectControlGroups makes /sys/fs/cgroup read-only: the agent could not write a single weight.
    assert!(
        !unit.lines().any(|l| l.trim().starts_with("ProtectControlGroups")),
        "ProtectControlGroups must not be set"
    );
    // The watchdog must allow a few sampling rounds (default 500 ms), or systemd kills a healthy agent.
    let wd = unit.lines().find_map(|l| l.strip_prefix("WatchdogSec=")).expect("WatchdogSec");
    let wd = qos_core::units::parse_duration(wd.trim()).unwrap();
    assert!(wd >= Duration::from_secs(2) * 3, "{wd:?}");
}

// ----- state show / state reset -----

#[test]
fn state_show_describes_a_good_file_a_damaged_one_and_the_agent_holding_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = run_config(dir.path(), "", "");
    let state = dir.path().join("state.json");
    let out = agent(&["-c", &cfg, "state", "show"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("no file"), "{}", String::from_utf8_lossy(&out.stdout));

    std::fs::write(&state, r#"{"version":1,"originals":{"aaa":100,"bbb":40}}"#).unwrap();
    let out = agent(&["-c", &cfg, "state", "show"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("ok: 2") && text.contains("bbb") && text.contains("no agent"),
        "{text}"
    );

    // Damaged: an unknown version and one bad weight; the good entry is still listed. Exit 1.
    std::fs::write(&state, r#"{"version":99,"originals":{"aaa":100,"bbb":0}}"#).unwrap();
    let out = agent(&["-c", &cfg, "state", "show"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    for want in ["DAMAGED", "version 99", "\"bbb\"", "aaa"] {
        assert!(text.contains(want), "{want:?} missing:\n{text}");
    }
    std::fs::write(&state, "\u{0}garbage").unwrap();
    let text = String::from_utf8_lossy(&agent(&["-c", &cfg, "state", "show"]).stdout).into_owned();
    assert!(text.contains("not JSON"), "{text}");

    // Held by an agent: show names its pid (the lock file holds it), reset refuses.
    let held = qos_agent::state::OriginalWeights::load(Some(&dir.path().join("other.json"))).unwrap();
    let out = agent(&["-c", &cfg, "state", "show", "--state-file", dir.path().join("other.json").to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("pid {}", std::process::id())), "{text}");
    let out = agent(&[
        "-c",
        &cfg,
        "state",
        "reset",
        "--to",
        "100",
        "--state-file",
        dir.path().join("other.json").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("stop it first"), "{}", stderr(&out));
    drop(held);
}

#[test]
fn state_reset_puts_named_cgroups_back_and_rewrites_the_file_keeping_what_reads() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = run_config(dir.path(), "", "");
    let root = dir.path().join("cgroup");
    for c in ["pods/a", "pods/b", "other"] {
        fixture_cgroup(&root.join(c), 0);
        std::fs::write(root.join(c).join("blkio.bfq.weight"), "40\n").unwrap();
    }
    let state = dir.path().join("state.json");
    std::fs::write(&state, r#"{"version":1,"originals":{"keep":300,"bad":"x"}}"#).unwrap();
    let out = agent(&["-c", &cfg, "state", "reset", "--to", "100", "--children-of", "pods", "other"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}\n{text}", stderr(&out));
    for c in ["pods/a", "pods/b", "other"] {
        assert_eq!(std::fs::read_to_string(root.join(c).join("blkio.bfq.weight")).unwrap().trim(), "100", "{c}");
        assert!(text.contains(&format!("{c}: weight 40 -> 100")), "{text}");
    }
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    assert_eq!(v, serde_json::json!({"version": 1, "originals": {"keep": 300}}));
    let backups: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("state.json.bak-"))
        .collect();
    assert_eq!(backups.len(), 1, "the damaged file is kept");
    assert!(std::fs::read_to_string(backups[0].path()).unwrap().contains("\"bad\""));
    // An agent loads the rewritten file.
    assert_eq!(qos_agent::state::OriginalWeights::load(Some(&state)).unwrap().len(), 1);

    // A cgroup outside the root, or a bad weight, is refused before anything is written.
    let out = agent(&["-c", &cfg, "state", "reset", "--to", "100", "../etc"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("../etc"), "{}", stderr(&out));
    let out = agent(&["-c", &cfg, "state", "reset", "--to", "0", "other"]);
    assert!(stderr(&out).contains("--to 0"), "{}", stderr(&out));
}

// ----- systemd notify protocol -----

/// A v1-style fixture cgroup with BFQ files, `read` bytes read so far.
fn fixture_cgroup(dir: &Path, read: u64) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("blkio.bfq.weight"), "100\n").unwrap();
    let stat = format!("7:0 Read {read}\n7:0 Write 0\n7:0 Total {read}\nTotal {read}\n");
    std::fs::write(dir.join("blkio.bfq.io_service_bytes_recursive"), stat).unwrap();
}

/// Each thread of process `pid`: its name and nice value (`/proc/PID/task/TID/stat`, the 19th field).
fn thread_nices(pid: u32) -> Vec<(String, i32)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else { continue };
        let name = stat.split_once('(').and_then(|(_, r)| r.rsplit_once(')')).map_or("", |(n, _)| n).to_string();
        // From field 3 (state) on, so the 19th field is the 17th here.
        let nice = testbed::probe::stat_fields(&stat).get(16).and_then(|n| n.parse().ok()).expect("nice field");
        out.push((name, nice));
    }
    out
}

struct KillOnDrop(Child);

/// Spawns `cmd` (stdout discarded) with its stderr read to the end by a thread, whose result is the log.
fn spawn_draining(cmd: &mut Command) -> (KillOnDrop, std::thread::JoinHandle<String>) {
    let mut child = KillOnDrop(cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap());
    let mut pipe = child.0.stderr.take().unwrap();
    let drain = std::thread::spawn(move || {
        let mut err = String::new();
        pipe.read_to_string(&mut err).unwrap();
        err
    });
    (child, drain)
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Receives datagrams until one contains `what`; returns everything received.
fn expect_message(sock: &UnixDatagram, what: &str, limit: Duration) -> Vec<String> {
    let start = Instant::now();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while start.elapsed() < limit {
        match sock.recv(&mut buf) {
            Ok(n) => {
                let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
                let done = msg.lines().any(|l| l == what);
                seen.push(msg);
                if done {
                    return seen;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(e) => panic!("recv: {e}"),
        }
    }
    panic!("no {what} within {limit:?}; received {seen:?}");
}

#[test]
fn systemd_notify_ready_watchdog_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let notify = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&notify).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let cg = dir.path().join("cgroup/pods");
    fixture_cgroup(&cg.join("web"), 0);
    let cfg = run_config(dir.path(), "runtime = \"cgroup-dir\"\nsample_interval = \"50ms\"", "parent = \"pods\"");
    let check = agent(&["check-config", &cfg]);
    assert!(check.status.success(), "{}", stderr(&check));

    // Drained meanwhile: a debug log filling the pipe would block the agent and stop its watchdog pings.
    let (mut child, drain) =
        spawn_draining(Command::new(BIN).args(["-c", &cfg]).env("NOTIFY_SOCKET", &notify).env("DDISKQOS_LOG", "debug"));
    let before_ready = expect_message(&sock, "READY=1", Duration::from_secs(20));
    assert_eq!(before_ready.len(), 1, "READY=1 is the first message: {before_ready:?}");
    // After READY the first discovery is done: the container already has the top weight.
    assert_eq!(std::fs::read_to_string(cg.join("web/blkio.bfq.weight")).unwrap().trim(), "1000");
    expect_message(&sock, "WATCHDOG=1", Duration::from_secs(5));
    expect_message(&sock, "WATCHDOG=1", Duration::from_secs(5)); // every round, not once
                                                                 // `nice` unset: the default -10, on every thread of the agent (the watcher threads inherit it). Without
                                                                 // CAP_SYS_NICE it cannot be had; the agent says so and runs on.
    let nices = thread_nices(child.0.id());
    let root = nix::unistd::geteuid().is_root();
    if root {
        assert!(!nices.is_empty() && nices.iter().all(|(_, n)| *n == -10), "threads and nice values: {nices:?}");
    }

    // SIGHUP (the unit's ExecReload) re-reads the file; the agent keeps running and sampling.
    let pid = nix::unistd::Pid::from_raw(child.0.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    expect_message(&sock, "WATCHDOG=1", Duration::from_secs(5));
    expect_message(&sock, "WATCHDOG=1", Duration::from_secs(5));

    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    expect_message(&sock, "STOPPING=1", Duration::from_secs(10));
    let status = wait_with_timeout(&mut child.0, Duration::from_secs(10));
    let err = drain.join().unwrap();
    assert!(status.success(), "exit {status:?}: {err}");
    assert!(err.contains("configuration reloaded"), "SIGHUP reloads: {err}");
    if !root {
        assert!(err.contains("cannot set the agent's nice value to -10"), "not root: the agent says so: {err}");
    }
    assert_eq!(
        std::fs::read_to_string(cg.join("web/blkio.bfq.weight")).unwrap().trim(),
        "100",
        "the original weight is back after SIGTERM: {err}"
    );
    assert!(!dir.path().join("agent.sock").exists(), "control socket removed at exit");
}

/// Issue 12's bad-config corpus: for every file, `check-config` and `run` agree. Both refuse it with exit 1, naming
/// the same field; `run` starts nothing (no control socket).
#[test]
fn check_config_and_run_agree_on_the_bad_config_corpus() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    std::fs::create_dir_all(dir.path().join("plain/pods")).unwrap();
    std::fs::write(dir.path().join("precious"), "data").unwrap();
    // The base is a cgroup-dir config over a fixture root that passes every check.
    let good = |replace: &[(&str, &str)], extra: &str| {
        let mut text =
            std::fs::read_to_string(run_config(dir.path(), "runtime = \"cgroup-dir\"", "parent = \"pods\"")).unwrap();
        for (from, to) in replace {
            assert!(text.contains(from), "{from} not in {text}");
            text = text.replace(from, to);
        }
        text + extra
    };
    let long = format!("{d}/{}.sock", "s".repeat(110));
    let cases: Vec<(&str, String, &str)> = vec![
        ("nul-in-path", good(&[("state.json", "sta\\u0000te.json")], ""), "state_file"),
        ("long-socket", good(&[(&format!("{d}/agent.sock"), &long)], ""), "control_socket"),
        ("state-is-dir", good(&[(&format!("{d}/state.json"), &d)], ""), "state_file"),
        ("socket-is-file", good(&[("agent.sock", "precious")], ""), "control_socket"),
        ("socket-is-state", good(&[("agent.sock", "state.json")], ""), "control_socket"),
        (
            "no-docker",
            good(&[("runtime = \"cgroup-dir\"", "runtime = \"docker\"")], "[docker]\nsocket = \"/nonexistent.sock\"\n"),
            "docker.socket",
        ),
        ("no-root", good(&[("cgroup\"", "no-such-root\"")], ""), "cgroup.root"),
        ("plain-root", good(&[("cgroup\"", "plain\"")], ""), "cgroup.root"),
        ("no-parent", good(&[("parent = \"pods\"", "parent = \"no/such\"")], ""), "cgroup.parent"),
        ("unknown-device", good(&[], "[devices]\ncheck = [\"nosuchdisk0\"]\n"), "devices.check[0]"),
    ];
    for (name, text, field) in cases {
        let path = file(dir.path(), &format!("{name}.toml"), &text);
        let check = agent(&["check-config", &path]);
        assert_eq!(check.status.code(), Some(1), "{name}: check-config accepted it:\n{text}");
        assert!(stderr(&check).contains(field), "{name}: check-config does not name {field}: {}", stderr(&check));
        let mut child = Command::new(BIN)
            .args(["-c", &path, "run"])
            .env_remove("NOTIFY_SOCKET")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let status = wait_with_timeout(&mut child, Duration::from_secs(10));
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        assert_eq!(status.code(), Some(1), "{name}: run did not refuse it:\n{err}");
        assert!(err.contains(field), "{name}: run does not name {field}: {err}");
        assert!(!dir.path().join("agent.sock").exists(), "{name}: run left a control socket");
    }
    assert_eq!(std::fs::read_to_string(dir.path().join("precious")).unwrap(), "data", "no file was replaced");
}

// ----- the agent's CPU priority -----

/// The session group (autogroup) process `pid` is in (`/proc/PID/autogroup`): its name ("" for the kernel's root
/// group) and what it says.
fn autogroup_of(pid: u32) -> (String, SessionGroup) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/autogroup")).expect("/proc/PID/autogroup");
    let group =
        qos_agent::priority::parse_session_group(&text).unwrap_or_else(|| panic!("autogroup of {pid}: {text:?}"));
    (text.split_whitespace().next().unwrap_or_default().to_string(), group)
}

/// Which session the agent is started in.
#[derive(Clone, Copy)]
enum Session {
    /// One of its own (`setsid`), as systemd starts a service.
    Own,
    /// A new one led by a shell that starts it (`setsid sh -c '… &'`), as an operator's login shell does.
    Shell,
    /// This test's own, whatever it is (a shell's session group, or the kernel's root group under CI's runner).
    Inherited,
}

/// Runs the agent in `session` on a fixture tree until `done` holds for its pid, then stops it; its pid and log.
fn agent_until(cfg: &str, session: Session, done: impl Fn(u32) -> bool) -> (u32, String, bool) {
    let pidfile = tempfile::NamedTempFile::new().unwrap();
    let mut cmd = match session {
        Session::Own => {
            let mut c = Command::new("setsid");
            c.arg(BIN);
            c
        }
        Session::Shell => {
            let mut c = Command::new("setsid");
            // The shell leads the session and waits for the agent, its child, with which it shares the session.
            c.args(["sh", "-c", "\"$0\" \"$@\" & echo $! > \"$PIDFILE\"; wait $!", BIN]).env("PIDFILE", pidfile.path());
            c
        }
        Session::Inherited => Command::new(BIN),
    };
    let (mut child, drain) =
        spawn_draining(cmd.args(["-c", cfg]).env_remove("NOTIFY_SOCKET").env("DDISKQOS_LOG", "info"));
    let deadline = Instant::now() + testbed::process::patience(Duration::from_secs(20));
    let pid = match session {
        Session::Shell => loop {
            let text = std::fs::read_to_string(pidfile.path()).unwrap();
            if let Ok(pid) = text.trim().parse::<u32>() {
                break pid;
            }
            assert!(Instant::now() < deadline, "the shell never started the agent");
            std::thread::sleep(Duration::from_millis(10));
        },
        Session::Own | Session::Inherited => child.0.id(),
    };
    let mut reached = done(pid);
    while !reached && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        reached = done(pid);
    }
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = wait_with_timeout(&mut child.0, Duration::from_secs(10));
    let log = drain.join().unwrap();
    assert!(status.success(), "exit {status:?}: {log}");
    (pid, log, reached)
}

/// On a kernel that groups sessions (autogroup) a thread's nice value weighs only inside its session: the agent run
/// as a service is, leading a session of its own, gives that session's group its nice value (-10 by default); run
/// inside another program's session it leaves that group alone and says why; in the kernel's root group (the
/// session of a PID 1 that never made one, where CI runs the tests) there is no group to set, and it says so.
#[test]
#[ignore = "needs root and a kernel that groups sessions (autogroup): run ./scripts/test.sh"]
fn a_session_leading_agent_gives_its_session_group_its_nice_value_and_leaves_a_shared_one_alone() {
    let test = "cli::a_session_leading_agent_gives_its_session_group_its_nice_value_and_leaves_a_shared_one_alone";
    let needs =
        [testbed::Need::Root, testbed::Need::Autogroup, testbed::Need::Program("setsid"), testbed::Need::Program("sh")];
    if !testbed::require(test, &needs) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    fixture_cgroup(&dir.path().join("cgroup/pods/web"), 0);
    let cfg = run_config(dir.path(), "runtime = \"cgroup-dir\"\nsample_interval = \"50ms\"", "parent = \"pods\"");
    let sock = dir.path().join("agent.sock");
    let mine = autogroup_of(std::process::id());

    // Its own session (as systemd starts a service): a new group, at the agent's -10 once it runs.
    let name = std::cell::RefCell::new(String::new());
    let (_, log, reached) = agent_until(&cfg, Session::Own, |pid| {
        let (group, now) = autogroup_of(pid);
        *name.borrow_mut() = group;
        now == SessionGroup::Nice(-10)
    });
    assert!(reached, "the agent's own session group never read nice -10: {log}");
    assert!(log.contains("session group (autogroup) set to the agent's nice value"), "{log}");
    assert_ne!(*name.borrow(), mine.0, "a group of its own");

    // A shell's session: the shell's group, a new one at 0, is left at 0 once the agent runs, and the log says why.
    let seen = std::cell::Cell::new(None);
    let (_, log, reached) = agent_until(&cfg, Session::Shell, |pid| {
        sock.exists() && {
            seen.set(Some(autogroup_of(pid).1));
            true
        }
    });
    assert!(reached, "the agent never started: {log}");
    assert!(log.contains("the agent shares its session"), "{log}");
    assert_eq!(seen.get(), Some(SessionGroup::Nice(0)), "the shell's session group is left at its value");

    // This test's session: left as it is, and the log says why.
    let (_, log, reached) = agent_until(&cfg, Session::Inherited, |_| sock.exists());
    assert!(reached, "the agent never started: {log}");
    match mine.1 {
        SessionGroup::Root => assert!(log.contains("runs in the kernel's root scheduling group"), "{log}"),
        SessionGroup::Nice(_) => assert!(log.contains("the agent shares its session"), "{log}"),
        SessionGroup::Off => panic!("autogroup off, yet required on"),
    }
    assert_eq!(autogroup_of(std::process::id()), mine, "this test's session group is as it was");
}
