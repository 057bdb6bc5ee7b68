//! The VMs memtide manages: found from the configuration and socket globs, connected in
//! the background with backoff, sampled and actuated concurrently under a timeout each,
//! and dropped cleanly when their hypervisor goes away.

use super::backoff::Backoff;
use crate::config::{Bounds, Config};
use async_trait::async_trait;
use futures::future::join_all;
use memtide_adapters::qmp::{QmpVm, QmpVmOptions};
use memtide_core::backend::VmBackend;
use memtide_core::{BackendError, Bytes, VmSnapshot};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio::time::{timeout, Instant};
use tracing::Instrument;

/// Opens a connection to a VM's control socket.
#[async_trait]
pub trait Connector: Send + Sync + 'static {
    /// Connect to the VM behind `socket`, with its guest agent's socket if it has one.
    async fn connect(
        &self,
        socket: &Path,
        agent: Option<&Path>,
    ) -> Result<Box<dyn VmBackend>, BackendError>;
}

/// Connects to QEMU over QMP.
pub struct QmpConnector(pub QmpVmOptions);

#[async_trait]
impl Connector for QmpConnector {
    async fn connect(
        &self,
        socket: &Path,
        agent: Option<&Path>,
    ) -> Result<Box<dyn VmBackend>, BackendError> {
        Ok(Box::new(QmpVm::connect(socket, agent, &self.0).await?))
    }
}

/// Something that happened to the fleet, for the event log.
#[derive(Debug, Clone, PartialEq)]
pub enum FleetEvent {
    /// A VM was connected and is now managed.
    Connected {
        /// Its name.
        vm: String,
        /// Its socket.
        socket: PathBuf,
    },
    /// A managed VM went away.
    Lost {
        /// Its name.
        vm: String,
        /// Why.
        why: String,
    },
}

/// A VM known by its socket but not connected, shown in status.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Waiting {
    /// Its name.
    pub name: String,
    /// Its socket.
    pub socket: PathBuf,
    /// The last connection error.
    pub error: Option<String>,
    /// Seconds until the next attempt.
    pub retry_in_s: f64,
}

/// A VM not connected yet.
struct Candidate {
    name: String,
    agent: Option<PathBuf>,
    bounds: Bounds,
    /// Found by a glob (forgotten when its socket disappears), not named in the config.
    discovered: bool,
    backoff: Backoff,
    error: Option<String>,
}

/// A connected VM.
struct Managed {
    socket: PathBuf,
    agent: Option<PathBuf>,
    bounds: Bounds,
    discovered: bool,
    backend: Box<dyn VmBackend>,
    /// The configured size, once a sample has told it.
    configured: Option<Bytes>,
}

type Attempt = (PathBuf, Result<Box<dyn VmBackend>, BackendError>);

/// All VMs, connected or not.
pub struct Fleet {
    connector: Arc<dyn Connector>,
    globs: Vec<String>,
    agent_extension: String,
    defaults: crate::config::VmDefaults,
    call_timeout: Duration,
    candidates: BTreeMap<PathBuf, Candidate>,
    managed: BTreeMap<String, Managed>,
    connecting: JoinSet<Attempt>,
    in_flight: std::collections::HashSet<PathBuf>,
}

impl Fleet {
    /// A fleet from the configuration's VM list and globs.
    pub fn new(config: &Config, connector: Arc<dyn Connector>) -> Fleet {
        let candidates = config
            .vms
            .iter()
            .map(|vm| {
                let c = Candidate {
                    name: vm.name.clone(),
                    agent: vm.agent.clone(),
                    bounds: Bounds::new(Some(vm), &config.defaults),
                    discovered: false,
                    backoff: Backoff::default(),
                    error: None,
                };
                (vm.qmp.clone(), c)
            })
            .collect();
        Fleet {
            connector,
            globs: config.discovery.qmp_glob.clone(),
            agent_extension: config.discovery.agent_extension.clone(),
            defaults: config.defaults.clone(),
            call_timeout: config.call_timeout(),
            candidates,
            managed: BTreeMap::new(),
            connecting: JoinSet::new(),
            in_flight: Default::default(),
        }
    }

    /// Take in finished connection attempts, discover new sockets, forget vanished ones,
    /// and start attempts for candidates whose backoff has passed. Never waits on a VM.
    pub fn refresh(&mut self) -> Vec<FleetEvent> {
        let now = Instant::now();
        let mut events = Vec::new();
        while let Some(done) = self.connecting.try_join_next() {
            let Ok((socket, result)) = done else { continue }; // a panicked attempt is retried
            self.in_flight.remove(&socket);
            let Some(mut c) = self.candidates.remove(&socket) else {
                continue;
            };
            match result {
                Ok(backend) => {
                    events.push(FleetEvent::Connected {
                        vm: c.name.clone(),
                        socket: socket.clone(),
                    });
                    let m = Managed {
                        socket,
                        agent: c.agent,
                        bounds: c.bounds,
                        discovered: c.discovered,
                        backend,
                        configured: None,
                    };
                    self.managed.insert(c.name, m);
                }
                Err(e) => {
                    c.error = Some(e.to_string());
                    c.backoff.failed(now);
                    self.candidates.insert(socket, c);
                }
            }
        }
        self.discover();
        for (socket, c) in &self.candidates {
            if c.backoff.ready(now) && self.in_flight.insert(socket.clone()) {
                let (connector, socket, limit) =
                    (self.connector.clone(), socket.clone(), self.call_timeout);
                let agent = c.agent.clone();
                self.connecting.spawn(async move {
                    // connect() makes several calls; bound the whole of it.
                    let result = timeout(limit * 4, connector.connect(&socket, agent.as_deref()))
                        .await
                        .unwrap_or_else(|_| Err(BackendError::timeout(limit * 4)));
                    (socket, result)
                });
            }
        }
        events
    }

    /// Add sockets matching the globs; forget discovered candidates whose socket is gone.
    fn discover(&mut self) {
        let mut seen = std::collections::HashSet::new();
        for pattern in &self.globs {
            for socket in glob::glob(pattern).into_iter().flatten().flatten() {
                seen.insert(socket.clone());
                let known = self.candidates.contains_key(&socket)
                    || self.managed.values().any(|m| m.socket == socket);
                let Some(name) = socket.file_stem().and_then(|s| s.to_str()) else {
                    continue;
                };
                let taken = self.managed.contains_key(name)
                    || self.candidates.values().any(|c| c.name == name);
                if known || taken {
                    continue;
                }
                let agent = (!self.agent_extension.is_empty())
                    .then(|| socket.with_extension(&self.agent_extension))
                    .filter(|a| a.exists());
                let c = Candidate {
                    name: name.to_string(),
                    agent,
                    bounds: Bounds::new(None, &self.defaults),
                    discovered: true,
                    backoff: Backoff::default(),
                    error: None,
                };
                self.candidates.insert(socket, c);
            }
        }
        self.candidates
            .retain(|socket, c| !c.discovered || seen.contains(socket));
    }

    /// Sample every managed VM concurrently, each bounded by the call timeout. VMs whose
    /// connection is gone are dropped (and reported); the rest are returned in name order.
    pub async fn sample(&mut self) -> (Vec<VmSnapshot>, Vec<FleetEvent>) {
        let limit = self.call_timeout;
        let results = join_all(self.managed.iter_mut().map(|(name, m)| async move {
            let span = tracing::info_span!("vm", name = name.as_str());
            let sample = timeout(limit, m.backend.sample().instrument(span))
                .await
                .unwrap_or_else(|_| Err(BackendError::timeout(limit)));
            (name.clone(), sample)
        }))
        .await;
        let mut vms = Vec::new();
        let mut events = Vec::new();
        for (name, sample) in results {
            if let Err(BackendError::Disconnected(why)) = &sample {
                self.lose(&name, why.clone());
                events.push(FleetEvent::Lost {
                    vm: name,
                    why: why.clone(),
                });
                continue;
            }
            let m = self
                .managed
                .get_mut(&name)
                .expect("sampled VMs are managed");
            if let Ok(s) = &sample {
                m.configured = Some(s.configured);
            }
            let limits = m.bounds.limits(m.configured.unwrap_or(Bytes::ZERO));
            vms.push(VmSnapshot {
                limits,
                target: m.backend.target(),
                name,
                sample,
            });
        }
        (vms, events)
    }

    /// Move a managed VM back to the candidates, to be reconnected with backoff (config
    /// VMs) or rediscovered while its socket exists (discovered VMs).
    fn lose(&mut self, name: &str, why: String) {
        let Some(m) = self.managed.remove(name) else {
            return;
        };
        let mut backoff = Backoff::default();
        backoff.failed(Instant::now());
        let c = Candidate {
            name: name.to_string(),
            agent: m.agent,
            bounds: m.bounds,
            discovered: m.discovered,
            backoff,
            error: Some(why),
        };
        self.candidates.insert(m.socket, c);
    }

    /// Set balloon targets concurrently, each bounded by the call timeout.
    pub async fn set_balloons(
        &mut self,
        targets: &[(String, Bytes)],
    ) -> Vec<Result<(), BackendError>> {
        let limit = self.call_timeout;
        let mut by_name: BTreeMap<&str, &mut Managed> = self
            .managed
            .iter_mut()
            .map(|(n, m)| (n.as_str(), m))
            .collect();
        let mut calls = Vec::new();
        for (name, target) in targets {
            let call = by_name.remove(name.as_str()).map(|m| async move {
                timeout(limit, m.backend.set_balloon(*target))
                    .await
                    .unwrap_or_else(|_| Err(BackendError::timeout(limit)))
            });
            calls.push(call);
        }
        join_all(calls.into_iter().map(|call| async move {
            match call {
                Some(call) => call.await,
                None => Err(BackendError::Disconnected(
                    "the VM is no longer connected".into(),
                )),
            }
        }))
        .await
    }

    /// VMs known but not connected.
    pub fn waiting(&self) -> Vec<Waiting> {
        let now = Instant::now();
        self.candidates
            .iter()
            .map(|(socket, c)| Waiting {
                name: c.name.clone(),
                socket: socket.clone(),
                error: c.error.clone(),
                retry_in_s: c.backoff.remaining(now).as_secs_f64(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memtide_core::{VmSample, VmSnapshot};
    use std::collections::HashMap;
    use std::sync::Mutex;

    /// How a fake VM behaves.
    #[derive(Clone, Copy, PartialEq)]
    enum Behaviour {
        Healthy,
        Refuses,
        Hangs,
        Dies,
    }

    /// Connects to fake VMs whose behaviour the test changes by socket path.
    #[derive(Default)]
    struct FakeConnector {
        behaviour: Mutex<HashMap<PathBuf, Behaviour>>,
        attempts: Mutex<Vec<PathBuf>>,
    }

    struct FakeVm(Behaviour);

    #[async_trait]
    impl VmBackend for FakeVm {
        async fn sample(&mut self) -> Result<VmSample, BackendError> {
            match self.0 {
                Behaviour::Hangs => std::future::pending().await,
                Behaviour::Dies => Err(BackendError::Disconnected("end of stream".into())),
                _ => Ok(VmSample {
                    configured: Bytes::from_mib(512),
                    balloon: Some(Bytes::from_mib(512)),
                    stats: Default::default(),
                    agent: None,
                    rss: None,
                    referenced: None,
                    events: Vec::new(),
                }),
            }
        }
        async fn set_balloon(&mut self, _: Bytes) -> Result<(), BackendError> {
            Ok(())
        }
        fn target(&self) -> Option<Bytes> {
            None
        }
    }

    #[async_trait]
    impl Connector for FakeConnector {
        async fn connect(
            &self,
            socket: &Path,
            _agent: Option<&Path>,
        ) -> Result<Box<dyn VmBackend>, BackendError> {
            self.attempts.lock().unwrap().push(socket.to_path_buf());
            match self
                .behaviour
                .lock()
                .unwrap()
                .get(socket)
                .copied()
                .unwrap_or(Behaviour::Healthy)
            {
                Behaviour::Refuses => Err(BackendError::Disconnected("connection refused".into())),
                b => Ok(Box::new(FakeVm(b))),
            }
        }
    }

    fn names(vms: &[VmSnapshot]) -> Vec<&str> {
        vms.iter().map(|v| v.name.as_str()).collect()
    }

    /// Let background connection attempts finish.
    async fn settle(fleet: &mut Fleet) -> Vec<FleetEvent> {
        fleet.refresh();
        tokio::time::sleep(Duration::from_millis(10)).await;
        fleet.refresh()
    }

    fn fleet(dir: &Path, connector: Arc<FakeConnector>) -> Fleet {
        let mut config = Config::default();
        config.discovery.qmp_glob = vec![dir.join("*.sock").display().to_string()];
        config.daemon.call_timeout_ms = 100;
        Fleet::new(&config, connector)
    }

    #[tokio::test(start_paused = true)]
    async fn sockets_that_appear_are_managed_and_vanished_ones_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let connector = Arc::new(FakeConnector::default());
        let mut fleet = fleet(dir.path(), connector.clone());
        assert!(settle(&mut fleet).await.is_empty());
        std::fs::write(dir.path().join("web.sock"), "").unwrap();
        let events = settle(&mut fleet).await;
        assert_eq!(
            events,
            vec![FleetEvent::Connected {
                vm: "web".into(),
                socket: dir.path().join("web.sock")
            }]
        );
        let (vms, _) = fleet.sample().await;
        assert_eq!(names(&vms), ["web"]);
        assert_eq!(
            vms[0].limits.max,
            Bytes::from_mib(512),
            "limits follow the configured size"
        );
        assert_eq!(vms[0].limits.min, Bytes::from_mib(128), "default min");

        // QEMU dies: the VM leaves the managed set; the stale socket refuses; then it is removed.
        connector
            .behaviour
            .lock()
            .unwrap()
            .insert(dir.path().join("web.sock"), Behaviour::Refuses);
        fleet.managed.get_mut("web").unwrap().backend = Box::new(FakeVm(Behaviour::Dies));
        let (vms, events) = fleet.sample().await;
        assert!(vms.is_empty());
        assert_eq!(
            events,
            vec![FleetEvent::Lost {
                vm: "web".into(),
                why: "end of stream".into()
            }]
        );
        assert_eq!(fleet.waiting()[0].error.as_deref(), Some("end of stream"));
        std::fs::remove_file(dir.path().join("web.sock")).unwrap();
        settle(&mut fleet).await;
        assert!(
            fleet.waiting().is_empty(),
            "a discovered VM whose socket is gone is forgotten"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn failed_connections_are_retried_with_growing_delays() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("db.sock");
        std::fs::write(&socket, "").unwrap();
        let connector = Arc::new(FakeConnector::default());
        connector
            .behaviour
            .lock()
            .unwrap()
            .insert(socket.clone(), Behaviour::Refuses);
        let mut fleet = fleet(dir.path(), connector.clone());
        // Over 8 simulated seconds: attempts at 0, 1, 3 and 7 s (delays 1, 2, 4 s).
        for _ in 0..80 {
            settle(&mut fleet).await;
            tokio::time::advance(Duration::from_millis(100)).await;
        }
        assert_eq!(connector.attempts.lock().unwrap().len(), 4);
        assert_eq!(
            fleet.waiting()[0].error.as_deref(),
            Some("disconnected: connection refused")
        );
        // It comes up: the next attempt connects it.
        connector
            .behaviour
            .lock()
            .unwrap()
            .insert(socket, Behaviour::Healthy);
        tokio::time::advance(Duration::from_secs(8)).await;
        let events = settle(&mut fleet).await;
        assert!(matches!(&events[..], [FleetEvent::Connected { vm, .. }] if vm == "db"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_vm_times_out_without_holding_the_others() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["hung", "ok"] {
            std::fs::write(dir.path().join(format!("{name}.sock")), "").unwrap();
        }
        let connector = Arc::new(FakeConnector::default());
        connector
            .behaviour
            .lock()
            .unwrap()
            .insert(dir.path().join("hung.sock"), Behaviour::Hangs);
        let mut fleet = fleet(dir.path(), connector);
        settle(&mut fleet).await;
        let start = Instant::now();
        let (vms, events) = fleet.sample().await;
        assert_eq!(
            start.elapsed(),
            Duration::from_millis(100),
            "bounded by the call timeout"
        );
        assert!(events.is_empty(), "a timeout is not a disconnect");
        assert_eq!(vms[0].sample, Err(BackendError::Timeout(100)));
        assert!(vms[1].sample.is_ok());
    }
}
