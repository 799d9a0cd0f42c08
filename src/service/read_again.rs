//! Reads the API server answers "not now" are asked again: a layer under
//! kube's client stack (`connect::client`) that sends a GET again when its
//! answer is 429 or 5xx with a `Retry-After` header, after that many
//! seconds, up to ten times — what client-go does for every request
//! (`rest/with_retry.go`'s `checkWait` and its default of ten retries, read
//! in client-go v0.37.1), and kubectl with it. The API server says it so
//! when priority and fairness sheds a request and while a CRD created a
//! moment ago has no watch cache yet ("storage is (re)initializing",
//! `Retry-After: 1`): `kubectl apply` of the CRDs followed at once by
//! `nodekeeper status`, or an agent started beside them, met it.
//!
//! Only reads, unlike client-go: kube's own retries stay off because an
//! eviction's 429 is its PodDisruptionBudget's answer, which the drain
//! counts and backs off from itself, and every other write is the
//! decision of a level-triggered pass that decides again.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::http;

/// How many times a read is sent again (client-go's default).
const AGAIN: usize = 10;
/// The longest wait a `Retry-After` is taken at: the header is the
/// server's (or a proxy's) word, and one read is not held for minutes.
const LONGEST_WAIT: u64 = 10;

/// How long to wait before asking again after `res`, if at all.
fn retry_after<R>(res: &http::Response<R>) -> Option<Duration> {
    let code = res.status().as_u16();
    if !(code == 429 || code >= 500) {
        return None;
    }
    let seconds: u64 = res
        .headers()
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds.clamp(1, LONGEST_WAIT)))
}

/// The layer's service (see the module).
#[derive(Clone)]
pub struct ReadAgain<S>(pub S);

impl<S, R> tower::Service<http::Request<kube::client::Body>> for ReadAgain<S>
where
    S: tower::Service<http::Request<kube::client::Body>, Response = http::Response<R>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        // A GET's body is empty: the request can be sent again as it was.
        let again = (req.method() == http::Method::GET)
            .then(|| req.body().try_clone().map(|_| req.uri().clone()))
            .flatten();
        let Some(uri) = again else {
            return Box::pin(self.0.call(req));
        };
        let (parts, body) = req.into_parts();
        let first = self.0.call(http::Request::from_parts(parts.clone(), body));
        let mut inner = self.0.clone();
        Box::pin(async move {
            let mut answer = first.await;
            for _ in 0..AGAIN {
                let Some(wait) = answer.as_ref().ok().and_then(retry_after) else {
                    break;
                };
                log::debug!(
                    "GET {}: the API server answered {}; asking again in {} s",
                    uri.path(),
                    answer.as_ref().map_or(0, |r| r.status().as_u16()),
                    wait.as_secs()
                );
                crate::runtime::sleep(wait).await;
                std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
                let req = http::Request::from_parts(parts.clone(), kube::client::Body::empty());
                answer = inner.call(req).await;
            }
            answer
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::Service;

    /// A server that answers `first` to the first `n` requests, then 200.
    fn server(
        first: u16,
        retry_after: Option<&'static str>,
        n: usize,
        count: Arc<AtomicUsize>,
    ) -> impl tower::Service<
        http::Request<kube::client::Body>,
        Response = http::Response<()>,
        Error = std::convert::Infallible,
        Future = impl Send,
    > + Clone {
        tower::service_fn(move |_req: http::Request<kube::client::Body>| {
            let seen = count.fetch_add(1, Ordering::SeqCst);
            async move {
                let mut res = http::Response::builder().status(if seen < n { first } else { 200 });
                if let (Some(after), true) = (retry_after, seen < n) {
                    res = res.header(http::header::RETRY_AFTER, after);
                }
                Ok(res.body(()).unwrap_or_default())
            }
        })
    }

    fn ask(
        method: http::Method,
        first: u16,
        after: Option<&'static str>,
        n: usize,
    ) -> (u16, usize) {
        let count = Arc::new(AtomicUsize::new(0));
        let mut svc = ReadAgain(server(first, after, n, count.clone()));
        let req = http::Request::builder()
            .method(method)
            .uri("/apis/nodekeeper.io/v1alpha1")
            .body(kube::client::Body::empty())
            .expect("a request");
        let res = smol::block_on(svc.call(req));
        let code = res.map_or(0, |r| r.status().as_u16());
        (code, count.load(Ordering::SeqCst))
    }

    /// client-go v0.37.1, `rest/with_retry.go`: `checkWait` waits on 429
    /// and any 5xx that carries an integer `Retry-After`
    /// (`retryAfterSeconds` in `rest/request.go`), nothing else.
    #[test]
    fn a_read_told_to_retry_after_is_asked_again() {
        // "storage is (re)initializing": 429, Retry-After 1.
        assert_eq!(ask(http::Method::GET, 429, Some("1"), 1), (200, 2));
        assert_eq!(ask(http::Method::GET, 503, Some("1"), 1), (200, 2));
    }

    #[test]
    fn without_the_header_or_for_a_write_the_answer_is_the_callers() {
        assert_eq!(ask(http::Method::GET, 429, None, 1), (429, 1));
        assert_eq!(ask(http::Method::GET, 503, Some("soon"), 1), (503, 1));
        assert_eq!(ask(http::Method::GET, 404, Some("1"), 1), (404, 1));
        // An eviction's 429 is its PDB's answer, the drain's to count.
        assert_eq!(ask(http::Method::POST, 429, Some("1"), 1), (429, 1));
        assert_eq!(ask(http::Method::PATCH, 503, Some("1"), 1), (503, 1));
    }

    #[test]
    fn the_waits_are_bounded() {
        let res = http::Response::builder()
            .status(429)
            .header(http::header::RETRY_AFTER, "3600")
            .body(())
            .unwrap_or_default();
        assert_eq!(retry_after(&res), Some(Duration::from_secs(LONGEST_WAIT)));
        let res = http::Response::builder()
            .status(500)
            .header(http::header::RETRY_AFTER, "0")
            .body(())
            .unwrap_or_default();
        assert_eq!(retry_after(&res), Some(Duration::from_secs(1)));
    }
}
