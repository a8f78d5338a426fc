//! The documentation cannot drift from the code or rot on its own:
//!
//! - `docs/reference/cli/` holds one page per `cnimesh` command, each the command's `--help`
//!   rendered from the same clap definition the binary parses with. A page that differs, is
//!   missing, or names a command that no longer exists fails the test, which names the page and
//!   the command that regenerates them: `CNIMESH_UPDATE_DOCS=1 cargo test -p cnimesh-cli --test docs`.
//! - Every relative link in README.md, CHANGELOG.md and docs/**/*.md names a file that exists,
//!   and a `#fragment` names a heading of the page it points into (GitHub's heading slugs).
//! - README.md links every task page in docs/tasks/, so a new task is found from the front page.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Component, Path, PathBuf};

use clap::CommandFactory;

/// The repository root (this crate is one of its directories).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("cli/ has a parent").to_path_buf()
}

const CLI_DIR: &str = "docs/reference/cli";
const REGENERATE: &str = "CNIMESH_UPDATE_DOCS=1 cargo test -p cnimesh-cli --test docs";

/// Every command's page, by file name: `cnimesh.md`, `cnimesh-install.md`, `cnimesh-ca-init.md`…
fn cli_pages() -> BTreeMap<String, String> {
    // The pages must not depend on the environment the test runs in (KUBECONFIG's value).
    let cli = without_env_values(cnimesh_cli::Cli::command());
    let mut built = cli.clone();
    built.build();
    let mut pages = BTreeMap::new();
    render(&cli, &built, &mut Vec::new(), &mut pages);
    pages
}

fn without_env_values(cmd: clap::Command) -> clap::Command {
    cmd.mut_args(|arg| arg.hide_env_values(true)).mut_subcommands(without_env_values)
}

/// Exactly what `cnimesh <path> --help` prints: clap's own answer to that command line.
fn help(cli: &clap::Command, path: &[String]) -> String {
    let argv = path.iter().map(String::as_str).chain(["--help"]);
    match cli.clone().try_get_matches_from(argv) {
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp => e.render().to_string(),
        other => panic!("{path:?} --help did not print help: {other:?}"),
    }
}

fn render(cli: &clap::Command, cmd: &clap::Command, path: &mut Vec<String>, pages: &mut BTreeMap<String, String>) {
    path.push(cmd.get_name().to_string());
    let title = path.join(" ");
    let file = format!("{}.md", path.join("-"));
    let help = help(cli, path);
    let mut page = format!(
        "# {title}\n\n<!-- Generated from `{title} --help` by cli/tests/docs.rs; do not edit. \
         `{REGENERATE}` rewrites every page. -->\n\n```text\n{}\n```\n",
        help.trim_end()
    );
    let subcommands: Vec<String> =
        cmd.get_subcommands().map(|s| s.get_name().to_string()).filter(|name| name != "help").collect();
    if !subcommands.is_empty() {
        page.push_str("\n## Subcommands\n\n");
        for name in &subcommands {
            page.push_str(&format!("- [{title} {name}]({}-{name}.md)\n", path.join("-")));
        }
    }
    if path.len() > 1 {
        let parent = path[..path.len() - 1].join("-");
        page.push_str(&format!(
            "\nUp: [{}]({parent}.md) · [all commands](index.md)\n",
            path[..path.len() - 1].join(" ")
        ));
    } else {
        page.push_str("\nWhat each command is for: [the command table](index.md).\n");
    }
    pages.insert(file, page);
    for sub in cmd.get_subcommands() {
        if sub.get_name() != "help" {
            render(cli, sub, path, pages);
        }
    }
    path.pop();
}

#[test]
fn cli_reference_pages_equal_each_commands_help() {
    let dir = root().join(CLI_DIR);
    let pages = cli_pages();
    assert!(pages.len() > 10, "the CLI has its commands: {:?}", pages.keys());
    let on_disk: BTreeSet<String> = fs::read_dir(&dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|name| name.starts_with("cnimesh") && name.ends_with(".md"))
                .collect()
        })
        .unwrap_or_default();
    if std::env::var_os("CNIMESH_UPDATE_DOCS").is_some() {
        fs::create_dir_all(&dir).unwrap();
        for stale in on_disk.iter().filter(|name| !pages.contains_key(*name)) {
            fs::remove_file(dir.join(stale)).unwrap();
        }
        for (name, page) in &pages {
            fs::write(dir.join(name), page).unwrap();
        }
        return;
    }
    let mut problems = Vec::new();
    for (name, page) in &pages {
        match fs::read_to_string(dir.join(name)) {
            Ok(text) if text == *page => {}
            Ok(_) => problems.push(format!("{CLI_DIR}/{name} differs from the command's --help")),
            Err(_) => problems.push(format!("{CLI_DIR}/{name} is missing")),
        }
    }
    for stale in on_disk.iter().filter(|name| !pages.contains_key(*name)) {
        problems.push(format!("{CLI_DIR}/{stale} documents a command that does not exist"));
    }
    assert!(
        problems.is_empty(),
        "the CLI reference is stale:\n  {}\nregenerate it with `{REGENERATE}`",
        problems.join("\n  ")
    );
}

/// The Markdown files whose links must resolve.
fn markdown_files() -> Vec<PathBuf> {
    let root = root();
    let mut files = vec![root.join("README.md"), root.join("CHANGELOG.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The text outside fenced code blocks and inline code spans, where links are links.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            out.push('\n');
            continue;
        }
        if !fenced {
            let mut in_code = false;
            for c in line.chars() {
                if c == '`' {
                    in_code = !in_code;
                } else if !in_code {
                    out.push(c);
                }
            }
        }
        out.push('\n');
    }
    out
}

/// The targets of `[text](target)` links (the text may span lines).
fn link_targets(text: &str) -> Vec<String> {
    let prose = prose(text);
    let mut targets = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].split_whitespace().next().unwrap_or("").to_string();
        targets.push(target);
        rest = &rest[end..];
    }
    targets
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as dashes, repeats
/// numbered.
fn slugs(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let heading = line.trim_start_matches('#').trim();
        let slug: String = heading
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        out.insert(if *n == 0 { slug.clone() } else { format!("{slug}-{n}") });
        *n += 1;
    }
    out
}

/// `a/b/../c` as `a/c`, without touching the file system.
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[test]
fn every_relative_link_in_the_docs_resolves_to_a_file_and_heading() {
    let root = root();
    let mut broken = Vec::new();
    let files = markdown_files();
    assert!(files.len() > 20, "the docs tree is there: {files:?}");
    for file in &files {
        let text = fs::read_to_string(file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let shown = file.strip_prefix(&root).unwrap_or(file).display().to_string();
        for target in link_targets(&text) {
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = match target.split_once('#') {
                Some((path, fragment)) => (path, Some(fragment)),
                None => (target.as_str(), None),
            };
            let linked = if path.is_empty() { file.clone() } else { normalise(&file.parent().unwrap().join(path)) };
            if !linked.exists() {
                broken.push(format!("{shown}: {target}: no such file"));
                continue;
            }
            let Some(fragment) = fragment else { continue };
            if linked.extension().is_some_and(|e| e == "md") {
                let headings = slugs(&fs::read_to_string(&linked).unwrap());
                if !headings.contains(fragment) {
                    broken.push(format!("{shown}: {target}: no heading with anchor #{fragment}"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n  {}", broken.join("\n  "));
}

#[test]
fn the_readme_links_every_task_page() {
    let root = root();
    let readme = fs::read_to_string(root.join("README.md")).expect("reading README.md");
    let linked: BTreeSet<PathBuf> =
        link_targets(&readme).iter().map(|t| normalise(Path::new(t.split('#').next().unwrap_or("")))).collect();
    let tasks = root.join("docs/tasks");
    let mut unlinked = Vec::new();
    for entry in fs::read_dir(&tasks).unwrap_or_else(|e| panic!("reading {}: {e}", tasks.display())) {
        let name = entry.unwrap().file_name();
        let page = Path::new("docs/tasks").join(&name);
        if page.extension().is_some_and(|e| e == "md") && !linked.contains(&page) {
            unlinked.push(page.display().to_string());
        }
    }
    unlinked.sort();
    assert!(unlinked.is_empty(), "README.md does not link these task pages:\n  {}", unlinked.join("\n  "));
}

#[test]
fn the_link_checker_sees_links_and_anchors_as_github_renders_them() {
    let text = "# `cnimesh check` output explained\n## 403 Forbidden\n## Lessons\n## Lessons\n\
                see [a\npage](x.md#y) and `[not](a link)`\n```\n[nor](this)\n```\n";
    assert_eq!(link_targets(text), vec!["x.md#y".to_string()]);
    let anchors = slugs(text);
    for anchor in ["cnimesh-check-output-explained", "403-forbidden", "lessons", "lessons-1"] {
        assert!(anchors.contains(anchor), "{anchor} in {anchors:?}");
    }
}
