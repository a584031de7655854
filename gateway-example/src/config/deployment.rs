//! One `model_list` entry: its upstream or mock answer, timeouts, id and per-deployment limits.

use std::path::Path;
use std::time::Duration;

use tower_priority_limit::caller::Prices;
use tower_priority_limit::config::ConfigError;
use upstream_client::{Tls, TlsError, Verify};

use crate::shared::node::Node;

use super::{
    seconds, Api, Azure, Deployment, ProxySetting, Target, UpstreamConnections, ANTHROPIC_API_BASE,
    OPENAI_API_BASE,
};

/// What a deployment without its own takes: the timeouts, `router_settings.timeout` (else
/// `litellm_settings.request_timeout`, else [`DEFAULT_TIMEOUT`](super::DEFAULT_TIMEOUT)) and
/// `router_settings.stream_timeout` (else the deployment's own `timeout`); and how its `https`
/// upstream is verified, `litellm_settings.ssl_verify` and `ssl_certificate` (LiteLLM's
/// proxy-wide settings); and its pool's bounds, `router_settings.max_upstream_connections`,
/// `max_idle_upstream_connections` and `connect_timeout` (ours): read where they are, so an
/// error names the key that holds the value.
#[derive(Clone)]
pub(super) struct Defaults<'d> {
    pub(super) timeout: Duration,
    pub(super) stream_timeout: Option<Duration>,
    pub(super) ssl_verify: Option<Node<'d>>,
    pub(super) ssl_certificate: Option<Node<'d>>,
    /// `router_settings`' pool keys, each by its name in [`POOL_KEYS`].
    pub(super) pool: [Option<Node<'d>>; 3],
    /// The environment, for a provider's key when a deployment gives none (as LiteLLM reads
    /// `OPENAI_API_KEY`, `ANTHROPIC_API_KEY`, `AZURE_API_KEY`), and the TLS variables
    /// ([`TLS_VARIABLES`]).
    pub(super) env: &'d dyn Fn(&str) -> Option<String>,
    /// TLS settings loaded so far, by what they were loaded from: deployments that share them
    /// (every https one, with `SSL_CERT_FILE` set) read their files once.
    pub(super) loaded_tls: std::cell::RefCell<Vec<Tls>>,
}

/// The environment variable LiteLLM reads a provider's key from when a deployment gives none:
/// for the providers this gateway speaks to by their own API.
fn provider_key_variable(provider: Option<&str>) -> Option<&'static str> {
    match provider {
        None | Some("openai") => Some("OPENAI_API_KEY"),
        Some("anthropic") => Some("ANTHROPIC_API_KEY"),
        Some("azure") => Some("AZURE_API_KEY"),
        _ => None,
    }
}

/// LiteLLM's providers that are OpenAI-compatible APIs (called at `{api_base}/chat/completions`
/// and the like, as this gateway calls every provider but Anthropic and Azure).
const OPENAI_COMPATIBLE: &[&str] = &[
    "openai",
    "text-completion-openai",
    "custom_openai",
    "hosted_vllm",
    "litellm_proxy",
    "lm_studio",
    "llamafile",
    "deepseek",
    "groq",
    "together_ai",
    "fireworks_ai",
    "mistral",
    "perplexity",
    "deepinfra",
    "openrouter",
    "xai",
    "nvidia_nim",
    "cerebras",
    "anyscale",
    "sambanova",
    "github",
];

/// The warning for an upstream deployment of `provider` that LiteLLM calls in a format of its
/// own (`ollama`, `gemini`, `bedrock`…), which this gateway calls as an OpenAI-compatible API
/// at `api_base` (`None`: a provider it speaks, or one that is OpenAI-compatible).
fn provider_warning(path: &str, provider: Option<&str>, api_base: &str) -> Option<String> {
    let provider = provider?;
    if matches!(provider, "anthropic" | "azure") || OPENAI_COMPATIBLE.contains(&provider) {
        return None;
    }
    Some(format!(
        "{path}: provider \"{provider}\" is called as an OpenAI-compatible API at \
         {api_base}/chat/completions (and /embeddings, /completions, /responses), not in \
         {provider}'s own format as LiteLLM calls it: point api_base at its OpenAI-compatible \
         endpoint (Ollama's is http://HOST:11434/v1) and write the model as openai/NAME to say so"
    ))
}

/// The keys of a deployment's pool bounds, in `litellm_params` or as `router_settings`'
/// defaults for every deployment with an upstream.
pub(super) const POOL_KEYS: [&str; 3] = [
    "max_upstream_connections",
    "max_idle_upstream_connections",
    "connect_timeout",
];

pub(super) fn deployment(
    item: &Node<'_>,
    position: usize,
    defaults: &Defaults<'_>,
) -> Result<Deployment, ConfigError> {
    let name_node = item
        .get("model_name")?
        .ok_or_else(|| item.error("missing model_name"))?;
    let model_name = name_node.string()?;
    let params = item
        .get("litellm_params")?
        .ok_or_else(|| item.error("missing litellm_params"))?;
    let model_node = params
        .get("model")?
        .ok_or_else(|| params.error("missing model (e.g. openai/gpt-4o)"))?;
    let model = model_node.string()?;
    let (provider, upstream_model) = match model.split_once('/') {
        Some((provider, rest)) if !rest.is_empty() => (Some(provider.to_owned()), rest.to_owned()),
        _ => (None, model.clone()),
    };
    wildcard_forms(&model_name, &model, provider.as_deref(), &model_node)?;
    let timeout = match params.get("timeout")? {
        Some(t) => seconds(&t)?,
        None => defaults.timeout,
    };
    let stream_timeout = match params.get("stream_timeout")? {
        Some(t) => seconds(&t)?,
        None => defaults.stream_timeout.unwrap_or(timeout),
    };
    let api = match provider.as_deref() {
        Some("anthropic") => Api::Anthropic,
        _ => Api::OpenAi,
    };
    let target = if let Some(mock) = params.get("mock_response")? {
        Target::Mock {
            content: mock.string()?,
        }
    } else {
        let api_base = match params.get("api_base")? {
            Some(base) => {
                let base = base.string()?;
                if !(base.starts_with("http://") || base.starts_with("https://")) {
                    return Err(ConfigError::new(
                        format!("{}.api_base", params.path()),
                        format!("expected an http:// or https:// URL, got \"{base}\""),
                    ));
                }
                base.trim_end_matches('/').to_owned()
            }
            None if provider.as_deref().is_none_or(|p| p == "openai") => OPENAI_API_BASE.to_owned(),
            None if api == Api::Anthropic => ANTHROPIC_API_BASE.to_owned(),
            None => {
                return Err(ConfigError::new(
                    format!("{}.model", params.path()),
                    format!(
                        "provider \"{}\" needs an api_base (this gateway speaks the OpenAI API, \
                         and Anthropic's for anthropic/ models)",
                        provider.unwrap_or_default()
                    ),
                ))
            }
        };
        let api_key = match params.get("api_key")? {
            Some(node) => {
                let key = node.string()?;
                // Sent as a header: refused here rather than failing every request (the key
                // itself is not shown).
                if http::HeaderValue::from_str(&key).is_err() {
                    return Err(node.error(
                        "not usable in a header: it holds a control character (a trailing \
                         newline?)",
                    ));
                }
                Some(key)
            }
            // As LiteLLM: the provider's key from the environment (not for an `azure/` entry
            // keyed by `azure_ad_token`, which a key beside would contradict).
            None if params.get("azure_ad_token")?.is_none() => {
                match provider_key_variable(provider.as_deref()) {
                    Some(name) => match (defaults.env)(name).map(|k| k.trim().to_owned()) {
                        Some(key) if key.is_empty() => None,
                        Some(key) if http::HeaderValue::from_str(&key).is_err() => {
                            return Err(params.error(format!(
                                "no api_key, and {name} is not usable in a header: it holds a \
                                 control character"
                            )))
                        }
                        key => key,
                    },
                    None => None,
                }
            }
            None => None,
        };
        let azure = match provider.as_deref() {
            Some("azure") => Some(azure(&params, &upstream_model, api_key.is_some())?),
            _ => None,
        };
        let base = crate::shared::redact::redact_url(&api_base);
        if let Some(warning) = provider_warning(&model_node.path(), provider.as_deref(), &base) {
            tracing::warn!("{warning}");
        }
        Target::Upstream {
            api_base,
            api_key,
            api,
            azure,
        }
    };
    // Read as the limiter reads the group's: wherever LiteLLM reads them.
    let rpm = crate::shared::node::deployment_limit(item, "rpm")?;
    let tpm = crate::shared::node::deployment_limit(item, "tpm")?;
    let prices = Prices {
        input: price(item, "input_cost_per_token")?.unwrap_or(0.0),
        output: price(item, "output_cost_per_token")?.unwrap_or(0.0),
        // LiteLLM's prompt-cache prices (Anthropic's and OpenAI's cached tokens); unset, such
        // tokens cost the input price.
        cache_read: price(item, "cache_read_input_token_cost")?,
        cache_write: price(item, "cache_creation_input_token_cost")?,
    };
    let weight = match params.get("weight")? {
        Some(w) => {
            let v = w.number()?;
            if !(v.is_finite() && v >= 0.0) {
                return Err(w.error(format!("expected a weight ≥ 0, got {v}")));
            }
            Some(v)
        }
        None => None,
    };
    let proxy = match params.get("proxy")? {
        None => ProxySetting::FromEnvironment,
        Some(node) => match node.string()?.trim() {
            "" => ProxySetting::Direct,
            url => ProxySetting::Via(
                upstream_client::Proxy::parse(url, &node.path())
                    .map_err(|e| node.error(e.reason))?,
            ),
        },
    };
    let connections = connections(&params, &target, defaults)?;
    let id = match item.get("model_info")? {
        Some(info) => match info.get("id")? {
            Some(node) => {
                let id = node.string()?;
                tower_priority_limit::config::check_name(&id, &node.path())?;
                Some(id)
            }
            None => None,
        },
        None => None,
    }
    .unwrap_or_else(|| derived_id(position, &model_name, &model, &target));
    Ok(Deployment {
        model_name,
        model,
        upstream_model,
        target,
        timeout,
        stream_timeout,
        id,
        rpm,
        tpm,
        weight,
        proxy,
        connections,
        prices,
    })
}

/// A price per token in dollars, `key` in `model_info` or `litellm_params` (LiteLLM reads both;
/// written in both, they must agree), as nano-dollars; `None` where unset.
fn price(item: &Node<'_>, key: &str) -> Result<Option<f64>, ConfigError> {
    let mut found: Option<(f64, String)> = None;
    for place in ["model_info", "litellm_params"] {
        let Some(holder) = item.get(place)? else {
            continue;
        };
        let Some(node) = holder.get(key)? else {
            continue;
        };
        let dollars = node.number()?;
        if !(dollars.is_finite() && (0.0..=1.0).contains(&dollars)) {
            return Err(node.error(format!(
                "expected a price per token in dollars between 0 and 1, got {dollars}"
            )));
        }
        match &found {
            Some((first, path)) if *first != dollars => {
                return Err(node.error(format!(
                    "{dollars} disagrees with {path}: {first} (write the price once)"
                )))
            }
            Some(_) => {}
            None => found = Some((dollars, node.path())),
        }
    }
    Ok(found.map(|(dollars, _)| dollars * 1e9))
}

/// The most connections a deployment may bound its upstream's to (a guard against a typo's
/// extra zeros, far above what one upstream takes).
const MAX_UPSTREAM_CONNECTIONS: u64 = 100_000;

/// `max_upstream_connections`, `max_idle_upstream_connections`, `connect_timeout`, `ssl_verify`
/// and `ssl_certificate` of an entry's `litellm_params` (the first three else
/// `router_settings`', the last two else `litellm_settings`'); refused on an entry without an
/// upstream when it sets them itself (the defaults are for entries with one), the TLS ones on
/// an `http://` upstream (they would do nothing).
fn connections(
    params: &Node<'_>,
    target: &Target,
    defaults: &Defaults<'_>,
) -> Result<UpstreamConnections, ConfigError> {
    let own = [
        params.get(POOL_KEYS[0])?,
        params.get(POOL_KEYS[1])?,
        params.get(POOL_KEYS[2])?,
    ];
    let ssl_verify = params.get("ssl_verify")?;
    let ssl_certificate = params.get("ssl_certificate")?;
    if let Target::Mock { .. } = target {
        let mut set = own
            .iter()
            .flatten()
            .chain(&ssl_verify)
            .chain(&ssl_certificate);
        if let Some(node) = set.next() {
            return Err(node.error("a mock_response deployment has no upstream to connect to"));
        }
        return Ok(UpstreamConnections::default());
    }
    let https = target.is_https();
    // Each the deployment's own, else `router_settings`'.
    let [max, idle, timeout] = own;
    let [default_max, default_idle, default_timeout] = &defaults.pool;
    let bounds = pool_bounds(
        max.as_ref().or(default_max.as_ref()),
        idle.as_ref().or(default_idle.as_ref()),
        timeout.as_ref().or(default_timeout.as_ref()),
    )?;
    if !https {
        if let Some(node) = ssl_verify.as_ref().or(ssl_certificate.as_ref()) {
            return Err(node.error(
                "TLS settings apply to an https:// api_base; this deployment's is http://",
            ));
        }
    }
    let tls = match https {
        true => tls_of(
            ssl_verify.as_ref(),
            ssl_certificate.as_ref(),
            defaults,
            params,
        )?,
        false => None,
    };
    Ok(UpstreamConnections { tls, ..bounds })
}

/// The environment variables LiteLLM reads its TLS settings from, over `litellm_settings`':
/// `SSL_VERIFY` (`true`, `false` or a CA bundle's path), `SSL_CERT_FILE` (the CA bundle that
/// `true` verifies against instead of the built-in roots) and `SSL_CERTIFICATE` (a client
/// certificate with its key).
pub(super) const TLS_VARIABLES: [&str; 3] = ["SSL_VERIFY", "SSL_CERT_FILE", "SSL_CERTIFICATE"];

/// The TLS settings of an `https` deployment with `own_verify` and `own_certificate` (its
/// `litellm_params`' or, for the check at start, none): its own, else the environment's
/// ([`TLS_VARIABLES`]), else `litellm_settings`'; `true` is the `SSL_CERT_FILE` bundle where
/// that is set. `None`: the config sets none for it (the upstream client's default: the
/// environment's, [`environment_tls`], else the built-in roots). An error names where the
/// setting at fault was read: its key, or its variable.
pub(super) fn tls_of(
    own_verify: Option<&Node<'_>>,
    own_certificate: Option<&Node<'_>>,
    defaults: &Defaults<'_>,
    parent: &Node<'_>,
) -> Result<Option<Tls>, ConfigError> {
    // Set by the environment alone: the upstream client's own default ([`environment_tls`]),
    // so deployments keep sharing its connections per upstream.
    let set_in_config = own_verify.is_some()
        || own_certificate.is_some()
        || defaults.ssl_verify.is_some()
        || defaults.ssl_certificate.is_some();
    if !set_in_config {
        return Ok(None);
    }
    tls_read(own_verify, own_certificate, defaults, parent)
}

/// What the TLS variables alone ([`TLS_VARIABLES`]) say, for every `https` deployment whose
/// config sets neither `ssl_verify` nor `ssl_certificate` (itself or in `litellm_settings`):
/// the upstream client's default, `None` when no variable is set. An error names the variable.
pub(super) fn environment_tls(
    defaults: &Defaults<'_>,
    parent: &Node<'_>,
) -> Result<Option<Tls>, ConfigError> {
    let alone = Defaults {
        ssl_verify: None,
        ssl_certificate: None,
        ..defaults.clone()
    };
    tls_read(None, None, &alone, parent)
}

/// [`tls_of`]'s reading, wherever the settings are.
fn tls_read(
    own_verify: Option<&Node<'_>>,
    own_certificate: Option<&Node<'_>>,
    defaults: &Defaults<'_>,
    parent: &Node<'_>,
) -> Result<Option<Tls>, ConfigError> {
    let env = |name: &'static str| {
        (defaults.env)(name)
            .filter(|v| !v.trim().is_empty())
            .map(|v| (name, v))
    };
    let [verify_var, cert_file_var, certificate_var] = TLS_VARIABLES.map(env);
    // As httpx reads it: only a file (a directory, or nothing there, is passed over; the
    // config's reading says so once: `warn_unread_cert_file`).
    let cert_file_var = cert_file_var.filter(|(_, path)| Path::new(path.trim()).is_file());
    // Each setting with where it was read.
    let (mut verify, mut verify_from) = match (own_verify, &verify_var) {
        (Some(node), _) => (Some(verify(node)?), Some(From::Key(node))),
        (None, Some((name, text))) => {
            let v = verify_text(text).ok_or_else(|| {
                parent.error(format!(
                    "the {name} environment variable: expected true, false or the path of a \
                     PEM CA bundle"
                ))
            })?;
            (Some(v), Some(From::Variable(name)))
        }
        (None, None) => match defaults.ssl_verify.as_ref() {
            Some(node) => (Some(verify(node)?), Some(From::Key(node))),
            None => (None, None),
        },
    };
    if let (None | Some(Verify::Mozilla), Some((name, path))) = (&verify, &cert_file_var) {
        verify = Some(Verify::CaBundle(path.trim().into()));
        verify_from = Some(From::Variable(name));
    }
    let (certificate, certificate_from) = match (own_certificate, &certificate_var) {
        (Some(node), _) => (Some(node.string()?.into()), Some(From::Key(node))),
        (None, Some((name, path))) => (Some(path.trim().into()), Some(From::Variable(name))),
        (None, None) => match defaults.ssl_certificate.as_ref() {
            Some(node) => (Some(node.string()?.into()), Some(From::Key(node))),
            None => (None, None),
        },
    };
    if verify.is_none() && certificate.is_none() {
        return Ok(None);
    }
    let ca = match &verify {
        Some(Verify::CaBundle(path)) => Some(path.clone()),
        _ => None,
    };
    let certificate: Option<std::path::PathBuf> = certificate;
    let verify = verify.unwrap_or(Verify::Mozilla);
    let loaded = defaults
        .loaded_tls
        .borrow()
        .iter()
        .find(|t| t.is(&verify, certificate.as_deref()))
        .cloned();
    if let Some(tls) = loaded {
        return Ok(Some(tls));
    }
    Tls::load(verify, certificate)
        .map(|tls| {
            defaults.loaded_tls.borrow_mut().push(tls.clone());
            Some(tls)
        })
        .map_err(|e| {
            let at = match &e {
                TlsError::Read(path, _)
                | TlsError::NoCertificate(path)
                | TlsError::NoAnchor(path)
                    if ca.as_ref() == Some(path) =>
                {
                    verify_from
                }
                _ => certificate_from.or(verify_from),
            };
            match at {
                Some(From::Key(node)) => node.error(e.to_string()),
                Some(From::Variable(name)) => {
                    parent.error(format!("the {name} environment variable: {e}"))
                }
                None => parent.error(e.to_string()),
            }
        })
}

/// Where a TLS setting was read.
#[derive(Clone, Copy)]
enum From<'a, 'd> {
    Key(&'a Node<'d>),
    Variable(&'static str),
}

/// Says, once, that `SSL_CERT_FILE` is set but not to a file, so it is not read (httpx, which
/// LiteLLM calls upstreams with, passes it over the same way).
pub(super) fn warn_unread_cert_file(env: &dyn Fn(&str) -> Option<String>) {
    if let Some(path) = env("SSL_CERT_FILE").filter(|p| !p.trim().is_empty()) {
        if !Path::new(path.trim()).is_file() {
            tracing::warn!(
                "SSL_CERT_FILE={path} is not a file: not read (https upstreams are verified as \
                 without it), as httpx passes it over"
            );
        }
    }
}

/// `SSL_VERIFY`'s text as [`verify`] reads a string; `None` when empty.
fn verify_text(text: &str) -> Option<Verify> {
    match text.trim() {
        t if t.eq_ignore_ascii_case("true") || super::pyyaml_bool(t) == Some(true) => {
            Some(Verify::Mozilla)
        }
        t if t.eq_ignore_ascii_case("false") || super::pyyaml_bool(t) == Some(false) => {
            Some(Verify::Off)
        }
        "" => None,
        path => Some(Verify::CaBundle(path.into())),
    }
}

/// The bounds `max_upstream_connections`, `max_idle_upstream_connections` and `connect_timeout`
/// say (wherever each is written), checked: counts within range, no more idle than open (no TLS:
/// that is read beside).
pub(super) fn pool_bounds(
    max: Option<&Node<'_>>,
    idle: Option<&Node<'_>>,
    timeout: Option<&Node<'_>>,
) -> Result<UpstreamConnections, ConfigError> {
    let bounded = |node: Option<&Node<'_>>, least: u64| -> Result<Option<usize>, ConfigError> {
        let Some(node) = node else {
            return Ok(None);
        };
        let n = node.count()?;
        if !(least..=MAX_UPSTREAM_CONNECTIONS).contains(&n) {
            return Err(node.error(format!(
                "expected a whole number from {least} to {MAX_UPSTREAM_CONNECTIONS}, got {n}"
            )));
        }
        Ok(Some(n as usize))
    };
    let max_connections = bounded(max, 1)?;
    let max_idle = bounded(idle, 0)?;
    if let (Some(max_n), Some(idle_n), Some(max), Some(idle)) =
        (max_connections, max_idle, max, idle)
    {
        if idle_n > max_n {
            // Named where the bound is when it is elsewhere (one a default, one the deployment's).
            let elsewhere = match max.path().rsplit_once('.') {
                Some((parent, _)) if !idle.path().starts_with(&format!("{parent}.")) => {
                    format!(" ({})", max.path())
                }
                _ => String::new(),
            };
            return Err(idle.error(format!(
                "{idle_n} idle connections cannot be kept with max_upstream_connections \
                 {max_n}{elsewhere}"
            )));
        }
    }
    let connect_timeout = match timeout {
        Some(node) => Some(seconds(node)?),
        None => None,
    };
    Ok(UpstreamConnections {
        max_connections,
        max_idle,
        connect_timeout,
        tls: None,
    })
}

/// `ssl_verify` as LiteLLM reads it (httpx's `verify=`): `true` (the bundled Mozilla roots),
/// `false` (no verification), or the path of a PEM CA bundle; a string PyYAML reads as a
/// boolean (`no`, `off`, …; or `"true"` from `os.environ/`, say) is the boolean.
fn verify(node: &Node<'_>) -> Result<Verify, ConfigError> {
    match node.value() {
        serde_json::Value::Bool(true) => Ok(Verify::Mozilla),
        serde_json::Value::Bool(false) => Ok(Verify::Off),
        serde_json::Value::String(_) => verify_text(&node.string()?)
            .ok_or_else(|| node.error("expected true, false or the path of a PEM CA bundle")),
        other => Err(node.error(format!(
            "expected true, false or the path of a PEM CA bundle, got {other}"
        ))),
    }
}

/// Refuses the wildcard forms this gateway does not serve as LiteLLM would (see
/// [`super::wildcard`]): a `*` in `litellm_params.model` fills from the `*` of `model_name` in
/// the same place, so their counts must agree (or the model has none: every matched name goes
/// to it); the provider is written out (a provider chosen per request is not); and an Azure
/// deployment name is fixed (its URL is made once, at start).
fn wildcard_forms(
    model_name: &str,
    model: &str,
    provider: Option<&str>,
    model_node: &Node<'_>,
) -> Result<(), ConfigError> {
    let in_model = model.matches('*').count();
    if in_model == 0 {
        return Ok(());
    }
    let in_name = model_name.matches('*').count();
    if in_name == 0 {
        return Err(model_node.error(format!(
            "{model:?} has a * but model_name {model_name:?} has none: a * here is filled with \
             the part of the requested name that the model_name's * matched (write model_name \
             as a wildcard route, e.g. \"openai/*\")"
        )));
    }
    if in_model != in_name {
        return Err(model_node.error(format!(
            "{model:?} has {in_model} * and model_name {model_name:?} has {in_name}: each * here \
             takes what the model_name's * in the same place matched, so give both as many (or \
             none here, to send every matched name to one model)"
        )));
    }
    match provider {
        Some(p) if !p.contains('*') => {}
        _ => {
            return Err(model_node.error(format!(
                "{model:?}: write the provider out (e.g. \"openai/*\"); this gateway does not \
                 choose a provider per request"
            )))
        }
    }
    if provider == Some("azure") {
        return Err(model_node.error(format!(
            "{model:?}: Azure deployment names cannot be wildcards (each Azure URL is made at \
             start); list each deployment as its own model_list entry"
        )));
    }
    Ok(())
}

/// Whether `text` can go into a URL's path or query as it is: Azure's deployment names and API
/// versions are letters, digits, `-`, `_` and `.`.
fn url_safe(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// An `azure/<deployment>` entry's Azure settings: `api_version` required, the key as `api_key`
/// or `azure_ad_token` (not both: which one would be sent is not obvious).
fn azure(params: &Node<'_>, deployment: &str, has_key: bool) -> Result<Azure, ConfigError> {
    if !url_safe(deployment) {
        return Err(ConfigError::new(
            format!("{}.model", params.path()),
            format!(
                "the Azure deployment name \"{deployment}\" may hold only letters, digits, -, _ and ."
            ),
        ));
    }
    let version = params.get("api_version")?.ok_or_else(|| {
        params.error("missing api_version, which azure/ models need (e.g. \"2024-10-21\")")
    })?;
    let api_version = version.string()?;
    if !url_safe(&api_version) {
        return Err(version.error(format!(
            "expected an Azure API version such as \"2024-10-21\", got \"{api_version}\""
        )));
    }
    let ad_token = match params.get("azure_ad_token")? {
        Some(node) => {
            let token = node.string()?;
            if has_key {
                return Err(node.error("give api_key or azure_ad_token, not both"));
            }
            if token.starts_with("oidc/") || http::HeaderValue::from_str(&token).is_err() {
                return Err(node.error(
                    "expected the token itself (or os.environ/NAME); oidc/ tokens are not \
                     supported",
                ));
            }
            Some(token)
        }
        None => None,
    };
    Ok(Azure {
        api_version,
        ad_token,
    })
}

/// A deployment id that stays the same while its entry does: a hash of its position and what it
/// points at (never of its key).
fn derived_id(position: usize, model_name: &str, model: &str, target: &Target) -> String {
    use sha2::{Digest, Sha256};
    let base = match target {
        Target::Mock { .. } => "mock",
        Target::Upstream { api_base, .. } => api_base.as_str(),
    };
    let digest = Sha256::digest(format!("{position}\n{model_name}\n{model}\n{base}").as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_provider_with_a_format_of_its_own_is_named() {
        let warning = provider_warning(
            "model_list[0].litellm_params.model",
            Some("ollama"),
            "http://h:11434",
        )
        .unwrap();
        assert!(
            warning.starts_with("model_list[0].litellm_params.model: provider \"ollama\" is called as an OpenAI-compatible API at http://h:11434/chat/completions"),
            "{warning}"
        );
        for quiet in [
            None,
            Some("openai"),
            Some("hosted_vllm"),
            Some("anthropic"),
            Some("azure"),
        ] {
            assert_eq!(provider_warning("p", quiet, "http://h"), None, "{quiet:?}");
        }
        assert!(provider_warning("p", Some("gemini"), "http://h").is_some());
    }
}
