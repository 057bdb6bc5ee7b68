//! Firecracker through its API socket.
//!
//! The balloon API as documented in Firecracker's `docs/ballooning.md` and
//! `src/firecracker/swagger/firecracker.yaml`:
//! `GET /machine-config` (`mem_size_mib`), `GET /balloon` (`amount_mib`,
//! `stats_polling_interval_s`; 400 when no balloon is configured),
//! `PATCH /balloon {amount_mib}` (the balloon's size, not the guest's: the guest keeps
//! `mem_size_mib - amount_mib`), `GET /balloon/statistics` (`actual_mib` and the guest's
//! virtio-balloon statistics in bytes; 400 when statistics are off), and
//! `PATCH /balloon/statistics {stats_polling_interval_s}` (only while statistics are on:
//! they cannot be turned on or off after boot). Errors carry `{"fault_message": ...}`.
//!
//! Snapshots (`docs/snapshotting/snapshot-support.md`): `GET /` (`state`: `Not started`,
//! `Running`, `Paused`), `PATCH /vm {state: Paused|Resumed}`, `PUT /snapshot/create
//! {snapshot_type: Full, snapshot_path, mem_file_path}` on a paused VM, and, on a fresh
//! Firecracker process not configured yet, `PUT /snapshot/load {snapshot_path,
//! mem_backend: {backend_type: File, backend_path}, resume_vm}`. Firecracker has no call
//! that ends its process: a hibernation kills it.

use crate::api_socket::{guest_stats, ApiError, ApiSocket, ApiVmOptions};
use crate::pidfd::Pidfd;
use crate::procfs;
use crate::vmm_snapshot::{self, utf8, CutShort, Launch, Restored, SnapshotSteps};
use async_trait::async_trait;
use hyper::Method;
use memtide_core::backend::{AfterSave, Saved, Seal, VmBackend};
use memtide_core::stats::GuestStats;
use memtide_core::{BackendError, Bytes, VmSample};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The file, in a snapshot's directory, that holds the microVM's state (devices, vCPUs).
pub const STATE_FILE: &str = "vmstate";
/// The file, in a snapshot's directory, that holds the guest's memory.
pub const MEMORY_FILE: &str = "memory";

/// A Firecracker microVM.
pub struct FirecrackerVm {
    api: ApiSocket,
    mem: Bytes,
    /// Statistics were turned on at boot (`stats_polling_interval_s` > 0).
    stats: bool,
    /// Why the VM cannot be ballooned, when it cannot.
    no_balloon: Option<String>,
    process: Option<procfs::ProcessRss>,
    /// Firecracker's process, from the API socket's peer credentials.
    pid: Option<i32>,
    /// The /proc its process is read in.
    proc: PathBuf,
    /// What its connection knows of saves cut short.
    cut_short: CutShort,
    target: Option<Bytes>,
}

pub(crate) fn field(v: &Value, name: &str, what: &str) -> Result<u64, BackendError> {
    v.get(name)
        .and_then(Value::as_u64)
        .ok_or_else(|| BackendError::Protocol(format!("{what}: no {name} in {v}")))
}

/// The guest's memory in a `GET /machine-config` answer.
pub fn machine_memory(machine: &Value) -> Result<Bytes, BackendError> {
    field(machine, "mem_size_mib", "GET /machine-config").map(Bytes::from_mib)
}

/// What the guest keeps of `mem` with the balloon at `reply[name]` MiB (`amount_mib` of
/// `GET /balloon`, `actual_mib` of `GET /balloon/statistics`); `what` names the call.
pub fn guest_keeps(
    mem: Bytes,
    reply: &Value,
    name: &str,
    what: &str,
) -> Result<Bytes, BackendError> {
    let inflated = Bytes::from_mib(field(reply, name, what)?);
    Ok(mem.saturating_sub(inflated))
}

impl FirecrackerVm {
    /// Its process, when the socket's peer credentials gave it.
    pub fn pid(&self) -> Option<i32> {
        self.pid
    }

    /// Connect: read the VM's size and balloon, and set the statistics interval. With
    /// `paused_mark`, where a save of this VM marks the guest it paused
    /// ([`vmm_snapshot::PAUSED_MARK`]), a guest that a save cut short left paused is
    /// resumed first.
    pub async fn connect(
        socket: &Path,
        opts: &ApiVmOptions,
        paused_mark: Option<&Path>,
    ) -> Result<FirecrackerVm, BackendError> {
        let api = ApiSocket::new(socket, opts.call_timeout);
        let machine = api.call(Method::GET, "/machine-config", None).await?;
        let mem = machine_memory(&machine)?;
        let (stats, no_balloon) = match api.call(Method::GET, "/balloon", None).await {
            Ok(b) => {
                let interval = b.get("stats_polling_interval_s").and_then(Value::as_u64);
                (interval.unwrap_or(0) > 0, None)
            }
            Err(ApiError::Status {
                status, message, ..
            }) if status.is_client_error() => (false, Some(message)),
            Err(e) => return Err(e.into()),
        };
        let wanted = opts.stats_interval_s.max(1);
        if stats {
            let body = json!({"stats_polling_interval_s": wanted});
            api.call(Method::PATCH, "/balloon/statistics", Some(body))
                .await?;
        }
        let pid = api.peer_pid().await?;
        let process = pid.map(|pid| procfs::ProcessRss::new(&opts.proc, pid));
        let mut vm = FirecrackerVm {
            api,
            mem,
            stats,
            no_balloon,
            process,
            pid,
            proc: opts.proc.clone(),
            cut_short: CutShort::default(),
            target: None,
        };
        if let Some(mark) = paused_mark {
            let resumed = vmm_snapshot::resume_after_cut_short_save(&mut vm, mark).await;
            vm.cut_short = CutShort::resumed(resumed.map_err(BackendError::Busy)?);
        }
        Ok(vm)
    }
}

#[async_trait]
impl VmBackend for FirecrackerVm {
    fn resumed_at_connection(&mut self) -> Option<String> {
        self.cut_short.take_resumed()
    }

    async fn sample(&mut self) -> Result<VmSample, BackendError> {
        self.cut_short.check()?;
        let (balloon, stats) = match (&self.no_balloon, self.stats) {
            (Some(_), _) => (None, GuestStats::default()),
            (None, true) => {
                let v = self
                    .api
                    .call(Method::GET, "/balloon/statistics", None)
                    .await?;
                let keeps = guest_keeps(self.mem, &v, "actual_mib", "GET /balloon/statistics")?;
                (Some(keeps), guest_stats(&v))
            }
            // Without statistics Firecracker tells only the balloon's target size.
            (None, false) => {
                let v = self.api.call(Method::GET, "/balloon", None).await?;
                let keeps = guest_keeps(self.mem, &v, "amount_mib", "GET /balloon")?;
                (Some(keeps), GuestStats::default())
            }
        };
        let rss = self.process.as_ref().and_then(procfs::ProcessRss::read);
        let status = self
            .process
            .as_mut()
            .map(|p| p.status(rss))
            .unwrap_or_default();
        Ok(VmSample {
            ram_mappings: Vec::new(),
            configured: self.mem,
            balloon,
            stats,
            agent: None,
            rss,
            cpu_s: self.process.as_ref().and_then(procfs::ProcessRss::cpu_s),
            referenced: None,
            cold: None,
            virtio_mem: None,
            free_page_reporting: false,
            fixed: status.fixed,
            swapped: status.swapped,
            events: Vec::new(),
        })
    }

    async fn set_balloon(&mut self, target: Bytes) -> Result<(), BackendError> {
        if let Some(why) = &self.no_balloon {
            return Err(BackendError::Protocol(format!("no balloon device: {why}")));
        }
        // Whole MiB: the guest keeps at least `target`.
        let keep_mib = target.0.div_ceil(1 << 20).min(self.mem.mib());
        let amount_mib = self.mem.mib() - keep_mib;
        self.api
            .call(
                Method::PATCH,
                "/balloon",
                Some(json!({"amount_mib": amount_mib})),
            )
            .await?;
        self.target = Some(target);
        Ok(())
    }

    fn target(&self) -> Option<Bytes> {
        self.target
    }

    async fn save(
        &mut self,
        dir: &Path,
        then: AfterSave,
        limit: Duration,
        seal: Seal,
    ) -> Result<Saved, BackendError> {
        vmm_snapshot::save(self, dir, then, limit, seal).await
    }
}

#[async_trait]
impl SnapshotSteps for FirecrackerVm {
    fn mechanism(&self) -> &'static str {
        "firecracker snapshot/create"
    }

    fn cannot_quit(&self) -> Option<String> {
        self.pid
            .is_none()
            .then(|| "Firecracker's process is unknown (no peer credentials on its socket)".into())
    }

    async fn state(&mut self) -> Result<String, BackendError> {
        vmm_snapshot::state_at(&self.api, "/").await
    }

    async fn pause(&mut self) -> Result<(), BackendError> {
        let body = json!({"state": "Paused"});
        self.api.call(Method::PATCH, "/vm", Some(body)).await?;
        Ok(())
    }

    async fn resume(&mut self) -> Result<(), BackendError> {
        let body = json!({"state": "Resumed"});
        self.api.call(Method::PATCH, "/vm", Some(body)).await?;
        Ok(())
    }

    async fn write(&mut self, dir: &Path, limit: Duration) -> Result<(), BackendError> {
        let body = json!({
            "snapshot_type": "Full",
            "snapshot_path": utf8(&dir.join(STATE_FILE))?,
            "mem_file_path": utf8(&dir.join(MEMORY_FILE))?,
        });
        let api = self.api.with_timeout(limit);
        api.call(Method::PUT, "/snapshot/create", Some(body))
            .await?;
        Ok(())
    }

    async fn ended(&mut self) -> bool {
        self.api.refused().await
    }

    async fn serving(&mut self) -> Option<String> {
        vmm_snapshot::serving(&self.api, &self.proc).await
    }

    fn left_paused(&mut self, why: String) {
        self.cut_short.left_stopped(why);
    }

    async fn quit(&mut self) -> Result<(), BackendError> {
        // Firecracker has no call to end itself: its process is killed, if it is the one
        // serving the API socket now (asked again: the pid seen when memtide connected
        // may be another process's by now, if Firecracker was restarted on the same
        // socket). The process is held by a pidfd before it is checked, and signalled
        // through it: one that ends after the check, its pid taken by another, is the one
        // the signal would reach, and it reaches none.
        let known = self
            .pid
            .ok_or_else(|| BackendError::Protocol("no process".into()))?;
        let process = Pidfd::open(known)
            .map_err(|e| BackendError::Io(format!("Firecracker's process {known}: {e}")))?;
        match self.api.peer_pid().await? {
            Some(now) if now == known => {}
            Some(now) => {
                return Err(BackendError::Protocol(format!(
                    "the API socket is served by process {now}, not the {known} memtide \
                     connected to"
                )))
            }
            None => return Err(BackendError::Protocol("no process".into())),
        }
        process
            .signal(libc::SIGKILL)
            .map_err(|e| BackendError::Io(format!("killing Firecracker ({known}): {e}")))
    }
}

/// Start a Firecracker process by `launch` and load the snapshot in `dir` into it,
/// resumed when `resume` (it ran when saved). Firecracker maps the memory file private:
/// the guest's memory is read as it touches it, and the file must stay while it runs.
pub async fn restore(
    launch: &Launch<'_>,
    dir: &Path,
    resume: bool,
) -> Result<Restored, BackendError> {
    let body = json!({
        "snapshot_path": utf8(&dir.join(STATE_FILE))?,
        "mem_backend": {"backend_type": "File", "backend_path": utf8(&dir.join(MEMORY_FILE))?},
        "resume_vm": resume,
    });
    let started = vmm_snapshot::start(launch).await?;
    match started
        .api
        .call(Method::PUT, "/snapshot/load", Some(body))
        .await
    {
        Ok(_) => Ok(started.restored()),
        Err(e) => Err(started.fail(e.into(), launch.log)),
    }
}
