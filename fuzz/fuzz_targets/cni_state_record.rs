//! The attachment record reader (GC, the node agent's repair loop and the debug CLI read files
//! anyone with access to the state dir could have edited). A record that reads writes back as
//! itself, and the file name derived from its ids stays inside the records directory.
#![no_main]

use std::path::{Component, Path};

use cnimesh_cni::state::{RECORD_VERSION, StateStore, parse_record};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(record) = parse_record(data) else { return };
    assert!(record.version <= RECORD_VERSION);
    let written = serde_json::to_vec_pretty(&record).unwrap();
    assert_eq!(parse_record(&written).expect("a written record reads back"), record);
    let store = StateStore::new(Path::new("/var/lib/cnimesh"));
    let path = store.path(&record.network, &record.container_id, &record.ifname);
    assert_eq!(path.parent(), Some(store.dir()), "{path:?}");
    assert!(path.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_))), "{path:?}");
});
