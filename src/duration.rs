//! The one grammar for durations and times on the command line, shared by every subcommand
//! (`serve`, `check`, `audit`) and by the chart's values schema.
//!
//! A duration is `0`, or one or more `<number><unit>` parts with no spaces: `30s`, `5m`,
//! `1m30s`, `1.5h`, `500ms`. The number is decimal digits with an optional fraction; the units
//! are `h`, `m`, `s`, `ms`, `us` (or `µs`, either micro sign) and `ns`. This is Go's `time.ParseDuration` without a
//! sign, so it reads like every other Kubernetes component's flags. [`SCHEMA_PATTERN`] is the same
//! grammar as a regular expression (the chart's `values.schema.json` uses it; a test keeps them
//! equal).

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

/// [`parse_duration`]'s grammar as a regular expression (JSON Schema / ECMA-262 syntax).
pub const SCHEMA_PATTERN: &str = "^(0|([0-9]+(\\.[0-9]+)?(ns|us|\u{b5}s|\u{3bc}s|ms|s|m|h))+)$";

const UNITS: &str = "h, m, s, ms, us, ns";

/// Parses a duration (see the module documentation). The error names the text and what is wrong.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = |why: String| format!("{text:?} is not a duration like 30s, 1m30s or 500ms: {why}");
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err(bad("it is empty".to_string()));
    }
    let mut total: u128 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let int_len = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (int, after) = rest.split_at(int_len);
        if int.is_empty() {
            return Err(bad(format!("expected a number at {rest:?}")));
        }
        let (frac, after) = match after.strip_prefix('.') {
            Some(f) => {
                let len = f.find(|c: char| !c.is_ascii_digit()).unwrap_or(f.len());
                if len == 0 {
                    return Err(bad(format!("expected digits after the point in {rest:?}")));
                }
                f.split_at(len)
            }
            None => ("", after),
        };
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let nanos_per_unit: u128 = match unit {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(bad(format!("{int} has no unit ({UNITS})"))),
            other => return Err(bad(format!("unknown unit {other:?} (use {UNITS})"))),
        };
        let too_long = || bad("too long".to_string());
        let whole: u128 = int.parse().map_err(|_| too_long())?;
        let mut part = whole.checked_mul(nanos_per_unit).ok_or_else(too_long)?;
        if !frac.is_empty() {
            // At most 18 fraction digits matter (ns of an hour need 13); the rest are ignored.
            let digits = &frac[..frac.len().min(18)];
            let scale = 10u128.pow(digits.len() as u32);
            let f: u128 = digits.parse().map_err(|_| too_long())?;
            part = part
                .checked_add(f * nanos_per_unit / scale)
                .ok_or_else(too_long)?;
        }
        total = total.checked_add(part).ok_or_else(too_long)?;
        rest = next;
    }
    let secs = u64::try_from(total / 1_000_000_000).map_err(|_| bad("too long".to_string()))?;
    Ok(Duration::new(secs, (total % 1_000_000_000) as u32))
}

/// Like [`parse_duration`], but zero is refused.
pub fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d.is_zero() {
        return Err(format!("{text:?}: must be more than zero"));
    }
    Ok(d)
}

/// A positive duration of whole seconds (the Lease API counts in seconds).
pub fn parse_whole_seconds(text: &str) -> Result<Duration, String> {
    let d = parse_positive_duration(text)?;
    if d.subsec_nanos() != 0 {
        return Err(format!(
            "{text:?} must be whole seconds (the Lease API counts in seconds)"
        ));
    }
    Ok(d)
}

/// Parses `--now`: an RFC 3339 time.
pub fn parse_now(text: &str) -> Result<Timestamp, String> {
    text.parse::<Timestamp>()
        .map_err(|e| format!("{text:?} is not an RFC 3339 time like 2026-01-02T03:04:05Z: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Texts in the grammar, with their value.
    pub(crate) const GOOD: &[(&str, Duration)] = &[
        ("0", Duration::ZERO),
        ("0s", Duration::ZERO),
        ("30s", Duration::from_secs(30)),
        ("5m", Duration::from_secs(300)),
        ("1h", Duration::from_secs(3600)),
        ("1m30s", Duration::from_secs(90)),
        ("1h30m", Duration::from_secs(5400)),
        ("1.5h", Duration::from_secs(5400)),
        ("1.5s", Duration::from_millis(1500)),
        ("500ms", Duration::from_millis(500)),
        ("250us", Duration::from_micros(250)),
        ("250\u{b5}s", Duration::from_micros(250)),
        ("250\u{3bc}s", Duration::from_micros(250)),
        ("7ns", Duration::from_nanos(7)),
        ("0.000000001s", Duration::from_nanos(1)),
        ("2h45m30s100ms", Duration::from_millis(9_930_100)),
    ];

    /// Texts outside it.
    pub(crate) const BAD: &[&str] = &[
        "", "30", "s", "3x", "1.2.3s", "-1s", "+1s", "ms5", " 2s", "2s ", "1 m", ".5s", "1.s",
        "1d", "5min", "1h 30m", "00",
    ];

    #[test]
    fn grammar() {
        for &(text, want) in GOOD {
            assert_eq!(parse_duration(text), Ok(want), "{text:?}");
        }
        for &text in BAD {
            let e = parse_duration(text).expect_err(text);
            assert!(e.contains(&format!("{text:?}")), "{e}");
        }
        assert!(parse_positive_duration("0s").is_err());
        assert_eq!(parse_positive_duration("1ms"), Ok(Duration::from_millis(1)));
        assert_eq!(parse_whole_seconds("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_whole_seconds("1500ms").is_err());
        assert!(parse_whole_seconds("0").is_err());
        assert!(parse_now("2025-06-01T12:00:00Z").is_ok());
        assert!(parse_now("2025-06-01T12:00:00.123456+02:00").is_ok());
        assert!(parse_now("yesterday").is_err());
        assert!(parse_now("2025-06-01").is_err());
        // In the grammar, but too long for a Duration: an error, not a panic or a wrap.
        assert!(parse_duration("99999999999999999999999h").is_err());
        assert!(parse_duration(&"9".repeat(10_000)).is_err());
    }

    /// The chart's values schema checks durations with the same grammar as the binary.
    #[test]
    fn chart_schema_uses_the_grammar() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/charts/storageversion-webhook/values.schema.json"
        );
        let schema: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).expect(path)).expect(path);
        assert_eq!(schema["$defs"]["duration"]["pattern"], SCHEMA_PATTERN);
        let pattern = regex::Regex::new(SCHEMA_PATTERN).expect("SCHEMA_PATTERN");
        for &(text, _) in GOOD {
            assert!(
                pattern.is_match(text),
                "{text:?} parses but the schema refuses it"
            );
        }
        for &text in BAD {
            assert!(
                !pattern.is_match(text),
                "{text:?} is refused but the schema accepts it"
            );
        }
        // Whole seconds (leader Lease timing) are a narrower pattern; all it accepts must parse.
        let whole = schema["$defs"]["nullableWholeSeconds"]["anyOf"][1]["pattern"]
            .as_str()
            .expect("nullableWholeSeconds pattern");
        let whole = regex::Regex::new(whole).expect("whole-seconds pattern");
        for text in ["15s", "1m", "1h2m3s"] {
            assert!(whole.is_match(text));
            assert!(parse_whole_seconds(text).is_ok(), "{text}");
        }
    }
}
