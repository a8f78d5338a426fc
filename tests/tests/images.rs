//! The container images (scripts/images.sh, scripts/images/*/Containerfile) and what the manifests
//! in daemonset/ expect of them.
//!
//! - The CNI plugin is static: it runs in an empty root holding nothing but itself (docs/architecture.md, lesson 14).
//! - The three images build offline FROM scratch, load from their OCI archives into a fresh
//!   storage, run (`--version`, the node agent's installer against host dirs mounted like the
//!   DaemonSet's, the proxy as UID 2102 on a read-only root) and hold nothing unexpected.
//! - Every command the manifests exec (container command, lifecycle hooks, exec probes) and every
//!   path they point into an image exists in that image: no `sleep` in a preStop (docs/architecture.md, lesson 16).
//!
//! Podman runs with the `runc` runtime, `--network none` and explicit ulimits: crun refuses hosts
//! with hybrid cgroups, and podman's default for root (nofile/nproc raised to the maximum) fails
//! without CAP_SYS_RESOURCE. Each test has its own container storage (vfs) in a temp dir, so
//! parallel runs never share tags, and nothing is left in the system's storage.

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use cnimesh_e2e::manifest_check;
use serde_json::Value;

const IMAGES: [&str; 3] = ["cnimesh-node", "cnimesh-control", "cnimesh-proxy"];
const VERSION: &str = env!("CARGO_PKG_VERSION");

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// True when every prerequisite is there. Under CI=true a missing one fails the test; elsewhere
/// the test is skipped with a loud message (the rule of `cnimesh_e2e::require_root`).
fn require(test: &str, tools: &[(&str, &str)]) -> bool {
    let mut why = Vec::new();
    if !nix::unistd::geteuid().is_root() {
        why.push("needs root (chroot, container storage)".to_string());
    }
    for (tool, package) in tools {
        if !on_path(tool) {
            why.push(format!("needs {tool} (apt install {package}; scripts/setup.sh installs it)"));
        }
    }
    if why.is_empty() {
        return true;
    }
    let why = why.join("; ");
    if ci() {
        panic!("{test}: {why}; CI=true, so this is a failure, not a skip");
    }
    eprintln!("\n!!! SKIPPED {test}: {why}. Run the README's test command as root. !!!\n");
    false
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?).map(|dir| dir.join(tool)).find(|p| p.is_file())
}

fn on_path(tool: &str) -> bool {
    which(tool).is_some()
}

/// Runs a command; panics with its output unless it exits 0.
fn ok(cmd: &mut Command) -> String {
    let out = output(cmd);
    assert!(out.status.success(), "{cmd:?} failed ({}): {}", out.status, text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn output(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

fn text(out: &Output) -> String {
    format!(
        "stdout: {} stderr: {}",
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    )
}

/// The static plugin, built once per process by the same script scripts/images.sh uses. It builds
/// into its own target dir: a nested cargo in the workspace's would wait for the `cargo test` that
/// runs this test to release its lock.
fn static_plugin() -> &'static Path {
    static PLUGIN: OnceLock<PathBuf> = OnceLock::new();
    PLUGIN.get_or_init(|| {
        let out = ok(Command::new(workspace().join("scripts/images/cni-static.sh"))
            .args(["--profile", "debug"])
            .env("CARGO_TARGET_DIR", workspace().join("target/images-e2e"))
            .stderr(Stdio::inherit()));
        PathBuf::from(out.trim())
    })
}

fn assert_static(binary: &Path) {
    let file = ok(Command::new("file").arg("-L").arg(binary));
    assert!(
        file.contains("statically linked") || file.contains("static-pie linked"),
        "{} is not static: {file}",
        binary.display()
    );
    assert!(!file.contains("interpreter"), "{file}");
    // ldd exits 1 for "not a dynamic executable" (static) and 0 for "statically linked" (static-pie).
    let ldd = output(Command::new("ldd").arg(binary).env("LC_ALL", "C"));
    let ldd = text(&ldd);
    assert!(ldd.contains("statically linked") || ldd.contains("not a dynamic executable"), "{ldd}");
}

/// Runs `binary` as `/cnimesh-cni` in a chroot holding nothing else, with CNI_COMMAND=VERSION.
fn version_in_empty_root(binary: &Path) -> Output {
    let root = tempfile::Builder::new().prefix("cnimesh-empty-root").tempdir().unwrap();
    fs::copy(binary, root.path().join("cnimesh-cni")).unwrap();
    // The child's environment is cleared (nothing from the host leaks in): resolve chroot first.
    let mut child = Command::new(which("chroot").expect("chroot"))
        .arg(root.path())
        .arg("/cnimesh-cni")
        .env_clear()
        .env("CNI_COMMAND", "VERSION")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A binary that cannot start never reads its stdin: a broken pipe here is that failure.
    let _ = child.stdin.take().unwrap().write_all(br#"{"cniVersion":"1.0.0"}"#);
    child.wait_with_output().unwrap()
}

#[test]
fn static_plugin_runs_in_an_empty_root() {
    if !require(
        "static_plugin_runs_in_an_empty_root",
        &[("chroot", "coreutils"), ("file", "file"), ("ldd", "libc-bin")],
    ) {
        return;
    }
    let plugin = static_plugin();
    assert_static(plugin);

    let out = version_in_empty_root(plugin);
    assert!(out.status.success(), "the static plugin does not run in an empty root: {}", text(&out));
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    let versions: Vec<&str> =
        answer["supportedVersions"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    for v in ["0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        assert!(versions.contains(&v), "{answer}");
    }

    // The same check against the ordinary (dynamic) build fails: the root really is empty, so
    // this is what a node with another libc (or none where we look) would do to a dynamic plugin.
    let dynamic = Path::new(env!("CARGO_BIN_EXE_cnimesh-cni-e2e"));
    let out = version_in_empty_root(dynamic);
    assert!(!out.status.success(), "a dynamic binary ran in the empty root: {}", text(&out));
}

/// A Containerfile's view of its image: the files COPY puts in, ENV PATH, ENTRYPOINT and USER.
#[derive(Debug, Default)]
struct Containerfile {
    files: BTreeSet<String>,
    path: Vec<String>,
    entrypoint: Vec<String>,
    user: String,
}

impl Containerfile {
    fn read(image: &str) -> Self {
        let dir = workspace().join("scripts/images").join(image);
        let text = fs::read_to_string(dir.join("Containerfile")).unwrap();
        let mut cf = Containerfile::default();
        let mut from = Vec::new();
        for line in text.lines().map(str::trim).filter(|l| !l.starts_with('#')) {
            let mut words = line.split_whitespace();
            match words.next() {
                Some("FROM") => from.push(words.next().unwrap_or_default().to_string()),
                Some("COPY") => {
                    let args: Vec<&str> = words.filter(|w| !w.starts_with("--")).collect();
                    let (src, dest) = (args[0], args[1]);
                    if dest.ends_with('/') {
                        // A directory of the build context: etc/ is in the repository, lib/ is
                        // staged by images.sh (shared libraries only, checked on the real image).
                        if src == "etc/" {
                            for entry in fs::read_dir(dir.join("etc")).unwrap() {
                                let name = entry.unwrap().file_name();
                                cf.files.insert(format!("{dest}{}", name.to_string_lossy()));
                            }
                        }
                    } else {
                        cf.files.insert(dest.to_string());
                    }
                }
                Some("ENV") => {
                    if let Some(p) = line.strip_prefix("ENV PATH=") {
                        cf.path = p.split(':').map(String::from).collect();
                    }
                }
                Some("ENTRYPOINT") => {
                    cf.entrypoint = serde_json::from_str(line.trim_start_matches("ENTRYPOINT").trim()).unwrap();
                }
                Some("USER") => cf.user = words.next().unwrap_or_default().to_string(),
                _ => {}
            }
        }
        assert_eq!(from, ["scratch"], "{image}: one stage, FROM scratch");
        cf
    }

    /// Where the image resolves `command` (absolute, or through ENV PATH), if it holds it.
    fn resolve(&self, command: &str) -> Option<String> {
        if command.starts_with('/') {
            return self.files.contains(command).then(|| command.to_string());
        }
        self.path.iter().map(|dir| format!("{dir}/{command}")).find(|p| self.files.contains(p))
    }
}

/// Which of our images `image` (a reference) is, if it is one and carries the workspace version.
fn our_image(image: &str) -> Result<&'static str, String> {
    let rest = image.strip_prefix("ghcr.io/cnimesh/").ok_or_else(|| format!("{image:?} is not a cnimesh image"))?;
    let (name, tag) = rest.split_once(':').ok_or_else(|| format!("{image:?} has no tag"))?;
    let name = IMAGES.iter().find(|n| **n == name).ok_or_else(|| {
        format!("{image:?}: scripts/images.sh builds no image {name:?} (it builds {})", IMAGES.join(", "))
    })?;
    if tag != VERSION {
        return Err(format!("{image:?}: scripts/images.sh tags {VERSION} (the workspace version)"));
    }
    Ok(name)
}

/// Everything a container exec's or points into its image that the image does not hold.
fn container_problems(ctx: &str, c: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let image = c["image"].as_str().unwrap_or_default();
    let name = match our_image(image) {
        Ok(name) => name,
        Err(e) => return vec![format!("{ctx}: {e}")],
    };
    let cf = Containerfile::read(name);
    let first = |v: &Value| v.as_array().and_then(|a| a.first()).and_then(Value::as_str).map(String::from);
    let mut commands = Vec::new();
    match first(&c["command"]) {
        Some(cmd) => commands.push(("command".to_string(), cmd)),
        None => commands.push(("ENTRYPOINT".to_string(), cf.entrypoint.first().cloned().unwrap_or_default())),
    }
    for hook in ["postStart", "preStop"] {
        if let Some(cmd) = first(&c["lifecycle"][hook]["exec"]["command"]) {
            commands.push((format!("lifecycle.{hook}"), cmd));
        }
    }
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        if let Some(cmd) = first(&c[probe]["exec"]["command"]) {
            commands.push((format!("{probe}.exec"), cmd));
        }
    }
    for (what, cmd) in commands {
        if cf.resolve(&cmd).is_none() {
            problems.push(format!("{ctx}: {what} runs {cmd:?}, which image {name} does not hold ({:?})", cf.files));
        }
    }
    // Absolute paths in the environment that no volume provides must be files of the image
    // (CNIMESH_PLUGIN_BINARY=/opt/cnimesh/cnimesh-cni).
    let mounts: Vec<&str> =
        c["volumeMounts"].as_array().into_iter().flatten().filter_map(|m| m["mountPath"].as_str()).collect();
    for env in c["env"].as_array().into_iter().flatten() {
        let Some(value) = env["value"].as_str() else { continue };
        if value.starts_with("ghcr.io/") {
            if let Err(e) = our_image(value) {
                problems.push(format!("{ctx}: env {}: {e}", env["name"]));
            }
        } else if value.starts_with('/')
            && !mounts.iter().any(|m| Path::new(value).starts_with(m))
            && !cf.files.contains(value)
        {
            problems.push(format!("{ctx}: env {}={value} is neither in a volume nor in image {name}", env["name"]));
        }
    }
    problems
}

/// Every container (and init container) of every document, wherever its pod spec is.
fn containers<'a>(doc: &'a Value, at: String, found: &mut Vec<(String, &'a Value)>) {
    match doc {
        Value::Object(map) => {
            for (key, value) in map {
                if key == "containers" || key == "initContainers" {
                    for c in value.as_array().into_iter().flatten() {
                        found.push((format!("{at}/{key}/{}", c["name"].as_str().unwrap_or("?")), c));
                    }
                } else {
                    containers(value, format!("{at}/{key}"), found);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| containers(v, at.clone(), found)),
        _ => {}
    }
}

#[test]
fn manifests_exec_only_what_the_images_hold() {
    let (mut problems, mut checked) = (Vec::new(), 0);
    for file in &manifest_check::yaml_files(|_| true) {
        for doc in &manifest_check::documents(file) {
            let at =
                format!("{}:{}/{}", file.file_name().unwrap().to_string_lossy(), doc["kind"], doc["metadata"]["name"]);
            let mut found = Vec::new();
            containers(doc, at, &mut found);
            for (ctx, c) in found {
                checked += 1;
                problems.extend(container_problems(&ctx, c));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(checked >= 2, "expected the node agent's and the control plane's containers, checked {checked}");

    // The webhook injects the proxy image with no command: it must be ours, run by ENTRYPOINT.
    our_image(cnimesh_model::inject::DEFAULT_PROXY_IMAGE).unwrap();
    assert_eq!(Containerfile::read("cnimesh-proxy").entrypoint, ["/usr/local/bin/cnimesh-proxy"]);
    assert_eq!(
        Containerfile::read("cnimesh-proxy").user,
        "2102:2102",
        "the proxy UID (docs/architecture.md#names-and-numbers)"
    );

    // The check itself: the old preStop `sleep 5`, a shell probe and a bare name outside PATH fail.
    let node = format!("ghcr.io/cnimesh/cnimesh-node:{VERSION}");
    for bad in [
        serde_json::json!({"name": "a", "image": node, "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}}}),
        serde_json::json!({"name": "a", "image": node, "livenessProbe": {"exec": {"command": ["/bin/sh", "-c", "true"]}}}),
        serde_json::json!({"name": "a", "image": node, "command": ["cnimesh-cni"]}),
        serde_json::json!({"name": "a", "image": "ghcr.io/cnimesh/proxy:0.1.0"}),
    ] {
        assert!(!container_problems("self-check", &bad).is_empty(), "not caught: {bad}");
    }
}

/// podman on a private storage; removes its containers and images when dropped.
struct Podman {
    storage: tempfile::TempDir,
}

impl Podman {
    fn new() -> Self {
        Self { storage: tempfile::Builder::new().prefix("cnimesh-images").tempdir().unwrap() }
    }

    fn cmd(&self) -> Command {
        let mut cmd = Command::new("podman");
        let s = self.storage.path();
        cmd.arg("--root").arg(s.join("root")).arg("--runroot").arg(s.join("run"));
        cmd.args([
            "--storage-driver",
            "vfs",
            "--runtime",
            "runc",
            "--cgroup-manager",
            "cgroupfs",
            "--events-backend",
            "file",
        ]);
        cmd
    }

    fn run(&self, args: &[&str]) -> Output {
        let mut cmd = self.cmd();
        cmd.args(["run", "--rm", "--network", "none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]);
        output(cmd.args(args))
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self.cmd().args(["image", "unmount", "--all", "--force"]).output();
        let _ = self.cmd().args(["rm", "--all", "--force"]).output();
        let _ = self.cmd().args(["rmi", "--all", "--force"]).output();
    }
}

/// All regular files and symlinks under `root`, as absolute paths inside the image.
fn image_files(root: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for entry in fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                walk(root, &entry.path(), out);
            } else {
                out.insert(format!("/{}", entry.path().strip_prefix(root).unwrap().display()));
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(root, root, &mut out);
    out
}

#[test]
fn images_build_offline_and_run() {
    let tools = [
        ("podman", "podman"),
        ("runc", "runc"),
        ("strip", "binutils"),
        ("file", "file"),
        ("ldd", "libc-bin"),
        ("chroot", "coreutils"),
    ];
    if !require("images_build_offline_and_run", &tools) {
        return;
    }
    if !on_path("buildah") {
        eprintln!("note: buildah not found; scripts/images.sh builds with podman");
    }
    let tmp = tempfile::Builder::new().prefix("cnimesh-images-test").tempdir().unwrap();
    let bins = tmp.path().join("bins");
    fs::create_dir(&bins).unwrap();
    for (name, built) in [
        ("cnimesh-node", env!("CARGO_BIN_EXE_cnimesh-node-e2e")),
        ("cnimesh-control", env!("CARGO_BIN_EXE_cnimesh-control-e2e")),
        ("cnimesh-mirror", env!("CARGO_BIN_EXE_cnimesh-mirror-e2e")),
        ("cnimesh-proxy", env!("CARGO_BIN_EXE_cnimesh-proxy-e2e")),
    ] {
        std::os::unix::fs::symlink(built, bins.join(name)).unwrap();
    }
    std::os::unix::fs::symlink(static_plugin(), bins.join("cnimesh-cni")).unwrap();

    // Build into one storage and write the archives, then load them into a fresh one: the
    // archives are what a node imports.
    let build = Podman::new();
    let out = tmp.path().join("out");
    let log = ok(Command::new(workspace().join("scripts/images.sh"))
        .args(["--profile", "debug", "--bin-dir"])
        .arg(&bins)
        .arg("--out")
        .arg(&out)
        .arg("--storage")
        .arg(build.storage.path()));
    eprint!("{log}");
    let podman = Podman::new();
    for name in IMAGES {
        let archive = out.join(format!("{name}-{VERSION}.oci.tar"));
        assert!(archive.is_file(), "{} missing: {log}", archive.display());
        ok(podman.cmd().args(["load", "--quiet", "--input"]).arg(&archive));
    }
    drop(build);

    let mut sizes = Vec::new();
    for name in IMAGES {
        let image = format!("ghcr.io/cnimesh/{name}:{VERSION}");
        let inspect: Value = serde_json::from_str(&ok(podman.cmd().args(["image", "inspect", &image]))).unwrap();
        let inspect = &inspect[0];
        let labels = &inspect["Config"]["Labels"];
        assert_eq!(labels["org.opencontainers.image.title"], name, "{inspect}");
        assert_eq!(labels["org.opencontainers.image.version"], VERSION, "{inspect}");
        assert_eq!(labels["org.opencontainers.image.licenses"], "Apache-2.0", "{inspect}");
        let cf = Containerfile::read(name);
        assert_eq!(inspect["Config"]["User"], cf.user.as_str(), "{inspect}");
        sizes.push((image.clone(), inspect["Size"].as_u64().unwrap_or_default()));

        // --version through the ENTRYPOINT, as the image's own user, on a read-only root.
        let run = podman.run(&["--read-only", &image, "--version"]);
        assert!(run.status.success(), "{image} --version: {}", text(&run));
        assert_eq!(String::from_utf8_lossy(&run.stdout).trim(), format!("{name} {VERSION}"));

        // The file list: what the Containerfile copies, its /etc files, and shared libraries for
        // the dynamic binaries. No shell, no coreutils, nothing else.
        let mount = ok(podman.cmd().args(["image", "mount", &image]));
        let files = image_files(Path::new(mount.trim()));
        ok(podman.cmd().args(["image", "unmount", &image]));
        for expected in &cf.files {
            assert!(files.contains(expected), "{image} lacks {expected}: {files:?}");
        }
        let unexpected: Vec<&String> = files
            .iter()
            .filter(|f| !cf.files.contains(*f))
            .filter(|f| !((f.starts_with("/lib") || f.starts_with("/usr/lib")) && f.contains(".so")))
            .collect();
        assert!(unexpected.is_empty(), "{image} holds unexpected files {unexpected:?}");
        assert!(!files.contains("/bin/sh") && !files.iter().any(|f| f.ends_with("/sleep")), "{files:?}");
    }

    // The node image's installer against host dirs mounted like the DaemonSet's, with a primary
    // CNI's conflist in place: the static plugin lands in the bin dir and gets chained.
    let host = tmp.path().join("host");
    let (bin_dir, conf_dir) = (host.join("opt-cni-bin"), host.join("etc-cni-net.d"));
    fs::create_dir_all(&bin_dir).unwrap();
    fs::create_dir_all(&conf_dir).unwrap();
    let conflist = conf_dir.join("10-bridge.conflist");
    fs::write(
        &conflist,
        r#"{"cniVersion":"1.0.0","name":"bridge","plugins":[
  {"type":"bridge","bridge":"cni0","isGateway":true,"ipMasq":true,
   "ipam":{"type":"host-local","ranges":[[{"subnet":"10.88.0.0/16"}]]}},
  {"type":"portmap","capabilities":{"portMappings":true}}]}"#,
    )
    .unwrap();
    let node = format!("ghcr.io/cnimesh/cnimesh-node:{VERSION}");
    let volume = |host: &Path, container: &str| format!("{}:{container}", host.display());
    let run = podman.run(&[
        "--read-only",
        "-v",
        &volume(&bin_dir, "/host/opt/cni/bin"),
        "-v",
        &volume(&conf_dir, "/host/etc/cni/net.d"),
        "-e",
        "CNIMESH_CNI_BIN_DIR=/host/opt/cni/bin",
        "-e",
        "CNIMESH_CNI_CONF_DIR=/host/etc/cni/net.d",
        "-e",
        "CNIMESH_PLUGIN_BINARY=/opt/cnimesh/cnimesh-cni",
        &node,
        "install",
    ]);
    assert!(run.status.success(), "install: {}", text(&run));
    let installed = bin_dir.join("cnimesh-cni");
    assert_static(&installed);
    let version = output(Command::new(&installed).env("CNI_COMMAND", "VERSION").stdin(Stdio::null()));
    assert!(version.status.success() && text(&version).contains("supportedVersions"), "{}", text(&version));
    let chained: Value = serde_json::from_str(&fs::read_to_string(&conflist).unwrap()).unwrap();
    let types: Vec<&str> =
        chained["plugins"].as_array().unwrap().iter().map(|p| p["type"].as_str().unwrap_or_default()).collect();
    assert_eq!(types, ["bridge", "portmap", "cnimesh-cni"], "{chained}");

    // The preStop hook's command, as the manifest runs it (no `sleep` in the image).
    let run = podman.run(&["--read-only", &node, "pre-stop", "--seconds", "0"]);
    assert!(run.status.success(), "pre-stop: {}", text(&run));

    // The proxy as UID 2102 on a read-only root: a bad setting is a configuration error, not a
    // missing file or library.
    let proxy = format!("ghcr.io/cnimesh/cnimesh-proxy:{VERSION}");
    let run = podman.run(&["--user", "2102", "--read-only", &proxy, "--version"]);
    assert!(run.status.success(), "proxy --version: {}", text(&run));
    let run = podman.run(&["--user", "2102", "--read-only", "-e", "CNIMESH_PROXY_OPAQUE_PORTS=x", &proxy]);
    assert_eq!(run.status.code(), Some(2), "{}", text(&run));
    assert!(text(&run).contains("invalid configuration: CNIMESH_PROXY_OPAQUE_PORTS"), "{}", text(&run));

    eprintln!("\nimage sizes (debug binaries, stripped of debug info):");
    for (image, size) in sizes {
        eprintln!("  {image:<45} {:>6.1} MB", size as f64 / 1e6);
    }
}
