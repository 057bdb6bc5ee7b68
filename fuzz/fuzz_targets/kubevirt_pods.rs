//! The `kubevirt_pods` target of `memtide-fuzz` under libFuzzer.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| (memtide_fuzz::target("kubevirt_pods").expect("a target").run)(data));
