//! Writes every target's seeds into a cargo-fuzz corpus folder: `fuzz-seeds DIR` fills
//! `DIR/<target>/`, so that fuzzing starts from the captured files.

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: fuzz-seeds CORPUS_DIR");
        std::process::exit(2);
    };
    for target in memtide_fuzz::TARGETS {
        let out = dir.join(target.name);
        std::fs::create_dir_all(&out)?;
        let seeds = memtide_fuzz::seeds(target.name)?;
        for (name, bytes) in &seeds {
            std::fs::write(out.join(format!("seed-{name}")), bytes)?;
        }
        println!("{}: {} seeds", target.name, seeds.len());
    }
    Ok(())
}
