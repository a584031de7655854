//! The config loaders: `LimiterConfig::from_yaml_str` and the gateway's
//! `GatewayConfig::from_yaml_str_with_env`, fed configs generated from the documented keys with
//! random values of every type, mutations of the real configs (the quick start and every YAML
//! block of docs/configuration.md), and random text.
//!
//! Properties: no panic; a config either loads or errors with a message, and the error names
//! where: text that is not YAML (or not a JSON-like tree) is `invalid YAML` with an empty path,
//! a document that is a mapping gets a path whose first segment is one of its top-level keys.
//! A loaded limiter config finds each of its models by name, and no pool gets more than its model
//! (`floor(capacity × share)`, shares at most 1).

use gateway_example::config::GatewayConfig;
use proptest::prelude::*;
use proptest::test_runner::TestCaseResult;
use serde_json::{json, Map, Value};
use tower_priority_limit::config::PoolRef;
use tower_priority_limit::LimiterConfig;

use crate::fuzz;
use crate::mutate::mutated;

/// A config using most keys, each with a valid value.
const FULL: &str = r#"
model_list:
  - model_name: gpt-4o
    litellm_params: {model: openai/gpt-4o, api_base: "http://127.0.0.1:9/v1", api_key: os.environ/FUZZ_NOT_SET, rpm: 600, tpm: 100000, timeout: 30, weight: 2}
    model_info: {id: a}
  - model_name: gpt-4o
    litellm_params: {model: openai/gpt-4o, mock_response: hi, rpm: 60}
    model_info: {id: b}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation:
    prod: {type: rpm, value: 300}
    dev: {type: percent, value: 0.2}
    batch: 0.1
  priority_reservation_settings:
    default_priority: 0.1
    saturation_threshold: 0.8
    saturation_check_cache_ttl: 1.5
    redis_failure_mode: local
    expected_nodes: 2
    redis_timeout_ms: 40
    max_reported_tokens: 1000000
router_settings:
  routing_strategy: simple-shuffle
  num_retries: 2
  cooldown_time: 5
  allowed_fails: 3
  fallbacks: [{gpt-4o: [gpt-4o]}]
general_settings:
  master_key: sk-fuzz
  max_request_size_mb: 1.5
  request_body_timeout_seconds: 10
  redis_url: redis://user:pass@127.0.0.1:1/0
"#;

/// The quick start, [`FULL`], and the YAML blocks of the docs.
fn corpus() -> Vec<Vec<u8>> {
    let mut out = vec![
        include_str!("../../gateway-example/config/quickstart.yaml").to_owned(),
        FULL.to_owned(),
    ];
    let docs = [
        include_str!("../../docs/configuration.md"),
        include_str!("../../docs/behaviour.md"),
        include_str!("../../docs/routing.md"),
    ];
    let mut block: Option<String> = None;
    for line in docs.iter().flat_map(|d| d.lines()) {
        match &mut block {
            None if line.trim_start().starts_with("```yaml") => block = Some(String::new()),
            Some(b) if line.trim_start().starts_with("```") => {
                out.push(std::mem::take(b));
                block = None;
            }
            Some(b) => {
                b.push_str(line);
                b.push('\n');
            }
            None => {}
        }
    }
    out.into_iter().map(String::into_bytes).collect()
}

/// YAML (and JSON) tokens the mutations insert.
const DICTIONARY: &[&[u8]] = &[
    b"\n",
    b"\n  ",
    b"\n    ",
    b" ",
    b"\t",
    b"- ",
    b": ",
    b":",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b"'",
    b"\"",
    b"#",
    b"~",
    b"null",
    b"true",
    b"no",
    b".inf",
    b"-.inf",
    b".nan",
    b"1e999",
    b"-1",
    b"0",
    b"0.5",
    b"1.5",
    b"0x1F",
    b"0o17",
    b"1_000",
    b"18446744073709551616",
    b"1e30",
    b"&a ",
    b"*a",
    b"!!str ",
    b"!!binary ",
    b"<<: *a",
    b"---\n",
    b"...\n",
    b"? ",
    b"|\n  ",
    b">-\n  ",
    b"os.environ/FUZZ_NOT_SET",
    b"rpm: ",
    b"tpm: ",
    b"model_list:\n  - ",
    b"model_name: ",
    b"litellm_params: ",
    b"priority_reservation: ",
    b"type: rpm",
    b"value: ",
    b"\xff",
    b"\0",
    b"saturation_check_cache_ttl: ",
    b"max_reported_tokens: ",
    b"expected_nodes: ",
];

/// A number-ish value: every JSON type, numbers at and past every edge.
fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        (0u64..2000).prop_map(Value::from),
        Just(json!(0)),
        Just(json!(-1)),
        Just(json!(0.5)),
        Just(json!(1.5)),
        Just(json!(1e30)),
        Just(json!(-1e30)),
        Just(json!(1.7976931348623157e308)),
        Just(json!(u64::MAX)),
        Just(json!(i64::MIN)),
        Just(json!(5e-324)),
        any::<f64>().prop_map(Value::from), // NaN and inf become null
        any::<i64>().prop_map(Value::from),
        Just(json!("12")),
        Just(json!("0.25")),
        Just(json!("1e999")),
        Just(json!("abc")),
        Just(json!("")),
        Just(json!("os.environ/FUZZ_NOT_SET")),
        Just(json!(true)),
        Just(Value::Null),
        Just(json!([])),
        Just(json!([1, 2])),
        Just(json!({})),
        Just(json!({"type": "rpm", "value": 1})),
        crate::text(12).prop_map(Value::from),
    ]
}

/// A mapping of some of `keys` (and sometimes an unknown one) to values from `value`.
fn mapping(
    keys: &'static [&'static str],
    value: impl Strategy<Value = Value>,
) -> impl Strategy<Value = Value> {
    proptest::collection::vec((0..keys.len() + 1, value), 0..keys.len() + 2).prop_map(move |kv| {
        let mut m = Map::new();
        for (k, v) in kv {
            m.insert(keys.get(k).copied().unwrap_or("fuzz_unknown").to_owned(), v);
        }
        Value::Object(m)
    })
}

/// A config built from the documented keys, each with a right or wrong value.
fn generated() -> impl Strategy<Value = Value> {
    let name = prop_oneof![
        Just(json!("m")),
        Just(json!("gpt-4o")),
        Just(json!("")),
        crate::text(10).prop_map(Value::from),
        scalar(),
    ];
    let params = mapping(
        &[
            "model",
            "rpm",
            "tpm",
            "api_base",
            "api_key",
            "mock_response",
            "timeout",
            "stream_timeout",
            "weight",
        ],
        prop_oneof![
            3 => scalar(),
            1 => Just(json!("http://127.0.0.1:1/v1")),
            1 => Just(json!("openai/m")),
            1 => Just(json!("http://user:pass@[::1/v1")),
        ],
    );
    let item = (name, params, mapping(&["id"], scalar()), 0u8..8).prop_map(
        |(name, params, info, drop)| {
            let mut m = Map::new();
            if drop & 1 == 0 {
                m.insert("model_name".into(), name);
            }
            if drop & 2 == 0 {
                m.insert("litellm_params".into(), params);
            }
            if drop & 4 == 0 {
                m.insert("model_info".into(), info);
            }
            Value::Object(m)
        },
    );
    let model_list = prop_oneof![
        6 => proptest::collection::vec(item, 0..4).prop_map(Value::from),
        1 => scalar(),
    ];
    let reservation = prop_oneof![
        scalar(),
        (
            prop_oneof![
                Just(json!("rpm")),
                Just(json!("tpm")),
                Just(json!("percent")),
                Just(json!("rpx")),
                scalar()
            ],
            scalar(),
            0u8..4
        )
            .prop_map(|(t, v, drop)| {
                let mut m = Map::new();
                if drop & 1 == 0 {
                    m.insert("type".into(), t);
                }
                if drop & 2 == 0 {
                    m.insert("value".into(), v);
                }
                Value::Object(m)
            }),
    ];
    let reservations = proptest::collection::vec(
        (
            prop_oneof![Just("prod"), Just("dev"), Just(""), Just("batch")],
            reservation,
        ),
        0..4,
    )
    .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()));
    let settings = mapping(
        &[
            "default_priority",
            "saturation_threshold",
            "saturation_check_cache_ttl",
            "redis_failure_mode",
            "expected_nodes",
            "redis_timeout_ms",
            "max_reported_tokens",
        ],
        prop_oneof![4 => scalar(), 1 => Just(json!("local")), 1 => Just(json!("open")), 1 => Just(json!("closed"))],
    );
    let litellm = (
        prop_oneof![
            Just(json!(["dynamic_rate_limiter_v3"])),
            Just(json!([])),
            scalar()
        ],
        prop_oneof![3 => reservations, 1 => scalar()],
        prop_oneof![3 => settings, 1 => scalar()],
        0u8..8,
    )
        .prop_map(|(callbacks, reservation, settings, drop)| {
            let mut m = Map::new();
            if drop & 1 == 0 {
                m.insert("callbacks".into(), callbacks);
            }
            if drop & 2 == 0 {
                m.insert("priority_reservation".into(), reservation);
            }
            if drop & 4 == 0 {
                m.insert("priority_reservation_settings".into(), settings);
            }
            Value::Object(m)
        });
    let general = mapping(
        &[
            "master_key",
            "max_request_size_mb",
            "request_body_timeout_seconds",
            "header_read_timeout_seconds",
            "send_timeout_seconds",
            "max_connections",
            "redis_url",
            "redis_host",
            "redis_port",
            "redis_password",
            "redis_startup_nodes",
            "redis_key_prefix",
            "host",
            "port",
        ],
        scalar(),
    );
    let router = mapping(
        &[
            "routing_strategy",
            "num_retries",
            "cooldown_time",
            "allowed_fails",
            "fallbacks",
            "max_retry_wait",
            "retry_budget",
            "timeout",
        ],
        prop_oneof![
            3 => scalar(),
            1 => Just(json!("simple-shuffle")),
            1 => Just(json!([{"m": ["n"]}])),
            1 => Just(json!({"ratio": 0.1, "min_per_second": 1})),
        ],
    );
    (model_list, litellm, general, router, 0u8..16).prop_map(
        |(list, litellm, general, router, drop)| {
            let mut m = Map::new();
            for (bit, key, value) in [
                (1, "model_list", list),
                (2, "litellm_settings", litellm),
                (4, "general_settings", general),
                (8, "router_settings", router),
            ] {
                if drop & bit == 0 {
                    m.insert(key.into(), value);
                }
            }
            Value::Object(m)
        },
    )
}

/// Config text: generated (as JSON, which is YAML, or as block YAML), a mutated real config, or
/// random text.
#[derive(Debug, Clone)]
enum Input {
    Generated { doc: Value, block: bool },
    Mutated(crate::mutate::Mutated),
    Random(Vec<u8>),
}

fn input() -> impl Strategy<Value = Input> {
    prop_oneof![
        4 => (generated(), any::<bool>()).prop_map(|(doc, block)| Input::Generated { doc, block }),
        4 => mutated(0).prop_map(Input::Mutated),
        1 => proptest::collection::vec(any::<u8>(), 0..256).prop_map(Input::Random),
    ]
}

fn text(input: &Input, corpus: &[Vec<u8>]) -> String {
    match input {
        Input::Generated { doc, block: false } => doc.to_string(),
        Input::Generated { doc, block: true } => serde_yaml_ng::to_string(doc).unwrap(),
        Input::Mutated(m) => String::from_utf8_lossy(&m.apply(corpus, DICTIONARY)).into_owned(),
        Input::Random(bytes) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// The error names where it is, as far as a test can tell from the document.
/// How the gateway's refusal of unsupported keys begins (gateway-example's
/// `config::unsupported::refusal`).
const UNSUPPORTED_REFUSAL: &str = "the config sets what this gateway does not do";

fn check_error(yaml: &str, path: &str, message: &str, display: &str) -> TestCaseResult {
    prop_assert!(!message.is_empty(), "empty message at {:?}", path);
    prop_assert!(display.ends_with(message) && display.starts_with(path));
    // A mapping that repeats a key is invalid too (the JSON tree would keep the last).
    let repeats_a_key = serde_yaml_ng::from_str::<serde_yaml_ng::Value>(yaml).is_err();
    match serde_yaml_ng::from_str::<Value>(yaml) {
        // Valid YAML with an integer past 64 bits is told apart from invalid YAML (the loader
        // says the number is too large); either is about the whole document.
        Err(_) => {
            prop_assert_eq!(path, "", "{}", message);
            prop_assert!(
                message.starts_with("invalid YAML") || message.starts_with("a number too large"),
                "{}",
                message
            );
        }
        Ok(_) if repeats_a_key => {
            prop_assert_eq!(path, "", "{}", message);
            prop_assert!(message.starts_with("invalid YAML"), "{}", message);
        }
        // The refusal of unsupported keys is about every place it lists (each by its path, in
        // the message): the root path is right for it.
        Ok(Value::Object(_)) if path.is_empty() && message.starts_with(UNSUPPORTED_REFUSAL) => {}
        Ok(Value::Object(top)) => {
            let first = path.split(['.', '[']).next().unwrap_or_default();
            prop_assert!(
                top.contains_key(first),
                "error path {:?} does not start at a key of the document ({})",
                path,
                message
            );
        }
        Ok(_) => {} // the whole document is at fault: the root path ("") is right
    }
    Ok(())
}

fn check_limiter(yaml: &str) -> TestCaseResult {
    match LimiterConfig::from_yaml_str(yaml) {
        Ok(config) => {
            for (i, model) in config.models().iter().enumerate() {
                prop_assert_eq!(config.model_id(model.name()).map(|id| id.index()), Some(i));
                let pools = (0..config.priorities().len())
                    .map(|i| PoolRef::Named(i as u16))
                    .chain([PoolRef::Default]);
                for pool in pools {
                    if let Some(limits) = model.pool(pool) {
                        prop_assert!(limits.rpm <= model.rpm, "{:?} rpm over the model's", pool);
                        prop_assert!(limits.tpm <= model.tpm, "{:?} tpm over the model's", pool);
                        let share = model.share(pool).unwrap_or(0.0);
                        prop_assert!((0.0..=1.0).contains(&share), "share {}", share);
                    }
                }
            }
        }
        Err(e) => check_error(yaml, e.path(), e.message(), &e.to_string())?,
    }
    Ok(())
}

fn check_gateway(yaml: &str) -> TestCaseResult {
    if let Err(e) = GatewayConfig::from_yaml_str_with_env(yaml, |_| None) {
        check_error(yaml, e.path(), e.message(), &e.to_string())?;
    }
    Ok(())
}

#[test]
fn limiter_config() {
    let corpus = corpus();
    fuzz("limiter_config", input(), |input| {
        let text = text(&input, &corpus);
        crate::with_input(check_limiter(&text), &text)
    });
}

#[test]
fn gateway_config() {
    let corpus = corpus();
    fuzz("gateway_config", input(), |input| {
        let text = text(&input, &corpus);
        crate::with_input(check_gateway(&text), &text)
    });
}

/// Found by `gateway_config`: `router_settings.cooldown_time`, `max_retry_wait` and a deployment's
/// `timeout` too big for a `Duration` panicked in `Duration::from_secs_f64`
/// (gateway-example/src/config/{router,deployment}.rs); now refused with the path.
#[test]
fn huge_gateway_durations_are_refused_with_the_path() {
    let cases = [
        ("router_settings: {cooldown_time: 1.7976931348623157e308}", "router_settings.cooldown_time"),
        ("router_settings: {max_retry_wait: 1e30}", "router_settings.max_retry_wait"),
        (
            "model_list: [{model_name: m, litellm_params: {model: m, mock_response: hi, timeout: 1e20}}]",
            "model_list[0].litellm_params.timeout",
        ),
    ];
    for (yaml, path) in cases {
        let err = GatewayConfig::from_yaml_str_with_env(yaml, |_| None).unwrap_err();
        assert_eq!(err.path(), path, "{err}");
        assert!(
            err.message().contains("too long") || err.message().contains("at most 86400"),
            "{err}"
        );
    }
}

/// Found by `limiter_config`: a `saturation_check_cache_ttl` too big for a `Duration` passed the
/// `is_finite() && >= 0` check and then panicked in `Duration::from_secs_f64`
/// (tower-priority-limit/src/config/yaml.rs); now refused with the path.
#[test]
fn a_huge_cache_ttl_is_refused_with_the_path() {
    for ttl in ["1e30", "18446744073709551616", "\"1e20\""] {
        let yaml = format!(
            "model_list: [{{model_name: m, litellm_params: {{rpm: 1}}}}]\n\
             litellm_settings: {{priority_reservation_settings: {{saturation_check_cache_ttl: {ttl}}}}}\n"
        );
        let result = std::panic::catch_unwind(|| LimiterConfig::from_yaml_str(&yaml));
        let err = result
            .unwrap_or_else(|_| {
                panic!("saturation_check_cache_ttl: {ttl} panics instead of an error")
            })
            .expect_err("a TTL past Duration::MAX is refused");
        // A number past what JSON holds is refused by the YAML reader, which names the path in
        // its message; the others by the loader, with the path.
        let key = "litellm_settings.priority_reservation_settings.saturation_check_cache_ttl";
        assert!(
            err.path() == key || err.message().contains(key),
            "{ttl}: {err}"
        );
    }
}

/// The corpus is real: every YAML block of the docs that is a whole config loads.
#[test]
fn corpus_has_configs_that_load() {
    let corpus = corpus();
    assert!(corpus.len() > 3, "{} configs", corpus.len());
    let quickstart = std::str::from_utf8(&corpus[0]).unwrap();
    LimiterConfig::from_yaml_str(quickstart).unwrap();
    GatewayConfig::from_yaml_str_with_env(quickstart, |_| None).unwrap();
}

/// Found by `gateway_config`: a refused callback (custom code) gives the refusal of unsupported
/// keys, whose path is the root (it lists each place in its message); the check took the root
/// path for a fault.
#[test]
fn the_refusal_of_unsupported_keys_passes_the_error_check() {
    let yaml = "litellm_settings: {callbacks: [\"custom_callbacks.proxy_handler_instance\"]}\n";
    let err = GatewayConfig::from_yaml_str_with_env(yaml, |_| None).unwrap_err();
    assert_eq!(err.path(), "");
    assert!(err.message().starts_with(UNSUPPORTED_REFUSAL), "{err}");
    check_gateway(yaml).unwrap();
}
