//! The connector the daemon uses: each endpoint kind to its adapter.

use super::endpoint::{Connection, Connector, Endpoint};
use super::pve::{PveConfigs, PveVm};
use crate::config::{BoundFrom, Config};
use crate::snapshots::Store;
use async_trait::async_trait;
use memtide_adapters::api_socket::ApiVmOptions;
use memtide_adapters::cloud_hypervisor::CloudHypervisorVm;
use memtide_adapters::firecracker::FirecrackerVm;
use memtide_adapters::qmp::{QmpVm, QmpVmOptions};
use memtide_adapters::vmm_snapshot::PAUSED_MARK;
use memtide_core::backend::VmBackend;
use memtide_core::BackendError;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Connects to QEMU (QMP), libvirt domains, Firecracker and Cloud Hypervisor.
pub struct Connectors {
    qmp: QmpVmOptions,
    /// Proxmox VE's VM configurations, where QMP VMs take their bounds from.
    pve: Option<Arc<PveConfigs>>,
    api: ApiVmOptions,
    /// The snapshot store, where a save cut short leaves its mark of a paused guest.
    store: Store,
    #[cfg(feature = "libvirt")]
    libvirt: libvirt::Connections,
}

impl Connectors {
    /// The connectors for a configuration.
    pub fn new(config: &Config) -> Connectors {
        let stats_interval_s = config.interval_s.round().max(1.0) as u64;
        Connectors {
            qmp: QmpVmOptions {
                call_timeout: config.call_timeout(),
                stats_interval_s,
                proc: config.host.proc.clone(),
                sys: config.host.sys.clone(),
                sample_access: config.sample_access(),
                least_sample_window: Duration::from_secs_f64(config.interval_s / 2.0),
            },
            pve: (config.discovery.pve_config_dir.as_deref())
                .map(|dir| Arc::new(PveConfigs::new(dir, config.call_timeout()))),
            api: ApiVmOptions {
                call_timeout: config.call_timeout(),
                stats_interval_s,
                proc: config.host.proc.clone(),
            },
            store: Store::new(&config.snapshots.dir),
            #[cfg(feature = "libvirt")]
            libvirt: libvirt::Connections::new(config, stats_interval_s),
        }
    }
}

#[async_trait]
impl Connector for Connectors {
    async fn connect(
        &self,
        vm: &str,
        endpoint: &Endpoint,
        agent: Option<&Path>,
    ) -> Result<Connection, BackendError> {
        // Where a save of the VM marks the guest it paused (Firecracker, Cloud Hypervisor).
        let mark = self.store.vm_dir(vm).join(PAUSED_MARK);
        Ok(match endpoint {
            Endpoint::Qmp(socket) => {
                // Read first: a VM whose PVE configuration cannot be read is not connected
                // (its bounds are unknown), and is retried with the others.
                // Read off the runtime, and not waited for past the call timeout: /etc/pve
                // is a FUSE file system (pmxcfs), and one that hangs must not hold every
                // other VM's task.
                let pve = match &self.pve {
                    Some(configs) => Some((configs, configs.read(socket).await?)),
                    None => None,
                };
                let vm = QmpVm::connect(socket, agent, &self.qmp).await?;
                let pid = vm.pid();
                let Some((configs, m)) = pve else {
                    return Ok(with_pid(pid, Box::new(vm)));
                };
                // Its bounds follow its configuration as it is read again.
                let vm = PveVm::new(vm, configs.clone(), socket, m);
                Connection {
                    min: Some((m.min, BoundFrom::Proxmox)),
                    max: Some((m.memory, BoundFrom::Proxmox)),
                    shares: m.shares,
                    described: Some(BoundFrom::Proxmox),
                    ..with_pid(pid, Box::new(vm))
                }
            }
            // Each with its process, where proactive reclaim finds its cgroup.
            Endpoint::Firecracker(socket) => {
                let vm = FirecrackerVm::connect(socket, &self.api, Some(&mark)).await?;
                with_pid(vm.pid(), Box::new(vm))
            }
            Endpoint::CloudHypervisor(socket) => {
                let vm = CloudHypervisorVm::connect(socket, &self.api, Some(&mark)).await?;
                with_pid(vm.pid(), Box::new(vm))
            }
            #[cfg(feature = "libvirt")]
            Endpoint::Libvirt { uri, domain } => self.libvirt.connect(uri, domain).await?,
            #[cfg(not(feature = "libvirt"))]
            Endpoint::Libvirt { .. } => return Err(no_libvirt()),
        })
    }

    async fn running_domains(&self, uri: &str) -> Result<Vec<String>, BackendError> {
        #[cfg(feature = "libvirt")]
        return self.libvirt.running_domains(uri).await;
        #[cfg(not(feature = "libvirt"))]
        {
            let _ = uri;
            Err(no_libvirt())
        }
    }

    fn forget(&self, uri: &str) {
        #[cfg(feature = "libvirt")]
        self.libvirt.forget(uri);
        #[cfg(not(feature = "libvirt"))]
        let _ = uri;
    }
}

/// A connection to a VM whose hypervisor process is `pid` (from its socket's peer;
/// unknown where it is not a process: 0, a peer in another pid namespace).
fn with_pid(pid: Option<i32>, backend: Box<dyn VmBackend>) -> Connection {
    let mut connection = Connection::new(backend);
    connection.pid = pid
        .and_then(memtide_adapters::procfs::known_pid)
        .map(i32::unsigned_abs);
    connection
}

#[cfg(not(feature = "libvirt"))]
fn no_libvirt() -> BackendError {
    BackendError::Protocol("this memtide was built without libvirt support".into())
}

#[cfg(feature = "libvirt")]
mod libvirt {
    use super::super::endpoint::Connection;
    use crate::config::{BoundFrom, Config};
    use memtide_adapters::libvirt::{Libvirt, LibvirtVm, LibvirtVmOptions};
    use memtide_core::backend::VmBackend;
    use memtide_core::BackendError;
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// One shared connection per libvirt URI: those in the configuration, and those
    /// found on the node (KubeVirt's launchers), made when first asked for.
    pub struct Connections {
        by_uri: Mutex<BTreeMap<String, Arc<Libvirt>>>,
        call_timeout: Duration,
        opts: LibvirtVmOptions,
    }

    impl Connections {
        pub fn new(config: &Config, stats_interval_s: u64) -> Connections {
            Connections {
                by_uri: Mutex::default(),
                call_timeout: config.call_timeout(),
                opts: LibvirtVmOptions {
                    stats_interval_s,
                    proc: config.host.proc.clone(),
                },
            }
        }

        /// The connection to `uri`, made (not opened: that waits for its first call) if
        /// there is none.
        fn get(&self, uri: &str) -> Arc<Libvirt> {
            let mut by_uri = self.by_uri.lock().expect("libvirt connections lock");
            by_uri
                .entry(uri.to_string())
                .or_insert_with(|| Arc::new(Libvirt::new(uri, self.call_timeout)))
                .clone()
        }

        /// Drop the connection to `uri` (its VMs keep theirs until they fail).
        pub fn forget(&self, uri: &str) {
            self.by_uri
                .lock()
                .expect("libvirt connections lock")
                .remove(uri);
        }

        pub async fn connect(&self, uri: &str, domain: &str) -> Result<Connection, BackendError> {
            let vm = LibvirtVm::connect(&self.get(uri), domain, &self.opts).await?;
            // Its bounds follow the domain's description as the connector reads it again.
            Ok(Connection {
                described: Some(BoundFrom::Libvirt),
                ..super::with_pid(vm.pid(), Box::new(vm))
            })
        }

        pub async fn running_domains(&self, uri: &str) -> Result<Vec<String>, BackendError> {
            Ok(self.get(uri).running_domains().await?)
        }
    }
}
