//! Unit tests of `admission`.

use super::*;

/// A webhook off loopback answers only the API server: without the
/// CA of its client certificate it does not start, and says why.
#[test]
fn a_webhook_off_loopback_needs_the_api_servers_client_ca() {
    let parse = |address: &str, ca: Option<&std::path::Path>| {
        Config::parse(address, None, true, ca, "me".into()).map_err(|e| e.to_string())
    };
    assert!(parse("127.0.0.1:9443", None).is_ok());
    let err = parse(":9443", None).err().unwrap_or_default();
    assert!(err.contains("--admission-client-ca"), "{err}");
    let dir = std::env::temp_dir().join(format!("nk-client-ca-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let empty = dir.join("empty.pem");
    let _ = std::fs::write(&empty, "not a certificate\n");
    let err = parse(":9443", Some(&empty)).err().unwrap_or_default();
    assert!(err.contains("no PEM certificate"), "{err}");
    let missing = dir.join("missing.pem");
    let err = parse(":9443", Some(&missing)).err().unwrap_or_default();
    assert!(err.contains("missing.pem"), "{err}");
    let ca = rcgen::generate_simple_self_signed(vec!["ca".into()]).map(|c| c.cert.pem());
    let pem = dir.join("ca.pem");
    let _ = std::fs::write(&pem, ca.unwrap_or_default());
    let ok = parse(":9443", Some(&pem));
    assert!(
        ok.as_ref()
            .is_ok_and(|c| c.client_ca.as_ref().is_some_and(|v| v.len() == 1)),
        "{ok:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
