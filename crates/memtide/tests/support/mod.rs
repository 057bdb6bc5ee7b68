//! Test fixtures that start real things: QEMU guests in a memory cgroup of their own,
//! a libvirt daemon of the test's own, and the memtide daemon. Everything started is
//! stopped and removed on drop.

#![allow(dead_code)] // each test binary uses a different part of the support code

pub mod cgroup;
pub mod daemon;
pub mod guest;
pub mod libvirtd;

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The built test guest (`guest/build.sh`; `$MEMTIDE_GUEST_DIR` or target/guest): its
/// directory, or a panic saying how to build it.
pub fn guest_dir() -> PathBuf {
    memtide_testbed::guest_dir(None)
        .unwrap_or_else(|e| panic!("{e} (or scripts/test.sh, which does)"))
}

/// Poll `check` every 200 ms until it yields a value or `limit` passes.
pub fn wait_for<T>(limit: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + limit;
    loop {
        if let Some(v) = check() {
            return Some(v);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Send a signal by name (`STOP`, `CONT`, `KILL`, `TERM`) to a process.
pub fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(ok.success(), "kill -{sig} {pid} failed");
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// GET a path from a local HTTP server; returns the body.
pub fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "GET {path}: {head}");
    body.to_string()
}
pub mod harness;
