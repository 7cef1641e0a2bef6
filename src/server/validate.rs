//! The admission listener's routes, `POST /validate` and `POST /validate-crd` (the CRD guard,
//! when the server has one), as a plain hyper service: the path and method are matched here,
//! without a general router (axum's cost about 2 µs per request, for two routes). Either path
//! with another method gets 405 with `Allow: POST`; any other path 404.
//!
//! Nothing here may panic on input: every malformed request gets a 4xx with a message.
//!
//! Memory for request bodies is bounded across connections, not only per request: a body larger
//! than [`SMALL_BODY_BYTES`] is held only while it fits in the large-body budget
//! (`--large-body-budget-bytes`), else it gets 503 at once. Every review kube-apiserver sends for
//! a StorageVersion is a few KiB, so the budget never touches one; it stops many slow clients with
//! near-limit bodies from holding connections × `--max-request-bytes` of memory.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Bytes};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::admission::{Admission, CrdGuard};
use crate::metrics::{Metrics, ResultLabels};
use crate::server::conns::AwaitingBody;

/// The body of every response of the admission listener.
pub type ResponseBody = Full<Bytes>;

/// The path the webhook is registered on.
pub const PATH: &str = "/validate";

/// The path of the CRD guard's webhook entry (UPDATEs of CustomResourceDefinitions).
pub const CRD_PATH: &str = "/validate-crd";

/// `POST /validate`: cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct ValidateService(Arc<Validate>);

struct Validate {
    admission: Admission,
    crd_guard: Option<CrdGuard>,
    metrics: Metrics,
    max_request_bytes: usize,
    /// Bytes of bodies larger than [`SMALL_BODY_BYTES`] that may be held at once.
    large_bodies: Arc<Semaphore>,
    /// Longest a body may take to arrive after the headers (`--body-read-timeout`).
    body_read_timeout: Duration,
}

/// Bodies up to this size never count against the large-body budget.
pub const SMALL_BODY_BYTES: usize = 64 * 1024;

const JSON: HeaderValue = HeaderValue::from_static("application/json");
const TEXT: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");

impl ValidateService {
    /// `large_body_budget` is raised to `max_request_bytes` if lower, so that one body of the
    /// largest accepted size always fits.
    pub fn new(
        admission: Admission,
        crd_guard: Option<CrdGuard>,
        metrics: Metrics,
        max_request_bytes: usize,
        large_body_budget: usize,
        body_read_timeout: Duration,
    ) -> Self {
        let budget = large_body_budget
            .max(max_request_bytes)
            .min(Semaphore::MAX_PERMITS);
        ValidateService(Arc::new(Validate {
            admission,
            crd_guard,
            metrics,
            max_request_bytes,
            large_bodies: Arc::new(Semaphore::new(budget)),
            body_read_timeout,
        }))
    }

    /// Answers one request of the admission listener.
    pub async fn handle<B>(&self, mut req: Request<B>) -> Response<ResponseBody>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: std::fmt::Display,
    {
        let v = &*self.0;
        let crd = match (req.uri().path(), &v.crd_guard) {
            (PATH, _) => None,
            (CRD_PATH, Some(guard)) => Some(guard),
            _ => return respond(StatusCode::NOT_FOUND, None, Bytes::new()),
        };
        if req.method() != Method::POST {
            return v.reject(Rejected::MethodNotAllowed(req.method().clone()));
        }
        // While it is held, the connection may be dropped to make room for a new one
        // (conns.rs); released once the body is here.
        let awaiting = req.extensions_mut().remove::<AwaitingBody>();
        // Most bodies have arrived with their headers: read them without arming a timer.
        let budget = BodyBudget {
            budget: &v.large_bodies,
            held: None,
        };
        let mut read = std::pin::pin!(read_body(req, v.max_request_bytes, budget));
        let read = match read.as_mut().now_or_never() {
            Some(done) => done,
            None => tokio::time::timeout(v.body_read_timeout, read)
                .await
                .unwrap_or(Err(Rejected::TimedOut(v.body_read_timeout))),
        };
        drop(awaiting);
        // The reservation (if the body is large) lives until the review is answered.
        let (body, _reserved) = match read {
            Ok(read) => read,
            Err(rejected) => return v.reject(rejected),
        };
        let answer = match crd {
            None => v.admission.review(&body).await,
            Some(guard) => guard.review(&body),
        };
        match answer {
            Ok(json) => respond(StatusCode::OK, Some(JSON), Bytes::from(json)),
            Err(bad) => respond(
                StatusCode::BAD_REQUEST,
                Some(TEXT),
                Bytes::from(format!("{bad}\n")),
            ),
        }
    }
}

impl Validate {
    /// Counts a request refused before review and answers it.
    fn reject(&self, rejected: Rejected) -> Response<ResponseBody> {
        self.metrics
            .http_errors
            .get_or_create(&ResultLabels {
                result: rejected.label(),
            })
            .inc();
        rejected.into_response(self.max_request_bytes)
    }
}

fn respond(
    status: StatusCode,
    content_type: Option<HeaderValue>,
    body: Bytes,
) -> Response<ResponseBody> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    if let Some(content_type) = content_type {
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, content_type);
    }
    response
}

/// Why a request was refused before review.
enum Rejected {
    MethodNotAllowed(Method),
    TooLarge,
    Unreadable(String),
    TimedOut(Duration),
    /// A large body that does not fit in the large-body budget now.
    Busy,
}

impl Rejected {
    fn label(&self) -> &'static str {
        match self {
            Rejected::MethodNotAllowed(_) => "method_not_allowed",
            Rejected::TooLarge => "too_large",
            Rejected::Unreadable(_) => "body_unreadable",
            Rejected::TimedOut(_) => "body_timeout",
            Rejected::Busy => "large_body_budget",
        }
    }

    fn into_response(self, limit: usize) -> Response<ResponseBody> {
        let mut extra_header = None;
        let (status, message) = match self {
            Rejected::MethodNotAllowed(method) => {
                extra_header = Some((header::ALLOW, HeaderValue::from_static("POST")));
                (
                    StatusCode::METHOD_NOT_ALLOWED,
                    format!("method {method} is not allowed: send AdmissionReviews with POST\n"),
                )
            }
            Rejected::TooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body is larger than the limit of {limit} bytes\n"),
            ),
            Rejected::Unreadable(e) => (
                StatusCode::BAD_REQUEST,
                format!("cannot read the request body: {e}\n"),
            ),
            Rejected::TimedOut(limit) => (
                StatusCode::REQUEST_TIMEOUT,
                format!("the request body did not arrive within {limit:?} of the headers\n"),
            ),
            Rejected::Busy => {
                extra_header = Some((header::RETRY_AFTER, HeaderValue::from_static("1")));
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "too many request bodies larger than {SMALL_BODY_BYTES} bytes are in progress; retry later\n"
                    ),
                )
            }
        };
        let mut response = respond(status, Some(TEXT), Bytes::from(message));
        if let Some((name, value)) = extra_header {
            response.headers_mut().insert(name, value);
        }
        response
    }
}

/// Longest time spent discarding the rest of an oversized body.
const DRAIN_TIME: Duration = Duration::from_secs(5);

/// The large-body budget as one request holds it.
struct BodyBudget<'a> {
    budget: &'a Arc<Semaphore>,
    held: Option<OwnedSemaphorePermit>,
}

impl BodyBudget<'_> {
    /// Makes sure `bytes` are reserved (nothing is needed up to [`SMALL_BODY_BYTES`]); false when
    /// they do not fit now. Never waits: a request that cannot have its body held is answered.
    fn cover(&mut self, bytes: usize) -> bool {
        if bytes <= SMALL_BODY_BYTES {
            return true;
        }
        let have = self.held.as_ref().map_or(0, |p| p.num_permits());
        if bytes <= have {
            return true;
        }
        let Ok(more) = u32::try_from(bytes - have) else {
            return false;
        };
        match Arc::clone(self.budget).try_acquire_many_owned(more) {
            Ok(permit) => {
                match &mut self.held {
                    Some(held) => held.merge(permit),
                    None => self.held = Some(permit),
                }
                true
            }
            Err(_) => false,
        }
    }
}

/// Reads the whole body, refusing more than `limit` bytes: at once when Content-Length says so,
/// else as soon as the streamed (e.g. chunked) body passes the limit. A body larger than
/// [`SMALL_BODY_BYTES`] must fit in `budget` (all of a declared length up front, a streamed one
/// as it grows), else it is refused as [`Rejected::Busy`]. A body that arrives in one chunk is
/// not copied. Returns the body and its reservation, if it needed one.
async fn read_body<B>(
    req: Request<B>,
    limit: usize,
    mut budget: BodyBudget<'_>,
) -> Result<(Bytes, Option<OwnedSemaphorePermit>), Rejected>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    // A client waiting for "100 Continue" has not sent the body: answer without asking for it.
    let waits_to_send = req.headers().contains_key(header::EXPECT);
    let mut body = req.into_body();
    if let Some(n) = declared {
        if n > limit as u64 {
            if !waits_to_send {
                drain(&mut body, limit).await;
            }
            return Err(Rejected::TooLarge);
        }
        // Within the limit, so it fits in usize.
        if !budget.cover(usize::try_from(n).unwrap_or(usize::MAX)) {
            if !waits_to_send {
                drain(&mut body, limit).await;
            }
            return Err(Rejected::Busy);
        }
    }
    let mut first: Option<Bytes> = None;
    let mut joined: Vec<u8> = Vec::new();
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Rejected::Unreadable(e.to_string()))?;
        // Trailers carry nothing a review reads.
        let Ok(chunk) = frame.into_data() else {
            continue;
        };
        total = total.saturating_add(chunk.len());
        if total > limit {
            drain(&mut body, limit).await;
            return Err(Rejected::TooLarge);
        }
        // A streamed body reserves as it grows, in steps of SMALL_BODY_BYTES (a declared length
        // was reserved whole above).
        if declared.is_none() && !budget.cover(total.next_multiple_of(SMALL_BODY_BYTES).min(limit))
        {
            drain(&mut body, limit).await;
            return Err(Rejected::Busy);
        }
        match first.take() {
            None if joined.is_empty() => first = Some(chunk),
            prev => {
                if let Some(prev) = prev {
                    let hint = declared.map_or(0, |n| n as usize).max(total);
                    joined.reserve(hint);
                    joined.extend_from_slice(&prev);
                }
                joined.extend_from_slice(&chunk);
            }
        }
    }
    let body = match first {
        Some(only) => only,
        None => Bytes::from(joined),
    };
    Ok((body, budget.held))
}

/// Reads and discards what the client is still sending of an oversized body (at most `budget`
/// bytes more, for at most [`DRAIN_TIME`]). A client still writing when the server closes gets a
/// connection reset instead of the 413; after this it can read the answer.
async fn drain<B>(body: &mut B, budget: usize)
where
    B: Body<Data = Bytes> + Unpin,
{
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        let mut discarded = 0usize;
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(chunk) = frame.into_data() {
                discarded = discarded.saturating_add(chunk.len());
                if discarded > budget {
                    break;
                }
            }
        }
    })
    .await;
}
