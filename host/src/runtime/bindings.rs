//! Host-side bindings generated from `wit/`: one module per plugin world.
//!
//! Invariant: the handler world reuses the parser world's `types`, `log` and `config`
//! bindings, so each host import is implemented exactly once.

/// Bindings for components exporting the parser role.
pub mod parser_world {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "parser-plugin",
        imports: { default: trappable },
        exports: { default: async },
    });
}

/// Bindings for components exporting the handler role.
pub mod handler_world {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "handler-plugin",
        imports: { default: trappable },
        exports: { default: async },
        with: {
            "hookd:plugin/types": super::parser_world::hookd::plugin::types,
            "hookd:plugin/log": super::parser_world::hookd::plugin::log,
            "hookd:plugin/config": super::parser_world::hookd::plugin::config,
        },
    });
}

pub use parser_world::hookd::plugin::types;
