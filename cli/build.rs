//! Bundles the dashboard's page script (`dashboard-web/`: our `src/app.js` and the graph layout
//! libraries pinned in its `package-lock.json`) into one file, `$OUT_DIR/dashboard/app.js`, that
//! the binary embeds: nothing is loaded from elsewhere at run time.
//!
//! The npm packages are installed with `npm ci` (exactly the lock's versions, no install scripts)
//! into `$OUT_DIR`, never into the source tree, and only when the lock changed; esbuild (a pinned
//! dev dependency) bundles. Needs node and npm (`scripts/setup.sh` installs Debian's).

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let web = manifest.join("dashboard-web");
    for input in ["package.json", "package-lock.json", "src"] {
        println!("cargo:rerun-if-changed={}", web.join(input).display());
    }
    let work = out.join("dashboard-web");
    if let Err(e) = bundle(&web, &work, &out.join("dashboard")) {
        panic!(
            "building the dashboard's page ({}): {e}\n\
             it needs node and npm (Debian: `apt-get install nodejs npm`; `bash scripts/setup.sh` installs them) \
             and the npm registry, or its packages in npm's cache",
            web.display()
        );
    }
}

fn bundle(web: &Path, work: &Path, dest: &Path) -> Result<(), String> {
    std::fs::create_dir_all(work).map_err(|e| format!("creating {}: {e}", work.display()))?;
    std::fs::create_dir_all(dest).map_err(|e| format!("creating {}: {e}", dest.display()))?;
    let lock = read(&web.join("package-lock.json"))?;
    // `npm ci` again only when the lock changed: the copy beside node_modules says what it holds.
    let installed = work.join("installed-package-lock.json");
    if std::fs::read(&installed).ok().as_deref() != Some(lock.as_slice()) || !work.join("node_modules").is_dir() {
        copy(&web.join("package.json"), &work.join("package.json"))?;
        copy(&web.join("package-lock.json"), &work.join("package-lock.json"))?;
        run(
            Command::new("npm")
                .args(["ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"])
                .current_dir(work),
            "npm ci",
        )?;
        std::fs::write(&installed, &lock).map_err(|e| format!("writing {}: {e}", installed.display()))?;
    }
    // The sources next to node_modules, so that esbuild resolves the packages from there.
    let src = work.join("src");
    let _ = std::fs::remove_dir_all(&src);
    std::fs::create_dir_all(&src).map_err(|e| format!("creating {}: {e}", src.display()))?;
    let entries = std::fs::read_dir(web.join("src")).map_err(|e| format!("reading {}/src: {e}", web.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("reading {}/src: {e}", web.display()))?;
        copy(&entry.path(), &src.join(entry.file_name()))?;
    }
    let outfile = dest.join("app.js");
    run(
        Command::new("node")
            .arg(work.join("node_modules/esbuild/bin/esbuild"))
            .arg(src.join("app.js"))
            .args([
                "--bundle",
                "--format=esm",
                "--minify",
                "--legal-comments=eof",
                "--target=es2020",
                "--log-level=warning",
            ])
            .arg(format!("--outfile={}", outfile.display()))
            .current_dir(work),
        "esbuild",
    )
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))
}

fn copy(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::copy(from, to).map(drop).map_err(|e| format!("copying {} to {}: {e}", from.display(), to.display()))
}

fn run(command: &mut Command, what: &str) -> Result<(), String> {
    // A build script's stdout is read by cargo as instructions: the tools talk on stderr.
    let status = command.stdout(std::io::stderr()).status().map_err(|e| format!("running {what}: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("{what} failed ({status})")) }
}
