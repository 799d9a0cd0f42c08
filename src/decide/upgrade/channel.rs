//! A plan's `channel`, pure: the version an answer names, as
//! system-upgrade-controller reads it. The question itself (a `GET` that
//! follows no redirect) is the service's (`service/channels.rs`).

/// The version in a channel's answer: a `302`'s `Location` names it in its
/// last path element; any other answer from 200 to 399 names it in the
/// last path element of the channel's own URL; anything else is an error.
pub fn version_of(url: &str, code: u16, location: Option<&str>) -> Result<String, String> {
    let from = match (code, location) {
        (302, Some(l)) => l,
        (302, None) => return Err("it answered 302 without a Location".into()),
        (200..=399, _) => url,
        _ => return Err(format!("it answered {code}")),
    };
    // The answer is untrusted: it fills `{version}` in root commands, a
    // Job's image and args and node labels, so it must be a version.
    let version = last_path_element(from);
    crate::decide::version::Version::parse(&version)
        .map(|v| v.to_string())
        .map_err(|why| format!("its answer ({code}) was refused: {why}"))
}

/// Record a question's outcome in `status`: a version read (and checked)
/// replaces the one named and clears the error; a failure or a refused
/// answer keeps the version named before and says why.
pub fn record(
    status: &mut crate::api::upgrade::ChannelStatus,
    answer: Result<String, String>,
    now: k8s_openapi::jiff::Timestamp,
) {
    match answer {
        Ok(v) => {
            status.version = Some(v);
            status.error = None;
            let second = k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now);
            status.resolved = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(second));
        }
        Err(why) => status.error = Some(why),
    }
}

/// The last element of a URL's path (absolute or relative), its `%XX`
/// escapes decoded, without query or fragment.
fn last_path_element(url: &str) -> String {
    let no_scheme = url.split_once("://").map_or(url, |(_, rest)| rest);
    let path = if url.contains("://") {
        no_scheme.find('/').map_or("", |i| &no_scheme[i..])
    } else {
        no_scheme
    };
    let path = path.split(['?', '#']).next().unwrap_or_default();
    let last = path
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or_default();
    decode(last)
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(h), Some(l)) = (
                bytes.get(i + 1).and_then(|b| hex(*b)),
                bytes.get(i + 2).and_then(|b| hex(*b)),
            )
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_name_versions_as_system_upgrade_controller_reads_them() {
        let url = "https://update.example/v1-release/channels/stable";
        assert_eq!(
            version_of(
                url,
                302,
                Some("https://github.example/k3s-io/k3s/releases/tag/v1.33.1%2Bk3s1")
            ),
            Ok("v1.33.1+k3s1".into())
        );
        assert_eq!(
            version_of(url, 302, Some("/releases/tag/v1.34.0/?x=1")),
            Ok("v1.34.0".into())
        );
        // Not a redirect: the URL's own last element, as SUC does.
        assert_eq!(
            version_of("http://c/versions/v2", 200, None),
            Ok("v2".into())
        );
        assert!(version_of(url, 302, None).is_err());
        assert_eq!(version_of(url, 404, None), Err("it answered 404".into()));
        assert!(version_of("http://c/", 200, None).is_err());
    }

    /// A hostile or broken channel never names a version that could reach
    /// an argv, an image or a label (where-features-meet.md, finding 3).
    #[test]
    fn an_answer_that_is_not_a_version_is_refused() {
        let url = "http://c/stable";
        for location in [
            "/x/v1%3B%20touch%20%2Ftmp%2Fpwned",
            "/x/v1%20--force",
            "/x/%24(id)",
            "/x/..",
        ] {
            let got = version_of(url, 302, Some(location));
            assert!(got.is_err(), "{location} gave {got:?}");
        }
        let why = version_of(url, 302, Some("/x/v1%3B%20touch%20%2Ftmp%2Fpwned")).unwrap_err();
        assert!(
            why.contains("\"v1; touch /tmp/pwned\" is not a version"),
            "{why}"
        );
    }
}
