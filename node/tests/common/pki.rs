//! Test certificates made with rcgen: one CA, node certificates that name a node id (and
//! 127.0.0.1, never `localhost`), and client certificates; written as PEM files into a directory.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A CA whose certificates land in `dir`.
pub struct TestCa {
    pub dir: PathBuf,
    /// The CA certificate (PEM file).
    pub cert: PathBuf,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its key (PEM files).
#[derive(Debug, Clone)]
pub struct Identity {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestCa {
    pub fn new(dir: &Path, name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = dir.join(format!("{name}.pem"));
        std::fs::write(&cert, params.self_signed(&key).unwrap().pem()).unwrap();
        TestCa {
            dir: dir.to_path_buf(),
            cert,
            issuer: Issuer::new(params, key),
        }
    }

    /// A node certificate for `names` (DNS names or IP addresses), valid for server and client
    /// authentication, as a node's must be.
    pub fn node(&self, file: &str, names: &[&str]) -> Identity {
        self.issue(
            file,
            names,
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )
    }

    /// A client certificate: client authentication only.
    pub fn client(&self, file: &str, names: &[&str]) -> Identity {
        self.issue(file, names, vec![ExtendedKeyUsagePurpose::ClientAuth])
    }

    fn issue(&self, file: &str, names: &[&str], usages: Vec<ExtendedKeyUsagePurpose>) -> Identity {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params.distinguished_name.push(DnType::CommonName, file);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = usages;
        let identity = Identity {
            cert: self.dir.join(format!("{file}.pem")),
            key: self.dir.join(format!("{file}.key")),
        };
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        std::fs::write(&identity.cert, cert.pem()).unwrap();
        std::fs::write(&identity.key, key.serialize_pem()).unwrap();
        identity
    }
}
