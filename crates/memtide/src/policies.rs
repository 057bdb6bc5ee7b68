//! Where the policy comes from: a built-in name, policy files, or a directory of them,
//! and turning that into a running policy (with located, rendered errors).

use crate::config::Config;
use crate::status::Policies;
use memtide_core::policy::esx::Esx;
use memtide_core::policy::mom::{Mom, Paced};
use memtide_core::policy::none::Unmanaged;
use memtide_core::policy::proxmox::Proxmox;
use memtide_core::policy::routed::Routed;
use memtide_core::policy::working_set::{EstimatorConfig, WorkingSet};
use memtide_core::policy::Policy;
use memtide_lang::{Limits, ScriptPolicy, Source};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The built-in policies, by name.
pub const BUILTIN: [&str; 8] = [
    "memtide",
    "mom",
    "tws",
    "selfballoon",
    "sampled",
    "esx",
    "proxmox",
    "none",
];

/// A policy that could not be loaded: unreadable files, or the located, rendered parse error.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct LoadError(pub String);

impl LoadError {
    /// The error of the setting `field` that names the policy.
    fn of(self, field: &str) -> LoadError {
        LoadError(format!("{field}: {}", self.0))
    }
}

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

/// Whether a `policy` setting names a file or directory (found at `at`) rather than a
/// built-in policy: not a built-in name, and there, or looking like a path (a `/`, or
/// ending in `.policy`).
pub fn names_a_path(policy: &str, at: &Path) -> bool {
    !BUILTIN.contains(&policy)
        && (at.exists() || policy.contains('/') || policy.ends_with(".policy"))
}

impl PolicySource {
    /// `policy_dir` names a directory. Else `policy` is a built-in name if it is one;
    /// else an existing directory stands for its `*.policy` files, and any other
    /// existing path, or a name that looks like a path (has a `/` or ends in `.policy`),
    /// for a policy file. What is left is an unknown built-in name, which
    /// [`PolicySource::load`] refuses.
    pub fn from_config(policy: &str, policy_dir: Option<&Path>) -> PolicySource {
        let path = Path::new(policy);
        match policy_dir {
            Some(dir) => PolicySource::Dir(dir.to_path_buf()),
            None if !names_a_path(policy, path) => PolicySource::Builtin(policy.to_string()),
            None if path.is_dir() => PolicySource::Dir(path.to_path_buf()),
            None => PolicySource::Files(vec![path.to_path_buf()]),
        }
    }

    /// Build the policy; built-ins take their constants from the configuration.
    pub fn load(&self, c: &Config) -> Result<Box<dyn Policy>, LoadError> {
        let working_set = |e| -> Box<dyn Policy> {
            Box::new(WorkingSet::new(e, c.working_set.clone(), c.ksm.clone()))
        };
        // At MOM's pace, as MOM's policy engine runs policy files.
        let script = |files: &[PathBuf]| -> Result<Box<dyn Policy>, LoadError> {
            Ok(Box::new(Paced::new(parse(&read(files)?)?, &c.mom)))
        };
        match self {
            PolicySource::Builtin(name) => match name.as_str() {
                "memtide" => Ok(working_set(EstimatorConfig::Fused(c.memtide.clone()))),
                "mom" => Ok(Box::new(Mom::new(c.mom.clone(), c.ksm.clone()))),
                "tws" => Ok(working_set(EstimatorConfig::Tws(c.tws.clone()))),
                "selfballoon" => Ok(working_set(EstimatorConfig::SelfBalloon(
                    c.selfballoon.clone(),
                ))),
                "sampled" => Ok(working_set(EstimatorConfig::Sampled(c.sampled.clone()))),
                "esx" => Ok(Box::new(Esx::new(c.esx.clone(), c.ksm.clone()))),
                "proxmox" => Ok(Box::new(Proxmox::new(c.proxmox.clone(), c.ksm.clone()))),
                "none" => Ok(Box::new(Unmanaged)),
                other => Err(LoadError(unknown(other))),
            },
            PolicySource::Files(files) => script(files),
            PolicySource::Dir(dir) => script(&dir_files(dir)?),
        }
    }
}

/// The configuration's policy: the host's, with the VMs that name their own routed to it.
pub fn load(c: &Config) -> Result<Box<dyn Policy>, LoadError> {
    load_named(c).map(|(policy, _)| policy)
}

/// [`load`], and which of its policies decides each VM, by the policies' names.
pub fn load_named(c: &Config) -> Result<(Box<dyn Policy>, Policies), LoadError> {
    let field = if c.policy_dir.is_some() {
        "policy_dir"
    } else {
        "policy"
    };
    let host = c.policy_source().load(c).map_err(|e| e.of(field))?;
    let mut names = Policies {
        host: host.name().to_string(),
        vms: BTreeMap::new(),
    };
    let mut groups: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for vm in &c.vms {
        if let Some(p) = &vm.policy {
            groups
                .entry(p.as_str())
                .or_default()
                .insert(vm.name.clone());
        }
    }
    if groups.is_empty() {
        return Ok((host, names));
    }
    let exceptions = groups
        .into_iter()
        .map(|(policy, vms)| {
            let policy = PolicySource::from_config(policy, None)
                .load(c)
                .map_err(|e| {
                    let names: Vec<&str> = vms.iter().map(String::as_str).collect();
                    e.of(&format!("the policy of [[vm]] {}", names.join(", ")))
                })?;
            for vm in &vms {
                names.vms.insert(vm.clone(), policy.name().to_string());
            }
            Ok((vms, policy))
        })
        .collect::<Result<Vec<_>, LoadError>>()?;
    Ok((Box::new(Routed::new(host, exceptions)), names))
}

/// Why `name` is no policy: neither a built-in one nor a file or directory.
pub fn unknown(name: &str) -> String {
    format!(
        "unknown policy {name:?}: no built-in policy has that name ({}) and there is no \
         such file or directory",
        BUILTIN.join(", ")
    )
}

/// The policy files that `paths` name: a directory stands for its `*.policy` files
/// (see [`dir_files`]).
pub fn files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, LoadError> {
    let mut files = Vec::new();
    for path in paths {
        match path.is_dir() {
            true => files.extend(dir_files(path)?),
            false => files.push(path.clone()),
        }
    }
    Ok(files)
}

/// The `*.policy` files of a directory, hidden ones excepted, in name order; none is
/// an error.
pub fn dir_files(dir: &Path) -> Result<Vec<PathBuf>, LoadError> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| LoadError(format!("{}: {e}", dir.display())))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            // By bytes: a name that is not UTF-8 is still a policy file (an audit found it
            // skipped unsaid).
            use std::os::unix::ffi::OsStrExt;
            let name = p.file_name().map_or(&[][..], |n| n.as_bytes());
            !name.starts_with(b".") && name.ends_with(b".policy") && p.is_file()
        })
        .collect();
    files.sort();
    if files.is_empty() {
        // An empty directory would be a policy that decides nothing, named "".
        return Err(LoadError(format!(
            "{}: no *.policy file in it",
            dir.display()
        )));
    }
    Ok(files)
}

/// The most text a policy's files may hold together: a policy is a few KiB (the shipped
/// ones 1-2 KiB), and loading takes about a second per MiB and a hundred times its size
/// in memory (found by an audit: 16 MB took 18 s and 1 GB at a reload).
const MAX_POLICY_BYTES: usize = 1 << 20;

/// Read policy files, ordered by their names (as MOM concatenates a policy directory), at
/// most [`MAX_POLICY_BYTES`] together.
pub fn read(files: &[PathBuf]) -> Result<Vec<Source>, LoadError> {
    let mut files = files.to_vec();
    files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    let mut total = 0;
    files
        .iter()
        .map(|f| {
            let text = crate::text_file::read(f)
                .map_err(|e| LoadError(format!("{}: {e}", f.display())))?;
            total += text.len();
            if total > MAX_POLICY_BYTES {
                return Err(LoadError(format!(
                    "{}: the policy's files hold more than {} KiB together ({total} bytes \
                     with this one): a policy is a few KiB",
                    f.display(),
                    MAX_POLICY_BYTES >> 10
                )));
            }
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
        source.load(&Config::default())
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
        for name in BUILTIN {
            assert_eq!(
                load(&PolicySource::Builtin(name.into())).unwrap().name(),
                name
            );
        }
        let err = load(&PolicySource::Builtin("magic".into()))
            .err()
            .unwrap()
            .to_string();
        let expected = format!(
            "unknown policy \"magic\": no built-in policy has that name ({}) and there is \
             no such file or directory",
            BUILTIN.join(", ")
        );
        assert_eq!(err, expected);
    }

    #[test]
    fn an_existing_directory_is_a_policy_directory() {
        // (A file named without `/` or `.policy` is a CLI test: it needs a working directory.)
        let dir = tempfile::tempdir().unwrap();
        let policies = dir.path().join("vdsm");
        std::fs::create_dir(&policies).unwrap();
        std::fs::write(policies.join("10-a.policy"), "(defvar a 1)").unwrap();
        let name = policies.to_str().unwrap();
        let source = PolicySource::from_config(name, None);
        assert_eq!(source, PolicySource::Dir(policies.clone()));
        let expected = policies.join("10-a.policy").display().to_string();
        assert_eq!(load(&source).unwrap().name(), expected);
    }

    #[test]
    fn command_line_directories_stand_for_their_policy_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("20-b.policy"), "").unwrap();
        std::fs::write(dir.path().join("10-a.policy"), "").unwrap();
        let single = dir.path().join("x.rules");
        let paths = [dir.path().to_path_buf(), single.clone()];
        assert_eq!(
            files(&paths).unwrap(),
            [
                dir.path().join("10-a.policy"),
                dir.path().join("20-b.policy"),
                single
            ]
        );
    }

    #[test]
    fn policy_files_too_large_together_are_refused_naming_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.policy"), dir.path().join("b.policy"));
        std::fs::write(&a, "(+ 1 2)\n".repeat(80_000)).unwrap();
        std::fs::write(&b, "(+ 1 2)\n".repeat(80_000)).unwrap();
        assert_eq!(read(std::slice::from_ref(&a)).unwrap().len(), 1);
        let e = read(&[b.clone(), a]).unwrap_err().0;
        assert!(e.starts_with(&format!("{}: ", b.display())), "{e}");
        assert!(e.contains("more than 1024 KiB together"), "{e}");
    }

    #[test]
    fn vms_can_name_their_own_policy() {
        let c = Config::parse(
            "policy = \"memtide\"\n[[vm]]\nname = \"db\"\nqmp = \"/db\"\npolicy = \"tws\"\n",
            "x",
        )
        .unwrap();
        assert_eq!(super::load(&c).unwrap().name(), "memtide (tws for db)");
        assert_eq!(super::load(&Config::default()).unwrap().name(), "memtide");
    }

    #[test]
    fn a_policy_that_cannot_be_loaded_names_the_setting_that_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("gone.policy");
        let vm = |name: &str| {
            format!("[[vm]]\nname = \"{name}\"\nqmp = \"/{name}\"\npolicy = {missing:?}\n")
        };
        let c = Config::parse(&format!("{}{}", vm("a"), vm("b")), "x").unwrap();
        let err = super::load(&c).err().unwrap().to_string();
        let expected = format!("the policy of [[vm]] a, b: {}: ", missing.display());
        assert!(err.starts_with(&expected), "{err}");
        let c = Config::parse(&format!("policy = {missing:?}\n"), "x").unwrap();
        let err = super::load(&c).err().unwrap().to_string();
        assert!(
            err.starts_with(&format!("policy: {}: ", missing.display())),
            "{err}"
        );
        let c = Config::parse(&format!("policy_dir = {:?}\n", dir.path()), "x").unwrap();
        let err = super::load(&c).err().unwrap().to_string();
        assert_eq!(
            err,
            format!(
                "policy_dir: {}: no *.policy file in it",
                dir.path().display()
            )
        );
    }

    #[test]
    fn each_vm_is_told_the_name_of_the_policy_that_decides_it() {
        let c = Config::parse(
            "policy = \"memtide\"\n[[vm]]\nname = \"db\"\nqmp = \"/db\"\npolicy = \"mom\"\n\
             [[vm]]\nname = \"web\"\nqmp = \"/web\"\n",
            "x",
        )
        .unwrap();
        let (policy, names) = load_named(&c).unwrap();
        assert_eq!(policy.name(), "memtide (mom for db)");
        assert_eq!((names.of("db"), names.of("web")), ("mom", "memtide"));
        assert_eq!(names.of("found"), "memtide", "found, not configured");
        let (_, names) = load_named(&Config::default()).unwrap();
        assert_eq!((names.host.as_str(), names.vms.len()), ("memtide", 0));
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
        // A name that is not UTF-8 is one of them too.
        use std::os::unix::ffi::OsStrExt;
        let odd = std::ffi::OsStr::from_bytes(b"30-c\xff.policy");
        std::fs::write(dir.path().join(odd), "(").unwrap();
        let files = dir_files(dir.path()).unwrap();
        assert_eq!(files.last().unwrap().file_name(), Some(odd));
        assert!(load(&PolicySource::Dir(dir.path().into())).is_err());
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
