//! LiteLLM's top-level `environment_variables`: values for the environment names the config
//! reads (`os.environ/NAME` references, and the provider keys, `REDIS_*`, `DATABASE_URL` and
//! `LITELLM_MASTER_KEY` the gateway reads when the file does not set them) where the process
//! environment does not set the name. The process environment wins, as LiteLLM's own reading
//! of the block (`get_secret(name, default_value=value)`) lets it; the process's environment
//! itself is not changed.

use std::collections::HashMap;

use serde_json::Value;
use tower_priority_limit::config::ConfigError;

use crate::shared::node::{Node, ENV_PREFIX};

/// The `environment_variables` mapping of `doc`, each value as a string (a number or boolean
/// written as YAML writes it), or an error naming the entry that is not a scalar.
pub(super) fn read(doc: &Value) -> Result<HashMap<String, String>, ConfigError> {
    let mut vars = HashMap::new();
    let root = Node::root(doc);
    let Some(block) = root.get("environment_variables")? else {
        return Ok(vars);
    };
    for (name, node) in block.entries()? {
        let value = match node.value() {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            Value::Null => continue,
            _ => return Err(node.error("expected a string, number or boolean")),
        };
        vars.insert(name.to_owned(), value);
    }
    Ok(vars)
}

/// Replaces each `os.environ/NAME` string of `doc` whose `NAME` the process environment (`env`)
/// does not set and `vars` does with `vars`' value, so every reader of the document (the
/// limiter's too) sees it.
pub(super) fn substitute(
    doc: &mut Value,
    vars: &HashMap<String, String>,
    env: &dyn Fn(&str) -> Option<String>,
) {
    match doc {
        Value::String(s) => {
            if let Some(value) = s
                .strip_prefix(ENV_PREFIX)
                .filter(|name| env(name).is_none())
                .and_then(|name| vars.get(name))
            {
                *s = value.clone();
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| substitute(v, vars, env)),
        Value::Object(members) => members
            .iter_mut()
            .filter(|(name, _)| name.as_str() != "environment_variables")
            .for_each(|(_, v)| substitute(v, vars, env)),
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}
