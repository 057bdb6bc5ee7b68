//! What memtide reads from a libvirt domain's XML description (`virDomainGetXMLDesc`).
//!
//! Element names and units as documented in libvirt's domain format
//! (<https://libvirt.org/formatdomain.html#memory-allocation>,
//! `#memory-tuning`, `#memory-balloon-device`, `#memory-devices`, `#channel`).
//!
//! Operator bounds come from `<memtune><min_guarantee>` where the driver accepts it
//! (libvirt's QEMU driver refuses it: "Parameter 'min_guarantee' not supported by QEMU"),
//! else from memtide's own metadata element, which any driver keeps:
//!
//! ```xml
//! <metadata>
//!   <memtide:limits xmlns:memtide="urn:memtide:limits:1" min_mib="512" max_mib="4096"/>
//! </metadata>
//! ```

use crate::virtio_mem::Device;
use memtide_core::{Bytes, FixedMemory};
use std::ops::Range;

/// The namespace of memtide's metadata element.
pub const METADATA_NAMESPACE: &str = "urn:memtide:limits:1";

/// The parts of a domain's description memtide uses.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DomainXml {
    /// `<memory>`: the most the guest can have, memory devices included (libvirt adds
    /// their sizes to the NUMA cells').
    pub memory: Bytes,
    /// Never balloon below this (`min_guarantee`, else the metadata's `min_mib`).
    pub min: Option<Bytes>,
    /// Never give more than this (the metadata's `max_mib`).
    pub max: Option<Bytes>,
    /// The balloon device, unless the domain has none (`<memballoon model='none'/>`).
    pub balloon: Option<Balloon>,
    /// A virtio channel named `org.qemu.guest_agent.0` is configured.
    pub agent_channel: bool,
    /// The first virtio-mem device (`<memory model='virtio-mem'>` among the devices).
    pub virtio_mem: Option<VirtioMemDevice>,
    /// Memory no balloon gives back: all of it locked (`<memoryBacking><locked/>`, or a
    /// PCI `<hostdev>`, which VFIO pins whole for its DMA) or in huge pages
    /// (`<memoryBacking><hugepages/>`).
    pub fixed: FixedMemory,
}

impl DomainXml {
    /// The base memory, which the balloon works on: `<memory>` less the virtio-mem
    /// device's maximum.
    pub fn base_memory(&self) -> Bytes {
        self.memory - self.virtio_mem.as_ref().map_or(Bytes::ZERO, |d| d.size)
    }
}

/// The domain's memory balloon device.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Balloon {
    /// `virtio`, `virtio-transitional`, ...
    pub model: String,
    /// `freePageReporting='on'`: the guest hands freed pages back to the host by itself.
    pub free_page_reporting: bool,
    /// `autodeflate='on'`: the balloon gives memory back when the guest runs out
    /// (QEMU's `deflate-on-oom`), so ballooned pages stay in the guest's MemTotal.
    pub autodeflate: bool,
}

/// A virtio-mem device (`<memory model='virtio-mem'>`): memory plugged into the guest in
/// blocks. libvirt writes it as
///
/// ```xml
/// <memory model='virtio-mem'>
///   <target>
///     <size unit='KiB'>524288</size>
///     <node>0</node>
///     <block unit='KiB'>2048</block>
///     <requested unit='KiB'>262144</requested>
///     <current unit='KiB'>262144</current>
///   </target>
///   <alias name='virtiomem0'/>
///   <address type='pci' domain='0x0000' bus='0x00' slot='0x05' function='0x0'/>
/// </memory>
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct VirtioMemDevice {
    /// `<alias name>`: libvirt's name for the running device.
    pub alias: Option<String>,
    /// `<target><node>`: the guest NUMA node it plugs memory into.
    pub node: Option<u32>,
    /// `<target><size>`: the most that can be plugged.
    pub size: Bytes,
    /// `<target><block>`: the plugging granularity.
    pub block: Bytes,
    /// `<target><requested>`: what the guest is asked to plug.
    pub requested: Bytes,
    /// `<target><current>`: what the guest has plugged (a running domain's XML only).
    pub current: Option<Bytes>,
    /// The element as libvirt wrote it, and where `<requested>` stands in it: libvirt
    /// finds the device to update by its address and refuses any change but `requested`.
    element: String,
    requested_at: Range<usize>,
}

impl VirtioMemDevice {
    /// The device's sizes, from a running domain's XML (`None` without `<current>`).
    pub fn live(&self) -> Option<Device> {
        Some(Device {
            plugged: self.current?,
            requested: self.requested,
            max: self.size,
            block: self.block,
        })
    }

    /// The device's XML asking for `requested`, for `virDomainUpdateDeviceFlags`.
    pub fn update_xml(&self, requested: Bytes) -> String {
        let (before, after) = (
            &self.element[..self.requested_at.start],
            &self.element[self.requested_at.end..],
        );
        format!(
            "{before}<requested unit='KiB'>{}</requested>{after}",
            requested.kib()
        )
    }
}

/// A domain description that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum XmlError {
    /// Not XML.
    #[error("domain XML: {0}")]
    Syntax(String),
    /// A size or number that cannot be read.
    #[error("domain XML: {element}: {message}")]
    Value {
        /// The element or attribute.
        element: String,
        /// Why.
        message: String,
    },
}

/// Parse a domain description.
pub fn parse(text: &str) -> Result<DomainXml, XmlError> {
    let doc = roxmltree::Document::parse(text).map_err(|e| XmlError::Syntax(e.to_string()))?;
    let domain = doc.root_element();
    let memory = match child(domain, "memory") {
        Some(m) => size(m)?,
        None => return Err(value_error("memory", "missing")),
    };
    let metadata = child(domain, "metadata").and_then(|m| {
        m.children()
            .find(|c| c.has_tag_name((METADATA_NAMESPACE, "limits")))
    });
    let mib = |name: &str| -> Result<Option<Bytes>, XmlError> {
        match metadata.and_then(|m| m.attribute(name)) {
            Some(v) => v
                .trim()
                .parse::<u64>()
                .map(|n| Some(Bytes::from_mib(n)))
                .map_err(|_| value_error(&format!("memtide:limits {name}"), "not a number of MiB")),
            None => Ok(None),
        }
    };
    let min_guarantee = child(domain, "memtune")
        .and_then(|t| child(t, "min_guarantee"))
        .map(size)
        .transpose()?;
    let devices = child(domain, "devices");
    let balloon = devices
        .and_then(|d| child(d, "memballoon"))
        .filter(|b| b.attribute("model") != Some("none"))
        .map(|b| Balloon {
            model: b.attribute("model").unwrap_or("").to_string(),
            free_page_reporting: b.attribute("freePageReporting") == Some("on"),
            autodeflate: b.attribute("autodeflate") == Some("on"),
        });
    let virtio_mem = devices
        .and_then(|d| {
            d.children()
                .find(|c| c.has_tag_name("memory") && c.attribute("model") == Some("virtio-mem"))
        })
        .map(|m| virtio_mem(text, m))
        .transpose()?;
    let agent_channel = devices.is_some_and(|d| {
        d.children().filter(|c| c.has_tag_name("channel")).any(|c| {
            child(c, "target").is_some_and(|t| {
                t.attribute("type") == Some("virtio")
                    && t.attribute("name") == Some("org.qemu.guest_agent.0")
            })
        })
    });
    let backing = child(domain, "memoryBacking");
    let passthrough = devices.is_some_and(|d| {
        d.children()
            .any(|c| c.has_tag_name("hostdev") && c.attribute("type") == Some("pci"))
    });
    let all_if = |yes: bool| if yes { memory } else { Bytes::ZERO };
    let fixed = FixedMemory {
        locked: all_if(passthrough || backing.and_then(|b| child(b, "locked")).is_some()),
        hugetlb: all_if(backing.and_then(|b| child(b, "hugepages")).is_some()),
        own: None,
    };
    Ok(DomainXml {
        fixed,
        memory,
        min: min_guarantee.or(mib("min_mib")?),
        max: mib("max_mib")?,
        balloon,
        agent_channel,
        virtio_mem,
    })
}

/// A `<memory model='virtio-mem'>` element of the document `text`.
fn virtio_mem(text: &str, memory: roxmltree::Node<'_, '_>) -> Result<VirtioMemDevice, XmlError> {
    let missing = |name: &str| value_error(&format!("virtio-mem {name}"), "missing");
    let target = child(memory, "target").ok_or_else(|| missing("target"))?;
    let sized = |name: &str| child(target, name).ok_or_else(|| missing(name));
    let requested = sized("requested")?;
    let block = size(sized("block")?)?;
    if block == Bytes::ZERO {
        return Err(value_error("virtio-mem block", "zero"));
    }
    let node = child(target, "node")
        .map(|n| n.text().unwrap_or("").trim().parse::<u32>())
        .transpose()
        .map_err(|_| value_error("virtio-mem node", "not a number"))?;
    let start = memory.range().start;
    Ok(VirtioMemDevice {
        alias: child(memory, "alias")
            .and_then(|a| a.attribute("name"))
            .map(str::to_string),
        node,
        size: size(sized("size")?)?,
        block,
        requested: size(requested)?,
        current: child(target, "current").map(size).transpose()?,
        element: text[memory.range()].to_string(),
        requested_at: requested.range().start - start..requested.range().end - start,
    })
}

/// The first child element called `name`.
fn child<'a, 'i>(node: roxmltree::Node<'a, 'i>, name: &str) -> Option<roxmltree::Node<'a, 'i>> {
    node.children().find(|c| c.has_tag_name(name))
}

fn value_error(element: &str, message: &str) -> XmlError {
    XmlError::Value {
        element: element.to_string(),
        message: message.to_string(),
    }
}

/// A size element: its number in its `unit` (KiB when absent).
fn size(node: roxmltree::Node<'_, '_>) -> Result<Bytes, XmlError> {
    let name = node.tag_name().name();
    let n: u64 = node
        .text()
        .unwrap_or("")
        .trim()
        .parse()
        .map_err(|_| value_error(name, "not a number"))?;
    let unit = node.attribute("unit").unwrap_or("KiB");
    let factor: u64 = match unit {
        "b" | "bytes" => 1,
        "KB" => 1000,
        "k" | "KiB" => 1 << 10,
        "MB" => 1000 * 1000,
        "M" | "MiB" => 1 << 20,
        "GB" => 1000 * 1000 * 1000,
        "G" | "GiB" => 1 << 30,
        "TB" => 1000 * 1000 * 1000 * 1000,
        "T" | "TiB" => 1 << 40,
        other => return Err(value_error(name, &format!("unknown unit {other:?}"))),
    };
    Ok(Bytes(n.saturating_mul(factor)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A running domain as libvirt 9.0 described it (`virsh dumpxml`), shortened.
    const RUNNING: &str = r#"<domain type='qemu' id='1'>
  <name>lv1</name>
  <metadata>
    <memtide:limits xmlns:memtide="urn:memtide:limits:1" min_mib="100" max_mib="240"/>
  </metadata>
  <memory unit='KiB'>262144</memory>
  <currentMemory unit='KiB'>204800</currentMemory>
  <devices>
    <channel type='unix'>
      <source mode='bind' path='/tmp/lvt/config/libvirt/qemu/channel/target/domain-1-lv1/org.qemu.guest_agent.0'/>
      <target type='virtio' name='org.qemu.guest_agent.0' state='connected'/>
      <alias name='channel0'/>
    </channel>
    <memballoon model='virtio' freePageReporting='on'>
      <stats period='1'/>
      <alias name='balloon0'/>
    </memballoon>
  </devices>
</domain>"#;

    #[test]
    fn reads_size_limits_balloon_and_agent() {
        let d = parse(RUNNING).unwrap();
        assert_eq!(d.memory, Bytes::from_mib(256));
        assert_eq!(
            (d.min, d.max),
            (Some(Bytes::from_mib(100)), Some(Bytes::from_mib(240)))
        );
        let b = d.balloon.unwrap();
        assert_eq!(b.model, "virtio");
        assert!(b.free_page_reporting);
        assert!(d.agent_channel);
    }

    #[test]
    fn memory_locked_in_huge_pages_or_pinned_for_passthrough_is_fixed() {
        let domain = |inside: &str| {
            format!("<domain><memory unit='MiB'>512</memory>{inside}<devices/></domain>")
        };
        let fixed = |text: &str| parse(text).unwrap().fixed;
        assert_eq!(fixed(&domain("")), FixedMemory::default());
        let huge = fixed(&domain("<memoryBacking><hugepages/></memoryBacking>"));
        assert_eq!(huge.hugetlb, Bytes::from_mib(512));
        let locked = fixed(&domain("<memoryBacking><locked/></memoryBacking>"));
        assert_eq!(locked.locked, Bytes::from_mib(512));
        // A PCI device passed through (VFIO); a USB one pins nothing.
        let vfio = "<domain><memory unit='MiB'>512</memory><devices><hostdev mode='subsystem' \
                    type='pci' managed='yes'><source><address domain='0x0000' bus='0x06' \
                    slot='0x02' function='0x0'/></source></hostdev></devices></domain>";
        assert_eq!(fixed(vfio).locked, Bytes::from_mib(512));
        let usb = vfio.replace("type='pci'", "type='usb'");
        assert_eq!(fixed(&usb), FixedMemory::default());
    }

    /// A running domain with a virtio-mem device as libvirt 9.0 described it, shortened:
    /// 256 MiB in NUMA cell 0, a 512 MiB device with 256 MiB plugged.
    const VIRTIO_MEM: &str = r#"<domain type='qemu' id='1'>
  <name>v</name>
  <maxMemory slots='1' unit='KiB'>1048576</maxMemory>
  <memory unit='KiB'>786432</memory>
  <currentMemory unit='KiB'>524288</currentMemory>
  <cpu mode='custom' match='exact' check='full'>
    <numa>
      <cell id='0' cpus='0' memory='262144' unit='KiB'/>
    </numa>
  </cpu>
  <devices>
    <memballoon model='virtio' autodeflate='on'>
      <stats period='1'/>
      <alias name='balloon0'/>
      <address type='pci' domain='0x0000' bus='0x00' slot='0x04' function='0x0'/>
    </memballoon>
    <memory model='virtio-mem'>
      <target>
        <size unit='KiB'>524288</size>
        <node>0</node>
        <block unit='KiB'>2048</block>
        <requested unit='KiB'>262144</requested>
        <current unit='KiB'>262144</current>
      </target>
      <alias name='virtiomem0'/>
      <address type='pci' domain='0x0000' bus='0x00' slot='0x05' function='0x0'/>
    </memory>
  </devices>
</domain>"#;

    #[test]
    fn reads_the_virtio_mem_device_and_the_base_memory() {
        let d = parse(VIRTIO_MEM).unwrap();
        assert!(d.balloon.as_ref().unwrap().autodeflate);
        assert_eq!(d.memory, Bytes::from_mib(768), "base + the device's size");
        assert_eq!(d.base_memory(), Bytes::from_mib(256));
        let m = d.virtio_mem.unwrap();
        assert_eq!(
            (m.alias.as_deref(), m.node, m.size, m.block),
            (
                Some("virtiomem0"),
                Some(0),
                Bytes::from_mib(512),
                Bytes::from_mib(2)
            )
        );
        assert_eq!(
            m.live(),
            Some(Device {
                plugged: Bytes::from_mib(256),
                requested: Bytes::from_mib(256),
                max: Bytes::from_mib(512),
                block: Bytes::from_mib(2),
            })
        );
        // The domain's definition (`virsh dumpxml --inactive`) has no `<current>`.
        let inactive = VIRTIO_MEM.replace("<current unit='KiB'>262144</current>", "");
        let m = parse(&inactive).unwrap().virtio_mem.unwrap();
        assert_eq!((m.current, m.live()), (None, None));
    }

    #[test]
    fn the_update_keeps_the_device_as_libvirt_wrote_it_but_requested() {
        let m = parse(VIRTIO_MEM).unwrap().virtio_mem.unwrap();
        let update = m.update_xml(Bytes::from_mib(128));
        assert!(
            update.starts_with("<memory model='virtio-mem'>"),
            "{update}"
        );
        assert!(update.ends_with("</memory>"), "{update}");
        assert!(
            update.contains("<address type='pci' domain='0x0000' bus='0x00' slot='0x05'"),
            "libvirt finds the device by its address: {update}"
        );
        let again = parse(&format!(
            "<domain><memory>1</memory><devices>{update}</devices></domain>"
        ))
        .unwrap()
        .virtio_mem
        .unwrap();
        assert_eq!(again.requested, Bytes::from_mib(128));
        assert_eq!((again.size, again.block), (m.size, m.block));
        assert_eq!(again.alias, m.alias);
    }

    #[test]
    fn a_virtio_mem_device_without_its_sizes_is_an_error() {
        let no_block = VIRTIO_MEM.replace("<block unit='KiB'>2048</block>", "");
        assert_eq!(
            parse(&no_block).unwrap_err().to_string(),
            "domain XML: virtio-mem block: missing"
        );
        let zero = VIRTIO_MEM.replace(">2048</block>", ">0</block>");
        assert_eq!(
            parse(&zero).unwrap_err().to_string(),
            "domain XML: virtio-mem block: zero"
        );
        let dimm = "<domain><memory>1</memory><devices><memory model='dimm'>\
                    <target><size>1</size></target></memory></devices></domain>";
        assert_eq!(
            parse(dimm).unwrap().virtio_mem,
            None,
            "a DIMM is not driven"
        );
    }

    #[test]
    fn min_guarantee_wins_over_metadata_and_units_are_honoured() {
        let d = parse(
            "<domain><memory unit='GiB'>2</memory>\
             <memtune><min_guarantee unit='MiB'>300</min_guarantee></memtune>\
             <metadata><limits xmlns='urn:memtide:limits:1' min_mib='100'/></metadata>\
             <devices><memballoon model='none'/><channel type='unix'>\
             <target type='virtio' name='org.qemu.spice.0'/></channel></devices></domain>",
        )
        .unwrap();
        assert_eq!(d.memory, Bytes::from_gib(2));
        assert_eq!(d.min, Some(Bytes::from_mib(300)));
        assert_eq!(d.max, None);
        assert!(d.balloon.is_none(), "model='none' is no balloon");
        assert!(!d.agent_channel, "another channel is not the agent");
        let d = parse("<domain><memory>1024</memory></domain>").unwrap();
        assert_eq!(d.memory, Bytes::from_kib(1024), "KiB when no unit is given");
    }

    #[test]
    fn metadata_in_another_namespace_is_not_ours() {
        let d = parse(
            "<domain><memory>1024</memory><metadata>\
             <limits xmlns='urn:someone:else' min_mib='100'/></metadata></domain>",
        )
        .unwrap();
        assert_eq!(d.min, None);
    }

    #[test]
    fn bad_descriptions_say_what_is_wrong() {
        assert_eq!(
            parse("<domain><memory unit='parsecs'>3</memory></domain>")
                .unwrap_err()
                .to_string(),
            "domain XML: memory: unknown unit \"parsecs\""
        );
        assert_eq!(
            parse("<domain/>").unwrap_err().to_string(),
            "domain XML: memory: missing"
        );
        assert_eq!(
            parse("<domain><memory>1</memory><metadata><memtide:limits xmlns:memtide='urn:memtide:limits:1' min_mib='lots'/></metadata></domain>")
                .unwrap_err()
                .to_string(),
            "domain XML: memtide:limits min_mib: not a number of MiB"
        );
        assert!(parse("<domain>")
            .unwrap_err()
            .to_string()
            .starts_with("domain XML: "));
    }
}
