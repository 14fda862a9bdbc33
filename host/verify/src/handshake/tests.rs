//! The handshake answers and the handshake providers' event signatures, against vectors made
//! with an independent implementation (Python's `hmac` and `cryptography` Ed25519) from each
//! provider's documented construction; the Ed25519 key is RFC 8032's test 1 key.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderValue, StatusCode};

use super::*;
use crate::{Secret, SignError, VerifierConfigError, sign};

const TS: u64 = 1_700_000_000;
const RFC8032_SEED: &str = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
const RFC8032_PUBLIC: &str = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
const DISCORD_PING: &[u8] = br#"{"type":1,"id":"1","application_id":"2"}"#;
const DISCORD_PING_SIG: &str = "2a9f063017e818d053d63427c1836e21d10f478dd5efc861fa480d0a6e9033b2\
                                0990f9210c4ca4e6c9d5737333b6db3b98fcb0e2af4bc3ecd0faa92cfd322700";

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn verifier(scheme: Scheme, secrets: &[&str], credential: Option<&str>) -> Verifier {
    Verifier::with_credential(
        scheme,
        secrets.iter().map(|s| Secret::new((*s).into())).collect(),
        credential.map(|c| Secret::new(c.into())),
        Duration::from_secs(300),
    )
    .unwrap()
}

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(*name, HeaderValue::from_str(value).unwrap());
    }
    map
}

fn query(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn discord_headers(sig: &str) -> HeaderMap {
    headers(&[
        ("x-signature-ed25519", sig),
        ("x-signature-timestamp", "1700000000"),
    ])
}

#[test]
fn discord_ping_signed_by_an_independent_ed25519_is_answered_with_type_1() {
    let v = verifier(Scheme::Discord, &[], Some(RFC8032_PUBLIC));
    let reply = v
        .answer_post(
            &[],
            &discord_headers(DISCORD_PING_SIG),
            DISCORD_PING,
            at(TS),
        )
        .unwrap()
        .unwrap();
    assert_eq!(reply.body, br#"{"type":1}"#);
}

#[test]
fn discord_ping_with_a_flipped_signature_bit_is_refused() {
    let v = verifier(Scheme::Discord, &[], Some(RFC8032_PUBLIC));
    let bad = format!("3{}", &DISCORD_PING_SIG[1..]);
    let err = v
        .answer_post(&[], &discord_headers(&bad), DISCORD_PING, at(TS))
        .unwrap_err();
    assert_eq!(err.status(), StatusCode::UNAUTHORIZED);
}

#[test]
fn discord_signing_round_trips_through_verification() {
    let v = verifier(Scheme::Discord, &[], Some(RFC8032_PUBLIC));
    let body = br#"{"type":2,"id":"i-1"}"#;
    let signed = sign(
        &Scheme::Discord,
        &Secret::new(RFC8032_SEED.into()),
        "",
        body,
        at(TS),
    )
    .unwrap();
    let mut map = HeaderMap::new();
    map.extend(signed);
    assert!(v.verify(map, body.to_vec().into(), at(TS)).is_ok());
}

#[test]
fn discord_refuses_a_public_key_that_is_not_64_hex_digits() {
    let result = Verifier::with_credential(
        Scheme::Discord,
        Vec::new(),
        Some(Secret::new("abcd".into())),
        Duration::ZERO,
    );
    assert_eq!(result.unwrap_err(), VerifierConfigError::InvalidPublicKey);
}

#[test]
fn discord_signing_needs_a_hex_seed() {
    let result = sign(
        &Scheme::Discord,
        &Secret::new("nope".into()),
        "",
        b"",
        at(TS),
    );
    assert_eq!(result.unwrap_err(), SignError::InvalidSigningKey);
}

/// `v`'s answer to a URL validation signed with `zoom_secret_token`.
fn zoom_validation_answer(v: &Verifier) -> Value {
    let body = br#"{"payload":{"plainToken":"qgg8vlvZRS6UYooatFL8Aw"},"event_ts":1700000000000,"event":"endpoint.url_validation"}"#;
    let signed = sign(
        &Scheme::Zoom,
        &Secret::new("zoom_secret_token".into()),
        "",
        body,
        at(TS),
    )
    .unwrap();
    let mut map = HeaderMap::new();
    map.extend(signed);
    let reply = v.answer_post(&[], &map, body, at(TS)).unwrap().unwrap();
    serde_json::from_slice(&reply.body).unwrap()
}

#[test]
fn zoom_url_validation_answers_the_hmac_of_the_plain_token() {
    let v = verifier(Scheme::Zoom, &["zoom_secret_token"], None);
    assert_eq!(
        zoom_validation_answer(&v),
        json!({"plainToken": "qgg8vlvZRS6UYooatFL8Aw",
               "encryptedToken": "bd48235863f4a6323ccc4963c594908b7c97f88b4a6a95278f4f093690b12726"})
    );
}

/// During a rotation (the new secret listed beside the old), Zoom signs with whichever it
/// has now and checks the answer with that one: the answer is made with the secret that
/// signed, here the second (before, always the first, and the validation failed).
#[test]
fn zoom_url_validation_is_answered_with_the_secret_that_signed_it() {
    let v = verifier(Scheme::Zoom, &["old_secret", "zoom_secret_token"], None);
    assert_eq!(
        zoom_validation_answer(&v)["encryptedToken"],
        "bd48235863f4a6323ccc4963c594908b7c97f88b4a6a95278f4f093690b12726"
    );
}

#[test]
fn zoom_event_signature_matches_the_documented_v0_construction() {
    let v = verifier(Scheme::Zoom, &["zoom_secret_token"], None);
    let body = br#"{"event":"meeting.started","payload":{"object":{"id":"123"}},"event_ts":1700000000000}"#;
    let map = headers(&[
        (
            "x-zm-signature",
            "v0=3cd720ef24326df9636dc4af18b97eb62e07db9daf81967ba351fb6236d3713f",
        ),
        ("x-zm-request-timestamp", "1700000000"),
    ]);
    assert!(v.verify(map, body.to_vec().into(), at(TS)).is_ok());
}

#[test]
fn an_unsigned_zoom_url_validation_is_refused() {
    let v = verifier(Scheme::Zoom, &["zoom_secret_token"], None);
    let body = br#"{"payload":{"plainToken":"x"},"event":"endpoint.url_validation"}"#;
    let err = v
        .answer_post(&[], &HeaderMap::new(), body, at(TS))
        .unwrap_err();
    assert_eq!(err.status(), StatusCode::UNAUTHORIZED);
}

#[test]
fn slack_url_verification_echoes_the_challenge_once_signed() {
    let v = verifier(Scheme::Slack, &["slack-secret"], None);
    let body = br#"{"token":"t","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
    let mut map = HeaderMap::new();
    map.extend(
        sign(
            &Scheme::Slack,
            &Secret::new("slack-secret".into()),
            "",
            body,
            at(TS),
        )
        .unwrap(),
    );
    let reply = v.answer_post(&[], &map, body, at(TS)).unwrap().unwrap();
    assert_eq!(
        reply.body,
        br#"{"challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}"#
    );
}

/// A malformed handshake is checked for its signature first: unsigned, it is a 401 like any
/// other unsigned request, whatever is wrong with it (before, the missing challenge or the
/// over-long token was reported to anyone).
#[test]
fn a_malformed_handshake_is_refused_for_its_signature_first() {
    let slack = verifier(Scheme::Slack, &["slack-secret"], None);
    let long = format!(
        r#"{{"type":"url_verification","challenge":"{}"}}"#,
        "c".repeat(9000)
    );
    for body in [
        br#"{"type":"url_verification"}"#.as_slice(),
        long.as_bytes(),
    ] {
        let err = slack
            .answer_post(&[], &HeaderMap::new(), body, at(TS))
            .unwrap_err();
        assert_eq!(err.status(), StatusCode::UNAUTHORIZED, "{err}");
    }
    let zoom = verifier(Scheme::Zoom, &["zoom_secret_token"], None);
    let err = zoom
        .answer_post(
            &[],
            &HeaderMap::new(),
            br#"{"event":"endpoint.url_validation","payload":{}}"#,
            at(TS),
        )
        .unwrap_err();
    assert_eq!(err.status(), StatusCode::UNAUTHORIZED, "{err}");
}

/// A Discord webhook event of type 1 carries an `event` object: it is not an interactions
/// PING, so it is not answered (and dropped) as one.
#[test]
fn a_discord_webhook_event_is_not_a_ping() {
    let v = verifier(Scheme::Discord, &[], Some(RFC8032_PUBLIC));
    let body =
        br#"{"version":1,"application_id":"1","type":1,"event":{"type":"APPLICATION_AUTHORIZED"}}"#;
    assert_eq!(
        v.answer_post(&[], &HeaderMap::new(), body, at(TS)),
        Ok(None)
    );
}

#[test]
fn a_slack_event_callback_is_not_a_handshake() {
    let v = verifier(Scheme::Slack, &["slack-secret"], None);
    let body = br#"{"type":"event_callback","event_id":"Ev1"}"#;
    assert_eq!(
        v.answer_post(&[], &HeaderMap::new(), body, at(TS)),
        Ok(None)
    );
}

#[test]
fn meta_subscription_echoes_the_challenge_when_the_token_matches() {
    let v = verifier(Scheme::Meta, &["meta_app_secret"], Some("my-verify-token"));
    let q = query(&[
        ("hub.mode", "subscribe"),
        ("hub.verify_token", "my-verify-token"),
        ("hub.challenge", "1158201444"),
    ]);
    assert_eq!(v.answer_get(&q).unwrap().unwrap().body, b"1158201444");
}

#[test]
fn meta_subscription_with_a_wrong_token_is_forbidden() {
    let v = verifier(Scheme::Meta, &["meta_app_secret"], Some("my-verify-token"));
    let q = query(&[
        ("hub.mode", "subscribe"),
        ("hub.verify_token", "guess"),
        ("hub.challenge", "1158201444"),
    ]);
    assert_eq!(v.answer_get(&q), Err(HandshakeError::TokenMismatch));
}

#[test]
fn meta_event_signature_is_the_hex_hmac_of_the_body() {
    let v = verifier(Scheme::Meta, &["meta_app_secret"], Some("t"));
    let body = br#"{"object":"whatsapp_business_account","entry":[{"id":"1","changes":[]}]}"#;
    let map = headers(&[(
        "x-hub-signature-256",
        "sha256=6ea543368d11b57d83d2942e7acee0ca98c82058f97fd06510333d737ceb58fa",
    )]);
    assert!(v.verify(map, body.to_vec().into(), at(TS)).is_ok());
}

#[test]
fn meta_needs_its_verify_token() {
    let result = Verifier::with_credential(
        Scheme::Meta,
        vec![Secret::new("s".into())],
        None,
        Duration::ZERO,
    );
    assert!(matches!(
        result,
        Err(VerifierConfigError::MissingCredential { .. })
    ));
}

#[test]
fn twitter_crc_answers_the_base64_hmac_of_the_token() {
    let v = verifier(Scheme::Twitter, &["twitter_consumer_secret"], None);
    let q = query(&[("crc_token", "9b4507b3-9f62-4d1a-a41d-3a8c2a2e5a76")]);
    let reply = v.answer_get(&q).unwrap().unwrap();
    assert_eq!(
        reply.body,
        br#"{"response_token":"sha256=R8GgJ+YMsDOCwrseAH3zdX8CpVyPI7S5picOPgk7Jsw="}"#
    );
}

#[test]
fn twitter_event_signature_is_the_base64_hmac_of_the_body() {
    let v = verifier(Scheme::Twitter, &["twitter_consumer_secret"], None);
    let body = br#"{"for_user_id":"2244994945","tweet_create_events":[{"id_str":"1"}]}"#;
    let map = headers(&[(
        "x-twitter-webhooks-signature",
        "sha256=1fVa1iR3JSIaGNBqqYNzBYbQrtqZjn/tC5PzEWxYhZU=",
    )]);
    assert!(v.verify(map, body.to_vec().into(), at(TS)).is_ok());
}

#[test]
fn dropbox_challenge_is_echoed_as_plain_text() {
    let v = verifier(Scheme::Dropbox, &["dropbox_app_secret"], None);
    let reply = v
        .answer_get(&query(&[("challenge", "abc123")]))
        .unwrap()
        .unwrap();
    assert_eq!(
        (reply.content_type, reply.body),
        ("text/plain; charset=utf-8", b"abc123".to_vec())
    );
}

#[test]
fn dropbox_event_signature_is_the_hex_hmac_of_the_body() {
    let v = verifier(Scheme::Dropbox, &["dropbox_app_secret"], None);
    let body = br#"{"list_folder":{"accounts":["dbid:AAH4f99T0taONIb-OurWxbNQ6ywGRopQngc"]},"delta":{"users":[12345678]}}"#;
    let map = headers(&[(
        "x-dropbox-signature",
        "5362dde5af78efed1b6cc34740ea94796374af41848d7f9e8e54624e34412611",
    )]);
    assert!(v.verify(map, body.to_vec().into(), at(TS)).is_ok());
}

#[test]
fn a_get_for_a_scheme_without_a_get_handshake_is_not_answered() {
    let v = verifier(Scheme::Github, &["s"], None);
    assert_eq!(v.answer_get(&query(&[("challenge", "x")])), Ok(None));
}

#[test]
fn msgraph_validation_token_is_echoed_as_plain_text() {
    let v = verifier(Scheme::Msgraph, &[], Some("state-42"));
    let q = query(&[("validationToken", "Validation: Testing client application")]);
    let reply = v.answer_post(&q, &HeaderMap::new(), b"", at(TS)).unwrap();
    assert_eq!(
        reply.unwrap().body,
        b"Validation: Testing client application"
    );
}

/// A body over the handshake bound is an event whatever its query says: a validation token
/// beside it must not make hookd answer, and drop, what may be a notification.
#[test]
fn a_large_body_is_never_a_handshake_even_with_a_validation_token() {
    let v = verifier(Scheme::Msgraph, &[], Some("state-42"));
    let q = query(&[("validationToken", "x")]);
    let body = vec![b' '; MAX_HANDSHAKE_BODY + 1];
    assert_eq!(
        v.answer_post(&q, &HeaderMap::new(), &body, at(TS)),
        Ok(None)
    );
    let fits = vec![b' '; MAX_HANDSHAKE_BODY];
    assert!(
        v.answer_post(&q, &HeaderMap::new(), &fits, at(TS))
            .unwrap()
            .is_some()
    );
}

#[test]
fn msgraph_notifications_must_all_carry_the_client_state() {
    let v = verifier(Scheme::Msgraph, &[], Some("state-42"));
    let body =
        br#"{"value":[{"clientState":"state-42","id":"a"},{"clientState":"other","id":"b"}]}"#;
    let err = v.verify(HeaderMap::new(), body.to_vec().into(), at(TS));
    assert_eq!(err.unwrap_err(), VerifyError::ClientStateMismatch);
}

#[test]
fn msgraph_takes_no_secrets() {
    let result = Verifier::with_credential(
        Scheme::Msgraph,
        vec![Secret::new("s".into())],
        Some(Secret::new("state".into())),
        Duration::ZERO,
    );
    assert!(matches!(
        result,
        Err(VerifierConfigError::SecretsNotApplicable { .. })
    ));
}

#[test]
fn a_challenge_longer_than_the_cap_is_refused() {
    let v = verifier(Scheme::Dropbox, &["s"], None);
    let long = "a".repeat(MAX_HEADER_LEN + 1);
    let err = v.answer_get(&query(&[("challenge", &long)])).unwrap_err();
    assert_eq!(err.status(), StatusCode::BAD_REQUEST);
}

#[test]
fn a_twitter_crc_token_that_could_be_an_event_body_is_not_signed() {
    let v = verifier(Scheme::Twitter, &["twitter_consumer_secret"], None);
    let forged = r#"{"tweet_create_events":[{"id_str":"1"}]}"#;
    let err = v.answer_get(&query(&[("crc_token", forged)])).unwrap_err();
    assert_eq!(err, HandshakeError::InvalidCrcToken);
}

/// A CRC answer is a valid signature of its token: a body that is a token (`1234567890`, valid
/// JSON) sent with it is refused, since every Twitter event is a JSON object.
#[test]
fn a_crc_answer_does_not_sign_an_event() {
    let v = verifier(Scheme::Twitter, &["twitter_consumer_secret"], None);
    let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    for token in ["1234567890", "true", "null"] {
        let reply = v
            .answer_get(&query(&[("crc_token", token)]))
            .unwrap()
            .unwrap();
        let answer: Value = serde_json::from_slice(&reply.body).unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(
            "x-twitter-webhooks-signature",
            HeaderValue::from_str(answer["response_token"].as_str().unwrap()).unwrap(),
        );
        let err = v
            .verify(headers, bytes::Bytes::from(token), now)
            .unwrap_err();
        assert!(
            matches!(err, VerifyError::MalformedBody { .. }),
            "{token}: {err}"
        );
    }
}

#[test]
fn discord_interactions_are_acknowledged_as_deferred_by_type() {
    let v = verifier(Scheme::Discord, &[], Some(RFC8032_PUBLIC));
    let reply = |body: &str| {
        v.accepted_reply(body.as_bytes())
            .map(|r| serde_json::from_slice::<Value>(&r.body).unwrap())
    };
    assert_eq!(reply(r#"{"type":2,"id":"1"}"#), Some(json!({"type": 5})));
    assert_eq!(reply(r#"{"type":5,"id":"1"}"#), Some(json!({"type": 5})));
    assert_eq!(reply(r#"{"type":3,"id":"1"}"#), Some(json!({"type": 6})));
    assert_eq!(
        reply(r#"{"type":4,"id":"1"}"#),
        Some(json!({"type": 8, "data": {"choices": []}}))
    );
    assert_eq!(reply(r#"{"type":9,"id":"1"}"#), None);
    assert_eq!(reply("not json"), None);
}

#[test]
fn only_discord_answers_a_stored_event_itself() {
    let v = verifier(Scheme::Github, &["s"], None);
    assert_eq!(v.accepted_reply(br#"{"type":2}"#), None);
}
