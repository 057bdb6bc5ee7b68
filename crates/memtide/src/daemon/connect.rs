//! The connector the daemon uses: each endpoint kind to its adapter.

use super::endpoint::{Connection, Connector, Endpoint};
use crate::config::{BoundFrom, Config};
use async_trait::async_trait;
use memtide_adapters::api_socket::ApiVmOptions;
use memtide_adapters::cloud_hypervisor::CloudHypervisorVm;
use memtide_adapters::firecracker::FirecrackerVm;
use memtide_adapters::proxmox;
use memtide_adapters::qmp::{QmpVm, QmpVmOptions};
use memtide_core::backend::VmBackend;
use memtide_core::BackendError;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Connects to QEMU (QMP), libvirt domains, Firecracker and Cloud Hypervisor.
pub struct Connectors {
    qmp: QmpVmOptions,
    /// Proxmox VE's VM configurations, where QMP VMs take their bounds from.
    pve_config_dir: Option<PathBuf>,
    /// One read of a Proxmox VE configuration at a time: a read of a hung pmxcfs keeps
    /// its thread, and attempts after it wait here instead of each taking another.
    pve_reads: Arc<tokio::sync::Semaphore>,
    api: ApiVmOptions,
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
            pve_config_dir: config.discovery.pve_config_dir.clone(),
            pve_reads: Arc::new(tokio::sync::Semaphore::new(1)),
            api: ApiVmOptions {
                call_timeout: config.call_timeout(),
                stats_interval_s,
                proc: config.host.proc.clone(),
            },
            #[cfg(feature = "libvirt")]
            libvirt: libvirt::Connections::new(config, stats_interval_s),
        }
    }
}

/// The memory settings of the Proxmox VE VM whose QMP socket is `socket` (named by its
/// VMID: `101.sock` → `dir/101.conf`), refused while PVE's own auto-ballooning moves its
/// balloon: two managers of one balloon undo each other's targets.
fn pve_memory(dir: &Path, socket: &Path) -> Result<proxmox::PveMemory, BackendError> {
    let vmid = socket.file_stem().unwrap_or_default();
    let m = pve_settings(dir, vmid)?;
    if m.auto_ballooned() {
        return Err(BackendError::LeftAlone(format!(
            "Proxmox VE's auto-ballooning (pvestatd) moves its balloon (balloon {} below \
             memory {}, shares {}): `qm set {} --shares 0` leaves it to memtide",
            m.min,
            m.memory,
            m.shares.unwrap_or_default(),
            vmid.to_string_lossy()
        )));
    }
    Ok(m)
}

/// The memory settings in `dir/VMID.conf`.
fn pve_settings(dir: &Path, vmid: &std::ffi::OsStr) -> Result<proxmox::PveMemory, BackendError> {
    let conf = dir.join(vmid).with_extension("conf");
    let text = std::fs::read_to_string(&conf).map_err(|e| {
        BackendError::Io(format!("Proxmox VE configuration {}: {e}", conf.display()))
    })?;
    proxmox::memory(&text).map_err(|e| {
        BackendError::Protocol(format!("Proxmox VE configuration {}: {e}", conf.display()))
    })
}

impl Connectors {
    /// [`pve_memory`] off the runtime, one read at a time, within the call timeout
    /// (waiting for a read under way included).
    async fn pve_memory(
        &self,
        dir: &Path,
        socket: &Path,
    ) -> Result<proxmox::PveMemory, BackendError> {
        let limit = self.qmp.call_timeout;
        let read = async {
            let permit = self.pve_reads.clone().acquire_owned().await;
            let permit = permit.expect("the semaphore is never closed");
            let (dir, socket) = (dir.to_path_buf(), socket.to_path_buf());
            tokio::task::spawn_blocking(move || {
                let _permit = permit;
                pve_memory(&dir, &socket)
            })
            .await
        };
        let read = tokio::time::timeout(limit, read)
            .await
            .map_err(|_| BackendError::timeout(limit))?;
        read.map_err(|e| BackendError::Io(e.to_string()))?
    }
}

#[async_trait]
impl Connector for Connectors {
    async fn connect(
        &self,
        endpoint: &Endpoint,
        agent: Option<&Path>,
    ) -> Result<Connection, BackendError> {
        Ok(match endpoint {
            Endpoint::Qmp(socket) => {
                // Read first: a VM whose PVE configuration cannot be read is not connected
                // (its bounds are unknown), and is retried with the others.
                // Read off the runtime, and not waited for past the call timeout: /etc/pve
                // is a FUSE file system (pmxcfs), and one that hangs must not hold every
                // other VM's task.
                let pve = match &self.pve_config_dir {
                    Some(dir) => Some(self.pve_memory(dir, socket).await?),
                    None => None,
                };
                let vm = QmpVm::connect(socket, agent, &self.qmp).await?;
                let mut connection = with_pid(vm.pid(), Box::new(vm));
                if let Some(m) = pve {
                    connection.min = Some((m.min, BoundFrom::Proxmox));
                    connection.max = Some((m.memory, BoundFrom::Proxmox));
                    connection.shares = m.shares;
                }
                connection
            }
            // Each with its process, where proactive reclaim finds its cgroup.
            Endpoint::Firecracker(socket) => {
                let vm = FirecrackerVm::connect(socket, &self.api).await?;
                with_pid(vm.pid(), Box::new(vm))
            }
            Endpoint::CloudHypervisor(socket) => {
                let vm = CloudHypervisorVm::connect(socket, &self.api).await?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use memtide_core::Bytes;

    #[test]
    fn a_proxmox_vm_takes_its_bounds_from_its_configuration_unless_pve_auto_balloons_it() {
        let dir = tempfile::tempdir().unwrap();
        let conf = "memory: 2048\nballoon: 512\nshares: 0\nname: db\n";
        std::fs::write(dir.path().join("101.conf"), conf).unwrap();
        std::fs::write(dir.path().join("102.conf"), "memory: 2G\n").unwrap();
        let m = pve_memory(dir.path(), Path::new("/run/memtide/qmp/101.sock")).unwrap();
        assert_eq!(
            (m.memory, m.min, m.shares),
            (Bytes::from_mib(2048), Bytes::from_mib(512), None)
        );
        // Shares, but nothing to shrink: PVE leaves it at its size.
        let conf = "memory: 2048\nshares: 300\n";
        std::fs::write(dir.path().join("104.conf"), conf).unwrap();
        let m = pve_memory(dir.path(), Path::new("/q/104.sock")).unwrap();
        assert_eq!((m.min, m.shares), (Bytes::from_mib(2048), Some(300)));
        // PVE's auto-ballooning moves it (shares unset: PVE's default 1000).
        std::fs::write(dir.path().join("105.conf"), "memory: 2048\nballoon: 512\n").unwrap();
        let refused = pve_memory(dir.path(), Path::new("/q/105.sock"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            refused,
            "left alone: Proxmox VE's auto-ballooning (pvestatd) moves its balloon (balloon \
             512 MiB below memory 2.0 GiB, shares 1000): `qm set 105 --shares 0` leaves it to \
             memtide"
        );
        let missing = pve_memory(dir.path(), Path::new("/run/memtide/qmp/103.sock"))
            .unwrap_err()
            .to_string();
        assert!(
            missing.contains("Proxmox VE configuration") && missing.contains("103.conf"),
            "{missing}"
        );
        let bad = pve_memory(dir.path(), Path::new("/q/102.sock"))
            .unwrap_err()
            .to_string();
        assert!(bad.ends_with("102.conf: bad memory: \"2G\""), "{bad}");
    }

    #[tokio::test]
    async fn a_hung_proxmox_configuration_is_read_by_one_thread_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        // A configuration whose read blocks until something writes it, as a hung pmxcfs.
        let conf = dir.path().join("101.conf");
        rustix::fs::mkfifoat(rustix::fs::CWD, &conf, 0o600.into()).unwrap();
        let mut config = Config::default();
        config.daemon.call_timeout_ms = 100;
        config.discovery.pve_config_dir = Some(dir.path().into());
        let connectors = Connectors::new(&config);
        let socket = Path::new("/run/memtide/qmp/101.sock");
        for _ in 0..3 {
            let e = connectors.pve_memory(dir.path(), socket).await.unwrap_err();
            assert!(matches!(e, BackendError::Timeout(_)), "{e}");
        }
        assert_eq!(
            connectors.pve_reads.available_permits(),
            0,
            "the first read still holds its thread; the others took none"
        );
        // pmxcfs answers: the read under way ends, and the next read may start.
        std::fs::write(&conf, "memory: 2048\n").unwrap();
        for _ in 0..200 {
            if connectors.pve_reads.available_permits() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(connectors.pve_reads.available_permits(), 1);
    }
}
