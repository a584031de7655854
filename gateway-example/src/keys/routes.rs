//! A key's `allowed_routes`, matched as LiteLLM matches them: a route is allowed when it equals
//! an entry, starts with an entry followed by `/` (`"/v1/models"` allows `"/v1/models/gpt-4o"`),
//! matches an entry ending in `*` as a prefix (`"/v1/*"`), or is in a route group an entry names
//! (`"llm_api_routes"`, `"openai_routes"`, `"anthropic_routes"`, `"info_routes"`).
//!
//! Only the routes a key may call at all are checked (the others need the master key): an entry
//! that can match none of them is refused when the key is made, so a typo cannot leave a key
//! believed to be kept off a route.

use crate::endpoint::Endpoint;

/// The route groups an entry may name, LiteLLM's names.
pub const GROUPS: &[&str] = &[
    "llm_api_routes",
    "openai_routes",
    "anthropic_routes",
    "info_routes",
];

/// The routes a generated key may call, besides the completion endpoints ([`Endpoint`], with and
/// without `/v1`): `/metrics` only when the config asks for a key there.
const OTHER_ROUTES: &[&str] = &[
    "/models",
    "/v1/models",
    "/messages/count_tokens",
    "/v1/messages/count_tokens",
    "/metrics",
];

/// LiteLLM's `info_routes` beyond the model list: the deployments' and groups' info (routes a
/// key may call too).
const INFO_ROUTES: &[&str] = &[
    "/model/info",
    "/v1/model/info",
    "/model_group/info",
    "/v1/model_group/info",
];

/// Whether `route` is in group `group`.
fn in_group(group: &str, route: &str) -> bool {
    let api = Endpoint::from_path(route);
    let models = is_models(route);
    let anthropic = matches!(api, Some(Endpoint::Messages)) || route.ends_with("/count_tokens");
    match group {
        "llm_api_routes" => api.is_some() || models || anthropic,
        "openai_routes" => (api.is_some() && !anthropic) || models,
        "anthropic_routes" => anthropic,
        "info_routes" => models || INFO_ROUTES.contains(&route),
        _ => false,
    }
}

fn is_models(route: &str) -> bool {
    let rest = route.strip_prefix("/v1").unwrap_or(route);
    rest == "/models" || rest.starts_with("/models/")
}

/// Whether entry `allowed` lets a key call `route`.
fn matches(allowed: &str, route: &str) -> bool {
    if let Some(prefix) = allowed.strip_suffix('*') {
        return route.starts_with(prefix);
    }
    route == allowed
        || route
            .strip_prefix(allowed)
            .is_some_and(|rest| rest.starts_with('/'))
        || in_group(allowed, route)
}

/// Whether a key with `allowed_routes` may call `route` (an empty list allows every route).
pub fn allows(allowed_routes: &[String], route: &str) -> bool {
    allowed_routes.is_empty() || allowed_routes.iter().any(|a| matches(a, route))
}

/// The entries of `allowed_routes` that can match no route a key may call (a group name, a
/// route, a prefix of one, a `*` pattern, or a model's route `/v1/models/<id>` are understood).
pub fn not_understood(allowed_routes: &[String]) -> Vec<&str> {
    let known = Endpoint::ALL
        .iter()
        .flat_map(|e| [e.path().to_owned(), format!("/v1{}", e.path())])
        .chain(
            OTHER_ROUTES
                .iter()
                .chain(INFO_ROUTES)
                .map(|r| (*r).to_owned()),
        )
        .collect::<Vec<_>>();
    allowed_routes
        .iter()
        .map(String::as_str)
        .filter(|a| {
            let understood = GROUPS.contains(a)
                || (a.starts_with('/') && is_models(a))
                || known.iter().any(|route| matches(a, route));
            !understood
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes(list: &[&str]) -> Vec<String> {
        list.iter().map(|r| (*r).to_owned()).collect()
    }

    #[test]
    fn routes_match_exactly_by_prefix_by_pattern_and_by_group() {
        let embeddings = routes(&["/v1/embeddings"]);
        assert!(allows(&embeddings, "/v1/embeddings"));
        assert!(!allows(&embeddings, "/embeddings"));
        assert!(!allows(&embeddings, "/v1/chat/completions"));
        // A prefix only up to a `/`.
        let models = routes(&["/v1/models"]);
        assert!(allows(&models, "/v1/models/gpt-4o"));
        assert!(!allows(&models, "/v1/modelsx"));
        let v1 = routes(&["/v1/*"]);
        assert!(allows(&v1, "/v1/chat/completions") && !allows(&v1, "/chat/completions"));
        let llm = routes(&["llm_api_routes"]);
        for r in [
            "/chat/completions",
            "/v1/messages",
            "/v1/models",
            "/v1/responses",
        ] {
            assert!(allows(&llm, r), "{r}");
        }
        assert!(!allows(&llm, "/metrics"));
        let openai = routes(&["openai_routes"]);
        assert!(allows(&openai, "/v1/embeddings") && !allows(&openai, "/v1/messages"));
        let anthropic = routes(&["anthropic_routes"]);
        assert!(allows(&anthropic, "/v1/messages"));
        assert!(allows(&anthropic, "/v1/messages/count_tokens"));
        assert!(!allows(&anthropic, "/v1/chat/completions"));
        // LiteLLM's `info_routes`: the model list and the deployments' and groups' info.
        let info = routes(&["info_routes"]);
        for r in [
            "/v1/models",
            "/model/info",
            "/v1/model/info",
            "/model_group/info",
        ] {
            assert!(allows(&info, r), "{r}");
        }
        assert!(!allows(&info, "/v1/chat/completions"));
        assert!(not_understood(&routes(&["/model/info", "/v1/model_group/info"])).is_empty());
        // No list: every route.
        assert!(allows(&[], "/v1/chat/completions"));
    }

    #[test]
    fn entries_that_match_no_route_a_key_may_call_are_named() {
        let list = routes(&[
            "/v1/embeddings",
            "/v1",
            "/v1/models/gpt-4o",
            "/v1/*",
            "llm_api_routes",
            "/v1/embedding",
            "/key/generate",
            "management_routes",
            "embeddings",
        ]);
        assert_eq!(
            not_understood(&list),
            [
                "/v1/embedding",
                "/key/generate",
                "management_routes",
                "embeddings"
            ]
        );
    }
}
