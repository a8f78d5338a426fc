//! `CNIMESH_LOG_FORMAT=json` end to end: the real `cnimesh` binary writes its log lines to stderr
//! as JSON objects with a level and a message (the same `cnimesh_common::logging` every binary
//! initialises with), and refuses a format it does not know, by name.

use std::process::Command;

use serde_json::Value;

#[test]
fn the_cli_started_with_json_format_writes_json_lines_with_level_and_message() {
    let output = Command::new(env!("CARGO_BIN_EXE_cnimesh"))
        .args(["version", "--client"])
        .env("CNIMESH_LOG", "debug")
        .env("CNIMESH_LOG_FORMAT", "json")
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let stderr = String::from_utf8(output.stderr).unwrap();
    let lines: Vec<Value> =
        stderr.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"))).collect();
    let line = lines.iter().find(|l| l["message"] == "cnimesh version").unwrap_or_else(|| panic!("{stderr}"));
    assert_eq!(line["level"], "DEBUG");
    assert_eq!(line["version"], env!("CARGO_PKG_VERSION"));
    assert!(String::from_utf8(output.stdout).unwrap().starts_with("client: "), "stdout keeps the report");
}

#[test]
fn an_unknown_log_format_is_refused_by_name() {
    let output = Command::new(env!("CARGO_BIN_EXE_cnimesh"))
        .args(["version", "--client"])
        .env("CNIMESH_LOG_FORMAT", "yaml")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("CNIMESH_LOG_FORMAT=\"yaml\": expected plain or json"), "{stderr}");
}
