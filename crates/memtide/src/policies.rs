//! Where the policy comes from: a built-in name, policy files, or a directory of them,
//! and turning that into a running policy (with located, rendered errors).

use memtide_core::policy::mom::Mom;
use memtide_core::policy::none::Unmanaged;
use memtide_core::policy::Policy;
use memtide_core::policy::{ksmtuned::KsmConfig, mom::MomConfig};
use memtide_lang::{Limits, ScriptPolicy, Source};
use std::path::{Path, PathBuf};

/// The built-in policies, by name.
pub const BUILTIN: [&str; 2] = ["mom", "none"];

/// A policy that could not be loaded: unreadable files, or the located, rendered parse error.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct LoadError(pub String);

/// What the configuration names as the policy.
#[derive(Debug, Clone, PartialEq)]
pub enum PolicySource {
    /// A built-in policy.
    Builtin(String),
    /// Policy files, evaluated in the order of their names.
    Files(Vec<PathBuf>),
    /// Every `*.policy` file in a directory (hidden ones excepted), in name order.
    Dir(PathBuf),
}

impl PolicySource {
    /// `policy` is a built-in name unless it looks like a path (has a `/` or ends in
    /// `.policy`); `policy_dir` names a directory.
    pub fn from_config(policy: &str, policy_dir: Option<&Path>) -> PolicySource {
        match policy_dir {
            Some(dir) => PolicySource::Dir(dir.to_path_buf()),
            None if policy.contains('/') || policy.ends_with(".policy") => {
                PolicySource::Files(vec![PathBuf::from(policy)])
            }
            None => PolicySource::Builtin(policy.to_string()),
        }
    }

    /// Build the policy; built-ins take their constants from the configuration.
    pub fn load(&self, mom: &MomConfig, ksm: &KsmConfig) -> Result<Box<dyn Policy>, LoadError> {
        match self {
            PolicySource::Builtin(name) => match name.as_str() {
                "mom" => Ok(Box::new(Mom {
                    balloon: mom.clone(),
                    ksm: ksm.clone(),
                })),
                "none" => Ok(Box::new(Unmanaged)),
                other => Err(LoadError(format!(
                    "unknown policy {other:?} (built-in policies: {})",
                    BUILTIN.join(", ")
                ))),
            },
            PolicySource::Files(files) => Ok(Box::new(parse(&read(files)?)?)),
            PolicySource::Dir(dir) => Ok(Box::new(parse(&read(&dir_files(dir)?)?)?)),
        }
    }
}

/// The `*.policy` files of a directory, hidden ones excepted, in name order.
pub fn dir_files(dir: &Path) -> Result<Vec<PathBuf>, LoadError> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| LoadError(format!("{}: {e}", dir.display())))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            !name.starts_with('.') && name.ends_with(".policy") && p.is_file()
        })
        .collect();
    files.sort();
    Ok(files)
}

/// Read policy files, ordered by their names (as MOM concatenates a policy directory).
pub fn read(files: &[PathBuf]) -> Result<Vec<Source>, LoadError> {
    let mut files = files.to_vec();
    files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f)
                .map_err(|e| LoadError(format!("{}: {e}", f.display())))?;
            Ok(Source::new(f.display().to_string(), text))
        })
        .collect()
}

/// Parse sources into a policy, rendering any error with its line and a caret.
pub fn parse(sources: &[Source]) -> Result<ScriptPolicy, LoadError> {
    ScriptPolicy::parse(sources, Limits::default()).map_err(|e| LoadError(e.render(sources)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(source: &PolicySource) -> Result<Box<dyn Policy>, LoadError> {
        source.load(&MomConfig::default(), &KsmConfig::default())
    }

    #[test]
    fn names_and_paths_are_told_apart() {
        assert_eq!(
            PolicySource::from_config("mom", None),
            PolicySource::Builtin("mom".into())
        );
        assert_eq!(
            PolicySource::from_config("my.policy", None),
            PolicySource::Files(vec!["my.policy".into()])
        );
        assert_eq!(
            PolicySource::from_config("/etc/x", None),
            PolicySource::Files(vec!["/etc/x".into()])
        );
        assert_eq!(
            PolicySource::from_config("mom", Some(Path::new("/d"))),
            PolicySource::Dir("/d".into())
        );
        assert_eq!(
            load(&PolicySource::Builtin("none".into())).unwrap().name(),
            "none"
        );
        let err = load(&PolicySource::Builtin("magic".into()))
            .err()
            .unwrap()
            .to_string();
        assert_eq!(
            err,
            "unknown policy \"magic\" (built-in policies: mom, none)"
        );
    }

    #[test]
    fn a_directory_is_read_in_name_order_without_hidden_files() {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in [
            ("20-b.policy", "(defvar b 2)"),
            ("10-a.policy", "(defvar a 1)"),
            (".hidden.policy", "("),
            ("notes.txt", "("),
        ] {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        let files = dir_files(dir.path()).unwrap();
        let names: Vec<_> = files
            .iter()
            .map(|f| f.file_name().unwrap().to_str().unwrap())
            .collect();
        assert_eq!(names, ["10-a.policy", "20-b.policy"]);
        assert!(load(&PolicySource::Dir(dir.path().into())).is_ok());
    }

    #[test]
    fn parse_errors_are_rendered_with_the_line_and_a_caret() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("bad.policy");
        std::fs::write(&f, "# comment\n(defvar x $)\n").unwrap();
        let err = load(&PolicySource::Files(vec![f.clone()]))
            .err()
            .unwrap()
            .to_string();
        let lines: Vec<&str> = err.lines().collect();
        assert!(
            lines[0].starts_with(&format!("{}:2:11: ", f.display())),
            "{err}"
        );
        assert_eq!(lines[1..], ["(defvar x $)", "          ^"]);
    }
}
