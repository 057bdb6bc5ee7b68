//! Text that comes from outside memtide (guest agent errors, hypervisor replies, socket
//! names): bounded and printable before memtide keeps, logs or shows it.

use crate::snapshot::BackendError;

/// The most bytes of outside text kept, marker included.
pub const MAX_LEN: usize = 256;

/// `text` with control characters escaped (ESC becomes `\u{1b}`, a newline `\n`) and cut
/// to at most [`MAX_LEN`] bytes, ending with how many bytes there were when cut. Cleaning
/// clean text changes nothing.
pub fn clean(text: &str) -> String {
    clean_to(text, MAX_LEN)
}

/// [`clean`], cut to at most `max` bytes (at least 64): for memtide's own text that may
/// quote outside text, each quote already cleaned where it came in (an event's message).
pub fn clean_to(text: &str, max: usize) -> String {
    let max = max.max(64);
    let escaped = escape(text);
    if escaped.len() <= max {
        return escaped;
    }
    let marker = format!("… ({} bytes)", text.len());
    let mut end = max - marker.len();
    while !escaped.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = escaped[..end].to_string();
    out.push_str(&marker);
    out
}

/// `error` with its text cleaned.
pub fn clean_error(error: &mut BackendError) {
    match error {
        BackendError::Timeout(_) => {}
        BackendError::Disconnected(text)
        | BackendError::ShutDown(text)
        | BackendError::Protocol(text)
        | BackendError::Io(text)
        | BackendError::Busy(text)
        | BackendError::LeftAlone(text) => *text = clean(text),
    }
}

/// `text` with control characters escaped; not cut.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c.is_control() {
            true => out.extend(c.escape_default()),
            false => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn control_characters_are_escaped_and_long_text_cut() {
        assert_eq!(clean("ok\x1b[2Jgone\r\n"), "ok\\u{1b}[2Jgone\\r\\n");
        let long = "é".repeat(100_000);
        let cut = clean(&long);
        assert!(cut.len() <= MAX_LEN, "{}", cut.len());
        assert!(cut.ends_with("… (200000 bytes)"), "{cut}");
    }

    proptest! {
        #[test]
        fn clean_text_is_bounded_printable_and_stable(text in "(?s).{0,400}") {
            let once = clean(&text);
            prop_assert!(once.len() <= MAX_LEN);
            prop_assert!(!once.chars().any(char::is_control));
            prop_assert_eq!(clean(&once), once);
        }
    }
}
