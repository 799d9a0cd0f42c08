//! The little HTTP nodekeeper speaks to things that are not the API
//! server: a notification's JSON `POST` ([`post`]) and a channel's `GET`
//! ([`head_of`]), HTTP/1.1 over plain TCP or through rustls (`https://`:
//! the system's CA bundle, `SSL_CERT_FILE` in our image, or a Secret's own
//! `ca.crt`), bounded by a deadline, every failure one line. A URL may
//! carry a token, so no message names more of it than its host.

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use smol::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// An answer's head past this is cut (a webhook answers in a few bytes).
const ANSWER_LIMIT: usize = 16 * 1024;

/// A checked URL: scheme, host, port, path with query.
#[derive(Debug, PartialEq, Eq)]
pub struct Url {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    pub path: String,
}

/// Parse and check a webhook URL: `http://` or `https://`, a host of
/// letters, digits, `-` and `.`, an optional port, a path and query of
/// printable characters (no spaces: nothing can be smuggled into the
/// request line).
pub fn parse_url(url: &str) -> Result<Url, String> {
    let url = url.trim();
    let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("http://") {
        (false, r)
    } else {
        return Err("the URL is not http:// or https://".into());
    };
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (
            h,
            p.parse::<u16>()
                .map_err(|_| "the URL's port is not a number".to_string())?,
        ),
        None => (authority, if tls { 443 } else { 80 }),
    };
    let host_ok = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if !host_ok {
        return Err("the URL's host is not a host name or IPv4 address".into());
    }
    if !path.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("the URL's path has spaces or control characters".into());
    }
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_string()
    };
    Ok(Url {
        tls,
        host: host.to_string(),
        port,
        path,
    })
}

/// `url` as a log line, a status or an event may show it: scheme, host,
/// port and path, never its query, fragment or user info (a channel's or
/// a webhook's token rides there).
pub fn shown(url: &str) -> String {
    let url = url.trim();
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let (no_query, query) = match rest.find(['?', '#']) {
        Some(i) => (&rest[..i], true),
        None => (rest, false),
    };
    let (authority, path) = no_query
        .find('/')
        .map_or((no_query, ""), |i| no_query.split_at(i));
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let shown: String = format!("{scheme}://{host}{path}")
        .chars()
        .filter(char::is_ascii_graphic)
        .take(200)
        .collect();
    if query { format!("{shown}?…") } else { shown }
}

/// Why a delivery failed, and whether another try may help.
#[derive(Debug, PartialEq, Eq)]
pub struct Failure {
    pub why: String,
    /// A refusal (4xx other than 408/429) or a bad URL: trying again
    /// would get the same answer.
    pub permanent: bool,
}

fn transient(why: String) -> Failure {
    Failure {
        why,
        permanent: false,
    }
}

/// POST `body` to `url`; Ok on a 2xx answer.
pub async fn post(
    url: &str,
    body: &[u8],
    ca: Option<&[u8]>,
    deadline: Duration,
) -> Result<(), Failure> {
    let raw = send(url, Some(body), ca, deadline).await?;
    let host = parse_url(url).map(|u| u.host).unwrap_or_default();
    judge(&raw, &host)
}

/// GET `url` (no redirect followed) and give its status code and
/// `Location` header.
pub async fn head_of(url: &str, deadline: Duration) -> Result<(u16, Option<String>), Failure> {
    let raw = send(url, None, None, deadline).await?;
    let host = parse_url(url).map(|u| u.host).unwrap_or_default();
    let text = String::from_utf8_lossy(&raw);
    let code =
        status_code(&text).ok_or_else(|| transient(format!("{host} did not answer HTTP")))?;
    let head = text.split("\r\n\r\n").next().unwrap_or_default();
    let location = head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("location")
            .then(|| v.trim().to_string())
    });
    Ok((code, location))
}

fn status_code(text: &str) -> Option<u16> {
    text.lines()
        .next()?
        .trim()
        .strip_prefix("HTTP/1.")
        .and_then(|s| s.get(2..5))
        .and_then(|c| c.parse::<u16>().ok())
}

/// One request (a POST with `body`, else a GET); the answer's head and the
/// start of its body.
async fn send(
    url: &str,
    body: Option<&[u8]>,
    ca: Option<&[u8]>,
    deadline: Duration,
) -> Result<Vec<u8>, Failure> {
    let u = parse_url(url).map_err(|why| Failure {
        why,
        permanent: true,
    })?;
    let host = u.host.clone();
    let send = async {
        let tcp = smol::net::TcpStream::connect((u.host.as_str(), u.port))
            .await
            .map_err(|e| transient(format!("cannot connect to {host}:{}: {e}", u.port)))?;
        if u.tls {
            let config = tls_config(ca).map_err(|why| Failure {
                why,
                permanent: true,
            })?;
            let name = ServerName::try_from(u.host.clone())
                .map_err(|e| transient(format!("{host} is not a TLS server name: {e}")))?;
            let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
                .connect(name, async_compat::Compat::new(tcp))
                .await
                .map_err(|e| transient(format!("TLS with {host}: {e}")))?;
            exchange(async_compat::Compat::new(tls), &u, body).await
        } else {
            exchange(tcp, &u, body).await
        }
    };
    crate::runtime::timeout(deadline, send)
        .await
        .unwrap_or_else(|()| {
            Err(transient(format!(
                "no answer from {host} within {} s",
                deadline.as_secs()
            )))
        })
}

/// The client's TLS: the given CA bundle, else the system's.
fn tls_config(ca: Option<&[u8]>) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| format!("the Secret's ca.crt is not PEM: {e}"))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("the Secret's ca.crt: {e}"))?;
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    if roots.is_empty() {
        return Err(match ca {
            Some(_) => "the Secret's ca.crt holds no certificate".into(),
            None => "no CA certificates to check the server with: set SSL_CERT_FILE or put the CA in the Secret's ca.crt".into(),
        });
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// Write the request, read the answer's head (and a little body).
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut conn: S,
    u: &Url,
    body: Option<&[u8]>,
) -> Result<Vec<u8>, Failure> {
    let host = &u.host;
    let head = match body {
        Some(b) => format!(
            "POST {} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: nodekeeper\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            u.path,
            b.len()
        ),
        None => format!(
            "GET {} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: nodekeeper\r\nConnection: close\r\n\r\n",
            u.path
        ),
    };
    let write = async {
        conn.write_all(head.as_bytes()).await?;
        conn.write_all(body.unwrap_or_default()).await?;
        conn.flush().await
    };
    write
        .await
        .map_err(|e| transient(format!("writing to {host}: {e}")))?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 2048];
    // The status line and headers (and a short body, for the message);
    // a server that keeps the connection open after them is not waited on.
    while raw.len() < ANSWER_LIMIT {
        let n = conn
            .read(&mut buf)
            .await
            .map_err(|e| transient(format!("reading from {host}: {e}")))?;
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n")
            && raw.len() >= end + 4
        {
            break;
        }
    }
    Ok(raw)
}

/// A 2xx answer is a delivery; anything else says why.
fn judge(raw: &[u8], host: &str) -> Result<(), Failure> {
    let text = String::from_utf8_lossy(raw);
    let status = text.lines().next().unwrap_or_default().trim();
    let code = status_code(&text)
        .ok_or_else(|| transient(format!("{host} did not answer HTTP ({status:?})")))?;
    if (200..300).contains(&code) {
        return Ok(());
    }
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.trim())
        .unwrap_or_default();
    let body: String = body.chars().take(120).collect();
    let said = if body.is_empty() {
        String::new()
    } else {
        format!(": {}", body.replace(['\r', '\n'], " "))
    };
    Err(Failure {
        why: format!("{host} answered {status:?}{said}"),
        permanent: (400..500).contains(&code) && code != 408 && code != 429,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_shown_url_keeps_no_token() {
        use super::shown;
        assert_eq!(
            shown("https://user:secret@upd.example:8443/c/stable?token=SECRET123#x"),
            "https://upd.example:8443/c/stable?…"
        );
        assert_eq!(shown("http://127.0.0.1:1/c"), "http://127.0.0.1:1/c");
        assert!(!shown("http://h/p?token=SECRET123").contains("SECRET"));
    }

    use super::*;

    #[test]
    fn urls_are_checked_before_any_connection() {
        assert_eq!(
            parse_url("https://hooks.example.com/services/T0/B0/x?a=1&b=%2F"),
            Ok(Url {
                tls: true,
                host: "hooks.example.com".into(),
                port: 443,
                path: "/services/T0/B0/x?a=1&b=%2F".into(),
            })
        );
        assert_eq!(
            parse_url("http://127.0.0.1:8080"),
            Ok(Url {
                tls: false,
                host: "127.0.0.1".into(),
                port: 8080,
                path: "/".into(),
            })
        );
        assert!(parse_url("ftp://x").is_err());
        assert!(parse_url("http://a b/").is_err());
        assert!(parse_url("http://h/a\r\nX: y").is_err());
        assert!(parse_url("http://h:99999/").is_err());
        assert!(parse_url("http:///x").is_err());
    }

    #[test]
    fn answers_are_judged_and_refusals_are_not_retried() {
        assert_eq!(judge(b"HTTP/1.1 204 No Content\r\n\r\n", "h"), Ok(()));
        let no = judge(b"HTTP/1.1 403 Forbidden\r\n\r\ninvalid_token", "h");
        assert_eq!(
            no,
            Err(Failure {
                why: "h answered \"HTTP/1.1 403 Forbidden\": invalid_token".into(),
                permanent: true,
            })
        );
        assert!(judge(b"HTTP/1.1 503 Busy\r\n\r\n", "h").is_err_and(|f| !f.permanent));
        assert!(judge(b"HTTP/1.1 429 Slow down\r\n\r\n", "h").is_err_and(|f| !f.permanent));
        assert!(judge(b"garbage", "h").is_err_and(|f| !f.permanent));
    }

    #[test]
    fn a_ca_bundle_without_certificates_is_refused() {
        assert!(tls_config(Some(b"not pem")).is_err());
    }
}
