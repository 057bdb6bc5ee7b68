//! A QEMU monitor served by the harness, honest or hostile in one way.

use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

/// How the fake monitor misbehaves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Qmp {
    /// Answers like QEMU with a balloon; statistics of a guest using half its memory.
    Honest,
    /// Answers two `query-balloon` per connection (connecting, one sample), then nothing
    /// more (a QEMU that stops, like one under SIGSTOP).
    Hung,
    /// Never answers `balloon`.
    IgnoresBalloon,
    /// Sends a 4 MiB event every 50 ms.
    EventFlood,
    /// A balloon of 1 PiB and statistics of u64::MAX.
    AbsurdFigures,
    /// No balloon statistics at all.
    NoStatistics,
}

/// Serve `behaviour` on a new socket at `path`, for a guest of `size` bytes, under KVM or
/// TCG as `kvm` says (`query-kvm`: the daemon samples a TCG guest's accesses through its
/// hypervisor's page tables, here the harness's own), until the runtime ends.
pub fn serve(path: &Path, behaviour: Qmp, size: u64, kvm: bool) -> std::io::Result<()> {
    let listener = UnixListener::bind(path)?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(session(stream, behaviour, size, kvm));
        }
    });
    Ok(())
}

async fn session(stream: UnixStream, behaviour: Qmp, size: u64, kvm: bool) {
    let (read, mut write) = stream.into_split();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(4);
    tokio::spawn(async move {
        while let Some(line) = rx.recv().await {
            if write.write_all(line.as_bytes()).await.is_err() {
                return;
            }
        }
    });
    let greeting = json!({"QMP": {"version": {"qemu": {"major": 8, "minor": 2, "micro": 0}}, "capabilities": []}});
    if tx.send(format!("{greeting}\n")).await.is_err() {
        return;
    }
    if behaviour == Qmp::EventFlood {
        let events = tx.clone();
        tokio::spawn(async move {
            let event = json!({"event": "VSERPORT_CHANGE", "data": {"id": "x".repeat(4 << 20)},
                "timestamp": {"seconds": 0, "microseconds": 0}});
            let line = format!("{event}\n");
            while events.send(line.clone()).await.is_ok() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
    }
    let mut actual = match behaviour {
        Qmp::AbsurdFigures => 1u64 << 50,
        _ => size,
    };
    let mut queries = 0;
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let Ok(request) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let command = request["execute"].as_str().unwrap_or_default();
        let args = &request["arguments"];
        queries += usize::from(command == "query-balloon");
        let reply = match (command, behaviour) {
            ("query-balloon", Qmp::Hung) if queries > 2 => std::future::pending().await,
            ("balloon", Qmp::IgnoresBalloon) => continue,
            ("balloon", _) => {
                actual = args["value"].as_u64().unwrap_or(actual);
                json!({})
            }
            _ => answer(command, args, behaviour, size, actual, kvm),
        };
        let mut reply = match reply {
            Value::Object(_) if reply.get("error").is_some() => reply,
            r => json!({"return": r}),
        };
        if let Some(id) = request.get("id") {
            reply["id"] = id.clone();
        }
        if tx.send(format!("{reply}\n")).await.is_err() {
            return;
        }
    }
}

/// The answer to a command that does not depend on the session's state.
fn answer(command: &str, args: &Value, behaviour: Qmp, size: u64, actual: u64, kvm: bool) -> Value {
    match command {
        "qmp_capabilities" | "qom-set" => json!({}),
        "query-memory-size-summary" => json!({"base-memory": size, "plugged-memory": 0}),
        "query-memory-devices" => json!([]),
        "query-kvm" => json!({"enabled": kvm, "present": kvm}),
        "query-balloon" => json!({"actual": actual}),
        "query-status" => json!({"status": "running", "running": true}),
        "qom-list" if args["path"] == "/machine/peripheral" => {
            json!([{"name": "balloon0", "type": "child<virtio-balloon-pci>"}])
        }
        "qom-list" => json!([]),
        "qom-get" if args["property"] == "guest-stats" => stats(behaviour, size),
        "qom-get" => json!(false),
        _ => {
            json!({"error": {"class": "CommandNotFound", "desc": format!("The command {command} has not been found")}})
        }
    }
}

/// The balloon's `guest-stats` property.
fn stats(behaviour: Qmp, size: u64) -> Value {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    match behaviour {
        Qmp::NoStatistics => json!({"stats": {}, "last-update": 0}),
        Qmp::AbsurdFigures => {
            let max = u64::MAX;
            json!({"stats": {"stat-total-memory": max, "stat-free-memory": max,
                "stat-available-memory": max, "stat-disk-caches": max,
                "stat-major-faults": max, "stat-swap-in": max}, "last-update": now})
        }
        _ => json!({"stats": {"stat-total-memory": size, "stat-free-memory": size / 2,
            "stat-available-memory": size / 2, "stat-disk-caches": size / 8,
            "stat-major-faults": 0, "stat-swap-in": 0}, "last-update": now}),
    }
}
