//! memtide's fuzz targets, one per parser of untrusted input, as plain functions of the
//! input bytes. cargo-fuzz runs them for long (`fuzz/`, `bench/fuzz.sh`); `cargo test`
//! runs each over its seeds and a few thousand mutations of them (`tests/targets.rs`).
//!
//! A target fails by panicking: on a parser's own panic, and on a broken invariant it
//! checks (a parsed value that does not print back to itself, a size out of bounds).

mod config;
mod host;
mod kubevirt;
mod libvirt;
mod policy;
mod qga;
mod qmp;
mod recording;
mod vmm;

use std::path::{Path, PathBuf};

/// A fuzz target: its name (as cargo-fuzz knows it) and its body.
pub struct Target {
    /// Name, also the folder of its seeds under `fuzz/seeds/`.
    pub name: &'static str,
    /// Runs one input; panics on a defect.
    pub run: fn(&[u8]),
}

/// Every target.
pub const TARGETS: &[Target] = &[
    Target {
        name: "qmp",
        run: qmp::run,
    },
    Target {
        name: "qga",
        run: qga::run,
    },
    Target {
        name: "host",
        run: host::run,
    },
    Target {
        name: "libvirt_xml",
        run: libvirt::xml,
    },
    Target {
        name: "libvirt_memstats",
        run: libvirt::memstats,
    },
    Target {
        name: "firecracker",
        run: vmm::firecracker,
    },
    Target {
        name: "cloud_hypervisor",
        run: vmm::cloud_hypervisor,
    },
    Target {
        name: "kubevirt_pods",
        run: kubevirt::run,
    },
    Target {
        name: "config",
        run: config::run,
    },
    Target {
        name: "recording",
        run: recording::run,
    },
    Target {
        name: "policy",
        run: policy::run,
    },
];

/// The target called `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

/// `fuzz/seeds/`: captured files (links to the tests' data) and real replies.
pub fn seeds_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds")
}

/// Lines of a gzip seed kept: a recording's first ticks make a seed small enough to
/// mutate quickly.
const GZIP_SEED_LINES: usize = 2;

/// The seed inputs of target `name`, by file name: each file of its seed folder, a
/// gzip file decompressed to its first lines.
pub fn seeds(name: &str) -> std::io::Result<Vec<(String, Vec<u8>)>> {
    let mut seeds = Vec::new();
    for entry in std::fs::read_dir(seeds_dir().join(name))? {
        let path = entry?.path();
        let file = path.file_name().unwrap_or_default().to_string_lossy();
        let bytes = std::fs::read(&path)?;
        match file.strip_suffix(".gz") {
            Some(stem) => seeds.push((stem.to_string(), first_lines(&bytes, GZIP_SEED_LINES)?)),
            None => seeds.push((file.into_owned(), bytes)),
        }
    }
    seeds.sort();
    Ok(seeds)
}

fn first_lines(gzip: &[u8], n: usize) -> std::io::Result<Vec<u8>> {
    use std::io::BufRead;
    let mut out = Vec::new();
    let mut reader = std::io::BufReader::new(flate2::read::MultiGzDecoder::new(gzip));
    for _ in 0..n {
        if reader.read_until(b'\n', &mut out)? == 0 {
            break;
        }
    }
    Ok(out)
}

/// The input's lines (without their `\n`), as line-oriented protocols frame messages.
fn lines(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    data.split(|b| *b == b'\n')
}
