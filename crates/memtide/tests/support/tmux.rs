//! A terminal program driven in a detached tmux session of its own (its own server
//! socket: a user's tmux is never touched), for full-screen views such as `memtide top`.

use super::wait_for;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// A program running in a detached tmux session; killed on drop.
pub struct Screen {
    server: String,
}

impl Screen {
    /// Run `command` (a shell command line) on a `width` × `height` terminal.
    pub fn start(command: &str, width: u16, height: u16) -> Screen {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let server = format!("memtide-test-{}-{n}", std::process::id());
        let screen = Screen { server };
        let ok = screen
            .tmux()
            .args(["new-session", "-d", "-s", "t", "-x", &width.to_string()])
            .args(["-y", &height.to_string(), command])
            .status()
            .expect("tmux (Debian's tmux package; scripts/test.sh installs it)")
            .success();
        assert!(ok, "tmux new-session failed");
        screen
    }

    fn tmux(&self) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-L", &self.server]);
        c
    }

    /// The screen's text now, one string per line.
    pub fn text(&self) -> String {
        let out = self
            .tmux()
            .args(["capture-pane", "-p", "-t", "t"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Wait until the screen shows what `check` looks for; its text then.
    pub fn wait_until(&self, what: &str, check: impl Fn(&str) -> bool) -> String {
        wait_for(Duration::from_secs(20), || {
            let text = self.text();
            check(&text).then_some(text)
        })
        .unwrap_or_else(|| panic!("the screen never showed {what}:\n{}", self.text()))
    }

    /// Type `keys` (tmux key names: `Enter`, `Escape`, or literal text).
    pub fn keys(&self, keys: &[&str]) {
        let ok = self
            .tmux()
            .args(["send-keys", "-t", "t"])
            .args(keys)
            .status()
            .unwrap()
            .success();
        assert!(ok, "tmux send-keys {keys:?} failed");
    }

    /// Whether the program has ended (its session is gone).
    pub fn ended(&self) -> bool {
        !self
            .tmux()
            .args(["has-session", "-t", "t"])
            .status()
            .unwrap()
            .success()
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = self.tmux().arg("kill-server").status();
    }
}
