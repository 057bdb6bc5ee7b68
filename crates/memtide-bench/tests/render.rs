//! `memtide-bench --render`: a results file's plot drawn again, where `--out` says.

use std::path::Path;
use std::process::Command;

fn bench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_memtide-bench"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn a_plot_is_drawn_again_into_out_and_only_from_a_results_file() {
    let dir = tempfile::tempdir().unwrap();
    let results = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/results");
    let input = dir.path().join("coldmem.json");
    std::fs::copy(results.join("coldmem-memtide.json"), &input).unwrap();
    let out = dir.path().join("plots");
    std::fs::create_dir(&out).unwrap();
    let o = bench(&[
        "--render",
        input.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let svg = std::fs::read_to_string(out.join("coldmem.svg")).unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
    assert!(
        !dir.path().join("coldmem.svg").exists(),
        "not beside its input"
    );
    // Without --out: beside it.
    let o = bench(&["--render", input.to_str().unwrap()]);
    assert!(o.status.success());
    assert!(dir.path().join("coldmem.svg").exists());
    // A JSON file that holds no results is refused, and nothing drawn.
    let other = dir.path().join("other.json");
    std::fs::write(&other, "[1, 2]").unwrap();
    let o = bench(&["--render", other.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("not a results file"), "{err}");
    assert!(!dir.path().join("other.svg").exists());
}
