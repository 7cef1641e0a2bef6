//! The admission router: `POST /validate`.
//!
//! Nothing here may panic on input: every malformed request gets a 4xx with a message.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, BodyDataStream, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use futures::StreamExt;

use crate::admission::Admission;
use crate::metrics::{Metrics, ResultLabels};

struct Validate {
    admission: Admission,
    metrics: Metrics,
    max_request_bytes: usize,
}

/// The router of the admission listener.
pub fn router(admission: Admission, metrics: Metrics, max_request_bytes: usize) -> Router {
    let state = Arc::new(Validate {
        admission,
        metrics,
        max_request_bytes,
    });
    Router::new()
        .route("/validate", post(validate).fallback(method_not_allowed))
        .with_state(state)
}

const JSON: HeaderValue = HeaderValue::from_static("application/json");
const TEXT: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");

async fn validate(State(v): State<Arc<Validate>>, req: Request) -> Response {
    let read = tokio::time::timeout(BODY_READ_TIMEOUT, read_body(req, v.max_request_bytes));
    let body = match read.await.unwrap_or(Err(Rejected::TimedOut)) {
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
        Ok(json) => ([(header::CONTENT_TYPE, JSON)], json).into_response(),
        Err(bad) => (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, TEXT)],
            format!("{bad}\n"),
        )
            .into_response(),
    }
}

async fn method_not_allowed(State(v): State<Arc<Validate>>, method: Method) -> Response {
    v.metrics
        .http_errors
        .get_or_create(&ResultLabels {
            result: "method_not_allowed",
        })
        .inc();
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [
            (header::ALLOW, HeaderValue::from_static("POST")),
            (header::CONTENT_TYPE, TEXT),
        ],
        format!("method {method} is not allowed on /validate: send AdmissionReviews with POST\n"),
    )
        .into_response()
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

    fn into_response(self, limit: usize) -> Response {
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
        (status, [(header::CONTENT_TYPE, TEXT)], message).into_response()
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
async fn read_body(req: Request, limit: usize) -> Result<Bytes, Rejected> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    // A client waiting for "100 Continue" has not sent the body: answer without asking for it.
    let waits_to_send = req.headers().contains_key(header::EXPECT);
    let mut stream = Body::into_data_stream(req.into_body());
    if let Some(n) = declared {
        if n > limit as u64 {
            if !waits_to_send {
                drain(&mut stream, limit).await;
            }
            return Err(Rejected::TooLarge);
        }
    }
    let mut first: Option<Bytes> = None;
    let mut joined: Vec<u8> = Vec::new();
    let mut total = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| Rejected::Unreadable(e.to_string()))?;
        total = total.saturating_add(chunk.len());
        if total > limit {
            drain(&mut stream, limit).await;
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
async fn drain(stream: &mut BodyDataStream, budget: usize) {
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        let mut discarded = 0usize;
        while let Some(Ok(chunk)) = stream.next().await {
            discarded = discarded.saturating_add(chunk.len());
            if discarded > budget {
                break;
            }
        }
    })
    .await;
}
