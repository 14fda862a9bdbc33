//! Outbound TLS client configuration: which certificate authorities a plugin's `https://`
//! requests trust, built once per plugin instance when its configuration loads.
//!
//! Invariants:
//! - Verification is never skipped: every configuration trusts the Mozilla roots
//!   (`webpki-roots`), the operating system's store (read once per process) and the plugin's
//!   own `ca_file`, and nothing else; there is no switch that accepts an unverified peer.
//! - rustls with the ring provider, TLS 1.2 and 1.3 only, ALPN `http/1.1` (the transport speaks
//!   HTTP/1.1).
//! - A `ca_file` that cannot be used is a [`CaFileError`] naming the file and why, at load time,
//!   never a per-request surprise.

use std::{
    path::Path,
    sync::{Arc, OnceLock},
};

use rustls::{ClientConfig, RootCertStore};

pub use crate::tls::CaFileError;
use crate::tls::{add_ca_file, default_roots};

/// The client configuration of every plugin without a `ca_file`, built once.
pub fn default_client() -> Arc<ClientConfig> {
    static CLIENT: OnceLock<Arc<ClientConfig>> = OnceLock::new();
    CLIENT
        .get_or_init(|| build(default_roots().clone()))
        .clone()
}

/// The client configuration for a plugin: the default roots plus the CAs in `ca_file`, if any.
pub fn client_config(ca_file: Option<&Path>) -> Result<Arc<ClientConfig>, CaFileError> {
    let Some(path) = ca_file else {
        return Ok(default_client());
    };
    let mut roots = default_roots().clone();
    add_ca_file(&mut roots, path)?;
    Ok(build(roots))
}

fn build(roots: RootCertStore) -> Arc<ClientConfig> {
    let mut config = crate::tls::client_builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_without_certificates_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, "not a certificate\n").unwrap();
        let err = client_config(Some(&path)).unwrap_err();
        assert!(matches!(err, CaFileError::Empty { .. }), "{err:?}");
        assert!(err.to_string().contains("ca.pem"), "{err}");
    }

    #[test]
    fn a_missing_ca_file_is_refused_by_name() {
        let err = client_config(Some(Path::new("/nonexistent/ca.pem"))).unwrap_err();
        assert!(matches!(err, CaFileError::Read { .. }), "{err:?}");
        assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
    }

    #[test]
    fn a_certificate_block_that_is_not_der_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(
            &path,
            "-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let err = client_config(Some(&path)).unwrap_err();
        assert!(
            matches!(err, CaFileError::Certificate { index: 1, .. }),
            "{err:?}"
        );
    }
}
