//! `GET /admin/openapi.json`: the admin listener described as an OpenAPI 3.1 document, built by
//! `utoipa` from the wire types ([`super::api`]) and the routes' annotations
//! ([`super::handlers`]).
//!
//! Invariants:
//! - Every route of the admin router is in the document and the document has no other
//!   (`every_route_is_documented_and_nothing_else` reads the router's source); the answers'
//!   schemas are the types the handlers return, so they cannot drift from what is sent.
//! - The refusals every `/admin/*` route may answer (401, 403, 500, 503) and the bearer
//!   authentication are added here once, for every operation, rather than on each route.

use axum::Json;
use utoipa::{
    Modify, OpenApi,
    openapi::{
        self, ContentBuilder, Ref, RefOr, ResponseBuilder,
        security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme},
    },
};

use super::{api, handlers, metrics, state};

/// The name of the bearer-token security scheme in the document.
const BEARER: &str = "bearer";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "hookd admin API",
        description = "Events, replay, plugins, plugin state and nodes of a hookd host. Every `/admin/*` route \
                       needs `Authorization: Bearer <admin token>` and a `Host` the listener \
                       accepts; no route answers a cross-origin browser request."
    ),
    paths(
        handlers::healthz,
        handlers::readyz,
        metrics::metrics,
        handlers::list_events,
        handlers::event_detail,
        handlers::replay,
        handlers::discard,
        handlers::plugins,
        handlers::rollback,
        handlers::nodes,
        state::list_keys,
        state::get_key,
        state::put_key,
        state::delete_key,
        document,
    ),
    components(schemas(api::ErrorBody)),
    modifiers(&Refusals)
)]
struct AdminDoc;

/// The document.
pub fn document_value() -> openapi::OpenApi {
    AdminDoc::openapi()
}

#[utoipa::path(get, path = "/admin/openapi.json", tag = "meta",
    responses((status = 200, description = "This document", body = Object)))]
pub(super) async fn document() -> Json<openapi::OpenApi> {
    Json(document_value())
}

/// Adds what every route shares: the bearer scheme on `/admin/*` and the refusals.
struct Refusals;

impl Modify for Refusals {
    fn modify(&self, doc: &mut openapi::OpenApi) {
        doc.components
            .get_or_insert_with(Default::default)
            .add_security_scheme(
                BEARER,
                SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
            );
        for (path, item) in doc.paths.paths.iter_mut() {
            let admin = path.starts_with("/admin/");
            let methods = [
                &mut item.get,
                &mut item.post,
                &mut item.put,
                &mut item.delete,
            ];
            for operation in methods.into_iter().flatten() {
                let mut refusals = vec![
                    (
                        "403",
                        "A cross-origin request, or (`/admin/*`) a `Host` the listener does not accept",
                    ),
                    (
                        "408",
                        "The request's body was not received in time (`body_timeout`)",
                    ),
                    (
                        "413",
                        "A body over the listener's cap (`payload_too_large`), refused from its `Content-Length` alone when it has one",
                    ),
                ];
                if admin {
                    operation.security =
                        Some(vec![SecurityRequirement::new(BEARER, Vec::<String>::new())]);
                    refusals.extend([
                        ("401", "No bearer token, or the wrong one"),
                        ("429", "Too many wrong tokens from this address (5 within 5 minutes): refused until `Retry-After` seconds have passed, whatever token it sends"),
                        ("500", "An internal failure (logged by the host; nothing of it is sent)"),
                        ("503", "The database is busy or unavailable, or the listener holds as many request bodies as it may; retry after `Retry-After` seconds"),
                    ]);
                }
                for (status, description) in refusals {
                    operation
                        .responses
                        .responses
                        .entry(status.to_owned())
                        .or_insert_with(|| error_response(description));
                }
            }
        }
    }
}

/// A response whose body is an [`api::ErrorBody`].
fn error_response(description: &str) -> RefOr<openapi::Response> {
    let body = ContentBuilder::new()
        .schema(Some(Ref::from_schema_name("ErrorBody")))
        .build();
    ResponseBuilder::new()
        .description(description)
        .content("application/json", body)
        .build()
        .into()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// `(path, method)` of every `.route("…", method(…).method(…))` in router source `source`.
    fn routes_in(source: &str) -> BTreeSet<(String, String)> {
        let mut routes = BTreeSet::new();
        for call in source.split(".route(").skip(1) {
            let Some(call) = call.trim_start().strip_prefix('"') else {
                continue;
            };
            let (path, rest) = call.split_once('"').expect("a route's path literal");
            let methods = rest.split_once("))").map_or(rest, |(methods, _)| methods);
            for method in ["get", "post", "put", "patch", "delete"] {
                if methods.contains(&format!("{method}(")) {
                    routes.insert((path.to_owned(), method.to_owned()));
                }
            }
        }
        routes
    }

    fn documented() -> BTreeSet<(String, String)> {
        let doc = serde_json::to_value(document_value()).unwrap();
        let paths = doc["paths"].as_object().unwrap();
        paths
            .iter()
            .flat_map(|(path, item)| {
                let methods = item.as_object().unwrap().keys();
                methods.map(move |method| (path.clone(), method.clone()))
            })
            .collect()
    }

    #[test]
    fn every_route_is_documented_and_nothing_else() {
        let routed = routes_in(include_str!("mod.rs"));
        assert!(
            routed.len() >= 13,
            "the router's source was not read: {routed:?}"
        );
        assert_eq!(documented(), routed);
    }

    #[test]
    fn the_document_is_openapi_3_1_with_bearer_auth_on_every_admin_route() {
        let doc = serde_json::to_value(document_value()).unwrap();
        assert!(
            doc["openapi"].as_str().unwrap().starts_with("3.1"),
            "{}",
            doc["openapi"]
        );
        for (path, method) in documented() {
            let operation = &doc["paths"][&path][&method];
            let secured = operation["security"] == serde_json::json!([{ BEARER: [] }]);
            assert_eq!(secured, path.starts_with("/admin/"), "{method} {path}");
            for status in ["403"].into_iter().chain(secured.then_some("401")) {
                assert!(
                    operation["responses"][status].is_object(),
                    "{method} {path} {status}"
                );
            }
        }
    }
}
