//! The `firecracker` target of `memtide-fuzz` under libFuzzer.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| (memtide_fuzz::target("firecracker").expect("a target").run)(data));
