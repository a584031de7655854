//! Azure OpenAI deployments (`model: azure/<deployment>`) over real HTTP, against a local server
//! that answers only what Azure's REST reference describes: `POST {endpoint}/openai/deployments/
//! {deployment-id}/chat/completions?api-version=…` (and `/completions`, `/embeddings`), the
//! Responses API at `POST {endpoint}/openai/responses?api-version=…`, keyed with `api-key` or
//! with an Entra ID token as `Authorization: Bearer`. Anything else is Azure's 404 or 401.

use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Response, StatusCode, Uri};
use axum::Router;
use gateway_example::config::GatewayConfig;
use gateway_example::Endpoint;
use integration_tests::gateway::{sse_data, with_master, Gw, MASTER};
use serde_json::{json, Value};

const VERSION: &str = "2024-10-21";
/// An API version from before `stream_options`, which Azure refuses on it.
const OLD_VERSION: &str = "2024-02-01";
const KEY: &str = "azure-key-0123456789";
const TOKEN: &str = "eyJ0eXAiOiJKV1QiLCJhbGciOiJSUzI1NiJ9.entra-id-token";

/// What the server was sent: the path and query, and the model of the body.
type Seen = Arc<Mutex<Vec<(String, Value)>>>;

fn azure_error(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(
            json!({"error": {"code": code, "message": message}}).to_string(),
        ))
        .unwrap()
}

/// Azure's data plane for two deployments: `gpt4o-prod`, keyed with `api-key: KEY`, and
/// `gpt4o-entra`, keyed with `Authorization: Bearer TOKEN`.
async fn azure(
    State(seen): State<Seen>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response<Body> {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    seen.lock()
        .unwrap()
        .push((uri.to_string(), request.clone()));
    let old = uri.query() == Some(&format!("api-version={OLD_VERSION}"));
    if uri.query() != Some(&format!("api-version={VERSION}")) && !old {
        return azure_error(StatusCode::NOT_FOUND, "404", "Resource not found");
    }
    if old && request.get("stream_options").is_some() {
        return azure_error(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "Unrecognized request argument supplied: stream_options",
        );
    }
    let path = uri.path();
    let (deployment, endpoint) = if path == "/openai/responses" {
        (
            request["model"].as_str().unwrap_or_default(),
            Endpoint::Responses,
        )
    } else {
        let Some(rest) = path.strip_prefix("/openai/deployments/") else {
            return azure_error(StatusCode::NOT_FOUND, "404", "Resource not found");
        };
        let Some((deployment, operation)) = rest.split_once('/') else {
            return azure_error(StatusCode::NOT_FOUND, "404", "Resource not found");
        };
        let endpoint = match operation {
            "chat/completions" => Endpoint::ChatCompletions,
            "completions" => Endpoint::Completions,
            "embeddings" => Endpoint::Embeddings,
            _ => return azure_error(StatusCode::NOT_FOUND, "404", "Resource not found"),
        };
        (deployment, endpoint)
    };
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let keyed = match deployment {
        "gpt4o-prod" => header("api-key") == Some(KEY) && header("authorization").is_none(),
        "gpt4o-entra" => {
            header("authorization") == Some(&format!("Bearer {TOKEN}"))
                && header("api-key").is_none()
        }
        _ => {
            return azure_error(
                StatusCode::NOT_FOUND,
                "DeploymentNotFound",
                "The API deployment for this resource does not exist.",
            )
        }
    };
    if !keyed {
        return azure_error(
            StatusCode::UNAUTHORIZED,
            "401",
            "Access denied due to invalid subscription key or wrong API endpoint.",
        );
    }
    let include_usage = request["stream_options"]["include_usage"].as_bool() == Some(true);
    let answer =
        gateway_example::mock::answer(endpoint, deployment, "Hello there", &request, include_usage);
    Response::builder()
        .header("content-type", answer.content_type())
        .body(Body::from(answer.chunks.concat()))
        .unwrap()
}

async fn start() -> (Gw, Seen) {
    let seen = Seen::default();
    let app = Router::new().fallback(azure).with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let yaml = with_master(&format!(
        r#"
model_list:
  - model_name: azure-gpt
    litellm_params: {{model: azure/gpt4o-prod, api_base: "{base}/", api_key: {KEY}, api_version: "{VERSION}", tpm: 100000}}
  - model_name: azure-entra
    litellm_params: {{model: azure/gpt4o-entra, api_base: "{base}", azure_ad_token: {TOKEN}, api_version: "{VERSION}", tpm: 100000}}
  - model_name: azure-old
    litellm_params: {{model: azure/gpt4o-prod, api_base: "{base}", api_key: {KEY}, api_version: "{OLD_VERSION}", tpm: 100000}}
  - model_name: azure-wrong-key
    litellm_params: {{model: azure/gpt4o-prod, api_base: "{base}", api_key: not-the-key, api_version: "{VERSION}"}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
"#
    ));
    (Gw::start(&yaml, None).await, seen)
}

fn body(endpoint: Endpoint, model: &str, stream: bool) -> Value {
    let mut body = match endpoint {
        Endpoint::Embeddings => json!({"input": "The food was delicious."}),
        Endpoint::Completions => json!({"prompt": "Say hello.", "max_tokens": 20}),
        Endpoint::Responses => json!({"input": "Say hello.", "max_output_tokens": 20}),
        _ => json!({"messages": [{"role": "user", "content": "hi"}]}),
    };
    body["model"] = json!(model);
    if stream {
        body["stream"] = json!(true);
    }
    body
}

/// Chat (JSON and streamed), completions, embeddings and responses reach the deployment at the
/// paths, query and key header Azure's reference gives, with either way of keying; each answer is
/// metered as OpenAI's format (30 tokens, embeddings 10) and a stream's usage chunk the client did
/// not ask for is removed.
#[tokio::test]
async fn azure_deployments_are_called_as_azure_documents_them() {
    let (gw, seen) = start().await;
    for model in ["azure-gpt", "azure-entra"] {
        let deployment = if model == "azure-gpt" {
            "gpt4o-prod"
        } else {
            "gpt4o-entra"
        };
        let mut charged = 0;
        for (endpoint, stream, path, tokens) in [
            (
                Endpoint::ChatCompletions,
                false,
                format!("/openai/deployments/{deployment}/chat/completions"),
                30,
            ),
            (
                Endpoint::ChatCompletions,
                true,
                format!("/openai/deployments/{deployment}/chat/completions"),
                30,
            ),
            (
                Endpoint::Completions,
                true,
                format!("/openai/deployments/{deployment}/completions"),
                30,
            ),
            (
                Endpoint::Embeddings,
                false,
                format!("/openai/deployments/{deployment}/embeddings"),
                10,
            ),
            (
                Endpoint::Responses,
                false,
                "/openai/responses".to_owned(),
                30,
            ),
            (
                Endpoint::Responses,
                true,
                "/openai/responses".to_owned(),
                30,
            ),
        ] {
            let r = gw
                .post(
                    &format!("/v1{}", endpoint.path()),
                    Some(MASTER),
                    body(endpoint, model, stream),
                )
                .await;
            assert_eq!(r.status, 200, "{model} {endpoint:?}: {}", r.text());
            let (sent, sent_body) = seen.lock().unwrap().last().cloned().unwrap();
            assert_eq!(
                sent,
                format!("{path}?api-version={VERSION}"),
                "{model} {endpoint:?}"
            );
            assert_eq!(sent_body["model"], deployment, "the deployment's name");
            if stream && endpoint != Endpoint::Responses {
                assert_eq!(sent_body["stream_options"]["include_usage"], true);
                assert!(
                    sse_data(r.text())
                        .iter()
                        .all(|d| !d.contains("\"usage\":{")),
                    "{}",
                    r.text()
                );
            }
            charged += tokens;
            assert_eq!(gw.tokens(model), charged, "{model} {endpoint:?}");
        }
    }
    // A wrong key is Azure's own 401, passed on.
    let r = gw
        .post(
            "/v1/chat/completions",
            Some(MASTER),
            body(Endpoint::ChatCompletions, "azure-wrong-key", false),
        )
        .await;
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "401");
    // Azure deployments speak the OpenAI format only.
    let r = gw
        .post("/v1/messages", Some(MASTER), json!({"model": "azure-gpt", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}))
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
}

/// An Azure entry needs `api_version` and one key, and its names must fit in a URL; its Azure
/// keys are honoured, not warned about.
#[test]
fn azure_entries_are_checked_at_start() {
    let load = |params: &str| {
        GatewayConfig::from_yaml_str_with_env(
            &format!("model_list:\n  - model_name: a\n    litellm_params: {{{params}}}\n"),
            |_| None,
        )
        .map_err(|e| e.to_string())
    };
    let ok = load("model: azure/prod, api_base: \"https://r.openai.azure.com\", api_key: k, api_version: \"2024-10-21\"").unwrap();
    assert_eq!(ok.unsupported_warning(), None);
    for (params, error) in [
        (
            "model: azure/prod, api_base: \"https://r.openai.azure.com\", api_key: k",
            "model_list[0].litellm_params: missing api_version, which azure/ models need (e.g. \"2024-10-21\")",
        ),
        (
            "model: azure/prod, api_base: \"https://r.openai.azure.com\", api_key: k, azure_ad_token: t, api_version: \"2024-10-21\"",
            "model_list[0].litellm_params.azure_ad_token: give api_key or azure_ad_token, not both",
        ),
        (
            "model: azure/prod, api_base: \"https://r.openai.azure.com\", api_key: k, api_version: \"2024 10 21\"",
            "model_list[0].litellm_params.api_version: expected an Azure API version such as \"2024-10-21\", got \"2024 10 21\"",
        ),
        (
            "model: azure/a?b, api_base: \"https://r.openai.azure.com\", api_key: k, api_version: \"2024-10-21\"",
            "model_list[0].litellm_params.model: the Azure deployment name \"a?b\" may hold only letters, digits, -, _ and .",
        ),
        (
            "model: azure/prod, api_key: k, api_version: \"2024-10-21\"",
            "model_list[0].litellm_params.model: provider \"azure\" needs an api_base (this gateway speaks the OpenAI API, and Anthropic's for anthropic/ models)",
        ),
    ] {
        assert_eq!(load(params).unwrap_err(), error, "{params}");
    }
    // `api_version` elsewhere is not read, and said so.
    let other = load("model: openai/x, api_key: k, api_version: \"2024-10-21\"").unwrap();
    assert_eq!(
        other.unsupported_warning().as_deref(),
        Some("config keys this gateway does not honour: not supported, ignored: model_list[0].litellm_params.api_version")
    );
}

/// An Azure API version from before `stream_options` (`2024-02-01`, which Azure answers 400
/// "Unrecognized request argument supplied: stream_options") is not asked for a stream's usage:
/// chat and completions streams are served and metered from their text. Before, every stream to
/// it was refused.
#[tokio::test]
async fn an_azure_version_before_stream_options_is_not_sent_them() {
    let (gw, seen) = start().await;
    for endpoint in [Endpoint::ChatCompletions, Endpoint::Completions] {
        let before = gw.tokens("azure-old");
        let r = gw
            .post(
                &format!("/v1{}", endpoint.path()),
                Some(MASTER),
                body(endpoint, "azure-old", true),
            )
            .await;
        assert_eq!(r.status, 200, "{endpoint:?}: {}", r.text());
        assert!(r.text().contains("Hel"), "{}", r.text());
        let (sent, sent_body) = seen.lock().unwrap().last().cloned().unwrap();
        assert!(
            sent.ends_with(&format!("?api-version={OLD_VERSION}")),
            "{sent}"
        );
        assert_eq!(sent_body.get("stream_options"), None, "{sent_body}");
        assert!(gw.tokens("azure-old") > before, "the stream was metered");
    }
    let version = |v: &str| gateway_example::config::Azure {
        api_version: v.into(),
        ad_token: None,
    };
    for (v, takes) in [
        ("2024-02-01", false),
        ("2024-08-01-preview", false),
        ("2024-09-01-preview", true),
        ("2024-10-21", true),
        ("2025-04-01-preview", true),
        ("v1", true),
        ("preview", true),
    ] {
        assert_eq!(version(v).takes_stream_options(), takes, "{v}");
    }
}
