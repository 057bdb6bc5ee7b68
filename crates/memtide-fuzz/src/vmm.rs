//! Firecracker and Cloud Hypervisor: the input is the body of an API response, decoded
//! as a success and as an error, and a success read as each answer memtide asks for.

use hyper::{Method, StatusCode};
use memtide_adapters::api_socket::{decode_response, guest_stats, ApiError};
use memtide_adapters::{cloud_hypervisor, firecracker};
use memtide_core::Bytes;
use serde_json::Value;

/// The body as a success (its JSON) after checking it as an error's body.
fn decode(path: &str, data: &[u8]) -> Option<Value> {
    match decode_response(Method::GET, path, StatusCode::BAD_REQUEST, data) {
        // The message is the body's text or its fault_message: never longer than it
        // (lossy UTF-8 replaces each bad byte by 3).
        Err(ApiError::Status { message, .. }) => assert!(message.len() <= 3 * data.len()),
        other => panic!("an error status decoded as {other:?}"),
    }
    decode_response(Method::GET, path, StatusCode::OK, data).ok()
}

pub fn firecracker(data: &[u8]) {
    let Some(v) = decode("/balloon/statistics", data) else {
        return;
    };
    let mem = firecracker::machine_memory(&v).unwrap_or(Bytes::from_mib(1024));
    for (name, what) in [
        ("actual_mib", "GET /balloon/statistics"),
        ("amount_mib", "GET /balloon"),
    ] {
        if let Ok(keeps) = firecracker::guest_keeps(mem, &v, name, what) {
            assert!(keeps <= mem);
        }
    }
    let stats = guest_stats(&v);
    assert!(
        stats.last_update.is_none(),
        "Firecracker dates no statistics"
    );
}

pub fn cloud_hypervisor(data: &[u8]) {
    let Some(v) = decode("/api/v1/vm.info", data) else {
        return;
    };
    let running = cloud_hypervisor::check_state(&v).is_ok();
    assert_eq!(running, v["state"] == "Running");
    if let Ok((configured, _actual, _balloon)) = cloud_hypervisor::sizes(&v) {
        let size = v["config"]["memory"]["size"].as_u64();
        assert!(size.is_some_and(|s| configured.0 >= s));
    }
    let stats = cloud_hypervisor::balloon_stats(&v);
    assert_ne!(stats.last_update, Some(0));
}
