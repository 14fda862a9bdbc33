//! The SQL vocabulary the operations share: the delivery-state sets as SQL lists, and how a
//! request's headers are stored.
//!
//! Invariant: a set of delivery states is written in SQL only here, as the text of one macro
//! per set, and a test holds each macro to its `DeliveryState` constant, so SQL and Rust agree
//! on which states are open.

use crate::model::Header;

/// `DeliveryState::OPEN` as an SQL list, for `concat!` into a statement (a macro, not a
/// `const`, so statements stay `&'static str` for the statement cache).
macro_rules! open_states {
    () => {
        "('pending', 'running', 'retrying')"
    };
}
pub(super) use open_states;

/// `DeliveryState::WAITING` as an SQL list (see [`open_states!`]).
macro_rules! waiting_states {
    () => {
        "('pending', 'retrying')"
    };
}
pub(super) use waiting_states;

/// Headers as stored in `events.headers` and `quarantine.headers`: a JSON array of pairs.
pub(super) fn headers_json(headers: &[Header]) -> String {
    serde_json::to_string(headers).expect("string pairs serialize")
}

/// Headers back from their stored JSON (none if the text is not such an array).
pub(super) fn headers_from_json(text: &str) -> Vec<Header> {
    serde_json::from_str(text).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use crate::model::DeliveryState;

    fn sql_list(states: &[DeliveryState]) -> String {
        let quoted: Vec<String> = states.iter().map(|s| format!("'{s}'")).collect();
        format!("({})", quoted.join(", "))
    }

    #[test]
    fn the_sql_open_set_is_delivery_state_open() {
        assert_eq!(open_states!(), sql_list(&DeliveryState::OPEN));
    }

    #[test]
    fn the_sql_waiting_set_is_delivery_state_waiting() {
        assert_eq!(waiting_states!(), sql_list(&DeliveryState::WAITING));
    }
}
