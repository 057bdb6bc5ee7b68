//! KubeVirt: the input is the API server's pod list, whose pods' annotations and
//! resources any user allowed to create pods writes; each line is also read as a
//! quantity.

use memtide_adapters::kubevirt::pods::{launcher_pods, quantity};
use memtide_core::Bytes;

pub fn run(data: &[u8]) {
    if let Ok(pods) = launcher_pods(data) {
        for (name, memory) in pods.memory {
            let (min, max) = memory.bounds();
            if let (Some(min), Some(request)) = (min, memory.request) {
                assert!(
                    min >= request && min - request < Bytes::from_mib(1),
                    "{name}"
                );
            }
            if let (Some(max), Some(limit)) = (max, memory.limit) {
                assert!(max <= limit && limit - max < Bytes::from_mib(1), "{name}");
            }
        }
    }
    for line in super::lines(data) {
        let Ok(text) = std::str::from_utf8(line) else {
            continue;
        };
        if let Ok(bytes) = quantity(text) {
            assert_eq!(quantity(&bytes.0.to_string()), Ok(bytes), "{text:?}");
        }
    }
}
