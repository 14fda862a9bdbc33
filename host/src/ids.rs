//! Names and ids as newtypes, so a plugin name can never be passed where a source is expected.
//!
//! Invariant: every value is non-empty; the types are cheap to clone (`Arc<str>`).

use std::{fmt, sync::Arc};

macro_rules! id_newtype {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
        #[serde(transparent)]
        pub struct $name(Arc<str>);

        impl $name {
            /// Wraps `value`; callers validate non-emptiness where input is untrusted.
            pub fn new(value: impl Into<Arc<str>>) -> Self {
                Self(value.into())
            }

            /// The name as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&*self.0, f)
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl From<&str> for $name {
            fn from(value: &str) -> Self {
                Self(value.into())
            }
        }
    };
}

id_newtype!(
    /// A source: the `{source}` of `POST /hooks/{source}` and a `[sources.<name>]` table.
    SourceName
);
id_newtype!(
    /// A plugin instance: a `[plugins.<name>]` table (or a name a source refers to).
    PluginName
);
id_newtype!(
    /// The provider's id for one logical event; unique per source, forever.
    EventId
);
