//! Reading the API server's audit log: where it ends now (across its
//! rotations), its entries and text since then, and the requests one user
//! made — how tests count what nodekeeper asked of the API server.

use std::path::{Path, PathBuf};

use super::*;

/// The audit log's files, oldest first: the API server rotates `audit.log`
/// to `audit-<time>.log` at its size limit (100 MB by default) and keeps the
/// rotated files, so an offset counts bytes across all of them and stays
/// valid across a rotation (a test that took its offset before one still
/// finds the entries written after).
fn audit_files(path: &Path) -> Vec<PathBuf> {
    let (Some(dir), Some(stem)) = (path.parent(), path.file_stem().and_then(|s| s.to_str())) else {
        return vec![path.to_path_buf()];
    };
    let prefix = format!("{stem}-");
    let mut rotated: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".log"))
                })
                .collect()
        })
        .unwrap_or_default();
    // Their names hold the rotation time in a sortable form.
    rotated.sort();
    rotated.push(path.to_path_buf());
    rotated
}

/// Where the audit log at `path` ends now, counted across its rotations:
/// what to pass as `from` to read only what comes after.
pub fn audit_offset_of(path: &Path) -> u64 {
    audit_files(path)
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum()
}

/// The audit log's entries (one JSON object per line) from byte `from`
/// (an [`audit_offset_of`]), across rotations.
pub fn audit_entries(path: &Path, from: u64) -> Vec<serde_json::Value> {
    audit_text_since(path, from)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The audit log's text from byte `from` (an [`audit_offset_of`]) on,
/// across rotations; files wholly before `from` are not read.
pub fn audit_text_since(path: &Path, from: u64) -> String {
    let mut skip = from;
    let mut out = String::new();
    for file in audit_files(path) {
        let len = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
        if skip >= len {
            skip -= len;
            continue;
        }
        let text = std::fs::read(&file).unwrap_or_default();
        out.push_str(&String::from_utf8_lossy(
            &text[(skip as usize).min(text.len())..],
        ));
        skip = 0;
    }
    out
}

/// Distinct requests (audit IDs) in the API server's audit log since byte
/// offset `from` (the benchmarks' request counts).
pub fn audit_ids_since(path: &Path, from: u64) -> usize {
    let ids: std::collections::HashSet<String> = audit_entries(path, from)
        .into_iter()
        .filter_map(|v| {
            v.get("auditID")
                .and_then(|a| a.as_str())
                .map(str::to_string)
        })
        .collect();
    ids.len()
}

/// Requests with this verb on this resource after byte offset `from`: a
/// watch by its `ResponseStarted` entry (one opened earlier and ending now
/// is not counted), any other verb by its `ResponseComplete` (the
/// benchmarks' watch reopenings; the health gate's list pages).
pub fn audit_count_since(path: &Path, from: u64, verb: &str, resource: &str) -> usize {
    let ids: std::collections::HashSet<String> = audit_entries(path, from)
        .into_iter()
        .filter(|v| v["verb"].as_str() == Some(verb))
        .filter(|v| {
            v["stage"].as_str()
                == Some(if verb == "watch" {
                    "ResponseStarted"
                } else {
                    "ResponseComplete"
                })
        })
        .filter(|v| v["objectRef"]["resource"].as_str() == Some(resource))
        .filter_map(|v| v["auditID"].as_str().map(str::to_string))
        .collect();
    ids.len()
}

/// The API server's audit log.
pub fn audit_log() -> PathBuf {
    cluster().with_file_name("logs").join("audit.log")
}

/// One audited request: verb, resource (with subresource), URI, code,
/// and the client's User-Agent.
#[derive(Debug, Clone)]
pub struct Request {
    pub verb: String,
    pub resource: String,
    pub uri: String,
    pub code: i64,
    pub user_agent: String,
}

/// The requests `user` made since byte `from` of the audit log, one per
/// audit ID.
pub fn requests_of(user: &str, from: u64) -> Vec<Request> {
    let mut seen = std::collections::HashSet::new();
    audit_entries(&audit_log(), from)
        .into_iter()
        .filter(|v| v["user"]["username"].as_str() == Some(user))
        .filter(|v| {
            v["auditID"]
                .as_str()
                .is_some_and(|id| seen.insert(id.to_string()))
        })
        .map(|v| {
            let obj = &v["objectRef"];
            let mut resource = obj["resource"].as_str().unwrap_or_default().to_string();
            if let Some(sub) = obj["subresource"].as_str() {
                resource = format!("{resource}/{sub}");
            }
            Request {
                verb: v["verb"].as_str().unwrap_or_default().to_string(),
                resource,
                uri: v["requestURI"].as_str().unwrap_or_default().to_string(),
                code: v["responseStatus"]["code"].as_i64().unwrap_or(0),
                user_agent: v["userAgent"].as_str().unwrap_or_default().to_string(),
            }
        })
        .collect()
}

/// The audit log's size now (where to count from).
pub fn audit_offset() -> u64 {
    audit_offset_of(&audit_log())
}
