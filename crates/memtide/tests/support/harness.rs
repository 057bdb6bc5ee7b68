//! The test's own sessions with a guest, beside the daemon's: QMP on a second monitor
//! socket (QEMU serves one client per socket) and the guest agent (when the daemon is
//! not using it), both blocking, each on a runtime of its own.

use super::wait_for;
use memtide_adapters::qga::GuestAgent;
use memtide_adapters::qmp::QmpClient;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;
use tokio::runtime::Runtime;

/// Limit for one harness call.
const CALL: Duration = Duration::from_secs(5);

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A QMP session of the test's.
pub struct Qmp {
    rt: Runtime,
    client: QmpClient,
}

impl Qmp {
    /// Connect to the monitor at `path`, waiting up to 10 s for QEMU to listen.
    pub fn connect(path: &Path) -> Qmp {
        let rt = runtime();
        let client = wait_for(Duration::from_secs(10), || {
            rt.block_on(QmpClient::connect(path, CALL)).ok()
        })
        .unwrap_or_else(|| panic!("no QMP session on {}", path.display()));
        Qmp { rt, client }
    }

    /// Run a command; its `return` value or its error as text.
    pub fn execute(&mut self, command: &str, arguments: Option<Value>) -> Result<Value, String> {
        self.rt
            .block_on(self.client.execute(command, arguments))
            .map_err(|e| e.to_string())
    }

    /// The balloon's size as QEMU reports it (`query-balloon`), in MiB.
    pub fn balloon_mib(&mut self) -> Option<f64> {
        let r = self.execute("query-balloon", None).ok()?;
        Some(r["actual"].as_u64()? as f64 / (1 << 20) as f64)
    }

    /// Make a reset (guest or `system_reset`) reset the VM instead of ending QEMU, which
    /// the test guests' `-no-reboot` asks for.
    pub fn reset_on_reboot(&mut self) {
        self.execute("set-action", Some(json!({"reboot": "reset"})))
            .expect("set-action reboot=reset");
    }
}

/// A guest agent session of the test's (the daemon must not be configured with the same
/// agent socket: QEMU serves one client at a time).
pub struct Agent {
    rt: Runtime,
    agent: GuestAgent,
}

impl Agent {
    /// Connect to the agent's socket, waiting up to 60 s for the agent to answer.
    pub fn connect(path: &Path) -> Agent {
        let rt = runtime();
        let agent = wait_for(Duration::from_secs(60), || {
            rt.block_on(GuestAgent::connect(path, CALL)).ok()
        })
        .unwrap_or_else(|| panic!("no guest agent on {}", path.display()));
        Agent { rt, agent }
    }

    /// Start `sh -c script` in the guest (`guest-exec`) without waiting for it; returns
    /// its pid in the guest.
    pub fn spawn_sh(&mut self, script: &str) -> u64 {
        let r = self
            .rt
            .block_on(self.agent.execute(
                "guest-exec",
                json!({"path": "/bin/sh", "arg": ["-c", script]}),
            ))
            .unwrap_or_else(|e| panic!("guest-exec sh -c {script:?}: {e}"));
        r["pid"].as_u64().expect("guest-exec returns a pid")
    }

    /// A guest file's content.
    pub fn read_file(&mut self, path: &str) -> String {
        self.rt
            .block_on(self.agent.read_file(path))
            .unwrap_or_else(|e| panic!("reading {path} in the guest: {e}"))
    }

    /// Run `sh -c script` in the guest and wait (up to `limit`) for its exit status.
    pub fn run_sh(&mut self, script: &str, limit: Duration) -> i64 {
        let pid = self.spawn_sh(script);
        let status = wait_for(limit, || {
            let s = self
                .rt
                .block_on(self.agent.execute("guest-exec-status", json!({"pid": pid})))
                .ok()?;
            (s["exited"] == true).then(|| s["exitcode"].as_i64().unwrap_or(-1))
        });
        status.unwrap_or_else(|| panic!("sh -c {script:?} did not end within {limit:?}"))
    }
}
