//! A small YAML emitter for JSON values, enough for Kubernetes manifests.
//! serde_yaml is unmaintained and the manifests we print are plain data:
//! block mappings and sequences, with every string that could be misread
//! (numbers, booleans, punctuation) written as a JSON-style quoted scalar,
//! which YAML reads identically.

use serde_json::Value;

/// `---`-separated YAML documents.
pub fn documents(docs: &[Value]) -> String {
    let mut out = String::new();
    for d in docs {
        out.push_str("---\n");
        emit(d, 0, &mut out);
    }
    out
}

fn emit(v: &Value, indent: usize, out: &mut String) {
    match v {
        Value::Object(map) if !map.is_empty() => {
            for (k, val) in map {
                out.push_str(&" ".repeat(indent));
                out.push_str(&scalar_str(k));
                out.push(':');
                child(val, indent, out);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for item in items {
                let mut sub = String::new();
                match item {
                    Value::Object(m) if !m.is_empty() => emit(item, indent + 2, &mut sub),
                    Value::Array(a) if !a.is_empty() => emit(item, indent + 2, &mut sub),
                    _ => {
                        sub.push_str(&" ".repeat(indent + 2));
                        sub.push_str(&scalar(item));
                        sub.push('\n');
                    }
                }
                out.push_str(&" ".repeat(indent));
                out.push_str("- ");
                out.push_str(&sub[indent + 2..]);
            }
        }
        other => {
            out.push_str(&" ".repeat(indent));
            out.push_str(&scalar(other));
            out.push('\n');
        }
    }
}

fn child(val: &Value, indent: usize, out: &mut String) {
    match val {
        Value::Object(m) if !m.is_empty() => {
            out.push('\n');
            emit(val, indent + 2, out);
        }
        Value::Array(a) if !a.is_empty() => {
            out.push('\n');
            emit(val, indent + 2, out);
        }
        _ => {
            out.push(' ');
            out.push_str(&scalar(val));
            out.push('\n');
        }
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => scalar_str(s),
        Value::Object(_) => "{}".into(),
        Value::Array(_) => "[]".into(),
    }
}

fn scalar_str(s: &str) -> String {
    const RESERVED: [&str; 11] = [
        "true", "false", "null", "yes", "no", "on", "off", "y", "n", "~", "",
    ];
    let plain = s.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-'))
        && !RESERVED.contains(&s.to_ascii_lowercase().as_str());
    if plain {
        s.to_string()
    } else {
        serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn emits_block_yaml_with_safe_quoting() {
        let v =
            json!({"a": {"b": [1, "x y", {"c": true, "d": []}], "e": "yes", "f": "1.0"}, "g": {}});
        let y = documents(&[v]);
        assert_eq!(
            y,
            "---\na:\n  b:\n    - 1\n    - \"x y\"\n    - c: true\n      d: []\n  e: \"yes\"\n  f: \"1.0\"\ng: {}\n"
        );
    }

    #[test]
    fn nested_sequences_and_multiline_strings() {
        let y = documents(&[json!({"l": [["a"], "line1\nline2"]})]);
        assert_eq!(y, "---\nl:\n  - - a\n  - \"line1\\nline2\"\n");
    }
}
