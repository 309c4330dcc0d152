//! TLS for [`RedisStore`](super::RedisStore): `rediss://` URLs, and with
//! the `tls` feature the CAs to trust and a client certificate (mTLS).
//!
//! Every connection the store opens is made from the clients built here
//! (commands, the cluster's connections to every node it discovers, and the
//! pub/sub connections), so one setting covers them all. Certificates are
//! always verified: redis-rs's `#insecure` URL fragment is refused.

use std::fmt;

use crate::error::{ConfigError, Error, ErrorKind};

use super::{invalid_url, redact_url};

/// Whether `url` asks for TLS: a `rediss://` (or `valkeys://`) scheme, as
/// redis-rs reads it (schemes are case-insensitive).
pub(super) fn wants_tls(url: &str) -> bool {
    url.split_once("://").is_some_and(|(scheme, _)| {
        scheme.eq_ignore_ascii_case("rediss") || scheme.eq_ignore_ascii_case("valkeys")
    })
}

/// The TLS settings of a [`RedisStoreConfig`](super::RedisStoreConfig):
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

/// A client for `info` (parsed from `url`), with TLS as `url` and `tls`
/// say. Without the `tls` feature a `rediss://` URL is a configuration
/// error saying to enable it; TLS settings with a `redis://` URL are one
/// too, as is `#insecure` (no certificate checks).
pub(super) fn client(
    url: &str,
    info: redis::ConnectionInfo,
    tls: &TlsConfig,
) -> Result<redis::Client, Error> {
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
pub(super) fn check_supported(url: &str) -> Result<(), Error> {
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

#[cfg(test)]
mod tests {
    use crate::RedisStore;

    #[cfg(not(feature = "tls"))]
    #[test]
    fn a_rediss_url_without_the_feature_says_to_enable_it() {
        for url in [
            "rediss://app:hunter2@127.0.0.1:6380/",
            "REDISS://127.0.0.1/",
        ] {
            let err = RedisStore::connect(url).unwrap_err();
            assert!(err.is_config(), "{err}");
            let shown = format!("{err} {err:?}");
            assert!(shown.contains("without its `tls` feature"), "{shown}");
            assert!(shown.contains("features = [\\\"tls\\\"]"), "{shown}");
            assert!(!shown.contains("hunter2"), "{shown}");
        }
        let err = RedisStore::connect_cluster(["rediss://:hunter2@127.0.0.1:7000/"]).unwrap_err();
        assert!(err.to_string().contains("`tls` feature"), "{err}");
        assert!(!err.to_string().contains("hunter2"), "{err}");
        // Plain URLs are untouched.
        assert!(RedisStore::connect("redis://127.0.0.1:1/").is_ok());
    }

    #[cfg(feature = "tls")]
    mod with_tls {
        use breakwater_cache_testkit::TestCerts;

        use super::*;
        use crate::RedisStoreConfig;

        fn with_certs(certs: &TestCerts) -> RedisStoreConfig {
            RedisStoreConfig::default()
                .tls_ca_pem(certs.ca_pem())
                .tls_client_cert_pem(certs.client_cert_pem(), certs.client_key_pem())
        }

        /// `Display` and `Debug` of a config error.
        fn config_error(url: &str, config: RedisStoreConfig) -> String {
            let err = RedisStore::connect_with(url, config).unwrap_err();
            assert!(err.is_config(), "{err}");
            format!("{err} | {err:?}")
        }

        #[test]
        fn rediss_urls_make_stores_without_connecting() {
            assert!(RedisStore::connect("rediss://127.0.0.1:1/").is_ok());
            assert!(RedisStore::connect("valkeys://127.0.0.1:1/").is_ok());
            let certs = TestCerts::generate();
            assert!(RedisStore::connect_with("rediss://127.0.0.1:1/", with_certs(&certs)).is_ok());
            assert!(
                RedisStore::connect_cluster_with(
                    ["rediss://127.0.0.1:1/", "rediss://127.0.0.1:2/"],
                    with_certs(&certs)
                )
                .is_ok()
            );
        }

        #[test]
        fn tls_settings_need_a_rediss_url() {
            let certs = TestCerts::generate();
            let shown = config_error("redis://:hunter2@127.0.0.1:1/", with_certs(&certs));
            assert!(shown.contains("need a rediss:// url"), "{shown}");
            assert!(!shown.contains("hunter2"), "{shown}");
            let err =
                RedisStore::connect_cluster_with(["redis://127.0.0.1:1/"], with_certs(&certs))
                    .unwrap_err();
            assert!(err.to_string().contains("need a rediss:// url"), "{err}");
        }

        #[test]
        fn sentinel_over_tls_is_refused_as_not_supported_yet() {
            let certs = TestCerts::generate();
            let refused = |sentinel: &str, master: &str, config: RedisStoreConfig| {
                let err =
                    RedisStore::connect_sentinel_with([sentinel], master, config).unwrap_err();
                assert!(err.is_config(), "{err}");
                let shown = format!("{err} | {err:?}");
                assert!(
                    shown.contains("sentinel over TLS is not supported"),
                    "{shown}"
                );
                assert!(!shown.contains("hunter2"), "{shown}");
            };
            let plain = RedisStoreConfig::default;
            refused("rediss://:hunter2@127.0.0.1:1/", "mymaster", plain());
            refused(
                "redis://127.0.0.1:1/",
                "rediss://:hunter2@mymaster/0",
                plain(),
            );
            refused("redis://127.0.0.1:1/", "mymaster", with_certs(&certs));
            assert!(RedisStore::connect_sentinel(["redis://127.0.0.1:1/"], "mymaster").is_ok());
        }

        #[test]
        fn a_cluster_of_tls_and_plain_urls_is_refused() {
            let err =
                RedisStore::connect_cluster(["rediss://127.0.0.1:1/", "redis://127.0.0.1:2/"])
                    .unwrap_err();
            assert!(err.is_config(), "{err}");
            assert!(err.to_string().contains("all be rediss://"), "{err}");
        }

        #[test]
        fn insecure_is_refused() {
            let shown = config_error(
                "rediss://:hunter2@127.0.0.1:1/#insecure",
                RedisStoreConfig::default(),
            );
            assert!(shown.contains("#insecure"), "{shown}");
            assert!(shown.contains("tls_ca_pem"), "{shown}");
            assert!(!shown.contains("hunter2"), "{shown}");
        }

        #[test]
        fn a_ca_without_a_certificate_is_refused() {
            let url = "rediss://127.0.0.1:1/";
            for pem in [
                &b""[..],
                b"not a pem",
                b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
            ] {
                let shown = config_error(url, RedisStoreConfig::default().tls_ca_pem(pem));
                assert!(shown.contains("tls_ca_pem"), "{shown}");
            }
            let shown = config_error(url, RedisStoreConfig::default().tls_ca_pem("junk"));
            assert!(shown.contains("holds no certificate"), "{shown}");
        }

        #[test]
        fn a_bad_client_key_is_refused_without_being_quoted() {
            let certs = TestCerts::generate();
            let url = "rediss://127.0.0.1:1/";
            let secret =
                "-----BEGIN PRIVATE KEY-----\nhunter2-key-bytes!\n-----END PRIVATE KEY-----\n";
            for key in [secret, "", "hunter2-key-bytes"] {
                let config =
                    RedisStoreConfig::default().tls_client_cert_pem(certs.client_cert_pem(), key);
                let shown = config_error(url, config);
                assert!(shown.contains("tls_client_cert_pem"), "{shown}");
                assert!(!shown.contains("hunter2"), "{shown}");
            }
            // No certificate at all.
            let config =
                RedisStoreConfig::default().tls_client_cert_pem("", certs.client_key_pem());
            let shown = config_error(url, config);
            assert!(shown.contains("holds no certificate"), "{shown}");
        }

        #[test]
        fn a_key_that_does_not_match_its_certificate_is_refused() {
            let (a, b) = (TestCerts::generate(), TestCerts::generate());
            let config = RedisStoreConfig::default()
                .tls_client_cert_pem(a.client_cert_pem(), b.client_key_pem());
            let shown = config_error("rediss://127.0.0.1:1/", config);
            assert!(shown.contains("cannot be used"), "{shown}");
        }

        #[test]
        fn debug_never_shows_a_certificate_or_a_key() {
            let certs = TestCerts::generate();
            let config = with_certs(&certs);
            let key_line = certs.client_key_pem().lines().nth(1).unwrap();
            let cert_line = certs.client_cert_pem().lines().nth(1).unwrap();
            let shown = format!("{config:?}");
            assert!(shown.contains("ca_pem: \"set\""), "{shown}");
            assert!(!shown.contains(key_line), "{shown}");
            assert!(!shown.contains(cert_line), "{shown}");
            let store = RedisStore::connect_with("rediss://127.0.0.1:1/", config).unwrap();
            let shown = format!("{store:?}");
            assert!(!shown.contains(key_line), "{shown}");
        }
    }
}
