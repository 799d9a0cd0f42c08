//! YAML documents as trees that keep every scalar's text, and a serde
//! `Deserializer` over such a tree that resolves a scalar only as the
//! target type asks: `token: 0123` is the string `"0123"` for a `String`
//! field and the number 123 only where the target takes anything.
//!
//! This is how kube-client's YAML deserialiser (serde-saphyr) reads a
//! kubeconfig, but built once: serde-saphyr streams events into each
//! type's visitor, so its deserialiser is compiled again for every
//! kubeconfig type (~230 KB of the static binary). Here the parser's events
//! (granit-parser, serde-saphyr's own parser) become one tree, and the
//! small deserialiser below is all each type adds.
//!
//! The resolution rules are serde-saphyr's defaults, which kube-client
//! uses: YAML 1.1 booleans (`yes`, `on`, …) where a `bool` is asked for;
//! `~`, `null` and the empty plain scalar as none; merge keys (`<<`);
//! anchors and aliases; a duplicate key is an error. A `!!str` tag keeps
//! a scalar a string; other tags are ignored.

use std::collections::HashMap;

use granit_parser::{Event, Parser, ScalarStyle};
use serde::de::value::{Error, MapDeserializer, SeqDeserializer};
use serde::de::{Deserializer, Error as _, IntoDeserializer, Unexpected, Visitor};

/// One YAML node.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    /// A scalar with its text as written (after escapes and folding).
    Scalar {
        text: String,
        /// Plain (unquoted, not a block) and untagged: its type is
        /// inferred from its text.
        inferred: bool,
    },
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

/// At most this many nodes in one file, aliases expanded (a kubeconfig
/// has dozens; this stops an alias bomb).
const MAX_NODES: usize = 100_000;

/// Every document of `text`; empty documents are skipped, as
/// serde-saphyr's `from_multiple` does.
pub fn documents(text: &str) -> Result<Vec<Node>, String> {
    let mut build = Builder::default();
    for event in Parser::new_from_str(text) {
        let (event, span) = event.map_err(|e| e.to_string())?;
        build
            .event(event)
            .map_err(|e| format!("line {}: {e}", span.start.line()))?;
    }
    Ok(build.documents)
}

/// A collection still open while its events arrive.
enum Open {
    Seq(Vec<Node>, usize),
    Map(Vec<(Node, Node)>, Option<Node>, usize),
}

#[derive(Default)]
struct Builder {
    open: Vec<Open>,
    anchors: HashMap<usize, (Node, usize)>,
    nodes: usize,
    documents: Vec<Node>,
}

impl Builder {
    fn event(&mut self, event: Event<'_>) -> Result<(), String> {
        let done = match event {
            Event::Scalar(text, style, anchor, tag) => {
                let forced = tag.as_ref().is_some_and(|t| t.suffix() == "str");
                let inferred = matches!(style, ScalarStyle::Plain) && tag.is_none();
                let forced_string = forced || !inferred;
                let node = Node::Scalar {
                    text: text.into_owned(),
                    inferred: !forced_string,
                };
                self.count(1)?;
                self.anchor(anchor, &node, 1);
                node
            }
            Event::Alias(id) => {
                let (node, size) = self
                    .anchors
                    .get(&id)
                    .cloned()
                    .ok_or("an alias to no anchor")?;
                self.count(size)?;
                node
            }
            Event::UnresolvedAlias(name) => return Err(format!("an alias to no anchor ({name})")),
            Event::SequenceStart(_, anchor, _) => {
                self.open.push(Open::Seq(Vec::new(), anchor));
                return Ok(());
            }
            Event::MappingStart(_, anchor, _) => {
                self.open.push(Open::Map(Vec::new(), None, anchor));
                return Ok(());
            }
            Event::SequenceEnd => match self.open.pop() {
                Some(Open::Seq(items, anchor)) => self.closed(Node::Seq(items), anchor)?,
                _ => return Err("a sequence ends that did not start".into()),
            },
            Event::MappingEnd => match self.open.pop() {
                Some(Open::Map(entries, None, anchor)) => {
                    self.closed(Node::Map(merged(entries)?), anchor)?
                }
                _ => return Err("a mapping ends that did not start".into()),
            },
            _ => return Ok(()),
        };
        self.place(done);
        Ok(())
    }

    fn count(&mut self, n: usize) -> Result<(), String> {
        self.nodes += n;
        if self.nodes > MAX_NODES {
            return Err(format!("more than {MAX_NODES} nodes (aliases expanded)"));
        }
        Ok(())
    }

    fn anchor(&mut self, anchor: usize, node: &Node, size: usize) {
        if anchor != 0 {
            self.anchors.insert(anchor, (node.clone(), size));
        }
    }

    /// A finished collection: counted, and remembered under its anchor.
    fn closed(&mut self, node: Node, anchor: usize) -> Result<Node, String> {
        let size = size(&node);
        self.count(1)?;
        self.anchor(anchor, &node, size);
        Ok(node)
    }

    /// A finished node goes into the collection around it, or is a document.
    fn place(&mut self, node: Node) {
        match self.open.last_mut() {
            Some(Open::Seq(items, _)) => items.push(node),
            Some(Open::Map(entries, key, _)) => match key.take() {
                Some(k) => entries.push((k, node)),
                None => *key = Some(node),
            },
            None if is_null(&node) => {}
            None => self.documents.push(node),
        }
    }
}

fn size(node: &Node) -> usize {
    match node {
        Node::Scalar { .. } => 1,
        Node::Seq(items) => 1 + items.iter().map(size).sum::<usize>(),
        Node::Map(entries) => {
            1 + entries
                .iter()
                .map(|(k, v)| size(k) + size(v))
                .sum::<usize>()
        }
    }
}

/// A mapping's entries with its merge keys (`<<: *base` or
/// `<<: [*a, *b]`) applied: explicit keys win, then the merged mappings
/// in order. Two explicit entries with one key are an error.
fn merged(entries: Vec<(Node, Node)>) -> Result<Vec<(Node, Node)>, String> {
    let mut own: Vec<(Node, Node)> = Vec::with_capacity(entries.len());
    let mut merges = Vec::new();
    for (k, v) in entries {
        if matches!(&k, Node::Scalar { text, inferred: true } if text == "<<") {
            match v {
                Node::Map(m) => merges.push(m),
                Node::Seq(items) => {
                    for item in items {
                        match item {
                            Node::Map(m) => merges.push(m),
                            _ => return Err("a merge key (<<) takes mappings".into()),
                        }
                    }
                }
                _ => return Err("a merge key (<<) takes mappings".into()),
            }
        } else if own.iter().any(|(o, _)| o == &k) {
            return Err(format!("duplicate key {}", describe(&k)));
        } else {
            own.push((k, v));
        }
    }
    for (k, v) in merges.into_iter().flatten() {
        if !own.iter().any(|(o, _)| o == &k) {
            own.push((k, v));
        }
    }
    Ok(own)
}

fn describe(node: &Node) -> String {
    match node {
        Node::Scalar { text, .. } => format!("{text:?}"),
        Node::Seq(_) => "(a sequence)".into(),
        Node::Map(_) => "(a mapping)".into(),
    }
}

/// The plain scalars YAML reads as null.
fn is_null(node: &Node) -> bool {
    matches!(node, Node::Scalar { text, inferred: true } if matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL"))
}

/// YAML 1.1's booleans, as serde-saphyr reads a `bool`.
fn boolean(text: &str) -> Option<bool> {
    let t = text.trim();
    let is = |words: &[&str]| words.iter().any(|w| t.eq_ignore_ascii_case(w));
    if is(&["true", "yes", "y", "on"]) {
        Some(true)
    } else if is(&["false", "no", "n", "off"]) {
        Some(false)
    } else {
        None
    }
}

/// What an inferred scalar is where the target takes anything.
fn visit_inferred<'de, V: Visitor<'de>>(text: &'de str, visitor: V) -> Result<V::Value, Error> {
    if let Some(b) = boolean(text) {
        return visitor.visit_bool(b);
    }
    if let Ok(n) = text.parse::<u64>() {
        return visitor.visit_u64(n);
    }
    let radix = [("0x", 16), ("0o", 8), ("0b", 2)]
        .into_iter()
        .find_map(|(prefix, radix)| Some((text.strip_prefix(prefix)?, radix)));
    if let Some((digits, radix)) = radix
        && let Ok(n) = u64::from_str_radix(digits, radix)
    {
        return visitor.visit_u64(n);
    }
    if let Ok(n) = text.parse::<i64>() {
        return visitor.visit_i64(n);
    }
    let numeric = text.bytes().any(|b| b.is_ascii_digit())
        && text.bytes().all(|b| b"0123456789+-.eE".contains(&b));
    if numeric && let Ok(f) = text.parse::<f64>() {
        return visitor.visit_f64(f);
    }
    visitor.visit_borrowed_str(text)
}

impl<'de> IntoDeserializer<'de, Error> for &'de Node {
    type Deserializer = Self;
    fn into_deserializer(self) -> Self {
        self
    }
}

impl Node {
    fn scalar(&self, expected: &str) -> Result<&str, Error> {
        match self {
            Node::Scalar { text, .. } => Ok(text),
            Node::Seq(_) => Err(Error::invalid_type(Unexpected::Seq, &expected)),
            Node::Map(_) => Err(Error::invalid_type(Unexpected::Map, &expected)),
        }
    }

    fn parsed<T: std::str::FromStr>(&self, expected: &str) -> Result<T, Error> {
        let text = self.scalar(expected)?;
        text.trim()
            .parse()
            .map_err(|_| Error::invalid_value(Unexpected::Str(text), &expected))
    }
}

macro_rules! parsed {
    ($($method:ident $visit:ident $t:ty),*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
            visitor.$visit(self.parsed::<$t>(stringify!($t))?)
        }
    )*};
}

impl<'de> Deserializer<'de> for &'de Node {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self {
            n if is_null(n) => visitor.visit_unit(),
            Node::Scalar {
                text,
                inferred: true,
            } => visit_inferred(text, visitor),
            Node::Scalar { text, .. } => visitor.visit_borrowed_str(text),
            Node::Seq(items) => visitor.visit_seq(SeqDeserializer::new(items.iter())),
            Node::Map(entries) => {
                visitor.visit_map(MapDeserializer::new(entries.iter().map(|(k, v)| (k, v))))
            }
        }
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        if is_null(self) {
            return Err(Error::invalid_type(Unexpected::Unit, &"a string"));
        }
        visitor.visit_borrowed_str(self.scalar("a string")?)
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_borrowed_str(self.scalar("a key")?)
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let text = self.scalar("a boolean")?;
        match boolean(text) {
            Some(b) => visitor.visit_bool(b),
            None => Err(Error::invalid_value(Unexpected::Str(text), &"a boolean")),
        }
    }

    parsed!(deserialize_u8 visit_u8 u8, deserialize_u16 visit_u16 u16,
        deserialize_u32 visit_u32 u32, deserialize_u64 visit_u64 u64,
        deserialize_i8 visit_i8 i8, deserialize_i16 visit_i16 i16,
        deserialize_i32 visit_i32 i32, deserialize_i64 visit_i64 i64,
        deserialize_f32 visit_f32 f32, deserialize_f64 visit_f64 f64,
        deserialize_char visit_char char);

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        if is_null(self) {
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        if is_null(self) {
            visitor.visit_unit()
        } else {
            self.deserialize_any(visitor)
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        let variant = self.scalar("a variant name")?;
        visitor.visit_enum(IntoDeserializer::<Error>::into_deserializer(variant))
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        bytes byte_buf unit_struct seq tuple tuple_struct map struct
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[test]
    fn scalars_resolve_as_the_target_asks() {
        #[derive(Deserialize, Debug, PartialEq)]
        struct T {
            s: String,
            b: bool,
            n: Option<u16>,
            none: Option<String>,
            any: serde_json::Value,
        }
        let docs =
            documents("s: 0123\nb: yes\nn: 8080\nnone: ~\nany: [0123, 'x', 1.5, on, null]\n")
                .expect("parses");
        let t = T::deserialize(&docs[0]).expect("typed");
        assert_eq!(t.s, "0123");
        assert!(t.b);
        assert_eq!(t.n, Some(8080));
        assert_eq!(t.none, None);
        assert_eq!(t.any, serde_json::json!([123, "x", 1.5, true, null]));
    }

    #[test]
    fn aliases_and_merge_keys() {
        let yaml = "a: &a {x: 1, y: 2}\nb:\n  <<: *a\n  y: 3\nc:\n  <<: [{x: 5}, {x: 6, z: 7}]\n";
        let v = serde_json::Value::deserialize(&documents(yaml).expect("parses")[0]).expect("any");
        assert_eq!(v["b"], serde_json::json!({"x": 1, "y": 3}));
        assert_eq!(v["c"], serde_json::json!({"x": 5, "z": 7}));
    }

    #[test]
    fn refusals() {
        assert!(documents("a: 1\na: 2\n").is_err(), "duplicate key");
        assert!(documents("a: [\n").is_err(), "unclosed");
        // An alias bomb stops at the node budget instead of exhausting memory.
        let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..8 {
            let p = i - 1;
            bomb.push_str(&format!("a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"));
        }
        let err = documents(&bomb).expect_err("too many nodes");
        assert!(err.contains("more than"), "{err}");
    }
}
