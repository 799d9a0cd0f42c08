//! Log setup: `env_logger`, by default `info` for nodekeeper and nothing from
//! the libraries under it (kube reports every failed connection attempt at
//! error level; we report the failure ourselves, once, with context).
//! `RUST_LOG` overrides, e.g. `RUST_LOG=nodekeeper=debug,kube=debug`.
//!
//! Two layouts: text (`[time LEVEL] message`) and JSON (`--log-format
//! json`, one object per line, for log pipelines). Our lines name what they
//! are about first (`node worker-1: …`, `RebootPolicy workers: …`, a
//! convention every log call follows), so the JSON layout lifts that into
//! `node` and `object` fields without a second logging API.

use std::str::FromStr;

/// The layout of log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    #[default]
    Text,
    Json,
}

impl FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "text" => Ok(Format::Text),
            "json" => Ok(Format::Json),
            other => Err(format!("--log-format must be text or json, not {other:?}")),
        }
    }
}

/// The kinds whose lines start `Kind name: `.
const KINDS: [&str; 11] = [
    "NodeMaintenance",
    "RebootPolicy",
    "UpgradePlan",
    "NodeVersion",
    "ScalingGroup",
    "PendingNode",
    "JoiningNode",
    "AutoscalingStrategy",
    "MutexRule",
    "MutexTarget",
    "MutexRunConfig",
];

/// What a line is about, from its leading `node NAME: ` or `Kind NAME: `:
/// (node, object as `Kind/name`).
pub fn subject(message: &str) -> (Option<&str>, Option<String>) {
    let Some((head, _)) = message.split_once(": ") else {
        return (None, None);
    };
    let Some((kind, name)) = head.split_once(' ') else {
        return (None, None);
    };
    if name.is_empty() || name.contains(' ') {
        return (None, None);
    }
    if kind == "node" {
        return (Some(name), None);
    }
    if KINDS.contains(&kind) {
        return (None, Some(format!("{kind}/{name}")));
    }
    (None, None)
}

/// One JSON log line (without its newline).
pub fn json_line(time: &str, level: log::Level, target: &str, message: &str) -> String {
    let mut line = serde_json::json!({
        "time": time,
        "level": level.as_str().to_ascii_lowercase(),
        "target": target,
        "message": message,
    });
    let (node, object) = subject(message);
    if let Some(n) = node {
        line["node"] = serde_json::json!(n);
    }
    if let Some(o) = object {
        line["object"] = serde_json::json!(o);
    }
    line.to_string()
}

/// Initialise the global logger once, before any subcommand runs.
pub fn init(verbose: bool, format: Format) {
    let default = if verbose {
        "nodekeeper=debug"
    } else {
        "nodekeeper=info"
    };
    // env_logger's own layout (`[time LEVEL] message`), with the time
    // written by jiff, which the binary carries anyway: env_logger's
    // `humantime` feature cost more bytes than this closure.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default))
        .format(move |buf, record| {
            use std::io::Write as _;
            // Milliseconds at debug level, where the log is a timeline
            // (a round's writes, the drain's steps); seconds otherwise.
            let unit = if log::max_level() >= log::LevelFilter::Debug {
                jiff::Unit::Millisecond
            } else {
                jiff::Unit::Second
            };
            let now = jiff::Timestamp::now()
                .round(unit)
                .unwrap_or_else(|_| jiff::Timestamp::now());
            match format {
                Format::Text => writeln!(buf, "[{now} {:<5}] {}", record.level(), record.args()),
                Format::Json => {
                    let message = record.args().to_string();
                    let line =
                        json_line(&now.to_string(), record.level(), record.target(), &message);
                    writeln!(buf, "{line}")
                }
            }
        })
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_carry_the_node_and_object_a_line_is_about() {
        let line = json_line(
            "2026-11-26T20:00:00Z",
            log::Level::Warn,
            "nodekeeper::service",
            "node worker-1: the drain is blocked by \"pdb\"",
        );
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        assert_eq!(v["level"], "warn");
        assert_eq!(v["node"], "worker-1");
        assert_eq!(
            v["message"],
            "node worker-1: the drain is blocked by \"pdb\""
        );
        assert!(v.get("object").is_none());
        let v: serde_json::Value = serde_json::from_str(&json_line(
            "t",
            log::Level::Info,
            "x",
            "RebootPolicy workers: admitted a",
        ))
        .unwrap_or_default();
        assert_eq!(v["object"], "RebootPolicy/workers");
        assert_eq!(
            subject("talking HTTP/2 to the API server; up to 110"),
            (None, None)
        );
        assert_eq!(subject("received Term, shutting down"), (None, None));
        assert_eq!(
            "yaml".parse::<Format>(),
            Err("--log-format must be text or json, not \"yaml\"".into())
        );
    }
}
