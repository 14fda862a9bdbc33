//! Random event ids in the style of each scheme's provider, for `hookd send` without `--event-id`.
//!
//! Invariant: every id generated here is a valid, non-empty header value, so `verify::sign`
//! accepts it for every scheme that sends one.

use rand::distr::{Alphanumeric, SampleString as _};

use crate::verify::Scheme;

/// A random event id in the style of the scheme's provider: a UUID v4 for github and shopify,
/// `msg_…` for standard-webhooks, `evt_…` otherwise.
pub(super) fn random_event_id(scheme: &Scheme) -> String {
    let mut rng = rand::rng();
    match scheme {
        Scheme::Github | Scheme::Shopify => {
            let mut bytes: [u8; 16] = rand::random();
            bytes[6] = (bytes[6] & 0x0f) | 0x40; // version 4
            bytes[8] = (bytes[8] & 0x3f) | 0x80; // RFC 4122 variant
            let hex = hex::encode(bytes);
            format!(
                "{}-{}-{}-{}-{}",
                &hex[..8],
                &hex[8..12],
                &hex[12..16],
                &hex[16..20],
                &hex[20..]
            )
        }
        Scheme::StandardWebhooks => format!("msg_{}", Alphanumeric.sample_string(&mut rng, 27)),
        _ => format!("evt_{}", Alphanumeric.sample_string(&mut rng, 24)),
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use crate::verify::{self, Secret};

    #[test]
    fn standard_webhooks_ids_are_msg_and_27_characters() {
        let msg = random_event_id(&Scheme::StandardWebhooks);
        assert!(msg.starts_with("msg_") && msg.len() == 31, "{msg}");
    }

    #[test]
    fn ids_of_schemes_without_an_id_header_are_evt_and_24_characters() {
        let evt = random_event_id(&Scheme::Stripe);
        assert!(evt.starts_with("evt_") && evt.len() == 28, "{evt}");
    }

    #[test]
    fn github_ids_are_fresh_uuid_v4s() {
        let uuid = random_event_id(&Scheme::Github);
        assert_eq!(uuid.len(), 36, "{uuid}");
        assert_eq!(uuid.as_bytes()[14], b'4', "{uuid}");
        assert_ne!(random_event_id(&Scheme::Github), uuid);
    }

    #[test]
    fn every_generated_id_can_be_signed() {
        for scheme in [Scheme::StandardWebhooks, Scheme::Github, Scheme::Shopify] {
            let id = random_event_id(&scheme);
            let secret = Secret::new("whsec_c2VjcmV0".into());
            verify::sign(&scheme, &secret, &id, b"{}", SystemTime::now()).unwrap();
        }
    }
}
