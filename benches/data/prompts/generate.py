#!/usr/bin/env python3
"""Writes the prompt-estimate corpus: one JSON request body a line, one file per category.

    python3 benches/data/prompts/generate.py   # from the repository root

Deterministic (a seeded PRNG, sorted inputs): rerunning it on the same checkout rewrites the same
files. The texts are hand-written (`texts.py`) or taken from this repository's own docs and source
(long contexts, assistant answers, code to review). Bodies are serialised three ways, by index,
as clients send them: compact with raw UTF-8 (JavaScript's `JSON.stringify`), `", "`/`": "` with
`\\uXXXX` escapes (Python's `json.dumps` defaults), and indented with raw UTF-8 (hand-written
curl examples).
"""

import json
import os
import random
import re

import texts

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
rng = random.Random(20261130)
MODELS = ["gpt-4o", "gpt-4o-mini", "gpt-4.1", "gpt-4o-2024-08-06"]


def read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def paragraphs(rel):
    paras = [p.strip() for p in re.split(r"\n\s*\n", read(rel))]
    return [p for p in paras if len(p) > 80]


DOCS = ["README.md", "docs/architecture.md", "docs/behaviour.md", "docs/configuration.md",
        "docs/gateway.md", "docs/routing.md"]
DOC_PARAS = [p for d in DOCS for p in paragraphs(d)]
RUST_FILES = ["tower-priority-limit/src/" + f for f in
              ["body.rs", "clock.rs", "lease.rs", "limiter.rs", "priority.rs", "redact.rs",
               "service.rs", "throttle.rs", "layer.rs", "future.rs"]]


def dump(body, i):
    style = i % 3
    if style == 0:
        return json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    if style == 1:
        return json.dumps(body)
    # Indented, but one line in the file: the newlines are escaped away by re-encoding below.
    return json.dumps(body, ensure_ascii=False, indent=2)


def params(i):
    p = {"model": MODELS[i % len(MODELS)]}
    if i % 2 == 0:
        p["temperature"] = [0, 0.2, 0.7, 1][i % 4]
    if i % 3 == 0:
        p["max_tokens"] = [256, 512, 1024, 4096][i % 4]
    if i % 4 == 1:
        p["stream"] = True
        p["stream_options"] = {"include_usage": True}
    if i % 5 == 2:
        p["user"] = "user-%06d" % rng.randrange(10**6)
    return p


def chat(messages, i, **extra):
    body = params(i)
    body["messages"] = messages
    body.update(extra)
    return body


def code_snippet(i):
    if i % 3 == 2:
        pool = texts.PYTHON_SNIPPETS + texts.JS_SNIPPETS
        return pool[(i // 3) % len(pool)]
    src = read(RUST_FILES[i % len(RUST_FILES)]).splitlines()
    n = [20, 45, 80, 140][i % 4]
    start = rng.randrange(0, max(1, len(src) - n))
    return "\n".join(src[start:start + n])


def out(category, bodies):
    path = os.path.join(HERE, category + ".jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for i, b in enumerate(bodies):
            text = dump(b, i)
            # One body a line: an indented body keeps its indentation spaces but its newlines go
            # (a JSONL line cannot hold a raw newline; the byte count changes by one per line).
            f.write(text.replace("\n", " ") + "\n")


def short_chat():
    bodies = []
    for i, q in enumerate(texts.SHORT_QUESTIONS):
        msgs = []
        if i % 4 != 3:
            msgs.append({"role": "system", "content": texts.SYSTEM_SHORT[i % len(texts.SYSTEM_SHORT)]})
        if i % 5 == 4:
            # Content as an array of parts.
            msgs.append({"role": "user", "content": [{"type": "text", "text": q}]})
        else:
            msgs.append({"role": "user", "content": q})
        if i % 7 == 6:
            msgs.insert(-1, {"role": "user", "content": texts.SHORT_QUESTIONS[(i + 5) % 40]})
            msgs.insert(-1, {"role": "assistant", "content": texts.SHORT_ANSWERS[i % len(texts.SHORT_ANSWERS)]})
        if i % 9 == 8:
            msgs[-1]["name"] = "alice"
        bodies.append(chat(msgs, i))
    return bodies


def long_system():
    bodies = []
    for i in range(15):
        system = texts.LONG_SYSTEM[i % len(texts.LONG_SYSTEM)]
        if i >= 10:
            # A long system prompt made of product documentation.
            system = "Answer questions about the following product. Use only this documentation.\n\n" + \
                "\n\n".join(DOC_PARAS[(i * 7 + k) % len(DOC_PARAS)] for k in range(6))
        q = texts.SHORT_QUESTIONS[(i * 3) % 40]
        role = "developer" if i % 6 == 5 else "system"
        bodies.append(chat([{"role": role, "content": system}, {"role": "user", "content": q}], i))
    return bodies


def code():
    bodies = []
    for i in range(20):
        snippet = code_snippet(i)
        ask = texts.CODE_ASKS[i % len(texts.CODE_ASKS)]
        lang = "rust" if i % 3 != 2 else ("python" if (i // 3) % 4 < 2 else "")
        user = f"{ask}\n\n```{lang}\n{snippet}\n```"
        msgs = [{"role": "system", "content": texts.LONG_SYSTEM[1] if i % 2 else texts.SYSTEM_SHORT[3]},
                {"role": "user", "content": user}]
        if i % 4 == 3:
            msgs.append({"role": "assistant", "content": "\n\n".join(DOC_PARAS[(i * 5 + k) % len(DOC_PARAS)] for k in range(2))})
            msgs.append({"role": "user", "content": "Ok. Now show me the fixed version of the function with the most serious issue."})
        bodies.append(chat(msgs, i))
    return bodies


def multi_turn():
    bodies = []
    for i in range(15):
        turns = 2 + (i % 8)
        msgs = [{"role": "system", "content": texts.SYSTEM_SHORT[i % 4]}]
        for t in range(turns):
            msgs.append({"role": "user", "content": texts.MULTI_TURN_USER[t % len(texts.MULTI_TURN_USER)]})
            if t < turns - 1:
                k = rng.randrange(len(DOC_PARAS))
                answer = "\n\n".join(DOC_PARAS[(k + j) % len(DOC_PARAS)] for j in range(1 + t % 2))
                msgs.append({"role": "assistant", "content": answer})
        bodies.append(chat(msgs, i))
    return bodies


def tools():
    bodies = []
    for i in range(18):
        q, name, args, result, answer = texts.TOOL_TURNS[i % len(texts.TOOL_TURNS)]
        n_tools = [1, 2, 4, 8][i % 4]
        tool_set = [texts.TOOLS[(i + k) % len(texts.TOOLS)] for k in range(n_tools)]
        if not any(t["function"]["name"] == name for t in tool_set):
            tool_set.append(next(t for t in texts.TOOLS if t["function"]["name"] == name))
        msgs = [{"role": "system", "content": texts.SYSTEM_SHORT[i % 3]},
                {"role": "user", "content": q}]
        stage = i % 3
        call_id = "call_%024x" % rng.getrandbits(96)
        if stage >= 1:
            msgs.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function",
                 "function": {"name": name, "arguments": json.dumps(args)}}]})
            msgs.append({"role": "tool", "tool_call_id": call_id, "content": json.dumps(result)})
        if stage == 2:
            msgs.append({"role": "assistant", "content": answer})
            msgs.append({"role": "user", "content": "Thanks. Can you do the same for next week?"})
        extra = {"tools": tool_set}
        if i % 5 == 0:
            extra["tool_choice"] = "auto"
        if i % 6 == 1:
            extra["parallel_tool_calls"] = False
        bodies.append(chat(msgs, i, **extra))
    return bodies


def cjk():
    pool = texts.CHINESE + texts.JAPANESE + texts.KOREAN
    bodies = []
    for i, t in enumerate(pool):
        msgs = [{"role": "system", "content": "你是一个乐于助人的助手。" if i < 8 else texts.SYSTEM_SHORT[0]},
                {"role": "user", "content": t}]
        if i % 4 == 3:
            msgs.append({"role": "assistant", "content": pool[(i + 3) % len(pool)]})
            msgs.append({"role": "user", "content": pool[(i + 7) % len(pool)]})
        bodies.append(chat(msgs, i))
    # Longer CJK documents: several paragraphs to summarise.
    for i in range(4):
        doc = "\n\n".join(pool[(i * 5 + k) % len(pool)] for k in range(10))
        bodies.append(chat([{"role": "user", "content": "请总结以下内容：\n\n" + doc}], i + len(pool)))
    return bodies


def accented():
    bodies = []
    for i, (lang, t) in enumerate(texts.ACCENTED):
        msgs = [{"role": "system", "content": texts.SYSTEM_SHORT[i % 3]},
                {"role": "user", "content": t}]
        if i % 3 == 2:
            other = texts.ACCENTED[(i + 4) % len(texts.ACCENTED)][1]
            msgs += [{"role": "assistant", "content": other}, {"role": "user", "content": t[: len(t) // 2]}]
        bodies.append(chat(msgs, i))
    return bodies


def rag():
    corpus_files = DOCS + ["benches/RESULTS.md"]
    text = "\n\n".join(read(f) for f in corpus_files)
    bodies = []
    for i, size in enumerate([8_000, 25_000, 100_000]):
        start = (i * 9_973) % max(1, len(text) - size)
        ctx = text[start:start + size]
        chunks = [ctx[k:k + 2_000] for k in range(0, len(ctx), 2_000)]
        numbered = "\n\n".join(f"[{n + 1}] (source: doc-{(i * 31 + n) % 97})\n{c}" for n, c in enumerate(chunks))
        system = ("You answer questions using only the numbered passages below. Cite passages as [n]. "
                  "If the answer is not in the passages, say you don't know.\n\n" + numbered)
        q = ["How does the limiter decide whether a request is admitted?",
             "What happens when Redis is unavailable?",
             "Which settings control the priority reservations?",
             "Summarise the benchmark results."][i]
        bodies.append(chat([{"role": "system", "content": system}, {"role": "user", "content": q}], i))
    return bodies


def other_apis():
    bodies = []
    # Embeddings: a string, an array of strings.
    bodies.append({"model": "text-embedding-3-small", "input": texts.SHORT_QUESTIONS[3]})
    bodies.append({"model": "text-embedding-3-small", "input": DOC_PARAS[:8]})
    bodies.append({"model": "text-embedding-3-large", "input": [t for _, t in texts.ACCENTED[:6]], "dimensions": 1024})
    bodies.append({"model": "text-embedding-3-small", "input": texts.CHINESE[:5], "encoding_format": "float"})
    # Legacy completions.
    bodies.append({"model": "gpt-3.5-turbo-instruct", "prompt": "Write a tagline for an ice cream shop.", "max_tokens": 30})
    bodies.append({"model": "gpt-3.5-turbo-instruct", "prompt": "\n\n".join(DOC_PARAS[10:14]) + "\n\nTL;DR:", "max_tokens": 200})
    bodies.append({"model": "gpt-3.5-turbo-instruct", "prompt": [texts.SHORT_QUESTIONS[0], texts.SHORT_QUESTIONS[1]]})
    # Responses API.
    bodies.append({"model": "gpt-4.1", "input": texts.SHORT_QUESTIONS[5]})
    bodies.append({"model": "gpt-4.1", "instructions": texts.LONG_SYSTEM[0], "input": texts.SHORT_QUESTIONS[9]})
    bodies.append({"model": "gpt-4.1", "input": [
        {"role": "developer", "content": texts.SYSTEM_SHORT[1]},
        {"role": "user", "content": [{"type": "input_text", "text": texts.MULTI_TURN_USER[0]}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": DOC_PARAS[3]}]},
        {"role": "user", "content": [{"type": "input_text", "text": texts.MULTI_TURN_USER[1]}]}]})
    bodies.append({"model": "gpt-4.1", "instructions": texts.SYSTEM_SHORT[3], "input": [
        {"role": "user", "content": "Review this:\n\n" + code_snippet(4)}], "stream": True})
    # Anthropic messages (counted with o200k as a proxy: Claude's tokenizer is not public).
    bodies.append({"model": "claude-sonnet-4-5", "max_tokens": 1024, "messages": [
        {"role": "user", "content": texts.SHORT_QUESTIONS[14]}]})
    bodies.append({"model": "claude-sonnet-4-5", "max_tokens": 2048, "system": texts.LONG_SYSTEM[2], "messages": [
        {"role": "user", "content": "Solve x^2 - 5x + 6 = 0"},
        {"role": "assistant", "content": [{"type": "text", "text": "What have you tried so far?"}]},
        {"role": "user", "content": [{"type": "text", "text": "I tried the quadratic formula but got confused by the signs."}]}]})
    bodies.append({"model": "claude-haiku-4-5", "max_tokens": 512, "system": [{"type": "text", "text": texts.LONG_SYSTEM[4]}],
                   "messages": [{"role": "user", "content": texts.CHINESE[4]}]})
    bodies.append({"model": "claude-sonnet-4-5", "max_tokens": 1024, "tools": [
        {"name": t["function"]["name"], "description": t["function"]["description"],
         "input_schema": t["function"]["parameters"]} for t in texts.TOOLS[:4]],
        "messages": [{"role": "user", "content": texts.TOOL_TURNS[0][0]}]})
    return bodies


if __name__ == "__main__":
    out("short_chat", short_chat())
    out("long_system", long_system())
    out("code", code())
    out("multi_turn", multi_turn())
    out("tools", tools())
    out("cjk", cjk())
    out("accented", accented())
    out("rag", rag())
    out("other_apis", other_apis())
