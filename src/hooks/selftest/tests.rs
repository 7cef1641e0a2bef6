//! The self-test's pure judgements: which endpoints, what an answer means, what a TLS error says.

use super::*;

fn vwc(hooks: Value) -> ValidatingWebhookConfiguration {
    serde_json::from_value(json!({"metadata": {"name": "svw"}, "webhooks": hooks})).expect("vwc")
}

fn hook(name: &str, ca: Option<&str>) -> Value {
    json!({
        "name": name,
        "clientConfig": {
            "service": {"namespace": "ns", "name": "svc", "path": "/validate", "port": 443},
            "caBundle": ca,
        },
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
    })
}

fn target() -> Target {
    target_of(&vwc(json!([hook("a.b.c", Some("Y2E="))])), None).expect("target")
}

#[test]
fn the_target_is_the_service_and_ca_kube_apiserver_uses() {
    let t = target();
    assert_eq!(t.server_name(), "svc.ns.svc");
    assert_eq!((t.port, t.path.as_str()), (443, "/validate"));
    assert_eq!(t.ca_bundle, b"ca");
    let err = target_of(&vwc(json!([hook("a.b.c", None)])), None).unwrap_err();
    assert!(err.contains("has no caBundle"), "{err}");
    let two = vwc(json!([
        hook("a.b.c", Some("Y2E=")),
        hook("d.e.f", Some("Y2E="))
    ]));
    assert!(target_of(&two, None).unwrap_err().contains("--webhook"));
    assert_eq!(
        target_of(&two, Some("d.e.f")).expect("named").webhook,
        "d.e.f"
    );
    assert!(target_of(&two, Some("x"))
        .unwrap_err()
        .contains("no webhook x"));
}

fn service() -> Service {
    serde_json::from_value(json!({"spec": {"ports": [
        {"name": "https", "port": 443, "targetPort": "https"},
        {"name": "admin", "port": 8080, "targetPort": "admin"},
    ]}}))
    .expect("service")
}

fn slice(endpoints: Value) -> EndpointSlice {
    serde_json::from_value(json!({
        "addressType": "IPv4",
        "metadata": {"name": "s"},
        "ports": [{"name": "admin", "port": 8080}, {"name": "https", "port": 8443}],
        "endpoints": endpoints,
    }))
    .expect("slice")
}

#[test]
fn ready_endpoints_on_the_named_port_only() {
    let s = slice(json!([
        {"addresses": ["10.0.0.2"], "conditions": {"ready": true}},
        {"addresses": ["10.0.0.1"]},
        {"addresses": ["10.0.0.3"], "conditions": {"ready": false}},
        {"addresses": ["10.0.0.4"], "conditions": {"ready": true, "terminating": true}},
    ]));
    let got = ready_endpoints(&target(), &service(), &[s]).expect("ready");
    let want: Vec<SocketAddr> = vec![
        "10.0.0.1:8443".parse().expect("addr"),
        "10.0.0.2:8443".parse().expect("addr"),
    ];
    assert_eq!(got, want);
}

#[test]
fn no_ready_endpoint_is_said_plainly() {
    for slices in [
        vec![],
        vec![slice(json!([]))],
        vec![slice(json!([
            {"addresses": ["10.0.0.3"], "conditions": {"ready": false}},
        ]))],
    ] {
        let err = ready_endpoints(&target(), &service(), &slices).unwrap_err();
        assert!(
            err.starts_with("the webhook Service ns/svc has no ready endpoints"),
            "{err}"
        );
    }
    let mut t = target();
    t.port = 9999;
    let err = ready_endpoints(&t, &service(), &[]).unwrap_err();
    assert!(err.contains("has no port 9999"), "{err}");
}

#[test]
fn the_probes_are_judged_as_intended_by_the_rules() {
    use crate::model::StorageVersion;
    let object = |name: &str| -> StorageVersion {
        serde_json::from_value(review("u", name)["request"]["object"].clone()).expect("sv")
    };
    assert!(crate::rules::violations(&object(PROBE_NAME)).is_empty());
    let bad = crate::rules::violations(&object(INVALID_PROBE_NAME));
    assert!(
        bad.iter().any(|v| v.code.as_str() == INVALID_PROBE_RULE),
        "{bad:?}"
    );
}

#[test]
fn answers_are_read_as_kube_apiserver_reads_them() {
    let ok = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "response": {"uid": "u1", "allowed": true, "warnings": ["w"]}});
    let body = serde_json::to_vec(&ok).expect("json");
    let a = read_answer("u1", 200, &body).expect("answer");
    assert!(a.allowed);
    assert_eq!(a.warnings, vec!["w".to_string()]);
    assert!(read_answer("u2", 200, &body).unwrap_err().contains("uid"));
    assert!(read_answer("u1", 503, b"busy")
        .unwrap_err()
        .contains("HTTP 503: busy"));
    assert!(read_answer("u1", 200, b"<html>")
        .unwrap_err()
        .contains("not an AdmissionReview"));
    let denied = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "response": {"uid": "u1", "allowed": false, "status": {"message": "no"}}});
    let a = read_answer("u1", 200, &serde_json::to_vec(&denied).expect("json")).expect("a");
    assert_eq!((a.allowed, a.message.as_str()), (false, "no"));
}

#[test]
fn tls_errors_name_the_cause() {
    let t = target();
    let io = |e: rustls::Error| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
    let name = tls_problem(
        &io(rustls::Error::InvalidCertificate(
            rustls::CertificateError::NotValidForName,
        )),
        &t,
        "svw",
    );
    assert!(
        name.starts_with("TLS: the served certificate is not valid for svc.ns.svc"),
        "{name}"
    );
    let ca = tls_problem(
        &io(rustls::Error::InvalidCertificate(
            rustls::CertificateError::UnknownIssuer,
        )),
        &t,
        "svw",
    );
    assert!(
        ca.contains("not signed by a CA in the caBundle of ValidatingWebhookConfiguration svw"),
        "{ca}"
    );
    assert!(tls_config(b"not pem", "svw")
        .unwrap_err()
        .contains("no usable CA"));
}
