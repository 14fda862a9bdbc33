//! Every signature scheme's header parsing and verification over arbitrary headers and body.
//!
//! Input: first line `<scheme> [<now, unix seconds>]`, then `Name: value` header lines, an
//! empty line, and the raw body. Schemes: `standard-webhooks`, `stripe`, `github`, `shopify`,
//! `slack`, `hmac-sha256` (`x-signature: sha256=<hex>`), `hmac-sha256-base64`
//! (`x-signature: <base64>`), `none`.
//!
//! Properties: `verify` never panics; with secrets no input can know, nothing verifies (except
//! under `none`); an error message never contains a secret; and the same request signed by
//! `sign` at the same clock always verifies, whatever unrelated headers come with it.
#![no_main]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hookd_fuzz::{header_lines, lines, split_blank_line};
use host::verify::{Encoding, HmacScheme, Scheme, Secret, Verifier, sign};
use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;

/// Not in any seed or test vector: a signature made with it cannot be in the input.
const SECRET: &str = "fuzz-secret-nobody-knows-4f1c";
/// The same for standard-webhooks, which wants `whsec_` + base64.
const WHSEC: &str = "whsec_ZnV6ei1zZWNyZXQtbm9ib2R5LWtub3dzLTRmMWM=";
const TOLERANCE: Duration = Duration::from_secs(300);

fn scheme(name: &str) -> Option<Scheme> {
    let generic = |prefix: &str, encoding| {
        Scheme::HmacSha256(HmacScheme {
            header: HeaderName::from_static("x-signature"),
            prefix: prefix.to_owned(),
            encoding,
        })
    };
    Some(match name {
        "standard-webhooks" => Scheme::StandardWebhooks,
        "stripe" => Scheme::Stripe,
        "github" => Scheme::Github,
        "shopify" => Scheme::Shopify,
        "slack" => Scheme::Slack,
        "hmac-sha256" => generic("sha256=", Encoding::Hex),
        "hmac-sha256-base64" => generic("", Encoding::Base64),
        "none" => Scheme::None,
        _ => return None,
    })
}

fuzz_target!(|input: &[u8]| {
    let (head, body) = split_blank_line(input);
    let mut lines = lines(head);
    let Some(first) = lines.next() else { return };
    let mut words = first.split(' ');
    let Some(scheme) = words.next().and_then(scheme) else {
        return;
    };
    let now = words
        .next()
        .and_then(|w| w.parse::<u32>().ok())
        .unwrap_or(1_700_000_000);
    let now = UNIX_EPOCH + Duration::from_secs(now.into());
    let mut headers = HeaderMap::new();
    for (name, value) in header_lines(lines) {
        // What hyper would refuse never reaches `verify`.
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value.as_bytes()),
        ) else {
            continue;
        };
        headers.append(name, value);
    }
    let body = Bytes::copy_from_slice(body);

    let secret = if scheme == Scheme::StandardWebhooks {
        WHSEC
    } else {
        SECRET
    };
    let verifier = Verifier::new(scheme.clone(), vec![Secret::new(secret.into())], TOLERANCE)
        .expect("the fuzz secrets are valid for every scheme");
    match verifier.verify(headers.clone(), body.clone(), now) {
        Ok(_) => assert_eq!(scheme, Scheme::None, "an unsigned input verified"),
        Err(e) => assert!(!e.to_string().contains(secret), "an error names the secret"),
    }

    round_trip(&verifier, headers, body, now);
});

/// Signs `body` like the provider would and checks it verifies alongside the other headers.
fn round_trip(verifier: &Verifier, mut headers: HeaderMap, body: Bytes, now: SystemTime) {
    let scheme = verifier.scheme();
    let secret = if *scheme == Scheme::StandardWebhooks {
        WHSEC
    } else {
        SECRET
    };
    let signed = sign(scheme, &Secret::new(secret.into()), "evt_fuzz", &body, now)
        .unwrap_or_else(|e| panic!("sign refused a scheme and secret the verifier took: {e}"));
    assert!(
        *scheme == Scheme::None || !signed.is_empty(),
        "sign gave nothing"
    );
    for (name, _) in &signed {
        headers.remove(name);
    }
    for (name, value) in signed {
        headers.append(name, value);
    }
    if let Err(e) = verifier.verify(headers.clone(), body, now) {
        panic!("a freshly signed request is refused: {e}; headers {headers:?}");
    }
}
