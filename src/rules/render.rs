//! Rendering values the way apimachinery's `field.Error` prints them (Go `%q`, `%v`, `%#v`).

use std::fmt::Write;

/// A string as Go's `strconv.Quote` prints it: in double quotes, with `"` and `\` escaped and
/// control characters written as escapes. Printable non-ASCII text is kept as is.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A string list as Go's `%#v` prints a `[]string`: `[]string{"a", "b"}`. An empty list prints as
/// a nil slice, `[]string(nil)`, because an absent field (the usual way to be empty) decodes to nil.
pub fn go_string_slice(items: &[String]) -> String {
    if items.is_empty() {
        return "[]string(nil)".to_string();
    }
    let mut out = String::from("[]string{");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(&go_quote(item));
    }
    out.push('}');
    out
}

/// A string list as Go's `%v` prints a `[]string`: `[a b]`.
pub fn go_list(items: &[String]) -> String {
    let mut out = String::from("[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(item);
    }
    out.push(']');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_like_go() {
        assert_eq!(go_quote("v1"), r#""v1""#);
        assert_eq!(go_quote(""), r#""""#);
        assert_eq!(go_quote("a\"b\\c"), r#""a\"b\\c""#);
        assert_eq!(go_quote("a\nb\t\u{0}"), r#""a\nb\t\x00""#);
        assert_eq!(go_quote("é"), "\"é\"");
    }

    #[test]
    fn lists_like_go() {
        let l = vec!["a".to_string(), "b".to_string()];
        assert_eq!(go_string_slice(&l), r#"[]string{"a", "b"}"#);
        assert_eq!(go_string_slice(&[]), "[]string(nil)");
        assert_eq!(go_list(&l), "[a b]");
        assert_eq!(go_list(&[]), "[]");
    }
}
