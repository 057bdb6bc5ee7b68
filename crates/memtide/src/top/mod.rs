//! `memtide top`: a full-screen live view of the running daemon, refreshed every tick
//! from its control socket: each VM's size, working set, use and host memory, the rule of
//! its last decision, its recent history, sortable and filterable.

mod model;
mod view;

use crate::{control, render};
use anyhow::Context;
use model::Top;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::runtime::Handle;

/// Show the daemon behind `socket` until the user quits. Fails before taking the
/// terminal when there is none (run from cron, or over ssh without `-t`) or the daemon
/// cannot be reached at all.
pub async fn run(socket: PathBuf) -> anyhow::Result<()> {
    if !(std::io::stdin().is_terminal() && std::io::stdout().is_terminal()) {
        anyhow::bail!(
            "memtide top needs a terminal on its input and output (over ssh: ssh -t); \
             memtide status (--json) prints the same once"
        );
    }
    let first = control::request_status(&socket).await?;
    let handle = Handle::current();
    tokio::task::spawn_blocking(move || show(&handle, &socket, first)).await?
}

fn show(handle: &Handle, socket: &Path, first: crate::status::Status) -> anyhow::Result<()> {
    let mut top = Top::default();
    let mut every = refresh_interval(&first);
    top.update(render::printable(&first));
    let mut terminal = ratatui::try_init().context("cannot take the terminal")?;
    let result = (|| -> anyhow::Result<()> {
        let mut next = Instant::now() + every;
        loop {
            terminal.draw(|f| view::draw(f, &top))?;
            let wait = next.saturating_duration_since(Instant::now());
            if event::poll(wait)? {
                if let Event::Key(key) = event::read()? {
                    if key.kind == KeyEventKind::Press
                        && !handle_key(&mut top, key.code, key.modifiers)
                    {
                        return Ok(());
                    }
                }
                continue;
            }
            // Keys wait while the status is fetched: a daemon that hangs is shown as
            // unreachable within a few seconds, and q still quits.
            let fetched = control::request_status_within(socket, REFRESH_WAIT);
            match handle.block_on(fetched) {
                Ok(status) => {
                    every = refresh_interval(&status);
                    top.update(render::printable(&status));
                }
                Err(e) => top.error = Some(format!("{e:#}")),
            }
            next = Instant::now() + every;
        }
    })();
    ratatui::restore();
    result
}

/// How long a refresh waits for the daemon's status.
const REFRESH_WAIT: Duration = Duration::from_secs(3);

/// The daemon's interval, within 0.2 to 10 s.
fn refresh_interval(status: &crate::status::Status) -> Duration {
    Duration::from_secs_f64(status.interval_s.clamp(0.2, 10.0))
}

/// Apply a key; false to quit.
fn handle_key(top: &mut Top, code: KeyCode, modifiers: KeyModifiers) -> bool {
    if code == KeyCode::Char('c') && modifiers.contains(KeyModifiers::CONTROL) {
        return false;
    }
    if top.editing {
        match code {
            KeyCode::Enter => top.editing = false,
            KeyCode::Esc => {
                top.editing = false;
                top.filter.clear();
            }
            KeyCode::Backspace => {
                top.filter.pop();
            }
            KeyCode::Char(c) => top.filter.push(c),
            _ => {}
        }
        top.select(0);
        return true;
    }
    match code {
        KeyCode::Char('q') => return false,
        KeyCode::Esc => top.filter.clear(),
        KeyCode::Char('s') => top.next_sort(),
        KeyCode::Char('/') => top.editing = true,
        KeyCode::Up | KeyCode::Char('k') => top.select(-1),
        KeyCode::Down | KeyCode::Char('j') => top.select(1),
        _ => {}
    }
    true
}
