//! A small CNI runtime, doing what libcni does for the kubelet's sandbox: `lo` through the
//! `loopback` plugin, then ADD of each plugin of the conflist in order with the previous result as
//! `prevResult`; DEL in reverse with the cached result.
//!
//! Each attachment's record (the plugin objects as executed, CNI_ARGS, the result) is written
//! before ADD and kept under `<root>/attachments`, so `down` can DEL even after `up` crashed
//! halfway through an ADD; DEL is idempotent, so DEL of a half-done ADD is fine.

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use cnimesh_common::fs::write_atomic;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Attachment {
    pub namespace: String,
    pub pod: String,
    pub container_id: String,
    pub netns: PathBuf,
    pub ifname: String,
    pub args: String,
    /// The plugin objects executed, each with the list's `name` and `cniVersion` added.
    pub plugins: Vec<Value>,
    pub result: Option<Value>,
}

impl Attachment {
    /// The pod's first IPv4 address from the result.
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        self.result.as_ref()?["ips"]
            .as_array()?
            .iter()
            .find_map(|ip| ip["address"].as_str()?.split('/').next()?.parse().ok())
    }
}

pub struct Runtime {
    /// `CNI_PATH`: the reference plugins and the installed cnimesh-cni.
    pub cni_path: PathBuf,
    pub records: PathBuf,
}

/// A fresh 64-hex-digit id, like a containerd sandbox id.
pub fn random_id() -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

impl Runtime {
    fn record_path(&self, pod: &str) -> PathBuf {
        self.records.join(format!("{pod}.json"))
    }

    fn save(&self, a: &Attachment) -> anyhow::Result<()> {
        let body = serde_json::to_vec_pretty(a)?;
        write_atomic(&self.record_path(&a.pod), &body, None).with_context(|| format!("writing the record of {}", a.pod))
    }

    /// Sets up `lo` and `eth0` of the pod in `netns` through `plugins` of `conflist` (all of them,
    /// or only the primary for a pod outside the mesh's chain such as the control plane's).
    pub fn add(
        &self,
        conflist: &Value,
        only_primary: bool,
        namespace: &str,
        pod: &str,
        uid: &str,
        netns: &Path,
    ) -> anyhow::Result<Attachment> {
        let container_id = random_id()?;
        let args = format!(
            "K8S_POD_UID={uid};IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID={container_id}"
        );
        let mut plugins: Vec<Value> = conflist["plugins"].as_array().cloned().unwrap_or_default();
        if only_primary {
            plugins.truncate(1);
        }
        for p in &mut plugins {
            p["name"] = conflist["name"].clone();
            p["cniVersion"] = conflist["cniVersion"].clone();
        }
        let mut a = Attachment {
            namespace: namespace.into(),
            pod: pod.into(),
            container_id,
            netns: netns.into(),
            ifname: "eth0".into(),
            args,
            plugins,
            result: None,
        };
        self.save(&a)?;
        let lo = json!({"cniVersion": "1.0.0", "name": "cni-loopback", "type": "loopback"});
        self.exec(&lo, "ADD", &a, "lo")?;
        let mut prev: Option<Value> = None;
        for plugin in &a.plugins {
            let mut conf = plugin.clone();
            if let Some(p) = &prev {
                conf["prevResult"] = p.clone();
            }
            prev = self.exec(&conf, "ADD", &a, &a.ifname)?;
        }
        a.result = prev;
        self.save(&a)?;
        Ok(a)
    }

    /// DEL through the chain in reverse, then the record is dropped. Every plugin is tried even
    /// when one fails; the first failure is returned.
    pub fn del(&self, a: &Attachment) -> anyhow::Result<()> {
        let mut first_error = None;
        for plugin in a.plugins.iter().rev() {
            let mut conf = plugin.clone();
            if let Some(r) = &a.result {
                conf["prevResult"] = r.clone();
            }
            if let Err(e) = self.exec(&conf, "DEL", a, &a.ifname) {
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            None => {
                let _ = std::fs::remove_file(self.record_path(&a.pod));
                Ok(())
            }
            Some(e) => Err(e),
        }
    }

    /// The attachments recorded, in name order; unreadable records are reported and skipped.
    pub fn recorded(&self) -> Vec<Attachment> {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(&self.records)
            .map(|d| d.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "json")).collect())
            .unwrap_or_default();
        paths.sort();
        paths
            .into_iter()
            .filter_map(|p| {
                match std::fs::read(&p).map_err(anyhow::Error::from).and_then(|b| Ok(serde_json::from_slice(&b)?)) {
                    Ok(a) => Some(a),
                    Err(e) => {
                        tracing::warn!(record = %p.display(), error = %e, "skipping an unreadable attachment record");
                        None
                    }
                }
            })
            .collect()
    }

    /// Executes one plugin as a runtime does: CNI_* environment, configuration on stdin.
    fn exec(&self, conf: &Value, command: &str, a: &Attachment, ifname: &str) -> anyhow::Result<Option<Value>> {
        let plugin = conf["type"].as_str().unwrap_or_default();
        let mut child = Command::new(self.cni_path.join(plugin))
            .env_clear()
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", &a.container_id)
            .env("CNI_NETNS", &a.netns)
            .env("CNI_IFNAME", ifname)
            .env("CNI_ARGS", &a.args)
            .env("CNI_PATH", &self.cni_path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("executing CNI plugin {plugin} from {}", self.cni_path.display()))?;
        child.stdin.take().expect("piped").write_all(conf.to_string().as_bytes())?;
        let out = child.wait_with_output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let parsed: Option<Value> =
            (!stdout.trim().is_empty()).then(|| serde_json::from_str(&stdout)).transpose().ok().flatten();
        if !out.status.success() {
            let msg = parsed.as_ref().map_or(stdout.trim().to_string(), |e| {
                format!(
                    "code {} {} {}",
                    e["code"],
                    e["msg"].as_str().unwrap_or(""),
                    e["details"].as_str().unwrap_or("")
                )
            });
            bail!(
                "CNI {command} of {}/{} ({plugin}, {ifname}) failed: {} {}",
                a.namespace,
                a.pod,
                msg.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(parsed)
    }
}
