//! Provider set-up handshakes over real HTTP: for each provider hookd answers the handshake
//! itself (and stores nothing for it), refuses a bad signature or token, and then accepts,
//! dedupes and delivers a signed event. Discord's Ed25519 signatures are made by an independent
//! implementation (Python's `cryptography`), never by hookd's own signer.

use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{self, AdminApi, Scheme, TestHost, plugins};

/// Every provider's source, parsed by its parser and handled by `counter`.
const CONFIG: &str = r#"
[sources.slack]
scheme = "slack"
secrets = ["slack-signing-secret"]
parser = "slack"
handlers = ["counter"]

[sources.discord]
scheme = "discord"
public_key = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
parser = "discord"
handlers = ["counter"]

[sources.zoom]
scheme = "zoom"
secrets = ["zoom_secret_token"]
parser = "zoom-events"
handlers = ["counter"]

[sources.meta]
scheme = "meta"
secrets = ["meta_app_secret"]
verify_token = "my-verify-token"
parser = "meta-events"
handlers = ["counter"]

[sources.twitter]
scheme = "twitter"
secrets = ["twitter_consumer_secret"]
parser = "twitter-events"
handlers = ["counter"]

[sources.dropbox]
scheme = "dropbox"
secrets = ["dropbox_app_secret"]
parser = "dropbox-events"
handlers = ["counter"]

[sources.msgraph]
scheme = "msgraph"
client_state = "state-42"
parser = "graph-events"
handlers = ["counter"]

[sources.github]
scheme = "github"
secrets = ["gh"]

[plugins.zoom-events]
wasm = "generic"
config = { id_pointer = "/payload/object/uuid", type_pointer = "/event" }

[plugins.meta-events]
wasm = "generic"
config = { id_pointer = "/entry/0/changes/0/value/messages/0/id", type_pointer = "/object" }

[plugins.twitter-events]
wasm = "generic"
config = { id_pointer = "/tweet_create_events/0/id_str" }

[plugins.dropbox-events]
wasm = "generic"
config = { id_pointer = "/list_folder/accounts/0" }

[plugins.graph-events]
wasm = "generic"
config = { id_pointer = "/value/0/resourceData/id", type_pointer = "/value/0/changeType" }
"#;

/// RFC 8032's first test key: the seed Discord's side signs with, and its public key above.
const DISCORD_SEED: &str = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";

async fn start() -> TestHost {
    TestHost::start(
        CONFIG,
        &[
            ("slack", plugins::SLACK),
            ("discord", plugins::DISCORD),
            ("generic", plugins::GENERIC),
            ("counter", plugins::COUNTER),
        ],
    )
    .await
}

/// One request to `/hooks/{source}{query}`: status, headers, body.
async fn request(
    host: &TestHost,
    method: Method,
    path_and_query: &str,
    headers: &[(HeaderName, HeaderValue)],
    body: &[u8],
) -> (StatusCode, HeaderMap, Bytes) {
    let url = format!("http://{}/hooks/{path_and_query}", host.ingest);
    support::send(method, &url, headers, Bytes::copy_from_slice(body))
        .await
        .unwrap()
}

async fn get(host: &TestHost, path_and_query: &str) -> (StatusCode, HeaderMap, Bytes) {
    request(host, Method::GET, path_and_query, &[], b"").await
}

/// How many events the source has stored.
async fn stored(host: &TestHost, source: &str) -> usize {
    let (status, list) = host
        .admin_get(&format!("/admin/events?source={source}"))
        .await;
    assert_eq!(status, StatusCode::OK, "{list}");
    list.as_array().unwrap().len()
}

/// The event goes in once, its resend is a duplicate, and `counter` handles it.
async fn accepted_deduped_delivered(
    host: &TestHost,
    source: &str,
    event_id: &str,
    sign: impl Fn() -> Vec<(HeaderName, HeaderValue)>,
    body: &[u8],
) {
    for duplicate in [false, true] {
        let (status, reply) = host.post(source, &sign(), body).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{source}: {reply}");
        assert_eq!(
            reply,
            json!({"accepted": true, "duplicate": duplicate, "event_id": event_id}),
            "{source}"
        );
    }
    host.wait_state(source, event_id, "counter", "done", Duration::from_secs(30))
        .await;
    assert_eq!(stored(host, source).await, 1, "{source}");
}

fn header(name: &'static str, value: &str) -> (HeaderName, HeaderValue) {
    (
        HeaderName::from_static(name),
        HeaderValue::from_str(value).unwrap(),
    )
}

fn json_body(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap_or_else(|e| panic!("{e}: {bytes:?}"))
}

/// Discord's headers for `body`, signed now by Python's Ed25519 (`cryptography`).
fn discord_headers(body: &[u8]) -> Vec<(HeaderName, HeaderValue)> {
    let ts = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .to_string();
    let script = "import sys\n\
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey\n\
        key = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(sys.argv[1]))\n\
        print(key.sign(sys.argv[2].encode() + sys.stdin.buffer.read()).hex())";
    let mut child = Command::new("python3")
        .args(["-c", script, DISCORD_SEED, &ts])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs (the independent Ed25519 signer)");
    use std::io::Write as _;
    child.stdin.take().unwrap().write_all(body).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "python3 with `cryptography` signs");
    let signature = String::from_utf8(out.stdout).unwrap();
    vec![
        header("x-signature-ed25519", signature.trim()),
        header("x-signature-timestamp", &ts),
        header("content-type", "application/json"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_url_verification_is_answered_then_an_event_and_its_retry_are_handled_once() {
    let host = start().await;
    let secret = "slack-signing-secret";
    let handshake = br#"{"token":"Jhj5dZrVaK7ZwHHjRyZWjbDl","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
    let signed = support::sign(&Scheme::Slack, secret, "", handshake, SystemTime::now());
    let (status, _, body) = request(&host, Method::POST, "slack", &signed, handshake).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        json_body(&body),
        json!({"challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"})
    );
    let unsigned = request(&host, Method::POST, "slack", &[], handshake).await;
    assert_eq!(unsigned.0, StatusCode::UNAUTHORIZED);
    assert_eq!(stored(&host, "slack").await, 0);

    let event = br#"{"type":"event_callback","event_id":"Ev08MFMKH6","event_time":1700000000,"event":{"type":"app_mention","channel":"C1","text":"hi"}}"#;
    let sign = |retry: Option<&str>| {
        let mut headers = support::sign(&Scheme::Slack, secret, "", event, SystemTime::now());
        headers.extend(retry.map(|n| header("x-slack-retry-num", n)));
        headers
    };
    let (status, reply) = host.post("slack", &sign(None), event).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    let (status, reply) = host.post("slack", &sign(Some("1")), event).await;
    assert_eq!(
        (status, reply["duplicate"].clone()),
        (StatusCode::ACCEPTED, json!(true))
    );
    host.wait_state(
        "slack",
        "Ev08MFMKH6",
        "counter",
        "done",
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(stored(&host, "slack").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discord_ping_signed_independently_is_answered_then_an_interaction_is_handled_once() {
    let host = start().await;
    let ping = br#"{"id":"1","application_id":"2","type":1,"token":"t","version":1}"#;
    let (status, _, body) =
        request(&host, Method::POST, "discord", &discord_headers(ping), ping).await;
    assert_eq!(status, StatusCode::OK, "{body:?}");
    assert_eq!(json_body(&body), json!({"type": 1}));
    let mut forged = discord_headers(ping);
    forged[0] = header("x-signature-ed25519", &"00".repeat(64));
    let refused = request(&host, Method::POST, "discord", &forged, ping).await;
    assert_eq!(refused.0, StatusCode::UNAUTHORIZED);
    assert_eq!(stored(&host, "discord").await, 0);

    // An interaction is stored, and answered as Discord requires within 3 s: deferred, for
    // the handler to complete through the follow-up webhook. Its resend is a duplicate.
    let command = br#"{"id":"1120000000000000001","application_id":"2","type":2,"data":{"id":"7","name":"deploy"},"channel_id":"C9","token":"t","version":1}"#;
    for _ in 0..2 {
        let (status, headers, body) = request(
            &host,
            Method::POST,
            "discord",
            &discord_headers(command),
            command,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body:?}");
        assert_eq!(headers["content-type"], "application/json");
        assert_eq!(json_body(&body), json!({"type": 5}));
    }
    host.wait_state(
        "discord",
        "1120000000000000001",
        "counter",
        "done",
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(stored(&host, "discord").await, 1);
    let (_, event) = host
        .admin_get("/admin/events/discord/1120000000000000001")
        .await;
    assert_eq!(event["deliveries"][0]["attempts"], 1, "{event}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zoom_url_validation_is_answered_with_the_token_hmac_then_an_event_is_handled_once() {
    let host = start().await;
    let secret = "zoom_secret_token";
    let handshake = br#"{"payload":{"plainToken":"qgg8vlvZRS6UYooatFL8Aw"},"event_ts":1654503849680,"event":"endpoint.url_validation"}"#;
    let signed = support::sign(&Scheme::Zoom, secret, "", handshake, SystemTime::now());
    let (status, _, body) = request(&host, Method::POST, "zoom", &signed, handshake).await;
    assert_eq!(status, StatusCode::OK);
    // hex(HMAC-SHA256("zoom_secret_token", plainToken)), computed with Python's hmac.
    assert_eq!(
        json_body(&body),
        json!({"plainToken": "qgg8vlvZRS6UYooatFL8Aw",
               "encryptedToken": "bd48235863f4a6323ccc4963c594908b7c97f88b4a6a95278f4f093690b12726"})
    );
    let unsigned = request(&host, Method::POST, "zoom", &[], handshake).await;
    assert_eq!(unsigned.0, StatusCode::UNAUTHORIZED);
    assert_eq!(stored(&host, "zoom").await, 0);

    let event = br#"{"event":"meeting.started","event_ts":1700000000000,"payload":{"account_id":"a","object":{"uuid":"4444AAAiAAAAAiAiAiiAii==","id":"123"}}}"#;
    accepted_deduped_delivered(
        &host,
        "zoom",
        "4444AAAiAAAAAiAiAiiAii==",
        || support::sign(&Scheme::Zoom, secret, "", event, SystemTime::now()),
        event,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meta_get_verification_echoes_the_challenge_for_the_right_token_only() {
    let host = start().await;
    let (status, headers, body) = get(
        &host,
        "meta?hub.mode=subscribe&hub.verify_token=my-verify-token&hub.challenge=1158201444",
    )
    .await;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"1158201444"[..]));
    assert_eq!(headers["x-content-type-options"], "nosniff");
    let (status, _, body) = get(
        &host,
        "meta?hub.mode=subscribe&hub.verify_token=guess&hub.challenge=1",
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(!String::from_utf8_lossy(&body).contains("my-verify-token"));
    assert_eq!(stored(&host, "meta").await, 0);

    let event = br#"{"object":"whatsapp_business_account","entry":[{"id":"102290129340398","changes":[{"field":"messages","value":{"messaging_product":"whatsapp","messages":[{"id":"wamid.HBgLMTY1MDM4Nzk0MzkVAgASGBQzQTRBNjU5OUFFRTAzODEwMTQ0RgA=","type":"text"}]}}]}]}"#;
    accepted_deduped_delivered(
        &host,
        "meta",
        "wamid.HBgLMTY1MDM4Nzk0MzkVAgASGBQzQTRBNjU5OUFFRTAzODEwMTQ0RgA=",
        || {
            support::sign(
                &Scheme::Meta,
                "meta_app_secret",
                "",
                event,
                SystemTime::now(),
            )
        },
        event,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twitter_crc_is_answered_with_the_token_hmac_then_an_event_is_handled_once() {
    let host = start().await;
    let (status, _, body) = get(
        &host,
        "twitter?crc_token=9b4507b3-9f62-4d1a-a41d-3a8c2a2e5a76",
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    // "sha256=" + base64(HMAC-SHA256(consumer secret, crc_token)), computed with Python's hmac.
    assert_eq!(
        json_body(&body),
        json!({"response_token": "sha256=R8GgJ+YMsDOCwrseAH3zdX8CpVyPI7S5picOPgk7Jsw="})
    );
    assert_eq!(get(&host, "twitter").await.0, StatusCode::BAD_REQUEST);
    assert_eq!(stored(&host, "twitter").await, 0);

    let event = br#"{"for_user_id":"2244994945","tweet_create_events":[{"id_str":"1700000000000000001","text":"hi"}]}"#;
    accepted_deduped_delivered(
        &host,
        "twitter",
        "1700000000000000001",
        || {
            support::sign(
                &Scheme::Twitter,
                "twitter_consumer_secret",
                "",
                event,
                SystemTime::now(),
            )
        },
        event,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropbox_challenge_is_echoed_as_plain_text_then_a_notification_is_handled_once() {
    let host = start().await;
    let (status, headers, body) = get(&host, "dropbox?challenge=dGhpcyBpcyBhIHRlc3Q").await;
    assert_eq!(
        (status, &body[..]),
        (StatusCode::OK, &b"dGhpcyBpcyBhIHRlc3Q"[..])
    );
    assert_eq!(
        (
            headers["content-type"].to_str().unwrap(),
            headers["x-content-type-options"].to_str().unwrap()
        ),
        ("text/plain; charset=utf-8", "nosniff")
    );
    assert_eq!(stored(&host, "dropbox").await, 0);

    let event = br#"{"list_folder":{"accounts":["dbid:AAH4f99T0taONIb-OurWxbNQ6ywGRopQngc"]},"delta":{"users":[12345678]}}"#;
    accepted_deduped_delivered(
        &host,
        "dropbox",
        "dbid:AAH4f99T0taONIb-OurWxbNQ6ywGRopQngc",
        || {
            support::sign(
                &Scheme::Dropbox,
                "dropbox_app_secret",
                "",
                event,
                SystemTime::now(),
            )
        },
        event,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msgraph_validation_token_is_echoed_then_a_notification_with_its_client_state_is_handled_once()
 {
    let host = start().await;
    let (status, headers, body) = request(
        &host,
        Method::POST,
        "msgraph?validationToken=Validation%3A+Testing+client+application",
        &[],
        b"",
    )
    .await;
    assert_eq!(
        (status, &body[..]),
        (
            StatusCode::OK,
            &b"Validation: Testing client application"[..]
        )
    );
    assert_eq!(headers["content-type"], "text/plain; charset=utf-8");
    assert_eq!(stored(&host, "msgraph").await, 0);

    let notification = |state: &str| {
        json!({"value": [{
            "subscriptionId": "7f105c7d-2dc5-4530-97cd-4e7ae6534c07",
            "clientState": state,
            "changeType": "created",
            "resource": "Users/u/Messages/m",
            "resourceData": {"@odata.type": "#Microsoft.Graph.Message", "id": "AAMkAGUwNjQ4ZjIxAAA="}
        }]})
        .to_string()
        .into_bytes()
    };
    let forged = notification("guess");
    let json_type = [header("content-type", "application/json")];
    let (status, _) = host.post("msgraph", &json_type, &forged).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let event = notification("state-42");
    accepted_deduped_delivered(
        &host,
        "msgraph",
        "AAMkAGUwNjQ4ZjIxAAA=",
        || json_type.to_vec(),
        &event,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_is_405_for_a_scheme_without_a_get_handshake() {
    let host = start().await;
    let (status, headers, _) = get(&host, "github?challenge=x").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(headers["allow"], "POST");
    // Another method's 405 names the same: GET only where the scheme has a GET handshake.
    for (source, allow) in [("github", "POST"), ("meta", "GET,HEAD,POST")] {
        let (status, headers, _) = request(&host, Method::PUT, source, &[], b"").await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{source}");
        assert_eq!(headers["allow"], allow, "{source}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hookd_send_signs_discord_with_the_private_key_seed() {
    let host = start().await;
    let payload = host.path().join("command.json");
    std::fs::write(
        &payload,
        br#"{"id":"1130000000000000001","type":2,"data":{"name":"ship"},"token":"t","version":1}"#,
    )
    .unwrap();
    let url = format!("http://{}/hooks/discord", host.ingest);
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_hookd"))
        .args([
            "send", "--url", &url, "--scheme", "discord", "--repeat", "2",
        ])
        .arg(&payload)
        .env("HOOKD_SEND_SECRET", DISCORD_SEED)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("sent 2: 2xx=2"), "{stdout}");
    host.wait_state(
        "discord",
        "1130000000000000001",
        "counter",
        "done",
        Duration::from_secs(30),
    )
    .await;
}
