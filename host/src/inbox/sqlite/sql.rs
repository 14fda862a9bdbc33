//! The SQL vocabulary the operations share: the delivery-state sets as SQL lists, the skip
//! scan over an index's distinct leading values, and how a request's headers are stored (as
//! [`crate::inbox::request`] writes them).
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

/// `$arm!(state)` for each state of `DeliveryState::WAITING`, joined by `UNION ALL`: a query
/// that reads each waiting state as a range of an index, in that index's order, and merges
/// them (with the statement's own `ORDER BY`) instead of sorting the whole set.
macro_rules! each_waiting_state {
    ($arm:ident) => {
        concat!($arm!("pending"), " UNION ALL ", $arm!("retrying"))
    };
}
pub(super) use each_waiting_state;

/// `DeliveryState::ONCE_DONE` as an SQL list (see [`open_states!`]).
macro_rules! once_done_states {
    () => {
        "('pending', 'running', 'retrying', 'dead', 'discarded')"
    };
}
pub(super) use once_done_states;

/// `DeliveryState::FINISHED` as an SQL list (see [`open_states!`]).
macro_rules! finished_states {
    () => {
        "('done', 'stale', 'discarded')"
    };
}
pub(super) use finished_states;

/// `$name($column) AS (…)`, for a `WITH RECURSIVE`: every distinct `$column` of `$from` (a
/// table, with its `INDEXED BY` if wanted) among the rows its filter keeps (`$where`, as
/// ` WHERE x`, and `$and`, as `x AND `, or both empty; a partial index is read only by a
/// statement that names its condition), each found by one seek of an index led by `$column`
/// past the last one found. A skip scan: as many seeks as values, however many rows; the last
/// row is `NULL`, so the statement that follows filters it out. For `concat!` (see
/// [`open_states!`]).
#[rustfmt::skip]
macro_rules! distinct_by_seeks {
    ($name:literal, $column:literal, $from:literal, $where:literal, $and:literal) => {
        concat!(
            $name, "(", $column, ") AS (",
            " SELECT (SELECT MIN(", $column, ") FROM ", $from, $where, ")",
            " UNION ALL",
            " SELECT (SELECT MIN(", $column, ") FROM ", $from,
            " WHERE ", $and, $column, " > ", $name, ".", $column, ")",
            " FROM ", $name, " WHERE ", $name, ".", $column, " IS NOT NULL)"
        )
    };
}
pub(super) use distinct_by_seeks;

/// SQLite's plan for `sql` (`EXPLAIN QUERY PLAN`, its parameters unbound), one step per line:
/// what the room's tests hold a statement's index use to.
#[cfg(test)]
pub(super) fn query_plan(conn: &rusqlite::Connection, sql: &str) -> String {
    let mut statement = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
    let unbound = vec![rusqlite::types::Null; statement.parameter_count()];
    let steps: Vec<String> = statement
        .query_map(rusqlite::params_from_iter(unbound), |r| r.get(3))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    steps.join("\n")
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
    fn the_sql_once_done_set_is_delivery_state_once_done() {
        assert_eq!(once_done_states!(), sql_list(&DeliveryState::ONCE_DONE));
    }

    #[test]
    fn the_sql_waiting_set_is_delivery_state_waiting() {
        assert_eq!(waiting_states!(), sql_list(&DeliveryState::WAITING));
    }

    #[test]
    fn the_union_of_waiting_arms_is_delivery_state_waiting() {
        macro_rules! quoted {
            ($state:literal) => {
                concat!("'", $state, "'")
            };
        }
        let arms = each_waiting_state!(quoted).replace(" UNION ALL ", ", ");
        assert_eq!(format!("({arms})"), sql_list(&DeliveryState::WAITING));
    }

    #[test]
    fn the_sql_finished_set_is_delivery_state_finished() {
        assert_eq!(finished_states!(), sql_list(&DeliveryState::FINISHED));
    }
}
