//! TLS to the database, as libpq's connection options say it: `sslmode` (`disable`, `prefer`
//! (the default), `require`, `verify-ca`, `verify-full`), `sslrootcert` (a PEM file of the CAs
//! to trust, or `system`), and `sslcert` + `sslkey` (a client certificate), in the URL's query. tokio-postgres knows only the first three modes and none of the files,
//! so [`split`] takes these options out of the connection string and [`connector`] turns them
//! into a rustls configuration.
//!
//! Invariants:
//! - The modes mean what they mean to libpq: `prefer` and `require` encrypt without
//!   authenticating the server (unless `sslrootcert` names a file, when they check the chain as
//!   `verify-ca` does), `verify-ca` checks the chain and not the name, `verify-full` both.
//!   Even unauthenticated, the handshake's signature is checked against the certificate's key.
//! - `verify-ca` and `verify-full` without `sslrootcert` trust the default roots (Mozilla's and
//!   the system's); with a file, only the file's certificates. `sslrootcert=system` asks for
//!   `verify-full`, as libpq does.
//! - A file named by an option that cannot be used is refused at start-up, by option and path;
//!   no error quotes the connection string (it may hold the password).

use std::{path::Path, sync::Arc};

use rustls::{
    DigitallySignedStruct, Error as TlsError, RootCertStore, SignatureScheme,
    client::{
        WebPkiServerVerifier,
        danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    },
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime, pem::PemObject},
};
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::{inbox::InboxError, tls};

/// What makes each connection's TLS session.
pub(super) type Connector = MakeRustlsConnect;

/// How strictly the server is checked: libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl Mode {
    const NAMES: [(&'static str, Mode); 5] = [
        ("disable", Mode::Disable),
        ("prefer", Mode::Prefer),
        ("require", Mode::Require),
        ("verify-ca", Mode::VerifyCa),
        ("verify-full", Mode::VerifyFull),
    ];

    fn parse(value: &str) -> Result<Self, InboxError> {
        if let Some((_, mode)) = Self::NAMES.iter().find(|(name, _)| *name == value) {
            return Ok(*mode);
        }
        let hint = if value == "allow" {
            " (`allow`, plain first and TLS if refused, is not supported: use `prefer`)"
        } else {
            ""
        };
        Err(invalid(format!(
            "sslmode {value:?} is not one of {}{hint}",
            Self::NAMES.map(|(name, _)| name).join(", ")
        )))
    }

    /// tokio-postgres' own mode for it: whether to ask the server for TLS, and whether to give
    /// up without it.
    fn negotiation(self) -> SslMode {
        match self {
            Mode::Disable => SslMode::Disable,
            Mode::Prefer => SslMode::Prefer,
            Mode::Require | Mode::VerifyCa | Mode::VerifyFull => SslMode::Require,
        }
    }
}

/// The TLS options of a connection string, taken out of it.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Options {
    pub(super) mode: Option<Mode>,
    pub(super) root_cert: Option<String>,
    pub(super) client_cert: Option<String>,
    pub(super) client_key: Option<String>,
}

impl Options {
    fn set(&mut self, key: &str, value: String) -> Result<(), InboxError> {
        match key {
            "sslmode" => self.mode = Some(Mode::parse(&value)?),
            "sslrootcert" => self.root_cert = Some(value),
            "sslcert" => self.client_cert = Some(value),
            "sslkey" => self.client_key = Some(value),
            _ => unreachable!("only the keys of TLS_KEYS are set"),
        }
        Ok(())
    }
}

/// The options this module takes out of a connection string.
const TLS_KEYS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

fn invalid(reason: String) -> InboxError {
    InboxError::InvalidUrl { reason }
}

/// `url` without its TLS options, and those options, from a `postgres://` (or
/// `postgresql://`) URL's query (percent-encoded).
pub(super) fn split(url: &str) -> Result<(String, Options), InboxError> {
    let mut options = Options::default();
    let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        // The query starts at the first `?` after the credentials (which end at the first `@`,
        // as tokio-postgres reads them): a password may hold a `?` of its own.
        let after_scheme = url.find("://").map_or(0, |at| at + 3);
        let host_at = url[after_scheme..]
            .find('@')
            .map_or(after_scheme, |at| after_scheme + at + 1);
        let Some(query_at) = url[host_at..].find('?').map(|at| host_at + at) else {
            return Ok((url.to_owned(), options));
        };
        let (base, query) = (&url[..query_at], &url[query_at + 1..]);
        let mut kept = Vec::new();
        for pair in query.split('&') {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let key = decode(key);
            if TLS_KEYS.contains(&key.as_str()) {
                options.set(&key, decode(value))?;
            } else {
                kept.push(pair);
            }
        }
        if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        }
    } else {
        // hookd's configuration takes the URL form only.
        url.to_owned()
    };
    Ok((rest, options))
}

fn decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text)
        .decode_utf8_lossy()
        .into_owned()
}

/// Applies `options` to `config` and builds the connector its connections use. Reads the files
/// the options name, so a missing or unusable one stops the start-up by name.
pub(super) fn connector(
    options: &Options,
    config: &mut tokio_postgres::Config,
) -> Result<Connector, InboxError> {
    let mode = options.mode.unwrap_or(Mode::Prefer);
    config.ssl_mode(mode.negotiation());
    let roots = match options.root_cert.as_deref() {
        Some("system") => {
            if mode != Mode::VerifyFull {
                return Err(invalid(format!(
                    "sslrootcert=system needs sslmode=verify-full (it is {}): the system's \
                     roots vouch for names, not for a server you did not name",
                    Mode::NAMES
                        .iter()
                        .find(|(_, m)| *m == mode)
                        .map_or("", |(n, _)| n)
                )));
            }
            None
        }
        Some(path) => {
            let mut roots = RootCertStore::empty();
            tls::add_ca_file(&mut roots, Path::new(path))
                .map_err(|e| unusable(format!("sslrootcert: {e}")))?;
            Some(roots)
        }
        None => None,
    };
    let chain = |roots: Option<RootCertStore>| {
        WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots.unwrap_or_else(|| tls::default_roots().clone())),
            tls::provider(),
        )
        .build()
        .map_err(|e| unusable(format!("sslrootcert: {e}")))
    };
    let without_name = |chain| {
        Arc::new(WithoutName {
            chain,
            provider: tls::provider(),
        })
    };
    let verifier: Arc<dyn ServerCertVerifier> = match (mode, roots) {
        (Mode::VerifyFull, roots) => chain(roots)?,
        (Mode::VerifyCa, roots) => without_name(Some(chain(roots)?)),
        // libpq: with a root certificate at hand, `require` checks the chain.
        (_, Some(roots)) => without_name(Some(chain(Some(roots))?)),
        (_, None) => without_name(None),
    };
    let builder = tls::client_builder()
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let client = match (&options.client_cert, &options.client_key) {
        (None, None) => builder.with_no_client_auth(),
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| unusable(format!("sslcert: {cert}: {e}")))?;
            if chain.is_empty() {
                return Err(unusable(format!("sslcert: {cert}: holds no certificate")));
            }
            let key_der = client_key(key)?;
            builder.with_client_auth_cert(chain, key_der).map_err(|e| {
                let why = match e {
                    TlsError::InvalidCertificate(rustls::CertificateError::Other(other))
                        if format!("{other:?}").contains("UnsupportedCertVersion") =>
                    {
                        "it is an X.509 v1 certificate, which rustls does not take: issue \
                             a v3 one (with extensions, e.g. `openssl x509 -req ... -extfile`)"
                            .to_owned()
                    }
                    e => e.to_string(),
                };
                unusable(format!("sslcert ({cert}) with sslkey ({key}): {why}"))
            })?
        }
        (Some(_), None) => return Err(invalid("sslcert is set but sslkey is not".into())),
        (None, Some(_)) => return Err(invalid("sslkey is set but sslcert is not".into())),
    };
    Ok(MakeRustlsConnect::new(client))
}

fn unusable(reason: String) -> InboxError {
    InboxError::TlsFile { reason }
}

/// The client key in the PEM file at `path` (PKCS#8, PKCS#1 or SEC1), unencrypted: an
/// encrypted one is named as such (libpq's `sslpassword` is not taken).
fn client_key(path: &str) -> Result<PrivateKeyDer<'static>, InboxError> {
    let pem = std::fs::read(path).map_err(|e| unusable(format!("sslkey: {path}: {e}")))?;
    let text = String::from_utf8_lossy(&pem);
    if text.contains("ENCRYPTED PRIVATE KEY") || text.contains("Proc-Type: 4,ENCRYPTED") {
        return Err(unusable(format!(
            "sslkey: {path}: the key is encrypted; hookd takes an unencrypted key (no \
             `sslpassword`): decrypt it, e.g. `openssl pkey -in KEY -out KEY.plain`, and keep \
             that file owner-only"
        )));
    }
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| unusable(format!("sslkey: {path}: {e}")))
}

/// What `verify-ca`, and `prefer`/`require`, check of the server's certificate: the chain to a
/// trusted root and not the name (`verify-ca`, or the others with an `sslrootcert`), or
/// nothing (libpq's `prefer` and `require` without one). Either way the handshake must be
/// signed by the key of the certificate presented.
#[derive(Debug)]
struct WithoutName {
    chain: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for WithoutName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, TlsError> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        // rustls checks the chain first and the name last: a name error means the chain held.
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(TlsError::InvalidCertificate(
                rustls::CertificateError::NotValidForName
                | rustls::CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            verified => verified,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        let algorithms = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        let algorithms = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(url: &str) -> (String, Options) {
        split(url).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    #[test]
    fn a_urls_tls_options_are_taken_out_of_its_query() {
        let (rest, o) = options(
            "postgres://u:p@db.example:5432/hookd?application_name=x&sslmode=verify-full\
             &sslrootcert=%2Fetc%2Fca%20dir%2Froot.pem&connect_timeout=3",
        );
        assert_eq!(
            rest,
            "postgres://u:p@db.example:5432/hookd?application_name=x&connect_timeout=3"
        );
        assert_eq!(o.mode, Some(Mode::VerifyFull));
        assert_eq!(o.root_cert.as_deref(), Some("/etc/ca dir/root.pem"));
        let (rest, o) = options("postgresql://h/db?sslmode=require");
        assert_eq!(
            (rest.as_str(), o.mode),
            ("postgresql://h/db", Some(Mode::Require))
        );
        let (rest, o) = options("postgres://h/db");
        assert_eq!((rest.as_str(), o), ("postgres://h/db", Options::default()));
    }

    /// A `?` in the password is the password's: the options are the query's, after the `@`.
    #[test]
    fn a_question_mark_in_the_password_does_not_start_the_query() {
        let (rest, o) =
            options("postgres://u:Xy?9z&w@db/hookd?sslmode=require&sslrootcert=/ca.pem");
        assert_eq!(rest, "postgres://u:Xy?9z&w@db/hookd");
        assert_eq!(o.mode, Some(Mode::Require));
        assert_eq!(o.root_cert.as_deref(), Some("/ca.pem"));
        let (rest, o) = options("postgres://u:Xy?9z@db/hookd");
        assert_eq!(
            (rest.as_str(), o),
            ("postgres://u:Xy?9z@db/hookd", Options::default())
        );
    }

    /// An encrypted key, and an X.509 v1 certificate (what `openssl x509 -req` makes without
    /// extensions), are named as what they are.
    #[test]
    fn an_encrypted_key_and_a_v1_certificate_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let run = |args: &[&str]| {
            let out = std::process::Command::new("openssl")
                .args(args)
                .current_dir(dir.path())
                .output()
                .expect("openssl (Debian's `openssl`) runs");
            assert!(out.status.success(), "openssl {args:?}: {out:?}");
        };
        run(&[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            "k.pem",
        ]);
        run(&[
            "req",
            "-new",
            "-key",
            "k.pem",
            "-subj",
            "/CN=hookd",
            "-out",
            "c.csr",
        ]);
        run(&[
            "x509", "-req", "-in", "c.csr", "-signkey", "k.pem", "-days", "1", "-out", "v1.pem",
        ]);
        run(&[
            "pkcs8", "-topk8", "-in", "k.pem", "-passout", "pass:pw", "-out", "enc.pem",
        ]);
        let path = |name: &str| dir.path().join(name).display().to_string();
        let mut config = tokio_postgres::Config::new();
        for (cert, key, says) in [
            ("v1.pem", "enc.pem", "the key is encrypted"),
            ("v1.pem", "k.pem", "it is an X.509 v1 certificate"),
        ] {
            let o = Options {
                client_cert: Some(path(cert)),
                client_key: Some(path(key)),
                ..Options::default()
            };
            let e = connector(&o, &mut config).err().expect("refused");
            assert!(
                matches!(e, InboxError::TlsFile { .. }) && e.to_string().contains(says),
                "{e}"
            );
        }
    }

    #[test]
    fn bad_tls_options_are_refused_by_name_without_the_password() {
        for (url, says) in [
            (
                "postgres://u:s3cret@h/db?sslmode=verify-fool",
                "sslmode \"verify-fool\"",
            ),
            ("postgres://u:s3cret@h/db?sslmode=allow", "use `prefer`"),
        ] {
            let e = split(url).err().unwrap_or_else(|| panic!("{url} accepted"));
            let shown = e.to_string();
            assert!(shown.contains(says), "{url}: {shown}");
            assert!(!shown.contains("s3cret"), "{shown}");
        }
        let mut config = tokio_postgres::Config::new();
        for (o, says) in [
            (
                Options {
                    mode: Some(Mode::VerifyFull),
                    root_cert: Some("/nonexistent/root.pem".into()),
                    ..Options::default()
                },
                "sslrootcert: /nonexistent/root.pem: cannot be read",
            ),
            (
                Options {
                    mode: Some(Mode::Require),
                    root_cert: Some("system".into()),
                    ..Options::default()
                },
                "sslrootcert=system needs sslmode=verify-full (it is require)",
            ),
            (
                Options {
                    client_cert: Some("/nonexistent/client.pem".into()),
                    ..Options::default()
                },
                "sslcert is set but sslkey is not",
            ),
            (
                Options {
                    client_cert: Some("/nonexistent/client.pem".into()),
                    client_key: Some("/nonexistent/client.key".into()),
                    ..Options::default()
                },
                "sslcert: /nonexistent/client.pem",
            ),
        ] {
            let e = connector(&o, &mut config).err().expect("refused");
            assert!(e.to_string().contains(says), "{o:?}: {e}");
        }
    }

    #[test]
    fn the_modes_ask_tokio_postgres_for_tls_as_libpq_does() {
        for (mode, negotiation) in [
            (None, SslMode::Prefer),
            (Some(Mode::Disable), SslMode::Disable),
            (Some(Mode::Require), SslMode::Require),
            (Some(Mode::VerifyCa), SslMode::Require),
            (Some(Mode::VerifyFull), SslMode::Require),
        ] {
            let mut config = tokio_postgres::Config::new();
            connector(
                &Options {
                    mode,
                    ..Options::default()
                },
                &mut config,
            )
            .unwrap();
            assert_eq!(config.get_ssl_mode(), negotiation, "{mode:?}");
        }
    }
}
