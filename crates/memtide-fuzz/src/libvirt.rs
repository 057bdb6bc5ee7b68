//! libvirt: a domain's XML description, and its memory statistics (`tag value` lines,
//! as `virDomainMemoryStats` returns the pairs).

use memtide_adapters::libvirt::{stats, xml};
use memtide_core::Bytes;

pub fn xml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(domain) = xml::parse(text) else {
        return;
    };
    assert!(domain.base_memory() <= domain.memory);
    let Some(device) = &domain.virtio_mem else {
        return;
    };
    assert!(device.block.0 > 0);
    // The device as memtide sends it back to libvirt, asking for another size, reads
    // as the same device with that size. A device using a namespace prefix or an entity
    // declared outside it cannot stand alone: it is not checked.
    let requested = Bytes::from_kib(device.requested.kib() / 2);
    let update = device.update_xml(requested);
    if update.contains([':', '&']) {
        return;
    }
    let alone = format!(
        "<domain><memory unit='b'>{}</memory><devices>{update}</devices></domain>",
        domain.memory.0
    );
    let again = xml::parse(&alone)
        .unwrap_or_else(|e| panic!("{e}: {alone}"))
        .virtio_mem
        .expect("the device is still there");
    assert_eq!(again.requested, requested);
    assert_eq!(
        (again.size, again.block, again.node),
        (device.size, device.block, device.node)
    );
}

pub fn memstats(data: &[u8]) {
    let pairs: Vec<(u32, u64)> = String::from_utf8_lossy(data)
        .lines()
        .filter_map(|line| {
            let (tag, value) = line.split_once(' ')?;
            Some((tag.parse().ok()?, value.parse().ok()?))
        })
        .collect();
    let m = stats::parse(&pairs);
    // ACTUAL_BALLOON (tag 6) in KiB, the last one given.
    let balloon = pairs.iter().rev().find(|(tag, _)| *tag == 6);
    assert_eq!(m.balloon, balloon.map(|(_, kib)| Bytes::from_kib(*kib)));
    assert_ne!(m.stats.last_update, Some(0));
}
