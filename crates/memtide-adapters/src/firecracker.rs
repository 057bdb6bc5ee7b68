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

use crate::api_socket::{guest_stats, ApiError, ApiSocket, ApiVmOptions};
use crate::procfs;
use async_trait::async_trait;
use hyper::Method;
use memtide_core::backend::VmBackend;
use memtide_core::stats::GuestStats;
use memtide_core::{BackendError, Bytes, VmSample};
use serde_json::{json, Value};
use std::path::Path;

/// A Firecracker microVM.
pub struct FirecrackerVm {
    api: ApiSocket,
    mem: Bytes,
    /// Statistics were turned on at boot (`stats_polling_interval_s` > 0).
    stats: bool,
    /// Why the VM cannot be ballooned, when it cannot.
    no_balloon: Option<String>,
    process: Option<procfs::ProcessRss>,
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
    /// Connect: read the VM's size and balloon, and set the statistics interval.
    pub async fn connect(
        socket: &Path,
        opts: &ApiVmOptions,
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
        let process = api
            .peer_pid()
            .await?
            .map(|pid| procfs::ProcessRss::new(&opts.proc, pid));
        Ok(FirecrackerVm {
            api,
            mem,
            stats,
            no_balloon,
            process,
            target: None,
        })
    }
}

#[async_trait]
impl VmBackend for FirecrackerVm {
    async fn sample(&mut self) -> Result<VmSample, BackendError> {
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
        Ok(VmSample {
            configured: self.mem,
            balloon,
            stats,
            agent: None,
            rss,
            cpu_s: self.process.as_ref().and_then(procfs::ProcessRss::cpu_s),
            referenced: None,
            virtio_mem: None,
            free_page_reporting: false,
            fixed: self.process.as_mut().and_then(procfs::ProcessRss::fixed),
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
}
