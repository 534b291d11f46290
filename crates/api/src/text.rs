//! Text another writer wrote (a node's agent, a GPU driver, Kueue, a failed container), made
//! safe to show: cut to a bound, with control characters and bidirectional overrides replaced,
//! so it can neither bloat a status nor steer a terminal.

/// Longest piece of agent-written text (an error from the node) copied into a decision's
/// reasons; the rest is cut, so a node cannot bloat every job's status.
pub const MAX_NODE_TEXT: usize = 200;

/// Cuts `text` to at most [`MAX_NODE_TEXT`] characters, marking the cut, with control
/// characters (escape, bell, …) and bidirectional overrides replaced by `�`: text a node wrote
/// reaches conditions and terminals, and must not steer either.
pub fn bounded(text: &str) -> String {
    bounded_to(text, MAX_NODE_TEXT)
}

/// [`bounded`] with another limit, for text of other writers (Kueue's messages).
pub fn bounded_to(text: &str, max: usize) -> String {
    let safe = |c: char| {
        let bidi = matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}');
        if c.is_control() || bidi {
            '\u{FFFD}'
        } else {
            c
        }
    };
    let mut cut: String = text.chars().take(max).map(safe).collect();
    if text.chars().count() > max {
        cut.push('…');
    }
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_from_a_node_is_bounded() {
        let long = "x".repeat(200_000);
        let cut = bounded(&long);
        assert_eq!(cut.chars().count(), MAX_NODE_TEXT + 1);
        assert_eq!(bounded("short"), "short");
        // Escape, bell and a right-to-left override, as a node's report once carried them into
        // profile conditions.
        assert_eq!(
            bounded("ok\u{1b}[31mred\u{7}\u{202e}evil"),
            "ok\u{FFFD}[31mred\u{FFFD}\u{FFFD}evil"
        );
    }
}
