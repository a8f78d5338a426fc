//! Files-source YAML (local mode's cluster state; a file anyone with the directory can write).
//! Never a panic or a hang; the objects read, written back as JSON (which is YAML), read again
//! as the same objects.
#![no_main]

use cnimesh_control::destination::Object;
use cnimesh_control::sources::parse_files_for_fuzzing as parse;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fn to_value(object: &Object) -> Value {
    match object {
        Object::Service(o) => serde_json::to_value(o.as_ref()),
        Object::EndpointSlice(o) => serde_json::to_value(o.as_ref()),
        Object::Pod(o) => serde_json::to_value(o.as_ref()),
    }
    .expect("a Kubernetes object serialises")
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(objects) = parse(text) else { return };
    let written: Vec<String> = objects.iter().map(|o| to_value(o).to_string()).collect();
    let again = parse(&written.join("\n---\n")).unwrap_or_else(|e| panic!("written objects do not read back: {e}"));
    assert_eq!(again.len(), objects.len());
    for (a, b) in objects.iter().zip(&again) {
        assert_eq!((a.kind(), a.key()), (b.kind(), b.key()));
        assert_eq!(to_value(a), to_value(b));
    }
});
