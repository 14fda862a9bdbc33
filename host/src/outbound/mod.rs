//! Outbound HTTP for handlers, apart from the sandbox that exposes it: the policy that decides
//! what a plugin may reach, and the client that reaches it.
//!
//! Invariants:
//! - Independent of the Wasm runtime: nothing here names the runtime or its `wasi:http` types;
//!   the runtime's hooks translate both ways, so `config` and `dispatch` can use the policy
//!   without depending on the sandbox.
//! - [`policy`] decides, [`transport`] only carries out: every connection goes to an address
//!   the policy kept for a target the policy admitted.
//! - Secrets the host adds ([`credentials`]) and the trust roots ([`tls`]) are per plugin
//!   instance, fixed when its configuration loads.

pub mod credentials;
pub mod lookups;
pub mod policy;
pub mod sockets;
pub mod tls;
pub mod transport;

pub use self::policy::{
    AllowList, AllowListError, Denied, Host, HostPort, HostPortError, Outbound, idempotency_key,
};
