//! A small CNI runtime that executes a conflist the way libcni does: ADD runs the plugins in order,
//! each getting the previous one's result as `prevResult`; the final result is cached; DEL runs in
//! reverse with the cached result (or none); CHECK runs in order with it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::host::{REFERENCE_PLUGIN_DIR, run, unique_name};

/// Binaries the harness executes, resolved by the calling test crate (see [`crate::bins!`]).
#[derive(Debug, Clone)]
pub struct Bins {
    /// A `cnimesh-cni` binary.
    pub plugin: PathBuf,
    /// The `cnimesh-probe` traffic helper.
    pub probe: PathBuf,
    /// A `cnimesh-proxy` binary.
    pub proxy: PathBuf,
    /// A `cnimesh-control` binary.
    pub control: PathBuf,
}

/// Resolves [`Bins`] from the `CARGO_BIN_EXE_*` variables of an integration test or bench.
#[macro_export]
macro_rules! bins {
    () => {
        $crate::cni::Bins {
            plugin: env!("CARGO_BIN_EXE_cnimesh-cni-e2e").into(),
            probe: env!("CARGO_BIN_EXE_cnimesh-probe").into(),
            proxy: env!("CARGO_BIN_EXE_cnimesh-proxy-e2e").into(),
            control: env!("CARGO_BIN_EXE_cnimesh-control-e2e").into(),
        }
    };
}

/// A `CNI_PATH` directory: Debian's reference plugins plus our plugin as `cnimesh-cni`.
pub struct PluginDir {
    dir: TempDir,
}

impl PluginDir {
    pub fn new(plugin: &Path) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("cnimesh-cni-path").tempdir()?;
        for entry in std::fs::read_dir(REFERENCE_PLUGIN_DIR)? {
            let entry = entry?;
            std::os::unix::fs::symlink(entry.path(), dir.path().join(entry.file_name()))?;
        }
        std::os::unix::fs::symlink(plugin, dir.path().join("cnimesh-cni"))?;
        Ok(Self { dir })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// A plugin failure as the runtime sees it: the CNI error object, plus raw output for debugging.
#[derive(Debug, Clone)]
pub struct CniFailure {
    pub plugin: String,
    pub code: Option<u64>,
    pub msg: String,
    pub details: Option<String>,
    pub stderr: String,
}

impl std::fmt::Display for CniFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} failed (code {:?}): {} {:?} [stderr: {}]",
            self.plugin, self.code, self.msg, self.details, self.stderr
        )
    }
}

impl std::error::Error for CniFailure {}

/// One call's identity: what a runtime puts in CNI_CONTAINERID / CNI_NETNS / CNI_IFNAME / CNI_ARGS.
#[derive(Debug, Clone)]
pub struct Call<'a> {
    pub container_id: &'a str,
    pub netns: &'a str,
    pub ifname: &'a str,
    pub args: &'a str,
}

/// Raw output of one plugin execution.
pub struct Exec {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Executes one plugin binary with a CNI environment and stdin.
pub fn exec_raw(
    cni_path: &Path,
    plugin_type: &str,
    command: &str,
    call: &Call<'_>,
    stdin: &[u8],
) -> anyhow::Result<Exec> {
    exec_as(&cni_path.join(plugin_type), None, command, call, stdin)
}

/// Executes a plugin binary, as `uid` if given (e.g. to show what an unprivileged caller gets).
pub fn exec_as(binary: &Path, uid: Option<u32>, command: &str, call: &Call<'_>, stdin: &[u8]) -> anyhow::Result<Exec> {
    let mut cmd = Command::new(binary);
    if let Some(uid) = uid {
        std::os::unix::process::CommandExt::uid(&mut cmd, uid);
    }
    let cni_path = binary.parent().unwrap_or(Path::new("/"));
    let mut child = cmd
        .env_clear()
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", call.container_id)
        .env("CNI_NETNS", call.netns)
        .env("CNI_IFNAME", call.ifname)
        .env("CNI_ARGS", call.args)
        .env("CNI_PATH", cni_path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child.stdin.take().expect("piped").write_all(stdin)?;
    let out = child.wait_with_output()?;
    Ok(Exec {
        success: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// Executes one plugin object of a network; `Ok(result)` is its parsed stdout (if any).
pub fn exec_plugin(cni_path: &Path, conf: &Value, command: &str, call: &Call<'_>) -> Result<Option<Value>, CniFailure> {
    let plugin = conf["type"].as_str().unwrap_or_default().to_string();
    let failure = |error: Value, stderr: String| CniFailure {
        plugin: plugin.clone(),
        code: error["code"].as_u64(),
        msg: error["msg"].as_str().unwrap_or_default().to_string(),
        details: error["details"].as_str().map(str::to_string),
        stderr,
    };
    let out = exec_raw(cni_path, &plugin, command, call, conf.to_string().as_bytes())
        .map_err(|e| failure(json!({"msg": format!("exec failed: {e}")}), String::new()))?;
    let parsed = (!out.stdout.trim().is_empty())
        .then(|| serde_json::from_str::<Value>(&out.stdout).unwrap_or_else(|_| json!({"msg": out.stdout.clone()})));
    if out.success { Ok(parsed) } else { Err(failure(parsed.unwrap_or(json!({})), out.stderr)) }
}

/// The configuration libcni would load from `dir` now: the lexicographically first `.conf`,
/// `.conflist` or `.json` file that parses (a single plugin becomes a one-plugin list); `None`
/// when there is none (the runtime then fails the pod: "no network config found").
pub fn libcni_config(dir: &Path) -> Option<Value> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir).ok()?.flatten().map(|e| e.path()).collect();
    files.sort();
    files.into_iter().filter(|p| p.extension().is_some_and(|e| e == "conf" || e == "conflist" || e == "json")).find_map(
        |p| {
            let v: Value = serde_json::from_slice(&std::fs::read(&p).ok()?).ok()?;
            if v["plugins"].as_array().is_some_and(|p| !p.is_empty()) {
                Some(v)
            } else {
                v["type"].is_string().then(|| json!({"cniVersion": v["cniVersion"], "name": v["name"], "plugins": [v]}))
            }
        },
    )
}

/// `plugin` of `list` as libcni passes it: with the list's name and version, and prevResult.
fn as_called(list: &Value, plugin: &Value, prev: Option<&Value>) -> Value {
    let mut conf = plugin.clone();
    conf["name"] = list["name"].clone();
    conf["cniVersion"] = list["cniVersion"].clone();
    if let Some(p) = prev {
        conf["prevResult"] = p.clone();
    }
    conf
}

/// A bridge network (Debian's `bridge` + `host-local`) with `cnimesh-cni` chained after it.
/// Each network has its own bridge, IPAM store, result cache and cnimesh state directory.
pub struct Network {
    pub conflist: Value,
    pub bridge: String,
    plugins: PluginDir,
    state: TempDir,
}

pub const POD_SUBNET_V4: &str = "10.244.0.0/24";
pub const POD_SUBNET_V6: &str = "fd44::/64";

impl Network {
    /// `cnimesh` holds extra settings for the cnimesh-cni object (merged over the defaults).
    pub fn bridge(bins: &Bins, cnimesh: Value) -> anyhow::Result<Self> {
        let plugins = PluginDir::new(&bins.plugin)?;
        let state = tempfile::Builder::new().prefix("cnimesh-net").tempdir()?;
        let bridge = unique_name("cnmbr");
        let name = format!("net-{bridge}");
        let mut ours = json!({"type": "cnimesh-cni", "stateDir": state.path().join("cnimesh")});
        if let (Some(o), Some(extra)) = (ours.as_object_mut(), cnimesh.as_object()) {
            o.extend(extra.clone());
        }
        let conflist = json!({
            "cniVersion": "1.0.0",
            "name": name,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": bridge,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_SUBNET_V4}], [{"subnet": POD_SUBNET_V6}]],
                        "dataDir": state.path().join("ipam"),
                    }
                },
                ours
            ]
        });
        Ok(Self { conflist, bridge, plugins, state })
    }

    pub fn name(&self) -> &str {
        self.conflist["name"].as_str().unwrap_or_default()
    }

    pub fn cni_path(&self) -> &Path {
        self.plugins.path()
    }

    /// The cnimesh-cni state directory of this network (its `stateDir` setting).
    pub fn state_dir(&self) -> PathBuf {
        let ours = self.conflist["plugins"].as_array().and_then(|p| p.iter().find(|p| p["type"] == "cnimesh-cni"));
        ours.and_then(|p| p["stateDir"].as_str()).map_or_else(|| self.state.path().join("cnimesh"), PathBuf::from)
    }

    /// Debian's host-local store of this network: one file per allocated address.
    pub fn ipam_dir(&self) -> PathBuf {
        self.state.path().join("ipam").join(self.name())
    }

    /// What pods of this network left on the host: attachment records (and temporary files
    /// beside them), IPAM allocations, ports on the bridge. Empty once every pod is gone.
    pub fn leftovers(&self) -> Vec<String> {
        let files = |dir: PathBuf| -> Vec<String> {
            std::fs::read_dir(dir)
                .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
                .unwrap_or_default()
        };
        let mut left: Vec<String> =
            files(self.state_dir().join("attachments")).into_iter().map(|f| format!("record {f}")).collect();
        left.extend(
            files(self.ipam_dir())
                .into_iter()
                .filter(|f| f.parse::<std::net::IpAddr>().is_ok())
                .map(|f| format!("IPAM allocation {f}")),
        );
        let ports = run("ip", &["-o", "link", "show", "master", &self.bridge]).unwrap_or_default();
        left.extend(
            ports.lines().filter_map(|l| l.split(": ").nth(1)).map(|port| format!("port {port} on {}", self.bridge)),
        );
        left.sort();
        left
    }

    /// Whether host-local holds an address for `container_id`.
    pub fn allocated_to(&self, container_id: &str) -> bool {
        std::fs::read_dir(self.ipam_dir()).into_iter().flatten().flatten().any(|e| {
            e.file_name().to_string_lossy().parse::<std::net::IpAddr>().is_ok()
                && std::fs::read_to_string(e.path()).is_ok_and(|owner| owner.lines().next() == Some(container_id))
        })
    }

    fn cache_file(&self, call: &Call<'_>) -> PathBuf {
        self.state.path().join("results").join(format!("{}-{}", call.container_id, call.ifname))
    }

    /// A plugin object as libcni passes it: with the list's name and version, and prevResult.
    pub fn plugin_conf(&self, index: usize, prev: Option<&Value>) -> Value {
        as_called(&self.conflist, &self.conflist["plugins"][index], prev)
    }

    fn plugin_count(&self) -> usize {
        self.conflist["plugins"].as_array().map_or(0, Vec::len)
    }

    pub fn add(&self, call: &Call<'_>) -> Result<Value, CniFailure> {
        self.add_first(self.plugin_count(), call)
    }

    /// ADD through the primary plugin only: a pod the mesh does not capture (the control
    /// plane's own pod, a workload outside the mesh).
    pub fn add_primary(&self, call: &Call<'_>) -> Result<Value, CniFailure> {
        self.add_first(1, call)
    }

    fn add_first(&self, plugins: usize, call: &Call<'_>) -> Result<Value, CniFailure> {
        let mut list = self.conflist.clone();
        if let Some(p) = list["plugins"].as_array_mut() {
            p.truncate(plugins);
        }
        self.add_list(&list, call)
    }

    /// This network's list without cnimesh-cni: the primary CNI's own configuration.
    pub fn primary_conflist(&self) -> Value {
        let mut list = self.conflist.clone();
        if let Some(plugins) = list["plugins"].as_array_mut() {
            plugins.retain(|p| p["type"] != "cnimesh-cni");
        }
        list
    }

    /// ADD through `list` (a conflist read where the runtime reads it, say) with this network's
    /// plugin directory and result cache.
    pub fn add_list(&self, list: &Value, call: &Call<'_>) -> Result<Value, CniFailure> {
        let mut prev: Option<Value> = None;
        for plugin in list["plugins"].as_array().into_iter().flatten() {
            prev = exec_plugin(self.cni_path(), &as_called(list, plugin, prev.as_ref()), "ADD", call)?;
        }
        let result = prev.unwrap_or(Value::Null);
        let cache = self.cache_file(call);
        let _ = std::fs::create_dir_all(cache.parent().expect("has parent"));
        let _ = std::fs::write(cache, result.to_string());
        Ok(result)
    }

    pub fn cached_result(&self, call: &Call<'_>) -> Option<Value> {
        std::fs::read(self.cache_file(call)).ok().and_then(|b| serde_json::from_slice(&b).ok())
    }

    /// DEL in reverse order, with the cached result when there is one; the cache is then dropped.
    pub fn del(&self, call: &Call<'_>) -> Result<(), CniFailure> {
        let cached = self.cached_result(call);
        for i in (0..self.plugin_count()).rev() {
            exec_plugin(self.cni_path(), &self.plugin_conf(i, cached.as_ref()), "DEL", call)?;
        }
        let _ = std::fs::remove_file(self.cache_file(call));
        Ok(())
    }

    pub fn check(&self, call: &Call<'_>) -> Result<(), CniFailure> {
        let cached = self.cached_result(call);
        for i in 0..self.plugin_count() {
            exec_plugin(self.cni_path(), &self.plugin_conf(i, cached.as_ref()), "CHECK", call)?;
        }
        Ok(())
    }

    /// Runs the chained cnimesh-cni alone with the cached result as prevResult, as a runtime
    /// retrying only the last plugin would (reference plugins such as `bridge` are not idempotent).
    pub fn exec_cnimesh(&self, command: &str, call: &Call<'_>) -> Result<Option<Value>, CniFailure> {
        let conf = self.plugin_conf(self.plugin_count() - 1, self.cached_result(call).as_ref());
        exec_plugin(self.cni_path(), &conf, command, call)
    }

    /// The cnimesh-cni object alone at cniVersion 1.1.0 (GC and STATUS are 1.1.0 verbs, which
    /// Debian's reference plugins predate), with optional extra keys.
    pub fn cnimesh_conf_v11(&self, extra: Value) -> Value {
        let mut conf = self.plugin_conf(self.plugin_count() - 1, None);
        conf["cniVersion"] = json!("1.1.0");
        if let (Some(o), Some(e)) = (conf.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        conf
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        let _ = run("ip", &["link", "del", &self.bridge]);
    }
}
