//! Trust material every TLS client of hookd shares (a plugin's outbound requests, the
//! connection to PostgreSQL): the default roots, CA files, and rustls on the ring provider.
//!
//! Invariants:
//! - One crypto provider (ring) and TLS 1.2/1.3 only, for every client.
//! - The default roots are Mozilla's (`webpki-roots`) plus the operating system's store, read
//!   once per process.
//! - A CA file that cannot be used is a [`CaFileError`] naming the file and why.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, OnceLock},
};

use rustls::{
    ClientConfig, RootCertStore,
    pki_types::{CertificateDer, pem::PemObject},
};

/// rustls on the ring provider, TLS 1.3 and 1.2: where every client configuration starts.
pub(crate) fn client_builder() -> rustls::ConfigBuilder<ClientConfig, rustls::WantsVerifier> {
    ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .expect("the ring provider supports TLS 1.2 and 1.3")
}

/// The crypto provider every client uses.
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    static PROVIDER: OnceLock<Arc<rustls::crypto::CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(rustls::crypto::ring::default_provider()))
        .clone()
}

/// Why a file of CA certificates (a plugin's `ca_file`, a database URL's `sslrootcert`) cannot
/// be used.
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

/// The roots trusted unless told otherwise: Mozilla's set plus the operating system's store, read once.
pub(crate) fn default_roots() -> &'static RootCertStore {
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

/// Adds every certificate of the PEM file at `path` to `roots`.
pub(crate) fn add_ca_file(roots: &mut RootCertStore, path: &Path) -> Result<(), CaFileError> {
    for (index, cert) in read_ca_file(path)?.into_iter().enumerate() {
        roots.add(cert).map_err(|e| CaFileError::Certificate {
            path: path.to_owned(),
            index: index + 1,
            reason: e.to_string(),
        })?;
    }
    Ok(())
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
