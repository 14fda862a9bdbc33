//! `Secret`: a webhook signing secret as configured, before any scheme interprets it.
//!
//! Invariant: the value can only be read inside `verify` (`expose` is `pub(crate)`); outside,
//! it can only be compared in constant time (`matches`). `Debug` prints `Secret([REDACTED])`,
//! there is no `Display`, and the memory is zeroized on drop.

use std::fmt;

use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// A signing secret exactly as the operator configured it (e.g. `whsec_...`).
///
/// Clone is allowed so a reloaded configuration can rebuild verifiers; comparison is not,
/// because the only comparison that matters happens in constant time inside `verify`.
#[derive(Clone)]
pub struct Secret(SecretString);

impl Secret {
    /// Wraps a configured secret. Nothing is validated here: whether the value is usable
    /// depends on the scheme, and `Verifier::new` is where that is checked.
    pub fn new(value: String) -> Self {
        Self(SecretString::from(value))
    }

    /// Whether `presented` (e.g. an admin bearer token) equals this secret, in constant time.
    /// Both sides are hashed first, so timing reveals neither the content nor the length.
    pub fn matches(&self, presented: &[u8]) -> bool {
        let ours = Sha256::digest(self.expose().as_bytes());
        let theirs = Sha256::digest(presented);
        ours[..].ct_eq(&theirs[..]).into()
    }

    /// The raw value, for key derivation. Only `verify` may look.
    pub(crate) fn expose(&self) -> &str {
        self.0.expose_secret()
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self::new(value)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([REDACTED])")
    }
}
