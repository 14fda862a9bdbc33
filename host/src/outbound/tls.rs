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
    path::{Path, PathBuf},
    sync::{Arc, OnceLock},
};

use rustls::{
    ClientConfig, RootCertStore,
    pki_types::{CertificateDer, pem::PemObject},
};

/// Why a plugin's `ca_file` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CaFileError {
    #[error("{path}: cannot be read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not PEM certificates: {reason}")]
    Pem { path: PathBuf, reason: String },
    #[error("{path}: holds no certificate (expected `-----BEGIN CERTIFICATE-----` blocks)")]
    Empty { path: PathBuf },
    #[error("{path}: certificate {index} is not a usable CA certificate: {reason}")]
    Certificate {
        path: PathBuf,
        index: usize,
        reason: String,
    },
}

/// The roots every plugin trusts: Mozilla's set plus the operating system's store, read once.
fn default_roots() -> &'static RootCertStore {
    static ROOTS: OnceLock<RootCertStore> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let mut roots = RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        let native = rustls_native_certs::load_native_certs();
        for error in &native.errors {
            tracing::warn!("reading the system's CA certificates: {error}");
        }
        // An OS certificate rustls cannot parse is skipped, like every TLS client does.
        let (added, ignored) = roots.add_parsable_certificates(native.certs);
        tracing::debug!(added, ignored, "system CA certificates");
        roots
    })
}

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
    for (index, cert) in read_ca_file(path)?.into_iter().enumerate() {
        roots.add(cert).map_err(|e| CaFileError::Certificate {
            path: path.to_owned(),
            index: index + 1,
            reason: e.to_string(),
        })?;
    }
    Ok(build(roots))
}

fn build(roots: RootCertStore) -> Arc<ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .expect("the ring provider supports TLS 1.2 and 1.3")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// Every certificate in a PEM file; at least one.
fn read_ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, CaFileError> {
    let pem = std::fs::read(path).map_err(|source| CaFileError::Read {
        path: path.to_owned(),
        source,
    })?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CaFileError::Pem {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(CaFileError::Empty {
            path: path.to_owned(),
        });
    }
    Ok(certs)
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
