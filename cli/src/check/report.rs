//! What a check found, and the two ways of showing it. Rendering is pure (no clock, no cluster)
//! so that the golden files in `control/tests/golden/` pin the exact text an operator reads.
//!
//! Layer: runtime (operator CLI), pure rendering.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The part of the installation a check looks at: the table groups checks under it and `-o json`
/// carries it as the text of [`fmt::Display`] (what operators and scripts match on), so the names
/// below are part of the CLI's interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Category {
    KubernetesApi,
    KubernetesVersion,
    Permissions,
    PreInstall,
    ControlPlane,
    Webhook,
    Certificates,
    NodeAgents,
    MeshedPods,
    Multicluster,
    /// The checks of one multicluster Link, by the Link's name (`link NAME`).
    Link(String),
}

/// The text of a category name nothing in the CLI reports.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown check category {0:?}")]
pub struct UnknownCategory(pub String);

impl Category {
    /// Every category whose name is fixed (all but [`Category::Link`]).
    pub const FIXED: [Category; 10] = [
        Category::KubernetesApi,
        Category::KubernetesVersion,
        Category::Permissions,
        Category::PreInstall,
        Category::ControlPlane,
        Category::Webhook,
        Category::Certificates,
        Category::NodeAgents,
        Category::MeshedPods,
        Category::Multicluster,
    ];

    const LINK_PREFIX: &'static str = "link ";

    /// The text operators read and `-o json` carries.
    pub fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed(match self {
            Category::KubernetesApi => "kubernetes-api",
            Category::KubernetesVersion => "kubernetes-version",
            Category::Permissions => "permissions",
            Category::PreInstall => "pre-install",
            Category::ControlPlane => "control-plane",
            Category::Webhook => "webhook",
            Category::Certificates => "certificates",
            Category::NodeAgents => "node-agents",
            Category::MeshedPods => "meshed-pods",
            Category::Multicluster => "multicluster",
            Category::Link(link) => return Cow::Owned(format!("{}{link}", Self::LINK_PREFIX)),
        })
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl FromStr for Category {
    type Err = UnknownCategory;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if let Some(link) = text.strip_prefix(Self::LINK_PREFIX) {
            return Ok(Category::Link(link.to_string()));
        }
        Self::FIXED.into_iter().find(|c| c.name() == text).ok_or_else(|| UnknownCategory(text.to_string()))
    }
}

impl Serialize for Category {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Category {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer)?.parse().map_err(serde::de::Error::custom)
    }
}

/// The outcome of one check. `Skip` is for checks that could not run because something they
/// depend on failed first; the failure that caused it is reported on its own line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
    Skip,
}

impl Status {
    fn symbol(self) -> &'static str {
        match self {
            Status::Ok => "√",
            Status::Warn => "‼",
            Status::Fail => "×",
            Status::Skip => "-",
        }
    }
}

/// One line of the report: what was checked, what was found and, when it is not ok, what to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    pub category: Category,
    pub name: String,
    pub status: Status,
    pub message: String,
    /// Items behind the message (failing nodes, drifted pods...), one per line.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

impl Check {
    pub fn new(category: &Category, name: &str, status: Status, message: impl Into<String>) -> Self {
        Check {
            category: category.clone(),
            name: name.to_string(),
            status,
            message: message.into(),
            details: Vec::new(),
            hint: None,
        }
    }
    pub fn ok(category: &Category, name: &str, message: impl Into<String>) -> Self {
        Self::new(category, name, Status::Ok, message)
    }
    pub fn warn(category: &Category, name: &str, message: impl Into<String>, hint: impl Into<String>) -> Self {
        Self::new(category, name, Status::Warn, message).hint(hint)
    }
    pub fn fail(category: &Category, name: &str, message: impl Into<String>, hint: impl Into<String>) -> Self {
        Self::new(category, name, Status::Fail, message).hint(hint)
    }
    pub fn skip(category: &Category, name: &str, why: impl Into<String>) -> Self {
        Self::new(category, name, Status::Skip, why)
    }
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
    pub fn details(mut self, details: Vec<String>) -> Self {
        self.details = details;
        self
    }
}

/// "1 pod", "2 pods"; a consonant before a final y makes "ies" ("2 proxies", but "2 days").
pub fn plural(n: usize, noun: &str) -> String {
    if n == 1 {
        return format!("1 {noun}");
    }
    match noun.strip_suffix('y') {
        Some(stem) if stem.ends_with(|c: char| c.is_ascii_alphabetic() && !"aeiou".contains(c)) => {
            format!("{n} {stem}ies")
        }
        _ => format!("{n} {noun}s"),
    }
}

/// The JSON document of `-o json`: every check plus the verdict the exit code carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub success: bool,
    pub checks: Vec<Check>,
}

impl Report {
    /// The report of `checks` (what `-o json` prints and the dashboard serves).
    pub fn of(checks: &[Check]) -> Self {
        Self { success: success(checks), checks: checks.to_vec() }
    }
}

/// Warnings and skips do not fail the run: only a failed check does.
pub fn success(checks: &[Check]) -> bool {
    !checks.iter().any(|c| c.status == Status::Fail)
}

pub fn render_json(checks: &[Check]) -> String {
    let mut text = serde_json::to_string_pretty(&Report::of(checks)).expect("a report always serialises");
    text.push('\n');
    text
}

/// Like `linkerd check`: categories in the order they were first reported, one line per check,
/// details and a hint indented below the checks that need them, a verdict at the end.
pub fn render_table(checks: &[Check]) -> String {
    let mut categories: Vec<&Category> = Vec::new();
    for check in checks {
        if !categories.contains(&&check.category) {
            categories.push(&check.category);
        }
    }
    let mut out = String::new();
    for category in categories {
        let title = category.name();
        out.push_str(&title);
        out.push('\n');
        out.push_str(&"-".repeat(title.chars().count()));
        out.push('\n');
        for check in checks.iter().filter(|c| &c.category == category) {
            out.push_str(check.status.symbol());
            out.push(' ');
            out.push_str(&check.name);
            if !check.message.is_empty() {
                out.push_str(": ");
                out.push_str(&check.message);
            }
            out.push('\n');
            for detail in &check.details {
                out.push_str("    ");
                out.push_str(detail);
                out.push('\n');
            }
            if let Some(hint) = &check.hint {
                out.push_str("    hint: ");
                out.push_str(hint);
                out.push('\n');
            }
        }
        out.push('\n');
    }
    let count = |s: Status| checks.iter().filter(|c| c.status == s).count();
    let verdict = if success(checks) { Status::Ok } else { Status::Fail };
    out.push_str(&format!(
        "Status check results are {} ({} ok, {} warnings, {} failed, {} skipped)\n",
        verdict.symbol(),
        count(Status::Ok),
        count(Status::Warn),
        count(Status::Fail),
        count(Status::Skip)
    ));
    out
}
