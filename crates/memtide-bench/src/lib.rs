//! What the harness binaries beside the real-guest benchmark share: endpoints that answer
//! like QEMU's monitor, qemu-ga and Firecracker's API — honestly, or hostile in one way
//! each — and the release daemon run as its own process and measured.
//! `hostile-guests` (docs/security.md) and `load-test` use them.

pub mod daemon_process;
pub mod fake;

/// The output of `git ARGS` in the working directory, trimmed; `None` where git fails.
pub fn git(args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Make the process `cmd` starts die with the harness's thread that starts it, however
/// the harness ends (SIGKILL included): no QEMU outlives a benchmark.
pub fn dies_with_harness(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe; it only asks the kernel to kill the child when
    // its parent thread dies.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

/// `dir`, emptied (created if missing), as an absolute path.
pub fn fresh_dir(dir: &std::path::Path) -> std::io::Result<std::path::PathBuf> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    dir.canonicalize()
}

/// Write `doc` as pretty JSON to `path` (creating its directory) and say so on stderr
/// as `who`.
pub fn write_json(
    who: &str,
    path: &std::path::Path,
    doc: &serde_json::Value,
) -> anyhow::Result<()> {
    use anyhow::Context;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, serde_json::to_string_pretty(doc)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!("{who}: wrote {}", path.display());
    Ok(())
}
