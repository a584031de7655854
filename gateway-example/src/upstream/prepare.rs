//! What every request to one deployment carries, worked out once when the gateway starts: the
//! URL of each endpoint (OpenAI's, Anthropic's or Azure's form), the key as a header, the
//! connection settings and the proxy.

use std::sync::Arc;

use http::header::{ACCEPT_ENCODING, AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderMap, HeaderName, HeaderValue};
use upstream_client::{ConnectionSettings, Route};

use crate::config::{Api, Azure, Deployment, ProxySetting, Target};
use crate::endpoint::Endpoint;
use crate::shared::redact::redact_url;

/// The `anthropic-version` sent to Anthropic deployments when the client sends none.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// What [`Upstream::forward`](super::Upstream::forward) sends to one deployment that is the same for every request, worked
/// out once when the gateway starts (a deployment's target cannot change without a restart): the
/// route of each endpoint and the deployment's key as a header. `Debug` shows nothing of it.
pub(super) struct Prepared {
    /// The deployment's id, checked on use.
    pub(super) id: String,
    /// The format it speaks.
    pub(super) api: Api,
    /// By the endpoint's position in [`Endpoint::ALL`]; the URL
    /// (redacted) when it does not parse, for the error its requests get.
    pub(super) routes: Vec<Result<Route, String>>,
    /// The deployment's group, for the messages of the bodies it answers (shared, not copied
    /// into each).
    pub(super) model_name: Arc<str>,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared").finish_non_exhaustive()
    }
}

impl Prepared {
    /// `None` for a deployment without an upstream (`mock_response`).
    pub(super) fn new(deployment: &Deployment) -> Option<Self> {
        let Target::Upstream {
            api_base,
            api_key,
            api,
            azure,
        } = &deployment.target
        else {
            return None;
        };
        // What every request to the deployment carries, written once into each route.
        let mut headers = HeaderMap::with_capacity(4);
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        // Compressed bytes could not be metered; one that answers encoded anyway is decoded.
        headers.insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        // Keys that cannot be a header value are refused when the config is loaded.
        let azure_token = azure.as_ref().and_then(|a| a.ad_token.as_ref());
        let key = match (api_key, azure_token) {
            (Some(key), _) => Some((key, false)),
            // Azure's Entra ID token, as a bearer token.
            (None, Some(token)) => Some((token, true)),
            (None, None) => None,
        };
        let key = key.and_then(|(key, token)| {
            let (name, value) = match (api, azure.is_some() && !token) {
                (_, true) => (HeaderName::from_static("api-key"), key.clone()),
                (Api::OpenAi, false) => (AUTHORIZATION, format!("Bearer {key}")),
                (Api::Anthropic, false) => (HeaderName::from_static("x-api-key"), key.clone()),
            };
            let mut value = HeaderValue::try_from(value).ok()?;
            value.set_sensitive(true);
            Some((name, value))
        });
        if let Some((name, value)) = key {
            headers.insert(name, value);
        }
        if *api == Api::Anthropic {
            headers.insert(
                HeaderName::from_static("anthropic-version"),
                HeaderValue::from_static(ANTHROPIC_VERSION),
            );
        }
        // A deployment with settings of its own has a pool of its own, shared by its routes.
        let settings = deployment.connections.is_set().then(|| {
            let own = &deployment.connections;
            let mut settings = ConnectionSettings::default().named(deployment.id.clone());
            if let Some(n) = own.max_connections {
                settings = settings.max_connections(n);
            }
            if let Some(n) = own.max_idle {
                settings = settings.max_idle(n);
            }
            if let Some(timeout) = own.connect_timeout {
                settings = settings.connect_timeout(timeout);
            }
            if let Some(tls) = &own.tls {
                settings = settings.tls(tls.clone());
            }
            Arc::new(settings)
        });
        let routes = Endpoint::ALL
            .iter()
            .map(|&e| {
                let url = with_query(api_base, |base| match azure {
                    Some(azure) => azure_url(base, azure, &deployment.upstream_model, e),
                    None => upstream_url(base, *api, e),
                });
                url.parse()
                    .ok()
                    .and_then(|u| Route::new(u).ok())
                    .map(|route| {
                        let mut route = route.with_headers(&headers);
                        if let Some(settings) = &settings {
                            route = route.with_settings(Arc::clone(settings));
                        }
                        match &deployment.proxy {
                            ProxySetting::FromEnvironment => route,
                            ProxySetting::Direct => route.with_proxy(None),
                            ProxySetting::Via(proxy) => route.with_proxy(Some(proxy.clone())),
                        }
                    })
                    .ok_or_else(|| redact_url(&url))
            })
            .collect();
        Some(Self {
            model_name: deployment.model_name.as_str().into(),
            id: deployment.id.clone(),
            api: *api,
            routes,
        })
    }

    /// The route of `endpoint`, or the URL (redacted) that did not parse.
    pub(super) fn route(&self, endpoint: Endpoint) -> Result<&Route, &str> {
        let at = Endpoint::ALL
            .iter()
            .position(|&e| e == endpoint)
            .unwrap_or_default();
        self.routes[at].as_ref().map_err(String::as_str)
    }
}

/// The URL `url_of` makes of `api_base`'s scheme, host and path, with `api_base`'s query (an
/// `?subscription-key=…` a gateway in front of the upstream asks for) after it: the endpoint's
/// path goes before the query, not into it.
fn with_query(api_base: &str, url_of: impl Fn(&str) -> String) -> String {
    let Some((base, query)) = api_base.split_once('?') else {
        return url_of(api_base);
    };
    let url = url_of(base.trim_end_matches('/'));
    match (url.contains('?'), query.is_empty()) {
        (_, true) => url,
        (true, false) => format!("{url}&{query}"),
        (false, false) => format!("{url}?{query}"),
    }
}

/// Where `chat` goes on an upstream at `api_base` speaking `api`: `{api_base}/chat/completions` and
/// the like for OpenAI; `{api_base}/v1/messages` for Anthropic (an `api_base` already ending in
/// `/v1` or `/v1/messages` is not given them twice).
fn upstream_url(api_base: &str, api: Api, endpoint: Endpoint) -> String {
    match api {
        Api::OpenAi => format!("{api_base}{}", endpoint.path()),
        Api::Anthropic if api_base.ends_with("/v1/messages") => api_base.to_owned(),
        Api::Anthropic if api_base.ends_with("/v1") => format!("{api_base}/messages"),
        Api::Anthropic => format!("{api_base}/v1/messages"),
    }
}

/// Where `endpoint` goes on the Azure OpenAI deployment `deployment` at `api_base`, as Azure's
/// REST reference has it: `{api_base}/openai/deployments/{deployment}/chat/completions` (and
/// `/completions`, `/embeddings`), the Responses API at `{api_base}/openai/responses` (its
/// deployment is the body's `model`), each with `?api-version=`. (Config checks both names are
/// URL-safe.)
fn azure_url(api_base: &str, azure: &Azure, deployment: &str, endpoint: Endpoint) -> String {
    let version = &azure.api_version;
    match endpoint {
        Endpoint::Responses => {
            format!("{api_base}/openai/responses?api-version={version}")
        }
        _ => format!(
            "{api_base}/openai/deployments/{deployment}{}?api-version={version}",
            endpoint.path()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `api_base` with a query keeps it after the endpoint's path, Azure's `api-version`
    /// beside it; without one nothing changes.
    #[test]
    fn an_api_base_s_query_goes_after_the_path() {
        let openai = |base: &str| {
            with_query(base, |b| {
                upstream_url(b, Api::OpenAi, Endpoint::ChatCompletions)
            })
        };
        assert_eq!(
            openai("http://h/v1?subscription-key=K"),
            "http://h/v1/chat/completions?subscription-key=K"
        );
        assert_eq!(
            openai("http://h/v1/?code=C&x=1"),
            "http://h/v1/chat/completions?code=C&x=1"
        );
        assert_eq!(openai("http://h/v1"), "http://h/v1/chat/completions");
        assert_eq!(
            with_query("http://h?x-api-key=K", |b| upstream_url(
                b,
                Api::Anthropic,
                Endpoint::Messages
            )),
            "http://h/v1/messages?x-api-key=K"
        );
        let azure = Azure {
            api_version: "2024-10-21".into(),
            ad_token: None,
        };
        assert_eq!(
            with_query("http://h/?sig=S", |b| azure_url(
                b,
                &azure,
                "dep",
                Endpoint::ChatCompletions
            )),
            "http://h/openai/deployments/dep/chat/completions?api-version=2024-10-21&sig=S"
        );
    }
}
