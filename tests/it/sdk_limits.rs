//! The limits hookd enforces on plugins and the headers it refuses from them, restated by
//! each SDK's test harness (so a unit test refuses what hookd would) and by the SDKs' own
//! checks, held to hookd's values: a limit changed in the host and not in an SDK fails here,
//! instead of letting an SDK's tests approve what hookd refuses. The SDKs are other languages (and the Rust one another
//! target), so their sources are read as text: each constant by its name.

use std::{collections::BTreeSet, path::Path};

use crate::support::plugins;

/// Whether `line` is the top-level definition of a constant named `name` (in Rust,
/// TypeScript or Python): `pub const NAME: …`, `export const NAME = …`, `NAME = …`.
fn defines(line: &str, name: &str) -> bool {
    let line = line
        .trim_start_matches("pub ")
        .trim_start_matches("export ")
        .trim_start_matches("const ");
    line.strip_prefix(name)
        .is_some_and(|rest| rest.starts_with(':') || rest.starts_with(" ="))
}

/// The integer a constant named `name` is given in `file` (relative to the workspace), on the
/// one line at the file's top level that defines it: `NAME: usize = 8 * 1024 * 1024;`,
/// `NAME = 1024;`, a product of integers.
fn constant(file: &str, name: &str) -> u64 {
    let path = Path::new(plugins::WORKSPACE_ROOT).join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
    let defining: Vec<&str> = text.lines().filter(|line| defines(line, name)).collect();
    let [line] = defining[..] else {
        panic!(
            "{file} defines {name} {} times at its top level, not once",
            defining.len()
        );
    };
    let value = line.split('=').nth(1).unwrap().trim().trim_end_matches(';');
    value
        .split('*')
        .map(|factor| {
            factor
                .trim()
                .replace('_', "")
                .parse::<u64>()
                .unwrap_or_else(|e| panic!("{file}: {name} = {value}: {e}"))
        })
        .product()
}

/// The strings listed by a constant named `name` in `file`: every double-quoted string from
/// the line at the file's top level that defines it to the line that closes it (the next line
/// starting at column 0: `];`, `]);`, `)`). A list of names, one per line or several.
fn listed(file: &str, name: &str) -> BTreeSet<String> {
    let path = Path::new(plugins::WORKSPACE_ROOT).join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
    let mut lines = text.lines().skip_while(|line| !defines(line, name));
    let first = lines
        .next()
        .unwrap_or_else(|| panic!("{file} defines no {name} at its top level"));
    let body = lines.take_while(|line| line.starts_with(char::is_whitespace));
    let names: BTreeSet<String> = std::iter::once(first)
        .chain(body)
        .flat_map(|line| line.split('"').skip(1).step_by(2).map(str::to_owned))
        .collect();
    assert!(!names.is_empty(), "{file}: {name} lists no names");
    names
}

/// The headers each SDK refuses before sending a request, and the Rust harness from a parser's
/// answer, are hookd's: a header hookd refuses that an SDK lets through would have its
/// plugin's tests pass and every such event dead-lettered (or, from a parser, quarantined).
#[test]
fn every_sdk_refuses_the_headers_hookd_refuses() {
    let mut request: BTreeSet<String> = host::runtime::PLUGIN_FORBIDDEN_HEADERS
        .iter()
        .map(|name| name.as_str().to_owned())
        .collect();
    request.insert("content-length".to_owned());
    for (file, name) in [
        ("plugin-sdk/src/http.rs", "RESERVED_HEADERS"),
        ("plugin-sdk/js/src/http-core.ts", "HOST_HEADERS"),
        ("plugin-sdk/python/hookd/http.py", "HOOKD_HEADERS"),
    ] {
        assert_eq!(listed(file, name), request, "{file}: {name}");
    }
    let respond: BTreeSet<String> = host::outbound::policy::CONNECTION_HEADERS
        .iter()
        .map(|name| (*name).to_owned())
        .collect();
    assert_eq!(
        listed("plugin-sdk/src/testing.rs", "RESPOND_RESERVED"),
        respond,
        "plugin-sdk/src/testing.rs: RESPOND_RESERVED"
    );
}

#[test]
fn every_sdk_restates_hookds_limits_exactly() {
    let key = host::model::MAX_STATE_KEY_BYTES as u64;
    let value = host::model::MAX_STATE_VALUE_BYTES as u64;
    let requests = u64::from(host::outbound::policy::REQUESTS_PER_CALL);
    let envelope_field = host::ingest::MAX_ENVELOPE_FIELD_BYTES as u64;
    let response = host::outbound::transport::RESPONSE_BYTES;
    let respond_headers = host::runtime::MAX_RESPOND_HEADERS as u64;
    let restated = [
        ("plugin-sdk/src/state.rs", "MAX_KEY_BYTES", key),
        ("plugin-sdk/src/state.rs", "MAX_VALUE_BYTES", value),
        ("plugin-sdk/js/src/testing.ts", "MAX_KEY_BYTES", key),
        ("plugin-sdk/js/src/testing.ts", "MAX_VALUE_BYTES", value),
        ("plugin-sdk/python/hookd/testing.py", "MAX_KEY_BYTES", key),
        (
            "plugin-sdk/python/hookd/testing.py",
            "MAX_VALUE_BYTES",
            value,
        ),
        ("plugin-sdk/js/src/testing.ts", "MAX_REQUESTS", requests),
        (
            "plugin-sdk/python/hookd/testing.py",
            "MAX_REQUESTS",
            requests,
        ),
        (
            "plugin-sdk/src/testing.rs",
            "MAX_REQUESTS_PER_CALL",
            requests,
        ),
        (
            "plugin-sdk/src/testing.rs",
            "MAX_ENVELOPE_FIELD_BYTES",
            envelope_field,
        ),
        ("plugin-sdk/src/http.rs", "MAX_RESPONSE_BYTES", response),
        (
            "plugin-sdk/src/testing.rs",
            "MAX_RESPOND_HEADERS",
            respond_headers,
        ),
        (
            "plugin-sdk/python/hookd/http.py",
            "MAX_RESPONSE_BYTES",
            response,
        ),
        (
            "plugin-sdk/js/src/http-core.ts",
            "MAX_RESPONSE_BYTES",
            response,
        ),
    ];
    for (file, name, hookd) in restated {
        assert_eq!(constant(file, name), hookd, "{file}: {name}");
    }
}
