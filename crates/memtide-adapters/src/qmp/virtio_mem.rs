//! virtio-mem through QMP: the device found with `query-memory-devices` and resized with
//! `qom-set requested-size` (see [`crate::virtio_mem`] for how a size is met).

use super::client::{QmpClient, QmpError};
use crate::virtio_mem::Device;
use memtide_core::{BackendError, Bytes};
use serde_json::{json, Value};

/// The first virtio-mem device in a `query-memory-devices` answer, with its QOM path (for
/// `qom-set requested-size`), given the QOM path of devices without an id (`anonymous`).
pub fn parse(devices: &Value, anonymous: Option<&str>) -> Option<(String, Device)> {
    let d = devices
        .as_array()?
        .iter()
        .find(|d| d["type"] == "virtio-mem")?;
    let data = &d["data"];
    let bytes = |k: &str| data.get(k).and_then(Value::as_u64).map(Bytes);
    let path = match data.get("id").and_then(Value::as_str) {
        Some(id) => format!("/machine/peripheral/{id}"),
        None => anonymous?.to_string(),
    };
    let device = Device {
        plugged: bytes("size")?,
        requested: bytes("requested-size")?,
        max: bytes("max-size")?,
        block: bytes("block-size").filter(|b| b.0 > 0)?,
    };
    Some((path, device))
}

/// Query the device's current state.
pub async fn query(client: &mut QmpClient, path: &str) -> Result<Device, BackendError> {
    let devices = client.execute("query-memory-devices", None).await?;
    parse(&devices, Some(path))
        .map(|(_, d)| d)
        .ok_or_else(|| BackendError::Protocol("the virtio-mem device is gone".into()))
}

/// Ask the guest to plug `size`.
pub async fn request(client: &mut QmpClient, path: &str, size: Bytes) -> Result<(), QmpError> {
    let args = json!({"path": path, "property": "requested-size", "value": size.0});
    client.execute("qom-set", Some(args)).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `query-memory-devices` as QEMU 7.2 answers it.
    fn devices(id: bool, size: u64) -> Value {
        let mut data = json!({"memdev": "/objects/vmem0", "memaddr": 4294967296u64, "block-size": 2097152,
            "size": size, "node": 0, "max-size": 536870912, "requested-size": size});
        if id {
            data["id"] = "vmem0dev".into();
        }
        json!([{"type": "dimm", "data": {}}, {"type": "virtio-mem", "data": data}])
    }

    #[test]
    fn parses_the_device_with_or_without_an_id() {
        let (path, d) = parse(&devices(true, 0), None).unwrap();
        assert_eq!(
            (path.as_str(), d.max, d.block),
            (
                "/machine/peripheral/vmem0dev",
                Bytes::from_mib(512),
                Bytes::from_mib(2)
            )
        );
        assert_eq!(
            parse(
                &devices(false, 0),
                Some("/machine/peripheral-anon/device[1]")
            )
            .unwrap()
            .0,
            "/machine/peripheral-anon/device[1]"
        );
        assert_eq!(
            parse(&devices(false, 0), None),
            None,
            "an anonymous device needs its QOM path"
        );
        assert_eq!(parse(&json!([]), None), None);
    }
}
