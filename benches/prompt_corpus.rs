//! The prompt-estimate corpus (`data/prompts/*.jsonl`) and its ground truth, shared by
//! `examples/prompt_estimates.rs` and `tokenizer.rs`.
//!
//! The truth is what the model sees, counted with `o200k_base` the way OpenAI's cookbook counts
//! it: each message is 3 tokens of framing plus its role, content and name (1 more for a name),
//! each tool call its name and arguments plus 1, the conversation 3 more to prime the reply;
//! tool definitions are counted with the cookbook's GPT-4o formula (7 a function plus
//! `name:description`, 3 for the properties, 3 plus `key:type:description` a property, enum
//! values 3 plus the value each, less 3 a list, 12 at the end), extended to nested object
//! properties. Anthropic's `system` and the Responses API's `instructions` are a system message.
//! Embeddings' `input` and completions' `prompt` are their text alone.
//!
//! This walker is written separately from the crate's (`tower-priority-limit/src/estimate/
//! prompt.rs`) on purpose: it works on a parsed `serde_json::Value`.

#![allow(dead_code)]

use serde_json::Value;
use std::path::PathBuf;

/// One request body of the corpus.
pub struct Sample {
    pub category: String,
    pub body: Vec<u8>,
    /// Fixed tokens (framing, tool-definition overheads).
    pub overhead: u64,
    /// The texts to tokenize.
    pub pieces: Vec<String>,
}

impl Sample {
    /// Tokens with `count` for each piece.
    pub fn tokens(&self, count: impl Fn(&str) -> u64) -> u64 {
        self.overhead + self.pieces.iter().map(|p| count(p)).sum::<u64>()
    }
}

pub fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/prompts")
}

/// Every body of the corpus, by category (file name), in file order.
pub fn load() -> Vec<Sample> {
    let mut files: Vec<_> = std::fs::read_dir(data_dir())
        .expect("benches/data/prompts")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let category = f.file_stem().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&f).expect("corpus file");
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let v: Value = serde_json::from_str(line).expect("corpus line is JSON");
            let mut s = Sample {
                category: category.clone(),
                body: line.as_bytes().to_vec(),
                overhead: 0,
                pieces: Vec::new(),
            };
            walk_body(&v, &mut s);
            out.push(s);
        }
    }
    out
}

fn walk_body(v: &Value, s: &mut Sample) {
    let Some(obj) = v.as_object() else { return };
    let mut conversation = false;
    let mut any_tool = false;
    for (k, v) in obj {
        match k.as_str() {
            "messages" => {
                conversation = true;
                for m in v.as_array().into_iter().flatten() {
                    message(m, s);
                }
            }
            "system" | "instructions" => {
                conversation = true;
                s.overhead += 3;
                s.pieces.push("system".into());
                content(v, s);
            }
            "input" | "prompt" => input(v, s),
            "tools" | "functions" => {
                for t in v.as_array().into_iter().flatten() {
                    any_tool = true;
                    function(t, s);
                }
            }
            _ => {}
        }
    }
    if conversation {
        s.overhead += 3;
    }
    if any_tool {
        s.overhead += 12;
    }
}

fn text(v: &Value, s: &mut Sample) {
    if let Some(t) = v.as_str() {
        s.pieces.push(t.to_owned());
    }
}

fn message(m: &Value, s: &mut Sample) {
    s.overhead += 3;
    let Some(obj) = m.as_object() else {
        text(m, s);
        return;
    };
    for (k, v) in obj {
        match k.as_str() {
            "role" | "refusal" | "arguments" => text(v, s),
            "output" => content(v, s),
            "name" => {
                s.overhead += 1;
                text(v, s);
            }
            "content" => content(v, s),
            "tool_calls" => {
                for c in v.as_array().into_iter().flatten() {
                    call(c, s);
                }
            }
            "function_call" => call(v, s),
            _ => {}
        }
    }
}

fn call(c: &Value, s: &mut Sample) {
    s.overhead += 1;
    let f = c.get("function").unwrap_or(c);
    text(&f["name"], s);
    text(&f["arguments"], s);
}

fn content(v: &Value, s: &mut Sample) {
    match v {
        Value::String(t) => s.pieces.push(t.clone()),
        Value::Array(parts) => parts.iter().for_each(|p| content(p, s)),
        Value::Object(part) => {
            for (k, v) in part {
                match k.as_str() {
                    "text" | "refusal" => text(v, s),
                    "content" => content(v, s),
                    "type" if matches!(v.as_str(), Some("image_url" | "input_image" | "image")) => {
                        s.overhead += 765
                    }
                    _ => {}
                }
            }
        }
        _ => {}
    }
}

fn input(v: &Value, s: &mut Sample) {
    match v {
        Value::String(t) => s.pieces.push(t.clone()),
        Value::Number(_) => s.overhead += 1,
        Value::Array(items) => items.iter().for_each(|i| input(i, s)),
        Value::Object(_) => message(v, s),
        _ => {}
    }
}

fn strip_period(d: &str) -> &str {
    d.strip_suffix('.').unwrap_or(d)
}

fn function(t: &Value, s: &mut Sample) {
    let f = t.get("function").unwrap_or(t);
    s.overhead += 7;
    let name = f["name"].as_str().unwrap_or("");
    let desc = f["description"].as_str().unwrap_or("");
    s.pieces.push(format!("{name}:{}", strip_period(desc)));
    let schema = f.get("parameters").or_else(|| f.get("input_schema"));
    if let Some(schema) = schema {
        schema_props(schema, s);
    }
}

fn schema_props(schema: &Value, s: &mut Sample) {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    if props.is_empty() {
        return;
    }
    s.overhead += 3;
    for (key, p) in props {
        s.overhead += 3;
        if let Some(items) = p.get("enum").and_then(Value::as_array) {
            if !items.is_empty() {
                // enum_init (-3) + 3 per item: the first item is free of the 3.
                s.overhead += 3 * (items.len() as u64 - 1);
                for i in items {
                    match i {
                        Value::String(t) => s.pieces.push(t.clone()),
                        other => s.pieces.push(other.to_string()),
                    }
                }
            }
        }
        let ty = p["type"].as_str().unwrap_or("");
        let desc = p["description"].as_str().unwrap_or("");
        s.pieces.push(format!("{key}:{ty}:{}", strip_period(desc)));
        schema_props(p, s);
        if let Some(items) = p.get("items") {
            schema_props(items, s);
        }
    }
}
