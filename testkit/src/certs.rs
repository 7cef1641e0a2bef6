//! Test PKI made with rcgen: a CA, serving certificates for 127.0.0.1/localhost, client
//! certificates, and rustls client configurations that trust only the test CA.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SerialNumber,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A certificate authority.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    pub pem: String,
}

/// A certificate and its key.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: CertificateDer<'static>,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("CA key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("CA certificate");
        let pem = issuer.pem();
        Ca { issuer, pem }
    }

    fn issue(&self, cn: &str, sans: &[&str], serial: u64, usage: ExtendedKeyUsagePurpose) -> Leaf {
        let mut params =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .expect("leaf params");
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        params.distinguished_name = dn;
        params.serial_number = Some(SerialNumber::from(serial));
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().expect("leaf key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("leaf certificate");
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
        }
    }

    /// A serving certificate for `127.0.0.1` and `localhost`.
    pub fn server(&self, serial: u64) -> Leaf {
        self.issue(
            "storageversion-webhook",
            &["127.0.0.1", "localhost"],
            serial,
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A client certificate.
    pub fn client(&self, cn: &str, serial: u64) -> Leaf {
        self.issue(cn, &[], serial, ExtendedKeyUsagePurpose::ClientAuth)
    }

    /// A root store holding only this CA.
    pub fn roots(&self) -> rustls::RootCertStore {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.issuer.der().clone()).expect("add CA");
        roots
    }
}

impl Leaf {
    /// Writes `tls.crt` and `tls.key` into `dir`; returns their paths.
    pub fn write(&self, dir: &Path) -> (PathBuf, PathBuf) {
        let cert = dir.join("tls.crt");
        let key = dir.join("tls.key");
        std::fs::write(&cert, &self.cert_pem).expect("write cert");
        std::fs::write(&key, &self.key_pem).expect("write key");
        (cert, key)
    }
}

/// A client configuration trusting only `ca`, optionally presenting `client`, offering `alpn`.
pub fn client_config(ca: &Ca, client: Option<&Leaf>, alpn: &[&[u8]]) -> rustls::ClientConfig {
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocol versions")
    .with_root_certificates(ca.roots());
    let mut config = match client {
        Some(leaf) => builder
            .with_client_auth_cert(
                vec![leaf.der.clone()],
                PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).expect("client key"),
            )
            .expect("client auth"),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config
}

/// The DER of the first certificate in a PEM string.
pub fn first_der(pem: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pem.as_bytes()).expect("PEM certificate")
}
