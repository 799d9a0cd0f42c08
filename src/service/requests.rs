//! Every API request this process makes, counted by verb, resource and
//! answer: a layer under kube's client stack (`connect::client`), so every
//! request is seen whoever makes it (watches, the interpreter, the webhook's
//! reads), and `/metrics` shows `nodekeeper_api_requests_total`. Resources
//! are read from the path, so the label set stays as small as the kinds
//! nodekeeper touches.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::http;

use crate::counts::Counts;

/// (verb, resource, code) → requests.
pub static REQUESTS: Counts<(&'static str, String, u16)> = Counts::new();

/// The verb of a request as the API server's audit log names it, from its
/// method and query (`watch=true` or `watch=1` is a watch; a GET of a
/// collection is a list, told apart by the caller from the path).
fn verb(method: &http::Method, query: &str, collection: bool) -> &'static str {
    let watch = query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    match *method {
        http::Method::GET if watch => "watch",
        http::Method::GET if collection => "list",
        http::Method::GET => "get",
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE => "delete",
        _ => "other",
    }
}

/// `resource` or `resource/subresource` from an API path, and whether it
/// names a collection: `/api/v1/namespaces/ns/pods/p/eviction` is
/// `pods/eviction`, `/apis/g/v/nodemaintenances` a collection of
/// `nodemaintenances`. Anything else (discovery, `/version`) is `other`.
fn resource(path: &str) -> (String, bool) {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match segs.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => return ("other".into(), false),
    };
    let rest = match rest {
        ["namespaces", _ns, more @ ..] if !more.is_empty() => more,
        other => other,
    };
    match rest {
        [] => ("other".into(), false),
        [r] => (r.to_string(), true),
        [r, _name] => (r.to_string(), false),
        [r, _name, sub, ..] => (format!("{r}/{sub}"), false),
    }
}

/// How long any request may wait for its answer's head: the API server's
/// own limit for a request (`--request-timeout`, 60 s by default), so no
/// answer by then means none is coming. A watch's head comes when its
/// stream opens, so this bounds every call, not the length of a watch.
/// Without it a request sent while the API server restarted could wait for
/// the connection's 295 s read timeout, holding up the pass behind it.
pub const ANSWER_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

/// A request that had no answer within [`ANSWER_DEADLINE`].
#[derive(Debug)]
pub struct NoAnswer;

impl std::fmt::Display for NoAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "no answer from the API server within {} s",
            ANSWER_DEADLINE.as_secs()
        )
    }
}

impl std::error::Error for NoAnswer {}

/// The layer's service: counts each request when its answer's head
/// arrives (a watch when its stream opens), or as code 0 when none does
/// or none comes within [`ANSWER_DEADLINE`].
#[derive(Clone)]
pub struct Counted<S>(pub S);

impl<S, B, R> tower::Service<http::Request<B>> for Counted<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: From<NoAnswer> + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let (resource, collection) = resource(req.uri().path());
        let verb = verb(req.method(), req.uri().query().unwrap_or(""), collection);
        let answer = self.0.call(req);
        Box::pin(async move {
            let res = crate::runtime::timeout(ANSWER_DEADLINE, answer)
                .await
                .unwrap_or_else(|()| Err(NoAnswer.into()));
            let code = res.as_ref().map_or(0, |r| r.status().as_u16());
            REQUESTS.add((verb, resource, code));
            res
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_resource_and_requests_their_verb() {
        assert_eq!(
            resource("/api/v1/namespaces/ns/pods/p/eviction"),
            ("pods/eviction".into(), false)
        );
        assert_eq!(resource("/api/v1/pods"), ("pods".into(), true));
        assert_eq!(resource("/api/v1/nodes/n"), ("nodes".into(), false));
        assert_eq!(
            resource("/api/v1/namespaces/ns"),
            ("namespaces".into(), false)
        );
        assert_eq!(
            resource("/apis/nodekeeper.io/v1alpha1/rebootpolicies/p/status"),
            ("rebootpolicies/status".into(), false)
        );
        assert_eq!(
            resource("/apis/coordination.k8s.io/v1/namespaces/ns/leases/l"),
            ("leases".into(), false)
        );
        assert_eq!(resource("/version"), ("other".into(), false));
        assert_eq!(verb(&http::Method::GET, "watch=true&x=1", true), "watch");
        assert_eq!(verb(&http::Method::GET, "limit=1", true), "list");
        assert_eq!(verb(&http::Method::GET, "", false), "get");
        assert_eq!(verb(&http::Method::PATCH, "", false), "patch");
    }
}
