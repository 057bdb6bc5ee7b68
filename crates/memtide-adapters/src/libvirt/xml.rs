//! What memtide reads from a libvirt domain's XML description (`virDomainGetXMLDesc`).
//!
//! Element names and units as documented in libvirt's domain format
//! (<https://libvirt.org/formatdomain.html#memory-allocation>,
//! `#memory-tuning`, `#memory-balloon-device`, `#channel`).
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

use memtide_core::Bytes;

/// The namespace of memtide's metadata element.
pub const METADATA_NAMESPACE: &str = "urn:memtide:limits:1";

/// The parts of a domain's description memtide uses.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DomainXml {
    /// `<memory>`: the most the balloon can give the guest.
    pub memory: Bytes,
    /// Never balloon below this (`min_guarantee`, else the metadata's `min_mib`).
    pub min: Option<Bytes>,
    /// Never give more than this (the metadata's `max_mib`).
    pub max: Option<Bytes>,
    /// The balloon device, unless the domain has none (`<memballoon model='none'/>`).
    pub balloon: Option<Balloon>,
    /// A virtio channel named `org.qemu.guest_agent.0` is configured.
    pub agent_channel: bool,
}

/// The domain's memory balloon device.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Balloon {
    /// `virtio`, `virtio-transitional`, ...
    pub model: String,
    /// `freePageReporting='on'`: the guest hands freed pages back to the host by itself.
    pub free_page_reporting: bool,
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
        .map(|b| b.attribute("model").unwrap_or(""))
        .filter(|model| *model != "none")
        .map(|model| Balloon {
            model: model.to_string(),
            free_page_reporting: devices
                .and_then(|d| child(d, "memballoon"))
                .and_then(|b| b.attribute("freePageReporting"))
                == Some("on"),
        });
    let agent_channel = devices.is_some_and(|d| {
        d.children().filter(|c| c.has_tag_name("channel")).any(|c| {
            child(c, "target").is_some_and(|t| {
                t.attribute("type") == Some("virtio")
                    && t.attribute("name") == Some("org.qemu.guest_agent.0")
            })
        })
    });
    Ok(DomainXml {
        memory,
        min: min_guarantee.or(mib("min_mib")?),
        max: mib("max_mib")?,
        balloon,
        agent_channel,
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
