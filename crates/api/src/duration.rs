//! Durations given on the command line, as people write them (`15s`, `30m`, `6h`, `1h30m`),
//! read with jiff's friendly format (ISO 8601 `PT6H` too); a bare number is seconds.

use std::time::Duration;

use jiff::SignedDuration;

/// Reads `text` as a duration within `min..=max`, or says what is wrong with it.
pub fn parse_bounded(text: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    let trimmed = text.trim();
    let signed = if !trimmed.is_empty() && trimmed.bytes().all(|b| b.is_ascii_digit()) {
        let secs: i64 = trimmed
            .parse()
            .map_err(|_| format!("{text:?} is too many seconds"))?;
        SignedDuration::from_secs(secs)
    } else {
        trimmed
            .parse::<SignedDuration>()
            .map_err(|e| format!("{text:?} is not a duration like 15s, 30m or 6h: {e}"))?
    };
    let d = Duration::try_from(signed).map_err(|_| format!("{text:?} is negative"))?;
    if d < min || d > max {
        return Err(format!(
            "{text:?} is outside {} to {}",
            friendly(min),
            friendly(max)
        ));
    }
    Ok(d)
}

/// `d` as the friendly format writes it (`1h 30m`).
fn friendly(d: Duration) -> String {
    SignedDuration::try_from(d).map_or_else(|_| format!("{d:?}"), |s| format!("{s:#}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn durations_read_as_people_write_them() {
        let any = |t: &str| parse_bounded(t, Duration::ZERO, Duration::from_secs(86_400 * 30));
        assert_eq!(any("15s"), Ok(15 * S));
        assert_eq!(any("30m"), Ok(1800 * S));
        assert_eq!(any("6h"), Ok(6 * 3600 * S));
        assert_eq!(any("1h30m"), Ok(5400 * S));
        assert_eq!(any("1h 30m"), Ok(5400 * S));
        assert_eq!(any("PT2M"), Ok(120 * S));
        assert_eq!(any("90"), Ok(90 * S));
        assert_eq!(any("0s"), Ok(Duration::ZERO));
        assert_eq!(any("1.5s"), Ok(Duration::from_millis(1500)));
    }

    #[test]
    fn what_is_not_a_duration_or_out_of_range_says_so() {
        let lease = |t: &str| parse_bounded(t, 5 * S, 300 * S);
        assert_eq!(lease("5s"), Ok(5 * S));
        assert_eq!(lease("5m"), Ok(300 * S));
        for (text, says) in [
            ("4s", "outside 5s to 5m"),
            ("6m", "outside 5s to 5m"),
            ("-10s", "negative"),
            ("ten", "not a duration"),
            ("", "not a duration"),
            ("10 parsecs", "not a duration"),
            ("99999999999999999999", "too many seconds"),
        ] {
            let err = lease(text).unwrap_err();
            assert!(err.contains(says), "{text:?}: {err}");
        }
    }
}
