//! Host swap behind the VM memory domain, for scenarios that need it (`host_swap = true`):
//! a swap file the harness creates and enables for the runs, and disables and removes
//! when dropped. Only with `--host-swap-mib`: it is the one host-global setting the
//! harness ever changes, and it puts it back.

use anyhow::{bail, Context};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// An enabled swap file of the harness's own.
pub struct HostSwap {
    file: PathBuf,
}

fn run(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl HostSwap {
    /// Create `host.swap` of `mib` MiB in `dir` and enable it.
    pub fn enable(dir: &Path, mib: u64) -> anyhow::Result<HostSwap> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = dir.join("host.swap");
        let _ = std::fs::remove_file(&file);
        // Written out, not sparse or fallocated: swapon refuses files with holes, and
        // some filesystems refuse unwritten extents.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&file)
            .with_context(|| format!("creating {}", file.display()))?;
        let chunk = vec![0u8; 1 << 20];
        for _ in 0..mib {
            f.write_all(&chunk)?;
        }
        f.sync_all()?;
        drop(f);
        let path = file.display().to_string();
        let swap = HostSwap { file };
        run("mkswap", &[&path])?;
        if let Err(e) = run("swapon", &[&path]) {
            let _ = std::fs::remove_file(&swap.file);
            std::mem::forget(swap);
            return Err(e);
        }
        log!("host swap: {mib} MiB enabled at {path} (removed at the end)");
        Ok(swap)
    }
}

impl Drop for HostSwap {
    fn drop(&mut self) {
        let path = self.file.display().to_string();
        match run("swapoff", &[&path]) {
            Ok(()) => {
                let _ = std::fs::remove_file(&self.file);
                log!("host swap: {path} disabled and removed");
            }
            Err(e) => log!(
                "host swap: could not disable {path} ({e:#}): run swapoff {path} and remove it"
            ),
        }
    }
}
