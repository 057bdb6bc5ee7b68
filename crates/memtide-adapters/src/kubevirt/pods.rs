//! Each virt-launcher pod's memory request and limit, from a Kubernetes pod list, as
//! memtide's bounds for the pod's VM.
//!
//! KubeVirt sets the `compute` container's memory request from the VMI's memory request
//! plus its overhead (virt-launcher, QEMU, page tables; left out with
//! `overcommitGuestOverhead`), and the limit, when the VMI has one, likewise. The request
//! is what the scheduler reserved for the pod and what the node guarantees it: memtide
//! never balloons the guest below it. A pod using more than its request is among the
//! first the kubelet evicts under memory pressure, so a guest held at its request is not
//! one of them. The limit is the pod's cgroup ceiling: a guest kept below it is never
//! killed for it. Both include the overhead, which memtide cannot know from the pod: the
//! minimum is conservative by it, the maximum generous by it. Neither exceeds the guest's
//! configured size: the daemon caps both there (a VM whose request covers its whole
//! memory, KubeVirt's default without memory overcommit, is never ballooned).

use memtide_core::Bytes;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;

/// The annotation KubeVirt puts on every launcher pod: the name of its VMI.
const DOMAIN_ANNOTATION: &str = "kubevirt.io/domain";
/// The launcher's container that runs the VM, and carries its resources.
const COMPUTE: &str = "compute";

/// A launcher pod's memory, from its `compute` container.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodMemory {
    /// `resources.requests.memory`.
    pub request: Option<Bytes>,
    /// `resources.limits.memory`.
    pub limit: Option<Bytes>,
}

impl PodMemory {
    /// memtide's bounds for the pod's VM, in whole MiB as memtide keeps them: (min, max),
    /// the request rounded up (never below it), the limit down (never above it).
    pub fn bounds(&self) -> (Option<Bytes>, Option<Bytes>) {
        let min = self
            .request
            .map(|b| Bytes::from_mib(b.0.div_ceil(Bytes::from_mib(1).0)));
        let max = self.limit.map(|b| Bytes::from_mib(b.mib()));
        (min, max)
    }
}

/// Why a pod list or a quantity cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodsError(String);

impl fmt::Display for PodsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PodsError {}

/// A pod list as read: each running launcher pod's memory, and the pods whose memory
/// cannot be read.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct LauncherPods {
    /// Each pod's memory by its VM's name.
    pub memory: BTreeMap<String, PodMemory>,
    /// Why each pod passed over for its quantities cannot be read, by `NAMESPACE/POD`.
    pub unreadable: BTreeMap<String, String>,
    /// The VM each running launcher pod runs, by the pod's UID: what its libvirt daemon
    /// may name its domain (a pod chooses its annotation, but not its namespace).
    pub vms: BTreeMap<String, String>,
}

/// The memory of each running launcher pod in a pod list (`GET /api/v1/pods`), by the
/// name memtide gives its VM: `NAMESPACE/VMI`, as [`super::vm_name`] names the pod's
/// libvirt domain. A pod is named by its `kubevirt.io/domain` annotation, which KubeVirt
/// sets to the VMI's name (its `vm.kubevirt.io/name` label is the guest's host name,
/// which `spec.hostname` may change). Pods not running (a finished launcher of the same
/// VMI), without the annotation or without a `compute` container are passed over; two
/// running pods for one VMI (never on one node) leave it out, as neither can be chosen.
/// A pod whose memory cannot be read is passed over too, and listed with why: anyone who
/// may create pods on the node can label and annotate one as a launcher, and its
/// quantities must not cost every VM of the node its bounds. Each running pod's VM is
/// also given by the pod's UID, memory or not.
pub fn launcher_pods(json: &[u8]) -> Result<LauncherPods, PodsError> {
    let list: PodList =
        serde_json::from_slice(json).map_err(|e| PodsError(format!("not a pod list: {e}")))?;
    let mut pods = LauncherPods::default();
    let mut twice = Vec::new();
    for pod in list.items {
        let meta = &pod.metadata;
        let Some(vmi) = meta.annotations.get(DOMAIN_ANNOTATION) else {
            continue;
        };
        if pod.status.phase.as_deref() != Some("Running") {
            continue;
        }
        let name = format!("{}/{vmi}", meta.namespace);
        if !meta.uid.is_empty() {
            pods.vms.insert(meta.uid.clone(), name.clone());
        }
        let Some(compute) = pod.spec.containers.iter().find(|c| c.name == COMPUTE) else {
            continue;
        };
        let memory = |field: &str, q: Option<&String>| {
            q.map(|q| quantity(q))
                .transpose()
                .map_err(|e| format!("{field}: {e}"))
        };
        let resources = &compute.resources;
        let read =
            memory("requests.memory", resources.requests.get("memory")).and_then(|request| {
                let limit = memory("limits.memory", resources.limits.get("memory"))?;
                Ok(PodMemory { request, limit })
            });
        let memory = match read {
            Ok(memory) => memory,
            Err(why) => {
                let pod = format!("{}/{}", meta.namespace, meta.name);
                pods.unreadable.insert(pod, why);
                continue;
            }
        };
        if pods.memory.insert(name.clone(), memory).is_some() {
            twice.push(name);
        }
    }
    for name in twice {
        pods.memory.remove(&name);
    }
    Ok(pods)
}

/// A Kubernetes quantity (`512Mi`, `1G`, `1.5Gi`, `129M`, `1e3`, `100m`) as a number of
/// bytes, a fraction rounded up as Kubernetes rounds a quantity's value. Negative
/// quantities and those beyond 2^64-1 bytes are refused.
///
/// Written here rather than taken from a crate: the grammar (apimachinery's
/// `resource.Quantity`) is a sign, a decimal number and one suffix; the Kubernetes
/// client crates carry quantities as strings and leave parsing out, and the small crates
/// that parse them are not kept up. Exact integer arithmetic, no floating point.
pub fn quantity(text: &str) -> Result<Bytes, PodsError> {
    let bad = |why: &str| PodsError(format!("bad quantity {text:?}: {why}"));
    let unsigned = text.strip_prefix(['+', '-']).unwrap_or(text);
    let number_len = unsigned
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(number_len);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return Err(bad("no number"));
    }
    if fraction.contains('.') {
        return Err(bad("two decimal points"));
    }
    let digits = format!("{whole}{fraction}");
    let digits = digits.trim_start_matches('0');
    if digits.len() > 20 {
        return Err(bad("too many digits"));
    }
    // The value is mantissa × binary × 10^scale.
    let mantissa: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().expect("digits")
    };
    if mantissa > 0 && text.starts_with('-') {
        return Err(bad("negative"));
    }
    let mut scale = -(fraction.len() as i64);
    let mut binary: u128 = 1;
    match suffix {
        "" => {}
        "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" => {
            let power = "KMGTPE".find(&suffix[..1]).expect("a binary prefix") as u32 + 1;
            binary = 1 << (10 * power);
        }
        "n" => scale -= 9,
        "u" => scale -= 6,
        "m" => scale -= 3,
        "k" | "M" | "G" | "T" | "P" | "E" => {
            scale += 3 * ("kMGTPE".find(suffix).expect("a decimal prefix") as i64 + 1);
        }
        _ => {
            let exponent = suffix
                .strip_prefix(['e', 'E'])
                .filter(|e| {
                    let e = e.strip_prefix(['+', '-']).unwrap_or(e);
                    !e.is_empty() && e.len() <= 6 && e.bytes().all(|b| b.is_ascii_digit())
                })
                .ok_or_else(|| bad("unknown suffix"))?;
            scale += exponent.parse::<i64>().expect("a bounded exponent");
        }
    }
    // Below 2^67 × 2^60: no overflow.
    let value = mantissa * binary;
    let bytes = if value == 0 {
        0
    } else if scale >= 0 {
        u32::try_from(scale)
            .ok()
            .and_then(|s| 10u128.checked_pow(s))
            .and_then(|p| value.checked_mul(p))
            .ok_or_else(|| bad("too large"))?
    } else {
        match u32::try_from(-scale)
            .ok()
            .and_then(|s| 10u128.checked_pow(s))
        {
            Some(p) => value.div_ceil(p),
            None => 1, // a positive value below 10^39 over a larger power of ten
        }
    };
    u64::try_from(bytes)
        .map(Bytes)
        .map_err(|_| bad("too large"))
}

/// What is read of a pod list.
#[derive(Deserialize)]
struct PodList {
    items: Vec<Pod>,
}

#[derive(Deserialize)]
struct Pod {
    metadata: Metadata,
    #[serde(default)]
    spec: Spec,
    #[serde(default)]
    status: Status,
}

#[derive(Deserialize)]
struct Metadata {
    name: String,
    namespace: String,
    #[serde(default)]
    uid: String,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Default, Deserialize)]
struct Spec {
    #[serde(default)]
    containers: Vec<Container>,
}

#[derive(Deserialize)]
struct Container {
    name: String,
    #[serde(default)]
    resources: Resources,
}

#[derive(Default, Deserialize)]
struct Resources {
    #[serde(default)]
    requests: BTreeMap<String, String>,
    #[serde(default)]
    limits: BTreeMap<String, String>,
}

#[derive(Default, Deserialize)]
struct Status {
    phase: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn quantities_in_every_suffix_are_bytes() {
        for (text, bytes) in [
            ("512Mi", 512 * MIB),
            ("1G", 1_000_000_000),
            ("1.5Gi", 1536 * MIB),
            ("129M", 129_000_000),
            ("1e3", 1000),
            ("1E3", 1000),
            ("5e-1", 1),
            ("2.5e+2", 250),
            ("1Ki", 1024),
            ("2Ti", 2 << 40),
            ("1Pi", 1 << 50),
            ("7Ei", 7 << 60),
            ("3k", 3000),
            ("1T", 1_000_000_000_000),
            ("1P", 1_000_000_000_000_000),
            ("1E", 1_000_000_000_000_000_000),
            ("1500m", 2),
            ("1u", 1),
            ("5n", 1),
            ("2000000000n", 2),
            ("1000m", 1),
            ("0.1", 1),
            (".5Ki", 512),
            ("1.", 1),
            ("+4Mi", 4 * MIB),
            ("-0", 0),
            ("-0e5", 0),
            ("0", 0),
            ("000123", 123),
            ("4294967296", 1 << 32),
            ("1e-50", 1),
            ("0e400000", 0),
            ("18446744073709551615", u64::MAX),
        ] {
            assert_eq!(quantity(text), Ok(Bytes(bytes)), "{text}");
        }
    }

    #[test]
    fn bad_quantities_are_refused_saying_why() {
        for (text, why) in [
            ("", "no number"),
            ("Mi", "no number"),
            (".", "no number"),
            ("-1Gi", "negative"),
            ("1.2.3", "two decimal points"),
            ("1 Gi", "unknown suffix"),
            ("1GB", "unknown suffix"),
            ("1gi", "unknown suffix"),
            ("1e", "unknown suffix"),
            ("1e+", "unknown suffix"),
            ("1e1000000", "unknown suffix"),
            ("0x10", "unknown suffix"),
            ("16Ei", "too large"),
            ("18446744073709551616", "too large"),
            ("1e40", "too large"),
            ("123456789012345678901", "too many digits"),
        ] {
            let e = quantity(text).unwrap_err().to_string();
            assert_eq!(e, format!("bad quantity {text:?}: {why}"));
        }
    }

    proptest! {
        #[test]
        fn a_whole_number_with_a_suffix_is_that_many_units(n in 0u64..1_000_000, s in 0usize..13) {
            let (suffix, unit): (&str, u64) = [
                ("", 1), ("k", 1_000), ("M", 1_000_000), ("G", 1_000_000_000),
                ("T", 1_000_000_000_000), ("Ki", 1 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30),
                ("Ti", 1 << 40), ("e0", 1), ("e3", 1_000), ("e6", 1_000_000), ("E9", 1_000_000_000),
            ][s];
            prop_assert_eq!(quantity(&format!("{n}{suffix}")), Ok(Bytes(n * unit)));
        }

        #[test]
        fn a_decimal_fraction_of_mebibytes_rounds_up_to_a_byte(mib in 0u64..100_000, frac in 0u32..1000) {
            let exact = mib * MIB + (u64::from(frac) * MIB).div_ceil(1000);
            prop_assert_eq!(quantity(&format!("{mib}.{frac:03}Mi")), Ok(Bytes(exact)));
        }

        #[test]
        fn any_text_is_a_quantity_or_an_error_never_a_panic(text in "[-+0-9.eEkKMGTPim ]{0,12}") {
            let _ = quantity(&text);
        }
    }

    #[test]
    fn the_bounds_are_whole_mib_never_below_the_request_nor_above_the_limit() {
        let pod = PodMemory {
            request: Some(Bytes(129_000_000)), // 123.02 MiB
            limit: Some(Bytes(1_000_000_000)), // 953.67 MiB
        };
        assert_eq!(
            pod.bounds(),
            (Some(Bytes::from_mib(124)), Some(Bytes::from_mib(953)))
        );
        assert_eq!(PodMemory::default().bounds(), (None, None));
    }

    #[test]
    fn a_pod_list_gives_each_running_launchers_memory_by_vm_name() {
        let pods = launcher_pods(include_bytes!("testdata/launcher-pods.json")).unwrap();
        assert!(pods.unreadable.is_empty());
        assert_eq!(
            pods.memory,
            BTreeMap::from([
                // Memory overcommit: its request is below its 2 GiB guest.
                (
                    "default/web".to_string(),
                    PodMemory {
                        request: Some(Bytes(1_502_650_368)),
                        limit: None,
                    },
                ),
                // A VMI with a limit; its pod's hostname differs from its name.
                (
                    "team-a/db".to_string(),
                    PodMemory {
                        request: Some(Bytes::from_mib(4096 + 282)),
                        limit: Some(Bytes(4_500_000_000)),
                    },
                ),
            ]),
            "the finished launcher, the pod without the annotation and the one without a \
             compute container are passed over"
        );
        assert_eq!(
            pods.vms,
            BTreeMap::from([
                (
                    "4f1c2a0e-3b8d-4e61-9d0a-6c2f0b7e9a11".to_string(),
                    "default/web".to_string()
                ),
                (
                    "c2d4e6f8-1a3b-4c5d-8e9f-0a1b2c3d4e5f".to_string(),
                    "team-a/db".to_string()
                ),
            ]),
            "each running launcher's VM by its pod's UID"
        );
    }

    #[test]
    fn two_running_launchers_of_one_vmi_leave_it_out() {
        let pod = |name: &str, request: &str| {
            format!(
                r#"{{"metadata": {{"name": "{name}", "namespace": "ns", "uid": "uid-{name}",
                    "annotations": {{"kubevirt.io/domain": "vm"}}}},
                  "spec": {{"containers": [{{"name": "compute",
                    "resources": {{"requests": {{"memory": "{request}"}}}}}}]}},
                  "status": {{"phase": "Running"}}}}"#
            )
        };
        let json = format!(
            r#"{{"kind": "PodList", "items": [{}, {}]}}"#,
            pod("a", "1Gi"),
            pod("b", "2Gi")
        );
        let pods = launcher_pods(json.as_bytes()).unwrap();
        assert!(pods.memory.is_empty() && pods.unreadable.is_empty());
        assert_eq!(
            pods.vms,
            BTreeMap::from([
                ("uid-a".to_string(), "ns/vm".to_string()),
                ("uid-b".to_string(), "ns/vm".to_string()),
            ]),
            "each pod still runs that VM alone"
        );
        let json = format!(r#"{{"items": [{}]}}"#, pod("a", "1Gi"));
        assert_eq!(launcher_pods(json.as_bytes()).unwrap().memory.len(), 1);
    }

    #[test]
    fn a_bad_list_is_an_error_and_a_pod_of_bad_quantities_is_passed_over() {
        let e = launcher_pods(b"{\"kind\": \"Status\"}")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("not a pod list: missing field `items`"),
            "{e}"
        );
        let pod = |name: &str, limit: &str| {
            format!(
                r#"{{"metadata": {{"name": "{name}", "namespace": "ns",
                    "annotations": {{"kubevirt.io/domain": "{name}"}}}},
                  "spec": {{"containers": [{{"name": "compute",
                    "resources": {{"limits": {{"memory": "{limit}"}}}}}}]}},
                  "status": {{"phase": "Running"}}}}"#
            )
        };
        let json = format!(
            r#"{{"items": [{}, {}]}}"#,
            pod("x", "lots"),
            pod("y", "1Gi")
        );
        let pods = launcher_pods(json.as_bytes()).unwrap();
        assert_eq!(
            pods.memory.keys().collect::<Vec<_>>(),
            ["ns/y"],
            "the other pods keep their bounds"
        );
        assert_eq!(
            pods.unreadable,
            BTreeMap::from([(
                "ns/x".to_string(),
                "limits.memory: bad quantity \"lots\": no number".to_string()
            )])
        );
    }
}
