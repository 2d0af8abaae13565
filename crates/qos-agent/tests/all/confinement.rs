//! Confinement: the agent writes only the weight files of the containers it manages, under the cgroup root it
//! was given; paths that would lead outside (`..`, absolute paths, symlinks) are refused; the metrics endpoint
//! listens on loopback unless configured otherwise. Fixture trees need no root; the loopback check runs the
//! agent binary on a fixture too.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::Duration;

use qos_agent::cgroup::{CgroupError, CgroupRoot, CgroupVersion};
use qos_agent::runtime::docker::{container_cgroup, CgroupDriver};
use testbed::agent::Agent;
use testbed::probe::{scrape, status};
use testbed::process::wait_for;

use crate::AGENT;

/// What a path is, for a before/after comparison: file content, symlink target, or a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    Dir,
    File(Vec<u8>),
    Link(PathBuf),
}

/// Every entry under `top`, not following symlinks.
fn snapshot(top: &Path) -> BTreeMap<PathBuf, Entry> {
    let mut out = BTreeMap::new();
    let mut stack = vec![top.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            let t = e.file_type().unwrap();
            let entry = if t.is_symlink() {
                Entry::Link(fs::read_link(&p).unwrap())
            } else if t.is_dir() {
                stack.push(p.clone());
                Entry::Dir
            } else {
                Entry::File(fs::read(&p).unwrap())
            };
            out.insert(p.strip_prefix(top).unwrap().to_path_buf(), entry);
        }
    }
    out
}

/// Paths whose entry differs between two snapshots (added, removed or changed).
fn changed(a: &BTreeMap<PathBuf, Entry>, b: &BTreeMap<PathBuf, Entry>) -> Vec<PathBuf> {
    let mut keys: Vec<&PathBuf> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter().filter(|k| a.get(*k) != b.get(*k)).cloned().collect()
}

fn v1_cgroup(dir: &Path) {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join("blkio.bfq.weight"), "100\n").unwrap();
    fs::write(dir.join("blkio.bfq.io_service_bytes_recursive"), "Total 0\n").unwrap();
    fs::write(dir.join("blkio.bfq.weight_device"), "default 100\n").unwrap();
    fs::write(dir.join("cgroup.procs"), "").unwrap();
}

/// A fixture tree with decoys everywhere a confused agent might write: the root's and the parent's own files, a
/// sibling hierarchy, a grandchild, a child that is a symlink to a directory outside the root, a symlink to a
/// sibling inside the root, a plain file among the children, and a directory outside the root.
fn decoy_tree(tmp: &Path) -> PathBuf {
    let root = tmp.join("root");
    v1_cgroup(&root); // a real v1 root has no weight file: a decoy
    v1_cgroup(&root.join("ctr"));
    v1_cgroup(&root.join("other/x"));
    for c in ["c1", "c2", "c3", "c4"] {
        v1_cgroup(&root.join("ctr").join(c));
    }
    v1_cgroup(&root.join("ctr/c2/nested"));
    v1_cgroup(&tmp.join("outside/victim"));
    symlink(tmp.join("outside/victim"), root.join("ctr/evil")).unwrap();
    symlink(root.join("other/x"), root.join("ctr/sibling")).unwrap();
    fs::write(root.join("ctr/not-a-dir"), "100\n").unwrap();
    root
}

fn config(root: &Path, extra: &str) -> String {
    format!(
        r#"
runtime = "cgroup-dir"
sample_interval = "50ms"
state_file = "{{dir}}/state.json"
control_socket = "{{dir}}/agent.sock"
[cgroup]
root = "{root}"
parent = "ctr"
[mlfq]
boost_after = "1h"
idle_promote_after = "off"
{extra}
"#,
        root = root.display()
    )
}

/// Runs the agent over the decoy tree: while it runs only `ctr/c*/blkio.bfq.weight_device` (v1 BFQ's per-device
/// file, which the writer plans with, as the kernel's cgroups have it) differ from before; the
/// symlinked child, the sibling, the grandchild, the parent, the root and the directory outside are never
/// touched; after SIGTERM the whole tree (and the outside) is byte for byte what it was.
#[test]
fn agent_writes_only_weight_files_of_its_containers() {
    let tmp = tempfile::tempdir().unwrap();
    let root = decoy_tree(tmp.path());
    let before = snapshot(tmp.path());
    let mut agent = Agent::start(AGENT, &config(&root, ""));
    let weight = |c: &str| fs::read_to_string(root.join("ctr").join(c).join("blkio.bfq.weight_device")).unwrap();
    let managed = wait_for(Duration::from_secs(5), Duration::from_millis(20), || {
        ["c1", "c2", "c3", "c4"].iter().all(|c| weight(c) == "default 1000\n").then_some(())
    });
    assert!(managed.is_some(), "containers not managed:\n{}", agent.log_text());
    // A demotion too, so that more than one value is written.
    std::thread::sleep(Duration::from_millis(200));
    fs::write(root.join("ctr/c1/blkio.bfq.io_service_bytes_recursive"), "8:0 Read 3145728\n").unwrap();
    let demoted =
        wait_for(Duration::from_secs(5), Duration::from_millis(20), || (weight("c1") == "default 200\n").then_some(()));
    assert!(demoted.is_some(), "c1 not demoted:\n{}", agent.log_text());

    let table = status(&agent.socket()).expect("status");
    let mut names: Vec<String> = table.containers.iter().map(|r| r.name.clone()).collect();
    names.sort();
    assert_eq!(names, ["c1", "c2", "c3", "c4"], "only real child directories are containers");

    let during = snapshot(tmp.path());
    let mut diff = changed(&before, &during);
    diff.retain(|p| !p.starts_with("root/ctr/c1/blkio.bfq.io_service_bytes_recursive"));
    let allowed: Vec<PathBuf> = ["c1", "c2", "c3", "c4"]
        .iter()
        .map(|c| Path::new("root/ctr").join(c).join("blkio.bfq.weight_device"))
        .collect();
    assert_eq!(diff, allowed, "files changed while the agent ran");

    let code = agent.stop();
    assert!(code.success(), "agent exit {code:?}\n{}", agent.log_text());
    fs::write(root.join("ctr/c1/blkio.bfq.io_service_bytes_recursive"), "Total 0\n").unwrap();
    let after = snapshot(tmp.path());
    assert_eq!(changed(&before, &after), Vec::<PathBuf>::new(), "tree not as it was after the agent stopped");
}

/// Container ids and cgroup paths that would lead outside the root are refused, whichever way they arrive: a
/// Docker id, a `--cgroup-parent`, a systemd slice, a `/proc/PID/cgroup` line, a relative path; a symlink on the
/// way is refused even when it points inside the root.
#[test]
fn paths_leading_outside_the_root_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let root_dir = decoy_tree(tmp.path());
    let id = "0123456789abcdef".repeat(4);
    v1_cgroup(&root_dir.join("docker").join(&id));
    let root = CgroupRoot::from_dir(CgroupVersion::V1, &root_dir).unwrap();
    let refused = |r: Result<qos_agent::cgroup::CgroupDir, CgroupError>, what: &str| match r {
        Err(CgroupError::OutsideRoot { .. } | CgroupError::InvalidName(_)) => {}
        other => panic!("{what}: {other:?}"),
    };
    let cgroupfs = CgroupDriver::Cgroupfs;
    assert!(container_cgroup(&root, &id, cgroupfs, None).is_ok());
    for bad in [
        format!("../../outside/{}", &id[..50]),
        format!("{}/..", &id[..61]),
        id.to_uppercase(),
        id[..12].to_string(),
        format!("{id}/"),
        format!("/{}", &id[1..]),
    ] {
        refused(container_cgroup(&root, &bad, cgroupfs, None), &bad);
    }
    for parent in ["/../outside", "/docker/../..", "../..", "/ctr/evil"] {
        refused(container_cgroup(&root, &id, cgroupfs, Some(parent)), parent);
    }
    for slice in ["../x.slice", "a-..-b.slice", "a/b.slice", "x"] {
        refused(container_cgroup(&root, &id, CgroupDriver::Systemd, Some(slice)), slice);
    }
    let proc = Path::new("/proc/1/cgroup");
    for text in ["7:blkio:/../outside/victim\n", "7:blkio:/ctr/../../outside\n", "7:blkio:/ctr/evil\n"] {
        refused(root.resolve_proc_cgroup(proc, text.as_bytes()), text);
    }
    assert_eq!(
        root.resolve_proc_cgroup(proc, b"7:blkio:/ctr/c1\n").unwrap().path(),
        root_dir.canonicalize().unwrap().join("ctr/c1")
    );
    for rel in ["ctr/evil", "ctr/sibling", "ctr/evil/../c1", "/ctr/c1", "ctr/../../outside"] {
        refused(root.resolve_relative(rel), rel);
    }
    // A root given through a symlink is used as its real path, so nothing below it is reached through a link.
    symlink(&root_dir, tmp.path().join("root-link")).unwrap();
    let via_link = CgroupRoot::from_dir(CgroupVersion::V1, tmp.path().join("root-link")).unwrap();
    assert_eq!(via_link.path(), root_dir.canonicalize().unwrap());
}

/// The listening sockets on `port` from /proc/net/tcp and tcp6: (local address as hex, is IPv6).
fn listeners(port: u16) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    for (file, v6) in [("/proc/net/tcp", false), ("/proc/net/tcp6", true)] {
        for line in fs::read_to_string(file).unwrap_or_default().lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state)) = (f.get(1), f.get(3)) else { continue };
            let Some((addr, p)) = local.split_once(':') else { continue };
            if *state == "0A" && u16::from_str_radix(p, 16) == Ok(port) {
                out.push((addr.to_string(), v6));
            }
        }
    }
    out
}

/// This machine's first global IPv4 address, if it has one.
fn non_loopback_ipv4() -> Option<std::net::Ipv4Addr> {
    let out = std::process::Command::new("ip").args(["-4", "-o", "addr", "show", "scope", "global"]).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().skip_while(|w| *w != "inet").nth(1)?.split('/').next()?.parse().ok()
}

/// With `[metrics] enabled = true` and no address, the endpoint listens on 127.0.0.1:9477 only: /proc/net/tcp
/// shows no wildcard or other listener on that port, and connecting through the machine's own non-loopback
/// address is refused while loopback answers.
#[test]
fn metrics_listen_on_loopback_only_by_default() {
    let default = qos_agent::config::AgentConfig::default().metrics;
    assert!(!default.enabled, "metrics must be off by default");
    assert_eq!(default.listen, std::net::SocketAddr::from(([127, 0, 0, 1], 9477)));
    let port = default.listen.port();
    assert!(listeners(port).is_empty(), "port {port} already in use here: {:?}", listeners(port));

    let tmp = tempfile::tempdir().unwrap();
    let root = decoy_tree(tmp.path());
    let agent = Agent::start(AGENT, &config(&root, "[metrics]\nenabled = true\n"));
    let l = listeners(port);
    assert_eq!(l, [("0100007F".to_string(), false)], "listeners on {port}: {l:?}\n{}", agent.log_text());
    let body = scrape(default.listen).expect("metrics on loopback");
    assert!(body.contains("ddiskqos_containers 4"), "{body}");
    match non_loopback_ipv4() {
        Some(ip) => {
            let addr = std::net::SocketAddr::from((ip, port));
            let r = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2));
            assert!(r.is_err(), "metrics reachable through {addr}");
        }
        None => eprintln!("note: no global IPv4 address here; checked /proc/net/tcp only"),
    }
    drop(agent);
}
