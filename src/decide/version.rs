//! The one check for every value that fills `{version}`: a plan's
//! `spec.version`, a channel's answer, the version an admission recorded.
//! Such a value reaches root commands on every selected node (as an
//! argument of `strategy.command`), a Job's image, args and env, a Talos
//! installer image and node labels, so it is held to what a container
//! image tag may be (plus `+`, which k3s and RKE2 versions carry):
//! `[A-Za-z0-9][A-Za-z0-9._+-]{0,127}`. No space, quote, `;`, `$`, `/` or
//! `..`-led path can get through it into an argv.
//!
//! Where it fills an image reference it is written as
//! system-upgrade-controller writes it (`pkg/upgrade/plan/plan.go`,
//! `MungeVersion`: `+` becomes `-`, the k3s-upgrade images' tags); where
//! it fills a label value it is checked as a label value with the real
//! version ([`crate::decide::marking::check`]).

use std::fmt;

/// The longest version: an image tag's 128 characters.
pub const MAX_LEN: usize = 128;

/// The spec's CEL/OpenAPI pattern, the same rule as [`Version::parse`].
pub const PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$";

/// A checked version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version(String);

impl Version {
    /// The value if it is a version; otherwise why not, naming it
    /// (escaped, so a hostile answer prints as text, never as a control
    /// sequence in a log).
    pub fn parse(s: &str) -> Result<Version, String> {
        let mut chars = s.chars();
        let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
        let rest_ok =
            chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '+' | '-'));
        if first_ok && rest_ok && s.len() <= MAX_LEN {
            return Ok(Version(s.to_string()));
        }
        let shown: String = s.chars().take(64).collect();
        let more = if s.chars().count() > 64 { "…" } else { "" };
        Err(format!(
            "{shown:?}{more} is not a version (1 to {MAX_LEN} letters, digits, '.', '_', '+' or '-', starting with a letter or digit)"
        ))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The version as an image tag (see [`image_tag`]).
    pub fn image_tag(&self) -> String {
        image_tag(&self.0)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A version as an image tag: `+` → `-`, as SUC's `MungeVersion` writes
/// it (`v1.33.1+k3s1` → `v1.33.1-k3s1`).
pub fn image_tag(version: &str) -> String {
    version.replace('+', "-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_checks_versions_by_the_same_rule() {
        assert!(crate::api::upgrade::VERSION_RULE.contains(PATTERN));
    }

    #[test]
    fn versions_are_what_an_image_tag_may_be_plus_the_k3s_plus() {
        for ok in ["v1.33.1+k3s1", "1.2.3", "v1.31.4-rke2r1", "A_b.c", "9"] {
            assert_eq!(Version::parse(ok).map(|v| v.to_string()), Ok(ok.into()));
        }
        let long = "v".repeat(MAX_LEN + 1);
        for bad in [
            "",
            "v1; touch /tmp/pwned",
            "$(id)",
            "`id`",
            "v1 --force",
            "-v1",
            ".v1",
            "../etc",
            "v1/x",
            "v1\n",
            "v1'",
            "v1\"",
            long.as_str(),
        ] {
            assert!(Version::parse(bad).is_err(), "{bad:?} accepted");
        }
        let err = Version::parse("v1; touch /tmp/pwned").unwrap_err();
        assert!(
            err.starts_with("\"v1; touch /tmp/pwned\" is not a version"),
            "{err}"
        );
    }

    /// system-upgrade-controller `pkg/upgrade/plan/plan.go` `MungeVersion`:
    /// `strings.ReplaceAll(version, "+", "-")` for the image tag.
    #[test]
    fn an_image_gets_the_version_as_system_upgrade_controller_munges_it() {
        let v = Version::parse("v1.33.1+k3s1").unwrap();
        assert_eq!(v.image_tag(), "v1.33.1-k3s1");
        assert_eq!(v.as_str(), "v1.33.1+k3s1");
    }
}
