//! Development certificates (`--data-dir`): a peer CA that signs node certificates, a separate
//! client CA that signs a client certificate, created once with rcgen and reused on later
//! starts; node certificates per node id; and PEM loading.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Names every development node certificate carries besides its node id, so clients reach a
/// local node by `localhost` or a loopback address.
const LOCAL_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// Paths of the development PKI inside a data directory.
#[derive(Debug, Clone)]
pub struct DevCerts {
    pub dir: PathBuf,
    /// The peer CA: signs node certificates; clients trust it (`--ca` of the `floodgate`
    /// command) and nodes verify each other with it (`--peer-ca`).
    pub ca: PathBuf,
    /// The peer CA's key, kept to sign the certificates of node ids started later.
    pub ca_key: PathBuf,
    /// A node certificate for a node without `--node-id` (names: localhost, 127.0.0.1, ::1).
    pub node_cert: PathBuf,
    pub node_key: PathBuf,
    /// The client CA: signs `client.pem`; give it to nodes as `--client-ca` for mutual TLS.
    /// Separate from the peer CA, so a client certificate is never a node's.
    pub client_ca: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl DevCerts {
    fn in_dir(dir: &Path) -> Self {
        DevCerts {
            dir: dir.to_path_buf(),
            ca: dir.join("ca.pem"),
            ca_key: dir.join("ca.key"),
            node_cert: dir.join("node.pem"),
            node_key: dir.join("node.key"),
            client_ca: dir.join("client-ca.pem"),
            client_cert: dir.join("client.pem"),
            client_key: dir.join("client.key"),
        }
    }

    fn all(&self) -> [&Path; 7] {
        [
            &self.ca,
            &self.ca_key,
            &self.node_cert,
            &self.node_key,
            &self.client_ca,
            &self.client_cert,
            &self.client_key,
        ]
    }

    /// The certificate and key of node `id` (`node-<id>.pem`, `node-<id>.key`), created with
    /// the peer CA on first use: several nodes may share one data directory. The id must be a
    /// valid node id (a DNS name), which also keeps it a plain file name.
    pub fn node_cert_for(&self, id: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
        crate::node_id::validate_node_id(id)?;
        let cert = self.dir.join(format!("node-{id}.pem"));
        let key = self.dir.join(format!("node-{id}.key"));
        if cert.exists() && key.exists() {
            return Ok((cert, key));
        }
        let ca_key = KeyPair::from_pem(
            &fs::read_to_string(&self.ca_key)
                .with_context(|| format!("reading {}", self.ca_key.display()))?,
        )
        .with_context(|| format!("parsing {}", self.ca_key.display()))?;
        let issuer = Issuer::new(ca_params()?, ca_key);
        let names = std::iter::once(id).chain(LOCAL_NAMES).map(str::to_owned);
        let (pem, key_pem) = node_certificate(names.collect(), &issuer)?;
        // Key first: a certificate without its key would be taken as complete by another start.
        write_file(&key, &key_pem)?;
        write_file(&cert, &pem)?;
        Ok((cert, key))
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
            "{} holds only some of ca.pem, ca.key, node.pem, node.key, client-ca.pem, client.pem, \
             client.key (an older layout had one CA for nodes and clients); remove them or \
             complete the set",
            dir.display()
        );
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca_params()?.self_signed(&ca_key)?;
    write_file(&certs.ca_key, &ca_key.serialize_pem())?;
    write_file(&certs.ca, &ca_cert.pem())?;
    let issuer = Issuer::new(ca_params()?, ca_key);
    let (node_pem, node_key) = node_certificate(LOCAL_NAMES.map(str::to_owned).to_vec(), &issuer)?;
    write_file(&certs.node_cert, &node_pem)?;
    write_file(&certs.node_key, &node_key)?;

    // The client CA's key is not kept: it signs this one certificate.
    let client_ca_key = KeyPair::generate()?;
    let mut client_ca_params = ca_params()?;
    client_ca_params.distinguished_name = rcgen::DistinguishedName::new();
    client_ca_params
        .distinguished_name
        .push(DnType::CommonName, "floodgate development client CA");
    write_file(
        &certs.client_ca,
        &client_ca_params.self_signed(&client_ca_key)?.pem(),
    )?;
    let client_issuer = Issuer::new(client_ca_params, client_ca_key);
    let client_key = KeyPair::generate()?;
    let mut client_params = CertificateParams::new(Vec::<String>::new())?;
    client_params
        .distinguished_name
        .push(DnType::CommonName, "floodgate development client");
    client_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    client_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    write_file(
        &certs.client_cert,
        &client_params.signed_by(&client_key, &client_issuer)?.pem(),
    )?;
    write_file(&certs.client_key, &client_key.serialize_pem())?;
    Ok(certs)
}

/// The development peer CA's parameters (the same each time, so its key can sign again later).
fn ca_params() -> anyhow::Result<CertificateParams> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, "floodgate development CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(params)
}

/// A node certificate for `names` (rcgen turns names that parse as IP addresses into IP SANs):
/// server and client authentication, since a node serves and dials its peers. Returns the
/// certificate and key PEM.
fn node_certificate(
    names: Vec<String>,
    issuer: &Issuer<'_, KeyPair>,
) -> anyhow::Result<(String, String)> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(names)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "floodgate node");
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    Ok((params.signed_by(&key, issuer)?.pem(), key.serialize_pem()))
}

/// Writes `contents` whole or not at all (a temporary file renamed into place): nodes sharing a
/// data directory never read a half-written file. Keys are readable by their owner only.
fn write_file(path: &Path, contents: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    fs::write(&tmp, contents).with_context(|| format!("writing {}", tmp.display()))?;
    #[cfg(unix)]
    if path.extension().is_some_and(|e| e == "key") {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o600))?;
    }
    fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
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
