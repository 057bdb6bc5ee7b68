//! tlbtick: wakes every N milliseconds (default 500) and does nothing else.
//!
//!     tlbtick [MILLISECONDS]
//!
//! Not a workload: the guest's init runs it beside every workload, because of
//! how QEMU emulates a CPU without KVM (TCG). Its software TLB is resized only
//! when the guest flushes it whole, which an x86 guest does when it switches to
//! another process's page tables. A guest running one process alone flushes
//! seldom, so its TLB keeps the size the last working set needed, and a
//! workload whose working set grew then misses on nearly every page, 10-20
//! times slower, until some other process happens to run. Which guests stall,
//! and for how long, then depends on what else wakes in them (the guest agent
//! answering a policy's queries, say), not on their memory. A process waking
//! twice a second resizes every guest's TLB to its working set within a second
//! or two, alike under every policy (guest/README.md has the measurements);
//! under KVM there is no such TLB to resize.

use std::process::ExitCode;
use std::thread;
use std::time::Duration;

const DEFAULT_MS: u64 = 500;

fn main() -> ExitCode {
    let ms = match std::env::args().nth(1).map(|arg| arg.parse::<u64>()) {
        None => DEFAULT_MS,
        Some(Ok(ms)) if ms > 0 => ms,
        Some(_) => {
            eprintln!("usage: tlbtick [MILLISECONDS > 0]");
            return ExitCode::from(2);
        }
    };
    loop {
        thread::sleep(Duration::from_millis(ms));
    }
}
