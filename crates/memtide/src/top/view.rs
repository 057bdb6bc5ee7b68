//! Drawing `memtide top`: a header (the daemon and the host), the VM table, the selected
//! VM's history and full reason, and the keys.

use super::model::{self, Top, HISTORY};
use memtide_core::Bytes;
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Paragraph, Row, Table, TableState, Wrap};
use ratatui::Frame;

fn size(b: Option<Bytes>) -> String {
    b.map_or_else(|| "-".into(), |b| format!("{:.0}", b.as_f64() / 1048576.0))
}

/// Draw the whole screen.
pub fn draw(frame: &mut Frame, top: &Top) {
    let [header, table, detail, keys] = Layout::vertical([
        Constraint::Length(2),
        Constraint::Min(4),
        Constraint::Length(5),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    frame.render_widget(Paragraph::new(header_lines(top)), header);
    let mut state = TableState::default().with_selected(Some(top.selected));
    frame.render_stateful_widget(vm_table(top), table, &mut state);
    frame.render_widget(detail_view(top), detail);
    let typing = if top.editing {
        " (typing: Enter to apply, Esc to clear)"
    } else {
        ""
    };
    let help = format!(
        "q quit · ↑↓ select · s sort ({}) · / filter, Esc clear{typing}",
        top.sort.name()
    );
    frame.render_widget(
        Paragraph::new(help).style(Style::new().add_modifier(Modifier::DIM)),
        keys,
    );
}

fn header_lines(top: &Top) -> Vec<Line<'static>> {
    let Some(s) = &top.status else {
        let why = top
            .error
            .clone()
            .unwrap_or_else(|| "waiting for the daemon".into());
        return vec![Line::from(format!("memtide top · {why}"))];
    };
    let policy = s.decision.as_ref().map_or("-", |d| d.policy.as_str());
    let mut first = format!(
        "memtide {} · policy {policy} · every {} s · last tick {:.0} ms",
        s.version, s.interval_s, s.last_tick_ms
    );
    if !top.filter.is_empty() || top.editing {
        first.push_str(&format!(" · filter: {}", top.filter));
    }
    let second = match (&top.error, &s.decision) {
        (Some(e), _) => format!("daemon unreachable: {e} (showing the last status)"),
        (None, Some(d)) => {
            let mut line = format!(
                "host: {:.0} MiB, {:.0} MiB freeable ({:.1}%) · {} VM{}",
                d.host.total.as_f64() / 1048576.0,
                d.host.freeable.as_f64() / 1048576.0,
                d.host.free_ratio * 100.0,
                d.vms.len(),
                if d.vms.len() == 1 { "" } else { "s" }
            );
            if let Some(n) = d.host.need {
                line += &format!(" · need {}", n.level.name());
            }
            if s.host_error.is_some() {
                line += " · HOST UNREADABLE: no decisions (memtide status)";
            }
            if s.policy_error.is_some() {
                line += " · POLICY RELOAD REJECTED (memtide status)";
            }
            let waiting = top.not_connected();
            if !waiting.is_empty() {
                line += &format!(" · not connected: {}", waiting.join(", "));
            }
            let asleep: Vec<&str> = s
                .hibernated
                .iter()
                .map(|h| h.vm.as_str())
                .filter(|vm| vm.contains(top.filter.as_str()))
                .collect();
            if !asleep.is_empty() {
                line += &format!(" · hibernated: {}", asleep.join(", "));
            }
            line
        }
        (None, None) => "no decision yet".into(),
    };
    vec![
        Line::from(first).style(Style::new().add_modifier(Modifier::BOLD)),
        Line::from(second),
    ]
}

fn vm_table(top: &Top) -> Table<'static> {
    let rows = top.vms().into_iter().map(|vm| {
        let history: Vec<model::Point> = top.history(&vm.name).copied().collect();
        let full = vm.configured.unwrap_or(vm.max);
        let spark: Vec<Span> = model::sparkline(&history, full)
            .into_iter()
            .map(|(c, short)| {
                let colour = if short { Color::Red } else { Color::Green };
                Span::styled(c.to_string(), Style::new().fg(colour))
            })
            .collect();
        let reason = vm
            .reason
            .as_ref()
            .map_or(String::new(), |r| r.rule.to_string());
        Row::new(vec![
            Cell::from(vm.name.clone()),
            Cell::from(vm.state.name()),
            Cell::from(size(vm.actual)),
            Cell::from(size(vm.estimate)),
            Cell::from(size(vm.used)),
            Cell::from(size(vm.rss)),
            Cell::from(
                vm.swap_in_per_s
                    .map_or("-".into(), |r| format!("{:.1}", r / 1048576.0)),
            ),
            Cell::from(Line::from(spark)),
            Cell::from(reason),
        ])
    });
    let header = Row::new([
        "VM",
        "STATE",
        "ACTUAL",
        "ESTIMATE",
        "USED",
        "RSS",
        "SWAPIN",
        "ACTUAL (red: short)",
        "REASON",
    ])
    .style(Style::new().add_modifier(Modifier::BOLD));
    Table::new(
        rows,
        [
            Constraint::Min(12),
            Constraint::Length(11),
            Constraint::Length(7),
            Constraint::Length(8),
            Constraint::Length(7),
            Constraint::Length(7),
            Constraint::Length(7),
            Constraint::Length(HISTORY as u16),
            Constraint::Min(16),
        ],
    )
    .header(header)
    .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED))
    .block(Block::bordered().title(" VMs (MiB; swap-in MiB/s) "))
}

fn detail_view(top: &Top) -> Paragraph<'static> {
    let Some(vm) = top.selected_vm() else {
        return Paragraph::new("no VM").block(Block::bordered());
    };
    let reason = vm
        .reason
        .as_ref()
        .map_or_else(|| "no decision".into(), |r| r.to_string());
    let target = match vm.target {
        Some(_) => format!("{} MiB", size(vm.target)),
        None => "none in force".into(),
    };
    let bounds = format!(
        "configured {} MiB · min {} MiB · max {} MiB · target {target}",
        size(vm.configured),
        size(Some(vm.min)),
        size(Some(vm.max)),
    );
    Paragraph::new(vec![Line::from(bounds), Line::from(reason)])
        .wrap(Wrap { trim: true })
        .block(Block::bordered().title(format!(" {} ", vm.name)))
}
