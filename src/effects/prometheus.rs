//! Asking Prometheus which alerts are active, for `gates.prometheus`:
//! `GET <url>/api/v1/alerts` over plain HTTP/1.1, bounded by a deadline,
//! every way it can fail (no such host, refused, a hang, not Prometheus's
//! answer) coming back as one line for the waiting node's message. The
//! gate's URL is checked by the CRD (http://, host, optional port and path)
//! and again here before any connection.

use std::time::Duration;

use serde_json::Value;
use smol::io::{AsyncReadExt, AsyncWriteExt};

/// An answer past this is cut and refused: thousands of alerts fit.
const ANSWER_LIMIT: u64 = 8 * 1024 * 1024;

/// Host (with port) and path of an `http://` URL.
fn split(url: &str) -> Result<(String, String), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url:?} is not an http:// URL"))?;
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    let ok = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:".contains(&b))
        && path
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~/".contains(&b));
    if !ok {
        return Err(format!("{url:?} is not a URL nodekeeper can ask"));
    }
    let host = if host.contains(':') {
        host.to_string()
    } else {
        format!("{host}:80")
    };
    Ok((host, path.to_string()))
}

/// Every active alert as (alertname, state), or why not.
pub async fn active_alerts(url: &str, deadline: Duration) -> Result<Vec<(String, String)>, String> {
    let (host, path) = split(url)?;
    let ask = async {
        let mut conn = smol::net::TcpStream::connect(&host)
            .await
            .map_err(|e| format!("cannot connect to {host}: {e}"))?;
        let request = format!(
            "GET {path}/api/v1/alerts HTTP/1.1\r\nHost: {host}\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
        );
        conn.write_all(request.as_bytes())
            .await
            .map_err(|e| format!("writing to {host}: {e}"))?;
        let mut raw = Vec::new();
        (&mut conn)
            .take(ANSWER_LIMIT + 1)
            .read_to_end(&mut raw)
            .await
            .map_err(|e| format!("reading from {host}: {e}"))?;
        if raw.len() as u64 > ANSWER_LIMIT {
            return Err(format!("the answer is over {ANSWER_LIMIT} bytes"));
        }
        parse(&raw)
    };
    crate::runtime::timeout(deadline, ask)
        .await
        .unwrap_or_else(|()| {
            Err(format!(
                "no answer from {host} within {} s",
                deadline.as_secs()
            ))
        })
}

/// The alerts in an HTTP answer to `/api/v1/alerts`.
fn parse(raw: &[u8]) -> Result<Vec<(String, String)>, String> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("not an HTTP answer")?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let body = &raw[end + 4..];
    let status = head.lines().next().unwrap_or_default();
    if status.split(' ').nth(1).is_none_or(|c| c != "200") {
        return Err(format!("answered {status:?}"));
    }
    // Chunks count bytes: undone before the text is decoded.
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body).ok_or("a broken chunked answer")?
    } else {
        body.to_vec()
    };
    let v: Value = serde_json::from_slice(&body)
        .map_err(|e| format!("the answer is not Prometheus's JSON: {e}"))?;
    let alerts = v["data"]["alerts"]
        .as_array()
        .ok_or("the answer has no data.alerts (is this Prometheus's API?)")?;
    Ok(alerts
        .iter()
        .filter_map(|a| {
            Some((
                a["labels"]["alertname"].as_str()?.to_string(),
                a["state"].as_str().unwrap_or("firing").to_string(),
            ))
        })
        .collect())
}

fn dechunk(mut rest: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line = rest.windows(2).position(|w| w == b"\r\n")?;
        let size = std::str::from_utf8(&rest[..line]).ok()?;
        let n = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        let after = &rest[line + 2..];
        if n == 0 {
            return Some(out);
        }
        out.extend_from_slice(after.get(..n)?);
        rest = after.get(n + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_split_and_checked() {
        assert_eq!(
            split("http://prometheus.monitoring:9090"),
            Ok(("prometheus.monitoring:9090".into(), String::new()))
        );
        assert_eq!(split("http://p/prom/"), Ok(("p:80".into(), "/prom".into())));
        assert!(split("https://p").is_err());
        assert!(split("http://p/a b").is_err());
        assert!(split("http://p\r\nX: y").is_err());
    }

    #[test]
    fn answers_are_read_plain_or_chunked_and_failures_say_why() {
        let body = r#"{"status":"success","data":{"alerts":[{"labels":{"alertname":"A"},"state":"firing"},{"labels":{"alertname":"B"},"state":"pending"}]}}"#;
        let plain = format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{body}");
        let want = vec![
            ("A".to_string(), "firing".to_string()),
            ("B".to_string(), "pending".to_string()),
        ];
        assert_eq!(parse(plain.as_bytes()), Ok(want.clone()));
        let (a, b) = body.split_at(10);
        let chunked = format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
            a.len(),
            b.len()
        );
        assert_eq!(parse(chunked.as_bytes()), Ok(want));
        let refused = parse(b"HTTP/1.1 503 Service Unavailable\r\n\r\nnot ready");
        assert_eq!(
            refused,
            Err("answered \"HTTP/1.1 503 Service Unavailable\"".into())
        );
        assert!(parse(b"HTTP/1.1 200 OK\r\n\r\n{}").is_err_and(|e| e.contains("no data.alerts")));
    }
}
