//! The KSM sysfs directory (/sys/kernel/mm/ksm): one value per file.

use memtide_core::stats::KsmState;
use memtide_core::KsmSettings;
use std::path::Path;

fn read_value<T: std::str::FromStr>(dir: &Path, name: &str) -> Option<T> {
    std::fs::read_to_string(dir.join(name))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Read the KSM state; `None` when the kernel has no KSM (or its core files are unreadable).
pub fn read(dir: &Path) -> Option<KsmState> {
    let counter = |name| read_value::<u64>(dir, name).unwrap_or(0);
    Some(KsmState {
        run: read_value(dir, "run")?,
        pages_to_scan: read_value(dir, "pages_to_scan")?,
        sleep_millisecs: read_value(dir, "sleep_millisecs")?,
        pages_shared: counter("pages_shared"),
        pages_sharing: counter("pages_sharing"),
        pages_unshared: counter("pages_unshared"),
        pages_volatile: counter("pages_volatile"),
        full_scans: counter("full_scans"),
        merge_across_nodes: read_value(dir, "merge_across_nodes"),
        general_profit: read_value(dir, "general_profit"),
        ksm_zero_pages: read_value(dir, "ksm_zero_pages"),
        advisor: read_advisor(dir),
    })
}

/// The advisor in force, where one is (`advisor_mode` reads `[none] scan-time`, the
/// mode in force in brackets).
fn read_advisor(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("advisor_mode")).ok()?;
    let (_, rest) = text.split_once('[')?;
    let (mode, _) = rest.split_once(']')?;
    (mode != "none").then(|| mode.to_string())
}

/// A KSM write that failed: why, and the knobs it left as it wrote them (their old value
/// could not be written back, or was not known), which are now as memtide set them.
#[derive(Debug)]
pub struct WriteError {
    /// Why, naming the file, and what was set back or could not be.
    pub error: std::io::Error,
    /// The knobs left written.
    pub left: KsmSettings,
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for WriteError {}

/// Write the knobs that are set, tuning knobs first and `run` last, so ksmd starts with
/// its new settings. All or nothing where it can be: at the first failure (naming the
/// file) the knobs already written get their earlier values back, so a refused write
/// leaves no half-applied setting behind; those that cannot are in the error's `left`.
pub fn write(dir: &Path, settings: &KsmSettings) -> Result<(), WriteError> {
    let knobs = [
        ("merge_across_nodes", settings.merge_across_nodes),
        ("pages_to_scan", settings.pages_to_scan),
        ("sleep_millisecs", settings.sleep_millisecs),
        ("run", settings.run),
    ];
    let mut written: Vec<(&str, u64, Option<String>)> = Vec::new();
    for (name, value) in knobs {
        let Some(v) = value else { continue };
        let path = dir.join(name);
        let before = std::fs::read_to_string(&path).ok();
        if let Err(e) = std::fs::write(&path, format!("{v}\n")) {
            let (undone, left) = undo(dir, &written);
            let error = std::io::Error::new(e.kind(), format!("{}: {e}{undone}", path.display()));
            return Err(WriteError { error, left });
        }
        written.push((name, v, before));
    }
    Ok(())
}

/// Put back the earlier values of the knobs written before a failure: what it did, in
/// words, and the knobs it could not put back.
fn undo(dir: &Path, written: &[(&str, u64, Option<String>)]) -> (String, KsmSettings) {
    let mut left = KsmSettings::default();
    let (mut back, mut stuck) = (Vec::new(), Vec::new());
    for (name, value, before) in written.iter().rev() {
        let restored = before
            .as_ref()
            .is_some_and(|b| std::fs::write(dir.join(name), b).is_ok());
        if restored {
            back.push(*name);
            continue;
        }
        stuck.push(*name);
        let knob = match *name {
            "merge_across_nodes" => &mut left.merge_across_nodes,
            "pages_to_scan" => &mut left.pages_to_scan,
            "sleep_millisecs" => &mut left.sleep_millisecs,
            _ => &mut left.run,
        };
        *knob = Some(*value);
    }
    let mut said = String::new();
    if !back.is_empty() {
        said += &format!(" ({} set back)", back.join(", "));
    }
    if !stuck.is_empty() {
        said += &format!(" ({} could not be set back)", stuck.join(", "));
    }
    (said, left)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_captured_ksm_directory() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/ksm");
        let k = read(&dir).unwrap();
        assert_eq!((k.run, k.pages_to_scan, k.sleep_millisecs), (0, 100, 20));
        assert_eq!(k.merge_across_nodes, Some(1));
        assert_eq!(k.general_profit, Some(0));
    }

    #[test]
    fn missing_ksm_is_none_and_optional_files_are_optional() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()), None);
        for (f, v) in [
            ("run", "1"),
            ("pages_to_scan", "300"),
            ("sleep_millisecs", "10"),
        ] {
            std::fs::write(dir.path().join(f), v).unwrap();
        }
        let k = read(dir.path()).unwrap();
        assert_eq!(
            (
                k.run,
                k.pages_to_scan,
                k.merge_across_nodes,
                k.general_profit
            ),
            (1, 300, None, None)
        );
        assert_eq!((k.ksm_zero_pages, k.advisor), (None, None));
        // A newer kernel's: zero pages merged, and its advisor in force or not.
        let file = |f: &str, v: &str| std::fs::write(dir.path().join(f), v).unwrap();
        file("ksm_zero_pages", "10\n");
        file("advisor_mode", "[none] scan-time\n");
        let k = read(dir.path()).unwrap();
        assert_eq!((k.ksm_zero_pages, k.advisor), (Some(10), None));
        file("advisor_mode", "none [scan-time]\n");
        assert_eq!(
            read(dir.path()).unwrap().advisor.as_deref(),
            Some("scan-time")
        );
    }

    #[test]
    fn writes_only_the_given_knobs() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("sleep_millisecs"), "20\n").unwrap();
        let s = KsmSettings {
            run: Some(1),
            pages_to_scan: Some(400),
            ..KsmSettings::default()
        };
        write(dir.path(), &s).unwrap();
        let get = |f: &str| std::fs::read_to_string(dir.path().join(f)).unwrap();
        assert_eq!(
            (get("run"), get("pages_to_scan"), get("sleep_millisecs")),
            ("1\n".into(), "400\n".into(), "20\n".into())
        );
        assert!(!dir.path().join("merge_across_nodes").exists());
    }

    #[test]
    fn write_errors_name_the_file() {
        let s = KsmSettings {
            run: Some(1),
            ..KsmSettings::default()
        };
        let err = write(Path::new("/nonexistent/ksm"), &s)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("/nonexistent/ksm/run: "), "{err}");
    }

    #[test]
    fn a_refused_write_sets_back_the_knobs_written_before_it() {
        let dir = tempfile::tempdir().unwrap();
        for (f, v) in [("pages_to_scan", "100\n"), ("run", "0\n")] {
            std::fs::write(dir.path().join(f), v).unwrap();
        }
        // A directory where a knob's file should be: the write fails as the kernel's EINVAL
        // or EBUSY would, after pages_to_scan was written.
        std::fs::create_dir(dir.path().join("sleep_millisecs")).unwrap();
        let s = KsmSettings {
            run: Some(1),
            pages_to_scan: Some(400),
            sleep_millisecs: Some(10),
            ..KsmSettings::default()
        };
        let err = write(dir.path(), &s).unwrap_err();
        let said = err.to_string();
        assert!(said.contains("sleep_millisecs: "), "{said}");
        assert!(said.ends_with("(pages_to_scan set back)"), "{said}");
        assert_eq!(err.left, KsmSettings::default(), "nothing left written");
        let get = |f: &str| std::fs::read_to_string(dir.path().join(f)).unwrap();
        assert_eq!(
            (get("pages_to_scan"), get("run")),
            ("100\n".into(), "0\n".into())
        );
    }

    #[test]
    fn a_knob_that_cannot_be_set_back_is_named_and_left_as_written() {
        let dir = tempfile::tempdir().unwrap();
        // merge_across_nodes cannot be read before it is written (no earlier value to
        // put back); pages_to_scan can.
        std::fs::write(dir.path().join("pages_to_scan"), "100\n").unwrap();
        std::fs::create_dir(dir.path().join("sleep_millisecs")).unwrap();
        let s = KsmSettings {
            merge_across_nodes: Some(0),
            pages_to_scan: Some(400),
            sleep_millisecs: Some(10),
            ..KsmSettings::default()
        };
        let err = write(dir.path(), &s).unwrap_err();
        let said = err.to_string();
        assert!(
            said.ends_with("(pages_to_scan set back) (merge_across_nodes could not be set back)"),
            "{said}"
        );
        assert_eq!(
            err.left,
            KsmSettings {
                merge_across_nodes: Some(0),
                ..KsmSettings::default()
            }
        );
    }
}
