//! Plugin compilation in a child process: the `hookd` binary re-executed with a hidden
//! subcommand (`hookd __compile-plugin`), fed the wasm bytes on stdin, answering the
//! precompiled artifact on stdout; the host then only deserializes it.
//!
//! Invariants:
//! - A compile is bounded: its process dies with hookd (parent-death signal), gets an
//!   address-space limit (`server.compile_memory_mib`,
//!   `setrlimit(RLIMIT_AS)`), and is killed (SIGKILL, then reaped) when it runs past
//!   `server.compile_timeout_ms` or when the load waiting for it is dropped. A thread cannot be
//!   stopped; a process can, so a compile past its deadline never keeps running.
//! - Compiles queue for a global budget of wasm bytes being compiled at once
//!   (`server.compile_queue_bytes`, each file weighing its size, capped at the budget), so many
//!   files replaced together compile a few at a time, not all at once.
//! - The child gets an empty environment (no secrets) and the wasm on stdin only; its errors
//!   are wasmtime's validation messages, never the file's bytes.

use std::{
    path::PathBuf,
    process::{ExitCode, Stdio},
    sync::Arc,
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    sync::Semaphore,
};

/// The hidden subcommand the compiler process runs.
pub const SUBCOMMAND: &str = "__compile-plugin";
/// Bytes of the child's error message kept.
const MAX_ERROR_BYTES: usize = 2048;

/// How plugin files are compiled (`[server]` `compiler`, `compile_*`).
#[derive(Debug, Clone)]
pub struct CompilerSettings {
    /// The `hookd` executable to run as the compiler process.
    pub program: PathBuf,
    /// Longest one compile may run before its process is killed.
    pub timeout: Duration,
    /// Address-space limit of the compiler process.
    pub memory_bytes: u64,
    /// Wasm bytes being compiled at once, across all files.
    pub queue_bytes: u64,
}

/// Compiles plugin files in bounded child processes, queued by a budget of bytes.
#[derive(Debug, Clone)]
pub struct Compiler {
    settings: Arc<CompilerSettings>,
    queue: Arc<Semaphore>,
}

/// Why a compile produced no artifact.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// The wasm is not a valid component (wasmtime's message).
    #[error("{0}")]
    Invalid(String),
    /// The compile's process failed (it could not start, was killed, its output unreadable).
    #[error("{0}")]
    Process(String),
    /// The compile went over one of this node's limits (`server.compile_timeout_ms`,
    /// `server.compile_memory_mib`): it would again.
    #[error("{0}")]
    Limit(String),
}

impl Compiler {
    pub fn new(settings: CompilerSettings) -> Self {
        let permits = settings.queue_bytes.clamp(1, Semaphore::MAX_PERMITS as u64) as usize;
        Self {
            settings: Arc::new(settings),
            queue: Arc::new(Semaphore::new(permits)),
        }
    }

    pub fn settings(&self) -> &CompilerSettings {
        &self.settings
    }

    /// A compiler whose program does not exist: for tests whose loads must fail fast, without
    /// a compile.
    #[cfg(test)]
    pub fn missing() -> Self {
        Self::new(CompilerSettings {
            program: PathBuf::from("/nonexistent/hookd"),
            timeout: Duration::from_secs(1),
            memory_bytes: 1 << 30,
            queue_bytes: 1 << 20,
        })
    }

    /// Waits for `len` bytes of the compile budget (a file larger than the whole budget takes
    /// all of it, so it compiles alone).
    pub async fn reserve(&self, len: usize) -> tokio::sync::OwnedSemaphorePermit {
        let weight = (len as u64).clamp(1, self.settings.queue_bytes.max(1)) as u32;
        self.queue
            .clone()
            .acquire_many_owned(weight)
            .await
            .expect("the compile queue is never closed")
    }

    /// Compiles `wasm` in a child process; the precompiled artifact for an engine configured
    /// like [`super::engine::engine_config`] (call [`Compiler::reserve`] first).
    pub async fn compile(&self, wasm: Arc<Vec<u8>>) -> Result<Vec<u8>, CompileError> {
        let s = &self.settings;
        let mut child = tokio::process::Command::new(&s.program)
            .arg(SUBCOMMAND)
            .arg("--memory-bytes")
            .arg(s.memory_bytes.to_string())
            .arg("--parent")
            .arg(std::process::id().to_string())
            .env_clear()
            // Few malloc arenas: the address-space limit is for compiling, not for reservations.
            .env("MALLOC_ARENA_MAX", "2")
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                CompileError::Process(format!(
                    "cannot start the compiler process {} (server.compiler): {e}",
                    s.program.display()
                ))
            })?;
        let mut stdin = child.stdin.take().expect("piped");
        let mut stdout = child.stdout.take().expect("piped");
        let mut stderr = child.stderr.take().expect("piped");
        let limit = s.memory_bytes;
        let run = async {
            let feed = async {
                // A child that exits early closes the pipe; its status says why.
                let _ = stdin.write_all(&wasm).await;
                drop(stdin);
            };
            let mut artifact = Vec::new();
            let mut error = Vec::new();
            let mut out = (&mut stdout).take(limit);
            let read_out = out.read_to_end(&mut artifact);
            let read_err = async {
                let read = (&mut stderr)
                    .take(MAX_ERROR_BYTES as u64)
                    .read_to_end(&mut error)
                    .await;
                // Drain the rest, so a verbose child never blocks on a full pipe.
                let _ = tokio::io::copy(&mut stderr, &mut tokio::io::sink()).await;
                read
            };
            let ((), out, _) = tokio::join!(feed, read_out, read_err);
            let status = child.wait().await;
            (status, out.map(|_| artifact), error)
        };
        let (status, artifact, error) = match tokio::time::timeout(s.timeout, run).await {
            Ok(done) => done,
            Err(_) => {
                // SIGKILL and reap: the compile is over, not left running.
                let _ = child.kill().await;
                return Err(CompileError::Limit(format!(
                    "compiling took over {:?} (server.compile_timeout_ms); the compiler process \
                     was stopped",
                    s.timeout
                )));
            }
        };
        let status = status
            .map_err(|e| CompileError::Process(format!("waiting for the compiler process: {e}")))?;
        let mut message = String::from_utf8_lossy(&error)
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("note:"))
            .collect::<Vec<_>>()
            .join(" | ");
        message.truncate(message.floor_char_boundary(MAX_ERROR_BYTES));
        match status.code() {
            Some(0) => artifact.map_err(|e| {
                CompileError::Process(format!("reading the compiler process's output: {e}"))
            }),
            Some(INVALID) => Err(CompileError::Invalid(message)),
            _ => {
                use std::os::unix::process::ExitStatusExt as _;
                let how = match status.signal() {
                    Some(signal) => format!("was killed by signal {signal}"),
                    None => format!("failed ({status})"),
                };
                let out_of_memory = status.signal() == Some(6)
                    || message.contains("memory allocation")
                    || message.contains("out of memory");
                let hint = if out_of_memory {
                    format!(
                        "; it ran out of its {} MiB (server.compile_memory_mib)",
                        limit / (1024 * 1024)
                    )
                } else {
                    String::new()
                };
                let message = format!(
                    "the compiler process {} {how}{hint}{}",
                    s.program.display(),
                    if message.is_empty() {
                        String::new()
                    } else {
                        format!(": {message}")
                    }
                );
                Err(if out_of_memory {
                    CompileError::Limit(message)
                } else {
                    CompileError::Process(message)
                })
            }
        }
    }
}

/// Exit code of the compiler process for a file wasmtime refused.
const INVALID: i32 = 3;

/// `hookd __compile-plugin --memory-bytes N --parent PID`: die with the parent, limit this
/// process's address space, read a wasm component from stdin, write its precompiled artifact
/// to stdout.
pub fn child_main(memory_bytes: u64, parent: u32) -> ExitCode {
    use std::io::{Read as _, Write as _};
    // A hookd killed outright (SIGKILL) cannot kill its compile: the kernel does it.
    #[cfg(target_os = "linux")]
    {
        let signal = Some(rustix::process::Signal::KILL);
        if rustix::process::set_parent_process_death_signal(signal).is_err()
            || rustix::process::getppid().map(|p| p.as_raw_nonzero().get() as u32) != Some(parent)
        {
            eprintln!("the hookd that started this compile is gone");
            return ExitCode::FAILURE;
        }
    }
    let limit = rustix::process::Rlimit {
        current: Some(memory_bytes),
        maximum: Some(memory_bytes),
    };
    if let Err(e) = rustix::process::setrlimit(rustix::process::Resource::As, limit) {
        eprintln!("cannot limit the compiler's memory: {e}");
        return ExitCode::FAILURE;
    }
    let mut wasm = Vec::new();
    let cap = crate::registry::LARGEST_PLUGIN_BYTES + 1;
    if let Err(e) = std::io::stdin().lock().take(cap).read_to_end(&mut wasm) {
        eprintln!("reading the wasm from stdin: {e}");
        return ExitCode::FAILURE;
    }
    let engine = match wasmtime::Engine::new(&super::engine::engine_config(false)) {
        Ok(engine) => engine,
        Err(e) => {
            eprintln!("starting the compiler: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    match engine.precompile_component(&wasm) {
        Ok(artifact) => {
            let mut out = std::io::stdout().lock();
            if out.write_all(&artifact).and_then(|()| out.flush()).is_err() {
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            let message = format!("{e:#}").replace('\n', " | ");
            eprintln!("{message}");
            ExitCode::from(INVALID as u8)
        }
    }
}

#[cfg(test)]
mod tests {
    use wasmtime::{Engine, component::Component};

    /// The compiler process builds its engine without the pooling allocator (whose
    /// reservations would not fit its address-space limit); the host's pooling engine must
    /// still load what it produces.
    #[test]
    fn the_compiler_engine_makes_artifacts_the_host_engine_loads() {
        let plain = Engine::new(&super::super::engine::engine_config(false)).unwrap();
        let artifact = plain
            .precompile_component(b"\0asm\x0d\x00\x01\x00")
            .unwrap();
        for pooling in [false, true] {
            let Ok(host) = Engine::new(&super::super::engine::engine_config(pooling)) else {
                continue; // no pooling allocator on this machine: the host would not use it
            };
            // SAFETY: produced just above by wasmtime for this configuration.
            unsafe { Component::deserialize(&host, &artifact) }
                .unwrap_or_else(|e| panic!("pooling = {pooling}: {e:#}"));
        }
    }
}
