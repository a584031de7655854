//! A LiteLLM config means what it says: limits wherever LiteLLM reads them (the `model_list`
//! entry, `litellm_params`, `model_info`), YAML numbers as PyYAML (YAML 1.1, LiteLLM's loader)
//! reads them, checked against PyYAML itself where it is installed.

use std::io::Write;
use std::process::{Command, Stdio};

use gateway_example::config::GatewayConfig;
use integration_tests::external::required;
use integration_tests::gateway::{with_master, Gw, MASTER};
use serde_json::Value;
use tower_priority_limit::config::Node;

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
