//! How the command line is read and written, where argh alone falls short
//! of what people type: `--flag=value` as well as `--flag value`, durations
//! with a unit (`10s`, `2m`, `1h`) as well as bare seconds, and output to a
//! reader that may go away (`nodekeeper crds | head -1` ends quietly instead
//! of panicking on the closed pipe).

use std::fmt;
use std::io::Write;
use std::process::ExitCode;

use argh::FromArgs;

use super::Cli;

/// The command line, parsed; `--help` and usage errors are printed and end
/// the process (2 for a usage error, as most tools do).
pub fn from_env() -> Result<Cli, ExitCode> {
    let all: Vec<String> = std::env::args().collect();
    let name = all
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .and_then(|n| n.to_str())
        .unwrap_or("nodekeeper");
    // As a kubectl plugin (a `kubectl-nodekeeper` link on PATH), kubectl
    // runs it with the same arguments: only the usage line's name differs.
    let name = match name {
        "kubectl-nodekeeper" => "kubectl nodekeeper".to_string(),
        n => n.to_string(),
    };
    let args = split_equals(all.get(1..).unwrap_or_default());
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    Cli::from_args(&[&name], &refs).map_err(|exit| {
        if exit.status.is_ok() {
            out(format_args!("{}", exit.output));
            ExitCode::SUCCESS
        } else {
            eprintln!("{}", exit.output);
            ExitCode::from(2)
        }
    })
}

/// `--flag=value` → `--flag value`, up to a `--` (what follows it, such
/// as `host-exec`'s command, is passed on untouched).
pub fn split_equals(args: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len());
    let mut rest = args.iter();
    for a in rest.by_ref() {
        if a == "--" {
            out.push(a.clone());
            break;
        }
        match a.strip_prefix("--").and_then(|f| f.split_once('=')) {
            Some((flag, value))
                if !flag.is_empty()
                    && flag
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') =>
            {
                out.push(format!("--{flag}"));
                out.push(value.to_string());
            }
            _ => out.push(a.clone()),
        }
    }
    out.extend(rest.cloned());
    out
}

/// Seconds, bare or with a unit: `90`, `90s`, `2m`, `1h`.
pub fn parse_seconds(s: &str) -> Result<u64, String> {
    let (digits, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, ""),
    };
    let n: u64 = digits.parse().map_err(|_| {
        format!("{s:?} is not a duration: give seconds (90) or a unit (90s, 2m, 1h)")
    })?;
    let factor = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => {
            return Err(format!(
                "{s:?} is not a duration: the unit must be s, m or h"
            ));
        }
    };
    n.checked_mul(factor)
        .ok_or_else(|| format!("{s:?} is too long a duration"))
}

/// Write to stdout. A reader that went away ends the command quietly (exit
/// 0), as `head` expects of the tools it reads; `print!` would panic.
pub fn out(text: fmt::Arguments) {
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(text).and_then(|()| stdout.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("nodekeeper: error: writing to stdout: {e}");
        std::process::exit(1);
    }
}

/// [`out`] and a newline.
pub fn outln(text: fmt::Arguments) {
    out(format_args!("{text}\n"));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn flags_with_equals_are_split_up_to_the_end_of_options() {
        assert_eq!(
            split_equals(&strings(&[
                "run",
                "--kubeconfig=/tmp/k",
                "--node",
                "a",
                "-v"
            ])),
            strings(&["run", "--kubeconfig", "/tmp/k", "--node", "a", "-v"])
        );
        assert_eq!(
            split_equals(&strings(&["--pod-selector=app=web"])),
            strings(&["--pod-selector", "app=web"])
        );
        // What follows `--` is a command of its own.
        assert_eq!(
            split_equals(&strings(&["host-exec", "--", "env", "--x=y"])),
            strings(&["host-exec", "--", "env", "--x=y"])
        );
        // Not a flag name: left as it is.
        assert_eq!(split_equals(&strings(&["--=x"])), strings(&["--=x"]));
    }

    #[test]
    fn durations_take_seconds_or_a_unit() {
        assert_eq!(parse_seconds("90"), Ok(90));
        assert_eq!(parse_seconds("90s"), Ok(90));
        assert_eq!(parse_seconds("2m"), Ok(120));
        assert_eq!(parse_seconds("1h"), Ok(3600));
        assert!(parse_seconds("10d").is_err_and(|e| e.contains("s, m or h")));
        assert!(parse_seconds("soon").is_err_and(|e| e.contains("not a duration")));
        assert!(parse_seconds("").is_err());
    }
}
