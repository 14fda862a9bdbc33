//! `hookd new handler NAME --lang ts|python`: a handler project in an interpreted language,
//! built by its SDK's build script (`plugin-sdk/js/build.mjs`, `plugin-sdk/python/build.sh`),
//! which the generated `hookd.toml` names as the plugin's `build` command for `hookd dev`.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde_json::json;

use super::{
    Lang, NewArgs, Role, built_from, check_empty, check_name, print_next_steps, sdk_dir, secret,
    server_and_source,
};

/// A JavaScript component carries its engine (about 13 MB): the file cap it gets.
const TS_FILE_MIB: u64 = 32;
/// A Python component carries CPython and its standard library (about 19 MB).
const PYTHON_FILE_MIB: u64 = 64;

pub(super) fn run(args: &NewArgs) -> anyhow::Result<()> {
    // Not a crate: Rust's keywords are fine names (`fn`).
    check_name(&args.name, false)?;
    if args.role != Role::Handler {
        bail!(
            "parsers are written in Rust: a parser runs before the provider is answered, within \
             50 ms and 16 MiB by default, which an interpreter does not fit (leave out --lang, or \
             make a handler)"
        );
    }
    if args.sdk_git.is_some() {
        bail!("--sdk-git is for Rust plugins; point --sdk-path at hookd's plugin-sdk directory");
    }
    let dir = args
        .path
        .clone()
        .unwrap_or_else(|| PathBuf::from(&args.name));
    check_empty(&dir)?;
    let root = match &args.sdk_path {
        Some(path) => sdk_dir(path)?,
        None => built_from()?,
    };
    let (sdk, files) = match args.lang {
        Lang::Ts => {
            let sdk = language_sdk(&root, "js", "build.mjs")?;
            (sdk.clone(), ts_files(&args.name, &sdk))
        }
        Lang::Python => {
            let sdk = language_sdk(&root, "python", "build.sh")?;
            (sdk.clone(), python_files(&args.name))
        }
        Lang::Rust => unreachable!("Rust crates are made by new::run"),
    };
    let secret = secret();
    let config = hookd_toml(args.lang, &args.name, &sdk, &secret);
    for (file, text) in files
        .into_iter()
        .chain([("hookd.toml", config), (".gitignore", GITIGNORE.to_owned())])
    {
        let path = dir.join(file);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    let (install, test) = match args.lang {
        Lang::Ts => (
            format!("npm ci --prefix {}", sdk.display()),
            "npm test".to_owned(),
        ),
        _ => (
            format!(
                "python3 -m venv {venv} && {venv}/bin/pip install --require-hashes -r {req}",
                venv = root
                    .parent()
                    .unwrap_or(&root)
                    .join("target/py-venv")
                    .display(),
                req = sdk.join("requirements.txt").display()
            ),
            format!("PYTHONPATH={} python3 -m unittest", sdk.display()),
        ),
    };
    let lang = match args.lang {
        Lang::Ts => "TypeScript",
        _ => "Python",
    };
    say!("{install}   # once: the build toolchain");
    print_next_steps(
        &format!(
            "created the handler `{}` in {} ({lang}, SDK {})",
            args.name,
            dir.display(),
            sdk.display()
        ),
        &dir,
        &test,
        &args.name,
    );
    Ok(())
}

/// The SDK directory `lang` of the `plugin-sdk` at `root`, if it holds its build script.
fn language_sdk(root: &Path, lang: &str, script: &str) -> anyhow::Result<PathBuf> {
    let sdk = root.join(lang);
    if !sdk.join(script).is_file() {
        bail!(
            "{} has no {lang}/{script}: this plugin-sdk has no {lang} SDK (point --sdk-path at \
             the plugin-sdk directory of a hookd checkout that has one)",
            root.display()
        );
    }
    Ok(sdk)
}

const GITIGNORE: &str = "/plugins\n/hookd.db*\n/.hookd-cache\n/node_modules\n__pycache__/\n";

fn hookd_toml(lang: Lang, name: &str, sdk: &Path, secret: &str) -> String {
    let quote = |text: &str| toml::Value::String(text.to_owned()).to_string();
    let (build, file_mib, what) = match lang {
        Lang::Ts => (
            format!(
                "[\"node\", {}, \"src/handler.ts\", \"{{out}}\"]",
                quote(&sdk.join("build.mjs").display().to_string())
            ),
            TS_FILE_MIB,
            "a JavaScript component carries its engine (~13 MB)",
        ),
        _ => (
            format!(
                "[\"bash\", {}, \".\", \"handler\", \"{{out}}\"]",
                quote(&sdk.join("build.sh").display().to_string())
            ),
            PYTHON_FILE_MIB,
            "a Python component carries CPython (~19 MB)",
        ),
    };
    server_and_source(
        name,
        secret,
        "runs the plugin's `build` into plugins/, and again whenever a file here changes",
    ) + &format!(
        "handlers = [\"{name}\"]\n\n\
         [plugins.{name}]\n\
         build = {build}\n\
         max_file_mib = {file_mib}   # {what}\n\
         config = {{ greeting = \"hello\" }}\n"
    )
}

fn ts_files(name: &str, sdk: &Path) -> Vec<(&'static str, String)> {
    let sdk_text = sdk.display().to_string();
    let package = json!({
        "name": name.to_ascii_lowercase(),
        "private": true,
        "type": "module",
        "scripts": {
            "build": format!("node {} src/handler.ts plugins/{name}.wasm", sdk.join("build.mjs").display()),
            "test": format!("node {} .", sdk.join("scripts/test.mjs").display()),
            // The build strips types without checking them: this checks them.
            "check": format!("node {} -p .", sdk.join("node_modules/typescript/bin/tsc").display()),
        },
    });
    let tsconfig = json!({
        "extends": sdk.join("tsconfig.json"),
        // The tests run on node's own test runner, outside the SDK's types (as chat-ts's).
        "include": ["src/**/*.ts", format!("{sdk_text}/types/**/*.d.ts")],
    });
    vec![
        (
            "package.json",
            serde_json::to_string_pretty(&package).expect("JSON") + "\n",
        ),
        (
            "tsconfig.json",
            serde_json::to_string_pretty(&tsconfig).expect("JSON") + "\n",
        ),
        ("src/handler.ts", HANDLER_TS.replace("NAME", name)),
        ("handler.test.ts", HANDLER_TEST_TS.replace("NAME", name)),
    ]
}

fn python_files(name: &str) -> Vec<(&'static str, String)> {
    vec![
        ("handler.py", HANDLER_PY.replace("NAME", name)),
        ("test_handler.py", HANDLER_TEST_PY.replace("NAME", name)),
    ]
}

const HANDLER_TS: &str = r#"// NAME: a hookd handler. It counts the events of each type in plugin state, logs a line with
// the configured `greeting`, and returns {"count": N, "event_type": "..."}, which hookd stores on
// the delivery.
import { config, defineHandler, log, output, state } from "@hookd/plugin-sdk";

export const handler = defineHandler((event) => {
  const key = `count/${event.eventType}`;
  // Reads see committed state; the write is committed only if this attempt succeeds.
  const count = (state.getJson<number>(key) ?? 0) + 1;
  state.setJson(key, count);
  const greeting = config.get("greeting") ?? "hello";
  log.info(`${greeting}: ${event.eventId} is ${event.eventType} number ${count}`);
  return output.json({ count, event_type: event.eventType });
});
"#;

const HANDLER_TEST_TS: &str = r#"// The handler on Node (`npm test`), with the SDK's Harness standing in for hookd.
import assert from "node:assert/strict";
import { test } from "node:test";

import { Event, Harness } from "@hookd/plugin-sdk/testing";

import { handler } from "./src/handler.ts";

test("each event type is counted in state", () => {
  const hookd = new Harness().withConfig("greeting", "hi");
  const event = (id: string) =>
    new Event({ source: "NAME", eventId: id, eventType: "order.paid", body: '{"type":"order.paid"}' });
  hookd.handle(handler, event("evt_1"));
  assert.deepEqual(hookd.handle(handler, event("evt_2")), {
    ok: true,
    output: '{"count":2,"event_type":"order.paid"}',
  });
  assert.equal(new TextDecoder().decode(hookd.state("count/order.paid")), "2");
  assert.equal(hookd.logs()[1].message, "hi: evt_2 is order.paid number 2");
});
"#;

const HANDLER_PY: &str = r#""""NAME: a hookd handler. It counts the events of each type in plugin state, logs a line with
the configured `greeting`, and returns {"count": N, "event_type": "..."}, which hookd stores on
the delivery."""

from hookd import Event, config, log, state


class Handler:
    def handle(self, ev: Event):
        key = f"count/{ev.event_type}"
        # Reads see committed state; the write is committed only if this attempt succeeds.
        count = state.get_json(key, 0) + 1
        state.set_json(key, count)
        greeting = config.get("greeting", "hello")
        log.info(f"{greeting}: {ev.event_id} is {ev.event_type} number {count}")
        return {"count": count, "event_type": ev.event_type}
"#;

const HANDLER_TEST_PY: &str = r#""""The handler on CPython, with the SDK's Harness standing in for hookd:
PYTHONPATH=<plugin-sdk/python> python3 -m unittest"""

import unittest

from hookd import Event
from hookd.testing import Harness

import handler


class HandlerTest(unittest.TestCase):
    def test_each_event_type_is_counted_in_state(self):
        hookd = Harness().with_config("greeting", "hi")

        def event(event_id):
            return Event("NAME", event_id, "order.paid", {"type": "order.paid"})

        hookd.handle(handler, event("evt_1"))
        self.assertEqual(hookd.handle(handler, event("evt_2")), '{"count":2,"event_type":"order.paid"}')
        self.assertEqual(hookd.state_json("count/order.paid"), 2)
        self.assertEqual(hookd.logs()[1][1], "hi: evt_2 is order.paid number 2")


if __name__ == "__main__":
    unittest.main()
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generated_configs_build_the_handler_with_its_sdk() {
        let sdk = Path::new("/src/hookd/plugin-sdk/js");
        for lang in [Lang::Ts, Lang::Python] {
            let text = hookd_toml(lang, "order-events", sdk, &secret());
            let dir = tempfile::tempdir().unwrap();
            let config = crate::config::Config::parse(&text, dir.path(), &|_| None)
                .unwrap_or_else(|e| panic!("{e:#}\n{text}"));
            let plugin = config.plugins.values().next().unwrap();
            let build = plugin.build.as_ref().unwrap();
            assert!(build.iter().any(|a| a == "{out}"), "{build:?}");
            assert!(
                build[1].starts_with("/src/hookd/plugin-sdk/js/"),
                "{build:?}"
            );
            assert!(plugin.max_file_bytes >= 32 << 20);
        }
        let files = ts_files("order-events", sdk);
        let package: serde_json::Value = serde_json::from_str(&files[0].1).unwrap();
        assert!(
            package["scripts"]["build"]
                .as_str()
                .unwrap()
                .contains("/src/hookd/plugin-sdk/js/build.mjs"),
            "{package}"
        );
        for (_, text) in files.iter().chain(&python_files("order-events")) {
            assert!(!text.contains("NAME"), "{text}");
        }
    }
}
