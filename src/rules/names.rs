//! apimachinery's name and version string checks, with upstream's exact messages (docs/upstream.md §2.1,
//! §2.4 and §2.6).
//!
//! Each check comes twice: a `matches_*`/`is_*` predicate that never allocates (the hot path asks
//! only "is it valid?"), and a function returning upstream's messages, which allocates only when
//! the value is invalid. The matchers are hand-written byte loops equivalent to apimachinery's
//! anchored regular expressions, so nothing is compiled per call. Length checks and pattern checks
//! are independent, exactly as upstream: a value can get both messages.

/// `utilvalidation.EmptyError()`.
pub const EMPTY_MSG: &str = "must be non-empty";
/// Longest DNS-1123 subdomain.
pub const DNS1123_SUBDOMAIN_MAX_LENGTH: usize = 253;
/// Longest DNS-1035 label.
pub const DNS1035_LABEL_MAX_LENGTH: usize = 63;
/// Longest name part of a qualified name.
pub const QUALIFIED_NAME_MAX_LENGTH: usize = 63;

/// `MaxLenError(253)`.
pub const SUBDOMAIN_TOO_LONG_MSG: &str = "must be no more than 253 characters";
/// `MaxLenError(63)`.
pub const LABEL_TOO_LONG_MSG: &str = "must be no more than 63 characters";

/// The regex message of `IsDNS1123Subdomain`.
pub const DNS1123_SUBDOMAIN_MSG: &str = r"a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

/// The regex message of `IsDNS1035Label` (note the double space before `or`).
pub const DNS1035_LABEL_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";

/// The regex message of the name part of `IsQualifiedName` (without the `name part ` prefix).
pub const QUALIFIED_NAME_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

/// `IsQualifiedName`'s single message for a value with more than one `/`.
pub const QUALIFIED_NAME_TOO_MANY_PARTS_MSG: &str = "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')";

/// The StorageVersion API-version check's single message for a value with more than one `/`
/// (docs/upstream.md §2.6: note ", which" and the double space before `or`).
pub const API_VERSION_TOO_MANY_PARTS_MSG: &str = "an apiVersion is a DNS-1035 label, which must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyVersion')";

fn is_lower_alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, anchored.
fn matches_dns1123_label_pattern(s: &[u8]) -> bool {
    ends_and_body(s, is_lower_alnum, is_lower_alnum, |b| {
        is_lower_alnum(b) || b == b'-'
    })
}

/// Whether `s` is not empty, its first byte passes `first`, its last `last`, and every byte
/// `body` (the shape of every pattern here: `F(B*L)?` with single-byte classes).
fn ends_and_body(
    s: &[u8],
    first: impl Fn(u8) -> bool,
    last: impl Fn(u8) -> bool,
    body: impl Fn(u8) -> bool,
) -> bool {
    match (s.first(), s.last()) {
        (Some(&f), Some(&l)) => first(f) && last(l) && s.iter().all(|&b| body(b)),
        _ => false,
    }
}

/// The length message (when `too_long`) and the pattern message (unless `matches`),
/// independently, as apimachinery reports them.
fn length_and_pattern(
    too_long: bool,
    too_long_msg: &'static str,
    matches: bool,
    pattern_msg: &'static str,
) -> Vec<&'static str> {
    [(too_long, too_long_msg), (!matches, pattern_msg)]
        .into_iter()
        .filter_map(|(bad, msg)| bad.then_some(msg))
        .collect()
}

/// The DNS-1123 subdomain pattern (dot-separated DNS-1123 labels), ignoring length.
pub fn matches_dns1123_subdomain(s: &str) -> bool {
    s.as_bytes()
        .split(|&b| b == b'.')
        .all(matches_dns1123_label_pattern)
}

/// The DNS-1035 label pattern `[a-z]([-a-z0-9]*[a-z0-9])?`, ignoring length.
pub fn matches_dns1035_label(s: &str) -> bool {
    ends_and_body(
        s.as_bytes(),
        |b| b.is_ascii_lowercase(),
        is_lower_alnum,
        |b| is_lower_alnum(b) || b == b'-',
    )
}

/// The name-part pattern of a qualified name `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`.
fn matches_qualified_name_part(s: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_alphanumeric();
    ends_and_body(s.as_bytes(), alnum, alnum, |b| {
        alnum(b) || matches!(b, b'-' | b'_' | b'.')
    })
}

/// True when [`dns1123_subdomain`] has nothing to say.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= DNS1123_SUBDOMAIN_MAX_LENGTH && matches_dns1123_subdomain(s)
}

/// `IsDNS1123Subdomain`: the length message and the regex message, independently.
pub fn dns1123_subdomain(s: &str) -> Vec<&'static str> {
    length_and_pattern(
        s.len() > DNS1123_SUBDOMAIN_MAX_LENGTH,
        SUBDOMAIN_TOO_LONG_MSG,
        matches_dns1123_subdomain(s),
        DNS1123_SUBDOMAIN_MSG,
    )
}

/// True when [`dns1035_label`] has nothing to say.
pub fn is_dns1035_label(s: &str) -> bool {
    s.len() <= DNS1035_LABEL_MAX_LENGTH && matches_dns1035_label(s)
}

/// `IsDNS1035Label`: the length message and the regex message, independently.
pub fn dns1035_label(s: &str) -> Vec<&'static str> {
    length_and_pattern(
        s.len() > DNS1035_LABEL_MAX_LENGTH,
        LABEL_TOO_LONG_MSG,
        matches_dns1035_label(s),
        DNS1035_LABEL_MSG,
    )
}

/// How a value splits at `/`: one part, two parts, or more.
enum Slashes<'a> {
    One(&'a str),
    Two(&'a str, &'a str),
    More,
}

fn split_slashes(s: &str) -> Slashes<'_> {
    match s.split_once('/') {
        None => Slashes::One(s),
        Some((_, rest)) if rest.contains('/') => Slashes::More,
        Some((a, b)) => Slashes::Two(a, b),
    }
}

/// The part after the one optional `/` of `s` when the part before it (if any) is a DNS-1123
/// subdomain; `None` otherwise, or with more than one `/`.
fn after_valid_prefix(s: &str) -> Option<&str> {
    match split_slashes(s) {
        Slashes::One(rest) => Some(rest),
        Slashes::Two(prefix, rest) => is_dns1123_subdomain(prefix).then_some(rest),
        Slashes::More => None,
    }
}

/// The part after the one optional `/` of `s`, with what is wrong with the part before it (a
/// DNS-1123 subdomain, each message prefixed `label`) added to `errs`; `None` with more than one
/// `/`.
fn after_checked_prefix<'a>(s: &'a str, label: &str, errs: &mut Vec<String>) -> Option<&'a str> {
    let (prefix, rest) = match split_slashes(s) {
        Slashes::One(rest) => return Some(rest),
        Slashes::Two(prefix, rest) => (prefix, rest),
        Slashes::More => return None,
    };
    part_errors(prefix, label, dns1123_subdomain, errs);
    Some(rest)
}

/// `check`'s messages about `part`, each prefixed `label`, added to `errs`; the empty-part
/// message when `part` is empty.
fn part_errors(
    part: &str,
    label: &str,
    check: fn(&str) -> Vec<&'static str>,
    errs: &mut Vec<String>,
) {
    if part.is_empty() {
        errs.push(format!("{label}{EMPTY_MSG}"));
    } else {
        errs.extend(check(part).into_iter().map(|m| format!("{label}{m}")));
    }
}

/// True when [`qualified_name`] has nothing to say.
pub fn is_qualified_name(s: &str) -> bool {
    after_valid_prefix(s).is_some_and(|name| {
        name.len() <= QUALIFIED_NAME_MAX_LENGTH && matches_qualified_name_part(name)
    })
}

/// `IsQualifiedName`: an optional DNS-1123 subdomain prefix and `/`, then a name of 1-63
/// characters. Messages are prefixed `prefix part ` and `name part `.
pub fn qualified_name(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let Some(name) = after_checked_prefix(s, "prefix part ", &mut errs) else {
        return vec![QUALIFIED_NAME_TOO_MANY_PARTS_MSG.to_string()];
    };
    if name.is_empty() {
        errs.push(format!("name part {EMPTY_MSG}"));
    } else if name.len() > QUALIFIED_NAME_MAX_LENGTH {
        errs.push(format!("name part {LABEL_TOO_LONG_MSG}"));
    }
    if !matches_qualified_name_part(name) {
        errs.push(format!("name part {QUALIFIED_NAME_MSG}"));
    }
    errs
}

/// True when [`api_version`] has nothing to say.
pub fn is_api_version(s: &str) -> bool {
    after_valid_prefix(s).is_some_and(is_dns1035_label)
}

/// The StorageVersion API-version string check (docs/upstream.md §2.6): `version` or `group/version`, the
/// group a DNS-1123 subdomain and the version a DNS-1035 label. Messages are prefixed
/// `group part: ` and `version part: `; upstream joins them with `,` for one field error.
pub fn api_version(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let Some(version) = after_checked_prefix(s, "group part: ", &mut errs) else {
        return vec![API_VERSION_TOO_MANY_PARTS_MSG.to_string()];
    };
    part_errors(version, "version part: ", dns1035_label, &mut errs);
    errs
}

/// The API group of a GroupVersion string: the part before `/`, or `""` (core) without one.
pub fn api_version_group(s: &str) -> &str {
    s.split_once('/').map_or("", |(group, _)| group)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subdomain_accepts_and_rejects() {
        for ok in [
            "a",
            "core",
            "k8s.io",
            "authentication.k8s.io",
            "a-b.c-d",
            "0",
            "9a",
        ] {
            assert!(is_dns1123_subdomain(ok), "{ok}");
            assert!(dns1123_subdomain(ok).is_empty(), "{ok}");
        }
        for bad in [
            "", ".", "a.", ".a", "a..b", "-a", "a-", "A", "a_b", "a.-b", "é", "a\n",
        ] {
            assert!(!is_dns1123_subdomain(bad), "{bad:?}");
            assert_eq!(
                dns1123_subdomain(bad),
                vec![DNS1123_SUBDOMAIN_MSG],
                "{bad:?}"
            );
        }
    }

    #[test]
    fn subdomain_length_and_pattern_are_independent() {
        let long_ok = "x".repeat(253);
        assert!(dns1123_subdomain(&long_ok).is_empty());
        let too_long = "x".repeat(254);
        assert_eq!(dns1123_subdomain(&too_long), vec![SUBDOMAIN_TOO_LONG_MSG]);
        let too_long_and_bad = format!("{}-", "x".repeat(254));
        assert_eq!(
            dns1123_subdomain(&too_long_and_bad),
            vec![SUBDOMAIN_TOO_LONG_MSG, DNS1123_SUBDOMAIN_MSG]
        );
        assert!(!is_dns1123_subdomain(&too_long));
    }

    #[test]
    fn dns1035_label_checks() {
        for ok in ["a", "v1", "v1beta1", "my-name", "pods"] {
            assert!(is_dns1035_label(ok), "{ok}");
        }
        for bad in ["", "1a", "-a", "a-", "A", "a.b", "v2_"] {
            assert!(!is_dns1035_label(bad), "{bad:?}");
            assert_eq!(dns1035_label(bad), vec![DNS1035_LABEL_MSG], "{bad:?}");
        }
        assert!(dns1035_label(&"x".repeat(63)).is_empty());
        assert_eq!(dns1035_label(&"x".repeat(64)), vec![LABEL_TOO_LONG_MSG]);
        assert_eq!(
            dns1035_label(&format!("1{}", "x".repeat(63))),
            vec![LABEL_TOO_LONG_MSG, DNS1035_LABEL_MSG]
        );
    }

    #[test]
    fn qualified_name_checks() {
        for ok in [
            "True",
            "AllEncodingVersionsEqual",
            "a",
            "my.name",
            "123-abc",
            "a_b",
            "example.com/MyName",
        ] {
            assert!(is_qualified_name(ok), "{ok}");
            assert!(qualified_name(ok).is_empty(), "{ok}");
        }
        assert_eq!(
            qualified_name("-True"),
            vec![format!("name part {QUALIFIED_NAME_MSG}")]
        );
        assert_eq!(
            qualified_name(""),
            vec![
                "name part must be non-empty".to_string(),
                format!("name part {QUALIFIED_NAME_MSG}")
            ]
        );
        assert_eq!(
            qualified_name("/a"),
            vec!["prefix part must be non-empty".to_string()]
        );
        assert_eq!(
            qualified_name("Example.com/a"),
            vec![format!("prefix part {DNS1123_SUBDOMAIN_MSG}")]
        );
        assert_eq!(
            qualified_name("a/b/c"),
            vec![QUALIFIED_NAME_TOO_MANY_PARTS_MSG.to_string()]
        );
        assert_eq!(
            qualified_name(&"x".repeat(64)),
            vec!["name part must be no more than 63 characters".to_string()]
        );
        for bad in ["", "-True", "/a", "a/", "a/b/c", "a b"] {
            assert!(!is_qualified_name(bad), "{bad:?}");
            assert!(!qualified_name(bad).is_empty(), "{bad:?}");
        }
    }

    #[test]
    fn api_version_checks() {
        for ok in [
            "v1",
            "v1alpha1",
            "apps/v1",
            "mygroup.com/v2",
            "events.k8s.io/v1",
        ] {
            assert!(is_api_version(ok), "{ok}");
            assert!(api_version(ok).is_empty(), "{ok}");
        }
        assert_eq!(api_version("/v3"), vec!["group part: must be non-empty"]);
        assert_eq!(
            api_version("mygroup.com/"),
            vec!["version part: must be non-empty"]
        );
        assert_eq!(api_version(""), vec!["version part: must be non-empty"]);
        assert_eq!(
            api_version("/"),
            vec![
                "group part: must be non-empty",
                "version part: must be non-empty"
            ]
        );
        assert_eq!(
            api_version("mygroup_com/v2"),
            vec![format!("group part: {DNS1123_SUBDOMAIN_MSG}")]
        );
        assert_eq!(
            api_version("mygroup.com/v2_"),
            vec![format!("version part: {DNS1035_LABEL_MSG}")]
        );
        assert_eq!(
            api_version("a/b/c"),
            vec![API_VERSION_TOO_MANY_PARTS_MSG.to_string()]
        );
        assert_eq!(
            api_version(&"v".repeat(64)),
            vec![format!("version part: {LABEL_TOO_LONG_MSG}")]
        );
        for bad in ["", "/v3", "a/", "a/b/c", "V1", "1v", "mygroup_com/v2"] {
            assert!(!is_api_version(bad), "{bad:?}");
        }
    }

    #[test]
    fn messages_keep_upstream_spelling() {
        assert!(API_VERSION_TOO_MANY_PARTS_MSG.contains("label, which must"));
        assert!(API_VERSION_TOO_MANY_PARTS_MSG.contains("'my-name',  or 'abc-123'"));
        assert!(DNS1123_SUBDOMAIN_MSG.contains(r"(\.[a-z0-9]"));
        assert!(QUALIFIED_NAME_TOO_MANY_PARTS_MSG.ends_with("(e.g. 'example.com/MyName')"));
    }

    #[test]
    fn group_of_a_version() {
        assert_eq!(api_version_group("v1"), "");
        assert_eq!(api_version_group("apps/v1"), "apps");
        assert_eq!(api_version_group("events.k8s.io/v1"), "events.k8s.io");
    }
}
