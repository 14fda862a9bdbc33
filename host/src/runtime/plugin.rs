//! Loading a plugin file: native code from the artifact cache or the compiler process, its
//! roles read from its exports, its imports and exports checked against the WIT.
//!
//! Invariants:
//! - A [`Plugin`] exists only for a component whose every exported role matched the WIT at
//!   link time; [`Runtime::typecheck`] then instantiates each role once, in a throwaway bounded
//!   store, before the registry makes it live.
//! - Roles are recognised by export-name prefix (`hookd:plugin/parser@`, `…/handler@`) and
//!   the WIT version by the rest of the exact name; each role is linked with that version's
//!   bindings. One component has one version; a version this host does not load is refused
//!   with the versions it does.
//! - Native code is deserialized only when it came from the host-private cache or from this
//!   host's own compiler process, never from `plugins_dir`.

use std::{sync::Arc, time::Duration};

use sha2::{Digest, Sha256};
use wasmtime::component::Component;

use super::{
    ArtifactCache, CallContext, CallError, CompileError, Compiler, Limits, Origin, Runtime,
    bindings::{HandlerPre, ParserPre, WitVersion},
    call::{Role, bounded},
    host::HostState,
};
use crate::ids::PluginName;

/// The sha256 of a plugin file (lower-case hex): its version's identity in the registry, the
/// artifact cache and every attempt's record.
pub fn file_sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Which roles a component exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Roles {
    pub parser: bool,
    pub handler: bool,
}

impl Roles {
    /// The exported roles' names, parser first (as `/admin/plugins` lists them).
    pub fn names(self) -> Vec<&'static str> {
        let mut names = Vec::new();
        if self.parser {
            names.push("parser");
        }
        if self.handler {
            names.push("handler");
        }
        names
    }
}

/// A compiled, type-checked plugin file. Cheap to share; calls instantiate it afresh.
pub struct Plugin {
    sha256: String,
    roles: Roles,
    wit_version: WitVersion,
    origin: Origin,
    pub(super) parser: Option<ParserPre>,
    pub(super) handler: Option<HandlerPre>,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("sha256", &self.sha256)
            .field("roles", &self.roles)
            .field("wit_version", &self.wit_version)
            .field("origin", &self.origin)
            .finish()
    }
}

impl Plugin {
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    pub fn roles(&self) -> Roles {
        self.roles
    }

    /// The `hookd:plugin` WIT version it was built against (read from its exports).
    pub fn wit_version(&self) -> WitVersion {
        self.wit_version
    }

    /// Whether its native code came from the artifact cache or was compiled now.
    pub fn origin(&self) -> Origin {
        self.origin
    }
}

/// Why a plugin file was refused. Messages name the mismatch; the caller adds the file.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("not a valid WebAssembly component: {0}")]
    Invalid(String),
    #[error("exports neither hookd:plugin/parser nor hookd:plugin/handler (it exports: {0})")]
    NoRole(String),
    #[error("{0}")]
    Mismatch(String),
    /// The compile's process failed (a failure of the moment).
    #[error("{0}")]
    Compile(String),
    /// The compile went over this node's time or memory limit for it.
    #[error("{0}")]
    CompileLimit(String),
    /// A role did not start within its instances' limits.
    #[error("{0}")]
    Start(String),
    /// A role could not start for the host's plugin memory (or instance slots), taken by the
    /// calls in flight for as long as the load waited: a failure of the moment.
    #[error("{0}")]
    Busy(String),
}

impl LoadError {
    /// A role's export that does not match the WIT.
    fn export_mismatch<R: Role>(e: wasmtime::Error) -> Self {
        Self::Mismatch(format!(
            "its hookd:plugin/{} export does not match the WIT: {e:#}",
            R::NAME
        ))
    }
}

/// A plugin built for the registry, with the artifact to cache once it passed every check.
pub struct Built {
    pub plugin: Plugin,
    /// The precompiled code, when it was compiled now (not loaded from the cache).
    pub artifact: Option<Vec<u8>>,
}

impl Runtime {
    /// Compiles a component in this process (no cache, no deadline) and checks its imports:
    /// for tools. CPU-heavy: call it off the async executor, then [`Runtime::typecheck`] it.
    pub fn compile(&self, bytes: &[u8]) -> Result<Plugin, LoadError> {
        let component = Component::from_binary(&self.engine, bytes)
            .map_err(|e| LoadError::Invalid(format!("{e:#}")))?;
        self.plugin_from(component, file_sha256(bytes), Origin::Compiled)
    }

    /// The plugin for the file `wasm` (whose [`file_sha256`] is `sha256`): its native code from
    /// `cache` when a valid entry exists, else compiled by `compiler` (queued for its byte
    /// budget, in a bounded child process), then its imports checked. [`Runtime::typecheck`] it
    /// next, and only then store [`Built::artifact`] in the cache.
    pub async fn build(
        self: &Arc<Self>,
        wasm: Arc<Vec<u8>>,
        sha256: String,
        cache: Option<ArtifactCache>,
        compiler: &Compiler,
    ) -> Result<Built, LoadError> {
        if let Some(cache) = cache {
            let (runtime, sha) = (self.clone(), sha256.clone());
            let cached = tokio::task::spawn_blocking(move || {
                cache
                    .load(&runtime.engine, &sha)
                    .map(|component| runtime.plugin_from(component, sha, Origin::Cache))
            })
            .await
            .map_err(|e| LoadError::Compile(format!("loading the cached artifact failed: {e}")))?;
            if let Some(plugin) = cached {
                return plugin.map(|plugin| Built {
                    plugin,
                    artifact: None,
                });
            }
        }
        // Held until the artifact is deserialized: that copy is part of the compile's memory.
        let _permit = compiler.reserve(wasm.len()).await;
        let artifact = compiler.compile(wasm).await.map_err(|e| match e {
            CompileError::Invalid(m) => LoadError::Invalid(m),
            CompileError::Process(m) => LoadError::Compile(m),
            CompileError::Limit(m) => LoadError::CompileLimit(m),
        })?;
        let runtime = self.clone();
        tokio::task::spawn_blocking(move || {
            // SAFETY: the artifact was just produced by our own compiler process (the hookd
            // binary, `compiler::child_main`) from this file, for an engine configured like
            // this one; wasmtime checks its header and compatibility before using it.
            let component =
                unsafe { Component::deserialize(&runtime.engine, &artifact) }.map_err(|e| {
                    LoadError::Compile(format!(
                        "the compiler process's artifact does not load in this engine (is \
                         server.compiler the same hookd build?): {e:#}"
                    ))
                })?;
            let plugin = runtime.plugin_from(component, sha256, Origin::Compiled)?;
            Ok(Built {
                plugin,
                artifact: Some(artifact),
            })
        })
        .await
        .map_err(|e| LoadError::Compile(format!("loading the compiled artifact failed: {e}")))?
    }

    /// Checks a compiled component's exports and imports: the [`Plugin`] if hookd can run it.
    fn plugin_from(
        &self,
        component: Component,
        sha256: String,
        origin: Origin,
    ) -> Result<Plugin, LoadError> {
        let ty = component.component_type();
        let exports: Vec<String> = ty
            .exports(&self.engine)
            .map(|(n, _)| n.to_string())
            .collect();
        let parser = role_version::<ParserPre>(&exports)?;
        let handler = role_version::<HandlerPre>(&exports)?;
        let wit_version = match (parser, handler) {
            (None, None) => {
                return Err(LoadError::NoRole(if exports.is_empty() {
                    // Most often a Rust crate without its `plugin_sdk::register!(...)` line.
                    "nothing; a Rust plugin names its handler or parser with \
                     `plugin_sdk::register!(handler = T)` or `(parser = T)`"
                        .into()
                } else {
                    quoted_names(&exports)
                }));
            }
            (Some(p), Some(h)) if p != h => {
                return Err(LoadError::Mismatch(format!(
                    "it exports the parser of hookd:plugin@{p} and the handler of \
                     hookd:plugin@{h}; both roles of one component must use one WIT version"
                )));
            }
            (Some(v), _) | (None, Some(v)) => v,
        };
        let pre = self.linker.instantiate_pre(&component).map_err(|e| {
            LoadError::Mismatch(format!("imports something hookd does not provide: {e:#}"))
        })?;
        Ok(Plugin {
            sha256,
            roles: Roles {
                parser: parser.is_some(),
                handler: handler.is_some(),
            },
            wit_version,
            origin,
            parser: linked_role(parser, &pre)?,
            handler: linked_role(handler, &pre)?,
        })
    }

    /// Checks every exported role against the WIT by instantiating the component once per
    /// role in a throwaway store (export types are only checked on instantiation), each role
    /// within the most memory an instance using it so may hold (`limits`): a version that could
    /// start in no call is refused at load, and the version before it keeps serving.
    pub async fn typecheck(&self, plugin: &Plugin, limits: &StartLimits) -> Result<(), LoadError> {
        // The one place a load-time call's budget is set: no output, no logs, and time enough
        // for any component's start-up.
        let ctx = |memory_bytes, memory_key| CallContext {
            plugin: PluginName::from("typecheck"),
            config: Arc::default(),
            event: None,
            limits: Limits {
                timeout: Duration::from_secs(5),
                timeout_key: "the 5 s a load gives a component's start",
                memory_bytes,
                memory_key,
                pool_share: super::limiter::PoolShare::All,
                output_bytes: 0,
                log_bytes: 0,
            },
        };
        // A role no instance uses has no setting of its own to name.
        let key = |instance: &Option<String>, setting| match instance {
            Some(_) => setting,
            None => UNUSED_ROLE_KEY,
        };
        let parser = ctx(
            limits.parser_memory,
            key(&limits.parser_instance, "parser_memory_mib"),
        );
        self.typecheck_role(
            plugin.parser.as_ref(),
            &parser,
            limits.parser_instance.as_deref(),
        )
        .await?;
        let handler = ctx(
            limits.handler_memory,
            key(&limits.handler_instance, "memory_mib"),
        );
        self.typecheck_role(
            plugin.handler.as_ref(),
            &handler,
            limits.handler_instance.as_deref(),
        )
        .await
    }

    /// Instantiates one role (if exported) and checks its export against the WIT. While the
    /// host's plugin memory is held by the calls in flight, it waits for it (up to
    /// [`HOST_MEMORY_WAIT`]) rather than refuse a good file for a moment's load.
    async fn typecheck_role<R: Role>(
        &self,
        pre: Option<&R>,
        ctx: &CallContext,
        instance: Option<&str>,
    ) -> Result<(), LoadError> {
        let Some(pre) = pre else { return Ok(()) };
        let started = std::time::Instant::now();
        loop {
            let mut store = self.store(ctx, None);
            let stderr = store.data().stderr.clone();
            let started_role = bounded(
                &ctx.limits,
                &stderr,
                pre.linked().instantiate_async(&mut store),
            )
            .await;
            let instance = match started_role {
                Ok(instance) => instance,
                Err(CallError::HostMemory(_)) if started.elapsed() < HOST_MEMORY_WAIT => {
                    drop(store);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                Err(e @ CallError::HostMemory(_)) => {
                    return Err(LoadError::Busy(format!(
                        "starting its {} role failed: {e} (for {}s; tried again later)",
                        R::NAME,
                        HOST_MEMORY_WAIT.as_secs()
                    )));
                }
                Err(e) => {
                    let whose = instance.map_or_else(String::new, |instance| {
                        format!(
                            " ({} of plugins.{instance}, the most of the instances using it as \
                             a {})",
                            ctx.limits.memory_key,
                            R::NAME
                        )
                    });
                    return Err(LoadError::Start(format!(
                        "starting its {} role failed: {e}{whose}",
                        R::NAME
                    )));
                }
            };
            return pre
                .check_exports(&mut store, &instance)
                .map_err(LoadError::export_mismatch::<R>);
        }
    }
}

/// The memory each role of a file may start in, from the configuration: the most of the
/// instances that use the file in that role, and which instance that is (256 MiB, and none, for
/// a role none uses). An instance held to less traps when it runs, as any call over its limit.
#[derive(Debug, Clone)]
pub struct StartLimits {
    /// The largest `parser_memory_mib` (without its share per body byte) of the instances
    /// sources use the file as a parser.
    pub parser_memory: u64,
    pub parser_instance: Option<String>,
    /// The largest `memory_mib` of the instances sources use the file as a handler.
    pub handler_memory: u64,
    pub handler_instance: Option<String>,
}

impl Default for StartLimits {
    fn default() -> Self {
        Self {
            parser_memory: UNUSED_ROLE_MEMORY,
            parser_instance: None,
            handler_memory: UNUSED_ROLE_MEMORY,
            handler_instance: None,
        }
    }
}

/// The memory a role no instance uses may start in: enough for any component's start-up.
const UNUSED_ROLE_MEMORY: u64 = 256 * 1024 * 1024;
/// What a memory error names as the limit of such a role.
const UNUSED_ROLE_KEY: &str = "the 256 MiB a role no instance uses may start in";

/// How long a load waits for the host's plugin memory, held by the calls in flight, before it
/// refuses the file for want of it.
const HOST_MEMORY_WAIT: Duration = Duration::from_secs(30);

/// The WIT version of role `R`'s export, if the component exports the role.
fn role_version<R: Role>(exports: &[String]) -> Result<Option<WitVersion>, LoadError> {
    exports
        .iter()
        .find_map(|e| WitVersion::of_export(e, R::NAME))
        .transpose()
        .map_err(|version| {
            let loaded: Vec<_> = WitVersion::ALL.iter().map(|v| v.as_str()).collect();
            let (version, _) = crate::text::escape_within(version, NAME_BYTES);
            LoadError::Mismatch(format!(
                "it exports hookd:plugin/{}@{version}, a WIT version this hookd does not load \
                 (it loads {})",
                R::NAME,
                loaded.join(", ")
            ))
        })
}

/// The most bytes of one name a component chose that a load error quotes (escaped).
const NAME_BYTES: usize = 128;
/// The most of its names a load error lists.
const NAMES_SHOWN: usize = 10;

/// `names` (a component's exports) as a load error quotes them: the first [`NAMES_SHOWN`],
/// each escaped and cut to [`NAME_BYTES`], and how many there are in all. The file chose them:
/// 20 000 exports of 900 bytes made an 18 MB log line and admin answer.
fn quoted_names(names: &[String]) -> String {
    let mut shown: Vec<String> = names
        .iter()
        .take(NAMES_SHOWN)
        .map(|name| match crate::text::escape_within(name, NAME_BYTES) {
            (whole, true) => whole,
            (cut, false) => cut + "…",
        })
        .collect();
    if names.len() > NAMES_SHOWN {
        shown.push(format!("… ({} exports)", names.len()));
    }
    shown.join(", ")
}

/// The role's pre-instance if the component exports it, checked against its WIT version.
fn linked_role<R: Role>(
    version: Option<WitVersion>,
    pre: &wasmtime::component::InstancePre<HostState>,
) -> Result<Option<R>, LoadError> {
    version
        .map(|version| R::link(pre.clone(), version))
        .transpose()
        .map_err(LoadError::export_mismatch::<R>)
}

#[cfg(test)]
mod tests {
    /// The digest is the file's identity in the cache, the admin API and attempt records, so
    /// its spelling (lower-case hex of sha256) must not drift.
    #[test]
    fn a_file_is_named_by_the_lower_case_hex_sha256_of_its_bytes() {
        assert_eq!(
            super::file_sha256(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    /// A load error quotes at most ten of a component's names, each cut and escaped, and says
    /// how many there are: the file chose them (before, all of them, whole: 18 MB).
    #[test]
    fn a_load_error_quotes_few_names_each_cut() {
        let names: Vec<String> = (0..20_000)
            .map(|i| format!("e{i}-{}\n", "x".repeat(900)))
            .collect();
        let quoted = super::quoted_names(&names);
        assert!(
            quoted.len() < 11 * (super::NAME_BYTES + 8),
            "{}",
            quoted.len()
        );
        assert!(quoted.ends_with("… (20000 exports)"), "{quoted}");
        assert!(!quoted.contains('\n'));
        let few = ["hookd:plugin/other@0.1.0".to_owned(), "run\n".to_owned()];
        assert_eq!(
            super::quoted_names(&few),
            "hookd:plugin/other@0.1.0, run\\n"
        );
    }
}
