//! The dashboard page's npm packages (`dashboard-web/`, bundled into the binary by `build.rs`):
//! every package the lock installs has a licence we may ship (MIT, ISC, BSD, Apache-2.0, 0BSD),
//! and `package.json` pins exact versions, so the lock is the whole story.

use std::path::Path;

use serde_json::Value;

const ALLOWED: [&str; 6] = ["MIT", "ISC", "BSD-2-Clause", "BSD-3-Clause", "Apache-2.0", "0BSD"];

fn read(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboard-web").join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_bundled_npm_package_has_an_allowed_licence() {
    let lock = read("package-lock.json");
    let packages = lock["packages"].as_object().expect("a lockfile v3 `packages` map");
    let mut checked = 0;
    for (path, package) in packages.iter().filter(|(path, _)| !path.is_empty()) {
        let licence = package["license"].as_str().unwrap_or("(none)");
        // An SPDX expression with OR may be taken under any of its terms.
        let ok = licence.trim_matches(|c| c == '(' || c == ')').split(" OR ").any(|l| ALLOWED.contains(&l.trim()));
        assert!(ok, "{path}: licence {licence}, not one of {ALLOWED:?}");
        checked += 1;
    }
    assert!(checked >= 3, "cytoscape, cytoscape-dagre and esbuild at least: {checked}");
}

#[test]
fn the_page_s_npm_dependencies_are_pinned_to_exact_versions() {
    let manifest = read("package.json");
    for section in ["dependencies", "devDependencies"] {
        for (name, version) in manifest[section].as_object().unwrap() {
            let version = version.as_str().unwrap();
            assert!(
                version.chars().all(|c| c.is_ascii_digit() || c == '.'),
                "{section}.{name}: {version:?} is not an exact version"
            );
        }
    }
}
