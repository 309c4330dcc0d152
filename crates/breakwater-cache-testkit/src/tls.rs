//! Certificates for TLS test servers, made per test, and the blocking TLS
//! client the kit uses for its own commands to such a server.

use std::fmt;
use std::fs;
use std::io;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

/// A private certificate authority and what it signed, for one test: a
/// server certificate for `127.0.0.1` and `localhost` (good for client
/// authentication too, as cluster nodes and replicas need), and a client
/// certificate (for servers that require one: `redis-server` does by
/// default once it is given a CA, `tls-auth-clients yes`).
///
/// Made fresh with [`TestCerts::generate`] (ECDSA P-256 keys, by `rcgen`),
/// so no certificate or key is checked in. Two calls make two unrelated
/// authorities: a client that trusts one does not trust the other's
/// server, which is how a test shows a wrong CA being refused.
///
/// `Debug` shows none of the keys.
///
/// ```no_run
/// use breakwater_cache_testkit::{RedisServer, TestCerts};
///
/// let certs = TestCerts::generate();
/// let server = RedisServer::start_tls(&certs);
/// assert!(server.url().starts_with("rediss://127.0.0.1:"));
/// assert_eq!(server.command(&["PING"]).unwrap(), "PONG");
/// let (ca, cert, key) = (certs.ca_pem(), certs.client_cert_pem(), certs.client_key_pem());
/// # let _ = (ca, cert, key);
/// ```
#[derive(Clone)]
pub struct TestCerts {
    ca_pem: String,
    server_cert_pem: String,
    server_key_pem: String,
    client_cert_pem: String,
    client_key_pem: String,
}

impl fmt::Debug for TestCerts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestCerts").finish_non_exhaustive()
    }
}

impl TestCerts {
    /// A new authority named "breakwater test CA", a server certificate
    /// (`127.0.0.1`, `localhost`) and a client certificate signed by it.
    ///
    /// # Panics
    ///
    /// If `rcgen` cannot make a key or a certificate.
    pub fn generate() -> TestCerts {
        let ca_key = KeyPair::generate().unwrap_or_else(|e| panic!("rcgen: CA key: {e}"));
        let mut ca = CertificateParams::default();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "breakwater test CA");
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = CertifiedIssuer::self_signed(ca, ca_key)
            .unwrap_or_else(|e| panic!("rcgen: CA certificate: {e}"));

        let leaf = |name: &str, purposes: Vec<ExtendedKeyUsagePurpose>| {
            let key = KeyPair::generate().unwrap_or_else(|e| panic!("rcgen: {name} key: {e}"));
            let mut params = CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()])
                .unwrap_or_else(|e| panic!("rcgen: {name} names: {e}"));
            params.distinguished_name.push(DnType::CommonName, name);
            params.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            params.extended_key_usages = purposes;
            let cert = params
                .signed_by(&key, &ca)
                .unwrap_or_else(|e| panic!("rcgen: {name} certificate: {e}"));
            (cert.pem(), key.serialize_pem())
        };
        // A server is a client too: of other nodes on the cluster bus and
        // of its primary (redis-server presents its one certificate both
        // ways unless given a client one).
        let (server_cert_pem, server_key_pem) = leaf(
            "breakwater test server",
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        );
        let (client_cert_pem, client_key_pem) = leaf(
            "breakwater test client",
            vec![ExtendedKeyUsagePurpose::ClientAuth],
        );
        TestCerts {
            ca_pem: ca.pem(),
            server_cert_pem,
            server_key_pem,
            client_cert_pem,
            client_key_pem,
        }
    }

    /// The authority's certificate (PEM): what a client trusts.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The client certificate (PEM), signed by the authority.
    pub fn client_cert_pem(&self) -> &str {
        &self.client_cert_pem
    }

    /// The client certificate's private key (PKCS #8 PEM).
    pub fn client_key_pem(&self) -> &str {
        &self.client_key_pem
    }

    /// Writes the server's files into `dir`: `ca.crt`, `server.crt`,
    /// `server.key`.
    pub(crate) fn write_server_files(&self, dir: &Path) -> ServerFiles {
        let files = ServerFiles {
            ca: dir.join("ca.crt"),
            cert: dir.join("server.crt"),
            key: dir.join("server.key"),
        };
        for (path, pem) in [
            (&files.ca, &self.ca_pem),
            (&files.cert, &self.server_cert_pem),
            (&files.key, &self.server_key_pem),
        ] {
            fs::write(path, pem).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        }
        files
    }

    /// A rustls client that trusts the authority and presents the client
    /// certificate, on the ring provider (set here, not installed as the
    /// process default, so the code under test chooses its own).
    pub(crate) fn client_config(&self) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(self.ca_pem.as_bytes()) {
            let cert = cert.unwrap_or_else(|e| panic!("test CA PEM: {e}"));
            roots
                .add(cert)
                .unwrap_or_else(|e| panic!("test CA certificate: {e}"));
        }
        let chain = CertificateDer::pem_slice_iter(self.client_cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap_or_else(|e| panic!("test client certificate PEM: {e}"));
        let key = PrivateKeyDer::from_pem_slice(self.client_key_pem.as_bytes())
            .unwrap_or_else(|e| panic!("test client key PEM: {e}"));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap_or_else(|e| panic!("rustls protocol versions: {e}"))
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .unwrap_or_else(|e| panic!("rustls client certificate: {e}"));
        Arc::new(config)
    }
}

/// Where a TLS server's certificate, key and CA files are.
#[derive(Debug, Clone)]
pub(crate) struct ServerFiles {
    pub(crate) ca: PathBuf,
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
}

/// `stream` wrapped in a TLS client session for `127.0.0.1`.
pub(crate) fn connect(
    config: &Arc<ClientConfig>,
    stream: TcpStream,
) -> io::Result<StreamOwned<ClientConnection, TcpStream>> {
    let name = ServerName::try_from("127.0.0.1").map_err(io::Error::other)?;
    let conn = ClientConnection::new(Arc::clone(config), name).map_err(io::Error::other)?;
    Ok(StreamOwned::new(conn, stream))
}
