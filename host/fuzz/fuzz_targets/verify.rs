//! Every signature scheme's header parsing and verification, and every provider handshake,
//! over arbitrary headers, query and body.
//!
//! Input: first line `<scheme> [<now, unix seconds> [<query: a=b&c=d>]]`, then `Name: value`
//! header lines, an empty line, and the raw body. Schemes: every `SchemeKind` name, with
//! `hmac-sha256` as `x-signature: sha256=<hex>` and `hmac-sha256-base64` as
//! `x-signature: <base64>`.
//!
//! Properties: `verify` and the `GET`/`POST` handshakes never panic; with secrets no input can
//! know, nothing verifies (except under `none`) and no signed handshake is answered; no error
//! message or answer contains a secret; and the same request signed by `sign` at the same clock
//! always verifies, whatever unrelated headers come with it.
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
/// discord's signing key (an Ed25519 seed: sha256 of a phrase nobody knows) and its public key.
const DISCORD_SEED: &str = "7de24f58e59707fc573a56039765ccbd333528ccc7512af332e7e7bed2022a26";
const DISCORD_PUBLIC: &str = "19de49d33953e8441e8ece349b3c06cdc024ce56eb083260420428e75bd3d64e";
/// meta's verify token and msgraph's client state: unknown to the input too.
const TOKEN: &str = "fuzz-token-nobody-knows-9b2e";
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
        "discord" => Scheme::Discord,
        "zoom" => Scheme::Zoom,
        "meta" => Scheme::Meta,
        "twitter" => Scheme::Twitter,
        "dropbox" => Scheme::Dropbox,
        "msgraph" => Scheme::Msgraph,
        "hmac-sha256" => generic("sha256=", Encoding::Hex),
        "hmac-sha256-base64" => generic("", Encoding::Base64),
        "none" => Scheme::None,
        _ => return None,
    })
}

/// The secret `sign` signs with for `scheme`: discord signs with its private key.
fn signing_secret(scheme: &Scheme) -> &'static str {
    match scheme {
        Scheme::StandardWebhooks => WHSEC,
        Scheme::Discord => DISCORD_SEED,
        _ => SECRET,
    }
}

/// The verifier as a config would build it: secrets, or the scheme's credential instead.
fn verifier(scheme: Scheme) -> Verifier {
    let (secrets, credential) = match scheme {
        Scheme::Discord => (vec![], Some(DISCORD_PUBLIC)),
        Scheme::Msgraph => (vec![], Some(TOKEN)),
        Scheme::Meta => (vec![SECRET], Some(TOKEN)),
        Scheme::StandardWebhooks => (vec![WHSEC], None),
        _ => (vec![SECRET], None),
    };
    let secrets = secrets.into_iter().map(|s| Secret::new(s.into())).collect();
    Verifier::with_credential(
        scheme,
        secrets,
        credential.map(|c| Secret::new(c.into())),
        TOLERANCE,
    )
    .expect("the fuzz secrets are valid for every scheme")
}

/// No text the fuzzer sees from hookd may carry a secret, a credential or the signing key that
/// the input did not carry itself (libFuzzer learns the constants this check compares with, and
/// an echoed challenge may then hold one).
fn assert_no_secret(what: &str, text: &[u8], input: &[u8]) {
    let holds = |haystack: &[u8], needle: &str| {
        haystack
            .windows(needle.len())
            .any(|w| w == needle.as_bytes())
    };
    for secret in [SECRET, WHSEC, DISCORD_SEED, TOKEN] {
        assert!(
            !holds(text, secret) || holds(input, secret),
            "{what} contains a secret"
        );
    }
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
    let query: Vec<(String, String)> = words
        .next()
        .unwrap_or("")
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((name, value)) => (name.to_owned(), value.to_owned()),
            None => (pair.to_owned(), String::new()),
        })
        .collect();
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

    let verifier = verifier(scheme.clone());
    match verifier.verify(headers.clone(), body.clone(), now) {
        Ok(_) => assert_eq!(scheme, Scheme::None, "an unsigned input verified"),
        Err(e) => assert_no_secret("an error", e.to_string().as_bytes(), input),
    }
    handshakes(&verifier, &query, &headers, &body, now, input);

    if scheme != Scheme::Msgraph {
        // msgraph's proof is the client state in the body, not a header `sign` could add.
        round_trip(&verifier, headers, body, now);
    }
});

/// Handshakes: a `GET` may be answered (its challenge is the input's own), a `POST` only if its
/// signature verified, which no input can make here (msgraph's validation is unsigned).
fn handshakes(
    verifier: &Verifier,
    query: &[(String, String)],
    headers: &HeaderMap,
    body: &Bytes,
    now: SystemTime,
    input: &[u8],
) {
    let scheme = verifier.scheme();
    match verifier.answer_get(query) {
        Ok(Some(reply)) => {
            assert!(scheme.kind().answers_get(), "{scheme:?} answered a GET");
            assert_no_secret("a GET answer", &reply.body, input);
        }
        Ok(None) => assert!(!scheme.kind().answers_get(), "{scheme:?} ignored a GET"),
        Err(e) => assert_no_secret("a GET refusal", e.to_string().as_bytes(), input),
    }
    match verifier.answer_post(query, headers, body, now) {
        Ok(Some(reply)) => {
            assert_eq!(*scheme, Scheme::Msgraph, "an unsigned handshake was answered");
            assert_no_secret("a POST answer", &reply.body, input);
        }
        Ok(None) => {}
        Err(e) => assert_no_secret("a POST refusal", e.to_string().as_bytes(), input),
    }
}

/// Signs `body` like the provider would and checks it verifies alongside the other headers.
fn round_trip(verifier: &Verifier, mut headers: HeaderMap, body: Bytes, now: SystemTime) {
    let scheme = verifier.scheme();
    let secret = Secret::new(signing_secret(scheme).into());
    let signed = sign(scheme, &secret, "evt_fuzz", &body, now)
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
