//! One managed VM's backend, lent to one call at a time: a sample or a balloon command
//! runs as a task of its own, bounded by the call timeout, so a VM that does not answer
//! holds back only itself. The tick waits for a call until its own deadline and takes the
//! answer then, or at a later tick when it comes later; no second call to the VM starts
//! while one is in flight (a balloon command is never sent twice at once).

use memtide_core::backend::{AfterSave, Saved, Seal, VmBackend};
use memtide_core::snapshot::VmEvent;
use memtide_core::{BackendError, Bytes, VmSample};
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{timeout, timeout_at, Instant};
use tracing::Instrument;

/// A call to a VM.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Call {
    /// Read its sample.
    Sample,
    /// Set its balloon target.
    Balloon(Bytes),
    /// Save its memory (a snapshot): its result goes to whoever asked for it.
    Save,
}

/// What a VM answered to a call.
#[derive(Debug, PartialEq)]
pub enum Answer {
    /// Its sample (boxed: it is large, and moved through the task).
    Sample(Result<Box<VmSample>, BackendError>),
    /// The result of setting its balloon to this target.
    Balloon(Bytes, Result<(), BackendError>),
    /// A save ended; its result was handed over.
    Saved,
}

/// A save asked of a VM: where to, what then, within what time, what makes it whole,
/// and who takes the result.
pub struct SaveJob {
    /// The snapshot's directory.
    pub dir: PathBuf,
    /// What becomes of the VM after.
    pub then: AfterSave,
    /// The longest it may take.
    pub limit: Duration,
    /// Makes the snapshot whole once written (see `VmBackend::save`).
    pub seal: Seal,
    /// Takes the result.
    pub reply: oneshot::Sender<Result<Saved, BackendError>>,
}

#[cfg(test)]
impl SaveJob {
    /// A save for tests: into a directory it never writes, sealed by doing nothing, with
    /// where its result comes.
    pub fn for_test() -> (SaveJob, oneshot::Receiver<Result<Saved, BackendError>>) {
        let (reply, saved) = oneshot::channel();
        let job = SaveJob {
            dir: "/nonexistent".into(),
            then: AfterSave::Run,
            limit: Duration::from_secs(5),
            seal: Box::new(|_| Box::pin(async { Ok(()) })),
            reply,
        };
        (job, saved)
    }
}

/// Time a save's own cancellation and resumption may take beyond its limit before its
/// task gives up on it.
pub(super) const SAVE_GRACE: Duration = Duration::from_secs(30);

/// What a VM answered by a tick's sample deadline.
#[derive(Debug, PartialEq)]
pub struct Collected {
    /// The answer to a balloon command sent at an earlier tick, when it came.
    pub balloon: Option<(Bytes, Result<(), BackendError>)>,
    /// This tick's sample (or word that the connection is gone); `None`: late.
    pub sample: Option<Result<Box<VmSample>, BackendError>>,
}

/// A backend lent to a call, as the call hands it back.
type Lent = Option<Box<dyn VmBackend>>;

/// A call in flight: what it is, when it started, and the task that hands the backend back.
struct InFlight {
    call: Call,
    since: Instant,
    /// Hands back the backend (none after a save given up on), the answer and when it
    /// came.
    task: JoinHandle<(Lent, Answer, Instant)>,
}

/// A managed VM's backend, idle or lent to the call in flight.
pub struct VmTask {
    name: String,
    call_timeout: Duration,
    /// The backend while no call is in flight.
    idle: Option<Box<dyn VmBackend>>,
    in_flight: Option<InFlight>,
    /// The balloon target the backend last reported (kept while it is lent).
    target: Option<Bytes>,
    /// The hypervisor process the backend last reported (kept while it is lent).
    pid: Option<i32>,
    /// The bounds the backend last reported ([`VmBackend::bounds`]; kept while it is lent).
    bounds: Option<(Option<Bytes>, Option<Bytes>)>,
    /// When the latest answer came.
    answered: Option<Instant>,
    /// Events that came with a sample superseded before any tick used it (a reset seen
    /// while the VM answered late): handed on with the next sample, never lost.
    events: Vec<VmEvent>,
}

impl VmTask {
    /// The task of VM `name`, each of its calls bounded by `call_timeout`.
    pub fn new(name: &str, backend: Box<dyn VmBackend>, call_timeout: Duration) -> VmTask {
        VmTask {
            name: name.to_string(),
            call_timeout,
            target: backend.target(),
            pid: backend.pid(),
            bounds: backend.bounds(),
            idle: Some(backend),
            in_flight: None,
            answered: None,
            events: Vec::new(),
        }
    }

    /// Start `call` (a sample or a balloon command), unless a call is in flight (then
    /// false: nothing is sent).
    pub fn start(&mut self, call: Call) -> bool {
        let job = match call {
            Call::Sample => Job::Sample,
            Call::Balloon(target) => Job::Balloon(target),
            Call::Save => unreachable!("a save is started with start_save"),
        };
        self.lend(job).is_ok()
    }

    /// Start `save`, unless a call is in flight (then it is given back).
    pub fn start_save(&mut self, save: SaveJob) -> Result<(), SaveJob> {
        self.lend(Job::Save(save)).map_err(|job| match job {
            Job::Save(save) => save,
            _ => unreachable!("the job given"),
        })
    }

    /// Lend the backend to `job`, unless a call is in flight (then the job comes back).
    fn lend(&mut self, job: Job) -> Result<(), Job> {
        let Some(mut backend) = self.idle.take() else {
            return Err(job);
        };
        let call = job.call();
        let limit = self.call_timeout;
        let span = tracing::info_span!("vm", name = self.name.as_str());
        let task = tokio::spawn(
            async move {
                let mut kept = true;
                let answer = match job {
                    Job::Sample => Answer::Sample(
                        timeout(limit, backend.sample())
                            .await
                            .unwrap_or_else(|_| Err(BackendError::timeout(limit)))
                            .map(Box::new),
                    ),
                    Job::Balloon(target) => Answer::Balloon(
                        target,
                        timeout(limit, backend.set_balloon(target))
                            .await
                            .unwrap_or_else(|_| Err(BackendError::timeout(limit))),
                    ),
                    Job::Save(save) => {
                        // The backend cancels a save past its limit and resumes the guest;
                        // this bound is for a backend that cannot even do that.
                        let saving = backend.save(&save.dir, save.then, save.limit, save.seal);
                        let bound = save.limit + SAVE_GRACE;
                        let result = match timeout(bound, saving).await {
                            Ok(result) => result,
                            // Cut off at any step, the guest perhaps stopped: the backend
                            // is let go, so that the VM is connected afresh (a connection
                            // resumes a guest a save left stopped by its mark: QEMU's fd
                            // set, Firecracker's and Cloud Hypervisor's paused-by-save).
                            Err(_) => {
                                kept = false;
                                Err(BackendError::timeout(bound))
                            }
                        };
                        let _ = save.reply.send(result);
                        Answer::Saved
                    }
                };
                (kept.then_some(backend), answer, Instant::now())
            }
            .instrument(span),
        );
        self.in_flight = Some(InFlight {
            call,
            since: Instant::now(),
            task,
        });
        Ok(())
    }

    /// This tick's sample, asked for as soon as the VM is free, after the save waiting in
    /// `save` (taken from there once started): a call still in flight from an earlier
    /// tick is waited for first (a balloon command's answer is returned too). A sample
    /// asked for since `fresh` (the previous tick, not one before it) that came after its
    /// tick's deadline is this tick's, and no other is asked for, so that a balloon
    /// command can go out: a VM answering in more than the wait but less than the
    /// interval is decided every other tick (found in review: each tick superseded the
    /// sample that came late and asked for one that came late again, and such a VM, slow
    /// perhaps because its host was short, was never decided, nor given memory back). One
    /// asked for earlier is superseded, unless it says the connection is gone. Waits until
    /// `deadline` at the most.
    pub async fn sample_by(
        &mut self,
        fresh: Instant,
        deadline: Instant,
        save: &mut Option<SaveJob>,
    ) -> Collected {
        let mut balloon = None;
        let mut asked = false;
        loop {
            self.start_queued(save);
            let fresh_sample = self
                .in_flight
                .as_ref()
                .is_some_and(|f| f.call == Call::Sample && f.since >= fresh);
            if !asked {
                asked = self.start(Call::Sample);
                if !asked && self.in_flight.is_none() {
                    let gone = BackendError::Disconnected(
                        "its connection was let go (a save given up on, or a call that failed)"
                            .into(),
                    );
                    let sample = Some(Err(gone));
                    return Collected { balloon, sample };
                }
            }
            match self.answer_by(deadline).await {
                None => {
                    return Collected {
                        balloon,
                        sample: None,
                    }
                }
                Some(Answer::Balloon(target, result)) => balloon = Some((target, result)),
                Some(Answer::Saved) => {}
                Some(Answer::Sample(
                    sample @ Err(BackendError::Disconnected(_) | BackendError::ShutDown(_)),
                )) => {
                    return Collected {
                        balloon,
                        sample: Some(sample),
                    }
                }
                Some(Answer::Sample(mut sample)) if asked || (fresh_sample && sample.is_ok()) => {
                    if let Ok(s) = &mut sample {
                        let later = std::mem::take(&mut s.events);
                        s.events = std::mem::take(&mut self.events);
                        s.events.extend(later);
                    }
                    // A save waiting for the call goes before this tick's balloon command.
                    self.start_queued(save);
                    return Collected {
                        balloon,
                        sample: Some(sample),
                    };
                }
                Some(Answer::Sample(Ok(mut superseded))) => {
                    self.events.append(&mut superseded.events);
                }
                Some(Answer::Sample(Err(_))) => {}
            }
        }
    }

    /// Start the save queued in `save`, if any, taken from there once started.
    fn start_queued(&mut self, save: &mut Option<SaveJob>) {
        if let Some(job) = save.take() {
            *save = self.start_save(job).err();
        }
    }

    /// A save is running: lent the backend and not ended yet. One that ended (its result
    /// handed over) waits only for the next sample to take the backend back.
    pub fn saving(&self) -> bool {
        self.in_flight
            .as_ref()
            .is_some_and(|f| f.call == Call::Save && !f.task.is_finished())
    }

    /// The call in flight and how long it has been waiting, if one is.
    pub fn in_flight(&self) -> Option<(Call, Duration)> {
        self.in_flight.as_ref().map(|f| (f.call, f.since.elapsed()))
    }

    /// Wait until the call in flight answers or `deadline` passes (a deadline already
    /// passed takes an answer that is there). `None`: no call, or no answer yet.
    pub async fn answer_by(&mut self, deadline: Instant) -> Option<Answer> {
        let flight = self.in_flight.as_mut()?;
        let joined = timeout_at(deadline, &mut flight.task).await.ok()?;
        let call = self.in_flight.take().expect("checked above").call;
        Some(match joined {
            Ok((backend, answer, at)) => {
                self.answered = Some(at);
                if call == Call::Save && backend.is_some() {
                    self.events.push(VmEvent::Saved);
                }
                if let Some(backend) = backend {
                    (self.target, self.pid) = (backend.target(), backend.pid());
                    let bounds = backend.bounds();
                    if bounds != self.bounds {
                        tracing::info!(
                            "VM {}: its bounds as its hypervisor describes it are now min {}, \
                             max {} (were min {}, max {})",
                            self.name,
                            shown(bounds.and_then(|b| b.0)),
                            shown(bounds.and_then(|b| b.1)),
                            shown(self.bounds.and_then(|b| b.0)),
                            shown(self.bounds.and_then(|b| b.1)),
                        );
                        self.bounds = bounds;
                    }
                    self.idle = Some(backend);
                }
                answer
            }
            // The backend went with the task: the VM is treated as disconnected.
            Err(e) => {
                let gone = BackendError::Disconnected(format!("its task ended: {e}"));
                match call {
                    Call::Sample => Answer::Sample(Err(gone)),
                    Call::Balloon(target) => Answer::Balloon(target, Err(gone)),
                    // The save's reply went with the task: its asker hears it closed.
                    Call::Save => Answer::Saved,
                }
            }
        })
    }

    /// When the answer [`VmTask::answer_by`] last took came.
    pub fn answered(&self) -> Option<Instant> {
        self.answered
    }

    /// The balloon target the backend last reported.
    pub fn target(&self) -> Option<Bytes> {
        self.target
    }

    /// The hypervisor process the backend last reported ([`VmBackend::pid`]).
    pub fn pid(&self) -> Option<i32> {
        self.pid
    }

    /// The bounds the backend last reported ([`VmBackend::bounds`]).
    pub fn bounds(&self) -> Option<(Option<Bytes>, Option<Bytes>)> {
        self.bounds
    }
}

/// A bound as a log line shows it.
fn shown(bound: Option<Bytes>) -> String {
    bound.map_or_else(|| "unset".into(), |b| b.to_string())
}

/// What a call does, with what it needs.
enum Job {
    Sample,
    Balloon(Bytes),
    Save(SaveJob),
}

impl Job {
    fn call(&self) -> Call {
        match self {
            Job::Sample => Call::Sample,
            Job::Balloon(target) => Call::Balloon(*target),
            Job::Save(_) => Call::Save,
        }
    }
}

impl Drop for VmTask {
    /// A VM that is dropped takes its call in flight with it.
    fn drop(&mut self) {
        if let Some(flight) = &self.in_flight {
            flight.task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    /// Never answers a balloon command; counts those it was sent.
    struct Deaf(Arc<AtomicU32>);

    #[async_trait]
    impl VmBackend for Deaf {
        async fn sample(&mut self) -> Result<VmSample, BackendError> {
            Err(BackendError::Protocol("not sampled here".into()))
        }
        async fn set_balloon(&mut self, _: Bytes) -> Result<(), BackendError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            std::future::pending().await
        }
        fn target(&self) -> Option<Bytes> {
            Some(Bytes::from_mib(1))
        }
    }

    #[tokio::test]
    async fn a_save_that_ended_is_no_longer_saving_before_its_backend_is_taken_back() {
        let sent = Arc::new(AtomicU32::new(0));
        let mut task = VmTask::new("deaf", Box::new(Deaf(sent)), Duration::from_secs(2));
        let (save, result) = SaveJob::for_test();
        assert!(task.start_save(save).is_ok());
        assert!(task.saving());
        // Deaf cannot save: the save ends at once, with its error.
        assert!(result.await.unwrap().is_err());
        let ended = Instant::now() + Duration::from_secs(5);
        while task.saving() && Instant::now() < ended {
            tokio::task::yield_now().await;
        }
        assert!(!task.saving(), "ended");
        assert!(
            matches!(task.in_flight(), Some((Call::Save, _))),
            "its backend not taken back yet"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_in_flight_is_never_doubled_and_answers_after_its_deadline() {
        let sent = Arc::new(AtomicU32::new(0));
        let mut task = VmTask::new("deaf", Box::new(Deaf(sent.clone())), Duration::from_secs(2));
        let target = Bytes::from_mib(300);
        assert!(task.start(Call::Balloon(target)));
        let t0 = Instant::now();
        let deadline = t0 + Duration::from_millis(500);
        assert_eq!(
            task.answer_by(deadline).await,
            None,
            "no answer by the deadline"
        );
        assert_eq!(t0.elapsed(), Duration::from_millis(500));
        assert!(
            !task.start(Call::Balloon(target)),
            "not sent again while in flight"
        );
        assert!(!task.start(Call::Sample), "nor sampled");
        assert_eq!(task.target(), Some(Bytes::from_mib(1)), "known while lent");
        assert_eq!(
            task.in_flight(),
            Some((Call::Balloon(target), Duration::from_millis(500)))
        );
        // The call timeout ends it; its answer is taken at a later deadline.
        tokio::time::sleep(Duration::from_millis(1600)).await;
        assert_eq!(
            task.answer_by(Instant::now()).await,
            Some(Answer::Balloon(target, Err(BackendError::Timeout(2000))))
        );
        assert_eq!(sent.load(Ordering::SeqCst), 1, "sent once");
        assert_eq!(task.in_flight(), None);
        assert!(task.start(Call::Sample), "idle again");
    }

    /// Samples, but never ends a save.
    struct HungSave;

    #[async_trait]
    impl VmBackend for HungSave {
        async fn sample(&mut self) -> Result<VmSample, BackendError> {
            Ok(memtide_core::testkit::vm("v", 512, 512, 100)
                .sample
                .unwrap())
        }
        async fn set_balloon(&mut self, _: Bytes) -> Result<(), BackendError> {
            Ok(())
        }
        fn target(&self) -> Option<Bytes> {
            None
        }
        async fn save(
            &mut self,
            _: &std::path::Path,
            _: AfterSave,
            _: Duration,
            _: Seal,
        ) -> Result<Saved, BackendError> {
            std::future::pending().await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_save_given_up_on_lets_its_backend_go_so_the_vm_is_connected_afresh() {
        let mut task = VmTask::new("v", Box::new(HungSave), Duration::from_secs(2));
        let (save, result) = SaveJob::for_test();
        let mut save = Some(save);
        let first = task.sample_by(
            Instant::now(),
            Instant::now() + Duration::from_millis(500),
            &mut save,
        );
        assert_eq!(first.await.sample, None, "the save holds the backend");
        assert!(save.is_none(), "started");
        // for_test's limit (5 s) and the grace after it.
        tokio::time::sleep(Duration::from_secs(5) + SAVE_GRACE).await;
        assert_eq!(result.await.unwrap(), Err(BackendError::Timeout(35_000)));
        let next = task
            .sample_by(
                Instant::now(),
                Instant::now() + Duration::from_millis(500),
                &mut None,
            )
            .await;
        assert!(
            matches!(next.sample, Some(Err(BackendError::Disconnected(_)))),
            "not sampled through a backend in an unknown state"
        );
    }

    /// Answers its first sample late, with a reset among its events; the next at once.
    struct SlowOnce(u32);

    #[async_trait]
    impl VmBackend for SlowOnce {
        async fn sample(&mut self) -> Result<VmSample, BackendError> {
            self.0 += 1;
            let events = if self.0 == 1 {
                tokio::time::sleep(Duration::from_millis(800)).await;
                vec![VmEvent::Reset]
            } else {
                Vec::new()
            };
            let mut s = memtide_core::testkit::vm("v", 512, 512, 100)
                .sample
                .unwrap();
            s.events = events;
            Ok(s)
        }
        async fn set_balloon(&mut self, _: Bytes) -> Result<(), BackendError> {
            Ok(())
        }
        fn target(&self) -> Option<Bytes> {
            None
        }
    }

    #[tokio::test(start_paused = true)]
    async fn events_of_a_sample_too_late_for_its_tick_come_with_the_next() {
        let mut task = VmTask::new("v", Box::new(SlowOnce(0)), Duration::from_secs(2));
        let tick = |ms| Instant::now() + Duration::from_millis(ms);
        let late = task.sample_by(tick(0), tick(500), &mut None).await;
        assert_eq!(late.sample, None, "late for its tick");
        // Nothing asked for before this tick is fresh: the late sample is superseded.
        let next = task.sample_by(tick(0), tick(500), &mut None).await.sample;
        let next = next.unwrap().unwrap();
        assert_eq!(next.events, vec![VmEvent::Reset], "the reset is not lost");
        let after = task.sample_by(tick(0), tick(500), &mut None).await.sample;
        let after = after.unwrap().unwrap();
        assert!(after.events.is_empty(), "and given once");
    }
}
