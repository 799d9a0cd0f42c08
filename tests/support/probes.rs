//! Looking at a running process from outside: its HTTP endpoints on
//! loopback, a free port, its CPU seconds, cores and memory, and an Event's
//! count as `kubectl describe` shows it.

use std::time::Duration;

/// One HTTP GET on loopback; (status line, body), or None if nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(String, String)> {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(conn, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").ok()?;
    let mut text = String::new();
    conn.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    Some((head.lines().next()?.to_string(), body.to_string()))
}

/// A port nothing listens on now (for an agent's `--metrics-address`).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// User plus system CPU seconds of a process (clock ticks of 1/100 s).
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command (which may hold spaces) start at "state".
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// The cores process `pid` used over the next `window` (CPU seconds per
/// second of wall time), printed with `what` for the record (run the test
/// with `--nocapture` to read it).
pub async fn cores_used(pid: u32, window: Duration, what: &str) -> f64 {
    let before = cpu_seconds(pid);
    smol::Timer::after(window).await;
    let used = (cpu_seconds(pid) - before) / window.as_secs_f64();
    eprintln!("cores used {what}: {used:.4} over {window:?}");
    used
}

/// A field of /proc/PID/status in KiB (`VmRSS`, `VmHWM`), 0 if unreadable.
pub fn rss_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// How many times an Event was seen, as `kubectl describe` shows it: an
/// events.k8s.io series counts in `series.count`, which the core view does
/// not fold into `count`.
pub fn event_count(e: &k8s_openapi::api::core::v1::Event) -> usize {
    let series = e.series.as_ref().and_then(|s| s.count);
    series.or(e.count).unwrap_or(1).max(1) as usize
}
