//! Proxmox VE's VM configurations (`VMID.conf` in `[discovery] pve_config_dir`): where a
//! QEMU VM of a PVE host takes its bounds from, read at its connection and again while it
//! runs, so that `qm set` holds without a reconnection. `/etc/pve` is pmxcfs, a FUSE file
//! system whose reads may hang: each read is made off the runtime, one at a time.

use async_trait::async_trait;
use memtide_adapters::proxmox::{self, PveMemory};
use memtide_adapters::{Relearn, RELEARN_SAMPLES};
use memtide_core::backend::{AfterSave, Saved, Seal, VmBackend};
use memtide_core::{BackendError, Bytes, VmSample};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// The configurations of a PVE host's VMs.
pub struct PveConfigs {
    dir: PathBuf,
    /// One read at a time: a read of a hung pmxcfs keeps its thread, and reads after it
    /// wait here instead of each taking another.
    reads: Arc<tokio::sync::Semaphore>,
    call_timeout: Duration,
}

impl PveConfigs {
    /// The configurations in `dir`, a read waited for at most `call_timeout`.
    pub fn new(dir: &Path, call_timeout: Duration) -> PveConfigs {
        PveConfigs {
            dir: dir.to_path_buf(),
            reads: Arc::new(tokio::sync::Semaphore::new(1)),
            call_timeout,
        }
    }

    /// The memory settings of the VM whose QMP socket is `socket`, within the call
    /// timeout (waiting for a read under way included: one given up on waits no more).
    pub async fn read(&self, socket: &Path) -> Result<PveMemory, BackendError> {
        let limit = self.call_timeout;
        let read = async {
            let permit = self.reads.clone().acquire_owned().await;
            self.read_off_runtime(permit.expect("the semaphore is never closed"), socket)
                .await
                .map_err(|e| BackendError::Io(e.to_string()))?
        };
        tokio::time::timeout(limit, read)
            .await
            .map_err(|_| BackendError::timeout(limit))?
    }

    /// [`PveConfigs::read`], started now and not waited for, unless another read is
    /// under way: a read again while a VM runs never queues ahead of a connection's.
    fn reread(&self, socket: &Path) -> Option<JoinHandle<Result<PveMemory, BackendError>>> {
        let permit = self.reads.clone().try_acquire_owned().ok()?;
        Some(self.read_off_runtime(permit, socket))
    }

    /// A read on a blocking thread, holding `permit` until it ends.
    fn read_off_runtime(
        &self,
        permit: tokio::sync::OwnedSemaphorePermit,
        socket: &Path,
    ) -> JoinHandle<Result<PveMemory, BackendError>> {
        let (dir, socket) = (self.dir.clone(), socket.to_path_buf());
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            memory(&dir, &socket)
        })
    }
}

/// The memory settings of the PVE VM whose QMP socket is `socket` (named by its VMID:
/// `101.sock` → `dir/101.conf`), refused while PVE's own auto-ballooning moves its
/// balloon: two managers of one balloon undo each other's targets.
fn memory(dir: &Path, socket: &Path) -> Result<PveMemory, BackendError> {
    let vmid = socket.file_stem().unwrap_or_default();
    let conf = dir.join(vmid).with_extension("conf");
    let text = std::fs::read_to_string(&conf).map_err(|e| {
        BackendError::Io(format!("Proxmox VE configuration {}: {e}", conf.display()))
    })?;
    let m = proxmox::memory(&text).map_err(|e| {
        BackendError::Protocol(format!("Proxmox VE configuration {}: {e}", conf.display()))
    })?;
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

/// A QEMU VM of a PVE host: its connection `B`, its bounds those of its configuration,
/// read again every [`RELEARN_SAMPLES`] samples without waiting for the read (skipped
/// while another read is under way). A configuration that now hands the VM to PVE's auto-ballooning ends the
/// connection (the next is refused, and retried, as at the start); one that cannot be
/// read leaves the bounds last read.
pub struct PveVm<B> {
    vm: B,
    configs: Arc<PveConfigs>,
    socket: PathBuf,
    memory: PveMemory,
    relearn: Relearn,
    reading: Option<JoinHandle<Result<PveMemory, BackendError>>>,
}

impl<B> PveVm<B> {
    /// `vm`, reached through `socket`, whose configuration read `memory` at connection.
    /// VMs connected together read their configurations again at samples apart.
    pub fn new(vm: B, configs: Arc<PveConfigs>, socket: &Path, memory: PveMemory) -> Self {
        let spread = socket.as_os_str().as_encoded_bytes().iter();
        let spread = spread.fold(0u32, |n, b| n.wrapping_mul(31).wrapping_add(u32::from(*b)));
        PveVm {
            vm,
            configs,
            socket: socket.to_path_buf(),
            memory,
            relearn: Relearn::after(spread % RELEARN_SAMPLES + 1),
            reading: None,
        }
    }

    /// Take in a reading of the configuration that has ended, or start one when due.
    async fn follow(&mut self) -> Result<(), BackendError> {
        match self.reading.take_if(|r| r.is_finished()) {
            Some(read) => match read.await.map_err(|e| BackendError::Io(e.to_string()))? {
                Ok(m) => self.memory = m,
                Err(e @ BackendError::LeftAlone(_)) => {
                    return Err(BackendError::Disconnected(e.to_string()))
                }
                Err(e) => tracing::warn!("{e}; the bounds last read are kept"),
            },
            None if self.reading.is_none() && self.relearn.due() => {
                self.reading = self.configs.reread(&self.socket);
            }
            None => {}
        }
        Ok(())
    }
}

#[async_trait]
impl<B: VmBackend> VmBackend for PveVm<B> {
    async fn sample(&mut self) -> Result<VmSample, BackendError> {
        self.follow().await?;
        self.vm.sample().await
    }

    async fn set_balloon(&mut self, target: Bytes) -> Result<(), BackendError> {
        self.vm.set_balloon(target).await
    }

    fn target(&self) -> Option<Bytes> {
        self.vm.target()
    }

    fn pid(&self) -> Option<i32> {
        self.vm.pid()
    }

    fn resumed_at_connection(&mut self) -> Option<String> {
        self.vm.resumed_at_connection()
    }

    /// `balloon` and `memory` as last read: `qm set` holds within 60 samples (two
    /// minutes at the default interval).
    fn bounds(&self) -> Option<(Option<Bytes>, Option<Bytes>)> {
        Some((Some(self.memory.min), Some(self.memory.memory)))
    }

    async fn save(
        &mut self,
        dir: &Path,
        then: AfterSave,
        limit: Duration,
        seal: Seal,
    ) -> Result<Saved, BackendError> {
        self.vm.save(dir, then, limit, seal).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memtide_core::backend::VmBackend;

    fn configs(dir: &Path) -> Arc<PveConfigs> {
        Arc::new(PveConfigs::new(dir, Duration::from_millis(200)))
    }

    #[tokio::test]
    async fn a_proxmox_vm_takes_its_bounds_from_its_configuration_unless_pve_auto_balloons_it() {
        let dir = tempfile::tempdir().unwrap();
        let configs = configs(dir.path());
        let conf = "memory: 2048\nballoon: 512\nshares: 0\nname: db\n";
        std::fs::write(dir.path().join("101.conf"), conf).unwrap();
        std::fs::write(dir.path().join("102.conf"), "memory: 2G\n").unwrap();
        let m = configs.read(Path::new("/run/memtide/qmp/101.sock")).await;
        let m = m.unwrap();
        assert_eq!(
            (m.memory, m.min, m.shares),
            (Bytes::from_mib(2048), Bytes::from_mib(512), None)
        );
        // Shares, but nothing to shrink: PVE leaves it at its size.
        let conf = "memory: 2048\nshares: 300\n";
        std::fs::write(dir.path().join("104.conf"), conf).unwrap();
        let m = configs.read(Path::new("/q/104.sock")).await.unwrap();
        assert_eq!((m.min, m.shares), (Bytes::from_mib(2048), Some(300)));
        // PVE's auto-ballooning moves it (shares unset: PVE's default 1000).
        std::fs::write(dir.path().join("105.conf"), "memory: 2048\nballoon: 512\n").unwrap();
        let refused = configs.read(Path::new("/q/105.sock")).await;
        assert_eq!(
            refused.unwrap_err().to_string(),
            "left alone: Proxmox VE's auto-ballooning (pvestatd) moves its balloon (balloon \
             512 MiB below memory 2.0 GiB, shares 1000): `qm set 105 --shares 0` leaves it to \
             memtide"
        );
        let missing = configs.read(Path::new("/run/memtide/qmp/103.sock")).await;
        let missing = missing.unwrap_err().to_string();
        assert!(
            missing.contains("Proxmox VE configuration") && missing.contains("103.conf"),
            "{missing}"
        );
        let bad = configs.read(Path::new("/q/102.sock")).await;
        let bad = bad.unwrap_err().to_string();
        assert!(bad.ends_with("102.conf: bad memory: \"2G\""), "{bad}");
    }

    #[tokio::test]
    async fn a_hung_proxmox_configuration_is_read_by_one_thread_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        // A configuration whose read blocks until something writes it, as a hung pmxcfs.
        let conf = dir.path().join("101.conf");
        rustix::fs::mkfifoat(rustix::fs::CWD, &conf, 0o600.into()).unwrap();
        let configs = Arc::new(PveConfigs::new(dir.path(), Duration::from_millis(100)));
        let socket = Path::new("/run/memtide/qmp/101.sock");
        for _ in 0..3 {
            let e = configs.read(socket).await.unwrap_err();
            assert!(matches!(e, BackendError::Timeout(_)), "{e}");
        }
        assert_eq!(
            configs.reads.available_permits(),
            0,
            "the first read still holds its thread; the others took none"
        );
        assert!(
            configs.reread(socket).is_none(),
            "a read again does not queue"
        );
        // pmxcfs answers: the read under way ends, and the next read may start.
        std::fs::write(&conf, "memory: 2048\n").unwrap();
        for _ in 0..200 {
            if configs.reads.available_permits() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(configs.reads.available_permits(), 1);
    }

    /// A VM that samples as the test kit's 1000 MiB guest.
    struct Sampled;

    #[async_trait]
    impl VmBackend for Sampled {
        async fn sample(&mut self) -> Result<VmSample, BackendError> {
            memtide_core::testkit::vm("101", 1000, 800, 600).sample
        }
        async fn set_balloon(&mut self, _: Bytes) -> Result<(), BackendError> {
            Ok(())
        }
        fn target(&self) -> Option<Bytes> {
            None
        }
    }

    /// Sample `vm` until its bounds are `want` or its sample fails (a read of the
    /// configuration ends in the background).
    async fn sample_until(
        vm: &mut PveVm<Sampled>,
        want: (u64, u64),
    ) -> Result<(Option<Bytes>, Option<Bytes>), BackendError> {
        let want = (Some(Bytes::from_mib(want.0)), Some(Bytes::from_mib(want.1)));
        for _ in 0..1000 {
            vm.sample().await?;
            if vm.bounds() == Some(want) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(vm.bounds().unwrap())
    }

    #[tokio::test]
    async fn bounds_set_with_qm_set_hold_while_the_vm_runs() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("101.conf");
        std::fs::write(&conf, "memory: 2048\nballoon: 512\nshares: 0\n").unwrap();
        let configs = configs(dir.path());
        let socket = Path::new("/run/memtide/qmp/101.sock");
        let at_start = configs.read(socket).await.unwrap();
        let mut vm = PveVm::new(Sampled, configs, socket, at_start);
        let mib = |n| Some(Bytes::from_mib(n));
        assert_eq!(vm.bounds(), Some((mib(512), mib(2048))));
        // `qm set 101 --balloon 1024`: read again within the relearn samples.
        std::fs::write(&conf, "memory: 2048\nballoon: 1024\nshares: 0\n").unwrap();
        let now = sample_until(&mut vm, (1024, 2048)).await.unwrap();
        assert_eq!(now, (mib(1024), mib(2048)));
        // A configuration that does not read: the bounds last read stand.
        std::fs::write(&conf, "memory: lots\n").unwrap();
        let kept = sample_until(&mut vm, (0, 0)).await.unwrap();
        assert_eq!(kept, (mib(1024), mib(2048)));
        // Handed to PVE's auto-ballooning (`qm set 101 --shares 1000`): let go.
        std::fs::write(&conf, "memory: 2048\nballoon: 1024\nshares: 1000\n").unwrap();
        let e = sample_until(&mut vm, (0, 0)).await.unwrap_err();
        assert!(
            matches!(&e, BackendError::Disconnected(why) if why.contains("auto-ballooning")),
            "{e}"
        );
    }
}
