//! The plugin instance's configuration: the `config` table of its `[plugins.<name>]` section
//! in `hookd.toml`.
//!
//! ```toml
//! [plugins.classifier]
//! config = { labels = "bug,feature,other" }
//! ```

/// The configured value of `key`, or `None` if it is not set.
///
/// # Panics
///
/// Outside hookd (on a non-wasm target), where there is no configuration to read.
pub fn get(key: &str) -> Option<String> {
    #[cfg(target_arch = "wasm32")]
    {
        crate::__private::config::get(key)
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        crate::outside_hookd("config::get", key)
    }
}
