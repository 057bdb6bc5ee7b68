//! A VM's life through the snapshot store, as the daemon runs it: saves (asked for,
//! scheduled, hibernations), scheduled wakes, crash recovery after a QEMU died, and the
//! hibernated VMs the status shows. The decisions are `memtide-core`'s (`hibernate`,
//! `wake`, `recovery`); the store is [`crate::snapshots`].

use super::vm_task::{SaveJob, SAVE_GRACE};
use super::{Daemon, TIERS_EVERY};
use crate::control::Request;
use crate::snapshots::{self, Store, TakenBy};
use crate::status::Hibernated;
use memtide_core::backend::{AfterSave, Seal};
use memtide_core::hibernate;
use memtide_core::recovery::{Gone, Room, Verdict};
use memtide_core::{BackendError, Bytes, Decision, Snapshot, VmEvent};
use std::collections::HashSet;
use std::time::{Duration, SystemTime};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// Where a VM's task hands over a save's result.
pub(super) type SaveReply = oneshot::Receiver<Result<memtide_core::backend::Saved, BackendError>>;
/// Where a save's seal hands over the snapshot it made whole, or why it could not.
pub(super) type SealReply = oneshot::Receiver<Result<snapshots::Snapshot, String>>;

/// A save that ended, and who waits for its outcome.
pub(super) struct SaveDone {
    vm: String,
    result: Result<snapshots::Snapshot, String>,
    /// A scheduled save's older snapshots deleted beyond its `snapshot_keep` (that many
    /// kept), or why not.
    pruned: Option<(usize, Result<Vec<snapshots::Snapshot>, String>)>,
    reply: oneshot::Sender<Result<serde_json::Value, String>>,
}

/// Crash recovery's (`[[vm]] restore_on_crash`) and scheduled wakes' (`wake_at`)
/// steps run off the loop.
pub(super) enum Restoring {
    /// How VM `vm`'s QEMU went, and its configured memory (its newest snapshot's).
    Judged { vm: String, gone: Gone, size: Bytes },
    /// A restore ended: what was done, or why it failed.
    Restored {
        vm: String,
        result: Result<crate::snapshot_cmd::Started, String>,
    },
}

/// How often systemd is asked to wait longer for the stop while saves end.
const STOP_EXTEND_EVERY: Duration = Duration::from_secs(10);

/// How long past the longest a save's task takes the daemon waits for its outcome at
/// stop: its seal's end, and pruning the VM's older snapshots.
const STOP_MARGIN: Duration = Duration::from_secs(30);

/// Answer a control request that comes while memtide stops: nothing new is begun.
pub(super) fn refuse_while_stopping(request: Request) {
    let why = crate::control::STOPPING;
    match request {
        Request::Reload(reply) => drop(reply.send(Err(why.into()))),
        Request::Save { reply, .. } => drop(reply.send(Err(why.into()))),
        Request::Connect(_) => {}
    }
}

/// How long a QEMU whose connection closed is given to be gone before it counts as
/// running: its process ends just after its sockets close.
pub(super) const EXIT_GRACE: Duration = Duration::from_secs(2);

impl Daemon {
    /// Start saving VM `vm`'s memory into the store; `reply` takes the outcome when the
    /// save ends ([`Daemon::saved`]), or at once why it cannot start (logged either way,
    /// but for a name that is no VM's: no event of a VM that does not exist).
    pub(super) fn save(
        &mut self,
        vm: String,
        then: AfterSave,
        by: TakenBy,
        reply: oneshot::Sender<Result<serde_json::Value, String>>,
    ) {
        let known = self.fleet.process(&vm).is_some()
            || self.config.vms.iter().any(|v| v.name == vm)
            || self.fleet.waiting().iter().any(|w| w.name == vm);
        if !known {
            let why = format!("no VM named {vm:?} (memtide status lists the VMs)");
            return drop(reply.send(Err(why)));
        }
        let (saved, sealed) = match self.start_save(&vm, then, by) {
            Ok(started) => started,
            Err(why) => {
                let message = format!("not saved: {why}");
                self.events.log("snapshot_failed", Some(&vm), None, message);
                self.counters.action("snapshot", "error");
                return drop(reply.send(Err(why)));
            }
        };
        let (done, store) = (self.saves.clone(), self.store.clone());
        let keep = match by {
            TakenBy::Schedule => self.config.vms.iter().find(|v| v.name == vm),
            _ => None,
        }
        .map(|v| v.snapshot_keep);
        tokio::spawn(async move {
            let result = match saved.await {
                // The seal's outcome: the snapshot made whole, or why not.
                Ok(Ok(_)) => sealed
                    .await
                    .unwrap_or_else(|_| Err("the snapshot was not made whole".into())),
                // Failed, or its task ended: a seal begun runs to its end, and is waited
                // for (the VM's next save would remove what it is still sealing).
                failed => {
                    let e = match failed {
                        Ok(Err(e)) => e.to_string(),
                        _ => "the VM was lost before its save ended".into(),
                    };
                    let sealed = sealed.await.ok().and_then(Result::ok);
                    let store = store.clone();
                    let ran_on = move || failed_after_seal(&store, sealed, e);
                    Err(tokio::task::spawn_blocking(ran_on)
                        .await
                        .unwrap_or_else(|e| e.to_string()))
                }
            };
            // Deleting snapshots (GiBs of files) is the blocking pool's work, not the loop's.
            let pruned = match keep {
                Some(keep) if result.is_ok() => {
                    let name = vm.clone();
                    let prune = move || store.prune(&name, keep).map_err(|e| format!("{e:#}"));
                    let pruned = tokio::task::spawn_blocking(prune).await;
                    Some((keep, pruned.unwrap_or_else(|e| Err(e.to_string()))))
                }
                _ => None,
            };
            let done_save = SaveDone {
                vm,
                result,
                pruned,
                reply,
            };
            let _ = done.send(done_save).await;
        });
    }

    /// The snapshot begun for VM `vm` and the save handed to its task, or why not: where
    /// the save's result and the seal's (the snapshot made whole) will come.
    fn start_save(
        &mut self,
        vm: &str,
        then: AfterSave,
        by: TakenBy,
    ) -> Result<(SaveReply, SealReply), String> {
        if self.options.dry_run {
            return Err("a dry run changes nothing".into());
        }
        // One save of a VM at a time, from its start to its snapshot made whole: a
        // second one would remove the first's files as half-written.
        if self.saving.contains_key(vm) {
            return Err(format!("VM {vm} is being saved already"));
        }
        let Some(configured) = self.fleet.configured(vm) else {
            return Err(format!("VM {vm} is not connected, or not sampled yet"));
        };
        if then == AfterSave::Quit {
            if let Some(why) = crate::snapshot_cmd::cannot_restore(&self.config, vm) {
                return Err(format!(
                    "not hibernated, since memtide could not wake it: {why} (save it without \
                     --hibernate, or give it such an entry)"
                ));
            }
        }
        let pending = self
            .store
            .begin(vm, configured)
            .map_err(|e| format!("{e:#}"))?;
        let (tx, saved) = oneshot::channel();
        let (sealed_tx, sealed) = oneshot::channel();
        let dir = pending.dir().to_path_buf();
        // The seal's outcome is sent from its blocking task, which runs to its end even
        // where the save's task is given up on meanwhile: whoever waits for the save then
        // still learns whether its snapshot stands (a hibernation sealed but not ended is
        // marked woken, `failed_after_seal`).
        let seal: Seal = Box::new(move |saved| {
            Box::pin(async move {
                let finish = move || {
                    let result = pending
                        .finish(&saved, then, by)
                        .map_err(|e| format!("{e:#}"));
                    let outcome = result.as_ref().map(drop).map_err(Clone::clone);
                    let _ = sealed_tx.send(result);
                    outcome
                };
                tokio::task::spawn_blocking(finish)
                    .await
                    .unwrap_or_else(|e| Err(e.to_string()))
            })
        });
        let job = SaveJob {
            dir: dir.clone(),
            then,
            limit: Duration::from_secs(self.config.snapshots.timeout_s),
            seal,
            reply: tx,
        };
        // An operator's save starts at once; one the tick decided (hibernation, a
        // schedule) waits for the next sample, so that it does not overlap the passes
        // (reclaim, huge pages, placement) this tick has just started over the VM.
        let at_once = by == TakenBy::Operator;
        self.fleet.save(vm, job, at_once).map_err(|(_, why)| why)?;
        self.saving.insert(vm.to_string(), then);
        let message = match then {
            AfterSave::Run => format!("saving its memory into {}", dir.display()),
            AfterSave::Quit => format!(
                "hibernating: saving its memory into {}, then its hypervisor process quits",
                dir.display()
            ),
        };
        self.events.log("snapshot_started", Some(vm), None, message);
        Ok((saved, sealed))
    }

    /// Hibernate the VM that is due, if one is (`memtide_core::hibernate`: idle past its
    /// `hibernate_after_s` while the host is short); not in a dry run.
    pub(super) fn hibernate_idle(&mut self, snapshot: &Snapshot, decision: &Decision) {
        for vm in &snapshot.vms {
            let events = vm.sample.as_ref().map(|s| s.events.as_slice());
            if events.is_ok_and(|e| e.contains(&VmEvent::Saved)) {
                self.idleness.saved(&vm.name);
            }
        }
        let cpu = snapshot.vms.iter().map(|vm| {
            let cpu_s = vm.sample.as_ref().ok().and_then(|s| s.cpu_s);
            (vm.name.as_str(), cpu_s)
        });
        self.idleness
            .observe(snapshot.at, cpu, &self.config.hibernate);
        let running = self.saving.values().any(|then| *then == AfterSave::Quit);
        let settle = Duration::from_secs_f64(self.config.interval_s)
            * u32::try_from(self.config.engine.history_len).unwrap_or(u32::MAX);
        if !self.pace.allows(snapshot.at, running, settle) {
            return;
        }
        let allowed: Vec<(String, Duration, Bytes)> = self
            .config
            .vms
            .iter()
            .filter(|vm| !self.saving.contains_key(&vm.name))
            .filter_map(|vm| {
                let after = Duration::from_secs(vm.hibernate_after_s?);
                let report = decision.vms.iter().find(|r| r.name == vm.name)?;
                let held = report.rss.or(report.actual).unwrap_or_default();
                Some((vm.name.clone(), after, held))
            })
            .collect();
        if allowed.is_empty() || self.options.dry_run {
            return;
        }
        let free = decision.host.free_ratio_avg;
        let Some(due) = hibernate::due(&self.idleness, &allowed, free, &self.config.hibernate)
        else {
            return;
        };
        self.idleness.restart(&due.vm);
        self.events
            .log("hibernate", Some(&due.vm), None, due.reason);
        // Nobody waits for the outcome: it is logged as any save's.
        let (reply, _) = oneshot::channel();
        self.save(due.vm.clone(), AfterSave::Quit, TakenBy::Hibernation, reply);
        if self.saving.contains_key(&due.vm) {
            self.pace.begun();
        }
    }

    /// Start a snapshot due by its VM's `snapshot_every_s` (the first one period after
    /// its newest scheduled snapshot, or after it is first seen connected where it has
    /// none); not in a dry run. One at a time, and none while another save runs: VMs
    /// due together (a schedule shared, or overdue after the daemon was down) take
    /// turns, the longest overdue first, rather than stop their guests and write to the
    /// disk all at once.
    pub(super) fn snapshot_on_schedule(&mut self) {
        if self.options.dry_run {
            return;
        }
        let now = Instant::now();
        let scheduled: Vec<(String, Duration)> = self
            .config
            .vms
            .iter()
            .filter_map(|vm| Some((vm.name.clone(), Duration::from_secs(vm.snapshot_every_s?))))
            .collect();
        let mut first: Option<(Instant, String, Duration)> = None;
        for (vm, every) in scheduled {
            if self.fleet.configured(&vm).is_none() {
                continue;
            }
            let store = &self.store;
            let next = *(self.next_snapshot.entry(vm.clone()))
                .or_insert_with(|| first_scheduled_at(store, &vm, every, now));
            if next <= now && first.as_ref().is_none_or(|(due, ..)| next < *due) {
                first = Some((next, vm, every));
            }
        }
        let Some((_, vm, every)) = first.filter(|_| self.saving.is_empty()) else {
            return;
        };
        self.next_snapshot.insert(vm.clone(), now + every);
        let (reply, _) = oneshot::channel();
        self.save(vm, AfterSave::Run, TakenBy::Schedule, reply);
    }

    /// VM `vm` was lost. Off the loop, its process (`pid`, and its start time where known:
    /// another process that took the pid is not it) is given [`EXIT_GRACE`] to be gone
    /// (reaped if it is the daemon's own child: a QEMU a restore or a wake started);
    /// then, if the VM opted in to crash recovery and this is no dry run, how it went
    /// (`shut_down`: it announced it; its process still runs; a hibernation not woken from
    /// in the store) goes to [`Daemon::recover`] to decide.
    pub(super) fn lost(&mut self, vm: &str, shut_down: bool, pid: Option<(u32, Option<u64>)>) {
        let opted_in = self
            .config
            .vms
            .iter()
            .any(|v| v.name == vm && v.restore_on_crash);
        let judge = opted_in && !self.options.dry_run;
        if !judge && pid.is_none() {
            return;
        }
        let (vm, store, tx) = (vm.to_string(), self.store.clone(), self.restoring.clone());
        let proc = self.config.host.proc.clone();
        tokio::spawn(async move {
            let runs = |(pid, started): (u32, Option<u64>)| {
                memtide_adapters::procfs::process_runs_as(&proc, pid, started)
            };
            let gone_by = Instant::now() + EXIT_GRACE;
            let mut alive = pid.is_some_and(runs);
            while alive && Instant::now() < gone_by {
                tokio::time::sleep(Duration::from_millis(50)).await;
                alive = pid.is_some_and(runs);
            }
            if !judge {
                return;
            }
            // Hibernated: its newest snapshot is a hibernation not woken from.
            let name = vm.clone();
            let newest = tokio::task::spawn_blocking(move || store.list(&name))
                .await
                .ok()
                .and_then(Result::ok)
                .and_then(|mut list| list.pop());
            let asleep = newest.as_ref().is_some_and(snapshots::Snapshot::asleep);
            let size = newest.map_or(Bytes::ZERO, |s| s.configured);
            // A hibernation ends with its QEMU's quit, which announces a shutdown: said
            // as the hibernation it is.
            let gone = match () {
                _ if asleep => Gone::Hibernated,
                _ if shut_down => Gone::ShutDown,
                _ if alive => Gone::ProcessAlive,
                _ => Gone::Died,
            };
            let _ = tx.send(Restoring::Judged { vm, gone, size }).await;
        });
    }

    /// Wake the hibernated VMs whose `wake_at` time has come since they were hibernated
    /// (`memtide_core::wake`), each as `memtide snapshot restore` would, its outcome
    /// logged as a restore's; not in a dry run. Only VMs not connected, whose newest
    /// snapshot is a hibernation not woken from, and not being restored are looked at.
    pub(super) fn wake_on_schedule(&mut self) {
        if self.options.dry_run {
            return;
        }
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let scheduled: Vec<(String, Vec<memtide_core::wake::TimeOfDay>)> = self
            .config
            .vms
            .iter()
            .filter(|vm| {
                !vm.wake_at.is_empty()
                    && self.fleet.configured(&vm.name).is_none()
                    && !self.restores.contains(&vm.name)
            })
            .map(|vm| (vm.name.clone(), vm.wake_at.clone()))
            .collect();
        for (vm, times) in scheduled {
            let Some(asleep) = self.asleep.iter().find(|s| s.vm == vm).cloned() else {
                continue;
            };
            let Some(since) = humantime::parse_rfc3339(&asleep.created)
                .ok()
                .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            else {
                continue;
            };
            let Some(due) = memtide_core::wake::due(&times, since.as_secs(), now) else {
                continue;
            };
            if self.woken_for.get(&vm).is_some_and(|at| *at >= due) {
                continue;
            }
            self.woken_for.insert(vm.clone(), due);
            let when = humantime::format_rfc3339_seconds(
                SystemTime::UNIX_EPOCH + Duration::from_secs(due),
            );
            let message = format!(
                "woken on schedule ({when}, `wake_at`): restoring its hibernation {}",
                asleep.id
            );
            self.events.log("wake", Some(&vm), None, message);
            self.restores.insert(vm.clone());
            let (config, tx) = (self.config.clone(), self.restoring.clone());
            tokio::spawn(async move {
                let restore = crate::snapshot_cmd::restore(&config, &vm, Some(&asleep.id), false);
                let result = restore.await.map_err(|e| format!("{e:#}"));
                let _ = tx.send(Restoring::Restored { vm, result }).await;
            });
        }
    }

    /// A step of crash recovery: a lost VM judged (restored from its newest good
    /// snapshot, left, or given up on: `memtide_core::recovery`); or a restore (after a
    /// crash, or a scheduled wake) ended. Each logged and counted
    /// (`memtide_actions_total{kind="restore"}`).
    pub(super) fn recover(&mut self, step: Restoring) {
        match step {
            Restoring::Judged { vm, gone, size } => self.judge(vm, gone, size),
            Restoring::Restored { vm, result } => {
                self.restores.remove(&vm);
                self.recount_hibernated = true;
                match result {
                    Ok(started) => {
                        self.counters.action("restore", "ok");
                        self.fleet.reconnect_now(&vm);
                        self.events.log("restored", Some(&vm), None, started.line);
                        if let Some(why) = started.unmarked {
                            self.events.log("snapshot_failed", Some(&vm), None, why);
                        }
                    }
                    Err(e) => {
                        self.counters.action("restore", "error");
                        let message = format!("not restored: {e}");
                        self.events.log("restore_failed", Some(&vm), None, message);
                    }
                }
            }
        }
    }

    /// Decide about VM `vm`, gone as `gone`, of `size`, with the room the host had at
    /// the last tick, and carry it out: a restore that must wait for room is tried
    /// again each tick (its event logged once).
    fn judge(&mut self, vm: String, gone: Gone, size: Bytes) {
        if self.restores.contains(&vm) {
            self.waiting.remove(&vm);
            let why = "not restored again: a restore of it is under way".to_string();
            self.events.log("restore_skipped", Some(&vm), None, why);
            return;
        }
        let (at, cfg) = (self.start.elapsed(), &self.config.recovery);
        let room = Room { size, ..self.room };
        match self.recovery.decide(&vm, gone, at, room, cfg) {
            Verdict::Leave(why) => self.events.log("restore_skipped", Some(&vm), None, why),
            Verdict::GiveUp(why) => {
                self.waiting.remove(&vm);
                self.counters.action("restore", "given_up");
                self.events.log("restore_given_up", Some(&vm), None, why);
            }
            Verdict::Wait(why) => {
                if self.waiting.insert(vm.clone(), size).is_none() {
                    self.events.log("restore_waiting", Some(&vm), None, why);
                }
            }
            Verdict::Restore => {
                self.waiting.remove(&vm);
                let message = "its QEMU died without shutting down: restoring it from its \
                               newest good snapshot";
                self.events
                    .log("restore_started", Some(&vm), None, message.into());
                self.restores.insert(vm.clone());
                let (config, tx) = (self.config.clone(), self.restoring.clone());
                tokio::spawn(async move {
                    let result = crate::snapshot_cmd::recover(&config, &vm).await;
                    let result = result.map_err(|e| format!("{e:#}"));
                    let _ = tx.send(Restoring::Restored { vm, result }).await;
                });
            }
        }
    }

    /// Try again the restores waiting for room, with the host's room at this tick;
    /// one whose VM came back meanwhile waits no more.
    pub(super) fn restore_waiting(&mut self, host: &memtide_core::decision::HostReport) {
        self.room = Room {
            total: host.total,
            freeable: host.freeable,
            size: Bytes::ZERO,
        };
        let waiting: Vec<(String, Bytes)> = self.waiting.drain().collect();
        for (vm, size) in waiting {
            if self.fleet.configured(&vm).is_none() {
                // Still waiting: kept so that its event is not logged again.
                self.waiting.insert(vm.clone(), size);
                self.judge(vm, Gone::Died, size);
            }
        }
    }

    /// Log the scheduled snapshots of VM `vm` deleted beyond the `keep` newest, each.
    fn pruned(&mut self, vm: &str, keep: usize, pruned: Result<Vec<snapshots::Snapshot>, String>) {
        match pruned {
            Ok(deleted) => {
                for s in deleted {
                    let message = format!("scheduled snapshot {} deleted: {keep} newer kept", s.id);
                    self.events.log("snapshot_deleted", Some(vm), None, message);
                }
            }
            Err(e) => {
                let message = format!("old scheduled snapshots not deleted: {e}");
                self.events.log("snapshot_failed", Some(vm), None, message);
            }
        }
    }

    /// At stop, end the saves and restores under way before the daemon ends: a save cut
    /// short would leave its guest paused (Firecracker, Cloud Hypervisor) or its libvirt
    /// domain shut off, its memory in a snapshot never made whole, and a restore (a crash
    /// recovery, a scheduled wake) its guest paused before it runs. Saves still waiting for
    /// a sample are given up, and no restore is begun; those running are waited for — a
    /// save's task gives it up [`SAVE_GRACE`] past `[snapshots] timeout_s`, a restore's
    /// migration is bounded by it, and the wait ends [`STOP_MARGIN`] after that (a restore
    /// still verifying its snapshot then is cut short) — systemd told to extend its
    /// stop timeout meanwhile. The control socket's requests are answered that memtide
    /// stops; `stop` (a second SIGTERM or SIGINT) ends the wait at once. Returns whether
    /// it was ended so.
    pub(super) async fn finish_under_way(
        &mut self,
        saved: &mut mpsc::Receiver<SaveDone>,
        restored: &mut mpsc::Receiver<Restoring>,
        incoming: &mut mpsc::Receiver<Request>,
        stop: impl std::future::Future<Output = ()>,
    ) -> bool {
        self.fleet.give_up_queued_saves();
        if self.under_way().is_empty() {
            return false;
        }
        let limit = Duration::from_secs(self.config.snapshots.timeout_s) + SAVE_GRACE + STOP_MARGIN;
        let deadline = Instant::now() + limit;
        tracing::warn!(
            "stopping once the saves and restores under way end (at most {} s; a second \
             SIGTERM or SIGINT stops at once): {}",
            limit.as_secs(),
            self.under_way()
        );
        let mut extend = tokio::time::interval(STOP_EXTEND_EVERY);
        tokio::pin!(stop);
        while !self.under_way().is_empty() {
            tokio::select! {
                Some(done) = saved.recv() => self.saved(done),
                Some(step) = restored.recv() => match step {
                    Restoring::Restored { .. } => self.recover(step),
                    Restoring::Judged { vm, .. } => {
                        let why = "not restored: memtide is stopping".to_string();
                        self.events.log("restore_skipped", Some(&vm), None, why);
                    }
                },
                Some(request) = incoming.recv() => refuse_while_stopping(request),
                _ = extend.tick() => {
                    let usec = (STOP_EXTEND_EVERY * 3).as_micros();
                    super::notify(sd_notify::NotifyState::ExtendTimeoutUsec(
                        u32::try_from(usec).unwrap_or(u32::MAX),
                    ));
                }
                _ = tokio::time::sleep_until(deadline) => {
                    tracing::error!(
                        "stopping with saves or restores still under way after {} s: {}",
                        limit.as_secs(),
                        self.under_way()
                    );
                    return false;
                }
                _ = &mut stop => {
                    tracing::warn!(
                        "stopping at once, with saves or restores under way (what a save \
                         wrote is left in its ID.partial directory): {}",
                        self.under_way()
                    );
                    self.store.leave_unfinished();
                    return true;
                }
            }
        }
        false
    }

    /// The VMs being saved or restored, for a log line; empty where none is.
    fn under_way(&self) -> String {
        let mut names: Vec<&str> = self.saving.keys().map(String::as_str).collect();
        names.extend(self.restores.iter().map(String::as_str));
        names.join(", ")
    }

    /// Log and count a save that ended, and answer whoever asked for it.
    pub(super) fn saved(&mut self, done: SaveDone) {
        let SaveDone {
            vm,
            result,
            pruned,
            reply,
        } = done;
        self.saving.remove(&vm);
        self.recount_hibernated |= result.as_ref().is_ok_and(snapshots::Snapshot::asleep);
        match &result {
            Ok(s) => {
                let message = s.summary();
                self.events.log("snapshot_saved", Some(&vm), None, message);
                self.counters.action("snapshot", "ok");
            }
            Err(e) => {
                let message = format!("not saved: {e}");
                self.events.log("snapshot_failed", Some(&vm), None, message);
                self.counters.action("snapshot", "error");
            }
        }
        if let Some((keep, pruned)) = pruned {
            self.pruned(&vm, keep, pruned);
        }
        let reply_value = result.map(|s| serde_json::to_value(s).expect("a snapshot serializes"));
        let _ = reply.send(reply_value);
    }

    /// Read the hibernated VMs from the store again where they may have changed, and
    /// every [`TIERS_EVERY`] ticks (an unreadable store shows none, with a warning).
    pub(super) fn reread_asleep(&mut self) {
        let due = std::mem::take(&mut self.recount_hibernated)
            | self.counters.ticks.is_multiple_of(TIERS_EVERY);
        if due {
            self.asleep = self.store.asleep().unwrap_or_else(|e| {
                tracing::warn!("snapshot store: {e:#}");
                Vec::new()
            });
        }
    }

    /// The VMs hibernated and not woken yet, as last read from the store.
    pub(super) fn hibernated(&self) -> Vec<Hibernated> {
        self.asleep
            .iter()
            .map(|s| Hibernated {
                vm: s.vm.clone(),
                id: s.id.clone(),
                since: s.created.clone(),
                configured: s.configured,
            })
            .collect()
    }

    /// VMs whose hypervisor reports them reset or restored while their connection lasted
    /// run, as a (re)connected VM does: their hibernations are marked woken and the
    /// hibernated VMs read again, rather than listed asleep until the next periodic read.
    /// libvirt reports a domain restored from its hibernation (by hand, or by `memtide
    /// snapshot restore`) before its connection noticed it stop as restored.
    pub(super) fn started_again(&mut self, snapshot: &Snapshot) {
        for (vm, marked) in woken_by_reset(&self.store, snapshot, &self.restores) {
            // Read again if one was asleep: marked now, or by the restore that started it.
            let listed = self.asleep.iter().any(|s| s.vm == vm);
            self.recount_hibernated |= listed || marked.as_ref().is_ok_and(|m| !m.is_empty());
            self.log_woken(&vm, marked);
        }
    }

    /// VM `vm` runs, and memtide is not restoring it: a hibernation of it not woken
    /// from is not its memory any more (it was started afresh, or restored by hand), so
    /// it is marked woken, each logged, and neither a wake nor a restore without
    /// `--force` brings it back over the guest's disk.
    pub(super) fn running_on(&mut self, vm: &str) {
        let marked = self.store.mark_all_woken(vm);
        self.log_woken(vm, marked);
    }

    /// Log what marking VM `vm`'s hibernations woken did: `snapshot_woken` for each one
    /// marked, or `snapshot_failed`.
    fn log_woken(&mut self, vm: &str, marked: anyhow::Result<Vec<snapshots::Snapshot>>) {
        match marked {
            Ok(marked) => {
                for s in marked {
                    let message = format!(
                        "it runs: its hibernation {} is marked woken (no longer woken from)",
                        s.id
                    );
                    self.events.log("snapshot_woken", Some(vm), None, message);
                }
            }
            Err(e) => {
                let message = format!(
                    "it runs, but its hibernations could not be marked woken ({e:#}): do not \
                     restore them while the guest runs"
                );
                self.events.log("snapshot_failed", Some(vm), None, message);
            }
        }
    }
}

/// When VM `vm`'s first scheduled snapshot of this daemon is due, from `now`: `every`
/// after its newest scheduled snapshot in `store`, so that restarting the daemon does
/// not put the schedule off (where that is past, it is overdue by as much, and the
/// longest overdue go first); `every` after now where it has none, or the store cannot be
/// read (with a warning).
fn first_scheduled_at(store: &Store, vm: &str, every: Duration, now: Instant) -> Instant {
    let newest = match store.list(vm) {
        Ok(taken) => taken.into_iter().rev().find(|s| s.by == TakenBy::Schedule),
        Err(e) => {
            tracing::warn!("snapshot store: {e:#}: VM {vm}'s schedule starts afresh");
            None
        }
    };
    match newest.as_ref().and_then(snapshots::age) {
        None => now + every,
        Some(since) if since <= every => now + (every - since),
        Some(since) => now.checked_sub(since - every).unwrap_or(now),
    }
}

/// Why a save failed, for a save whose backend failed with `e` after `sealed` (if its
/// snapshot was sealed): a hibernation sealed whose VMM did not quit and still runs (one
/// that ended all the same is a hibernation that succeeded) has its snapshot marked
/// woken, and no restore without --force brings back memory the guest may have moved on
/// from; a snapshot of a guest that ran on stands, and is named.
fn failed_after_seal(store: &Store, sealed: Option<snapshots::Snapshot>, e: String) -> String {
    match sealed {
        Some(s) if s.then == AfterSave::Run => {
            format!("{e}; its snapshot {} was made whole all the same", s.id)
        }
        Some(s) if s.asleep() => match store.mark_woken(&s) {
            Ok(()) => format!(
                "{e}; its snapshot is marked woken (to go back to it, stop the VM and restore \
                 it with --force, only if the guest has not run since)"
            ),
            Err(w) => format!(
                "{e}; and its snapshot could not be marked woken ({w:#}): do not restore it \
                 while the guest runs"
            ),
        },
        _ => e,
    }
}

/// The VMs of `snapshot` whose hypervisor reported them reset or restored since their
/// previous sample, but for those memtide is restoring (`restoring`), each with its hibernations
/// not woken from marked woken in `store` (those marked, or why they could not be).
fn woken_by_reset(
    store: &Store,
    snapshot: &Snapshot,
    restoring: &HashSet<String>,
) -> Vec<(String, anyhow::Result<Vec<snapshots::Snapshot>>)> {
    snapshot
        .vms
        .iter()
        .filter(|vm| {
            let events = vm.sample.as_ref().map(|s| s.events.as_slice());
            events.is_ok_and(|e| e.contains(&VmEvent::Reset) || e.contains(&VmEvent::Restored))
        })
        .filter(|vm| !restoring.contains(&vm.name))
        .map(|vm| (vm.name.clone(), store.mark_all_woken(&vm.name)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use memtide_core::testkit::{host, snapshot, vm};

    /// A snapshot of VM `vm` sealed in `store`, its guest then left as `then`.
    fn stored(store: &Store, vm: &str, then: AfterSave, by: TakenBy) -> snapshots::Snapshot {
        let saved = memtide_core::backend::Saved {
            mechanism: "test".into(),
            was_running: true,
            downtime: Duration::from_secs(1),
            written: Duration::from_secs(1),
            ..memtide_core::backend::Saved::default()
        };
        let pending = store.begin(vm, memtide_core::Bytes::from_mib(1)).unwrap();
        std::fs::write(pending.dir().join("memory"), b"guest").unwrap();
        pending.finish(&saved, then, by).unwrap()
    }

    #[test]
    fn a_restarted_daemon_takes_its_next_scheduled_snapshot_a_period_after_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let hour = Duration::from_secs(3600);
        let now = Instant::now() + Duration::from_secs(3 * 86_400);
        let due_in = |vm| first_scheduled_at(&store, vm, hour, now).checked_duration_since(now);
        assert_eq!(due_in("web"), Some(hour), "none yet");
        stored(&store, "web", AfterSave::Run, TakenBy::Operator);
        assert_eq!(due_in("web"), Some(hour), "by hand: not counted");
        let taken = stored(&store, "web", AfterSave::Run, TakenBy::Schedule);
        let next = due_in("web").unwrap();
        assert!(
            next <= hour && next > hour - Duration::from_secs(60),
            "{next:?}"
        );
        // Taken long ago (the daemon was stopped meanwhile): overdue, the longest
        // overdue first (found by a review: all were due at the same moment, and the
        // configuration's order chose).
        let taken_at = |s: &snapshots::Snapshot, created: &str| {
            let meta = store.dir_of(s).join("snapshot.json");
            let mut described: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&meta).unwrap()).unwrap();
            described["created"] = created.into();
            std::fs::write(&meta, described.to_string()).unwrap();
        };
        let db = stored(&store, "db", AfterSave::Run, TakenBy::Schedule);
        let two_hours_ago = humantime::format_rfc3339(SystemTime::now() - 2 * hour).to_string();
        taken_at(&taken, &two_hours_ago);
        let day_ago = humantime::format_rfc3339(SystemTime::now() - 24 * hour).to_string();
        taken_at(&db, &day_ago);
        let (web, db) = (due_in("web"), due_in("db"));
        assert_eq!((web, db), (None, None), "overdue");
        let overdue = |vm| now - first_scheduled_at(&store, vm, hour, now);
        let (web, db) = (overdue("web"), overdue("db"));
        assert!(web.abs_diff(hour) < Duration::from_secs(60), "{web:?}");
        assert!(db.abs_diff(23 * hour) < Duration::from_secs(60), "{db:?}");
    }

    #[test]
    fn a_hibernation_whose_vm_did_not_stop_is_marked_woken() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let take = |then, by| stored(&store, "web", then, by);
        let asleep = take(AfterSave::Quit, TakenBy::Hibernation);
        assert!(asleep.asleep());
        let why = failed_after_seal(&store, Some(asleep), "the VMM did not quit".into());
        assert!(
            why.starts_with("the VMM did not quit; its snapshot is marked woken"),
            "{why}"
        );
        let listed = store.list("web").unwrap();
        assert!(
            !listed[0].asleep() && listed[0].woken.is_some(),
            "{listed:?}"
        );
        // A save that failed before its seal is told as it failed; one whose snapshot of
        // a guest that ran on was sealed all the same (its task's bound passed during the
        // seal) names it.
        assert_eq!(failed_after_seal(&store, None, "refused".into()), "refused");
        let ran = take(AfterSave::Run, TakenBy::Operator);
        let id = ran.id.clone();
        assert_eq!(
            failed_after_seal(&store, Some(ran), "timed out".into()),
            format!("timed out; its snapshot {id} was made whole all the same")
        );
    }

    #[test]
    fn a_vm_reset_under_its_connection_wakes_its_hibernations_unless_memtide_restores_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let hibernate = |vm: &str| stored(&store, vm, AfterSave::Quit, TakenBy::Hibernation).id;
        let (woken, waking, shut) = (hibernate("woken"), hibernate("waking"), hibernate("shut"));
        let with_events = |name: &str, events: Vec<VmEvent>| {
            let mut v = vm(name, 1000, 800, 600);
            if let Ok(sample) = &mut v.sample {
                sample.events = events;
            }
            v
        };
        let mut lost = vm("lost", 1000, 800, 600);
        lost.sample = Err(BackendError::Disconnected("gone".into()));
        let vms = vec![
            with_events("woken", vec![VmEvent::Shutdown, VmEvent::Reset]),
            with_events("waking", vec![VmEvent::Reset]),
            with_events("shut", vec![VmEvent::Shutdown]),
            lost,
            vm("calm", 1000, 800, 600),
        ];
        let snap = snapshot(0, host(4000, 400), vms);
        let restoring = HashSet::from(["waking".to_string()]);

        let marked = woken_by_reset(&store, &snap, &restoring);
        assert_eq!(
            marked.len(),
            1,
            "only the reset VM memtide is not restoring"
        );
        assert_eq!(marked[0].0, "woken");
        let ids: Vec<&str> = marked[0]
            .1
            .as_ref()
            .unwrap()
            .iter()
            .map(|s| s.id.as_str())
            .collect();
        assert_eq!(ids, [woken.as_str()]);
        let asleep = || -> Vec<String> {
            let mut ids: Vec<String> = store.asleep().unwrap().into_iter().map(|s| s.id).collect();
            ids.sort();
            ids
        };
        let mut left = vec![waking, shut.clone()];
        left.sort();
        assert_eq!(asleep(), left);
        // Reported reset again: nothing left to mark.
        let again = woken_by_reset(&store, &snap, &restoring);
        assert!(again[0].1.as_ref().unwrap().is_empty());
        // Once memtide's own restore has ended, a reset of that VM marks it too.
        let marked = woken_by_reset(&store, &snap, &HashSet::new());
        assert_eq!(marked.len(), 2);
        assert_eq!(asleep(), std::slice::from_ref(&shut));
        // Restored by libvirt under its connection (not booted): marked as well.
        let restored = hibernate("restored");
        let vms = vec![with_events("restored", vec![VmEvent::Restored])];
        let marked = woken_by_reset(&store, &snapshot(1, host(4000, 400), vms), &restoring);
        assert_eq!(marked[0].1.as_ref().unwrap()[0].id, restored);
        assert_eq!(asleep(), [shut]);
    }
}
