//! Host-side bindings generated from `wit/`: one module per released WIT version, and the
//! per-version pre-instances a [`Plugin`](super::Plugin) holds.
//!
//! Invariants:
//! - Each released version (`wit/v0.1.0`, `wit/v0.2.0`, …) is bound by its own module and
//!   never edited; [`latest`] is the newest. The host implements each import once, for
//!   [`latest`] (in `super::host`); an older module's import impls and its conversions adapt
//!   its shapes to the latest, so the rest of the runtime sees only [`latest`] types.
//! - A component's version is read from the exact name of the role it exports
//!   (`hookd:plugin/parser@0.1.0`); one component has one version.

use wasmtime::component::{HasSelf, Linker};

use super::host::HostState;

/// Implements an older version's `types`, `log`, `config` and `state` imports (the modules of
/// those names in scope where it is invoked) by delegating to the latest version's one
/// implementation: their shapes have not changed since 0.1.0.
macro_rules! delegate_imports_to_latest {
    () => {
        impl types::Host for HostState {}

        impl log::Host for HostState {
            fn log(&mut self, level: log::Level, message: String) -> wasmtime::Result<()> {
                let level = match level {
                    log::Level::Debug => latest::log::Level::Debug,
                    log::Level::Info => latest::log::Level::Info,
                    log::Level::Warn => latest::log::Level::Warn,
                    log::Level::Error => latest::log::Level::Error,
                };
                latest::log::Host::log(self, level, message)
            }
        }

        impl config::Host for HostState {
            fn get(&mut self, key: String) -> wasmtime::Result<Option<String>> {
                latest::config::Host::get(self, key)
            }
        }

        impl state::Host for HostState {
            fn get(&mut self, key: String) -> wasmtime::Result<Option<Vec<u8>>> {
                latest::state::Host::get(self, key)
            }

            fn set(&mut self, key: String, value: Vec<u8>) -> wasmtime::Result<()> {
                latest::state::Host::set(self, key, value)
            }

            fn delete(&mut self, key: String) -> wasmtime::Result<()> {
                latest::state::Host::delete(self, key)
            }
        }
    };
}
use delegate_imports_to_latest;

/// The `parser_world` and `handler_world` binding modules of a version from 0.2.0 on, whose
/// handler world also imports `wasi:http` (bound to wasmtime-wasi(-http)'s own types, so it is
/// the one the engine links, never a second binding of it). `types`, `log` and `config` are
/// the parser world's.
macro_rules! bind_worlds {
    ($path:literal) => {
        /// Bindings for components exporting the parser role.
        pub mod parser_world {
            wasmtime::component::bindgen!({
                path: $path,
                world: "parser-plugin",
                imports: { default: trappable },
                exports: { default: async },
            });
        }

        /// Bindings for components exporting the handler role.
        pub mod handler_world {
            wasmtime::component::bindgen!({
                path: $path,
                world: "handler-plugin",
                imports: { default: trappable },
                exports: { default: async },
                with: {
                    "hookd:plugin/types": super::parser_world::hookd::plugin::types,
                    "hookd:plugin/log": super::parser_world::hookd::plugin::log,
                    "hookd:plugin/config": super::parser_world::hookd::plugin::config,
                    "wasi:http": wasmtime_wasi_http::p2::bindings::http,
                    "wasi:io": wasmtime_wasi::p2::bindings::io,
                    "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
                },
            });
        }
    };
}
use bind_worlds;

pub mod v0_1;
pub mod v0_2;
pub mod v0_3;

pub use latest::types;
pub use v0_3 as latest;

/// A released `hookd:plugin` WIT version this host loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum WitVersion {
    V0_1,
    V0_2,
    V0_3,
}

impl WitVersion {
    /// Every version this host loads, oldest first.
    pub const ALL: [Self; 3] = [Self::V0_1, Self::V0_2, Self::V0_3];

    /// The version as written in the WIT package (`0.1.0`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V0_1 => "0.1.0",
            Self::V0_2 => "0.2.0",
            Self::V0_3 => "0.3.0",
        }
    }

    /// The version of an export named `hookd:plugin/{role}@{version}`: `None` if the name is
    /// not that role's, `Some(Err(version))` for a version this host does not load.
    pub fn of_export<'a>(export: &'a str, role: &str) -> Option<Result<Self, &'a str>> {
        let version = export
            .strip_prefix("hookd:plugin/")?
            .strip_prefix(role)?
            .strip_prefix('@')?;
        Some(
            Self::ALL
                .into_iter()
                .find(|v| v.as_str() == version)
                .ok_or(version),
        )
    }
}

impl std::fmt::Display for WitVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A component's parser role, linked against its WIT version.
pub enum ParserPre {
    V0_1(v0_1::parser_world::ParserPluginPre<HostState>),
    V0_2(v0_2::parser_world::ParserPluginPre<HostState>),
    V0_3(v0_3::parser_world::ParserPluginPre<HostState>),
}

/// A component's handler role, linked against its WIT version.
pub enum HandlerPre {
    V0_1(v0_1::handler_world::HandlerPluginPre<HostState>),
    V0_2(v0_2::handler_world::HandlerPluginPre<HostState>),
    V0_3(v0_3::handler_world::HandlerPluginPre<HostState>),
}

/// Adds the `hookd:plugin` imports of every version to `linker` (`wasi:*` is added by the
/// engine).
pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    v0_1::handler_world::HandlerPlugin::add_to_linker::<_, HasSelf<HostState>>(linker, |s| s)?;
    // From 0.2.0 the handler world also imports `wasi:http`, which the engine links on its own,
    // so its `hookd:plugin` interfaces are added one by one.
    v0_2::parser_world::ParserPlugin::add_to_linker::<_, HasSelf<HostState>>(linker, |s| s)?;
    v0_2::handler_world::hookd::plugin::state::add_to_linker::<_, HasSelf<HostState>>(
        linker,
        |s| s,
    )?;
    v0_3::parser_world::ParserPlugin::add_to_linker::<_, HasSelf<HostState>>(linker, |s| s)?;
    v0_3::handler_world::hookd::plugin::state::add_to_linker::<_, HasSelf<HostState>>(
        linker,
        |s| s,
    )?;
    v0_3::handler_world::hookd::plugin::network::add_to_linker::<_, HasSelf<HostState>>(
        linker,
        |s| s,
    )
}

#[cfg(test)]
mod tests {
    use super::WitVersion;

    /// Compile picks the bindings by this parse, so a near-miss name must not pass for a role.
    #[test]
    fn an_export_name_yields_its_role_s_version_and_nothing_else() {
        let of = WitVersion::of_export;
        assert_eq!(
            of("hookd:plugin/parser@0.1.0", "parser"),
            Some(Ok(WitVersion::V0_1))
        );
        assert_eq!(
            of("hookd:plugin/handler@0.2.0", "handler"),
            Some(Ok(WitVersion::V0_2))
        );
        assert_eq!(
            of("hookd:plugin/handler@0.9.0", "handler"),
            Some(Err("0.9.0"))
        );
        assert_eq!(of("hookd:plugin/parser@0.1.0", "handler"), None);
        assert_eq!(of("hookd:plugin/parsers@0.1.0", "parser"), None);
        assert_eq!(of("other:plugin/parser@0.1.0", "parser"), None);
    }
}
