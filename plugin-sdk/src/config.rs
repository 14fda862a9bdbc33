//! The plugin instance's configuration: the `config` table of its `[plugins.<name>]` section
//! in `hookd.toml`.
//!
//! ```toml
//! [plugins.classifier]
//! config = { labels = "bug,feature,other" }
//! ```

/// The configured value of `key`, or `None` if it is not set.
///
/// During a [`Harness`](crate::testing::Harness) call (on the host target) it is the
/// harness's [`with_config`](crate::testing::Harness::with_config) value.
///
/// # Panics
///
/// Outside hookd (on a non-wasm target) when no harness call is running, as there is no
/// configuration to read.
pub fn get(key: &str) -> Option<String> {
    #[cfg(target_arch = "wasm32")]
    {
        crate::__private::config::get(key)
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        crate::testing::config(key).unwrap_or_else(|| crate::outside_hookd("config::get", key))
    }
}
