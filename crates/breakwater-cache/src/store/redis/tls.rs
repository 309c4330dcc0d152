//! TLS for [`RedisStore`](crate::RedisStore): `rediss://` URLs, and with
//! the `tls` feature the CAs to trust and a client certificate (mTLS).
//!
//! Every connection the store opens is made from the clients built here
//! (commands, the cluster's connections to every node it discovers, and the
//! pub/sub connections), so one setting covers them all. Certificates are
//! always verified: redis-rs's `#insecure` URL fragment is refused.

use std::fmt;

use crate::error::{ConfigError, Error, ErrorKind};

use super::url::{connection_info, invalid_url, redact_url};

/// Whether `url` asks for TLS: a `rediss://` (or `valkeys://`) scheme, as
/// redis-rs reads it (schemes are case-insensitive).
pub(super) fn wants_tls(url: &str) -> bool {
    url.split_once("://").is_some_and(|(scheme, _)| {
        scheme.eq_ignore_ascii_case("rediss") || scheme.eq_ignore_ascii_case("valkeys")
    })
}

/// The TLS settings of a [`RedisStoreConfig`](crate::RedisStoreConfig):
/// PEM bytes, checked by [`validate`](TlsConfig::validate). Empty without
/// the `tls` feature.
#[derive(Clone, Default)]
pub(super) struct TlsConfig {
    /// CA certificates to trust instead of the webpki roots.
    #[cfg(feature = "tls")]
    pub(super) ca_pem: Option<Vec<u8>>,
    /// The client certificate chain and its private key.
    #[cfg(feature = "tls")]
    pub(super) client: Option<(Vec<u8>, Vec<u8>)>,
}

/// Never shows a certificate or a key: only whether each is set.
impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("TlsConfig");
        #[cfg(feature = "tls")]
        {
            let set = |on: bool| if on { "set" } else { "none" };
            d.field("ca_pem", &set(self.ca_pem.is_some()))
                .field("client_cert", &set(self.client.is_some()));
        }
        d.finish_non_exhaustive()
    }
}

impl TlsConfig {
    /// Whether a CA or a client certificate was given.
    pub(super) fn is_set(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.ca_pem.is_some() || self.client.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }

    /// The CAs parse to at least one certificate; the client chain to at
    /// least one certificate and a private key that belongs to it. Checked
    /// by building the rustls configuration the connections will use, so a
    /// bad PEM fails here, at `connect_with`, not on every reconnect. No
    /// message quotes a key.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        #[cfg(feature = "tls")]
        self.rustls_config()?;
        Ok(())
    }

    #[cfg(feature = "tls")]
    fn rustls_config(&self) -> Result<(), ConfigError> {
        use std::sync::Arc;

        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};

        if !self.is_set() {
            return Ok(());
        }
        let mut roots = rustls::RootCertStore::empty();
        if let Some(pem) = &self.ca_pem {
            let certs = CertificateDer::pem_slice_iter(pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| ConfigError::new(format!("redis tls_ca_pem is not valid PEM: {e}")))?;
            if certs.is_empty() {
                return Err(ConfigError::new(
                    "redis tls_ca_pem holds no certificate; give the CA certificate(s) as PEM \
                     (-----BEGIN CERTIFICATE-----)",
                ));
            }
            for cert in certs {
                roots.add(cert).map_err(|e| {
                    ConfigError::new(format!(
                        "redis tls_ca_pem: not a usable CA certificate: {e}"
                    ))
                })?;
            }
        }
        // Without a CA the connections trust the webpki roots; which roots
        // does not matter for checking the client certificate here.
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| ConfigError::new(format!("redis tls: {e}")))?
        .with_root_certificates(roots);
        if let Some((cert, key)) = &self.client {
            let chain = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| {
                    ConfigError::new(format!(
                        "redis tls_client_cert_pem: the certificate is not valid PEM: {e}"
                    ))
                })?;
            if chain.is_empty() {
                return Err(ConfigError::new(
                    "redis tls_client_cert_pem: the certificate holds no certificate; give the \
                     client certificate (and any intermediates) as PEM (-----BEGIN CERTIFICATE-----)",
                ));
            }
            // The parser's reason may quote a line of the key: not shown.
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|_| {
                ConfigError::new(
                    "redis tls_client_cert_pem: the key is not a PEM private key (PKCS #8, \
                     PKCS #1 or SEC1: -----BEGIN PRIVATE KEY-----)",
                )
            })?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                ConfigError::new(format!(
                    "redis tls_client_cert_pem: the key and certificate cannot be used: {e}"
                ))
            })?;
        }
        Ok(())
    }

    /// The certificates in redis-rs's form, if any were given.
    #[cfg(feature = "tls")]
    fn certificates(&self) -> Option<redis::TlsCertificates> {
        self.is_set().then(|| redis::TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.ca_pem.clone(),
        })
    }

    /// The TLS part of a cluster client: the certificates, if any (a
    /// `rediss://` seed URL alone already makes every node connection TLS).
    pub(super) fn cluster(
        &self,
        builder: redis::cluster::ClusterClientBuilder,
    ) -> redis::cluster::ClusterClientBuilder {
        #[cfg(feature = "tls")]
        if let Some(certs) = self.certificates() {
            return builder.certs(certs);
        }
        builder
    }
}

/// A client for one server's URL (with `TCP_NODELAY`, see
/// [`connection_info`]; TLS as the URL and `tls` say, see [`client`]). A
/// URL that does not parse is named with its password masked
/// ([`redact_url`]), and redis-rs's reason is kept as text with any copy
/// of the URL or password masked too.
pub(super) fn node_client(url: &str, tls: &TlsConfig) -> Result<redis::Client, Error> {
    check_supported(url)?;
    let info = connection_info(url).map_err(|e| invalid_url(url, &e))?;
    client(url, info, tls)
}

/// A client for `info` (parsed from `url`), with TLS as `url` and `tls`
/// say. Without the `tls` feature a `rediss://` URL is a configuration
/// error saying to enable it; TLS settings with a `redis://` URL are one
/// too, as is `#insecure` (no certificate checks).
fn client(url: &str, info: redis::ConnectionInfo, tls: &TlsConfig) -> Result<redis::Client, Error> {
    let tls_url = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
    if tls.is_set() && !tls_url {
        return Err(config_error(format!(
            "redis TLS settings (tls_ca_pem, tls_client_cert_pem) need a rediss:// url, got {:?}",
            redact_url(url)
        )));
    }
    if !tls_url {
        return redis::Client::open(info).map_err(|e| invalid_url(url, &e));
    }
    #[cfg(feature = "tls")]
    {
        if matches!(
            info.addr(),
            redis::ConnectionAddr::TcpTls { insecure: true, .. }
        ) {
            return Err(config_error(format!(
                "redis url {:?}: #insecure (no certificate checks) is not supported; give the \
                 server's CA with RedisStoreConfig::tls_ca_pem instead",
                redact_url(url)
            )));
        }
        ensure_crypto_provider();
        match tls.certificates() {
            Some(certs) => redis::Client::build_with_tls(info, certs),
            None => redis::Client::open(info),
        }
        .map_err(|e| invalid_url(url, &e))
    }
    #[cfg(not(feature = "tls"))]
    unreachable!("a rediss:// url is refused before it is parsed without the tls feature")
}

/// Without the `tls` feature, the error for a `rediss://` URL (redis-rs's
/// own, "the feature is not enabled", names a feature of redis-rs).
fn check_supported(url: &str) -> Result<(), Error> {
    if cfg!(feature = "tls") || !wants_tls(url) {
        return Ok(());
    }
    Err(config_error(format!(
        "redis url {:?} asks for TLS, but breakwater was built without its `tls` feature; \
         enable it: breakwater-cache = {{ version = \"{}\", features = [\"tls\"] }}",
        redact_url(url),
        env!("CARGO_PKG_VERSION"),
    )))
}

/// Redis Sentinel over TLS is not supported yet (the sentinels' and the
/// master's connections would need it alike): a `Config` error for a
/// `rediss://` sentinel or master URL, or TLS settings, instead of a store
/// that is TLS on some connections only.
pub(super) fn refuse_for_sentinel(url: &str, tls: &TlsConfig) -> Result<(), Error> {
    if !tls.is_set() && !wants_tls(url) {
        return Ok(());
    }
    Err(config_error(format!(
        "redis sentinel over TLS is not supported yet ({:?}, or TLS settings on \
         RedisStoreConfig); use redis:// urls, or connect to the master or cluster directly",
        redact_url(url)
    )))
}

/// rustls needs a process-wide crypto provider; when the program's
/// dependencies enable more than one (ring and aws-lc-rs), none is chosen
/// and connecting would panic. Installs ring's unless one is installed.
#[cfg(feature = "tls")]
fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may install one first: either is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

fn config_error(message: String) -> Error {
    Error::new(ErrorKind::Config, message)
}
