//! A guest agent (qemu-ga's protocol on a unix socket) served by the harness, honest or
//! hostile in one way.

use base64::Engine as _;
use serde_json::{json, Value};
use std::path::Path;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

/// How the fake agent misbehaves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Agent {
    /// Serves the /proc files of a 256 MiB guest using half its memory.
    Honest,
    /// Streams bytes without the 0xFF sync delimiter as long as it is read.
    StreamWithoutDelimiter,
    /// Answers every `guest-file-read` with one byte, never at the end of the file.
    Trickle,
    /// Answers every command with a 128 KiB error of terminal escapes.
    TextFlood,
    /// Serves /proc figures no guest can have: counters at u64::MAX, PSI of NaN, zram swap
    /// larger than any memory.
    AbsurdFigures,
}

/// Serve `behaviour` on a new socket at `path` until the runtime ends.
pub fn serve(path: &Path, behaviour: Agent) -> std::io::Result<()> {
    let listener = UnixListener::bind(path)?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(session(stream, behaviour));
        }
    });
    Ok(())
}

async fn session(stream: UnixStream, behaviour: Agent) {
    let (read, mut write) = stream.into_split();
    if behaviour == Agent::StreamWithoutDelimiter {
        let junk = vec![b'x'; 64 << 10];
        while write.write_all(&junk).await.is_ok() {}
        return;
    }
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let Ok(request) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let args = &request["arguments"];
        let mut out = Vec::new();
        let reply = match request["execute"].as_str().unwrap_or_default() {
            "guest-sync-delimited" => {
                out.push(0xFF);
                json!({"return": args["id"]})
            }
            _ if behaviour == Agent::TextFlood => {
                let desc = "\u{1b}[2J\u{1b}]0;owned\u{7}".repeat(128 << 10 >> 4);
                json!({"error": {"class": "GenericError", "desc": desc}})
            }
            "guest-file-open" => {
                let file = match args["path"].as_str().unwrap_or_default() {
                    "/proc/meminfo" => 1,
                    "/proc/vmstat" => 2,
                    "/proc/swaps" => 4,
                    "/sys/block/zram0/mm_stat" => 5,
                    _ => 3,
                };
                json!({ "return": file })
            }
            "guest-file-read" if behaviour == Agent::Trickle => {
                json!({"return": {"count": 1, "buf-b64": "eA==", "eof": false}})
            }
            "guest-file-read" => {
                let handle = args["handle"].as_u64().unwrap_or(0);
                let text = match behaviour {
                    Agent::Honest => honest_file(handle),
                    _ => absurd_file(handle),
                };
                let b64 = base64::engine::general_purpose::STANDARD.encode(text);
                json!({"return": {"count": text.len(), "buf-b64": b64, "eof": true}})
            }
            _ => json!({"return": {}}),
        };
        out.extend_from_slice(reply.to_string().as_bytes());
        out.push(b'\n');
        if write.write_all(&out).await.is_err() {
            return;
        }
    }
}

/// /proc/meminfo (1), /proc/vmstat (2), /proc/pressure/memory (3) and /proc/swaps (4)
/// of a quiet 256 MiB guest, swapping to a disk.
fn honest_file(handle: u64) -> &'static str {
    match handle {
        1 => "MemTotal: 262144 kB\nMemFree: 98304 kB\nMemAvailable: 131072 kB\nBuffers: 4096 kB\n\
              Cached: 32768 kB\nAnonPages: 100000 kB\nInactive(file): 12000 kB\n\
              SwapTotal: 131072 kB\nSwapFree: 131072 kB\nCommitted_AS: 120000 kB\n\
              Active(anon): 90000 kB\nInactive(anon): 10000 kB\nActive(file): 20000 kB\n",
        2 => "pgmajfault 120\npswpin 0\npswpout 0\nworkingset_refault_anon 0\nworkingset_refault_file 3\n",
        4 => "Filename\tType\tSize\tUsed\tPriority\n/dev/vda2\tpartition\t131072\t0\t-2\n",
        _ => "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n\
              full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
    }
}

/// /proc/meminfo (1), /proc/vmstat (2), /proc/pressure/memory (3), /proc/swaps (4) and
/// zram0's mm_stat (5) of no real guest.
fn absurd_file(handle: u64) -> &'static str {
    match handle {
        1 => "MemTotal: 262144 kB\nMemFree: 131072 kB\nMemAvailable: 131072 kB\nBuffers: 0 kB\n\
              Cached: 0 kB\n\
              SwapTotal: 0 kB\nSwapFree: 0 kB\nCommitted_AS: 18014398509481983 kB\n",
        2 => "pgmajfault 18446744073709551615\npswpin 18446744073709551615\n\
              workingset_refault_anon 18446744073709551615\nworkingset_refault_file 18446744073709551615\n",
        4 => "Filename\tType\tSize\tUsed\tPriority\n/dev/zram0 partition 18446744073709551615 0 100\n\
              /dev/zram0 partition 1 18446744073709551615 100\n",
        5 => "18446744073709551615 0 18446744073709551615 0 0 0 0 0 0\n",
        _ => "some avg10=nan avg60=inf avg300=-1.00 total=18446744073709551615\n\
              full avg10=1e308 avg60=0.00 avg300=0.00 total=0\n",
    }
}
