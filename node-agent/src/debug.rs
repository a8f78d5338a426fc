//! The node-level debug CLI: what the plugin captured on this node, the live rules with counters,
//! drift against the desired rules, and the health of the installation. Human tables by default,
//! JSON for scripts; every error names the pod and what to do next.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use cnimesh_cni::backend::{BackendError, LiveLine};
use cnimesh_cni::netns::NetnsError;
use cnimesh_cni::rules::Ruleset;
use cnimesh_cni::state::{AttachmentRecord, StateStore};
use serde::Serialize;

use crate::mounts;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum Format {
    #[default]
    Human,
    Json,
}

/// Columns padded to their widest cell: the one table layout of every command.
pub use cnimesh_common::table::table;

fn json<T: Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value).expect("serialisable") + "\n"
}

fn pod_name(r: &AttachmentRecord) -> String {
    match (&r.pod_namespace, &r.pod_name) {
        (Some(ns), Some(name)) => format!("{ns}/{name}"),
        _ => "(unknown pod)".into(),
    }
}

fn short(id: &str) -> String {
    id.chars().take(12).collect()
}

/// Every readable record; unreadable ones are reported on stderr.
pub fn records(state_dir: &Path) -> anyhow::Result<Vec<AttachmentRecord>> {
    let store = StateStore::new(state_dir);
    let list = store.list().with_context(|| format!("reading state records in {}", store.dir().display()))?;
    Ok(list
        .into_iter()
        .filter_map(|(path, r)| r.map_err(|e| eprintln!("warning: skipping {}: {e}", path.display())).ok())
        .collect())
}

/// The record's netns path, unless it now names another namespace (a reused path).
fn checked_netns(r: &AttachmentRecord) -> Result<&Path, BackendError> {
    let path = Path::new(&r.netns);
    if r.netns_matches(path) {
        Ok(path)
    } else {
        Err(BackendError::Netns(NetnsError::Missing { path: r.netns.clone() }))
    }
}

fn live_error(e: BackendError) -> String {
    match e {
        BackendError::Netns(n) if n.is_gone() => {
            let path = match &n {
                NetnsError::Missing { path } | NetnsError::Enter { path, .. } => path.as_str(),
                _ => "",
            };
            match mounts::missing_netns_hint(Path::new(path)) {
                // On a private host mount a live pod's netns looks exactly like a stale one.
                Some(hint) => format!(
                    "netns {path} not found here: {hint}; if the pod is gone, the record is stale (GC or DEL will remove it)"
                ),
                None => "netns is gone (stale record; GC or DEL will remove it)".into(),
            }
        }
        BackendError::Netns(NetnsError::Enter { .. }) => format!("{e} (run as root)"),
        other => other.to_string(),
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct PodRow {
    pub pod: String,
    pub container_id: String,
    pub netns: String,
    pub backend: String,
    pub inbound_port: u16,
    pub outbound_port: u16,
    /// Packets redirected to the proxy, inbound and outbound (new connections).
    pub redirected_inbound: Option<u64>,
    pub redirected_outbound: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

fn redirected(lines: &[LiveLine], inbound: bool) -> u64 {
    lines
        .iter()
        .filter(|l| l.redirect && (l.chain.ends_with("inbound") || l.chain.ends_with("INBOUND")) == inbound)
        .map(|l| l.packets)
        .sum()
}

pub fn pods(state_dir: &Path) -> anyhow::Result<Vec<PodRow>> {
    Ok(records(state_dir)?
        .into_iter()
        .map(|r| {
            let live = checked_netns(&r).and_then(|netns| r.backend.live(netns));
            let (inbound, outbound, error) = match &live {
                Ok(lines) if lines.is_empty() => {
                    (None, None, Some("no rules installed (run `cnimesh-node verify`)".into()))
                }
                Ok(lines) => (Some(redirected(lines, true)), Some(redirected(lines, false)), None),
                Err(_) => (None, None, live.err().map(live_error)),
            };
            PodRow {
                pod: pod_name(&r),
                container_id: r.container_id.clone(),
                netns: r.netns.clone(),
                backend: r.backend.name().into(),
                inbound_port: r.spec.inbound_proxy_port,
                outbound_port: r.spec.outbound_proxy_port,
                redirected_inbound: inbound,
                redirected_outbound: outbound,
                error,
            }
        })
        .collect())
}

pub fn render_pods(rows: &[PodRow], format: Format) -> String {
    if format == Format::Json {
        return json(&rows);
    }
    let count = |n: Option<u64>| n.map_or("-".into(), |n| n.to_string());
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.pod.clone(),
                short(&r.container_id),
                r.backend.clone(),
                format!(":{}", r.inbound_port),
                format!(":{}", r.outbound_port),
                format!("{}/{}", count(r.redirected_inbound), count(r.redirected_outbound)),
                r.error.clone().unwrap_or_else(|| r.netns.clone()),
            ]
        })
        .collect();
    table(&["POD", "CONTAINER", "BACKEND", "INBOUND", "OUTBOUND", "REDIRECTED IN/OUT", "NETNS"], &body)
}

/// The record for `target`: a container id (or unique prefix), `namespace/name`, or a unique name.
pub fn find(state_dir: &Path, target: &str) -> anyhow::Result<AttachmentRecord> {
    let all = records(state_dir)?;
    let matches: Vec<&AttachmentRecord> = all
        .iter()
        .filter(|r| {
            r.container_id.starts_with(target)
                || pod_name(r) == target
                || (!target.contains('/') && r.pod_name.as_deref() == Some(target))
        })
        .collect();
    match matches.as_slice() {
        [one] => Ok((*one).clone()),
        [] => bail!(
            "no captured pod matches {target:?} on this node: see `cnimesh-node pods` (state dir {})",
            state_dir.display()
        ),
        many => bail!(
            "{target:?} matches {} pods ({}): use namespace/name or a longer container id",
            many.len(),
            many.iter().map(|r| pod_name(r)).collect::<Vec<_>>().join(", ")
        ),
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Rules {
    pub pod: String,
    pub container_id: String,
    pub backend: String,
    pub netns: String,
    pub rules: Vec<LiveLine>,
}

pub fn rules(state_dir: &Path, target: &str) -> anyhow::Result<Rules> {
    let r = find(state_dir, target)?;
    let lines =
        r.backend.live(Path::new(&r.netns)).map_err(|e| anyhow::anyhow!("{}: {}", pod_name(&r), live_error(e)))?;
    Ok(Rules {
        pod: pod_name(&r),
        container_id: r.container_id,
        backend: r.backend.name().into(),
        netns: r.netns,
        rules: lines,
    })
}

pub fn render_rules(rules: &Rules, format: Format) -> String {
    if format == Format::Json {
        return json(rules);
    }
    let mut out =
        format!("# {} container {} ({}, {})\n", rules.pod, short(&rules.container_id), rules.backend, rules.netns);
    if rules.rules.is_empty() {
        out.push_str("no cnimesh rules are installed: run `cnimesh-node verify` for details\n");
    }
    let body: Vec<Vec<String>> = rules
        .rules
        .iter()
        .map(|l| vec![l.chain.clone(), l.packets.to_string(), l.bytes.to_string(), l.rule.clone()])
        .collect();
    out.push_str(&table(&["CHAIN", "PACKETS", "BYTES", "RULE"], &body));
    out
}

#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub pod: String,
    pub container_id: String,
    pub ok: bool,
    pub drift: Vec<String>,
}

pub fn verify(state_dir: &Path, target: Option<&str>) -> anyhow::Result<Vec<Verdict>> {
    let selected = match target {
        Some(t) => vec![find(state_dir, t)?],
        None => records(state_dir)?,
    };
    Ok(selected
        .into_iter()
        .map(|r| {
            let drift = checked_netns(&r)
                .and_then(|netns| r.backend.drift(netns, &Ruleset::from_spec(&r.spec)))
                .unwrap_or_else(|e| vec![live_error(e)]);
            Verdict { pod: pod_name(&r), container_id: r.container_id, ok: drift.is_empty(), drift }
        })
        .collect())
}

pub fn render_verify(verdicts: &[Verdict], format: Format) -> String {
    if format == Format::Json {
        return json(&verdicts);
    }
    let mut out = String::new();
    for v in verdicts {
        if v.ok {
            out.push_str(&format!("ok     {} ({})\n", v.pod, short(&v.container_id)));
        } else {
            out.push_str(&format!("DRIFT  {} ({})\n", v.pod, short(&v.container_id)));
            for d in &v.drift {
                out.push_str(&format!("       - {d}\n"));
            }
        }
    }
    if verdicts.is_empty() {
        out.push_str("no captured pods on this node\n");
    }
    out
}

#[derive(Debug, Clone, Serialize)]
pub struct Status {
    pub plugin_binary: PathBuf,
    pub plugin_installed: bool,
    pub plugin_versions: Option<Vec<String>>,
    pub primary_config: Option<PathBuf>,
    pub chained_in: Option<PathBuf>,
    pub agent_socket: PathBuf,
    pub agent_socket_present: bool,
    pub kube: String,
    pub captured_pods: usize,
}

impl Status {
    pub fn healthy(&self) -> bool {
        self.plugin_installed && self.chained_in.is_some() && self.agent_socket_present
    }
}

fn plugin_versions(binary: &Path) -> Option<Vec<String>> {
    let out =
        Command::new(binary).env("CNI_COMMAND", "VERSION").stdin(Stdio::null()).stderr(Stdio::null()).output().ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    Some(v["supportedVersions"].as_array()?.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
}

pub fn status(bin_dir: &Path, conf_dir: &Path, socket: &Path, state_dir: &Path, kube: String) -> Status {
    let plugin_binary = crate::install::target(bin_dir);
    Status {
        plugin_installed: plugin_binary.is_file(),
        plugin_versions: plugin_versions(&plugin_binary),
        plugin_binary,
        primary_config: crate::chain::scan(conf_dir).ok().and_then(|s| s.primary),
        chained_in: crate::chain::is_chained(conf_dir),
        agent_socket: socket.to_path_buf(),
        // A socket file alone may be stale: the agent must accept.
        agent_socket_present: std::os::unix::net::UnixStream::connect(socket).is_ok(),
        kube,
        captured_pods: records(state_dir).map(|r| r.len()).unwrap_or(0),
    }
}

pub fn render_status(s: &Status, format: Format) -> String {
    if format == Format::Json {
        return json(s);
    }
    let yes_no = |b: bool| if b { "yes" } else { "NO" };
    let path = |p: &Option<PathBuf>| p.as_ref().map_or("none".to_string(), |p| p.display().to_string());
    let rows = vec![
        vec![
            "plugin binary".into(),
            format!("{} (installed: {})", s.plugin_binary.display(), yes_no(s.plugin_installed)),
        ],
        vec!["plugin CNI versions".into(), s.plugin_versions.as_ref().map_or("unknown".into(), |v| v.join(", "))],
        vec!["primary CNI config".into(), path(&s.primary_config)],
        vec!["cnimesh-cni chained in".into(), path(&s.chained_in)],
        vec![
            "agent socket".into(),
            format!("{} (present: {})", s.agent_socket.display(), yes_no(s.agent_socket_present)),
        ],
        vec!["kubernetes API".into(), s.kube.clone()],
        vec!["captured pods".into(), s.captured_pods.to_string()],
    ];
    table(&["CHECK", "STATE"], &rows)
}
