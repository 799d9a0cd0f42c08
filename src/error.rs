//! nodekeeper's one error type. Each variant carries the context a user needs
//! to act on it; `Display` renders one line (context: cause), which is what
//! the CLI prints and what status fields and events carry.

use std::fmt;

/// Everything that can go wrong, grouped by what the user should do about it.
#[derive(Debug)]
pub enum Error {
    /// No usable kubeconfig or in-cluster credentials.
    NoCredentials(String),
    /// The API server did not answer.
    Unreachable { server: String, cause: String },
    /// `--node` names a node the cluster does not have.
    NodeNotFound(String),
    /// Our CRDs are not installed.
    CrdsMissing(Vec<String>),
    /// An API call failed; `context` says which and why we made it.
    Kube {
        context: String,
        source: kube::Error,
    },
    /// A local I/O operation failed.
    Io {
        context: String,
        source: std::io::Error,
    },
    /// Bad flags or input, with the message for the user.
    Invalid(String),
    /// The cluster role's leader lease was lost or could not be renewed in
    /// time: it stops acting (another replica may be leading already).
    LostLease(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wrap a kube error with what we were doing.
    pub fn kube(context: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let context = context.into();
        move |source| Error::Kube { context, source }
    }

    /// Wrap an I/O error with what we were doing.
    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let context = context.into();
        move |source| Error::Io { context, source }
    }

    /// A short, stable label for metrics and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::NoCredentials(_) => "no_credentials",
            Error::Unreachable { .. } => "unreachable",
            Error::NodeNotFound(_) => "node_not_found",
            Error::CrdsMissing(_) => "crds_missing",
            Error::Kube { .. } => "kube",
            Error::Io { .. } => "io",
            Error::Invalid(_) => "invalid",
            Error::LostLease(_) => "lost_lease",
        }
    }

    /// The HTTP status of an API error, if this is one.
    /// May the write that failed with this have happened on the server
    /// all the same? A refusal (4xx) did not; a timeout, a dropped
    /// connection or a 5xx (a gateway's timeout) may have.
    pub fn possibly_applied(&self) -> bool {
        match self {
            Error::Kube { source, .. } => match source {
                kube::Error::Api(s) => s.code >= 500,
                _ => true,
            },
            _ => false,
        }
    }

    pub fn api_code(&self) -> Option<u16> {
        match self {
            Error::Kube {
                source: kube::Error::Api(s),
                ..
            } => Some(s.code),
            _ => None,
        }
    }
}

/// The first line of a message: some causes (YAML parsers) append a
/// multi-line excerpt, and an error must reach the user as one line.
pub fn first_line(msg: &str) -> &str {
    msg.lines().next().unwrap_or_default().trim_end()
}

/// One line for a kube error: the API server's own message for API errors,
/// the innermost cause for transport errors (kube's Display nests Debug dumps).
pub fn kube_cause(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) if !status.message.is_empty() => {
            first_line(&status.message).to_string()
        }
        other => first_line(&innermost(other)).to_string(),
    }
}

fn innermost(err: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![err.to_string()];
    let mut cur = err.source();
    while let Some(e) = cur {
        parts.push(e.to_string());
        cur = e.source();
    }
    // Transport errors read best from the bottom ("Connection refused"), but
    // the bottom alone can be too terse, so keep the last two distinct parts.
    parts.dedup();
    let n = parts.len();
    if n >= 2 && !parts[n - 2].contains(&parts[n - 1]) {
        format!("{}: {}", parts[n - 2], parts[n - 1])
    } else {
        parts.pop().unwrap_or_default()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoCredentials(why) => write!(
                f,
                "no Kubernetes credentials: {why} (pass --kubeconfig, set KUBECONFIG, or run inside a pod)"
            ),
            Error::Unreachable { server, cause } => {
                write!(
                    f,
                    "cannot reach the Kubernetes API server at {server}: {cause}"
                )
            }
            Error::NodeNotFound(node) => write!(
                f,
                "node {node:?} does not exist in the cluster (set --node or NODE_NAME to this machine's node name)"
            ),
            Error::CrdsMissing(crds) => write!(
                f,
                "CRDs not installed: {} (install them with: nodekeeper crds | kubectl apply -f -)",
                crds.join(", ")
            ),
            Error::Kube { context, source } => write!(f, "{context}: {}", kube_cause(source)),
            Error::Io { context, source } => write!(f, "{context}: {source}"),
            Error::Invalid(msg) => f.write_str(msg),
            Error::LostLease(why) => write!(f, "not the leader any more: {why}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Kube { source, .. } => Some(source),
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> Error {
        Error::Kube {
            context: "creating NodeMaintenance reboot-a".into(),
            source: kube::Error::Api(
                kube::core::Status::failure("refused", "Refused")
                    .with_code(code)
                    .boxed(),
            ),
        }
    }

    /// A create answered with a refusal did not happen; one whose answer
    /// was lost or a 5xx may have (the executor then reads it as existing
    /// until the store says).
    #[test]
    fn only_a_refusal_says_a_write_did_not_happen() {
        for code in [400, 403, 404, 409, 422] {
            assert!(!api(code).possibly_applied(), "{code}");
        }
        for code in [500, 503, 504] {
            assert!(api(code).possibly_applied(), "{code}");
        }
        let lost = Error::Kube {
            context: "creating".into(),
            source: kube::Error::Service("connection reset".into()),
        };
        assert!(lost.possibly_applied());
        assert!(!Error::Invalid("bad".into()).possibly_applied());
    }
}
