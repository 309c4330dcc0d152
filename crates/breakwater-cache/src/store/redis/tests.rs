//! Unit tests of [`RedisStore`]'s constructors and `Debug`: URLs, timeouts
//! and TLS settings refused with exact messages, and never a password in
//! an error or in `Debug`. (Each file below tests its own items.)

use super::*;

#[test]
fn bad_url_is_a_config_error() {
    let err = RedisStore::connect("mysql://nope").unwrap_err();
    assert!(err.is_config(), "{err}");
    assert!(err.to_string().contains("invalid redis url"), "{err}");
}

const SECRET_URL: &str = "redis://user:hunter2@host:notaport/0";

/// Display and Debug of an error, which must not show a password.
fn shown(err: &Error) -> String {
    format!("{err} | {err:?}")
}

#[test]
fn a_bad_url_is_named_with_its_password_masked() {
    let err = RedisStore::connect(SECRET_URL).unwrap_err();
    assert!(err.is_config(), "{err}");
    let shown = shown(&err);
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(
        err.to_string().starts_with(
            "invalid configuration: invalid redis url \"redis://user:***@host:notaport/0\""
        ),
        "{err}"
    );
    let config = RedisStoreConfig::default();
    let err = RedisStore::connect_with(SECRET_URL, config).unwrap_err();
    assert!(!self::shown(&err).contains("hunter2"), "{err:?}");
}

#[test]
fn a_bad_cluster_url_is_named_with_its_password_masked() {
    let err = RedisStore::connect_cluster(["redis://:other-secret@127.0.0.1:7000", SECRET_URL])
        .unwrap_err();
    let shown = shown(&err);
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(
        shown.contains("redis://user:***@host:notaport/0"),
        "{shown}"
    );
    // Valid URLs whose passwords differ: the cluster client's reason
    // does not show them either.
    let result = RedisStore::connect_cluster([
        "redis://:s3cret-a@127.0.0.1:7000",
        "redis://:s3cret-b@127.0.0.1:7001",
    ]);
    if let Err(err) = result {
        let shown = self::shown(&err);
        assert!(!shown.contains("s3cret"), "{shown}");
    }
}

#[test]
fn debug_never_shows_a_password() {
    let store = RedisStore::connect("redis://user:hunter2@127.0.0.1:1/0").unwrap();
    let shown = format!("{store:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    let cluster = RedisStore::connect_cluster(["redis://:hunter2@127.0.0.1:1/"]).unwrap();
    let shown = format!("{cluster:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
}

#[test]
fn a_sentinel_stores_debug_shows_no_password() {
    let store = RedisStore::connect_sentinel(
        ["redis://:hunter2@127.0.0.1:26379"],
        "redis://:hunter3@mymaster/0",
    )
    .unwrap();
    let shown = format!("{store:?}");
    assert!(!shown.contains("hunter"), "{shown}");
    assert!(shown.contains("127.0.0.1:26379"), "{shown}");
    assert!(shown.contains("mymaster"), "{shown}");
}

#[tokio::test]
async fn connect_errors_never_show_a_password() {
    let store = RedisStore::connect("redis://user:hunter2@127.0.0.1:1/0").unwrap();
    let err = store.get(b"k").await.unwrap_err();
    assert!(!shown(&err).contains("hunter2"), "{err:?}");
}

#[test]
fn a_cluster_needs_valid_node_urls() {
    let err = RedisStore::connect_cluster(Vec::<&str>::new()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid configuration: a redis cluster needs at least one node url"
    );
    let err = RedisStore::connect_cluster(["redis://127.0.0.1:7000", "not a url"]).unwrap_err();
    assert!(err.is_config(), "{err}");
    assert!(err.to_string().contains("not a url"), "{err}");
    // Valid URLs make a store without connecting.
    assert!(RedisStore::connect_cluster(["redis://127.0.0.1:1/"]).is_ok());
}

#[test]
fn zero_timeout_is_rejected() {
    let config = RedisStoreConfig::default().response_timeout(Duration::ZERO);
    let err = RedisStore::connect_with("redis://127.0.0.1:1/", config).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid configuration: redis response_timeout must be greater than zero"
    );
}

#[test]
fn timeouts_past_a_day_are_rejected() {
    let config = RedisStoreConfig::default().connect_timeout(Duration::MAX);
    let err = RedisStore::connect_with("redis://127.0.0.1:1/", config).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "invalid configuration: redis connect_timeout must be at most 1 day, got {:?}; \
             use milliseconds to seconds (see RedisStoreConfig's defaults)",
            Duration::MAX
        )
    );
    let config = RedisStoreConfig::default().clock_refresh(Duration::from_secs(86_401));
    assert!(RedisStore::connect_cluster_with(["redis://127.0.0.1:1/"], config).is_err());
}

#[tokio::test]
async fn unreachable_redis_fails_fast_with_a_store_error() {
    // Port 1 on loopback: nothing listens, the connection is refused.
    let store = RedisStore::connect("redis://127.0.0.1:1/").unwrap();
    let err = store.get(b"k").await.unwrap_err();
    assert!(err.is_store(), "{err}");
    // The clock falls back to the system clock until Redis is reached.
    assert!(store.now_ms() > 1_600_000_000_000);
}

/// The TLS settings, as the constructors check them (see `tls`).
mod tls_settings {
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
