//! The chained plugin's result: the previous plugin's, converted to the requested version.
//!
//! Results 0.3.0–1.1.0 share one shape except that 0.3.x/0.4.0 tag each IP with `"version"`,
//! which 1.0.0 dropped; conversion adds or removes that tag and sets `cniVersion`.

use serde_json::Value;

use crate::error::{CniError, ErrorCode, Result};
use crate::version;

pub fn convert(prev: &Value, target: &str) -> Result<Value> {
    let mut out = prev.clone();
    let Some(obj) = out.as_object_mut() else {
        return Err(CniError::new(ErrorCode::InvalidConfig, "prevResult is not a JSON object"));
    };
    if obj.contains_key("ip4") || obj.contains_key("ip6") {
        return Err(CniError::new(
            ErrorCode::IncompatibleVersion,
            "prevResult is in the pre-0.3.0 format (ip4/ip6), which cnimesh-cni cannot convert",
        ));
    }
    // Fields added in 1.1.0; older readers do not know them (libcni drops them too).
    if !version::at_least(target, "1.1.0") {
        for (list, fields) in [
            ("interfaces", &["mtu", "socketPath", "pciID"][..]),
            ("routes", &["mtu", "advmss", "priority", "table", "scope"][..]),
        ] {
            for item in
                obj.get_mut(list).and_then(Value::as_array_mut).into_iter().flatten().filter_map(Value::as_object_mut)
            {
                for f in fields {
                    item.remove(*f);
                }
            }
        }
    }
    let legacy = !version::at_least(target, "1.0.0");
    if let Some(ips) = obj.get_mut("ips").and_then(Value::as_array_mut) {
        for ip in ips.iter_mut().filter_map(Value::as_object_mut) {
            if legacy {
                let is_v6 = ip.get("address").and_then(Value::as_str).is_some_and(|a| a.contains(':'));
                ip.entry("version").or_insert_with(|| Value::from(if is_v6 { "6" } else { "4" }));
            } else {
                ip.remove("version");
            }
        }
    }
    obj.insert("cniVersion".into(), Value::from(target));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bridge_result() -> Value {
        json!({"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/var/run/netns/x"}],
               "ips":[{"interface":0,"address":"10.1.0.2/24","gateway":"10.1.0.1"},{"interface":0,"address":"fd00::2/64"}],
               "routes":[{"dst":"0.0.0.0/0"}],"dns":{}})
    }

    #[test]
    fn down_and_up_conversion() {
        let old = convert(&bridge_result(), "0.4.0").unwrap();
        assert_eq!(old["cniVersion"], "0.4.0");
        assert_eq!(old["ips"][0]["version"], "4");
        assert_eq!(old["ips"][1]["version"], "6");
        assert_eq!(old["interfaces"], bridge_result()["interfaces"]);
        let new = convert(&old, "1.1.0").unwrap();
        assert_eq!(new["cniVersion"], "1.1.0");
        assert!(new["ips"][0].get("version").is_none());
        assert_eq!(new["ips"], bridge_result()["ips"]);
    }

    #[test]
    fn newer_fields_are_dropped_for_older_readers() {
        let mut r = bridge_result();
        r["interfaces"][0]["mtu"] = json!(1500);
        r["routes"][0]["table"] = json!(100);
        let old = convert(&r, "1.0.0").unwrap();
        assert!(old["interfaces"][0].get("mtu").is_none() && old["routes"][0].get("table").is_none());
        assert_eq!(convert(&r, "1.1.0").unwrap()["interfaces"][0]["mtu"], 1500);
    }

    #[test]
    fn numbers_in_the_result_are_printed_back_unchanged() {
        // Found by fuzz/fuzz_targets/cni_netconf.rs: a float read inexactly printed back one ULP off.
        let stdin = br#"{"cniVersion":"1.1.0","routes":[{"table":1022222222222222222.22222}]}"#;
        let prev: Value = serde_json::from_slice(stdin).unwrap();
        let printed = convert(&prev, "1.1.0").unwrap().to_string();
        let read_back: Value = serde_json::from_str(&printed).unwrap();
        assert_eq!(read_back, prev, "{printed}");
    }

    #[test]
    fn rejects_non_objects_and_ancient_results() {
        assert_eq!(convert(&json!([1]), "1.0.0").unwrap_err().code, ErrorCode::InvalidConfig);
        assert_eq!(convert(&json!({"ip4":{}}), "1.0.0").unwrap_err().code, ErrorCode::IncompatibleVersion);
    }
}
