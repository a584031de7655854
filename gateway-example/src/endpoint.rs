//! The LLM APIs the gateway serves ([`Endpoint`]) and the wire formats its deployments speak
//! ([`Api`]). The gateway passes bodies through; it does not translate between formats, so an
//! endpoint is served only by deployments that speak its format.

use std::borrow::Cow;

/// The wire format a deployment speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// OpenAI's: chat completions, embeddings, completions and the Responses API, under one
    /// `api_base` (`{api_base}/chat/completions`, ...), keyed with `Authorization: Bearer`.
    OpenAi,
    /// Anthropic's Messages API (`{api_base}/v1/messages`), keyed with `x-api-key` and versioned
    /// with `anthropic-version`.
    Anthropic,
}

impl Api {
    /// The format's name, for error messages.
    pub fn name(self) -> &'static str {
        match self {
            Api::OpenAi => "the OpenAI API",
            Api::Anthropic => "Anthropic's Messages API",
        }
    }
}

/// One endpoint LLM clients call, served at its path with and without the `/v1` prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`.
    ChatCompletions,
    /// `POST /v1/embeddings`: prompt tokens only, never streamed.
    Embeddings,
    /// `POST /v1/completions` (legacy text completions).
    Completions,
    /// `POST /v1/responses` (OpenAI's Responses API, streamed as typed events).
    Responses,
    /// `POST /v1/messages` (Anthropic's Messages API).
    Messages,
}

/// The deployment and endpoint of Azure OpenAI's path, `/openai/deployments/{deployment}/` then
/// `chat/completions`, `completions` or `embeddings` (what the `AzureOpenAI` clients of the
/// OpenAI SDKs call, `api-version` in the query); `None` for any other path. The deployment is
/// percent-decoded: the SDKs send a name with a `/` (`openai/gpt-4o`) as `openai%2Fgpt-4o`.
pub fn azure_deployment(path: &str) -> Option<(Cow<'_, str>, Endpoint)> {
    let rest = path.strip_prefix("/openai/deployments/")?;
    let (deployment, endpoint) = rest.split_once('/')?;
    let endpoint = match endpoint {
        "chat/completions" => Endpoint::ChatCompletions,
        "completions" => Endpoint::Completions,
        "embeddings" => Endpoint::Embeddings,
        _ => return None,
    };
    let deployment = percent_encoding::percent_decode_str(deployment).decode_utf8_lossy();
    (!deployment.is_empty()).then_some((deployment, endpoint))
}

impl Endpoint {
    /// Every endpoint.
    pub const ALL: [Endpoint; 5] = [
        Endpoint::ChatCompletions,
        Endpoint::Embeddings,
        Endpoint::Completions,
        Endpoint::Responses,
        Endpoint::Messages,
    ];

    /// The paths served for every endpoint: each with and without the `/v1` prefix.
    pub fn served_paths() -> impl Iterator<Item = String> {
        Self::ALL
            .into_iter()
            .flat_map(|e| [e.path().to_owned(), format!("/v1{}", e.path())])
    }

    /// The path after `/v1` (and after an OpenAI `api_base`, which ends in `/v1`).
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "/chat/completions",
            Endpoint::Embeddings => "/embeddings",
            Endpoint::Completions => "/completions",
            Endpoint::Responses => "/responses",
            Endpoint::Messages => "/messages",
        }
    }

    /// The endpoint served at `path` (`/v1/embeddings` or `/embeddings`, ...), also Azure
    /// OpenAI's form that the `AzureOpenAI` clients call (`azure_deployment`).
    pub fn from_path(path: &str) -> Option<Self> {
        let plain = path.strip_prefix("/v1").unwrap_or(path);
        Self::ALL
            .into_iter()
            .find(|e| e.path() == plain)
            .or_else(|| azure_deployment(path).map(|(_, endpoint)| endpoint))
    }

    /// The format its requests and responses are in.
    pub fn api(self) -> Api {
        match self {
            Endpoint::Messages => Api::Anthropic,
            _ => Api::OpenAi,
        }
    }

    /// Whether `"stream": true` asks for an event stream (embeddings never stream).
    pub fn streams(self) -> bool {
        self != Endpoint::Embeddings
    }

    /// Whether a stream reports usage only when asked (`stream_options.include_usage`): the gateway
    /// asks for it, to meter the stream, and removes it again when the client did not. The
    /// Responses API and Anthropic always report it.
    pub fn asks_stream_usage(self) -> bool {
        matches!(self, Endpoint::ChatCompletions | Endpoint::Completions)
    }

    /// The body field the endpoint cannot do without, and whether it must be a list: chat and
    /// messages' `messages`, embeddings' `input`, completions' `prompt`. The Responses API needs
    /// none (`input` may be left out when `previous_response_id` carries the conversation).
    pub fn required_field(self) -> Option<(&'static str, bool)> {
        match self {
            Endpoint::ChatCompletions | Endpoint::Messages => Some(("messages", true)),
            Endpoint::Embeddings => Some(("input", false)),
            Endpoint::Completions => Some(("prompt", false)),
            Endpoint::Responses => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_with_and_without_v1() {
        for e in Endpoint::ALL {
            assert_eq!(Endpoint::from_path(e.path()), Some(e));
            assert_eq!(Endpoint::from_path(&format!("/v1{}", e.path())), Some(e));
        }
        assert_eq!(
            Endpoint::from_path("/openai/deployments/gpt-4o/chat/completions"),
            Some(Endpoint::ChatCompletions)
        );
        assert_eq!(
            azure_deployment("/openai/deployments/ada/embeddings"),
            Some(("ada".into(), Endpoint::Embeddings))
        );
        assert_eq!(
            azure_deployment("/openai/deployments/openai%2Fgpt-4o/chat/completions"),
            Some(("openai/gpt-4o".into(), Endpoint::ChatCompletions)),
            "a name with a `/`, as the SDKs encode it"
        );
        for not_azure in [
            "/openai/deployments//chat/completions",
            "/openai/deployments/x/responses",
            "/openai/deployments/x",
            "/v1/openai/deployments/x/embeddings",
        ] {
            assert_eq!(Endpoint::from_path(not_azure), None, "{not_azure}");
        }
        assert_eq!(Endpoint::from_path("/v1/models"), None);
        assert_eq!(Endpoint::from_path("/v1/v1/embeddings"), None);
        assert_eq!(Endpoint::from_path("/v2/embeddings"), None);
    }
}
