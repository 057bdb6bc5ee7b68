//! Cloud Hypervisor through its API socket.
//!
//! As documented in Cloud Hypervisor's `docs/api.md` and
//! `vmm/src/api/openapi/cloud-hypervisor.yaml`: `GET /api/v1/vm.info` (`state`,
//! `config.memory.size` and `hotplugged_size`, `config.balloon`, `memory_actual_size`:
//! the guest's memory less the balloon), `PUT /api/v1/vm.resize {desired_balloon}` (the
//! balloon's size in bytes; 204 on success), and, in newer releases,
//! `GET /api/v1/vm.balloon-stats` (`balloon_actual`, `last_update` in milliseconds, and the
//! guest's statistics under `stats`). Errors come as a status with the error's text.
//!
//! Snapshots: `PUT /api/v1/vm.pause`, `vm.snapshot {destination_url: "file:///DIR"}` (the
//! VM paused; Cloud Hypervisor writes its files into the existing directory DIR),
//! `vm.resume`, `vmm.shutdown` (the process ends); on a fresh process with no VM yet,
//! `vm.restore {source_url}`, which leaves the VM paused.

use crate::api_socket::{guest_stats, ApiError, ApiSocket, ApiVmOptions};
use crate::firecracker::field;
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

/// How often, and how many times, a VMM whose shutdown answer broke off is asked whether
/// it still answers (2 s in all, and each call's own timeout).
const QUIT_CHECK_EVERY: Duration = Duration::from_millis(100);
const QUIT_CHECKS: u32 = 20;

/// A Cloud Hypervisor VM.
pub struct CloudHypervisorVm {
    api: ApiSocket,
    /// `vm.balloon-stats` answered at least once, or was not tried yet.
    stats: bool,
    process: Option<procfs::ProcessRss>,
    /// Its process, from the socket's peer credentials.
    pid: Option<i32>,
    /// The /proc its process is read in.
    proc: PathBuf,
    /// What its connection knows of saves cut short.
    cut_short: CutShort,
    target: Option<Bytes>,
    configured: Bytes,
}

/// The sizes `vm.info` tells: (memory, the guest's logical size, a balloon is configured).
pub fn sizes(info: &Value) -> Result<(Bytes, Bytes, bool), BackendError> {
    let memory = &info["config"]["memory"];
    let size = field(memory, "size", "GET /api/v1/vm.info config.memory")?;
    let plugged = memory
        .get("hotplugged_size")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let configured = Bytes(size.saturating_add(plugged));
    let balloon = info["config"].get("balloon").is_some_and(|b| !b.is_null());
    let actual = info
        .get("memory_actual_size")
        .and_then(Value::as_u64)
        .map_or(configured, Bytes);
    Ok((configured, actual, balloon))
}

/// `Ok` when `vm.info` says the VM runs; why it cannot be managed otherwise.
pub fn check_state(info: &Value) -> Result<(), BackendError> {
    match info.get("state").and_then(Value::as_str) {
        Some("Running") => Ok(()),
        Some("Paused") => Err(BackendError::Busy("the VM is paused".into())),
        other => Err(BackendError::Disconnected(format!(
            "the VM is not running (state {})",
            other.unwrap_or("unknown")
        ))),
    }
}

/// The guest's statistics in a `vm.balloon-stats` answer.
pub fn balloon_stats(v: &Value) -> GuestStats {
    let mut s = guest_stats(&v["stats"]);
    // In milliseconds; 0 s means never, as everywhere (found by fuzzing: 176 ms gave 0).
    s.last_update = v["last_update"]
        .as_u64()
        .map(|ms| ms / 1000)
        .filter(|t| *t > 0);
    s
}

impl CloudHypervisorVm {
    /// Connect: the VM must be running. With `paused_mark`, where a save of this VM marks
    /// the guest it paused ([`vmm_snapshot::PAUSED_MARK`]), a guest that a save cut short
    /// left paused is resumed first.
    pub async fn connect(
        socket: &Path,
        opts: &ApiVmOptions,
        paused_mark: Option<&Path>,
    ) -> Result<CloudHypervisorVm, BackendError> {
        let api = ApiSocket::new(socket, opts.call_timeout);
        let mut info = api.call(Method::GET, "/api/v1/vm.info", None).await?;
        let (configured, _, _) = sizes(&info)?;
        let pid = api.peer_pid().await?;
        let process = pid.map(|pid| procfs::ProcessRss::new(&opts.proc, pid));
        let mut vm = CloudHypervisorVm {
            api,
            stats: true,
            process,
            pid,
            proc: opts.proc.clone(),
            cut_short: CutShort::default(),
            target: None,
            configured,
        };
        if let Some(mark) = paused_mark {
            let resumed = vmm_snapshot::resume_after_cut_short_save(&mut vm, mark).await;
            let resumed = resumed.map_err(BackendError::Busy)?;
            let again = resumed.is_some();
            vm.cut_short = CutShort::resumed(resumed);
            if again {
                info = vm.api.call(Method::GET, "/api/v1/vm.info", None).await?;
            }
        }
        check_state(&info)?;
        Ok(vm)
    }

    /// Its process, when the socket's peer credentials gave it.
    pub fn pid(&self) -> Option<i32> {
        self.pid
    }

    /// The guest's balloon statistics, where this Cloud Hypervisor has them; a release
    /// without the endpoint, or a guest driver without statistics, is asked no more.
    async fn stats(&mut self) -> Result<GuestStats, BackendError> {
        if !self.stats {
            return Ok(GuestStats::default());
        }
        match self
            .api
            .call(Method::GET, "/api/v1/vm.balloon-stats", None)
            .await
        {
            Ok(v) => Ok(balloon_stats(&v)),
            Err(e) if e.status().is_some() => {
                tracing::info!("{e}: no balloon statistics from this VM");
                self.stats = false;
                Ok(GuestStats::default())
            }
            Err(e) => Err(e.into()),
        }
    }
}

#[async_trait]
impl VmBackend for CloudHypervisorVm {
    fn resumed_at_connection(&mut self) -> Option<String> {
        self.cut_short.take_resumed()
    }

    async fn sample(&mut self) -> Result<VmSample, BackendError> {
        self.cut_short.check()?;
        let info = self.api.call(Method::GET, "/api/v1/vm.info", None).await?;
        check_state(&info)?;
        let (configured, actual, balloon) = sizes(&info)?;
        self.configured = configured;
        let stats = if balloon {
            self.stats().await?
        } else {
            GuestStats::default()
        };
        let rss = self.process.as_ref().and_then(procfs::ProcessRss::read);
        let status = self
            .process
            .as_mut()
            .map(|p| p.status(rss))
            .unwrap_or_default();
        Ok(VmSample {
            ram_mappings: Vec::new(),
            configured,
            balloon: balloon.then_some(actual),
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
        let desired = self.configured.saturating_sub(target);
        let body = json!({"desired_balloon": desired.0});
        self.api
            .call(Method::PUT, "/api/v1/vm.resize", Some(body))
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

/// `dir` as the `file://` URL Cloud Hypervisor's snapshot calls take.
fn file_url(dir: &Path) -> Result<String, BackendError> {
    Ok(format!("file://{}", utf8(dir)?))
}

/// `PUT /api/v1/CALL` with `body`.
async fn put(api: &ApiSocket, call: &str, body: Option<Value>) -> Result<(), BackendError> {
    api.call(Method::PUT, &format!("/api/v1/{call}"), body)
        .await?;
    Ok(())
}

#[async_trait]
impl SnapshotSteps for CloudHypervisorVm {
    fn mechanism(&self) -> &'static str {
        "cloud-hypervisor vm.snapshot"
    }

    fn cannot_quit(&self) -> Option<String> {
        None
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

    async fn state(&mut self) -> Result<String, BackendError> {
        vmm_snapshot::state_at(&self.api, "/api/v1/vm.info").await
    }

    async fn pause(&mut self) -> Result<(), BackendError> {
        put(&self.api, "vm.pause", None).await
    }

    async fn resume(&mut self) -> Result<(), BackendError> {
        put(&self.api, "vm.resume", None).await
    }

    async fn write(&mut self, dir: &Path, limit: Duration) -> Result<(), BackendError> {
        let body = json!({"destination_url": file_url(dir)?});
        put(&self.api.with_timeout(limit), "vm.snapshot", Some(body)).await
    }

    async fn quit(&mut self) -> Result<(), BackendError> {
        // The process may end before its answer is read: it quit all the same if its
        // socket then refuses connections (an exchange that broke off before the request
        // was sent must not pass for a shutdown).
        match self
            .api
            .call(Method::PUT, "/api/v1/vmm.shutdown", None)
            .await
        {
            Ok(_) => Ok(()),
            Err(ApiError::Http(..)) => {
                for _ in 0..QUIT_CHECKS {
                    // Only a socket nobody listens on (or gone) says the process ended.
                    if self.api.refused().await {
                        return Ok(());
                    }
                    tokio::time::sleep(QUIT_CHECK_EVERY).await;
                }
                Err(BackendError::Protocol(
                    "vmm.shutdown broke off and the VMM still answers".into(),
                ))
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// Start a Cloud Hypervisor process by `launch`, restore the snapshot in `dir` into it
/// and resume it when `resume` (it ran when saved).
pub async fn restore(
    launch: &Launch<'_>,
    dir: &Path,
    resume: bool,
) -> Result<Restored, BackendError> {
    let body = json!({"source_url": file_url(dir)?});
    let started = vmm_snapshot::start(launch).await?;
    let restored = async {
        put(&started.api, "vm.restore", Some(body)).await?;
        if resume {
            put(&started.api, "vm.resume", None).await?;
        }
        Ok::<(), BackendError>(())
    }
    .await;
    match restored {
        Ok(()) => Ok(started.restored()),
        Err(e) => Err(started.fail(e, launch.log)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn balloon_stats_date_their_update_in_seconds() {
        let stats =
            |ms: u64| balloon_stats(&json!({"last_update": ms, "stats": {"free_memory": 4096}}));
        assert_eq!(stats(1_764_060_000_123).last_update, Some(1_764_060_000));
        assert_eq!(stats(1_764_060_000_123).free, Some(Bytes(4096)));
        // Under a second is no date (the fuzzer's case: `"last_update":176`).
        assert_eq!(stats(176).last_update, None);
        assert_eq!(stats(0).last_update, None);
    }
}
