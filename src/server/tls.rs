//! TLS for the admission listener: loading the serving certificate and key, re-reading them when
//! the files change, and the rustls configuration that serves whatever is current.
//!
//! Rotation works by content, not by file events: every reload interval both files are read
//! again, and a pair whose bytes differ from the last one seen is parsed and, if good, swapped
//! in. Kubernetes Secret volumes replace files by swapping a `..data` symlink, which defeats
//! naive inotify watches; reading through the path sees the swap on the next tick.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, Context};
use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::args::TlsSettings;
use crate::metrics::{Metrics, ResultLabels};

pub const ALPN_H2: &[u8] = b"h2";
pub const ALPN_HTTP11: &[u8] = b"http/1.1";

/// The crypto provider used everywhere in the server: *ring*.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A parsed, consistent certificate chain and key.
pub struct LoadedCert {
    pub key: Arc<CertifiedKey>,
    /// The leaf's notAfter, in seconds since the Unix epoch.
    pub not_after: i64,
    /// The leaf's subject, for logs.
    pub subject: String,
    /// The leaf's serial number (hex), for logs.
    pub serial: String,
}

/// Parses a PEM certificate chain and a PEM private key (PKCS#1, PKCS#8 or SEC1) and checks that
/// the key belongs to the leaf certificate. Errors name the file at fault.
pub fn parse_pair(
    cert_file: &Path,
    cert_pem: &[u8],
    key_file: &Path,
    key_pem: &[u8],
    provider: &CryptoProvider,
) -> anyhow::Result<LoadedCert> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("certificate file {}: bad PEM: {e}", cert_file.display()))?;
    let Some(leaf) = chain.first() else {
        return Err(anyhow!(
            "certificate file {}: no PEM CERTIFICATE block found",
            cert_file.display()
        ));
    };
    let (_, parsed) = x509_parser::parse_x509_certificate(leaf.as_ref()).map_err(|e| {
        anyhow!(
            "certificate file {}: the first certificate is not valid X.509: {e}",
            cert_file.display()
        )
    })?;
    let not_after = parsed.validity().not_after.timestamp();
    let subject = parsed.subject().to_string();
    let serial = parsed.raw_serial_as_string();

    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => anyhow!(
            "key file {}: no PEM private key found (want PKCS#1 \"RSA PRIVATE KEY\", \
             PKCS#8 \"PRIVATE KEY\" or SEC1 \"EC PRIVATE KEY\")",
            key_file.display()
        ),
        e => anyhow!("key file {}: bad PEM: {e}", key_file.display()),
    })?;
    let signing_key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| anyhow!("key file {}: unusable private key: {e}", key_file.display()))?;
    let certified = CertifiedKey::new(chain, signing_key);
    match certified.keys_match() {
        Ok(()) => {}
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {
            // The key type does not expose its public key; rustls itself accepts this.
            tracing::debug!(
                key_file = %key_file.display(),
                "cannot check that the key matches the certificate for this key type"
            );
        }
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            return Err(anyhow!(
                "key file {} does not match the certificate in {} (subject {subject}, serial {serial})",
                key_file.display(),
                cert_file.display()
            ));
        }
        Err(e) => {
            return Err(anyhow!(
                "certificate file {}: cannot check it against key file {}: {e}",
                cert_file.display(),
                key_file.display()
            ));
        }
    }
    Ok(LoadedCert {
        key: Arc::new(certified),
        not_after,
        subject,
        serial,
    })
}

/// What one reload tick did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReloadOutcome {
    /// The files hold the same bytes as last time.
    Unchanged,
    /// A new pair was loaded and is now served.
    Reloaded,
    /// The files changed but could not be read or used; the previous pair is still served.
    Failed,
    /// The certificate file changed while being read (a rotation in progress); try next tick.
    InFlux,
}

#[derive(Default)]
struct Seen {
    cert: Vec<u8>,
    key: Vec<u8>,
    /// The last failure reported, so that a persisting one is logged and counted once.
    failure: Option<String>,
}

/// The serving certificate currently in use, and where it comes from.
pub struct CertStore {
    current: ArcSwap<CertifiedKey>,
    not_after: AtomicI64,
    cert_file: PathBuf,
    key_file: PathBuf,
    provider: Arc<CryptoProvider>,
    metrics: Metrics,
    seen: Mutex<Seen>,
}

impl fmt::Debug for CertStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertStore")
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("not_after", &self.not_after.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl CertStore {
    /// Reads and parses the pair. Errors name the file that is unreadable or wrong.
    pub fn load(
        cert_file: &Path,
        key_file: &Path,
        provider: Arc<CryptoProvider>,
        metrics: Metrics,
    ) -> anyhow::Result<Arc<CertStore>> {
        let cert = std::fs::read(cert_file)
            .with_context(|| format!("cannot read certificate file {}", cert_file.display()))?;
        let key = std::fs::read(key_file)
            .with_context(|| format!("cannot read key file {}", key_file.display()))?;
        let loaded = parse_pair(cert_file, &cert, key_file, &key, &provider)?;
        tracing::info!(
            cert_file = %cert_file.display(),
            subject = %loaded.subject,
            serial = %loaded.serial,
            not_after = loaded.not_after,
            "serving certificate loaded"
        );
        let store = CertStore {
            current: ArcSwap::new(loaded.key),
            not_after: AtomicI64::new(loaded.not_after),
            cert_file: cert_file.to_path_buf(),
            key_file: key_file.to_path_buf(),
            provider,
            metrics,
            seen: Mutex::new(Seen {
                cert,
                key,
                failure: None,
            }),
        };
        store.update_expiry();
        Ok(Arc::new(store))
    }

    /// The pair new handshakes get.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.load_full()
    }

    /// True once a certificate is loaded (always, for a store that [`CertStore::load`] returned).
    pub fn is_loaded(&self) -> bool {
        !self.current.load().cert.is_empty()
    }

    /// Seconds until the current leaf's notAfter (negative once expired).
    pub fn seconds_to_expiry(&self) -> f64 {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        self.not_after.load(Ordering::Relaxed) as f64 - now
    }

    fn update_expiry(&self) {
        self.metrics
            .cert_expiry_seconds
            .set(self.seconds_to_expiry());
    }

    /// Reads both files again and swaps in the pair if it changed and is good.
    pub async fn reload_once(&self) -> ReloadOutcome {
        let outcome = self.reload_inner().await;
        self.update_expiry();
        outcome
    }

    async fn reload_inner(&self) -> ReloadOutcome {
        let cert = match tokio::fs::read(&self.cert_file).await {
            Ok(b) => b,
            Err(e) => {
                return self.failed(format!(
                    "cannot read certificate file {}: {e}",
                    self.cert_file.display()
                ))
            }
        };
        let key = match tokio::fs::read(&self.key_file).await {
            Ok(b) => b,
            Err(e) => {
                return self.failed(format!(
                    "cannot read key file {}: {e}",
                    self.key_file.display()
                ))
            }
        };
        // The two files are read one after the other; if the certificate changed meanwhile, the
        // pair may be torn (new certificate, old key). Wait for the next tick instead.
        match tokio::fs::read(&self.cert_file).await {
            Ok(again) if again == cert => {}
            _ => {
                tracing::debug!(cert_file = %self.cert_file.display(), "certificate file changed while being read; retrying next tick");
                return ReloadOutcome::InFlux;
            }
        }

        {
            let mut seen = self.lock_seen();
            if seen.cert == cert && seen.key == key {
                if let Some(prev) = seen.failure.take() {
                    tracing::info!(
                        cert_file = %self.cert_file.display(),
                        key_file = %self.key_file.display(),
                        previous_error = %prev,
                        "certificate files readable again and unchanged; still serving the current certificate"
                    );
                }
                return ReloadOutcome::Unchanged;
            }
            seen.cert.clone_from(&cert);
            seen.key.clone_from(&key);
        }

        match parse_pair(&self.cert_file, &cert, &self.key_file, &key, &self.provider) {
            Ok(loaded) => {
                self.current.store(loaded.key);
                self.not_after.store(loaded.not_after, Ordering::Relaxed);
                self.lock_seen().failure = None;
                self.metrics
                    .cert_reloads
                    .get_or_create(&ResultLabels { result: "ok" })
                    .inc();
                tracing::info!(
                    cert_file = %self.cert_file.display(),
                    subject = %loaded.subject,
                    serial = %loaded.serial,
                    not_after = loaded.not_after,
                    "serving certificate reloaded"
                );
                ReloadOutcome::Reloaded
            }
            Err(e) => self.failed(format!("{e:#}")),
        }
    }

    /// Reports a failed reload once per distinct failure; the current pair stays in use.
    fn failed(&self, message: String) -> ReloadOutcome {
        let mut seen = self.lock_seen();
        if seen.failure.as_deref() == Some(message.as_str()) {
            tracing::debug!(error = %message, "serving certificate reload still failing");
            return ReloadOutcome::Failed;
        }
        self.metrics
            .cert_reloads
            .get_or_create(&ResultLabels { result: "error" })
            .inc();
        tracing::error!(
            error = %message,
            "serving certificate reload failed; keeping the current certificate"
        );
        seen.failure = Some(message);
        ReloadOutcome::Failed
    }

    fn lock_seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        // A panic while holding this lock cannot leave `Seen` inconsistent in a harmful way.
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Re-reads the files every `interval` until the returned task is aborted.
    pub fn spawn_reloader(self: &Arc<Self>, interval: Duration) -> tokio::task::JoinHandle<()> {
        let store = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                store.reload_once().await;
            }
        })
    }
}

/// Hands every handshake the store's current pair.
#[derive(Debug)]
struct StoreResolver(Arc<CertStore>);

impl ResolvesServerCert for StoreResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current())
    }
}

/// Reads a PEM CA bundle into a root store. Errors name the file.
pub fn load_ca_bundle(path: &Path) -> anyhow::Result<RootCertStore> {
    let pem = std::fs::read(path)
        .with_context(|| format!("cannot read client CA file {}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("client CA file {}: bad PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(anyhow!(
            "client CA file {}: no PEM CERTIFICATE block found",
            path.display()
        ));
    }
    let mut roots = RootCertStore::empty();
    for (i, cert) in certs.into_iter().enumerate() {
        roots.add(cert).map_err(|e| {
            anyhow!(
                "client CA file {}: certificate #{} is not a usable CA certificate: {e}",
                path.display(),
                i + 1
            )
        })?;
    }
    Ok(roots)
}

/// The ALPN protocols offered, most preferred first.
pub fn alpn_protocols(http2: bool) -> Vec<Vec<u8>> {
    if http2 {
        vec![ALPN_H2.to_vec(), ALPN_HTTP11.to_vec()]
    } else {
        vec![ALPN_HTTP11.to_vec()]
    }
}

/// The rustls server configuration: TLS 1.2 and 1.3, the store's current certificate, ALPN as
/// configured and, with a client CA, mandatory client certificates.
pub fn server_config(
    settings: &TlsSettings,
    store: &Arc<CertStore>,
    provider: Arc<CryptoProvider>,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .context("cannot configure TLS 1.2 and 1.3 with the ring provider")?;
    let builder = match &settings.client_ca_file {
        Some(path) => {
            let roots = load_ca_bundle(path)?;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| anyhow!("client CA file {}: {e}", path.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(Arc::new(StoreResolver(Arc::clone(store))));
    config.alpn_protocols = alpn_protocols(settings.http2);
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (String, String, rcgen::KeyPair) {
        let key = rcgen::KeyPair::generate().expect("key");
        let params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).expect("params");
        let cert = params.self_signed(&key).expect("cert");
        (cert.pem(), key.serialize_pem(), key)
    }

    /// PKCS#8 for EC keys wraps the SEC1 `ECPrivateKey` in an OCTET STRING: dig it out.
    fn sec1_from_pkcs8(pkcs8: &[u8]) -> Vec<u8> {
        fn header(b: &[u8]) -> (usize, usize) {
            // (header length, content length) of the DER TLV at b
            let first = b[1] as usize;
            if first < 0x80 {
                (2, first)
            } else {
                let n = first & 0x7f;
                let mut len = 0usize;
                for i in 0..n {
                    len = (len << 8) | b[2 + i] as usize;
                }
                (2 + n, len)
            }
        }
        let (h, _) = header(pkcs8); // outer SEQUENCE
        let mut pos = h;
        for _ in 0..2 {
            // version INTEGER, algorithm SEQUENCE
            let (h, l) = header(&pkcs8[pos..]);
            pos += h + l;
        }
        assert_eq!(pkcs8[pos], 0x04, "OCTET STRING");
        let (h, l) = header(&pkcs8[pos..]);
        pkcs8[pos + h..pos + h + l].to_vec()
    }

    #[test]
    fn parses_pkcs8_and_sec1_and_rejects_mismatch() {
        let p = provider();
        let (cert, key, kp) = pair();
        let c = Path::new("tls.crt");
        let k = Path::new("tls.key");
        let loaded = parse_pair(c, cert.as_bytes(), k, key.as_bytes(), &p).expect("pkcs8");
        assert!(loaded.not_after > 0);

        let sec1 = sec1_from_pkcs8(&kp.serialize_der());
        let sec1_pem = format!(
            "-----BEGIN EC PRIVATE KEY-----\n{}\n-----END EC PRIVATE KEY-----\n",
            base64_lines(&sec1)
        );
        parse_pair(c, cert.as_bytes(), k, sec1_pem.as_bytes(), &p).expect("sec1");

        let (_, other_key, _) = pair();
        let err = parse_pair(c, cert.as_bytes(), k, other_key.as_bytes(), &p)
            .err()
            .expect("mismatch");
        let msg = format!("{err:#}");
        assert!(msg.contains("does not match"), "{msg}");
        assert!(msg.contains("tls.key"), "{msg}");

        let err = parse_pair(c, b"junk", k, key.as_bytes(), &p)
            .err()
            .expect("no cert");
        assert!(format!("{err:#}").contains("certificate file tls.crt"));
        let err = parse_pair(c, cert.as_bytes(), k, cert.as_bytes(), &p)
            .err()
            .expect("no key");
        assert!(format!("{err:#}").contains("key file tls.key: no PEM private key"));
    }

    #[test]
    fn parses_pkcs1_rsa() {
        // A throwaway 2048-bit RSA test key in PKCS#1 form and a certificate for it.
        let p = provider();
        let rsa = rcgen::KeyPair::from_pem(RSA_PKCS8).expect("rsa key");
        let params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).expect("params");
        let cert = params.self_signed(&rsa).expect("cert");
        parse_pair(
            Path::new("c"),
            cert.pem().as_bytes(),
            Path::new("k"),
            RSA_PKCS1.as_bytes(),
            &p,
        )
        .expect("pkcs1");
    }

    fn base64_lines(der: &[u8]) -> String {
        const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut out = String::new();
        for chunk in der.chunks(3) {
            let b = [
                chunk[0],
                *chunk.get(1).unwrap_or(&0),
                *chunk.get(2).unwrap_or(&0),
            ];
            let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out.as_bytes()
            .chunks(64)
            .map(|l| String::from_utf8_lossy(l).into_owned())
            .collect::<Vec<_>>()
            .join("\n")
    }

    const RSA_PKCS1: &str = include_str!("testdata/rsa_pkcs1.pem");
    const RSA_PKCS8: &str = include_str!("testdata/rsa_pkcs8.pem");
}
