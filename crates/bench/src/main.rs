//! # ddiskqos-bench
//!
//! Replays the dDiskQoS paper's experiments (Tables 3-5) on this machine: a loop device with BFQ, a background
//! stream, foreground readers as new cgroups or containers, and three variants per case (Alone, Original,
//! dDiskQoS with the shipped agent's daemon applying weights), four with `run --static-best` (the static-best
//! weights set at each container's creation). See the crate README.
//!
//! ## Layout
//! - `cli`: flags; `app`: the `run` command end to end; `sweep`: the knob sweep.
//! - `disk` (and `throttled`, the default device), `files`, `cleanup`: the device, the test files, the undo stack
//!   (also on Ctrl-C).
//! - `workload`: the experiments as data; `runner`: one BFQ mode; `runtime/`: cgroup, Docker and CRI (pod) readers;
//!   `static_best`: the static-best variant's weights, set at creation and read back.
//! - `agent`: the shipped agent's daemon (`qos_agent::daemon::Daemon`) with the agent's own backends, driving the
//!   weights; the bench only reads weight files.
//! - `reader`: the reader processes (hidden subcommands); `stats`, `report/` (its `data.rs`: the results as data): results and output.

mod agent;
mod app;
mod cleanup;
mod cli;
mod dashboard;
mod disk;
mod files;
mod hogs;
mod reader;
mod report;
mod runner;
mod runtime;
mod session;
mod static_best;
mod stats;
mod sweep;
mod sys;
mod throttled;
mod workload;

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;

use crate::cli::{Cli, Cmd};

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The agent's warnings, and what its assembly did to the device (protection's plan and what it measured
    // there), land in every run's log; `RUST_LOG` says otherwise.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,qos_agent::agent=info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    match dispatch(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(cmd: Cmd) -> Result<()> {
    match cmd {
        Cmd::Run(args) => {
            let _guard = cleanup::Guard::install();
            app::run(&args, cleanup::Cleanup::global()).map(|_| ())
        }
        Cmd::Soak(args) => {
            let _guard = cleanup::Guard::install();
            app::soak(&args, cleanup::Cleanup::global()).map(|_| ())
        }
        Cmd::Sweep(args) => {
            let _guard = cleanup::Guard::install();
            sweep::run(&args, cleanup::Cleanup::global())
        }
        Cmd::Dashboard { scrapes, dashboard, out, rate_interval, step } => {
            let text = if scrapes.extension().is_some_and(|e| e == "gz") {
                let child = std::process::Command::new("gzip")
                    .arg("-dc")
                    .arg(&scrapes)
                    .output()
                    .with_context(|| format!("gzip -dc {}", scrapes.display()))?;
                anyhow::ensure!(
                    child.status.success(),
                    "gzip -dc {}: {}",
                    scrapes.display(),
                    String::from_utf8_lossy(&child.stderr)
                );
                child.stdout
            } else {
                std::fs::read(&scrapes).with_context(|| format!("cannot read {}", scrapes.display()))?
            };
            let text = String::from_utf8(text).with_context(|| format!("{}: not UTF-8", scrapes.display()))?;
            let store = dashboard::parse_scrapes(&text, &scrapes.display().to_string())?;
            let json =
                std::fs::read_to_string(&dashboard).with_context(|| format!("cannot read {}", dashboard.display()))?;
            let panels = dashboard::panels(&json, &dashboard.display().to_string())?;
            let title = format!(
                "{} from {} (rate interval {rate_interval})",
                dashboard.file_name().unwrap_or_default().to_string_lossy(),
                scrapes.file_name().unwrap_or_default().to_string_lossy()
            );
            dashboard::render(&panels, &store, &rate_interval, step, &title, &out)?;
            println!("dashboard: {} ({} panels)", out.display(), panels.len());
            Ok(())
        }
        Cmd::Report { json, out } => {
            let mut run = report::json::read(&json)?;
            report::json::check_consistency(&run)?;
            report::json::complete(&mut run);
            let dir = out.unwrap_or_else(|| json.parent().map(|p| p.to_path_buf()).unwrap_or_default());
            print!("{}", report::table::render(&run));
            std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
            let (svg, png) = (dir.join("chart.svg"), dir.join("chart.png"));
            report::chart::write(&run, &svg, &png)?;
            println!("chart: {} and {}", svg.display(), png.display());
            Ok(())
        }
        Cmd::ReadFile { cgroup, wait_for, go_fifo, result, path } => {
            let r = match (go_fifo, path) {
                (Some(fifo), _) => {
                    if let Some(dir) = &cgroup {
                        reader::join_cgroup(dir)?;
                    }
                    let (path, waited) = reader::path_from_fifo(&fifo)?;
                    reader::read_direct(&path, waited, reader::BLOCK)?
                }
                (None, Some(path)) => reader::read_file(&path, cgroup.as_deref(), wait_for.as_deref(), reader::BLOCK)?,
                (None, None) => anyhow::bail!("read-file needs a PATH or --go-fifo"),
            };
            match result {
                Some(file) => reader::write_report(&r, &file)?,
                None => println!("{}", serde_json::to_string(&r)?),
            }
            Ok(())
        }
        Cmd::Stream { cgroup, threads, path } => reader::stream(&path, cgroup.as_deref(), threads, reader::BLOCK),
        Cmd::HoldDisk { disk, size_mib } => {
            let _guard = cleanup::Guard::install();
            app::hold_disk(&disk, size_mib, cleanup::Cleanup::global())
        }
        Cmd::ExecIn { cgroup, argv } => reader::exec_in(&cgroup, &argv),
        Cmd::Spin { parent } => hogs::spin(parent),
    }
}
