//! `Config::parse` (the whole `hookd.toml` loader: TOML, defaults, validation) on arbitrary text.
//!
//! Properties: never panics; a secret read from the environment never appears in an error;
//! an accepted config names only plugins it also configures.
#![no_main]

use std::path::Path;

use host::config::Config;
use libfuzzer_sys::fuzz_target;

/// What the environment holds for any variable whose name contains `SECRET`.
const ENV_SECRET: &str = "env-secret-value-7d2e";

fuzz_target!(|input: &[u8]| {
    let Ok(text) = std::str::from_utf8(input) else {
        return;
    };
    let env = |name: &str| name.contains("SECRET").then(|| ENV_SECRET.to_owned());
    match Config::parse(text, Path::new("/srv/hookd"), &env) {
        Ok(config) => {
            for source in config.sources.values() {
                for plugin in source.parser.iter().chain(&source.handlers) {
                    assert!(
                        config.plugins.contains_key(plugin),
                        "{plugin} is not configured"
                    );
                }
            }
        }
        Err(e) => {
            let message = format!("{e:#}");
            assert!(
                !message.contains(ENV_SECRET),
                "an error names a secret: {message}"
            );
        }
    }
});
