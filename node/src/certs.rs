//! Development certificates (`--data-dir`): a CA, the node's certificate and a client
//! certificate, created once with rcgen and reused on later starts; and PEM loading.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Paths of the development PKI inside a data directory.
#[derive(Debug, Clone)]
pub struct DevCerts {
    pub dir: PathBuf,
    /// The CA certificate clients trust (`--ca` of the `floodgate` command).
    pub ca: PathBuf,
    pub node_cert: PathBuf,
    pub node_key: PathBuf,
    /// A client certificate signed by the same CA, for mutual TLS (`--client-ca DIR/ca.pem`).
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl DevCerts {
    fn in_dir(dir: &Path) -> Self {
        DevCerts {
            dir: dir.to_path_buf(),
            ca: dir.join("ca.pem"),
            node_cert: dir.join("node.pem"),
            node_key: dir.join("node.key"),
            client_cert: dir.join("client.pem"),
            client_key: dir.join("client.key"),
        }
    }

    fn all(&self) -> [&Path; 5] {
        [
            &self.ca,
            &self.node_cert,
            &self.node_key,
            &self.client_cert,
            &self.client_key,
        ]
    }
}

/// Creates the development PKI in `dir` unless it is already there; returns its paths. A partial
/// set (some files missing) is an error rather than silently replaced: certificates already handed
/// to clients would stop matching.
pub fn ensure_dev_certs(dir: &Path) -> anyhow::Result<DevCerts> {
    let certs = DevCerts::in_dir(dir);
    let present = certs.all().iter().filter(|p| p.exists()).count();
    if present == certs.all().len() {
        return Ok(certs);
    }
    if present > 0 {
        bail!(
            "{} holds only some of ca.pem, node.pem, node.key, client.pem, client.key; remove them or complete the set",
            dir.display()
        );
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "floodgate development CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key)?;
    write_file(&certs.ca, &ca_cert.pem())?;
    let issuer = Issuer::new(ca_params, ca_key);

    // rcgen turns names that parse as IP addresses into IP SANs.
    let node_names = vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
    ];
    let node_key = KeyPair::generate()?;
    let mut node_params = CertificateParams::new(node_names)?;
    node_params
        .distinguished_name
        .push(DnType::CommonName, "floodgate node");
    node_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    node_params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    write_file(
        &certs.node_cert,
        &node_params.signed_by(&node_key, &issuer)?.pem(),
    )?;
    write_file(&certs.node_key, &node_key.serialize_pem())?;

    let client_key = KeyPair::generate()?;
    let mut client_params = CertificateParams::new(Vec::<String>::new())?;
    client_params
        .distinguished_name
        .push(DnType::CommonName, "floodgate development client");
    client_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    client_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    write_file(
        &certs.client_cert,
        &client_params.signed_by(&client_key, &issuer)?.pem(),
    )?;
    write_file(&certs.client_key, &client_key.serialize_pem())?;
    Ok(certs)
}

fn write_file(path: &Path, contents: &str) -> anyhow::Result<()> {
    fs::write(path, contents).with_context(|| format!("writing {}", path.display()))?;
    #[cfg(unix)]
    if path.extension().is_some_and(|e| e == "key") {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

/// Every certificate in a PEM file (at least one).
pub fn load_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("opening {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing {}", path.display()))?;
    if certs.is_empty() {
        bail!("no certificate in {}", path.display());
    }
    Ok(certs)
}

/// The private key in a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path)
        .with_context(|| format!("loading the private key in {}", path.display()))
}
