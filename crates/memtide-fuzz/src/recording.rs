//! Recordings, replayed as `memtide replay` does: the input is a recording file's
//! content (gzip, or JSON lines compressed here), each tick fed to a fresh engine.

use flate2::write::GzEncoder;
use flate2::Compression;
use memtide_core::policy::mom::Mom;
use memtide_core::EngineConfig;
use memtide_sim::replay::{replay, CAVEAT};
use std::io::Write;
use std::path::PathBuf;

/// The gzip magic number.
const GZIP: [u8; 2] = [0x1f, 0x8b];

/// The file written for each input, removed once read: one name per process, so that
/// parallel jobs do not share.
fn file() -> PathBuf {
    std::env::temp_dir().join(format!("memtide-fuzz-{}.jsonl.gz", std::process::id()))
}

pub fn run(data: &[u8]) {
    let content = if data.starts_with(&GZIP) {
        data.to_vec()
    } else {
        let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
        gz.write_all(data).expect("to memory");
        gz.finish().expect("to memory")
    };
    let path = file();
    std::fs::write(&path, content).expect("temporary file written");
    let report = replay(
        std::slice::from_ref(&path),
        &|| Box::new(Mom::default()),
        EngineConfig::default(),
    );
    // Each input's file goes once it is read (found: every test run left one in the
    // temporary directory).
    let _ = std::fs::remove_file(&path);
    let Ok(report) = report else {
        return;
    };
    assert_eq!(report.caveat, CAVEAT);
    assert!(report.ticks_differing <= report.ticks);
    assert!(report.differences.len() as u64 <= report.ticks_differing);
    assert!(report
        .per_vm
        .iter()
        .all(|vm| vm.ticks_differing <= report.ticks));
    report.text();
}
