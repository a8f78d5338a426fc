//! `CNI_ARGS` and the rest of the CNI_* environment, as a runtime (or anyone able to exec the
//! plugin) sets them. Errors are code 4; parsed args print back and parse to the same map.
#![no_main]

use cnimesh_cni::env::{self, Command};
use cnimesh_cni::error::ErrorCode;
use cnimesh_fuzz::assert_cni_error_json;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match env::parse_args(text) {
        Ok(args) => {
            for (k, v) in &args {
                assert!(!k.is_empty() && !k.contains(['=', ';']), "key {k:?}");
                assert!(!v.contains(';'), "value {v:?}");
            }
            let printed: Vec<String> = args.iter().map(|(k, v)| format!("{k}={v}")).collect();
            assert_eq!(env::parse_args(&printed.join(";")).unwrap(), args);
        }
        Err(e) => {
            assert_eq!(e.code, ErrorCode::InvalidEnv);
            assert_cni_error_json(&e, "1.1.0");
        }
    }
    // The whole environment: the first lines are CNI_COMMAND, CNI_CONTAINERID, CNI_NETNS and
    // CNI_IFNAME (absent when missing), the rest is CNI_ARGS.
    let mut lines = text.splitn(5, '\n');
    let vars: Vec<(&str, Option<&str>)> = ["CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS"]
        .into_iter()
        .map(|k| (k, lines.next()))
        .collect();
    let get = |name: &str| vars.iter().find(|(k, _)| *k == name).and_then(|(_, v)| v.map(str::to_string));
    let command = match env::parse_command(get("CNI_COMMAND").as_deref()) {
        Ok(c) => c,
        Err(e) => {
            assert_eq!(e.code, ErrorCode::InvalidEnv);
            return;
        }
    };
    match env::from_vars(command, get) {
        Ok(parsed) => {
            if matches!(command, Command::Add | Command::Check) {
                assert!(!parsed.netns.is_empty());
            }
            if matches!(command, Command::Add | Command::Check | Command::Del) {
                assert!(!parsed.container_id.is_empty() && !parsed.ifname.is_empty());
            }
        }
        Err(e) => assert_eq!(e.code, ErrorCode::InvalidEnv),
    }
});
