//! A LiteLLM config means what it says: limits wherever LiteLLM reads them (the `model_list`
//! entry, `litellm_params`, `model_info`), YAML numbers as PyYAML (YAML 1.1, LiteLLM's loader)
//! reads them, checked against PyYAML itself where it is installed.

use std::io::Write;
use std::process::{Command, Stdio};

use gateway_example::config::GatewayConfig;
use integration_tests::external::required;
use integration_tests::gateway::{with_master, Gw, MASTER};
use serde_json::Value;
use tower_priority_limit::config::ConfigError;

/// The gateway's YAML walker, which is the limiter's: compiled here from the same file, as the
/// gateway compiles it (it is no public API of either).
#[path = "../../tower-priority-limit/src/config/node.rs"]
#[allow(dead_code)]
mod node;
use node::Node;

/// How many of `n` chats to `model` are served (then the rest are 429s, checked).
async fn served_of(gw: &Gw, model: &str, n: usize) -> usize {
    let mut served = 0;
    for _ in 0..n {
        let r = gw.chat(MASTER, model, false).await;
        match r.status.as_u16() {
            200 => served += 1,
            429 => {}
            other => panic!("{model}: {other} {}", r.text()),
        }
    }
    served
}

const LIMITS: &str = r#"
model_list:
  # LiteLLM's load_balancer.yaml form: the limits on the entry itself.
  - model_name: on-entry
    litellm_params: {model: openai/a, mock_response: "hi"}
    rpm: 6
    tpm: 80_000
  - model_name: in-model-info
    litellm_params: {model: openai/b, mock_response: "hi"}
    model_info: {rpm: 2}
  - model_name: in-params
    litellm_params: {model: openai/c, mock_response: "hi", rpm: 3}
  - model_name: everywhere-alike
    litellm_params: {model: openai/d, mock_response: "hi", rpm: 4}
    model_info: {rpm: 4}
    rpm: 4
"#;

/// `rpm` on the entry, in `model_info` and in `litellm_params` each caps the model: with the
/// limiter on (the group's limit) and off (the deployment's own, kept by the router).
#[tokio::test]
async fn limits_are_read_wherever_litellm_reads_them() {
    for limiter in [true, false] {
        let callbacks = if limiter {
            "litellm_settings:\n  callbacks: [\"dynamic_rate_limiter_v3\"]\n"
        } else {
            ""
        };
        let gw = Gw::start(&with_master(&format!("{LIMITS}{callbacks}")), None).await;
        for (model, cap) in [
            ("on-entry", 6),
            ("in-model-info", 2),
            ("in-params", 3),
            ("everywhere-alike", 4),
        ] {
            assert_eq!(
                served_of(&gw, model, cap + 2).await,
                cap,
                "{model}, limiter {limiter}"
            );
        }
        let config = gw.gateway.config();
        let entry = config
            .deployments
            .iter()
            .find(|d| d.model_name == "on-entry")
            .unwrap();
        assert_eq!((entry.rpm, entry.tpm), (Some(6), Some(80_000)));
    }
}

/// The limit read from the entry is the limiter's group limit too, shown in its headers.
#[tokio::test]
async fn an_entry_tpm_in_pyyaml_notation_is_the_group_limit() {
    let yaml = with_master(&format!(
        "{LIMITS}litellm_settings:\n  callbacks: [\"dynamic_rate_limiter_v3\"]\n"
    ));
    let gw = Gw::start(&yaml, None).await;
    let r = gw.chat(MASTER, "on-entry", false).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["x-ratelimit-limit-tokens"], "80000");
    assert_eq!(r.headers["x-ratelimit-limit-requests"], "6");
}

/// The same limit written in two places with different values is refused, naming both paths.
#[test]
fn conflicting_limits_are_refused_naming_both_paths() {
    for (entry, first, second) in [
        (
            "{model_name: m, rpm: 6, litellm_params: {model: openai/m, mock_response: hi, rpm: 7}}",
            "model_list[0].rpm: 6",
            "model_list[0].litellm_params.rpm: 7",
        ),
        (
            "{model_name: m, litellm_params: {model: openai/m, mock_response: hi, tpm: 1000}, model_info: {tpm: 2000}}",
            "model_list[0].litellm_params.tpm: 1000",
            "model_list[0].model_info.tpm: 2000",
        ),
    ] {
        let err = GatewayConfig::from_yaml_str(&format!("model_list:\n  - {entry}\n"))
            .unwrap_err()
            .to_string();
        let (path, value) = second.split_once(": ").unwrap();
        assert_eq!(
            err,
            format!(
                "{path}: {value} disagrees with {first} (LiteLLM reads {} from the entry, \
                 litellm_params and model_info, the first it finds; write it once)",
                &path[path.len() - 3..]
            )
        );
    }
}

/// Plain scalars whose reading by PyYAML this gateway follows: every one PyYAML reads as a
/// number, and some it reads as a string. (Not `.inf`: the loader here reads it as nothing, so a
/// limit of `.inf` is no limit, as it says.)
const SCALARS: [&str; 44] = [
    "80_000",
    "1_000_000",
    "1__0",
    "1_",
    "0",
    "00",
    "0_",
    "010",
    "0777",
    "0x1F",
    "0x_1",
    "+0x10",
    "0b101",
    "-0b11",
    "-5",
    "+5",
    "100",
    "1:30",
    "1:3",
    "190:20:30",
    "1_0.5",
    ".5",
    "1.",
    "1.5",
    "1.5_",
    "1._5",
    "1.0e+5",
    "1.e+5",
    "1:30.5",
    "-1_000",
    "100000.0", // numbers to PyYAML
    "1e5",
    "1.0e5",
    "1e+5",
    "6e7",
    "0o10",
    "09",
    "-.5",
    "+.5", // numbers here, strings to PyYAML
    "1,000",
    "100k",
    "_1",
    "0b",
    "1:60", // strings to both: an error in a number field
];

/// What a number field reads each of [`SCALARS`] as, written down: PyYAML's number where it reads
/// one; where it reads a string, the number that string writes as Rust reads it (`1e5`: PyYAML's
/// YAML 1.1 has no exponent without a `.`, YAML 1.2 and the gateway read 100000), else `None`,
/// an error.
fn ours(scalar: &str) -> Option<f64> {
    let doc: Value = serde_yaml_ng::from_str(&format!("n: {scalar}")).unwrap();
    let root = Node::root(&doc);
    let node = root.get("n").unwrap()?;
    node.number().ok()
}

#[test]
fn yaml_numbers_read_as_written_down() {
    let want: [Option<f64>; 44] = [
        Some(80_000.0),
        Some(1e6),
        Some(10.0),
        Some(1.0),
        Some(0.0),
        Some(0.0),
        Some(0.0),
        Some(8.0),
        Some(511.0),
        Some(31.0),
        Some(1.0),
        Some(16.0),
        Some(5.0),
        Some(-3.0),
        Some(-5.0),
        Some(5.0),
        Some(100.0),
        Some(90.0),
        Some(63.0),
        Some(685_230.0),
        Some(10.5),
        Some(0.5),
        Some(1.0),
        Some(1.5),
        Some(1.5),
        Some(1.5),
        Some(1e5),
        Some(1e5),
        Some(90.5),
        Some(-1000.0),
        Some(1e5), // PyYAML's numbers
        Some(1e5),
        Some(1e5),
        Some(1e5),
        Some(6e7),
        Some(8.0),
        Some(9.0),
        Some(-0.5),
        Some(0.5),
        None,
        None,
        None,
        None,
        None,
    ];
    for (scalar, want) in SCALARS.iter().zip(want) {
        assert_eq!(ours(scalar), want, "{scalar}");
    }
}

/// [`SCALARS`] through PyYAML itself (`yaml.safe_load`, as LiteLLM loads its config): where it
/// reads an int or a float, the gateway reads the same number; where it reads a string, the
/// gateway reads what [`yaml_numbers_read_as_written_down`] says. Skipped loudly without python3
/// and PyYAML, unless `REQUIRE_PYYAML=1`.
#[test]
fn yaml_numbers_as_pyyaml_reads_them() {
    let script = "import sys, yaml\n\
        for line in sys.stdin.read().splitlines():\n\
        \x20   v = yaml.safe_load('n: ' + line)['n']\n\
        \x20   print(type(v).__name__, repr(float(v)) if type(v) in (int, float) else '-')\n";
    let child = Command::new("python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let pyyaml = Command::new("python3")
        .args(["-c", "import yaml"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let (Ok(mut child), true) = (child, pyyaml) else {
        if required("REQUIRE_PYYAML") {
            panic!("REQUIRE_PYYAML=1 but python3 with PyYAML is not there");
        }
        eprintln!(
            "\n*** SKIPPED yaml_numbers_as_pyyaml_reads_them: python3 with PyYAML is not there \
             (pip install pyyaml); set REQUIRE_PYYAML=1 to make this a failure ***\n"
        );
        return;
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(SCALARS.join("\n").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), SCALARS.len(), "{out}");
    let mut strings = 0;
    for (scalar, line) in SCALARS.iter().zip(lines) {
        let (kind, value) = line.split_once(' ').unwrap();
        match kind {
            "int" | "float" => {
                let pyyaml: f64 = value.parse().unwrap();
                assert_eq!(ours(scalar), Some(pyyaml), "{scalar}: PyYAML reads {value}");
            }
            "str" => strings += 1,
            other => panic!("{scalar}: PyYAML reads a {other}"),
        }
    }
    // The ones the list says PyYAML reads as strings, and no more.
    assert_eq!(strings, 13, "{out}");
}

/// What a config of the corpus does at start.
enum Expect {
    /// Starts, honouring every key.
    Start,
    /// Starts, with the one warning line naming these keys (as shown: a path, a callback's item
    /// with its name).
    Warn(&'static [&'static str]),
    /// Refuses to start, naming these keys (as shown) and the `--ignore-unsupported` list.
    Refuse(&'static [&'static str], &'static str),
}

/// LiteLLM configs in the forms its documentation gives them (its proxy quick start,
/// `load_balancer.yaml`, guardrails, tag routing, budgets, callbacks, caching, auth), every setting
/// of issue 33 in each place LiteLLM accepts it, and what each does here.
fn corpus() -> Vec<(&'static str, String, Expect)> {
    let model = "model_list:\n  - model_name: gpt-4o\n    litellm_params: {model: openai/gpt-4o, api_key: sk-up, mock_response: hi}\n";
    let with = |rest: &str| format!("{model}{rest}");
    vec![
        (
            "quick start with the limiter",
            with("litellm_settings:\n  callbacks: [\"dynamic_rate_limiter_v3\"]\n  priority_reservation: {prod: 0.9}\ngeneral_settings:\n  master_key: sk-1234\n"),
            Expect::Start,
        ),
        (
            "load_balancer.yaml: limits on the entry, in model_info, and prometheus",
            "model_list:\n  - model_name: gpt-4o\n    litellm_params: {model: openai/gpt-4o, mock_response: hi}\n    rpm: 6\n    tpm: 80_000\n  - model_name: gpt-4o\n    litellm_params: {model: openai/gpt-4o-mini, mock_response: hi}\n    model_info: {id: second, rpm: 3}\nlitellm_settings:\n  callbacks: [\"prometheus\"]\n  require_auth_for_metrics_endpoint: true\nrouter_settings:\n  routing_strategy: usage-based-routing-v2\n  num_retries: 2\n".into(),
            Expect::Start,
        ),
        (
            "wildcard_routing: provider routes, a custom pattern, the catch-all",
            "model_list:\n  - model_name: \"anthropic/*\"\n    litellm_params:\n      model: \"anthropic/*\"\n      api_key: sk-ant\n  - model_name: \"groq/*\"\n    litellm_params:\n      model: \"groq/*\"\n      api_base: https://api.groq.com/openai/v1\n      api_key: gsk\n  - model_name: \"fo::*:static::*\"\n    litellm_params:\n      model: \"openai/fo::*:static::*\"\n      api_key: sk-up\n  - model_name: \"*\"\n    litellm_params:\n      model: \"openai/*\"\n      api_key: sk-up\n".into(),
            Expect::Start,
        ),
        (
            "guardrails (v2, top level)",
            with("guardrails:\n  - guardrail_name: aporia-pre-guard\n    litellm_params: {guardrail: aporia, mode: during_call, default_on: true}\n"),
            Expect::Refuse(&["guardrails"], "guardrails"),
        ),
        (
            "guardrails (v1, litellm_settings) and checking callbacks",
            with("litellm_settings:\n  guardrails:\n    - prompt_injection: {callbacks: [lakera_prompt_injection], default_on: true}\n  callbacks: [\"presidio\", \"custom_callbacks.proxy_handler_instance\", \"dynamic_rate_limiter_v3\"]\n"),
            Expect::Refuse(
                &["litellm_settings.guardrails", "litellm_settings.callbacks[0] (presidio)", "litellm_settings.callbacks[1] (custom_callbacks.proxy_handler_instance)"],
                "guardrails,presidio,custom_callbacks.proxy_handler_instance",
            ),
        ),
        (
            "tag routing",
            "model_list:\n  - model_name: gpt-4\n    litellm_params: {model: openai/gpt-4o, mock_response: hi, tags: [teamA]}\n  - model_name: gpt-4\n    litellm_params: {model: openai/gpt-4o-mini, mock_response: hi, tags: [teamB]}\nrouter_settings:\n  enable_tag_filtering: true\n".into(),
            Expect::Refuse(
                &["model_list[0].litellm_params.tags", "model_list[1].litellm_params.tags", "router_settings.enable_tag_filtering"],
                "tags,enable_tag_filtering",
            ),
        ),
        (
            "budgets in every place",
            "model_list:\n  - model_name: gpt-4o\n    litellm_params: {model: openai/gpt-4o, mock_response: hi, max_budget: 10, budget_duration: 1d}\nlitellm_settings:\n  max_budget: 100\n  budget_duration: 30d\n  max_end_user_budget: 1\nrouter_settings:\n  provider_budget_config: {openai: {budget_limit: 100, time_period: 1d}}\n".into(),
            Expect::Refuse(
                &["model_list[0].litellm_params.max_budget", "model_list[0].litellm_params.budget_duration", "litellm_settings.max_budget", "litellm_settings.budget_duration", "litellm_settings.max_end_user_budget", "router_settings.provider_budget_config"],
                "max_budget,budget_duration,max_end_user_budget,provider_budget_config",
            ),
        ),
        (
            "auth: custom_auth, JWT, routes, pass-through, a secret manager",
            with("general_settings:\n  master_key: sk-1234\n  custom_auth: custom_auth.user_api_key_auth\n  enable_jwt_auth: true\n  allowed_routes: [\"/chat/completions\"]\n  pass_through_endpoints:\n    - path: /v1/rerank\n      target: https://api.cohere.com/v1/rerank\n  key_management_system: aws_secret_manager\n"),
            Expect::Refuse(
                &["general_settings.custom_auth", "general_settings.enable_jwt_auth", "general_settings.allowed_routes", "general_settings.pass_through_endpoints", "general_settings.key_management_system"],
                "custom_auth,enable_jwt_auth,allowed_routes,pass_through_endpoints,key_management_system",
            ),
        ),
        (
            "LiteLLM's earlier priority limiter, role-based access control",
            with("litellm_settings:\n  callbacks: [\"dynamic_rate_limiter\"]\ngeneral_settings:\n  master_key: sk-1234\n  enforce_rbac: true\n"),
            Expect::Refuse(
                &["litellm_settings.callbacks[0] (dynamic_rate_limiter)", "general_settings.enforce_rbac"],
                "dynamic_rate_limiter,enforce_rbac",
            ),
        ),
        (
            "a misspelt master key, or one in a misspelt block: the gateway would run open",
            with("general_setting:\n  master_key: sk-1234\nlitellm_settings:\n  master_ky: sk-1234\n  mastr_key: sk-1234\ngeneral_settings:\n  admin_key: sk-1234\n"),
            Expect::Refuse(
                &["general_setting (did you mean general_settings?)", "litellm_settings.master_ky", "litellm_settings.mastr_key", "general_settings.admin_key"],
                "general_setting,master_ky,mastr_key,admin_key",
            ),
        ),
        (
            "LiteLLM's settings about keys are not taken for a misspelt master key; a misspelt limiter setting is named",
            with("general_settings:\n  master_key: sk-1234\n  disable_master_key_return: true\n  litellm_key_header_name: X-Litellm-Key\n  user_api_key_cache_ttl: 60\n  salt_key: sk-salt\nlitellm_settings:\n  priority_reservation_settings: {saturation_treshold: 0.9}\n"),
            Expect::Warn(&[
                "general_settings.disable_master_key_return",
                "general_settings.litellm_key_header_name",
                "general_settings.user_api_key_cache_ttl",
                "general_settings.salt_key",
                "litellm_settings.priority_reservation_settings.saturation_treshold (did you mean saturation_threshold?)",
            ]),
        ),
        (
            "settings that would be refused, turned off",
            with("general_settings:\n  master_key: sk-1234\n  enforce_rbac: false\n  enable_jwt_auth: false\n  custom_auth: null\n  pass_through_endpoints: []\n  allowed_routes: {}\n"),
            Expect::Start,
        ),
        (
            "access groups and concurrency limits",
            "model_list:\n  - model_name: gpt-4o\n    litellm_params: {model: openai/gpt-4o, mock_response: hi, max_parallel_requests: 5}\n    model_info: {access_groups: [beta]}\ngeneral_settings:\n  global_max_parallel_requests: 100\n".into(),
            Expect::Refuse(
                &["model_list[0].litellm_params.max_parallel_requests", "model_list[0].model_info.access_groups", "general_settings.global_max_parallel_requests"],
                "max_parallel_requests,access_groups,global_max_parallel_requests",
            ),
        ),
        (
            "logging callbacks, caching, environment variables, alerting",
            with("environment_variables:\n  LANGFUSE_PUBLIC_KEY: pk\nlitellm_settings:\n  callbacks: [\"langfuse\", \"dynamic_rate_limiter_v3\"]\n  success_callback: [\"langfuse\"]\n  failure_callback: [\"sentry\"]\n  cache: true\n  cache_params: {type: redis}\n  drop_params: true\n  set_verbose: false\ngeneral_settings:\n  alerting: [\"slack\"]\n"),
            Expect::Warn(&[
                "litellm_settings.callbacks[0] (langfuse)",
                "litellm_settings.success_callback",
                "litellm_settings.failure_callback",
                "litellm_settings.cache",
                "litellm_settings.cache_params",
                "litellm_settings.drop_params",
                "litellm_settings.set_verbose",
                "general_settings.alerting",
            ]),
        ),
        (
            "per-deployment defaults, model_info metadata, router settings not read",
            "model_list:\n  - model_name: gpt-4o\n    litellm_params: {model: openai/gpt-4o, mock_response: hi, temperature: 0.2, max_tokens: 100}\n    model_info: {mode: chat, base_model: gpt-4o}\nrouter_settings:\n  model_group_alias: {gpt-4: gpt-4o}\n  routing_strategy_args: {ttl: 60}\n  enable_pre_call_checks: true\n".into(),
            Expect::Warn(&[
                "model_list[0].litellm_params.temperature",
                "model_list[0].litellm_params.max_tokens",
                "model_list[0].model_info.mode",
                "model_list[0].model_info.base_model",
                "router_settings.model_group_alias",
                "router_settings.routing_strategy_args",
                "router_settings.enable_pre_call_checks (deployments' rpm and tpm are always \
                 enforced here, whatever this says; the context-window and other pre-call checks \
                 are not done)",
            ]),
        ),
    ]
}

/// Each config of the corpus starts, starts with one warning naming what is not honoured, or is
/// refused with a message naming each key that decides who may do what, with its path.
#[test]
fn litellm_configs_start_warn_or_refuse_as_the_table_says() {
    for (name, yaml, expect) in corpus() {
        let loaded = GatewayConfig::from_yaml_str_with_env(&yaml, |_| None);
        match expect {
            Expect::Start => {
                let config = loaded.unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(config.unsupported_warning(), None, "{name}");
            }
            Expect::Warn(named) => {
                let config = loaded.unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(
                    config.unsupported_warning().as_deref(),
                    Some(
                        format!(
                            "config keys this gateway does not honour: not supported, ignored: {}",
                            named.join(", ")
                        )
                        .as_str()
                    ),
                    "{name}"
                );
            }
            Expect::Refuse(named, flag) => {
                let err = loaded.map(|_| ()).unwrap_err().to_string();
                assert!(
                    err.starts_with("the config sets what this gateway does not do, where it decides who may do what or what is enforced: "),
                    "{name}: {err}"
                );
                let listed = err
                    .split_once("enforced: ")
                    .unwrap()
                    .1
                    .split_once(". Remove them")
                    .unwrap()
                    .0;
                let shown: Vec<&str> = listed
                    .split("; ")
                    .map(|each| each.split_once(": ").unwrap().0)
                    .collect();
                assert_eq!(shown, named, "{name}: {err}");
                assert!(
                    err.ends_with(&format!(
                        "start with --ignore-unsupported {flag} to run without them"
                    )),
                    "{name}: {err}"
                );
            }
        }
    }
}

/// `--ignore-unsupported` by key or by path starts without the refused keys it names, which the
/// warning then names; one it does not name is still refused; one naming nothing refused is named.
#[test]
fn ignore_unsupported_names_keys_or_paths() {
    let yaml = "model_list:\n  - model_name: a\n    litellm_params: {model: openai/a, mock_response: hi, tags: [x]}\n  - model_name: b\n    litellm_params: {model: openai/b, mock_response: hi, tags: [y]}\nguardrails: [{guardrail_name: g}]\n";
    let load = |ignore: &[&str]| {
        let ignore: Vec<String> = ignore.iter().map(|s| s.to_string()).collect();
        GatewayConfig::from_yaml_str_ignoring(yaml, |_| None, &ignore)
    };
    let config = load(&["tags", "guardrails"]).unwrap();
    assert_eq!(
        config.unsupported_warning().unwrap(),
        "config keys this gateway does not honour: not enforced (--ignore-unsupported): \
         model_list[0].litellm_params.tags, model_list[1].litellm_params.tags, guardrails"
    );
    let err = load(&["model_list[0].litellm_params.tags", "guardrails"])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("model_list[1].litellm_params.tags: tag routing is not done")
            && !err.contains("model_list[0]")
            && err.ends_with("--ignore-unsupported tags to run without them"),
        "{err}"
    );
    let config = load(&["tags", "guardrails", "custom_auth"]).unwrap();
    assert!(
        config
            .unsupported_warning()
            .unwrap()
            .ends_with("; --ignore-unsupported names what the config does not refuse: custom_auth"),
        "{:?}",
        config.unsupported_warning()
    );
}

/// LiteLLM's other read endpoints that its clients and dashboards call: `/model/info` (the
/// deployments, without keys), `/model_group/info` (the groups), each only what the caller may
/// use; `/health/liveness` (LiteLLM's second spelling); `/health` says where health is instead
/// of a bare 404; `POST /key/{key}/regenerate`, the path form. Each was a 404 before.
#[tokio::test]
async fn litellm_model_info_health_and_path_regenerate() {
    use serde_json::json;
    let gw = Gw::start(
        &with_master(
            "model_list:\n\
             \x20 - model_name: gpt-4o\n\
             \x20   litellm_params: {model: openai/gpt-4o, api_base: \"http://u:pw@127.0.0.1:9/v1\", api_key: sk-upstream-secret-0123, rpm: 6, input_cost_per_token: 0.000002}\n\
             \x20 - model_name: gpt-4o\n\
             \x20   litellm_params: {model: openai/gpt-4o-mini, api_base: \"http://127.0.0.1:9/v1\", rpm: 4}\n\
             \x20 - model_name: cheap\n\
             \x20   litellm_params: {model: openai/cheap, mock_response: hi}\n",
        ),
        None,
    )
    .await;
    let info = gw.get("/model/info", Some(MASTER)).await;
    assert_eq!(info.status, 200, "{}", info.text());
    assert!(
        !info.text().contains("secret") && !info.text().contains("pw@"),
        "{}",
        info.text()
    );
    let data = info.json()["data"].as_array().unwrap().clone();
    assert_eq!(data.len(), 3);
    assert_eq!(data[0]["model_name"], "gpt-4o");
    assert_eq!(data[0]["litellm_params"]["rpm"], 6);
    assert_eq!(data[0]["model_info"]["litellm_provider"], "openai");
    assert_eq!(data[0]["model_info"]["input_cost_per_token"], 0.000002);
    // Priced, with no output price: 0, not null (a trial read a configured 0 as null).
    assert_eq!(data[0]["model_info"]["output_cost_per_token"], 0.0);
    assert_eq!(
        data[2]["model_info"]["input_cost_per_token"],
        Value::Null,
        "unpriced"
    );
    assert_eq!(data[2]["model_info"]["litellm_provider"], "mock");
    let id = data[1]["model_info"]["id"].as_str().unwrap().to_owned();
    let one = gw
        .get(
            &format!("/v1/model/info?litellm_model_id={id}"),
            Some(MASTER),
        )
        .await;
    assert_eq!(
        one.json()["data"].as_array().unwrap().len(),
        1,
        "{}",
        one.text()
    );
    assert_eq!(
        one.json()["data"][0]["litellm_params"]["model"],
        "openai/gpt-4o-mini",
        "as the config writes it"
    );
    let bad = gw.get("/model/info?page=2", Some(MASTER)).await;
    assert_eq!(bad.status, 400, "{}", bad.text());
    assert!(bad.text().contains("'page'"), "{}", bad.text());

    let groups = gw.get("/model_group/info", Some(MASTER)).await;
    assert_eq!(groups.status, 200, "{}", groups.text());
    let groups = groups.json()["data"].as_array().unwrap().clone();
    assert_eq!(groups.len(), 2);
    assert_eq!(groups[0]["model_group"], "gpt-4o");
    assert_eq!(groups[0]["rpm"], 10, "6 + 4");
    assert_eq!(groups[0]["output_cost_per_token"], 0.0);
    assert_eq!(groups[0]["providers"], json!(["openai"]));
    assert_eq!(groups[1]["rpm"], Value::Null, "a deployment without rpm");

    // A key held to `cheap` sees only it.
    let key = gw.new_key(json!({"models": ["cheap"]})).await;
    let mine = gw.get("/model/info", Some(&key)).await;
    let names: Vec<Value> = mine.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["model_name"].clone())
        .collect();
    assert_eq!(names, [json!("cheap")]);
    let mine = gw
        .get("/model_group/info?model_group=gpt-4o", Some(&key))
        .await;
    assert_eq!(mine.json()["data"], json!([]));
    assert_eq!(gw.get("/model/info", None).await.status, 401);

    let alive = gw.get("/health/liveness", None).await;
    assert_eq!(alive.status, 200);
    assert_eq!(alive.json(), json!("I'm alive!"));
    let health = gw.get("/health", None).await;
    assert_eq!(health.status, 404);
    assert!(
        health.text().contains("/health/readiness"),
        "{}",
        health.text()
    );

    // The path form of /key/regenerate: the old value stops, the new one works.
    let regenerated = gw
        .post(&format!("/key/{key}/regenerate"), Some(MASTER), json!({}))
        .await;
    assert_eq!(regenerated.status, 200, "{}", regenerated.text());
    let new = regenerated.json()["key"].as_str().unwrap().to_owned();
    assert_ne!(new, key);
    assert_eq!(gw.chat(&key, "cheap", false).await.status, 401);
    assert_eq!(gw.chat(&new, "cheap", false).await.status, 200);
    let refused = gw
        .post(
            &format!("/key/{new}/regenerate"),
            Some(MASTER),
            json!({"max_budget": 5}),
        )
        .await;
    assert_eq!(refused.status, 400, "{}", refused.text());
    assert!(refused.text().contains("max_budget"), "{}", refused.text());
    let unknown = gw
        .post("/key/sk-nobody/regenerate", Some(MASTER), json!({}))
        .await;
    assert_eq!(unknown.status, 404, "{}", unknown.text());
}
