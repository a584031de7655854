//! The body sent upstream: the client's own bytes with the upstream's model name and, on
//! streams, usage asked for, edited in place where that is safe (no tree is built and
//! serialized on the way), else serialized from the parsed body.

use bytes::Bytes;
use serde_json::Value;

use crate::chat::ChatRequest;
use crate::config::Deployment;

/// The body sent upstream: the client's, with the upstream's model name, and usage requested on
/// chat and completions streams where the upstream takes it ([`asks_usage`]; so tokens can be
/// counted; the gateway strips it again if the client did not ask).
pub(super) fn upstream_body(
    deployment: &Deployment,
    chat: &ChatRequest,
) -> Result<Value, serde_json::Error> {
    let mut body = chat.body()?;
    body["model"] = Value::String(deployment.upstream_model_for(chat.captures()).into_owned());
    if asks_usage(deployment, chat) {
        if !body.get("stream_options").is_some_and(Value::is_object) {
            body["stream_options"] = Value::Object(Default::default());
        }
        body["stream_options"]["include_usage"] = Value::Bool(true);
    }
    Ok(body)
}

/// Whether the body sent to `deployment` asks for the stream's usage: a chat or completions
/// stream, to a deployment whose API takes `stream_options` (not an Azure version from before
/// it: [`Deployment::takes_stream_options`]).
fn asks_usage(deployment: &Deployment, chat: &ChatRequest) -> bool {
    chat.stream && chat.endpoint.asks_stream_usage() && deployment.takes_stream_options()
}

/// [`upstream_body`] as bytes, made from the client's own bytes ([`ChatRequest::raw`]) without
/// building and serializing a tree: sent as they are when the model name is the upstream's
/// already and no usage is to be asked for, else edited in place (the `model` value swapped,
/// `stream_options` added or its `include_usage` set). Falls back to serializing
/// [`upstream_body`] for what the in-place edit does not handle (an escaped key at the top level).
pub(super) fn upstream_bytes(deployment: &Deployment, chat: &ChatRequest) -> Result<Bytes, String> {
    let ask_usage = asks_usage(deployment, chat);
    let model = deployment.upstream_model_for(chat.captures());
    if let Some(bytes) = edit_in_place(&chat.raw, &model, ask_usage) {
        return Ok(bytes);
    }
    let body = upstream_body(deployment, chat).map_err(|e| e.to_string())?;
    serde_json::to_vec(&body)
        .map(Bytes::from)
        .map_err(|e| e.to_string())
}

/// Whether [`upstream_bytes`] edits `raw`, a JSON object, in place (else it parses and
/// serializes it whole): a body without a backslash has no escaped key, so needs no closer look.
pub fn edits_in_place(raw: &[u8]) -> bool {
    memchr::memchr(b'\\', raw).is_none() || top_level_members(raw, |_, _| {}).is_some()
}

/// Visits the top-level members of the JSON object `raw` (valid JSON, as the gateway parsed it)
/// in order: each key's bytes between its quotes and its value's byte range. Their number, or
/// `None` (after visiting those before) when a key holds an escape (its raw bytes are then not its
/// name) or `raw` is not an object.
pub(super) fn top_level_members<'r>(
    raw: &'r [u8],
    mut visit: impl FnMut(&'r [u8], std::ops::Range<usize>),
) -> Option<usize> {
    let skip_ws = |mut i: usize| {
        while raw.get(i).is_some_and(|b| b.is_ascii_whitespace()) {
            i += 1;
        }
        i
    };
    // The index just past the string whose opening quote is at `i`. Long strings (a prompt's
    // messages) are crossed a vector at a time, not byte by byte.
    let string_end = |mut i: usize| {
        i += 1;
        loop {
            i += memchr::memchr2(b'"', b'\\', raw.get(i..)?)?;
            match raw[i] {
                b'"' => return Some(i + 1),
                _ => i += 2,
            }
        }
    };
    let mut i = skip_ws(0);
    if raw.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_ws(i + 1);
    let mut members = 0;
    if raw.get(i) == Some(&b'}') {
        return Some(members);
    }
    loop {
        if raw.get(i) != Some(&b'"') {
            return None;
        }
        let key_end = string_end(i)?;
        let key = &raw[i + 1..key_end - 1];
        if key.contains(&b'\\') {
            return None;
        }
        i = skip_ws(key_end);
        if raw.get(i) != Some(&b':') {
            return None;
        }
        let start = skip_ws(i + 1);
        // The value: a string, or anything up to the `,` or `}` that ends it at depth 0.
        let mut j = start;
        let mut depth = 0usize;
        loop {
            match *raw.get(j)? {
                b'"' => {
                    j = string_end(j)?;
                    continue;
                }
                b'{' | b'[' => depth += 1,
                b'}' | b']' if depth > 0 => depth -= 1,
                b',' | b'}' if depth == 0 => break,
                _ => {}
            }
            j += 1;
        }
        let mut end = j;
        while end > start && raw[end - 1].is_ascii_whitespace() {
            end -= 1;
        }
        visit(key, start..end);
        members += 1;
        if raw[j] == b'}' {
            return Some(members);
        }
        i = skip_ws(j + 1);
    }
}

/// `raw` with every top-level `model` set to `model` and, when `ask_usage`, usage asked for in
/// `stream_options` (see [`upstream_bytes`]); `None` when [`top_level_members`] cannot read it.
fn edit_in_place(raw: &Bytes, model: &str, ask_usage: bool) -> Option<Bytes> {
    // (range, replacement), in order of position.
    let mut edits: Vec<(std::ops::Range<usize>, Vec<u8>)> = Vec::new();
    let mut has_options = false;
    let members = top_level_members(raw, |key, range| match key {
        b"model" if !is_json_string(&raw[range.clone()], model) => {
            // The name as a JSON string (a `Value`'s text: unlike `to_vec`, it cannot fail, and
            // this closure has no way to say it did). Only when the body's name differs.
            let json = serde_json::Value::from(model).to_string();
            edits.push((range, json.into_bytes()));
        }
        b"stream_options" if ask_usage => {
            has_options = true;
            let mut options = match serde_json::from_slice::<Value>(&raw[range.clone()]) {
                Ok(v @ Value::Object(_)) => v,
                _ => Value::Object(Default::default()),
            };
            if options.get("include_usage") != Some(&Value::Bool(true)) {
                options["include_usage"] = Value::Bool(true);
                edits.push((range, options.to_string().into_bytes()));
            }
        }
        _ => {}
    })?;
    let closing = raw.len() - raw.iter().rev().position(|&b| b == b'}')? - 1;
    if ask_usage && !has_options {
        let comma = if members == 0 { "" } else { "," };
        let added = format!(r#"{comma}"stream_options":{{"include_usage":true}}"#);
        edits.push((closing..closing, added.into_bytes()));
    }
    if edits.is_empty() {
        return Some(raw.clone());
    }
    let mut out = Vec::with_capacity(raw.len() + model.len() + 48);
    let mut at = 0;
    for (range, replacement) in edits {
        out.extend_from_slice(&raw[at..range.start]);
        out.extend_from_slice(&replacement);
        at = range.end;
    }
    out.extend_from_slice(&raw[at..]);
    Some(out.into())
}

/// Whether `value`, a JSON value's text, is the string `text` as serde_json writes it: `"text"`,
/// for a text without a character JSON escapes (one with is compared as not equal, and rewritten).
pub(super) fn is_json_string(value: &[u8], text: &str) -> bool {
    let needs_escape = |b: &u8| *b == b'"' || *b == b'\\' || *b < 0x20;
    value.len() == text.len() + 2
        && value.first() == Some(&b'"')
        && value.last() == Some(&b'"')
        && &value[1..value.len() - 1] == text.as_bytes()
        && !text.as_bytes().iter().any(needs_escape)
}
