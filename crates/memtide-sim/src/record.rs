//! Recordings of what the engine saw and decided: gzip-compressed JSON lines, one per
//! tick, `{"snapshot": Snapshot, "decision": Decision}`, in files `record-<n>.jsonl.gz`
//! that rotate at a size limit. The daemon owns a [`Recorder`]; [`Records`] reads them
//! back for replay.

use flate2::read::MultiGzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;
use memtide_core::{Decision, Snapshot};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// One recorded tick.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// What the engine was given.
    pub snapshot: Snapshot,
    /// What it decided.
    pub decision: Decision,
}

/// A recorded tick as written, borrowing the engine's input and output.
#[derive(Serialize)]
struct RecordRef<'a> {
    snapshot: &'a Snapshot,
    decision: &'a Decision,
}

/// Why a recording could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// A file could not be read, written or listed.
    #[error("{path}: {error}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The cause (not a `source`: the message says it once).
        error: io::Error,
    },
    /// A complete line is not a recorded tick.
    #[error("{path}:{line}: not a recorded tick: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Line number, from 1.
        line: usize,
        /// What the JSON reader said.
        message: String,
    },
    /// A tick no later than the one before it in the same file.
    #[error("{path}:{line}: a tick at {at_s:.1} s after one at {before_s:.1} s: time goes back within a file")]
    OutOfOrder {
        /// The file.
        path: PathBuf,
        /// Line number, from 1.
        line: usize,
        /// The tick's time (s).
        at_s: f64,
        /// The time of the tick before it (s).
        before_s: f64,
    },
}

/// Where and how much to record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RecorderConfig {
    /// Start a new file once the current one holds this many compressed bytes.
    pub max_file_bytes: u64,
    /// Files kept; the oldest are deleted beyond this.
    pub keep_files: usize,
}

impl Default for RecorderConfig {
    fn default() -> Self {
        RecorderConfig {
            max_file_bytes: 64 << 20,
            keep_files: 8,
        }
    }
}

/// Counts the bytes written through it.
struct Counting<W> {
    inner: W,
    written: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

type Encoder = GzEncoder<Counting<BufWriter<File>>>;

/// Writes recordings into a folder, rotating files.
pub struct Recorder {
    dir: PathBuf,
    config: RecorderConfig,
    next: u64,
    current: Option<(PathBuf, Encoder)>,
    /// The current file holds no tick yet.
    fresh: bool,
    /// A recording was pruned to make room since the last write that worked.
    made_room: bool,
}

/// The recording files in `dir`, oldest first (by their number).
pub fn recording_files(dir: &Path) -> Result<Vec<PathBuf>, RecordError> {
    let io_err = |source| RecordError::Io {
        path: dir.to_path_buf(),
        error: source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_err)? {
        let path = entry.map_err(io_err)?.path();
        if let Some(n) = file_number(&path) {
            files.push((n, path));
        }
    }
    files.sort();
    Ok(files.into_iter().map(|(_, p)| p).collect())
}

/// The `n` of `record-<n>.jsonl.gz`.
fn file_number(path: &Path) -> Option<u64> {
    path.file_name()?
        .to_str()?
        .strip_prefix("record-")?
        .strip_suffix(".jsonl.gz")?
        .parse()
        .ok()
}

impl Recorder {
    /// Record into `dir` (created if needed), after any recording already there.
    pub fn open(dir: &Path, config: RecorderConfig) -> Result<Recorder, RecordError> {
        std::fs::create_dir_all(dir).map_err(|source| RecordError::Io {
            path: dir.to_path_buf(),
            error: source,
        })?;
        let next = recording_files(dir)?
            .last()
            .and_then(|p| file_number(p))
            .map_or(0, |n| n + 1);
        Ok(Recorder {
            dir: dir.to_path_buf(),
            config,
            next,
            current: None,
            fresh: false,
            made_room: false,
        })
    }

    /// Append one tick. Each line is flushed, so a reader sees every tick recorded so far
    /// even if the recorder dies. After a failed write (a full disk) the file is left as
    /// it is, readable up to its last whole line, and the next tick starts a new one; a
    /// new file is removed if its first tick fails, and the oldest files are pruned
    /// once a new one holds a tick (found by an audit: each try on a full disk left an
    /// empty file, and pruned a recording to make room for it, until none was left).
    /// A new file that cannot be made or written for a full disk (or quota) prunes the
    /// oldest recording beyond one, once until a write works again: a disk the
    /// recordings filled gets room.
    pub fn record(&mut self, snapshot: &Snapshot, decision: &Decision) -> Result<(), RecordError> {
        if self.current.is_none() {
            if let Err(e) = self.start_file() {
                self.make_room(&e);
                return Err(e);
            }
        }
        let (path, encoder) = self.current.as_mut().expect("a file was just started");
        let line = serde_json::to_vec(&RecordRef { snapshot, decision })
            .expect("snapshots and decisions serialize");
        let written = encoder
            .write_all(&line)
            .and_then(|()| encoder.write_all(b"\n"))
            .and_then(|()| encoder.flush());
        if let Err(source) = written {
            let path = path.clone();
            self.current = None;
            let fresh = std::mem::take(&mut self.fresh);
            if fresh {
                let _ = std::fs::remove_file(&path);
            }
            let e = RecordError::Io {
                path,
                error: source,
            };
            if fresh {
                self.make_room(&e);
            }
            return Err(e);
        }
        self.made_room = false;
        if std::mem::take(&mut self.fresh) {
            self.prune(self.config.keep_files.max(1))?;
        }
        let (_, encoder) = self.current.as_mut().expect("written to just now");
        if encoder.get_ref().written >= self.config.max_file_bytes {
            self.finish_file()?;
        }
        Ok(())
    }

    /// After `e`, a new file's failure: where the disk is full (or the quota used), prune
    /// the oldest recording beyond one, once until a write works again (best effort).
    fn make_room(&mut self, e: &RecordError) {
        let full = matches!(e, RecordError::Io { error, .. }
            if matches!(error.kind(), io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded));
        if full && !std::mem::replace(&mut self.made_room, true) {
            let kept = self.config.keep_files.saturating_sub(1).max(1);
            let _ = self.prune(kept);
        }
    }

    /// Close the current file properly.
    pub fn finish(mut self) -> Result<(), RecordError> {
        self.finish_file()
    }

    fn start_file(&mut self) -> Result<(), RecordError> {
        let path = self.dir.join(format!("record-{}.jsonl.gz", self.next));
        let file = File::create(&path).map_err(|source| RecordError::Io {
            path: path.clone(),
            error: source,
        })?;
        self.next += 1;
        let counting = Counting {
            inner: BufWriter::new(file),
            written: 0,
        };
        self.current = Some((path, GzEncoder::new(counting, Compression::default())));
        self.fresh = true;
        Ok(())
    }

    fn finish_file(&mut self) -> Result<(), RecordError> {
        if let Some((path, encoder)) = self.current.take() {
            encoder
                .finish()
                .and_then(|mut c| c.inner.flush())
                .map_err(|source| RecordError::Io {
                    path,
                    error: source,
                })?;
        }
        Ok(())
    }

    /// Delete the oldest files beyond the newest `keep`.
    fn prune(&self, keep: usize) -> Result<(), RecordError> {
        let files = recording_files(&self.dir)?;
        let excess = files.len().saturating_sub(keep);
        for path in &files[..excess] {
            std::fs::remove_file(path).map_err(|source| RecordError::Io {
                path: path.clone(),
                error: source,
            })?;
        }
        Ok(())
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        // Best effort: a file left unfinished still reads up to its last flushed line.
        let _ = self.finish_file();
    }
}

/// One recording file, decompressed as it is read.
type FileLines = BufReader<MultiGzDecoder<File>>;

/// The longest line a recording may hold (a tick of 1000 VMs is about 2 MiB): a corrupt
/// or hostile file (a gzip bomb of one endless line) cannot make replay allocate without
/// bound.
const MAX_LINE: u64 = 64 << 20;

/// The next line of `r` without its newline, at most [`MAX_LINE`] bytes (`None` at the
/// end): `Ok(Err(why))` for a line too long or not UTF-8.
fn next_line(r: &mut FileLines) -> Option<io::Result<Result<String, String>>> {
    let mut buf = Vec::new();
    match r.by_ref().take(MAX_LINE + 1).read_until(b'\n', &mut buf) {
        Ok(0) => None,
        Err(e) => Some(Err(e)),
        Ok(_) if buf.len() as u64 > MAX_LINE => {
            Some(Ok(Err(format!("line longer than {} MiB", MAX_LINE >> 20))))
        }
        Ok(_) => {
            if buf.last() == Some(&b'\n') {
                buf.pop();
            }
            Some(Ok(
                String::from_utf8(buf).map_err(|_| "not UTF-8 text".to_string())
            ))
        }
    }
}

/// What a file that cannot be a recording is told to be.
const NOT_A_RECORDING: &str = "not a recording (gzip-compressed JSON lines, record-N.jsonl.gz)";

/// The regular file at `path` (a link followed), open for reading: a FIFO would block the
/// replay until something wrote to it, a device would be read as a recording.
fn open_recording(path: &Path) -> io::Result<File> {
    if !std::fs::metadata(path)?.is_file() {
        let why = format!("{NOT_A_RECORDING}: not a regular file");
        return Err(io::Error::new(io::ErrorKind::InvalidInput, why));
    }
    File::open(path)
}

/// `f`, rewound, if it starts as gzip does (or is too short to tell: a recording cut at
/// its start); `None` if it starts otherwise.
fn gzip_or_empty(mut f: File) -> io::Result<Option<File>> {
    let mut magic = Vec::with_capacity(2);
    io::Read::by_ref(&mut f).take(2).read_to_end(&mut magic)?;
    io::Seek::rewind(&mut f)?;
    Ok((magic.len() < 2 || magic == [0x1f, 0x8b]).then_some(f))
}

/// The ticks of recording files, read one at a time, in the order of the files given.
pub struct Records {
    files: VecDeque<PathBuf>,
    /// The file being read, the number of its last line read, and its lines.
    current: Option<(PathBuf, usize, FileLines)>,
    /// Ticks read from that file so far.
    ticks_in_file: usize,
    /// Files that ended before their gzip stream did (a recorder that died, a full
    /// disk): every complete line before the cut was read, a torn one after it skipped.
    pub truncated: Vec<PathBuf>,
}

impl Records {
    /// Read `paths` in order.
    pub fn open(paths: &[PathBuf]) -> Records {
        Records {
            files: paths.iter().cloned().collect(),
            current: None,
            ticks_in_file: 0,
            truncated: Vec::new(),
        }
    }

    /// Whether the last tick read was the first of its file.
    pub fn first_of_file(&self) -> bool {
        self.ticks_in_file == 1
    }

    /// The file the last tick read came from.
    pub fn path(&self) -> Option<&Path> {
        self.current.as_ref().map(|(path, ..)| path.as_path())
    }

    /// The line of that file it was on (from 1).
    pub fn line(&self) -> usize {
        self.current.as_ref().map_or(0, |(_, line, _)| *line)
    }
}

impl Iterator for Records {
    type Item = Result<Record, RecordError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.current.is_none() {
                let path = self.files.pop_front()?;
                match open_recording(&path).and_then(gzip_or_empty) {
                    Ok(Some(f)) => {
                        let lines = BufReader::new(MultiGzDecoder::new(f));
                        self.current = Some((path, 0, lines));
                        self.ticks_in_file = 0;
                    }
                    Ok(None) => {
                        let error = io::Error::new(io::ErrorKind::InvalidData, NOT_A_RECORDING);
                        return Some(Err(RecordError::Io { path, error }));
                    }
                    Err(source) => {
                        return Some(Err(RecordError::Io {
                            path,
                            error: source,
                        }))
                    }
                }
            }
            let (path, number, lines) = self.current.as_mut().expect("opened above");
            match next_line(lines) {
                None => self.current = None,
                // Unreadable before its first line, and not for being cut short: no
                // recording at all (not gzip, or corrupt from its start).
                Some(Err(e)) if *number == 0 && e.kind() != io::ErrorKind::UnexpectedEof => {
                    let path = path.clone();
                    self.current = None;
                    let error = io::Error::new(e.kind(), format!("{NOT_A_RECORDING}: {e}"));
                    return Some(Err(RecordError::Io { path, error }));
                }
                Some(Err(_)) => {
                    self.truncated.push(path.clone());
                    self.current = None;
                }
                Some(Ok(Ok(line))) if line.trim().is_empty() => *number += 1,
                Some(Ok(line)) => {
                    *number += 1;
                    self.ticks_in_file += 1;
                    let parsed =
                        line.and_then(|l| serde_json::from_str(&l).map_err(|e| e.to_string()));
                    return Some(parsed.map_err(|message| RecordError::Parse {
                        path: path.clone(),
                        line: *number,
                        message,
                    }));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ticks recorded from the simulator (the committed recording).
    fn ticks() -> Vec<Record> {
        let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/quick-mom.jsonl.gz");
        Records::open(&[committed]).map(Result::unwrap).collect()
    }

    /// Make the recorder's current file refuse its writes as a full disk does (its writes
    /// go to /dev/full: ENOSPC).
    fn fill_the_disk(recorder: &mut Recorder) {
        let (path, _) = recorder.current.take().expect("a file");
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let counting = Counting {
            inner: BufWriter::new(full),
            written: 0,
        };
        recorder.current = Some((path, GzEncoder::new(counting, Compression::default())));
    }

    #[test]
    fn a_full_disk_leaves_no_empty_file_and_costs_one_recording_at_most() {
        let dir = tempfile::tempdir().unwrap();
        let config = RecorderConfig {
            max_file_bytes: 2048,
            keep_files: 3,
        };
        let ticks = ticks();
        let mut recorder = Recorder::open(dir.path(), config).unwrap();
        let mut next = ticks.iter().cycle();
        while recording_files(dir.path()).unwrap().len() < 3 || recorder.current.is_some() {
            let tick = next.next().unwrap();
            recorder.record(&tick.snapshot, &tick.decision).unwrap();
        }
        let recorded = recording_files(dir.path()).unwrap();
        // Each later try on the full disk starts a file, and fails its first tick: the
        // first prunes the oldest recording (room, where the recordings filled the disk),
        // the others nothing.
        for _ in 0..10 {
            recorder.start_file().unwrap();
            fill_the_disk(&mut recorder);
            let tick = next.next().unwrap();
            assert!(recorder.record(&tick.snapshot, &tick.decision).is_err());
        }
        assert_eq!(recording_files(dir.path()).unwrap(), recorded[1..]);
        // Once writing works, the new file is kept beside them.
        let tick = next.next().unwrap();
        recorder.record(&tick.snapshot, &tick.decision).unwrap();
        let now = recording_files(dir.path()).unwrap();
        assert_eq!(now.len(), 3);
        assert_eq!(now[..2], recorded[1..]);
        recorder.finish().unwrap();
        assert_eq!(Records::open(&now[2..]).count(), 1);
    }
}
