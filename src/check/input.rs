//! Reading `check`'s input files: YAML streams (several `---` documents) or JSON, decoded into
//! typed objects with errors that say where in the file the problem is.
//!
//! Each file is decoded in two passes. The first reads every document's `apiVersion` and `kind`
//! (and those of list items) into a [`Header`]; the caller turns each header into a *shape*, i.e.
//! what the document should be decoded as. The second pass decodes each document straight into
//! that typed shape, so a field of the wrong type is reported at its own line and column. A
//! document whose kind is not accepted is rejected in the second pass too, at its `kind`.

use std::fmt;
use std::io::Read;
use std::marker::PhantomData;
use std::path::Path;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

/// One input file, read whole.
pub struct InputFile {
    /// How messages name the file (`<stdin>` for `-`).
    pub name: String,
    pub text: String,
}

/// Why an input could not be used: rendered as `<file>: line <L>, column <C>: <what>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputError {
    pub file: String,
    /// 1-based line and column, when known.
    pub location: Option<(usize, usize)>,
    pub message: String,
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.location {
            Some((line, column)) => write!(
                f,
                "{}: line {line}, column {column}: {}",
                self.file, self.message
            ),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

/// The name given to standard input on the command line.
pub const STDIN_ARG: &str = "-";

/// Reads `path` (or standard input for `-`) as UTF-8 text.
pub fn read_input(path: &Path) -> Result<InputFile, InputError> {
    let (name, bytes) = if path == Path::new(STDIN_ARG) {
        let name = "<stdin>".to_string();
        let mut bytes = Vec::new();
        match std::io::stdin().lock().read_to_end(&mut bytes) {
            Ok(_) => (name, bytes),
            Err(e) => return Err(unlocated(name, format!("cannot read: {e}"))),
        }
    } else {
        let name = path.display().to_string();
        match std::fs::read(path) {
            Ok(bytes) => (name, bytes),
            Err(e) => return Err(unlocated(name, format!("cannot read: {e}"))),
        }
    };
    match String::from_utf8(bytes) {
        Ok(text) => Ok(InputFile { name, text }),
        Err(e) => {
            let valid = &e.as_bytes()[..e.utf8_error().valid_up_to()];
            // The prefix is valid UTF-8 by construction; fall back to "no location" regardless.
            let location = std::str::from_utf8(valid).ok().map(end_position);
            Err(InputError {
                file: name,
                location,
                message: "not valid UTF-8 text".to_string(),
            })
        }
    }
}

fn unlocated(file: String, message: String) -> InputError {
    InputError {
        file,
        location: None,
        message,
    }
}

/// The 1-based line and column just after `text`.
fn end_position(text: &str) -> (usize, usize) {
    let line = text.matches('\n').count() + 1;
    let last_line = text.rsplit('\n').next().unwrap_or("");
    (line, last_line.chars().count() + 1)
}

/// What the first pass learns about a document.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(
    rename_all = "camelCase",
    expecting = "a Kubernetes object (a mapping with apiVersion and kind)"
)]
pub struct Header {
    #[serde(default)]
    pub api_version: Option<String>,
    #[serde(default)]
    pub kind: Option<String>,
    /// Only meaningful for lists.
    #[serde(default)]
    pub items: Vec<ItemHeader>,
}

/// What the first pass learns about one item of a list.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(
    rename_all = "camelCase",
    expecting = "a Kubernetes object (a mapping with apiVersion and kind)"
)]
pub struct ItemHeader {
    #[serde(default)]
    pub api_version: Option<String>,
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub metadata: ItemMeta,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct ItemMeta {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
}

/// What a document is to be decoded as, decided from its [`Header`].
pub trait Shape {
    type Decoded;
    fn decode<'de, D: Deserializer<'de>>(&self, deserializer: D)
        -> Result<Self::Decoded, D::Error>;
}

/// One non-empty document of a file.
pub struct Document<T> {
    /// 1-based position in the file, counting empty documents too.
    pub index: usize,
    pub header: Header,
    pub value: T,
}

/// Decodes every document of `file`, as `classify` says from its header. Empty documents are
/// left out. Stops at the first error.
pub fn decode_file<S: Shape>(
    file: &InputFile,
    classify: impl Fn(&Header) -> S,
) -> Result<Vec<Document<S::Decoded>>, InputError> {
    let located = |(location, message)| InputError {
        file: file.name.clone(),
        location,
        message,
    };
    let json = looks_like_json(&file.text);
    let headers = if json {
        json_headers(&file.text)
    } else {
        yaml_headers(&file.text)
    }
    .map_err(located)?;
    let shapes: Vec<Option<S>> = headers.iter().map(|h| h.as_ref().map(&classify)).collect();
    let values = if json {
        json_values(&file.text, &shapes)
    } else {
        yaml_values(&file.text, &shapes)
    }
    .map_err(located)?;
    Ok(headers
        .into_iter()
        .zip(values)
        .enumerate()
        .filter_map(|(i, (header, value))| {
            Some(Document {
                index: i + 1,
                header: header?,
                value: value?,
            })
        })
        .collect())
}

/// JSON when the first thing in the file opens an object or an array; YAML otherwise.
fn looks_like_json(text: &str) -> bool {
    matches!(text.trim_start().chars().next(), Some('{' | '['))
}

type Located<T> = Result<T, (Option<(usize, usize)>, String)>;

fn yaml_headers(text: &str) -> Located<Vec<Option<Header>>> {
    serde_norway::Deserializer::from_str(text)
        .map(|doc| Option::<Header>::deserialize(doc).map_err(yaml_error))
        .collect()
}

fn yaml_values<S: Shape>(text: &str, shapes: &[Option<S>]) -> Located<Vec<Option<S::Decoded>>> {
    serde_norway::Deserializer::from_str(text)
        .zip(shapes)
        .map(|(doc, shape)| Step(shape.as_ref()).deserialize(doc).map_err(yaml_error))
        .collect()
}

fn json_headers(text: &str) -> Located<Vec<Option<Header>>> {
    serde_json::Deserializer::from_str(text)
        .into_iter::<Option<Header>>()
        .map(|r| r.map_err(json_error))
        .collect()
}

fn json_values<S: Shape>(text: &str, shapes: &[Option<S>]) -> Located<Vec<Option<S::Decoded>>> {
    let mut de = serde_json::Deserializer::from_str(text);
    shapes
        .iter()
        .map(|shape| {
            Step(shape.as_ref())
                .deserialize(&mut de)
                .map_err(json_error)
        })
        .collect()
}

fn yaml_error(e: serde_norway::Error) -> (Option<(usize, usize)>, String) {
    let location = e.location().map(|l| (l.line(), l.column()));
    let mut message = e.to_string();
    if let Some((line, column)) = location {
        message = message.replacen(&format!(" at line {line} column {column}"), "", 1);
    }
    (location, message)
}

fn json_error(e: serde_json::Error) -> (Option<(usize, usize)>, String) {
    let location = (e.line() > 0).then(|| (e.line(), e.column()));
    let mut message = e.to_string();
    if let Some((line, column)) = location {
        message = message.replacen(&format!(" at line {line} column {column}"), "", 1);
    }
    (location, message)
}

/// Decodes one document as its shape says, or skips it (`None`) when it is empty.
struct Step<'a, S>(Option<&'a S>);

impl<'de, S: Shape> DeserializeSeed<'de> for Step<'_, S> {
    type Value = Option<S::Decoded>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        match self.0 {
            Some(shape) => shape.decode(deserializer).map(Some),
            None => IgnoredAny::deserialize(deserializer).map(|_| None),
        }
    }
}

/// Decodes the `items` of a list document: item `i` as a `T` when `wanted[i]`, otherwise skipped
/// (`None`). Every other field of the list is ignored.
pub fn decode_items<'de, T, D>(deserializer: D, wanted: &[bool]) -> Result<Vec<Option<T>>, D::Error>
where
    T: Deserialize<'de>,
    D: Deserializer<'de>,
{
    deserializer.deserialize_map(ListVisitor {
        wanted,
        item: PhantomData,
    })
}

struct ListVisitor<'a, T> {
    wanted: &'a [bool],
    item: PhantomData<T>,
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for ListVisitor<'_, T> {
    type Value = Vec<Option<T>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list object with items")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            if key == "items" {
                items = map.next_value_seed(ItemsSeed {
                    wanted: self.wanted,
                    item: PhantomData,
                })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(items)
    }
}

struct ItemsSeed<'a, T> {
    wanted: &'a [bool],
    item: PhantomData<T>,
}

impl<'de, T: Deserialize<'de>> DeserializeSeed<'de> for ItemsSeed<'_, T> {
    type Value = Vec<Option<T>>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for ItemsSeed<'_, T> {
    type Value = Vec<Option<T>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a sequence of objects")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        loop {
            let wanted = self.wanted.get(items.len()).copied().unwrap_or(false);
            let item = if wanted {
                match seq.next_element::<T>()? {
                    Some(item) => Some(item),
                    None => break,
                }
            } else {
                match seq.next_element::<IgnoredAny>()? {
                    Some(_) => None,
                    None => break,
                }
            };
            items.push(item);
        }
        Ok(items)
    }
}

/// Fails on a document whose kind is not accepted: at its `kind` value when it has one (so the
/// error carries that position), at the end of the document otherwise.
pub fn reject<'de, T, D: Deserializer<'de>>(deserializer: D, why: &str) -> Result<T, D::Error> {
    // The visitor never succeeds: it fails at `kind`, or at the end of the mapping.
    deserializer.deserialize_map(RejectVisitor {
        why,
        value: PhantomData,
    })
}

struct RejectVisitor<'a, T> {
    why: &'a str,
    value: PhantomData<T>,
}

impl<'de, T> Visitor<'de> for RejectVisitor<'_, T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kubernetes object (a mapping with apiVersion and kind)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            if key == "kind" {
                map.next_value_seed(RejectValue { why: self.why })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Err(de::Error::custom(self.why))
    }
}

struct RejectValue<'a> {
    why: &'a str,
}

impl<'de> DeserializeSeed<'de> for RejectValue<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for RejectValue<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a kind")
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Err(E::custom(self.why))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_position_counts_lines_and_characters() {
        assert_eq!(end_position(""), (1, 1));
        assert_eq!(end_position("ab"), (1, 3));
        assert_eq!(end_position("ab\nc"), (2, 2));
        assert_eq!(end_position("ab\n"), (2, 1));
    }

    #[test]
    fn json_is_told_from_yaml_by_its_first_character() {
        assert!(looks_like_json("  \n{\"kind\": \"List\"}"));
        assert!(looks_like_json("[]"));
        assert!(!looks_like_json("kind: List"));
        assert!(!looks_like_json("---\n{}"));
    }
}
