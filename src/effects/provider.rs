//! The provider plugin: the one way nodekeeper talks to a cloud. An
//! executable named by `run --provider-command` is run once per question,
//! `PROVIDER <verb>` with one JSON request on stdin; it answers one JSON
//! object on stdout and exits 0, or exits non-zero with a message on stderr
//! (or `{"error": "..."}` on stdout). The verbs, requests and answers are
//! in the README ("Node replacement: the provider protocol").
//!
//! Every call is bounded by a timeout and killed past it, and every way a
//! provider can misbehave (no such file, non-zero exit, bad JSON, a hang)
//! comes back as one line of text for status and events: a provider can
//! stall the replacement pass for at most its timeout, never the loop.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use smol::io::AsyncWriteExt;

/// How to reach the provider.
#[derive(Debug, Clone)]
pub struct Provider {
    pub command: PathBuf,
    pub timeout: Duration,
}

/// Output past this is cut: an answer is a few hundred bytes.
const ANSWER_LIMIT: usize = 64 * 1024;

/// (verb, answered: `ok` or `error`) → calls, for `/metrics`.
pub static CALLS: crate::counts::Counts<(String, &'static str)> = crate::counts::Counts::new();

impl Provider {
    /// Ask `verb` with `request`; the answer object, or why not.
    pub async fn call(&self, verb: &str, request: &Value) -> Result<Value, String> {
        let answer = self.ask(verb, request).await;
        CALLS.add((
            verb.to_string(),
            if answer.is_ok() { "ok" } else { "error" },
        ));
        answer
    }

    async fn ask(&self, verb: &str, request: &Value) -> Result<Value, String> {
        let what = format!("provider {verb}");
        let mut child = smol::process::Command::new(&self.command)
            .arg(verb)
            .stdin(smol::process::Stdio::piped())
            .stdout(smol::process::Stdio::piped())
            .stderr(smol::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("{what}: cannot run {}: {e}", self.command.display()))?;
        let body = serde_json::to_vec(request).unwrap_or_default();
        let run = async move {
            if let Some(mut stdin) = child.stdin.take() {
                // A provider that does not read its request is its business.
                let _ = stdin.write_all(&body).await;
                drop(stdin);
            }
            child.output().await
        };
        let timeout = async {
            crate::runtime::sleep(self.timeout).await;
            Err(std::io::Error::other("timeout"))
        };
        let out = smol::future::or(run, timeout).await.map_err(|e| {
            if e.to_string() == "timeout" {
                format!(
                    "{what}: no answer within {} s (killed)",
                    self.timeout.as_secs()
                )
            } else {
                format!("{what}: {e}")
            }
        })?;
        let stdout = String::from_utf8_lossy(&out.stdout[..out.stdout.len().min(ANSWER_LIMIT)]);
        let parsed: Option<Value> = serde_json::from_str(stdout.trim()).ok();
        let said_error = parsed
            .as_ref()
            .and_then(|v| v.get("error"))
            .and_then(|e| e.as_str())
            .map(str::to_string);
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let msg = said_error
                .or_else(|| last_line(&stderr))
                .unwrap_or_else(|| "no message".into());
            return Err(format!(
                "{what}: exited with {}: {msg}",
                out.status.code().unwrap_or(-1)
            ));
        }
        if let Some(e) = said_error {
            return Err(format!("{what}: {e}"));
        }
        match parsed {
            Some(v @ Value::Object(_)) => Ok(v),
            _ => Err(format!(
                "{what}: the answer is not a JSON object: {:?}",
                cut(stdout.trim())
            )),
        }
    }
}

fn last_line(s: &str) -> Option<String> {
    s.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(|l| cut(l).to_string())
}

fn cut(s: &str) -> &str {
    let mut end = s.len().min(200);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// One string field of an answer, or why the answer is unusable.
pub fn field<'a>(answer: &'a Value, verb: &str, key: &str) -> Result<&'a str, String> {
    answer
        .get(key)
        .and_then(|v| v.as_str())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| format!("provider {verb}: the answer has no {key:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn script(body: &str) -> (tempdir::Dir, Provider) {
        let dir = tempdir::Dir::new();
        let path = dir.0.join("provider");
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        (
            dir,
            Provider {
                command: path,
                timeout: Duration::from_millis(500),
            },
        )
    }

    mod tempdir {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                let p = std::env::temp_dir().join(format!(
                    "nk-provider-{}-{:?}",
                    std::process::id(),
                    std::thread::current().id()
                ));
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    /// The call, tried again while exec says "Text file busy": the script
    /// was just written, and a process another test thread forks in that
    /// moment holds a copy of the write descriptor until it execs itself
    /// (ETXTBSY, a known race of writing an executable and running it in a
    /// multi-threaded process). A provider written by someone else is not
    /// exposed to it.
    fn call(p: &Provider, verb: &str) -> Result<Value, String> {
        let mut tries = 0;
        loop {
            let answer = smol::block_on(p.call(verb, &json!({"providerID": "kwok://a"})));
            match answer {
                Err(e) if e.contains("Text file busy") && tries < 100 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(10));
                }
                answer => return answer,
            }
        }
    }

    #[test]
    fn answers_and_failures_come_back_as_one_line() {
        let (_d, p) = script(r#"read req; echo "{\"verb\": \"$1\", \"req\": $req}""#);
        let v = call(&p, "node-state").unwrap();
        assert_eq!(v["verb"], "node-state");
        assert_eq!(v["req"]["providerID"], "kwok://a");

        let (_d, p) = script("echo 'no such instance' >&2; exit 3");
        let e = call(&p, "node-image").unwrap_err();
        assert_eq!(e, "provider node-image: exited with 3: no such instance");

        let (_d, p) = script(r#"echo '{"error": "quota exceeded"}'; exit 1"#);
        assert_eq!(
            call(&p, "create-node").unwrap_err(),
            "provider create-node: exited with 1: quota exceeded"
        );

        let (_d, p) = script("echo not json");
        assert!(
            call(&p, "node-state")
                .unwrap_err()
                .contains("not a JSON object")
        );

        let (_d, p) = script("sleep 5");
        assert!(
            call(&p, "node-state")
                .unwrap_err()
                .contains("no answer within")
        );

        let p = Provider {
            command: "/nonexistent/provider".into(),
            timeout: Duration::from_secs(1),
        };
        assert!(call(&p, "node-state").unwrap_err().contains("cannot run"));
    }
}
