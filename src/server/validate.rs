//! The admission listener's one route, `POST /validate`, as a plain hyper service: the path and
//! method are matched here, without a general router (axum's cost about 2 µs per request, for one
//! route). `/validate` with another method gets 405 with `Allow: POST`; any other path 404.
//!
//! Nothing here may panic on input: every malformed request gets a 4xx with a message.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Bytes};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};

use crate::admission::Admission;
use crate::metrics::{Metrics, ResultLabels};

/// The body of every response of the admission listener.
pub type ResponseBody = Full<Bytes>;

/// The path the webhook is registered on.
pub const PATH: &str = "/validate";

/// `POST /validate`: cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct ValidateService(Arc<Validate>);

struct Validate {
    admission: Admission,
    metrics: Metrics,
    max_request_bytes: usize,
}

const JSON: HeaderValue = HeaderValue::from_static("application/json");
const TEXT: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");

impl ValidateService {
    pub fn new(admission: Admission, metrics: Metrics, max_request_bytes: usize) -> Self {
        ValidateService(Arc::new(Validate {
            admission,
            metrics,
            max_request_bytes,
        }))
    }

    /// Answers one request of the admission listener.
    pub async fn handle<B>(&self, req: Request<B>) -> Response<ResponseBody>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: std::fmt::Display,
    {
        let v = &*self.0;
        if req.uri().path() != PATH {
            return respond(StatusCode::NOT_FOUND, None, Bytes::new());
        }
        if req.method() != Method::POST {
            return v.method_not_allowed(req.method());
        }
        // Most bodies have arrived with their headers: read them without arming a timer.
        let mut read = std::pin::pin!(read_body(req, v.max_request_bytes));
        let read = match read.as_mut().now_or_never() {
            Some(done) => done,
            None => tokio::time::timeout(BODY_READ_TIMEOUT, read)
                .await
                .unwrap_or(Err(Rejected::TimedOut)),
        };
        let body = match read {
            Ok(body) => body,
            Err(rejected) => {
                v.metrics
                    .http_errors
                    .get_or_create(&ResultLabels {
                        result: rejected.label(),
                    })
                    .inc();
                return rejected.into_response(v.max_request_bytes);
            }
        };
        match v.admission.review(&body).await {
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
    fn method_not_allowed(&self, method: &Method) -> Response<ResponseBody> {
        self.metrics
            .http_errors
            .get_or_create(&ResultLabels {
                result: "method_not_allowed",
            })
            .inc();
        let mut response = respond(
            StatusCode::METHOD_NOT_ALLOWED,
            Some(TEXT),
            Bytes::from(format!(
                "method {method} is not allowed on /validate: send AdmissionReviews with POST\n"
            )),
        );
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST"));
        response
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

/// Why a body was not read.
enum Rejected {
    TooLarge,
    Unreadable(String),
    TimedOut,
}

impl Rejected {
    fn label(&self) -> &'static str {
        match self {
            Rejected::TooLarge => "too_large",
            Rejected::Unreadable(_) => "body_unreadable",
            Rejected::TimedOut => "body_timeout",
        }
    }

    fn into_response(self, limit: usize) -> Response<ResponseBody> {
        let (status, message) = match self {
            Rejected::TooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body is larger than the limit of {limit} bytes\n"),
            ),
            Rejected::Unreadable(e) => (
                StatusCode::BAD_REQUEST,
                format!("cannot read the request body: {e}\n"),
            ),
            Rejected::TimedOut => (
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {}s\n",
                    BODY_READ_TIMEOUT.as_secs()
                ),
            ),
        };
        respond(status, Some(TEXT), Bytes::from(message))
    }
}

/// Longest time a request body may take to arrive: kube-apiserver gives up on a webhook call
/// after at most 30 s anyway.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest time spent discarding the rest of an oversized body.
const DRAIN_TIME: Duration = Duration::from_secs(5);

/// Reads the whole body, refusing more than `limit` bytes: at once when Content-Length says so,
/// else as soon as the streamed (e.g. chunked) body passes the limit. A body that arrives in one
/// chunk is not copied.
async fn read_body<B>(req: Request<B>, limit: usize) -> Result<Bytes, Rejected>
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
    Ok(match first {
        Some(only) => only,
        None => Bytes::from(joined),
    })
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
