//! The config's parsing and validation, through its public API.

use super::*;

#[test]
fn quickstart_file_loads() {
    let c = GatewayConfig::from_yaml_str(include_str!("../../config/quickstart.yaml")).unwrap();
    assert!(c.limiter_enabled);
    assert_eq!(c.master_key.as_deref(), Some("sk-1234"));
    assert_eq!(c.deployments[0].upstream_model, "my-fake-model");
    assert!(matches!(c.deployments[0].target, Target::Mock { .. }));
    assert_eq!(c.max_request_bytes, DEFAULT_MAX_REQUEST_BYTES);
    assert_eq!(c.header_read_timeout, DEFAULT_HEADER_READ_TIMEOUT);
    assert_eq!(c.send_timeout, DEFAULT_SEND_TIMEOUT);
    assert_eq!(c.request_body_timeout, DEFAULT_REQUEST_BODY_TIMEOUT);
    assert_eq!(c.max_connections, DEFAULT_MAX_CONNECTIONS);
}

#[test]
fn connection_limits_are_read_and_checked() {
    let c = GatewayConfig::from_yaml_str(
        "general_settings: {header_read_timeout_seconds: 1.5, request_body_timeout_seconds: 2, \
         max_connections: 7, send_timeout_seconds: 0.25}\n",
    )
    .unwrap();
    assert_eq!(c.header_read_timeout, Duration::from_millis(1500));
    assert_eq!(c.request_body_timeout, Duration::from_secs(2));
    assert_eq!(c.max_connections, 7);
    assert_eq!(c.send_timeout, Duration::from_millis(250));
    for (yaml, path) in [
        (
            "general_settings: {send_timeout_seconds: 0}",
            "general_settings.send_timeout_seconds",
        ),
        (
            "general_settings: {header_read_timeout_seconds: 0}",
            "general_settings.header_read_timeout_seconds",
        ),
        (
            "general_settings: {request_body_timeout_seconds: -1}",
            "general_settings.request_body_timeout_seconds",
        ),
        (
            "general_settings: {max_connections: 0}",
            "general_settings.max_connections",
        ),
        (
            "general_settings: {max_connections: 1.5}",
            "general_settings.max_connections",
        ),
    ] {
        let e = GatewayConfig::from_yaml_str(yaml).unwrap_err().to_string();
        assert!(e.starts_with(path), "{yaml}: {e}");
    }
}

#[test]
fn upstreams_map_names_and_resolve_keys() {
    std::env::set_var("GW_TEST_KEY_1", "sk-upstream");
    let c = GatewayConfig::from_yaml_str(
            r#"
model_list:
  - model_name: luna
    litellm_params: {model: openai/gpt-5.6-luna, api_base: "http://127.0.0.1:9001/v1/", api_key: os.environ/GW_TEST_KEY_1, timeout: 2.5}
  - model_name: plain
    litellm_params: {model: gpt-x}
general_settings: {max_request_size_mb: 1}
"#,
        )
        .unwrap();
    assert!(!c.limiter_enabled);
    let d = &c.deployments[0];
    assert_eq!(d.upstream_model, "gpt-5.6-luna");
    assert_eq!(
        d.target,
        Target::Upstream {
            api_base: "http://127.0.0.1:9001/v1".into(),
            api_key: Some("sk-upstream".into()),
            api: Api::OpenAi,
            azure: None,
        }
    );
    assert_eq!(d.timeout, Duration::from_millis(2500));
    assert!(
        matches!(&c.deployments[1].target, Target::Upstream { api_base, .. } if api_base == OPENAI_API_BASE)
    );
    assert_eq!(c.max_request_bytes, 1024 * 1024);
}

#[test]
fn anthropic_models_speak_anthropics_api() {
    let c = GatewayConfig::from_yaml_str_with_env(
        r#"
model_list:
  - model_name: claude
    litellm_params: {model: anthropic/claude-sonnet-4-5, api_key: sk-ant}
  - model_name: claude-proxy
    litellm_params: {model: anthropic/claude-haiku, api_base: "http://127.0.0.1:9/"}
  - model_name: mock
    litellm_params: {model: m, mock_response: hi}
  - model_name: vllm
    litellm_params: {model: hosted_vllm/llama, api_base: "http://127.0.0.1:9/v1"}
"#,
        no_env,
    )
    .unwrap();
    let target = |i: usize| c.deployments[i].target.clone();
    assert_eq!(
        target(0),
        Target::Upstream {
            api_base: ANTHROPIC_API_BASE.into(),
            api_key: Some("sk-ant".into()),
            api: Api::Anthropic,
            azure: None,
        }
    );
    assert_eq!(c.deployments[0].upstream_model, "claude-sonnet-4-5");
    assert!(
        matches!(target(1), Target::Upstream { api_base, api: Api::Anthropic, .. } if api_base == "http://127.0.0.1:9")
    );
    assert!(c.deployments[0].speaks(Api::Anthropic) && !c.deployments[0].speaks(Api::OpenAi));
    assert!(c.deployments[2].speaks(Api::Anthropic) && c.deployments[2].speaks(Api::OpenAi));
    assert!(!c.deployments[3].speaks(Api::Anthropic) && c.deployments[3].speaks(Api::OpenAi));
}

#[test]
fn errors_name_the_yaml_path() {
    let cases = [
            (
                "model_list: [{model_name: m, litellm_params: {model: openai/x, api_key: os.environ/GW_TEST_UNSET}}]",
                "model_list[0].litellm_params.api_key: environment variable GW_TEST_UNSET is not set (value is \"os.environ/GW_TEST_UNSET\")",
            ),
            (
                "model_list: [{model_name: m, litellm_params: {rpm: 1}}]",
                "model_list[0].litellm_params: missing model (e.g. openai/gpt-4o)",
            ),
            (
                "model_list: [{model_name: m, litellm_params: {model: vertex_ai/gemini}}]",
                "model_list[0].litellm_params.model: provider \"vertex_ai\" needs an api_base (this gateway speaks the OpenAI API, and Anthropic's for anthropic/ models)",
            ),
            (
                "model_list: [{model_name: m, litellm_params: {model: x, api_base: localhost:1}}]",
                "model_list[0].litellm_params.api_base: expected an http:// or https:// URL, got \"localhost:1\"",
            ),
            (
                "model_list: [{model_name: m, litellm_params: {model: openai/x, api_key: k}}, {model_name: m, litellm_params: {model: anthropic/y, api_key: k}}]",
                "model_list[1].litellm_params.model: model_name \"m\" mixes API formats: this deployment speaks Anthropic's Messages API and model_list[0] does not (the gateway does not translate between formats; give them different model_names)",
            ),
            (
                "model_list: [{model_name: m, litellm_params: {model: openai/x, api_key: k}}, {model_name: n, litellm_params: {model: openai/y, api_key: k}}, {model_name: m, litellm_params: {model: openai/x, api_key: k}, model_info: {id: d1}}, {model_name: n, litellm_params: {model: openai/z, api_key: k}, model_info: {id: d1}}]",
                "model_list[3].model_info.id: id \"d1\" is used by another deployment",
            ),
            (
                "model_list: [{model_name: m, litellm_params: {model: openai/x, api_key: k}}]\nrouter_settings: {fallbacks: [{m: [nope]}]}",
                "router_settings.fallbacks: \"nope\" is not a model_name in model_list",
            ),
            (
                "model_list: [{model_name: \"a\\\"b\", litellm_params: {model: openai/x, api_key: k}}]",
                "model_list[0].model_name: \"a\\\"b\" contains '\"': names must not hold quotes, backslashes or control characters",
            ),
            (
                "model_list: [{model_name: m, litellm_params: {model: openai/x, api_key: k}, model_info: {id: \"x\\ny\"}}]",
                "model_list[0].model_info.id: \"x\\ny\" contains '\\n': names must not hold quotes, backslashes or control characters",
            ),
            (
                "general_settings: {max_request_size_mb: 0}",
                "general_settings.max_request_size_mb: expected megabytes > 0, got 0",
            ),
            (
                "general_settings: {max_request_size_mb: 0.0000001}",
                "general_settings.max_request_size_mb: expected megabytes from 0.0009765625 (a kilobyte) to 4096, got 0.0000001",
            ),
            (
                "general_settings: {max_request_size_mb: 1e15}",
                "general_settings.max_request_size_mb: expected megabytes from 0.0009765625 (a kilobyte) to 4096, got 1000000000000000",
            ),
            (
                "general_settings: {master_key: \"   \"}",
                "general_settings.master_key: must not be empty or blank",
            ),
            (
                "router_settings: {fallbacks: [{m: [m]}]}",
                "router_settings.fallbacks[0].m: \"m\" falls back to itself: a group's retries are num_retries, its fallbacks other groups",
            ),
            (
                "litellm_settings: {priority_reservation: {dev: {type: rpx, value: 1}}}",
                "litellm_settings.priority_reservation.dev.type: unknown type \"rpx\", expected percent|rpm|tpm",
            ),
        ];
    for (yaml, want) in cases {
        assert_eq!(
            GatewayConfig::from_yaml_str(yaml).unwrap_err().to_string(),
            want
        );
    }
}

/// The not-honoured warning of `yaml`, which must load (no environment), or "" without one.
fn not_honoured(yaml: &str) -> String {
    let c = GatewayConfig::from_yaml_str_with_env(yaml, no_env).unwrap();
    c.unsupported_warning().unwrap_or_default()
}

fn no_env(_: &str) -> Option<String> {
    None
}

fn redis_of(yaml: &str, env: &[(&str, &str)]) -> Result<(Option<RedisTarget>, String), String> {
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    GatewayConfig::from_yaml_str_with_env(yaml, move |name| {
        env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    })
    .map(|c| (c.redis, c.redis_key_prefix))
    .map_err(|e| e.to_string())
}

fn single(url: &str) -> Option<RedisTarget> {
    Some(RedisTarget::Single(url.into()))
}

#[test]
fn no_redis_means_embedded() {
    let c =
        GatewayConfig::from_yaml_str_with_env(include_str!("../../config/quickstart.yaml"), no_env)
            .unwrap();
    assert_eq!(c.redis, None);
    assert_eq!(c.redis_key_prefix, DEFAULT_REDIS_KEY_PREFIX);
}

#[test]
fn redis_from_router_settings() {
    let cases = [
            (
                "router_settings: {redis_url: \"redis://10.0.0.1:6380/2\", redis_host: ignored}",
                single("redis://10.0.0.1:6380/2"),
            ),
            (
                "router_settings: {redis_host: 127.0.0.1}",
                single("redis://127.0.0.1:6379/"),
            ),
            (
                "router_settings: {redis_host: cache.internal, redis_port: \"7000\", redis_password: \"p@ss/w:rd\"}",
                single("redis://:p%40ss%2Fw%3Ard@cache.internal:7000/"),
            ),
            (
                "router_settings: {redis_host: \"::1\", redis_port: 7001}",
                single("redis://[::1]:7001/"),
            ),
            (
                "router_settings: {redis_startup_nodes: [\"127.0.0.1:7000\", {host: 127.0.0.2, port: 7001}, \"[::1]:7002\", \"h3\"]}",
                Some(RedisTarget::Cluster(vec![
                    "redis://127.0.0.1:7000/".into(),
                    "redis://127.0.0.2:7001/".into(),
                    "redis://[::1]:7002/".into(),
                    "redis://h3:6379/".into(),
                ])),
            ),
            (
                "router_settings: {redis_startup_nodes: [{host: n1, port: 7000}], redis_password: pw}",
                Some(RedisTarget::Cluster(vec!["redis://:pw@n1:7000/".into()])),
            ),
        ];
    for (yaml, want) in cases {
        // The file wins over the environment.
        let got = redis_of(yaml, &[("REDIS_URL", "redis://env:1/")]).unwrap();
        assert_eq!(got.0, want, "{yaml}");
    }
    let (_, prefix) = redis_of(
        "router_settings: {redis_host: h, redis_key_prefix: \"gw-eu:\"}",
        &[],
    )
    .unwrap();
    assert_eq!(prefix, "gw-eu:");
}

#[test]
fn redis_from_the_environment() {
    assert_eq!(
        redis_of("{}", &[("REDIS_URL", "redis://r1:6390/")])
            .unwrap()
            .0,
        single("redis://r1:6390/")
    );
    assert_eq!(
        redis_of(
            "router_settings: {routing_strategy: simple-shuffle}",
            &[
                ("REDIS_HOST", "r2"),
                ("REDIS_PORT", "6391"),
                ("REDIS_PASSWORD", "s3cret")
            ]
        )
        .unwrap()
        .0,
        single("redis://:s3cret@r2:6391/")
    );
    assert_eq!(
        redis_of("{}", &[("REDIS_HOST", "r3"), ("REDIS_URL", "")])
            .unwrap()
            .0,
        single("redis://r3:6379/"),
        "an empty REDIS_URL is unset"
    );
    assert_eq!(
        redis_of("{}", &[("REDIS_PORT", "1")]).unwrap().0,
        None,
        "a port alone names no server"
    );
    // `os.environ/NAME` in the file reads the process environment (a name no other test uses).
    std::env::set_var("GW_TEST_REDIS_PASSWORD_1", "from-env");
    std::env::set_var("GW_TEST_REDIS_HOST_1", "r4");
    assert_eq!(
            redis_of(
                "router_settings: {redis_host: os.environ/GW_TEST_REDIS_HOST_1, redis_password: os.environ/GW_TEST_REDIS_PASSWORD_1}",
                &[]
            )
            .unwrap()
            .0,
            single("redis://:from-env@r4:6379/")
        );
}

#[test]
fn bad_redis_settings_name_the_path() {
    let cases = [
            (
                "router_settings: {redis_url: \"http://h:1\"}",
                &[][..],
                "router_settings.redis_url: expected a redis://, rediss:// or unix:// URL, got \"http://h:1\"",
            ),
            (
                "router_settings: {redis_host: h, redis_port: 70000}",
                &[][..],
                "router_settings.redis_port: expected a port 1-65535, got \"70000\"",
            ),
            (
                "router_settings: {redis_port: 6379}",
                &[][..],
                "router_settings.redis_port: needs router_settings.redis_host (or use redis_url)",
            ),
            (
                "router_settings: {redis_startup_nodes: [\"h:1\", \"h:x\"]}",
                &[][..],
                "router_settings.redis_startup_nodes[1]: expected a port 1-65535, got \"x\"",
            ),
            (
                "router_settings: {redis_startup_nodes: [{port: 1}]}",
                &[][..],
                "router_settings.redis_startup_nodes[0]: missing host",
            ),
            (
                "router_settings: {redis_startup_nodes: [{host: h, prot: 7000}]}",
                &[][..],
                "router_settings.redis_startup_nodes[0].prot: unknown key: a node takes host and port (the password is router_settings.redis_password, for every node)",
            ),
            (
                "router_settings: {redis_startup_nodes: [{host: h, port: 7000, pasword: x}]}",
                &[][..],
                "router_settings.redis_startup_nodes[0].pasword: unknown key: a node takes host and port (the password is router_settings.redis_password, for every node)",
            ),
            (
                "router_settings: {redis_startup_nodes: []}",
                &[][..],
                "router_settings.redis_startup_nodes: expected at least one \"host:port\"",
            ),
            (
                "router_settings: {redis_host: os.environ/GW_TEST_REDIS_UNSET}",
                &[][..],
                "router_settings.redis_host: environment variable GW_TEST_REDIS_UNSET is not set (value is \"os.environ/GW_TEST_REDIS_UNSET\")",
            ),
            (
                "{}",
                &[("REDIS_HOST", "h"), ("REDIS_PORT", "port")][..],
                "REDIS_PORT: expected a port 1-65535, got \"port\"",
            ),
            (
                "{}",
                &[("REDIS_URL", "h:6379")][..],
                "REDIS_URL: expected a redis://, rediss:// or unix:// URL, got \"h:6379\"",
            ),
        ];
    for (yaml, env, want) in cases {
        assert_eq!(redis_of(yaml, env).unwrap_err(), want, "{yaml}");
    }
}

#[test]
fn redis_passwords_never_show_in_debug_or_errors() {
    let t = RedisTarget::Single("redis://:hunter2@h:1/".into());
    assert!(!format!("{t:?}").contains("hunter2"));
    assert_eq!(t.redacted(), "redis://:***@h:1/");
    let t = RedisTarget::Cluster(vec!["redis://u:hunter2@h:1/".into()]);
    assert_eq!(t.redacted(), "cluster [redis://u:***@h:1/]");
    let e = redis_of(
        "router_settings: {redis_url: \"redis://:hunter2@h:notaport/\"}",
        &[],
    )
    .unwrap_err();
    assert!(!e.contains("hunter2"), "{e}");
    assert!(
        e.starts_with("router_settings.redis_url: invalid Redis URL"),
        "{e}"
    );
}

#[test]
fn debug_output_hides_upstream_keys_and_passwords() {
    let c = GatewayConfig::from_yaml_str(
        r#"
model_list:
  - model_name: m
    litellm_params: {model: openai/m, api_base: "https://u:base-secret@h/v1", api_key: sk-key-secret}
"#,
    )
    .unwrap();
    let shown = format!("{c:?}");
    assert!(shown.contains("https://u:***@h/v1"), "{shown}");
    for secret in ["base-secret", "sk-key-secret"] {
        assert!(!shown.contains(secret), "{secret} in {shown}");
    }
}

/// `timeout` and `stream_timeout` are read where the source product reads them: per deployment
/// (`litellm_params`), else `router_settings`, else (`timeout` only) `litellm_settings.
/// request_timeout`, else 600 s; `stream_timeout` defaults to the deployment's `timeout`. Only
/// `router_settings.timeout` bounds a whole request.
#[test]
fn timeouts_are_read_per_deployment_router_and_litellm_settings() {
    let list = "model_list:\n\
                - {model_name: a, litellm_params: {model: openai/a, timeout: 3, stream_timeout: 0.5}}\n\
                - {model_name: b, litellm_params: {model: openai/b}}\n";
    let c = GatewayConfig::from_yaml_str(list).unwrap();
    assert_eq!(c.deployments[0].timeout, Duration::from_secs(3));
    assert_eq!(c.deployments[0].stream_timeout, Duration::from_millis(500));
    assert_eq!(c.deployments[1].timeout, DEFAULT_TIMEOUT);
    assert_eq!(c.deployments[1].stream_timeout, DEFAULT_TIMEOUT);
    assert_eq!(c.router.timeout, None);
    assert_eq!(c.shutdown_grace, DEFAULT_SHUTDOWN_GRACE);

    let c = GatewayConfig::from_yaml_str(&format!(
        "{list}litellm_settings: {{request_timeout: 20}}\n"
    ))
    .unwrap();
    assert_eq!(
        c.router.timeout, None,
        "each call's, not the whole request's"
    );
    assert_eq!(c.deployments[1].timeout, Duration::from_secs(20));
    assert_eq!(c.deployments[1].stream_timeout, Duration::from_secs(20));

    let c = GatewayConfig::from_yaml_str(&format!(
        "{list}litellm_settings: {{request_timeout: 20}}\n\
         router_settings: {{timeout: 10, stream_timeout: 2}}\n\
         general_settings: {{shutdown_grace_seconds: 0}}\n"
    ))
    .unwrap();
    assert_eq!(c.router.timeout, Some(Duration::from_secs(10)));
    assert_eq!(c.router.stream_timeout, Some(Duration::from_secs(2)));
    assert_eq!(c.deployments[0].timeout, Duration::from_secs(3), "its own");
    assert_eq!(c.deployments[1].timeout, Duration::from_secs(10));
    assert_eq!(c.deployments[1].stream_timeout, Duration::from_secs(2));
    assert_eq!(c.shutdown_grace, Duration::ZERO);

    for (yaml, path) in [
        (
            "model_list: [{model_name: a, litellm_params: {model: openai/a, stream_timeout: 0}}]",
            "model_list[0].litellm_params.stream_timeout",
        ),
        ("router_settings: {timeout: -1}", "router_settings.timeout"),
        (
            "router_settings: {stream_timeout: 0}",
            "router_settings.stream_timeout",
        ),
        (
            "litellm_settings: {request_timeout: 0}",
            "litellm_settings.request_timeout",
        ),
        (
            "general_settings: {shutdown_grace_seconds: -1}",
            "general_settings.shutdown_grace_seconds",
        ),
    ] {
        let e = GatewayConfig::from_yaml_str(yaml).unwrap_err().to_string();
        assert!(e.starts_with(path), "{yaml}: {e}");
    }
}

/// `Debug` of a config shows no secret: not the master key, not an upstream key, not a password
/// in a URL.
#[test]
fn debug_hides_every_secret() {
    let c = GatewayConfig::from_yaml_str_with_env(
        r#"
model_list:
  - {model_name: a, litellm_params: {model: openai/a, api_base: "http://user:pa55word@h/v1", api_key: sk-upstream-secret}}
general_settings: {master_key: sk-master-secret}
router_settings: {redis_url: "redis://:redis-secret@127.0.0.1:6379"}
"#,
        |_| None,
    )
    .unwrap();
    let debug = format!("{c:?}");
    for secret in [
        "sk-master-secret",
        "sk-upstream-secret",
        "pa55word",
        "redis-secret",
    ] {
        assert!(!debug.contains(secret), "{secret} in {debug}");
    }
    assert!(debug.contains("master_key: Some(\"***\")"), "{debug}");
}

/// An upstream key that cannot be sent as a header (a trailing newline from a secrets file, say)
/// is refused at load, naming its path and not showing the key.
#[test]
fn an_api_key_unusable_in_a_header_is_refused_at_load() {
    for key in ["\"sk-secret\\n\"", "\"sk-s\\aecret\""] {
        let yaml = format!(
            "model_list:\n  - model_name: m\n    litellm_params: {{model: openai/x, api_key: {key}}}\n"
        );
        let e = GatewayConfig::from_yaml_str(&yaml).unwrap_err().to_string();
        assert!(e.contains("model_list[0].litellm_params.api_key"), "{e}");
        assert!(e.contains("not usable in a header"), "{e}");
        assert!(!e.contains("sk-s"), "{e}");
    }
}

/// LiteLLM's wildcard forms load: the provider's (`openai/*`), a prefix (`openai/gpt-*`), the
/// catch-all (`*`), several `*`s, and a pattern sent to one fixed model; the model keeps its `*`s
/// to fill per request.
#[test]
fn wildcard_routes_load_in_litellms_forms() {
    let c = GatewayConfig::from_yaml_str_with_env(
        r#"
model_list:
  - model_name: openai/*
    litellm_params: {model: openai/*, api_base: "http://127.0.0.1:1/v1", rpm: 5}
  - model_name: openai/gpt-*
    litellm_params: {model: openai/gpt-*, api_base: "http://127.0.0.1:1/v1"}
  - model_name: "*"
    litellm_params: {model: "openai/*", api_base: "http://127.0.0.1:1/v1"}
  - model_name: "fo::*::static::*"
    litellm_params: {model: "openai/fo::*::static::*", api_base: "http://127.0.0.1:1/v1"}
  - model_name: "cheap/*"
    litellm_params: {model: openai/gpt-4o-mini, api_base: "http://127.0.0.1:1/v1"}
  - model_name: "claude/*"
    litellm_params: {model: "anthropic/claude-*"}
router_settings: {max_wildcard_models: 3}
"#,
        |_| None,
    )
    .unwrap();
    let d = &c.deployments;
    assert_eq!(d[0].upstream_model, "*");
    assert_eq!(d[0].rpm, Some(5));
    assert_eq!(d[0].upstream_model_for(&["gpt-4o".into()]), "gpt-4o");
    assert_eq!(d[1].upstream_model_for(&["4o".into()]), "gpt-4o");
    assert_eq!(
        d[3].upstream_model_for(&["a".into(), "b".into()]),
        "fo::a::static::b"
    );
    assert_eq!(d[4].upstream_model_for(&["x".into()]), "gpt-4o-mini");
    assert_eq!(d[5].upstream_model_for(&["3".into()]), "claude-3");
    assert_eq!(c.router.max_wildcard_models, 3);
    assert_eq!(c.limiter.models()[0].name(), "openai/*");
}

/// The wildcard forms that would not be served as LiteLLM serves them are refused at start,
/// naming the path.
#[test]
fn wildcard_routes_it_cannot_serve_are_refused_by_path() {
    let base = "api_base: \"http://127.0.0.1:1/v1\"";
    for (entry, want) in [
        (
            format!("{{model_name: any, litellm_params: {{model: \"openai/gpt-*\", {base}}}}}"),
            "model_list[0].litellm_params.model: \"openai/gpt-*\" has a * but model_name \"any\" has none",
        ),
        (
            format!("{{model_name: \"a/*-*\", litellm_params: {{model: \"openai/*\", {base}}}}}"),
            "model_list[0].litellm_params.model: \"openai/*\" has 1 * and model_name \"a/*-*\" has 2",
        ),
        (
            format!("{{model_name: \"*\", litellm_params: {{model: \"*\", {base}}}}}"),
            "model_list[0].litellm_params.model: \"*\": write the provider out",
        ),
        (
            format!("{{model_name: \"x/*\", litellm_params: {{model: \"*/gpt\", {base}}}}}"),
            "model_list[0].litellm_params.model: \"*/gpt\": write the provider out",
        ),
        (
            format!(
                "{{model_name: \"az/*\", litellm_params: {{model: \"azure/*\", {base}, api_version: \"2024-10-21\"}}}}"
            ),
            "model_list[0].litellm_params.model: \"azure/*\": Azure deployment names cannot be wildcards",
        ),
    ] {
        let yaml = format!("model_list:\n  - {entry}\n");
        let e = GatewayConfig::from_yaml_str_with_env(&yaml, |_| None)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with(want), "{e}\nwanted: {want}");
    }
    // A fallback is entered by name: not a wildcard route.
    let e = GatewayConfig::from_yaml_str_with_env(
        r#"
model_list:
  - {model_name: m, litellm_params: {model: m, mock_response: hi}}
  - {model_name: "openai/*", litellm_params: {model: "openai/*", mock_response: hi}}
router_settings: {fallbacks: [{m: ["openai/*"]}]}
"#,
        |_| None,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with(
            "router_settings.fallbacks: \"openai/*\" (a fallback of \"m\") is a wildcard route"
        ),
        "{e}"
    );
    // A wildcard route as the group that falls back is fine.
    GatewayConfig::from_yaml_str_with_env(
        r#"
model_list:
  - {model_name: m, litellm_params: {model: m, mock_response: hi}}
  - {model_name: "openai/*", litellm_params: {model: "openai/*", mock_response: hi}}
router_settings: {fallbacks: [{"openai/*": [m]}]}
"#,
        |_| None,
    )
    .unwrap();
    // With Redis too: its names' windows are the fleet's (`RedisStore::windows_of`).
    let c = GatewayConfig::from_yaml_str_with_env(
        r#"
model_list:
  - {model_name: m, litellm_params: {model: m, mock_response: hi}}
  - {model_name: "openai/*", litellm_params: {model: "openai/*", mock_response: hi}}
router_settings: {redis_url: "redis://127.0.0.1:1"}
"#,
        |_| None,
    )
    .unwrap();
    assert!(c.redis.is_some());
    for bad in ["0", "100001", "-1"] {
        let yaml = format!(
            "model_list: [{{model_name: m, litellm_params: {{model: m, mock_response: hi}}}}]\nrouter_settings: {{max_wildcard_models: {bad}}}\n"
        );
        let e = GatewayConfig::from_yaml_str_with_env(&yaml, |_| None)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("router_settings.max_wildcard_models: "),
            "{e}"
        );
    }
}

#[test]
fn database_url_from_general_settings_else_the_environment() {
    let base =
        "model_list: [{model_name: m, litellm_params: {model: openai/m, mock_response: hi}}]\n";
    let read = |yaml: &str, env: Option<&str>| {
        let env = env.map(str::to_owned);
        GatewayConfig::from_yaml_str_with_env(yaml, move |name| {
            (name == "DATABASE_URL").then(|| env.clone()).flatten()
        })
        .map(|c| c.database_url)
        .map_err(|e| e.to_string())
    };
    assert_eq!(read(base, None).unwrap(), None);
    let in_file = format!(
        "{base}general_settings: {{database_url: \"postgresql://u:pw@db:5432/litellm\"}}\n"
    );
    let url = read(&in_file, Some("postgres://other/x")).unwrap().unwrap();
    assert_eq!(
        url.as_str(),
        "postgresql://u:pw@db:5432/litellm",
        "the file wins"
    );
    assert_eq!(url.source(), "general_settings.database_url");
    assert_eq!(url.redacted(), "postgresql://u:***@db:5432/litellm");
    assert_eq!(format!("{url:?}"), "postgresql://u:***@db:5432/litellm");
    let url = read(base, Some(" postgres://gw@db/keys "))
        .unwrap()
        .unwrap();
    assert_eq!(url.as_str(), "postgres://gw@db/keys");
    assert_eq!(url.source(), "DATABASE_URL", "what an error about it names");
    assert_eq!(
        url.redacted(),
        "postgres://***@db/keys",
        "a bare user-info may be a token"
    );
    let url = read(base, Some("postgres://db/keys?user=gw&password=pw"))
        .unwrap()
        .unwrap();
    assert_eq!(url.redacted(), "postgres://db/keys?user=gw&password=***");
    let e = read(
        &in_file.replace("postgresql://u:pw@db:5432/litellm", "mysql://db"),
        None,
    )
    .unwrap_err();
    assert!(
        e.contains("general_settings.database_url") && e.contains("Postgres URL"),
        "{e}"
    );
    let e = read(base, Some("sqlite:///keys.db")).unwrap_err();
    assert!(e.contains("DATABASE_URL"), "{e}");
}

/// A config written with YAML anchors and merge keys reads as PyYAML (LiteLLM's reader) reads it:
/// the merged settings apply, a mapping's own keys win over merged ones; a merge of something
/// that is not a mapping is an error at its path. PyYAML's booleans (`yes`, `off`, …) are booleans where one
/// is expected.
#[test]
fn merge_keys_and_pyyaml_booleans_read_as_litellm_reads_them() {
    let yaml = r#"
x-defaults: &defaults {api_base: "http://127.0.0.1:9/v1", rpm: 10, timeout: 7}
model_list:
  - model_name: m
    litellm_params: {<<: *defaults, model: openai/m, timeout: 3}
  - model_name: n
    litellm_params:
      <<: [*defaults, {tpm: 500}]
      model: openai/n
general_settings: {metrics_require_auth: yes, metrics: On}
"#;
    let c = GatewayConfig::from_yaml_str(yaml).unwrap();
    let m = c.deployments.iter().find(|d| d.model_name == "m").unwrap();
    assert!(
        matches!(&m.target, Target::Upstream { api_base, .. } if api_base == "http://127.0.0.1:9/v1"),
        "{:?}",
        m.target
    );
    assert_eq!(m.rpm, Some(10));
    assert_eq!(m.timeout, Duration::from_secs(3), "its own key wins");
    let n = c.deployments.iter().find(|d| d.model_name == "n").unwrap();
    assert_eq!((n.rpm, n.tpm), (Some(10), Some(500)));
    assert!(c.metrics);
    let e = GatewayConfig::from_yaml_str(
        "model_list: [{model_name: m, litellm_params: {<<: 3, model: openai/m}}]",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("model_list[0].litellm_params.<<: a merge key (<<) takes a mapping"),
        "{e}"
    );
    let e = GatewayConfig::from_yaml_str(
        "model_list: [{model_name: m, litellm_params: {model: openai/m, mock_response: hi}}]\ngeneral_settings: {metrics: maybe}",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("general_settings.metrics"), "{e}");
}

/// A deployment's `weight` under a strategy other than `simple-shuffle` (the gateway's default
/// is not LiteLLM's) is named at start, not passed over in silence.
#[test]
fn a_weight_no_strategy_reads_is_named() {
    let yaml = |strategy: &str| {
        format!(
            r#"
model_list:
  - {{model_name: a, litellm_params: {{model: openai/a, mock_response: hi, weight: 9}}}}
  - {{model_name: a, litellm_params: {{model: openai/b, mock_response: hi, weight: 1}}}}
{strategy}
"#
        )
    };
    let c = GatewayConfig::from_yaml_str(&yaml("")).unwrap();
    let warning = c.unsupported_warning().unwrap_or_default();
    assert!(
        warning.contains("model_list[0].litellm_params.weight")
            && warning.contains("model_list[1].litellm_params.weight"),
        "{warning}"
    );
    // It says why, and what would make it read.
    assert!(
        warning.contains("read only by routing_strategy simple-shuffle, LiteLLM's default")
            && warning.contains("routes with headroom-least-busy")
            && warning.contains("set router_settings.routing_strategy: simple-shuffle"),
        "{warning}"
    );
    let c =
        GatewayConfig::from_yaml_str(&yaml("router_settings: {routing_strategy: simple-shuffle}"))
            .unwrap();
    assert_eq!(c.unsupported_warning(), None);
}

/// A deployment without `api_key` takes its provider's key from the environment, as LiteLLM
/// does (`OPENAI_API_KEY`, `ANTHROPIC_API_KEY`, `AZURE_API_KEY`); its own key wins; other
/// providers and an Azure entry keyed by `azure_ad_token` take none.
#[test]
fn a_missing_api_key_comes_from_the_providers_variable() {
    let yaml = r#"
model_list:
  - {model_name: o, litellm_params: {model: openai/o, api_base: "http://127.0.0.1:9/v1"}}
  - {model_name: a, litellm_params: {model: anthropic/a, api_base: "http://127.0.0.1:9"}}
  - {model_name: z, litellm_params: {model: azure/z, api_base: "https://x.openai.azure.com", api_version: "2024-06-01"}}
  - {model_name: own, litellm_params: {model: openai/own, api_base: "http://127.0.0.1:9/v1", api_key: sk-own}}
  - {model_name: g, litellm_params: {model: groq/g, api_base: "http://127.0.0.1:9/v1"}}
  - {model_name: t, litellm_params: {model: azure/t, api_base: "https://x.openai.azure.com", api_version: "2024-06-01", azure_ad_token: tok}}
"#;
    let c = GatewayConfig::from_yaml_str_with_env(yaml, |name| match name {
        "OPENAI_API_KEY" => Some("sk-openai".into()),
        "ANTHROPIC_API_KEY" => Some("sk-ant".into()),
        "AZURE_API_KEY" => Some("az-key".into()),
        _ => None,
    })
    .unwrap();
    let key = |name: &str| match &c
        .deployments
        .iter()
        .find(|d| d.model_name == name)
        .unwrap()
        .target
    {
        Target::Upstream { api_key, .. } => api_key.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(key("o").as_deref(), Some("sk-openai"));
    assert_eq!(key("a").as_deref(), Some("sk-ant"));
    assert_eq!(key("z").as_deref(), Some("az-key"));
    assert_eq!(key("own").as_deref(), Some("sk-own"), "its own wins");
    assert_eq!(key("g"), None, "no variable read for another provider");
    assert_eq!(key("t"), None, "keyed by its token");
    let c = GatewayConfig::from_yaml_str_with_env(yaml, |_| None).unwrap();
    assert_eq!(
        c.deployments
            .iter()
            .find(|d| d.model_name == "o")
            .map(|d| match &d.target {
                Target::Upstream { api_key, .. } => api_key.clone(),
                _ => None,
            }),
        Some(None),
        "none set: none sent"
    );
}

/// Two fallback lists for one group are refused by path, not the second dropped.
#[test]
fn a_group_given_fallbacks_twice_is_refused() {
    let yaml = r#"
model_list:
  - {model_name: a, litellm_params: {model: openai/a, mock_response: hi}}
  - {model_name: b, litellm_params: {model: openai/b, mock_response: hi}}
  - {model_name: c, litellm_params: {model: openai/c, mock_response: hi}}
router_settings:
  fallbacks: [{"a": ["b"]}, {"a": ["c"]}]
"#;
    let e = GatewayConfig::from_yaml_str(yaml).unwrap_err().to_string();
    assert!(
        e.starts_with("router_settings.fallbacks[1].a:") && e.contains("one list"),
        "{e}"
    );
}

/// The master key is `general_settings.master_key`, else `LITELLM_MASTER_KEY`, as LiteLLM reads
/// it: a container set up for LiteLLM with the variable alone must not run open.
#[test]
fn master_key_from_general_settings_else_the_environment() {
    let base =
        "model_list: [{model_name: m, litellm_params: {model: openai/m, mock_response: hi}}]\n";
    let read = |yaml: &str, env: Option<&str>| {
        let env = env.map(str::to_owned);
        GatewayConfig::from_yaml_str_with_env(yaml, move |name| {
            (name == "LITELLM_MASTER_KEY")
                .then(|| env.clone())
                .flatten()
        })
        .map(|c| c.master_key)
        .map_err(|e| e.to_string())
    };
    assert_eq!(read(base, None).unwrap(), None, "open without either");
    assert_eq!(
        read(base, Some(" sk-from-env ")).unwrap().as_deref(),
        Some("sk-from-env")
    );
    let in_file = format!("{base}general_settings: {{master_key: sk-in-file}}\n");
    assert_eq!(
        read(&in_file, Some("sk-from-env")).unwrap().as_deref(),
        Some("sk-in-file"),
        "the file wins"
    );
    let e = read(base, Some("  ")).unwrap_err();
    assert!(e.contains("LITELLM_MASTER_KEY"), "{e}");
}

/// A deployment's connection settings are read where they are written; a bad one names its
/// path and says what is expected.
#[test]
fn connection_settings_are_read_and_bad_ones_refused_by_path() {
    let entry = |params: &str| {
        format!(
            "model_list: [{{model_name: a, litellm_params: {{model: openai/a, \
             api_base: \"https://h/v1\", {params}}}}}]"
        )
    };
    let c = GatewayConfig::from_yaml_str(&entry(
        "max_upstream_connections: 8, max_idle_upstream_connections: 4, connect_timeout: 2.5, \
         ssl_verify: true",
    ))
    .unwrap();
    let own = &c.deployments[0].connections;
    assert_eq!(
        (own.max_connections, own.max_idle, own.connect_timeout),
        (Some(8), Some(4), Some(Duration::from_millis(2500)))
    );
    assert!(own.tls.is_some() && own.is_set());
    // Without any (and no TLS variable in the environment), nothing of its own: the upstream's
    // shared pool.
    let c = GatewayConfig::from_yaml_str_with_env(&entry("rpm: 1"), |_| None).unwrap();
    assert!(!c.deployments[0].connections.is_set());
    // `ssl_verify: false` and `"False"` (from the environment, say) are the same.
    for off in ["false", "\"False\""] {
        let c = GatewayConfig::from_yaml_str(&entry(&format!("ssl_verify: {off}"))).unwrap();
        assert_eq!(
            c.deployments[0].connections.tls,
            Some(upstream_client::Tls::load(upstream_client::Verify::Off, None).unwrap())
        );
    }

    let params = "model_list[0].litellm_params";
    for (yaml, path, says) in [
        (
            entry("max_upstream_connections: 0"),
            "max_upstream_connections",
            "from 1 to 100000, got 0",
        ),
        (
            entry("max_upstream_connections: 2.5"),
            "max_upstream_connections",
            "whole number",
        ),
        (
            entry("max_upstream_connections: 2, max_idle_upstream_connections: 3"),
            "max_idle_upstream_connections",
            "3 idle connections cannot be kept with max_upstream_connections 2",
        ),
        (
            entry("connect_timeout: 0"),
            "connect_timeout",
            "seconds > 0",
        ),
        (
            entry("ssl_verify: 5"),
            "ssl_verify",
            "expected true, false or the path of a PEM CA bundle",
        ),
        (
            entry("ssl_verify: /nonexistent/ca.pem"),
            "ssl_verify",
            "cannot read /nonexistent/ca.pem",
        ),
        (
            entry("ssl_certificate: /nonexistent/client.pem"),
            "ssl_certificate",
            "cannot read /nonexistent/client.pem",
        ),
        (
            "model_list: [{model_name: a, litellm_params: {model: openai/a, \
             api_base: \"http://h/v1\", ssl_verify: false}}]"
                .to_owned(),
            "ssl_verify",
            "apply to an https:// api_base",
        ),
        (
            "model_list: [{model_name: a, litellm_params: {model: openai/a, \
             mock_response: hi, max_upstream_connections: 2}}]"
                .to_owned(),
            "max_upstream_connections",
            "has no upstream",
        ),
        (
            format!(
                "{}\nlitellm_settings: {{ssl_verify: /nonexistent/ca.pem}}",
                entry("rpm: 1")
            ),
            "litellm_settings.ssl_verify",
            "cannot read",
        ),
        // Checked without an https deployment to take it, too.
        (
            "litellm_settings: {ssl_certificate: /nonexistent/client.pem}".to_owned(),
            "litellm_settings.ssl_certificate",
            "cannot read /nonexistent/client.pem",
        ),
    ] {
        let e = GatewayConfig::from_yaml_str(&yaml).unwrap_err().to_string();
        let at = if path.starts_with("litellm_settings") {
            path.to_owned()
        } else {
            format!("{params}.{path}")
        };
        assert!(e.starts_with(&at) && e.contains(says), "{yaml}: {e}");
    }
}

/// `router_settings.max_upstream_connections`, `max_idle_upstream_connections` and
/// `connect_timeout` are the defaults of every deployment with an upstream, each deployment's own
/// winning key by key; not applied to a `mock_response` entry; a bad one is refused by its path,
/// with no deployment to take it too; unknown keys beside them are still named.
#[test]
fn router_settings_give_every_deployment_its_pool_bounds() {
    let yaml = "model_list:\n\
        - {model_name: a, litellm_params: {model: openai/a, api_base: \"http://h/v1\"}}\n\
        - {model_name: b, litellm_params: {model: openai/b, api_base: \"http://h/v1\", \
           max_upstream_connections: 16, connect_timeout: 1}}\n\
        - {model_name: m, litellm_params: {model: openai/m, mock_response: hi}}\n\
        router_settings: {max_upstream_connections: 8, max_idle_upstream_connections: 4, \
           connect_timeout: 2.5, max_upstream_conections: 3}\n";
    let c = GatewayConfig::from_yaml_str(yaml).unwrap();
    let bounds = |i: usize| {
        let own = &c.deployments[i].connections;
        (own.max_connections, own.max_idle, own.connect_timeout)
    };
    assert_eq!(
        bounds(0),
        (Some(8), Some(4), Some(Duration::from_millis(2500)))
    );
    assert_eq!(bounds(1), (Some(16), Some(4), Some(Duration::from_secs(1))));
    assert!(c.deployments[0].connections.is_set());
    assert!(!c.deployments[2].connections.is_set(), "a mock has no pool");
    let warning = c.unsupported_warning().unwrap_or_default();
    assert!(
        warning.contains("router_settings.max_upstream_conections"),
        "{warning}"
    );
    assert!(
        !warning.contains("router_settings.connect_timeout"),
        "{warning}"
    );

    for (yaml, at, says) in [
        (
            "router_settings: {max_upstream_connections: 0}".to_owned(),
            "router_settings.max_upstream_connections",
            "from 1 to 100000, got 0",
        ),
        (
            "router_settings: {connect_timeout: 0}".to_owned(),
            "router_settings.connect_timeout",
            "seconds > 0",
        ),
        (
            "router_settings: {max_upstream_connections: 2, max_idle_upstream_connections: 3}"
                .to_owned(),
            "router_settings.max_idle_upstream_connections",
            "3 idle connections cannot be kept with max_upstream_connections 2",
        ),
        // The default's idle bound over a deployment's own: both named.
        (
            "model_list: [{model_name: a, litellm_params: {model: openai/a, \
             api_base: \"http://h/v1\", max_upstream_connections: 2}}]\n\
             router_settings: {max_idle_upstream_connections: 3}"
                .to_owned(),
            "router_settings.max_idle_upstream_connections",
            "with max_upstream_connections 2 (model_list[0].litellm_params.max_upstream_connections)",
        ),
    ] {
        let e = GatewayConfig::from_yaml_str(&yaml).unwrap_err().to_string();
        assert!(e.starts_with(at) && e.contains(says), "{yaml}: {e}");
    }
}

/// LiteLLM's reliability settings in `litellm_settings` (as its own docs write them) are read
/// where `router_settings` does not set them, and `router_settings` wins where both do. Before,
/// they were named as not supported and the request was neither retried nor fallen back.
#[test]
fn reliability_settings_are_read_from_litellm_settings_too() {
    let list = "model_list:\n  - {model_name: a, litellm_params: {model: openai/a}}\n  \
                - {model_name: b, litellm_params: {model: openai/b}}\n";
    let c = GatewayConfig::from_yaml_str(&format!(
        "{list}litellm_settings: {{num_retries: 3, fallbacks: [{{a: [b]}}], allowed_fails: 5, \
         cooldown_time: 30}}\n"
    ))
    .unwrap();
    assert_eq!(c.router.num_retries, 3);
    assert_eq!(c.router.fallbacks_of("a"), ["b".to_owned()]);
    assert_eq!(c.router.allowed_fails, 5);
    assert_eq!(c.router.cooldown, Duration::from_secs(30));
    assert_eq!(c.unsupported_warning(), None, "nothing named as not read");

    let c = GatewayConfig::from_yaml_str(&format!(
        "{list}litellm_settings: {{num_retries: 3, fallbacks: [{{a: [b]}}]}}\n\
         router_settings: {{num_retries: 1}}\n"
    ))
    .unwrap();
    assert_eq!(c.router.num_retries, 1, "router_settings wins");
    assert_eq!(c.router.fallbacks_of("a"), ["b".to_owned()]);

    // Checked as under router_settings, with the path they were given at.
    let e = GatewayConfig::from_yaml_str(&format!(
        "{list}litellm_settings: {{fallbacks: [{{a: [nowhere]}}]}}\n"
    ))
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("litellm_settings.fallbacks: \"nowhere\""),
        "{e}"
    );
    let e = GatewayConfig::from_yaml_str(&format!("{list}litellm_settings: {{num_retries: -1}}\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("litellm_settings.num_retries"), "{e}");
}

/// LiteLLM's `environment_variables` give the names the config reads where the process
/// environment does not: an `os.environ/` reference anywhere (the limiter's `rpm` too) and the
/// provider key read when a deployment gives none. The process environment wins. Before, the
/// block was named as not supported and such a config did not start.
#[test]
fn environment_variables_fill_in_what_the_environment_does_not_set() {
    let yaml = "environment_variables:\n  GW_TEST_ENVBLOCK_KEY: sk-from-the-file\n  \
                GW_TEST_ENVBLOCK_RPM: 7\n  OPENAI_API_KEY: sk-openai-from-the-file\n\
                model_list:\n  - model_name: a\n    litellm_params: {model: openai/a, api_base: \
                \"http://127.0.0.1:9/v1\", api_key: os.environ/GW_TEST_ENVBLOCK_KEY, rpm: \
                os.environ/GW_TEST_ENVBLOCK_RPM}\n  - model_name: b\n    litellm_params: \
                {model: openai/b, api_base: \"http://127.0.0.1:9/v1\"}\n";
    let key = |c: &GatewayConfig, i: usize| match &c.deployments[i].target {
        Target::Upstream { api_key, .. } => api_key.clone(),
        Target::Mock { .. } => None,
    };
    let c = GatewayConfig::from_yaml_str_with_env(yaml, |_| None).unwrap();
    assert_eq!(key(&c, 0).as_deref(), Some("sk-from-the-file"));
    assert_eq!(c.deployments[0].rpm, Some(7));
    assert_eq!(key(&c, 1).as_deref(), Some("sk-openai-from-the-file"));
    assert_eq!(c.unsupported_warning(), None);
    // The process environment wins (here, the one the config is read with).
    let c = GatewayConfig::from_yaml_str_with_env(yaml, |name| {
        (name == "OPENAI_API_KEY").then(|| "sk-openai-from-the-process".to_owned())
    })
    .unwrap();
    assert_eq!(key(&c, 1).as_deref(), Some("sk-openai-from-the-process"));
    let e = GatewayConfig::from_yaml_str("environment_variables: {X: [1]}\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("environment_variables.X"), "{e}");
}

#[test]
fn a_number_as_a_key_is_named_by_its_path() {
    // `{…, 30, …}` in a flow mapping is the key 30 with no value: named like any other key the
    // gateway does not read, not refused as a document that is not YAML.
    let yaml = "model_list:\n- {model_name: m, litellm_params: {model: openai/m, mock_response: hi, 30}}\n";
    let warning = not_honoured(yaml);
    assert!(
        warning.contains("model_list[0].litellm_params.30"),
        "{warning}"
    );
}

/// Settings that restrict or enforce in LiteLLM, and `include` (whose files could hold a master
/// key), are refused by path; LiteLLM's pre-call checks are named with what they are here.
#[test]
fn restricting_settings_and_include_are_refused() {
    let entry =
        "model_list:\n- {model_name: m, litellm_params: {model: openai/m, mock_response: hi}}\n";
    for (yaml, path) in [
        ("include: [keys.yaml]", "include"),
        (
            "general_settings: {ui_access_mode: admin_only}",
            "general_settings.ui_access_mode",
        ),
        (
            "general_settings: {disable_llm_api_endpoints: true}",
            "general_settings.disable_llm_api_endpoints",
        ),
        (
            "general_settings: {reject_clientside_metadata_tags: true}",
            "general_settings.reject_clientside_metadata_tags",
        ),
        (
            "general_settings: {max_response_size_mb: 5}",
            "general_settings.max_response_size_mb",
        ),
        (
            "general_settings: {token_rate_limit_type: output}",
            "general_settings.token_rate_limit_type",
        ),
    ] {
        let e = GatewayConfig::from_yaml_str_with_env(&format!("{entry}{yaml}\n"), |_| None)
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("{path}: ")), "{yaml}: {e}");
    }
    let warning = not_honoured(&format!(
        "{entry}router_settings: {{enable_pre_call_checks: true}}\n"
    ));
    assert!(
        warning.contains("router_settings.enable_pre_call_checks (deployments' rpm and tpm are always enforced here"),
        "{warning}"
    );
}

/// The proxy-wide TLS settings with no `https://` upstream do nothing: named, not passed over.
#[test]
fn proxy_wide_tls_settings_without_an_https_upstream_are_named() {
    let http = "model_list:\n- {model_name: m, litellm_params: {model: openai/m, api_base: \"http://127.0.0.1:9/v1\"}}\n";
    let warning = not_honoured(&format!("{http}litellm_settings: {{ssl_verify: false}}\n"));
    assert!(
        warning.contains("litellm_settings.ssl_verify (verifies https:// upstreams only"),
        "{warning}"
    );
    let https = http.replace("http://127.0.0.1:9", "https://127.0.0.1:9");
    let yaml = format!("{https}litellm_settings: {{ssl_verify: false}}\n");
    assert_eq!(not_honoured(&yaml), "");
}

/// An environment reference where a list is expected says that it gives single values only.
#[test]
fn an_environment_reference_for_a_list_says_it_gives_single_values() {
    let yaml =
        "model_list:\n- {model_name: m, litellm_params: {model: openai/m, mock_response: hi}}\n\
                router_settings: {fallbacks: os.environ/FB}\n";
    let e = GatewayConfig::from_yaml_str_with_env(yaml, |_| Some("x".into()))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(
            "router_settings.fallbacks: expected a list, got a string (an os.environ/ reference"
        ),
        "{e}"
    );
}
