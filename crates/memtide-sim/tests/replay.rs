//! Recordings and replay: the recorder's files, and replaying a recording the simulator
//! made (`tests/data/quick-mom.jsonl.gz`: the `quick` scenario under `mom`, 120 ticks).

use memtide_core::policy::mom::Mom;
use memtide_core::policy::none::Unmanaged;
use memtide_core::EngineConfig;
use memtide_sim::replay::CAVEAT;
use memtide_sim::{
    recording_files, replay, Recorder, RecorderConfig, Records, Scenario, Simulation,
};
use std::io::{Read, Write};
use std::path::PathBuf;

fn committed() -> Vec<PathBuf> {
    vec![PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/quick-mom.jsonl.gz")]
}

/// Record `ticks` ticks of the quick scenario under mom into `dir`.
fn record(dir: &std::path::Path, ticks: u64, config: RecorderConfig) {
    let mut scenario = Scenario::builtin("quick").unwrap();
    scenario.ticks = ticks;
    let mut recorder = Recorder::open(dir, config).unwrap();
    Simulation::new(
        &scenario,
        Box::new(Mom::default()),
        EngineConfig::default(),
        1,
    )
    .run_with(|snap, decision| recorder.record(snap, decision).unwrap());
    recorder.finish().unwrap();
}

#[test]
#[ignore = "rewrites tests/data/quick-mom.jsonl.gz: run it when the snapshot format, the model or mom changes"]
fn regenerate_the_committed_recording() {
    let dir = tempfile::tempdir().unwrap();
    record(dir.path(), 120, RecorderConfig::default());
    std::fs::copy(dir.path().join("record-0.jsonl.gz"), &committed()[0]).unwrap();
}

#[test]
fn replaying_the_recorded_policy_changes_nothing() {
    let report = replay(
        &committed(),
        &|| Box::new(Mom::default()),
        EngineConfig::default(),
    )
    .unwrap();
    assert_eq!(report.ticks, 120);
    assert_eq!(report.recorded_policy, "mom");
    assert_eq!(report.ticks_differing, 0, "{}", report.text());
    assert_eq!(report.per_vm.len(), 4);
    for vm in &report.per_vm {
        assert_eq!(vm.recorded, vm.replayed);
        assert_eq!(vm.mean_target_gap_mib, 0.0);
    }
}

#[test]
fn replaying_another_policy_shows_what_it_would_not_have_reclaimed() {
    let report = replay(
        &committed(),
        &|| Box::new(Unmanaged),
        EngineConfig::default(),
    )
    .unwrap();
    assert_eq!(report.policy, "none");
    assert!(report.ticks_differing > 0);
    let reclaimed: f64 = report.per_vm.iter().map(|v| v.recorded.reclaimed_mib).sum();
    assert!(reclaimed > 0.0, "mom reclaimed memory in the recording");
    for vm in &report.per_vm {
        assert_eq!(vm.replayed.actions, 0, "none never resizes");
        assert!(
            vm.mean_target_gap_mib >= 0.0,
            "none keeps VMs at least as large"
        );
    }
    let text = report.text();
    assert!(text.starts_with(&format!("note: {CAVEAT}")), "{text}");
    assert!(text.contains("recorded"), "{text}");
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["caveat"], CAVEAT);
}

#[test]
fn the_recorder_rotates_and_keeps_the_newest_files() {
    let dir = tempfile::tempdir().unwrap();
    let config = RecorderConfig {
        max_file_bytes: 4096,
        keep_files: 3,
    };
    record(dir.path(), 60, config.clone());
    let files = recording_files(dir.path()).unwrap();
    assert_eq!(files.len(), 3);
    let last: u64 = files[2]
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .trim_start_matches("record-")
        .trim_end_matches(".jsonl.gz")
        .parse()
        .unwrap();
    assert!(last >= 3, "older files were deleted");
    // The kept files hold the last ticks, in order.
    let times: Vec<f64> = Records::open(&files)
        .map(|r| r.unwrap().snapshot.at.as_secs_f64())
        .collect();
    assert!(!times.is_empty());
    assert!(times.windows(2).all(|w| w[1] == w[0] + 1.0), "{times:?}");
    assert_eq!(*times.last().unwrap(), 60.0);
    // A new recorder continues after the existing files.
    record(dir.path(), 1, config);
    let newest = recording_files(dir.path()).unwrap().pop().unwrap();
    assert!(newest.ends_with(format!("record-{}.jsonl.gz", last + 1)));
}

#[test]
fn a_cut_recording_is_read_up_to_the_cut() {
    let dir = tempfile::tempdir().unwrap();
    record(dir.path(), 30, RecorderConfig::default());
    let path = dir.path().join("record-0.jsonl.gz");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let mut records = Records::open(std::slice::from_ref(&path));
    let read: Vec<_> = records.by_ref().collect();
    assert!(read.iter().all(Result::is_ok));
    let n = read.len();
    assert!(n > 5 && n < 30, "{n}");
    assert_eq!(records.truncated, vec![path.clone()]);
    let report = replay(
        &[path],
        &|| Box::new(Mom::default()),
        EngineConfig::default(),
    )
    .unwrap();
    assert_eq!(report.truncated_files.len(), 1);
    assert!(report.text().contains("ends early"));
}

#[test]
fn a_file_that_is_no_recording_is_an_error_not_an_empty_replay() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.jsonl.gz");
    std::fs::write(&path, "garbage\n").unwrap();
    let e = replay(
        std::slice::from_ref(&path),
        &|| Box::new(Mom::default()),
        EngineConfig::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("bad.jsonl.gz: not a recording"), "{e}");
    // Cut before its first line is still a recording that ended early.
    record(dir.path(), 3, RecorderConfig::default());
    let cut = dir.path().join("record-0.jsonl.gz");
    let bytes = std::fs::read(&cut).unwrap();
    std::fs::write(&cut, &bytes[..12]).unwrap();
    let mut records = Records::open(std::slice::from_ref(&cut));
    assert_eq!(records.by_ref().count(), 0);
    assert_eq!(records.truncated, vec![cut]);
}

#[test]
fn a_line_that_is_not_a_tick_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("record-0.jsonl.gz");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut enc, b"{\"snapshot\": 1}\n").unwrap();
    std::fs::write(&path, enc.finish().unwrap()).unwrap();
    let e = Records::open(&[path])
        .next()
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("record-0.jsonl.gz:1: not a recorded tick"),
        "{e}"
    );
}

#[test]
fn a_fifo_or_a_device_is_refused_not_read_as_a_recording() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("record-0.jsonl.gz");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    assert!(made.unwrap().success());
    for path in [fifo, "/dev/null".into()] {
        let e = Records::open(std::slice::from_ref(&path))
            .next()
            .unwrap()
            .unwrap_err()
            .to_string();
        assert!(e.ends_with("not a regular file"), "{e}");
        assert!(e.contains(&path.display().to_string()), "{e}");
    }
}

#[test]
fn a_torn_last_tick_before_the_cut_is_skipped() {
    // A recorder killed mid-line: the gzip stream ends inside a line whose start was
    // flushed (a sync flush after half a line), so the reader sees the half line then
    // the cut.
    let dir = tempfile::tempdir().unwrap();
    record(dir.path(), 3, RecorderConfig::default());
    let path = dir.path().join("record-0.jsonl.gz");
    let text = Records::open(std::slice::from_ref(&path))
        .map(|r| serde_json::to_string(&r.unwrap()).unwrap() + "\n")
        .collect::<String>();
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut enc, text.as_bytes()).unwrap();
    std::io::Write::write_all(&mut enc, &text.as_bytes()[..text.len() / 5]).unwrap();
    std::io::Write::flush(&mut enc).unwrap();
    std::fs::write(&path, enc.get_ref()).unwrap();
    let mut records = Records::open(std::slice::from_ref(&path));
    let read: Vec<_> = records.by_ref().collect();
    assert_eq!(read.len(), 3, "{read:?}");
    assert!(read.iter().all(Result::is_ok));
    assert_eq!(records.truncated, vec![path]);
}

#[test]
fn a_line_too_long_or_not_text_is_an_error_naming_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, lines: &[&[u8]]| {
        let path = dir.path().join(name);
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        for line in lines {
            std::io::Write::write_all(&mut enc, line).unwrap();
        }
        std::fs::write(&path, enc.finish().unwrap()).unwrap();
        path
    };
    let first_error = |path| {
        Records::open(&[path])
            .next()
            .unwrap()
            .unwrap_err()
            .to_string()
    };
    let binary = write("record-0.jsonl.gz", &[b"\xff\xfe{}\n"]);
    let e = first_error(binary);
    assert!(
        e.contains("record-0.jsonl.gz:1:") && e.contains("not UTF-8 text"),
        "{e}"
    );
    // One endless line (65 MiB of spaces, 65 KiB compressed): refused, not read whole.
    let endless = vec![b' '; 65 << 20];
    let bomb = write("record-1.jsonl.gz", &[&endless, b"\n"]);
    let e = first_error(bomb);
    assert!(
        e.contains("record-1.jsonl.gz:1:") && e.contains("line longer than 64 MiB"),
        "{e}"
    );
}

#[test]
fn a_daemon_run_after_another_is_replayed_by_a_fresh_engine() {
    // The same run twice: the second's time starts again, as a restarted daemon's does.
    let twice = [committed(), committed()].concat();
    let report = replay(
        &twice,
        &|| Box::new(Mom::default()),
        EngineConfig::default(),
    )
    .unwrap();
    assert_eq!((report.ticks, report.runs), (240, 2));
    assert_eq!(report.ticks_differing, 0, "{}", report.text());
    assert!(report.text().contains("2 daemon runs"), "{}", report.text());
}

#[test]
fn a_policy_reloaded_within_a_run_is_told() {
    // The committed run as if `memtide reload` had put another policy in force for a while.
    let dir = tempfile::tempdir().unwrap();
    let mut recorder = Recorder::open(dir.path(), RecorderConfig::default()).unwrap();
    for (i, record) in Records::open(&committed()).enumerate() {
        let mut record = record.unwrap();
        if (40..80).contains(&i) {
            record.decision.policy = "memtide".into();
        }
        recorder.record(&record.snapshot, &record.decision).unwrap();
    }
    recorder.finish().unwrap();
    let files = recording_files(dir.path()).unwrap();
    let report = replay(
        &files,
        &|| Box::new(Mom::default()),
        EngineConfig::default(),
    )
    .unwrap();
    assert_eq!(report.runs, 1);
    assert_eq!(report.recorded_policy, "mom then memtide then mom");
    assert!(
        report
            .text()
            .contains("recorded under mom then memtide then mom"),
        "{}",
        report.text()
    );
}

#[test]
fn time_going_back_within_a_file_or_no_tick_at_all_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut lines = String::new();
    flate2::read::MultiGzDecoder::new(std::fs::File::open(&committed()[0]).unwrap())
        .read_to_string(&mut lines)
        .unwrap();
    let lines: Vec<&str> = lines.lines().collect();
    let write = |name: &str, lines: &[&str]| {
        let path = dir.path().join(name);
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        for l in lines {
            writeln!(enc, "{l}").unwrap();
        }
        std::fs::write(&path, enc.finish().unwrap()).unwrap();
        path
    };
    // A file that starts with a blank line still starts a run.
    let blank = write("blank.jsonl.gz", &[&[""][..], &lines].concat());
    let runs = [committed()[0].clone(), blank];
    let report = replay(&runs, &|| Box::new(Mom::default()), EngineConfig::default()).unwrap();
    assert_eq!(report.runs, 2);
    let back = write("back.jsonl.gz", &[lines[0], lines[1], lines[2], lines[1]]);
    let e = replay(
        &[back],
        &|| Box::new(Mom::default()),
        EngineConfig::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("back.jsonl.gz:4:") && e.contains("time goes back"),
        "{e}"
    );
    let empty = write("empty.jsonl.gz", &[]);
    let e = replay(
        &[empty],
        &|| Box::new(Mom::default()),
        EngineConfig::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("empty.jsonl.gz: no recorded tick"), "{e}");
}
