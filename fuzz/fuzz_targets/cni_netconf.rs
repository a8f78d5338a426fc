//! The plugin's stdin (the network configuration with its `prevResult`), for every cniVersion it
//! accepts: parse, spec, result conversion. Errors are CNI error objects with the right codes;
//! what parses round-trips.
#![no_main]

use cnimesh_cni::config::NetConf;
use cnimesh_cni::error::ErrorCode;
use cnimesh_cni::{result, version};
use cnimesh_fuzz::{assert_cni_error_json, assert_json_round_trip};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    check(data);
    // The same object under every version the plugin speaks, so each conversion path is fuzzed
    // whatever version the input names.
    if let Ok(Value::Object(mut obj)) = serde_json::from_slice::<Value>(data) {
        for v in version::SUPPORTED {
            obj.insert("cniVersion".into(), Value::from(*v));
            check(&serde_json::to_vec(&obj).unwrap());
        }
    }
});

fn check(stdin: &[u8]) {
    let requested = version::requested(stdin);
    assert!(version::is_supported(&requested));
    let conf = match NetConf::parse(stdin) {
        Ok(conf) => conf,
        Err(e) => {
            assert!(
                matches!(e.code, ErrorCode::Decode | ErrorCode::InvalidConfig | ErrorCode::IncompatibleVersion),
                "{e:?}"
            );
            assert_cni_error_json(&e, &requested);
            return;
        }
    };
    assert!(version::is_supported(&conf.cni_version));
    assert_eq!(conf.cni_version, requested);
    match conf.spec() {
        Ok(spec) => {
            spec.validate().expect("a spec from the configuration is valid");
            assert_eq!(spec.clone().normalized(), spec, "spec() normalises");
            let json = serde_json::to_value(&spec).unwrap();
            let back: cnimesh_cni::spec::RedirectSpec =
                serde_json::from_value(json.clone()).unwrap_or_else(|e| panic!("spec {json} does not read back: {e}"));
            assert_eq!(back, spec);
        }
        Err(e) => {
            assert_eq!(e.code, ErrorCode::InvalidConfig, "{e:?}");
            assert_cni_error_json(&e, &conf.cni_version);
        }
    }
    let _ = conf.excludes(Some("default"));
    let Some(prev) = &conf.prev_result else { return };
    match result::convert(prev, &conf.cni_version) {
        Ok(out) => {
            assert_eq!(out["cniVersion"], conf.cni_version.as_str());
            let legacy = !version::at_least(&conf.cni_version, "1.0.0");
            for ip in out.get("ips").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_object) {
                assert_eq!(ip.contains_key("version"), legacy, "{out}");
            }
            // Converting again to the same version changes nothing; the output is JSON that
            // reads back as itself (it is printed to the runtime).
            assert_eq!(result::convert(&out, &conf.cni_version).unwrap(), out);
            assert_json_round_trip(&out);
        }
        Err(e) => {
            assert!(matches!(e.code, ErrorCode::InvalidConfig | ErrorCode::IncompatibleVersion), "{e:?}");
            assert_cni_error_json(&e, &conf.cni_version);
        }
    }
}
