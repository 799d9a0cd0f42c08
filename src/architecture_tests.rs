//! The architecture map's invariants that a reading of the source can
//! check (see the crate documentation): which layer may import which, the
//! pure decisions' lack of I/O and clocks, the one module that starts
//! futures. Each test names the invariant it enforces; a file's unit tests
//! (its `mod tests` and the files under `tests/`) are not held to them.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `src/<dir>`, but test files.
fn sources(dir: &str) -> Vec<PathBuf> {
    fn walk(at: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(at) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if p.is_dir() {
                if name != "tests" {
                    walk(&p, out);
                }
            } else if name.ends_with(".rs") && name != "tests.rs" && !name.ends_with("_tests.rs") {
                out.push(p);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    let at = root.join(dir);
    if at.is_dir() {
        walk(&at, &mut out);
    } else {
        out.push(root.join(format!("{dir}.rs")));
    }
    out.sort();
    out
}

/// The code lines of a file (comments and the unit tests at its end left
/// out), with their numbers.
fn code(path: &Path) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with("mod tests") {
            break;
        }
        if t.starts_with("//") {
            continue;
        }
        out.push((i + 1, line.to_string()));
    }
    out
}

/// Where any of `dirs` names any of `forbidden`, as `file:line: text`.
fn offences(dirs: &[&str], forbidden: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for dir in dirs {
        for file in sources(dir) {
            for (n, line) in code(&file) {
                if forbidden.iter().any(|f| line.contains(f)) {
                    let shown = file
                        .strip_prefix(env!("CARGO_MANIFEST_DIR"))
                        .unwrap_or(&file)
                        .display()
                        .to_string();
                    found.push(format!("{shown}:{n}: {}", line.trim()));
                }
            }
        }
    }
    found
}

#[test]
fn every_source_directory_is_read() {
    for dir in ["api", "decide", "effects", "service", "cli", "deploy"] {
        assert!(sources(dir).len() > 3, "{dir}: {:?}", sources(dir));
    }
}

/// Invariant: nothing under `decide/` performs I/O or reads a clock; time
/// comes in through the snapshot.
#[test]
fn decide_performs_no_io_and_reads_no_clock() {
    let found = offences(
        &["decide"],
        &[
            "kube::Client",
            "kube::Api",
            "std::fs",
            "std::process",
            "std::net",
            "std::thread",
            "smol::",
            "tokio::",
            "Timestamp::now",
            "SystemTime::now",
            "Instant::now",
            "crate::effects",
            "crate::service",
        ],
    );
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// Invariant: layers import downwards only: `api` < `decide` < `effects` <
/// `service` < `deploy` < `cli`.
#[test]
fn layers_import_downwards_only() {
    let rules: [(&[&str], &[&str]); 4] = [
        (
            &["api"],
            &[
                "crate::decide",
                "crate::effects",
                "crate::service",
                "crate::deploy",
                "crate::cli",
            ],
        ),
        (
            &["effects"],
            &["crate::service", "crate::deploy", "crate::cli"],
        ),
        (&["service"], &["crate::deploy", "crate::cli"]),
        (&["deploy"], &["crate::cli"]),
    ];
    let mut found = Vec::new();
    for (dirs, forbidden) in rules {
        found.extend(offences(dirs, forbidden));
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// Invariant: `runtime` is the only module that starts futures (inside
/// `Compat`, where kube's client finds its reactor).
#[test]
fn only_runtime_starts_futures() {
    let found = offences(
        &[
            "api", "decide", "effects", "service", "cli", "deploy", "logging", "main",
        ],
        &[
            "smol::spawn(",
            "smol::block_on(",
            "async_io::block_on(",
            "std::thread::spawn(",
        ],
    );
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// Invariant: only `effects` writes to the API server on the loop's behalf:
/// no decision or service module calls a write verb of kube's `Api`.
#[test]
fn only_effects_write_to_the_api_server() {
    let found = offences(
        &["decide", "service"],
        &[
            ".create(&PostParams",
            ".patch(",
            ".replace(&",
            ".delete(&",
            ".patch_status(",
            ".replace_status(",
        ],
    );
    // The exceptions the map names: the webhook's own caBundle (guarded)
    // and the metrics/admission servers are beside the loop.
    let found: Vec<String> = found
        .into_iter()
        .filter(|l| !l.starts_with("src/service/admission"))
        .collect();
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// Invariant: nothing waits on kube-runtime's `Store::wait_until_ready`
/// (it wakes one waiter only); readiness is a `runtime::Latch` per kind.
#[test]
fn no_store_waits_until_ready() {
    let found = offences(
        &[
            "api", "decide", "effects", "service", "cli", "deploy", "runtime",
        ],
        &["wait_until_ready"],
    );
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The map names every module of `decide/`, `effects/` and `service/`
/// (as `layer::module`): a module added without a place in the map fails
/// here, so the map cannot drift from the code unseen.
#[test]
fn every_module_is_named_in_the_map() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(root.join("lib.rs")).unwrap_or_default();
    let map: String = lib
        .lines()
        .filter(|l| l.starts_with("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    let named = |path: &str| {
        map.match_indices(path).any(|(i, _)| {
            !map[i + path.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '_')
        })
    };
    let mut missing = Vec::new();
    for layer in ["decide", "effects", "service"] {
        let text = std::fs::read_to_string(root.join(layer).join("mod.rs")).unwrap_or_default();
        for line in text.lines() {
            let l = line.trim();
            let Some(rest) = ["pub mod ", "pub(crate) mod ", "mod "]
                .iter()
                .find_map(|p| l.strip_prefix(p))
            else {
                continue;
            };
            let Some(module) = rest.strip_suffix(';') else {
                continue;
            };
            if module != "tests" && !named(&format!("{layer}::{module}")) {
                missing.push(format!("{layer}::{module}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "modules the map (src/lib.rs) does not name: {missing:?}"
    );
}

/// The module a source file is, as path segments (`src/decide/reboot/
/// stages.rs` is `decide::reboot::stages`; a `mod.rs` is its folder).
fn module_of(file: &Path) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let rel = file.strip_prefix(&root).unwrap_or(file).with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().to_string())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// Whether `layer::name` is a module of its own (a file or a folder).
fn is_module(layer: &str, name: &str) -> bool {
    let at = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join(layer);
    at.join(format!("{name}.rs")).is_file() || at.join(name).is_dir()
}

/// The first segment of each path a `use`-like reference names after
/// `prefix` in `code`: `super::{a, b::c}` gives `a` and `b`.
fn named_after<'c>(code: &'c str, prefix: &str) -> Vec<&'c str> {
    let ident = |s: &'c str| {
        let end = s
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(s.len());
        &s[..end]
    };
    let mut out = Vec::new();
    for (i, _) in code.match_indices(prefix) {
        let rest = &code[i + prefix.len()..];
        let Some(list) = rest.strip_prefix('{') else {
            out.push(ident(rest));
            continue;
        };
        // Top-level elements of the brace list.
        let (mut depth, mut start) = (0usize, 0usize);
        for (j, c) in list.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    out.push(ident(list[start..j].trim_start()));
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    out.push(ident(list[start..j].trim_start()));
                    start = j + 1;
                }
                _ => {}
            }
        }
    }
    out
}

/// Invariant: within a layer, modules import each other without cycles
/// (a module and its submodules count as one). A cycle means neither side
/// can be read, changed or tested without the other; the two that
/// structure-turn5.md found (`decide::notify` with the features,
/// `service::context` with the executor) were opened, and this keeps new
/// ones out.
#[test]
fn modules_within_a_layer_import_each_other_without_cycles() {
    use std::collections::{BTreeMap, BTreeSet};
    for layer in ["decide", "effects", "service"] {
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for file in sources(layer) {
            let module = module_of(&file);
            let Some(unit) = module.get(1).cloned() else {
                continue; // the layer's root: the kernel every module uses
            };
            let code: String = code(&file)
                .into_iter()
                .map(|(_, l)| l)
                .collect::<Vec<_>>()
                .join("\n");
            let mut named: Vec<String> = named_after(&code, &format!("crate::{layer}::"))
                .into_iter()
                .map(str::to_string)
                .collect();
            // `super::` from `layer::unit` is the layer; from deeper, a
            // module inside the unit (no edge).
            if module.len() == 2 {
                named.extend(
                    named_after(&code, "super::")
                        .into_iter()
                        .map(str::to_string),
                );
            }
            for other in named {
                if !other.is_empty() && other != unit && is_module(layer, &other) {
                    edges.entry(unit.clone()).or_default().insert(other);
                }
            }
        }
        // Depth-first search for a path back to where it started.
        fn back<'a>(
            edges: &'a BTreeMap<String, BTreeSet<String>>,
            from: &'a str,
            to: &str,
            path: &mut Vec<&'a str>,
            seen: &mut BTreeSet<&'a str>,
        ) -> bool {
            for next in edges.get(from).into_iter().flatten() {
                if next == to {
                    return true;
                }
                if seen.insert(next) {
                    path.push(next);
                    if back(edges, next, to, path, seen) {
                        return true;
                    }
                    path.pop();
                }
            }
            false
        }
        let mut cycles = Vec::new();
        for start in edges.keys() {
            let (mut path, mut seen) = (vec![start.as_str()], BTreeSet::new());
            if back(&edges, start, start, &mut path, &mut seen) {
                cycles.push(format!("{layer}: {} -> {start}", path.join(" -> ")));
            }
        }
        assert!(
            cycles.is_empty(),
            "modules importing each other in a cycle:\n{}",
            cycles.join("\n")
        );
    }
}

/// A file a newcomer can read at once: no source file is longer than 600
/// lines (unit tests at its end not counted). A file that grows past it
/// is split by what it holds, its parts as child modules.
#[test]
fn no_source_file_is_longer_than_600_lines() {
    const MOST: usize = 600;
    let long: Vec<String> = sources("")
        .iter()
        .filter_map(|p| {
            let text = std::fs::read_to_string(p).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let own = lines
                .windows(2)
                .position(|w| w[0] == "#[cfg(test)]" && w[1].starts_with("mod tests {"))
                .unwrap_or(lines.len());
            (own > MOST).then(|| format!("{} ({own} lines)", p.display()))
        })
        .collect();
    assert!(long.is_empty(), "longer than {MOST} lines: {long:?}");
}
