//! The `libvirt_xml` target of `memtide-fuzz` under libFuzzer.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| (memtide_fuzz::target("libvirt_xml").expect("a target").run)(data));
