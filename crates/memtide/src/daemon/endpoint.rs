//! Where a VM is reached, and how a connection to it is opened.

use crate::config::{Bound, BoundFrom, VmConfig};
use async_trait::async_trait;
use memtide_core::backend::VmBackend;
use memtide_core::BackendError;
use std::fmt;
use std::path::{Path, PathBuf};

/// Where a VM is reached.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Endpoint {
    /// QEMU's QMP socket.
    Qmp(PathBuf),
    /// A domain on a libvirt connection.
    Libvirt {
        /// The connection URI.
        uri: String,
        /// The domain's name.
        domain: String,
    },
    /// Firecracker's API socket.
    Firecracker(PathBuf),
    /// Cloud Hypervisor's API socket.
    CloudHypervisor(PathBuf),
}

impl Endpoint {
    /// The endpoint a configured VM names.
    pub(super) fn of(vm: &VmConfig) -> Option<Endpoint> {
        let libvirt = vm.libvirt.clone().map(|uri| Endpoint::Libvirt {
            uri,
            domain: vm.name.clone(),
        });
        vm.qmp
            .clone()
            .map(Endpoint::Qmp)
            .or(libvirt)
            .or_else(|| vm.firecracker.clone().map(Endpoint::Firecracker))
            .or_else(|| vm.cloud_hypervisor.clone().map(Endpoint::CloudHypervisor))
    }

    /// The connector's name, as metrics label it.
    pub(super) fn connector(&self) -> &'static str {
        match self {
            Endpoint::Qmp(_) => "qmp",
            Endpoint::Libvirt { .. } => "libvirt",
            Endpoint::Firecracker(_) => "firecracker",
            Endpoint::CloudHypervisor(_) => "cloud_hypervisor",
        }
    }

    /// The socket, for endpoints that are one.
    pub(super) fn socket(&self) -> Option<&Path> {
        match self {
            Endpoint::Qmp(p) | Endpoint::Firecracker(p) | Endpoint::CloudHypervisor(p) => Some(p),
            Endpoint::Libvirt { .. } => None,
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Qmp(p) => write!(f, "{}", p.display()),
            Endpoint::Libvirt { uri, domain } => write!(f, "{uri} domain {domain}"),
            Endpoint::Firecracker(p) => write!(f, "firecracker {}", p.display()),
            Endpoint::CloudHypervisor(p) => write!(f, "cloud-hypervisor {}", p.display()),
        }
    }
}

/// A connected VM and the bounds its hypervisor's configuration sets (libvirt's domain
/// description, Proxmox VE's VM configuration), which the memtide configuration
/// overrides.
pub struct Connection {
    /// The backend.
    pub backend: Box<dyn VmBackend>,
    /// Never below this (unless the configuration says otherwise), and where it came
    /// from.
    pub min: Option<Bound>,
    /// Never above this (unless the configuration says otherwise), and where it came from.
    pub max: Option<Bound>,
    /// Its weight when memory is divided (unless the configuration says otherwise).
    pub shares: Option<u32>,
    /// Its hypervisor's process, when known (for its cgroup).
    pub pid: Option<u32>,
    /// Where the bounds its backend reports while it runs ([`VmBackend::bounds`]) come
    /// from, for backends that report them; they then stand for `min` and `max`.
    pub described: Option<BoundFrom>,
}

impl Connection {
    /// A connection whose hypervisor sets no bounds.
    pub fn new(backend: Box<dyn VmBackend>) -> Connection {
        Connection {
            backend,
            min: None,
            max: None,
            shares: None,
            pid: None,
            described: None,
        }
    }
}

/// Opens connections to VMs, and lists the VMs a hypervisor manager knows.
#[async_trait]
pub trait Connector: Send + Sync + 'static {
    /// Connect to VM `vm` at `endpoint`, with its guest agent's socket if it has one.
    async fn connect(
        &self,
        vm: &str,
        endpoint: &Endpoint,
        agent: Option<&Path>,
    ) -> Result<Connection, BackendError>;
    /// The names of the running domains on the libvirt connection `uri`.
    async fn running_domains(&self, uri: &str) -> Result<Vec<String>, BackendError>;
    /// Drop what is kept for the libvirt connection `uri`: its daemon is gone.
    fn forget(&self, _uri: &str) {}
}
