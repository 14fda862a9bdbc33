//! Test plugin: a component that exports `hookd:plugin/parser@0.1.0` with the wrong
//! signature (`parse: func(x: u32) -> u32`), so the tests can check that the host refuses it
//! with a message naming the mismatch instead of calling it.
//!
//! Exception: this is the one crate besides `plugin-sdk` that uses wit-bindgen directly, with
//! an inline WIT, because the SDK (rightly) cannot produce a wrong export.

wit_bindgen::generate!({
    inline: r"
        package hookd:plugin@0.1.0;

        interface parser {
            parse: func(x: u32) -> u32;
        }

        world mismatch {
            export parser;
        }
    ",
});

struct Mismatch;

impl exports::hookd::plugin::parser::Guest for Mismatch {
    fn parse(x: u32) -> u32 {
        x
    }
}

export!(Mismatch);
