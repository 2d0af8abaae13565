//! `ddiskqos-agent`: thin binary over the `qos_agent` library.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand};
use qos_agent::blockdev::tune::LeftSettings;
use qos_agent::config::{ActuatorMode, AgentConfig};

mod app;

/// The binary's name: in `--version`, the man pages' names and the completion scripts.
const BIN: &str = "ddiskqos-agent";

/// dDiskQoS agent: gives containers block-I/O weights by a multi-level feedback queue over their I/O.
#[derive(Debug, Parser)]
#[command(name = BIN, version, about)]
struct Cli {
    /// TOML config file; without one the embedded defaults (the paper's) are used.
    #[arg(short, long, global = true, env = "DDISKQOS_CONFIG")]
    config: Option<PathBuf>,
    /// Decide and log, but write no weight.
    #[arg(long)]
    dry_run: bool,
    /// How weights are applied.
    #[arg(long, value_enum)]
    actuator: Option<ActuatorMode>,
    /// Time between sampling rounds, e.g. 500ms.
    #[arg(long, value_parser = parse_duration)]
    sample_interval: Option<Duration>,
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9477).
    #[arg(long)]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Docker API socket.
    #[arg(long)]
    docker_socket: Option<PathBuf>,
    /// Log as JSON lines instead of text.
    #[arg(long)]
    log_json: bool,
    #[command(subcommand)]
    command: Option<Cmd>,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the agent (the default).
    Run,
    /// Check a config file as `run` would before starting (rules, paths, sockets, cgroup root, devices) and exit
    /// non-zero naming the field and value at fault; what only the running runtime can answer is listed as not
    /// checked.
    CheckConfig {
        /// The file (defaults to --config).
        file: Option<PathBuf>,
        /// Check only the file itself (syntax and rules), not this host.
        #[arg(long)]
        syntax_only: bool,
    },
    /// Opt-in io.cost set-up (cgroup v2): measure a block device and print, or with --apply write, its
    /// io.cost.model and io.cost.qos lines. (The running agent enables io.cost only on the devices it manages, by
    /// `[devices] protect`, and turns it off at stop.)
    Iocost {
        /// The block device, e.g. /dev/sdb or /dev/loop3 (read, never written).
        device: PathBuf,
        /// Seconds per measurement.
        #[arg(long, default_value_t = 3)]
        seconds: u64,
        /// Threads issuing I/O at once (queue depth).
        #[arg(long, default_value_t = 16)]
        jobs: usize,
        /// An existing file of at least 64 MiB on the device, overwritten to measure writes (without one the write
        /// coefficients are taken equal to the read ones).
        #[arg(long)]
        write_file: Option<PathBuf>,
        /// Read-latency target at the 95th percentile, e.g. 2ms (default: 5 x the device's median lone 4 KiB
        /// read, at least 2ms).
        #[arg(long, value_parser = parse_duration)]
        rlat: Option<Duration>,
        /// Write the lines into the cgroup v2 root (else only print them).
        #[arg(long)]
        apply: bool,
    },
    /// Print the running agent's table: container, level, weight, bytes and time at level.
    Status {
        /// Control socket (defaults to the config's control_socket).
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Inspect or repair the state file (the original weights a restarted agent restores).
    State {
        #[command(subcommand)]
        action: StateCmd,
    },
    /// The device settings the agent makes (protection by default, bfq_tunables).
    Devices {
        #[command(subcommand)]
        action: DevicesCmd,
    },
    /// Print the completion script for SHELL, e.g. `ddiskqos-agent completions bash >
    /// /usr/share/bash-completion/completions/ddiskqos-agent`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff; read it with `ddiskqos-agent man | man -l -`), or with --dir write it and one
    /// page per subcommand into DIR (ddiskqos-agent.1, ddiskqos-agent-status.1, ...), as the package installs them.
    Man {
        /// Write every page into this directory (it must exist) and print their paths, instead of printing the
        /// top page.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum DevicesCmd {
    /// With the agent stopped (e.g. when uninstalling after it was killed): put back every device setting whose
    /// original an agent recorded in <state_file>.bfq-tunables.json, then remove that file. A clean stop of the
    /// agent does this itself.
    Restore {
        /// The state file (defaults to the config's state_file).
        #[arg(long)]
        state_file: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum StateCmd {
    /// Print what the state file holds, or what is wrong with it, and whether an agent holds it. Exit 1 if an
    /// agent would refuse it.
    Show {
        /// The state file (defaults to the config's state_file).
        #[arg(long)]
        state_file: Option<PathBuf>,
    },
    /// With the agent stopped: put the named cgroups' block-I/O weight back to --to, and rewrite the state file
    /// keeping only the entries that still read (the old file is kept as <state_file>.bak-<seconds>).
    Reset {
        /// The weight to write, 1..=1000 (e.g. the runtime's default: 500 for Docker on cgroup v1 blkio, 100 for BFQ).
        #[arg(long)]
        to: u64,
        /// Cgroups to put back, relative to the cgroup root (e.g. docker/<id>, system.slice/docker-<id>.scope).
        cgroups: Vec<String>,
        /// Also every child cgroup of this one (e.g. docker), relative to the cgroup root; repeatable.
        #[arg(long)]
        children_of: Vec<String>,
        /// Write an empty state file instead of keeping the entries that still read.
        #[arg(long)]
        forget_all: bool,
        /// The state file (defaults to the config's state_file).
        #[arg(long)]
        state_file: Option<PathBuf>,
    },
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    qos_core::units::parse_duration(s)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match real_main(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ddiskqos-agent: error: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, `: `-separated. A cause the message before it already ends with is skipped: several
/// errors (config file, state file) show their source in their own message, and `{e:#}` would print it twice.
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// What the command line sets over the config file (again at every reload).
fn overrides(cli: &Cli) -> app::Overrides {
    app::Overrides {
        dry_run: cli.dry_run,
        actuator: cli.actuator,
        sample_interval: cli.sample_interval,
        metrics_listen: cli.metrics_listen,
        docker_socket: cli.docker_socket.clone(),
    }
}

fn load(cli: &Cli) -> anyhow::Result<AgentConfig> {
    overrides(cli).load(cli.config.as_deref())
}

fn real_main(cli: Cli) -> anyhow::Result<ExitCode> {
    match &cli.command {
        Some(Cmd::Completions { shell }) => {
            let mut script = Vec::new();
            clap_complete::generate(*shell, &mut Cli::command(), BIN, &mut script);
            if *shell == clap_complete::Shell::Bash {
                script = fix_bash_states(script);
            }
            write_stdout(&script)
        }
        Some(Cmd::Man { dir: None }) => {
            let mut page = Vec::new();
            clap_mangen::Man::new(Cli::command().disable_help_subcommand(true)).render(&mut page)?;
            write_stdout(&page)
        }
        Some(Cmd::Man { dir: Some(dir) }) => {
            for path in man_pages(Cli::command(), dir)? {
                println!("{}", path.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(Cmd::CheckConfig { file, syntax_only }) => {
            let Some(path) = file.as_ref().or(cli.config.as_ref()) else {
                anyhow::bail!("check-config needs a file (argument or --config)");
            };
            let cfg = AgentConfig::load(path)?;
            if *syntax_only {
                println!("{}: ok", path.display());
                return Ok(ExitCode::SUCCESS);
            }
            let checked =
                qos_agent::ops::preflight::check(&cfg).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            println!("{}: ok", path.display());
            for change in checked.device_changes {
                println!("at start: {change}");
            }
            for what in checked.not_checked {
                println!("not checked (needs the running runtime): {what}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(Cmd::Iocost { device, seconds, jobs, write_file, rlat, apply }) => {
            iocost(device, *seconds, *jobs, write_file.clone(), *rlat, *apply)
        }
        Some(Cmd::Status { socket }) => {
            let path = match socket {
                Some(s) => s.clone(),
                None => load(&cli)?.control_socket,
            };
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let status = rt.block_on(qos_agent::ops::control::fetch(&path)).map_err(anyhow::Error::msg)?;
            print!("{}", qos_agent::ops::control::render(&status));
            Ok(ExitCode::SUCCESS)
        }
        Some(Cmd::State { action }) => state_cmd(&cli, action),
        Some(Cmd::Devices { action: DevicesCmd::Restore { state_file } }) => {
            let cfg = load(&cli)?;
            init_tracing(cli.log_json);
            let path = state_file.clone().unwrap_or_else(|| cfg.state_file.clone());
            if let Some(pid) = qos_agent::state::inspect(&path).ok().and_then(|f| f.holder) {
                anyhow::bail!(
                    "{} is held by a running agent (pid {pid}): stop it (it restores the devices)",
                    path.display()
                );
            }
            let root = qos_agent::ops::preflight::cgroup_root(&cfg)?;
            let v2 = (root.version() == qos_agent::cgroup::CgroupVersion::V2).then(|| root.path().to_path_buf());
            match qos_agent::blockdev::tune::restore_left_settings(v2.as_deref(), &path)? {
                LeftSettings::PutBack { file, count, failed } => {
                    println!("{}: {} of {count} device setting(s) put back", file.display(), count - failed);
                    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
                }
                LeftSettings::None { file } => {
                    println!("{}: no such file: no device setting to put back", file.display());
                    Ok(ExitCode::SUCCESS)
                }
                _ => Ok(ExitCode::FAILURE),
            }
        }
        None | Some(Cmd::Run) => {
            let cfg = load(&cli)?;
            init_tracing(cli.log_json);
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let summary = rt.block_on(app::run(cfg, cli.config.clone(), overrides(&cli)))?;
            Ok(if summary.restore_failures == 0 { ExitCode::SUCCESS } else { ExitCode::from(3) })
        }
    }
}

/// clap_complete's bash script (4.6.11) spells the state of a subcommand two ways when the binary's name has a
/// hyphen: its loop sets `ddiskqos__agent__subcmd__state`, its case arms test `ddiskqos__subcmd__agent__subcmd__state`,
/// so nothing past the first word ever completes (clap-rs/clap#6421, open). The arms are respelled as the loop spells
/// them; once clap_complete is fixed this changes nothing (the test `cli::completions_are_written_for_each_shell_
/// and_bash_completes_the_subcommands` completes `state <TAB>` through bash either way).
fn fix_bash_states(script: Vec<u8>) -> Vec<u8> {
    String::from_utf8_lossy(&script).replace("ddiskqos__subcmd__agent", "ddiskqos__agent").into_bytes()
}

/// Writes generated text to stdout; a closed pipe is an error, not a panic.
fn write_stdout(bytes: &[u8]) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(bytes).and_then(|()| out.flush()).map_err(|e| anyhow::anyhow!("writing to stdout: {e}"))?;
    Ok(ExitCode::SUCCESS)
}

/// Writes the man page of `cmd` and of each visible subcommand, nested ones too (`ddiskqos-agent-state-show.1`),
/// into `dir`; returns their paths, the top page first.
fn man_pages(cmd: clap::Command, dir: &std::path::Path) -> anyhow::Result<Vec<PathBuf>> {
    fn each(cmd: clap::Command, dir: &std::path::Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
        let subcommands: Vec<clap::Command> = cmd.get_subcommands().filter(|c| !c.is_hide_set()).cloned().collect();
        out.push(clap_mangen::Man::new(cmd).generate_to(dir)?);
        for sub in subcommands {
            each(sub, dir, out)?;
        }
        Ok(())
    }
    // Built first, so that each subcommand's page is named and titled by its full name (ddiskqos-agent-state-show).
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let mut out = Vec::new();
    each(cmd, dir, &mut out).map_err(|e| anyhow::anyhow!("writing man pages into {}: {e}", dir.display()))?;
    Ok(out)
}

fn state_cmd(cli: &Cli, action: &StateCmd) -> anyhow::Result<ExitCode> {
    use qos_agent::state;
    let cfg = load(cli)?;
    match action {
        StateCmd::Show { state_file } => {
            let path = state_file.clone().unwrap_or(cfg.state_file);
            let found = state::inspect(&path)?;
            match &found.holder {
                Some(pid) => println!("{}: held by a running agent (pid {pid})", path.display()),
                None => println!("{}: no agent holds it", path.display()),
            }
            if !found.exists {
                println!("no file: no original weight is owed to any container");
                return Ok(ExitCode::SUCCESS);
            }
            if found.problems.is_empty() {
                println!("ok: {} container(s) owed their original weight", found.originals.len());
            } else {
                println!("DAMAGED: an agent refuses this file:");
                for p in &found.problems {
                    println!("  - {p}");
                }
                println!(
                    "{} entr(y/ies) still read; `ddiskqos-agent state reset --to N [CGROUP...]` keeps them",
                    found.originals.len()
                );
            }
            if !found.originals.is_empty() {
                println!("{:<66} ORIGINAL", "CONTAINER");
                for (id, w) in &found.originals {
                    println!("{:<66} {w}", id.as_str());
                }
            }
            Ok(if found.problems.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        StateCmd::Reset { to, cgroups, children_of, forget_all, state_file } => {
            let weight = qos_core::Weight::new(*to).map_err(|e| anyhow::anyhow!("--to {to}: {e}"))?;
            let path = state_file.clone().unwrap_or_else(|| cfg.state_file.clone());
            let root = qos_agent::ops::preflight::cgroup_root(&cfg)?;
            let reset = state::reset::Reset {
                state_file: path.clone(),
                weight,
                cgroups: cgroups.clone(),
                children_of: children_of.clone(),
                forget_all: *forget_all,
            };
            let done = state::reset::reset(&root, &reset)?;
            match &done.backup {
                Some(b) => println!(
                    "{}: rewritten with {} entr(y/ies); the old file is {}",
                    path.display(),
                    done.kept,
                    b.display()
                ),
                None => println!("{}: written with {} entr(y/ies)", path.display(), done.kept),
            }
            for (rel, before, result) in &done.cgroups {
                let before = before.map(|w| w.to_string()).unwrap_or_else(|| "?".into());
                match result {
                    Ok(()) => println!("{rel}: weight {before} -> {weight}"),
                    Err(e) => eprintln!("{rel}: cannot write weight {weight}: {e}"),
                }
            }
            Ok(if done.failed() == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
    }
}

fn iocost(
    device: &std::path::Path,
    seconds: u64,
    jobs: usize,
    write_file: Option<PathBuf>,
    rlat: Option<Duration>,
    apply: bool,
) -> anyhow::Result<ExitCode> {
    use anyhow::Context;
    use qos_agent::blockdev::iocost::{self, Calibration, SetUp};
    let calibration = Calibration { duration: Duration::from_secs(seconds), jobs, write_file };
    let setup = SetUp { device: device.to_owned(), calibration, rlat, apply }.prepare()?;
    let root = if apply {
        let root = qos_agent::cgroup::CgroupRoot::detect().context("finding the cgroup v2 root")?;
        if root.version() != qos_agent::cgroup::CgroupVersion::V2 {
            anyhow::bail!(
                "io.cost needs the io controller on cgroup v2; this host has it on v1 ({})",
                root.path().display()
            );
        }
        Some(root)
    } else {
        None
    };
    let (dev, disk) = (setup.dev, &setup.disk);
    eprintln!("measuring {} ({dev}, disk {disk}) for about {}s ...", device.display(), setup.about().as_secs());
    let result = setup.measure()?;
    println!("measured: {}", result.measured);
    let (model_line, qos_line) = (&result.model_line, &result.qos_line);
    match root {
        None => {
            println!("io.cost.model: {model_line}");
            println!("io.cost.qos:   {qos_line}");
            println!("(not applied: run again with --apply, on a cgroup v2 host, to write them)");
        }
        Some(root) => {
            setup.apply(root.path(), &result)?;
            println!("wrote {}: {model_line}", root.path().join(iocost::IO_COST_MODEL).display());
            println!("wrote {}: {qos_line}", root.path().join(iocost::IO_COST_QOS).display());
            println!("io.weight now divides {disk} among cgroups. To undo:");
            for (line, file) in iocost::undo_lines(dev) {
                println!("  echo \"{line}\" > {}", root.path().join(file).display());
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn init_tracing(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("DDISKQOS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // No colour codes in the journal or a log file, only on a terminal.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}
