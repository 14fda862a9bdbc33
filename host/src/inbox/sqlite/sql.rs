//! The SQL vocabulary the operations share: the delivery-state sets as SQL lists, and how a
//! request's headers are stored (as [`crate::inbox::request`] writes them).
//!
//! Invariant: a set of delivery states is written in SQL only here, as the text of one macro
//! per set, and a test holds each macro to its `DeliveryState` constant, so SQL and Rust agree
//! on which states are open.

pub(super) use crate::inbox::request::{headers_from_json, headers_json};

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

/// `DeliveryState::FINISHED` as an SQL list (see [`open_states!`]).
macro_rules! finished_states {
    () => {
        "('done', 'stale', 'discarded')"
    };
}
pub(super) use finished_states;

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

    #[test]
    fn the_sql_finished_set_is_delivery_state_finished() {
        assert_eq!(finished_states!(), sql_list(&DeliveryState::FINISHED));
    }
}
