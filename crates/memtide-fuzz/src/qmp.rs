//! QMP: each line is a message from QEMU (greeting, reply or event), classified as the
//! session's reader does; a reply's value goes through the parsers of the answers
//! memtide reads (`guest-stats`, `query-memory-devices`), an event through the VM's.

use memtide_adapters::qmp::client::{message, Message, MAX_EVENT_DATA, QUEUED_EVENTS};
use memtide_adapters::qmp::vm::vm_event;
use memtide_adapters::qmp::{stats, virtio_mem};
use memtide_core::VmEvent;
use serde_json::Value;

/// The QOM path a device without an id gets (as QEMU names the first one).
const ANONYMOUS: &str = "/machine/peripheral-anon/device[0]";

pub fn run(data: &[u8]) {
    for line in crate::lines(data) {
        let Ok(msg) = serde_json::from_slice::<Value>(line) else {
            continue;
        };
        match message(&msg) {
            Message::Event(event) => {
                assert!(QUEUED_EVENTS.contains(&event.name.as_str()));
                assert!(event.data.is_null() || event.data.to_string().len() <= MAX_EVENT_DATA);
                match vm_event(&event) {
                    Some(VmEvent::BalloonChange { actual }) => {
                        assert_eq!(event.data["actual"].as_u64(), Some(actual.0));
                    }
                    Some(_) => assert_ne!(event.name, "BALLOON_CHANGE"),
                    None => assert_eq!(event.name, "BALLOON_CHANGE"),
                }
            }
            Message::Reply(id, reply) => {
                assert_eq!(msg["id"].as_u64(), Some(id));
                match reply {
                    Ok(value) => answer(&value),
                    Err(e) => assert!(!e.to_string().is_empty()),
                }
            }
            Message::Ignored => {}
        }
    }
}

/// A command's `return` value, read as each answer memtide asks for is.
fn answer(value: &Value) {
    let s = stats::parse(value);
    assert_ne!(s.last_update, Some(0), "0 means never updated");
    for figure in [
        s.free,
        s.total,
        s.available,
        s.disk_caches,
        s.swap_in,
        s.swap_out,
    ] {
        assert_ne!(
            figure.map(|b| b.0),
            Some(u64::MAX),
            "QEMU's \"not supplied\""
        );
    }
    if let Some((path, device)) = virtio_mem::parse(value, Some(ANONYMOUS)) {
        assert!(device.block.0 > 0);
        assert!(path.starts_with("/machine/"));
    }
}
