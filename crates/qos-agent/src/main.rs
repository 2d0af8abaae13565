//! `ddiskqos-agent`: thin binary over the `qos_agent` library.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use qos_agent::config::{ActuatorMode, AgentConfig};

/// dDiskQoS agent: gives containers block-I/O weights by a multi-level feedback queue over their I/O.
#[derive(Debug, Parser)]
#[command(version, about)]
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
    /// Validate a config file and exit non-zero naming the field and value at fault.
    CheckConfig {
        /// The file (defaults to --config).
        file: Option<PathBuf>,
    },
    /// Print the running agent's table: container, level, weight, bytes and time at level.
    Status {
        /// Control socket (defaults to the config's control_socket).
        #[arg(long)]
        socket: Option<PathBuf>,
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

fn load(cli: &Cli) -> anyhow::Result<AgentConfig> {
    let mut cfg = match &cli.config {
        Some(p) => AgentConfig::load(p)?,
        None => AgentConfig::default(),
    };
    if cli.dry_run {
        cfg.dry_run = true;
    }
    if let Some(a) = cli.actuator {
        cfg.actuator = a;
    }
    if let Some(d) = cli.sample_interval {
        cfg.sample_interval = d;
    }
    if let Some(l) = cli.metrics_listen {
        cfg.metrics.enabled = true;
        cfg.metrics.listen = l;
    }
    if let Some(s) = &cli.docker_socket {
        cfg.docker.socket = s.clone();
    }
    cfg.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(cfg)
}

fn real_main(cli: Cli) -> anyhow::Result<ExitCode> {
    match &cli.command {
        Some(Cmd::CheckConfig { file }) => {
            let Some(path) = file.as_ref().or(cli.config.as_ref()) else {
                anyhow::bail!("check-config needs a file (argument or --config)");
            };
            AgentConfig::load(path)?;
            println!("{}: ok", path.display());
            Ok(ExitCode::SUCCESS)
        }
        Some(Cmd::Status { socket }) => {
            let path = match socket {
                Some(s) => s.clone(),
                None => load(&cli)?.control_socket,
            };
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let status = rt.block_on(qos_agent::control::fetch(&path)).map_err(anyhow::Error::msg)?;
            print!("{}", qos_agent::control::render(&status));
            Ok(ExitCode::SUCCESS)
        }
        None | Some(Cmd::Run) => {
            let cfg = load(&cli)?;
            init_tracing(cli.log_json);
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let summary = rt.block_on(qos_agent::app::run(cfg, cli.config.clone()))?;
            Ok(if summary.restore_failures == 0 { ExitCode::SUCCESS } else { ExitCode::from(3) })
        }
    }
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
