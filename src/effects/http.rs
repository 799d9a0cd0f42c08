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
#[derive(Debug, Clone, PartialEq, Eq)]
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
    let proxy = proxy_for(&u, |k| std::env::var(k).ok()).map_err(|why| Failure {
        why,
        permanent: true,
    })?;
    let send = async {
        let tcp = match &proxy {
            Some(p) => through(p, &u).await?,
            None => smol::net::TcpStream::connect((u.host.as_str(), u.port))
                .await
                .map_err(|e| transient(format!("cannot connect to {host}:{}: {e}", u.port)))?,
        };
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
        } else if proxy.is_some() {
            // Plain HTTP through a proxy: the request names the whole URL,
            // the default port left out as Go's client writes it.
            let port = if u.port == 80 {
                String::new()
            } else {
                format!(":{}", u.port)
            };
            let absolute = Url {
                path: format!("http://{}{port}{}", u.host, u.path),
                ..u.clone()
            };
            exchange(tcp, &absolute, body).await
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

/// A proxy: host and port (`http://` only, as Go's transport takes from
/// the environment; credentials in it are refused, not sent in clear).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proxy {
    pub host: String,
    pub port: u16,
}

/// The proxy for `u` as system-upgrade-controller's and kured's HTTP
/// clients pick it (Go's `http.ProxyFromEnvironment`, `x/net/http/httpproxy`):
/// `HTTPS_PROXY`/`https_proxy` for `https://`, `HTTP_PROXY`/`http_proxy`
/// for `http://`, none for a host `NO_PROXY`/`no_proxy` names (`*`; a
/// host; a domain and its subdomains, with or without a leading `.`; an
/// IP; `host:port` for that port only) or for loopback. `env` reads one
/// variable (the process's environment in service).
pub fn proxy_for(u: &Url, env: impl Fn(&str) -> Option<String>) -> Result<Option<Proxy>, String> {
    let pick = |upper: &str, lower: &str| {
        env(upper)
            .or_else(|| env(lower))
            .filter(|v| !v.trim().is_empty())
    };
    let Some(raw) = (if u.tls {
        pick("HTTPS_PROXY", "https_proxy")
    } else {
        pick("HTTP_PROXY", "http_proxy")
    }) else {
        return Ok(None);
    };
    let host = u.host.to_ascii_lowercase();
    if host == "localhost" || host.starts_with("127.") || host == "::1" {
        return Ok(None);
    }
    let no_proxy = pick("NO_PROXY", "no_proxy").unwrap_or_default();
    for entry in no_proxy.split(',').map(|e| e.trim().to_ascii_lowercase()) {
        if entry.is_empty() {
            continue;
        }
        if entry == "*" {
            return Ok(None);
        }
        let (name, port) = match entry.rsplit_once(':') {
            Some((n, p)) if p.parse::<u16>().is_ok() => (n.to_string(), p.parse::<u16>().ok()),
            _ => (entry.clone(), None),
        };
        if port.is_some_and(|p| p != u.port) {
            continue;
        }
        let name = name.trim_start_matches("*.").trim_start_matches('.');
        if host == name || host.ends_with(&format!(".{name}")) {
            return Ok(None);
        }
    }
    // `host:port` alone is read as http://host:port, as Go does.
    let with_scheme = if raw.contains("://") {
        raw.trim().to_string()
    } else {
        format!("http://{}", raw.trim())
    };
    let Some(rest) = with_scheme.strip_prefix("http://") else {
        return Err("the proxy in HTTPS_PROXY/HTTP_PROXY is not an http:// URL".into());
    };
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    if authority.contains('@') {
        return Err("the proxy in HTTPS_PROXY/HTTP_PROXY carries credentials, which nodekeeper does not send".into());
    }
    let (phost, pport) = match authority.rsplit_once(':') {
        Some((h, p)) => (
            h,
            p.parse::<u16>()
                .map_err(|_| "the proxy's port is not a number".to_string())?,
        ),
        None => (authority, 80),
    };
    if phost.is_empty()
        || !phost
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    {
        return Err("the proxy's host is not a host name or IPv4 address".into());
    }
    Ok(Some(Proxy {
        host: phost.to_string(),
        port: pport,
    }))
}

/// A connection to `u` through `p`: for `https://` a `CONNECT` tunnel (TLS
/// then runs end to end); for `http://` the proxy itself, which gets the
/// request in absolute form.
async fn through(p: &Proxy, u: &Url) -> Result<smol::net::TcpStream, Failure> {
    let mut tcp = smol::net::TcpStream::connect((p.host.as_str(), p.port))
        .await
        .map_err(|e| {
            transient(format!(
                "cannot connect to the proxy {}:{}: {e}",
                p.host, p.port
            ))
        })?;
    if !u.tls {
        return Ok(tcp);
    }
    let target = format!("{}:{}", u.host, u.port);
    let ask =
        format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nUser-Agent: nodekeeper\r\n\r\n");
    tcp.write_all(ask.as_bytes())
        .await
        .map_err(|e| transient(format!("writing to the proxy {}: {e}", p.host)))?;
    // Its answer's head, byte by byte: nothing of the tunnel may be read.
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < ANSWER_LIMIT {
        let n = tcp
            .read(&mut byte)
            .await
            .map_err(|e| transient(format!("reading from the proxy {}: {e}", p.host)))?;
        if n == 0 {
            break;
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head);
    match status_code(&text) {
        Some(200) => Ok(tcp),
        _ => {
            let line: String = text
                .lines()
                .next()
                .unwrap_or_default()
                .chars()
                .take(80)
                .collect();
            Err(transient(format!(
                "the proxy {} refused a tunnel to {}: {line:?}",
                p.host, u.host
            )))
        }
    }
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
    /// Go's `httpproxy.FromEnvironment` as SUC's channel client and
    /// kured's notifier use it (where-features-meet.md, finding 14).
    #[test]
    fn the_proxy_is_taken_from_the_environment_as_gos_transport_takes_it() {
        use super::{Proxy, parse_url, proxy_for};
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let u = |s: &str| parse_url(s).unwrap();
        let proxy = Some(Proxy {
            host: "proxy.corp".into(),
            port: 3128,
        });
        let vars: &[(&str, &str)] = &[
            ("HTTPS_PROXY", "http://proxy.corp:3128"),
            (
                "no_proxy",
                "internal.example,.svc, 10.0.0.7 ,hooks.example:8443",
            ),
        ];
        assert_eq!(
            proxy_for(&u("https://update.example/c"), env(vars)),
            Ok(proxy.clone())
        );
        assert_eq!(
            proxy_for(&u("http://update.example/c"), env(vars)),
            Ok(None),
            "HTTP_PROXY unset"
        );
        for direct in [
            "https://internal.example/x",
            "https://a.internal.example/x",
            "https://api.ns.svc/x",
            "https://10.0.0.7/x",
            "https://hooks.example:8443/x",
            "https://127.0.0.1:9/x",
        ] {
            assert_eq!(proxy_for(&u(direct), env(vars)), Ok(None), "{direct}");
        }
        assert_eq!(
            proxy_for(&u("https://hooks.example/x"), env(vars)),
            Ok(proxy),
            "other port"
        );
        let bare: &[(&str, &str)] = &[("http_proxy", "proxy.corp:8080")];
        assert_eq!(
            proxy_for(&u("http://c.example/v"), env(bare)),
            Ok(Some(Proxy {
                host: "proxy.corp".into(),
                port: 8080
            }))
        );
        let all: &[(&str, &str)] = &[("HTTPS_PROXY", "http://p:1"), ("NO_PROXY", "*")];
        assert_eq!(proxy_for(&u("https://x.example/"), env(all)), Ok(None));
        let creds: &[(&str, &str)] = &[("HTTPS_PROXY", "http://user:pw@p:1")];
        assert!(proxy_for(&u("https://x.example/"), env(creds)).is_err());
    }

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
