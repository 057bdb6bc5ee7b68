//! The guest agent: each line is the agent's reply to the next command, and memtide
//! reads the guest's /proc files through them (`guest-file-open`, `-read` until EOF,
//! `-close`, for meminfo, vmstat and pressure) and parses what the guest sent.

use async_trait::async_trait;
use memtide_adapters::qga::{
    read_proc, reply_value, AgentChannel, OpenHandles, QgaError, MAX_READS,
};
use serde_json::Value;

/// Files `read_proc` reads.
const FILES: usize = 3;

/// An agent answering with the input's lines, in order.
struct Scripted<'a, I: Iterator<Item = &'a [u8]>> {
    replies: I,
    calls: usize,
}

#[async_trait]
impl<'a, I: Iterator<Item = &'a [u8]> + Send> AgentChannel for Scripted<'a, I> {
    async fn execute(&mut self, _command: &str, _arguments: Value) -> Result<Value, QgaError> {
        self.calls += 1;
        let line = self
            .replies
            .next()
            .ok_or_else(|| QgaError::Protocol("connection closed".into()))?;
        let reply = serde_json::from_slice(line)
            .map_err(|e| QgaError::Protocol(format!("invalid JSON ({e})")))?;
        reply_value(&reply)
    }
}

pub fn run(data: &[u8]) {
    let mut agent = Scripted {
        replies: crate::lines(data),
        calls: 0,
    };
    let read = futures::executor::block_on(read_proc(&mut agent, &mut OpenHandles::default()));
    // Open, at most MAX_READS reads, close: a guest cannot keep the sample going.
    assert!(
        agent.calls <= FILES * (MAX_READS + 2),
        "{} calls",
        agent.calls
    );
    match read {
        Ok(stats) => {
            if let Some(psi) = stats.psi {
                crate::host::check_psi(&psi);
            }
        }
        Err(e) => assert!(!e.is_empty()),
    }
}
