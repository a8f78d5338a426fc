//! The CNI commands. Each returns what to print on success, or the error to report.
//!
//! Order matters for "nothing half-installed": everything that can be validated is validated
//! before the netns is touched, rules are replaced in one atomic step, and if the record that
//! follows cannot be written the rules are removed again before failing.

use std::path::Path;

use serde_json::json;
use tracing::{info, warn};

use crate::agent::{self, AgentConfig, Decision, DecisionRequest};
use crate::backend::BackendError;
use crate::config::NetConf;
use crate::env::{self, CniEnv, Command};
use crate::error::{CniError, ErrorCode, Result, err};
use crate::netns::NetnsId;
use crate::result;
use crate::rules::Ruleset;
use crate::spec::RedirectSpec;
use crate::state::{AttachmentRecord, RECORD_VERSION, StateStore};
use crate::version;

/// Runs one CNI call. `get_env` reads the process environment in production.
pub fn run(command: Command, get_env: impl Fn(&str) -> Option<String>, stdin: &[u8]) -> Result<Option<String>> {
    if command == Command::Version {
        return Ok(Some(version_output(stdin)));
    }
    let conf = NetConf::parse(stdin)?;
    crate::logging::init(&conf.settings);
    let env = env::from_vars(command, get_env)?;
    require_version(command, &conf.cni_version)?;
    match command {
        Command::Add => add(&conf, &env).map(Some),
        Command::Del => del(&conf, &env).map(|()| None),
        Command::Check => check(&conf, &env).map(|()| None),
        Command::Gc => gc(&conf).map(|()| None),
        Command::Status => status(&conf).map(|()| None),
        Command::Version => unreachable!("handled above"),
    }
}

/// VERSION answers even for configurations it cannot otherwise parse.
fn version_output(stdin: &[u8]) -> String {
    json!({"cniVersion": version::requested(stdin), "supportedVersions": version::SUPPORTED}).to_string()
}

fn require_version(command: Command, v: &str) -> Result<()> {
    let min = match command {
        Command::Check => "0.4.0",
        Command::Gc | Command::Status => "1.1.0",
        _ => return Ok(()),
    };
    if version::at_least(v, min) {
        Ok(())
    } else {
        Err(CniError::new(
            ErrorCode::IncompatibleVersion,
            format!("{command:?} needs cniVersion {min} or later, got {v}"),
        ))
    }
}

fn store(conf: &NetConf) -> StateStore {
    StateStore::new(&conf.state_dir())
}

fn backend_error(action: &str, netns: &str, e: BackendError) -> CniError {
    let code = match &e {
        BackendError::Netns(n) if n.is_gone() => ErrorCode::ContainerUnknown,
        BackendError::Nft(n) if n.is_transient() => ErrorCode::TryAgainLater,
        _ => ErrorCode::RulesFailed,
    };
    err(code, format!("cannot {action} capture rules in {netns}"), e)
}

fn add(conf: &NetConf, env: &CniEnv) -> Result<String> {
    let prev = conf.prev_result.as_ref().ok_or_else(|| {
        CniError::new(
            ErrorCode::InvalidConfig,
            "cnimesh-cni must be chained after a primary CNI plugin: ADD received no prevResult",
        )
    })?;
    let output = result::convert(prev, &conf.cni_version)?.to_string();
    if conf.excludes(env.pod_namespace()) {
        info!(namespace = env.pod_namespace(), container = %env.container_id, "namespace excluded; not capturing");
        return Ok(output);
    }
    let spec = match &conf.settings.node_agent {
        None => conf.spec()?,
        Some(agent_config) => match ask_agent(agent_config, env)? {
            Some(spec) => spec,
            None => return Ok(output),
        },
    };
    let ruleset = Ruleset::from_spec(&spec);
    let netns = Path::new(&env.netns);
    let backend =
        conf.settings.backend.resolve(netns).map_err(|e| backend_error("choose a backend for", &env.netns, e))?;
    backend.apply(netns, &ruleset).map_err(|e| backend_error("install", &env.netns, e))?;

    let record = AttachmentRecord {
        version: RECORD_VERSION,
        network: conf.name.clone(),
        container_id: env.container_id.clone(),
        ifname: env.ifname.clone(),
        netns: env.netns.clone(),
        netns_id: NetnsId::of(netns),
        pod_namespace: env.pod_namespace().map(str::to_string),
        pod_name: env.pod_name().map(str::to_string),
        pod_uid: env.pod_uid().map(str::to_string),
        backend,
        spec,
        created_at: AttachmentRecord::now(),
    };
    if let Err(e) = store(conf).write(&record) {
        // A capture nobody knows about cannot be checked, repaired or collected: undo it.
        if let Err(undo) = backend.remove(netns) {
            warn!(error = %undo, "could not remove rules after failing to write the record");
        }
        return Err(err(
            ErrorCode::Io,
            format!("cannot write the attachment record under {}", conf.state_dir().display()),
            e,
        ));
    }
    info!(container = %env.container_id, netns = %env.netns, backend = backend.name(), rules = ruleset.rule_count(), "capture installed");
    Ok(output)
}

/// The way out for a pod of `namespace` that must start whether or not the agent answers.
fn exclude_hint(namespace: &str) -> String {
    format!(
        "pods of excluded namespaces never wait for the agent (excludeNamespaces / CNIMESH_EXCLUDE_NAMESPACES, \
         default {}): exclude namespace {namespace:?} if its pods must start without the mesh",
        crate::config::DEFAULT_EXCLUDED_NAMESPACES.join(", ")
    )
}

/// The agent's decision for this pod: `Some(spec)` to capture, `None` to leave it alone.
fn ask_agent(config: &AgentConfig, env: &CniEnv) -> Result<Option<RedirectSpec>> {
    let (Some(namespace), Some(name)) = (env.pod_namespace(), env.pod_name()) else {
        return Err(CniError::new(
            ErrorCode::InvalidEnv,
            format!(
                "cannot decide whether to capture container {}: CNI_ARGS has no K8S_POD_NAMESPACE/K8S_POD_NAME, so \
                 the node agent cannot tell whether this pod is meshed; the runtime must pass them (containerd and \
                 CRI-O do), or remove nodeAgent from the cnimesh-cni configuration to decide without the agent",
                env.container_id
            ),
        ));
    };
    let request = DecisionRequest {
        version: agent::PROTOCOL_VERSION,
        pod_namespace: namespace.to_string(),
        pod_name: name.to_string(),
        pod_uid: env.pod_uid().map(str::to_string),
        container_id: env.container_id.clone(),
    };
    let pod = format!("{namespace}/{name}");
    let which = format!("pod {pod} (namespace {namespace}, container {})", env.container_id);
    match agent::ask(config, &request) {
        Ok(Decision::Capture { spec }) => {
            let spec = spec.normalized();
            spec.validate().map_err(|e| {
                CniError::new(ErrorCode::InvalidConfig, format!("node agent sent an invalid spec for {pod}: {e}"))
            })?;
            Ok(Some(spec))
        }
        Ok(Decision::Skip { reason }) => {
            info!(pod, reason, "node agent: not capturing");
            Ok(None)
        }
        Ok(Decision::Error { message, retry: true }) => Err(CniError::new(
            ErrorCode::TryAgainLater,
            format!(
                "the cnimesh node agent cannot decide yet whether to capture {which}: {message}; the runtime \
                 retries; if this persists, see the agent's log (`kubectl -n cnimesh-system logs ds/cnimesh-node`); \
                 {}",
                exclude_hint(namespace)
            ),
        )),
        Ok(Decision::Error { message, retry: false }) => {
            Err(CniError::new(ErrorCode::InvalidConfig, format!("pod {pod} cannot be meshed: {message}")))
        }
        // Fail closed: without an answer the pod might need capture; the runtime retries.
        Err(e) => Err(err(
            ErrorCode::TryAgainLater,
            format!(
                "cannot decide whether to capture {which}: the cnimesh node agent did not answer; the node agent \
                 must be running on this node (DaemonSet cnimesh-node in namespace cnimesh-system: \
                 `kubectl -n cnimesh-system get pods -o wide`), and the runtime retries until it answers; {}",
                exclude_hint(namespace)
            ),
            e,
        )),
    }
}

/// Every readable record, for finding attachments that share a netns.
fn all_records(store: &StateStore) -> Vec<AttachmentRecord> {
    store.list().unwrap_or_default().into_iter().filter_map(|(_, r)| r.ok()).collect()
}

fn del(conf: &NetConf, env: &CniEnv) -> Result<()> {
    let store = store(conf);
    let record = store.read(&conf.name, &env.container_id, &env.ifname).unwrap_or_else(|e| {
        warn!(error = %e, "unreadable attachment record; removing rules with the configured backend");
        None
    });
    // The runtime's netns when it gives one; else the recorded one, if it is still that netns.
    let netns = match (&record, env.netns.is_empty()) {
        (_, false) => Some(env.netns.clone()),
        (Some(r), true) if r.netns_matches(Path::new(&r.netns)) => Some(r.netns.clone()),
        _ => None,
    };
    let shared = record.as_ref().is_some_and(|r| all_records(&store).iter().any(|o| r.shares_netns_with(o)));
    if let Some(netns) = netns.filter(|_| !shared) {
        match &record {
            Some(r) => match r.backend.remove(Path::new(&netns)) {
                // The rules died with the namespace.
                Ok(()) => {}
                Err(BackendError::Netns(e)) if e.is_gone() => {}
                Err(e) => return Err(backend_error("remove", &netns, e)),
            },
            // No record: ADD never completed here, so whatever a crashed ADD may have left is
            // cleaned up best-effort, and an unusable backend is no reason to block the DEL.
            None => {
                for backend in conf.settings.backend.candidates() {
                    if let Err(e) = backend.remove(Path::new(&netns)) {
                        info!(backend = backend.name(), error = %e, "cleanup without a record skipped");
                    }
                }
            }
        }
    }
    store
        .remove(&conf.name, &env.container_id, &env.ifname)
        .map_err(|e| err(ErrorCode::Io, "cannot remove the attachment record", e))?;
    info!(container = %env.container_id, shared, "capture removed");
    Ok(())
}

fn check(conf: &NetConf, env: &CniEnv) -> Result<()> {
    if conf.prev_result.is_none() {
        return Err(CniError::new(ErrorCode::InvalidConfig, "CHECK received no prevResult"));
    }
    if conf.excludes(env.pod_namespace()) {
        return Ok(());
    }
    let record = store(conf)
        .read(&conf.name, &env.container_id, &env.ifname)
        .map_err(|e| err(ErrorCode::Io, "cannot read the attachment record", e))?
        .ok_or_else(|| {
            CniError::new(
                ErrorCode::RulesDrifted,
                format!("no capture record for container {} ({}): ADD did not complete", env.container_id, env.ifname),
            )
        })?;
    if record.netns != env.netns || !record.netns_matches(Path::new(&env.netns)) {
        return Err(CniError::new(
            ErrorCode::RulesDrifted,
            format!("capture was set up in netns {}, but the container's netns is now {}", record.netns, env.netns),
        ));
    }
    // CHECK verifies what ADD applied (the record's spec, which the node agent may have tailored
    // per pod); a later configuration change shows up on the next ADD, not as drift.
    let ruleset = Ruleset::from_spec(&record.spec);
    let drift =
        record.backend.drift(Path::new(&env.netns), &ruleset).map_err(|e| backend_error("read", &env.netns, e))?;
    if drift.is_empty() {
        return Ok(());
    }
    Err(CniError::new(
        ErrorCode::RulesDrifted,
        format!("capture rules in {} ({}) drifted: {}", env.netns, record.backend.name(), drift.join("; ")),
    ))
}

/// Removes as much stale state as it can; records whose rules could not be removed are kept
/// (so the next GC retries), and the failures are reported together.
fn gc(conf: &NetConf) -> Result<()> {
    // Without the list every attachment would look stale: refuse rather than wipe the node.
    let valid = conf.valid_attachments.clone().ok_or_else(|| {
        CniError::new(ErrorCode::InvalidConfig, "GC requires cni.dev/valid-attachments in the configuration")
    })?;
    let store = store(conf);
    let records = store.list().map_err(|e| err(ErrorCode::Io, "cannot list attachment records", e))?;
    let readable: Vec<AttachmentRecord> = records.iter().filter_map(|(_, r)| r.as_ref().ok().cloned()).collect();
    let mut failures = Vec::new();
    for (path, record) in &records {
        let record = match record {
            Ok(r) => r,
            Err(e) => {
                warn!(path = %path.display(), error = %e, "skipping unreadable attachment record");
                continue;
            }
        };
        let listed = valid.iter().any(|a| a.container_id == record.container_id && a.ifname == record.ifname);
        if record.network != conf.name || listed {
            continue;
        }
        let netns = Path::new(&record.netns);
        let shared = readable.iter().any(|o| {
            record.shares_netns_with(o)
                && (o.network != conf.name
                    || valid.iter().any(|a| a.container_id == o.container_id && a.ifname == o.ifname))
        });
        if !shared && record.netns_matches(netns) {
            match record.backend.remove(netns) {
                Ok(()) => {}
                Err(BackendError::Netns(e)) if e.is_gone() => {}
                Err(e) => {
                    failures.push(format!("{}: {e}", record.container_id));
                    continue;
                }
            }
        }
        if let Err(e) = store.remove(&record.network, &record.container_id, &record.ifname) {
            failures.push(format!("{}: cannot remove its record: {e}", record.container_id));
            continue;
        }
        info!(container = %record.container_id, "garbage-collected stale attachment");
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(CniError::new(ErrorCode::Io, format!("GC could not clean up {} attachment(s)", failures.len()))
            .with_details(failures.join("; ")))
    }
}

fn status(conf: &NetConf) -> Result<()> {
    let choice = conf.settings.backend;
    choice.usable().map_err(|e| {
        err(ErrorCode::StatusNotAvailable, format!("the {} backend cannot be used on this node", choice.name()), e)
    })?;
    if let Some(agent) = &conf.settings.node_agent
        && !agent::socket_present(&agent.socket)
    {
        return Err(CniError::new(
            ErrorCode::StatusNotAvailable,
            format!("the cnimesh node agent socket {} is missing: is cnimesh-node running?", agent.socket.display()),
        ));
    }
    let dir = store(conf).dir().to_path_buf();
    let unwritable = |e: std::io::Error| {
        err(ErrorCode::StatusNotAvailable, format!("state directory {} is not writable", dir.display()), e)
    };
    std::fs::create_dir_all(&dir).map_err(unwritable)?;
    // An existing read-only directory passes create_dir_all: really write.
    let probe = dir.join(format!(".status-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(unwritable)?;
    std::fs::remove_file(&probe).map_err(unwritable)
}
