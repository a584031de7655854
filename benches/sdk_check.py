#!/usr/bin/env python3
"""Checks that the official `openai` and `anthropic` Python SDKs work against a running gateway,
for every endpoint, JSON and streamed. It starts nothing: point it at a gateway.

    pip install openai anthropic
    python3 benches/sdk_check.py --base-url http://127.0.0.1:4000 --key sk-1234 \
        --model my-openai-model --anthropic-model my-claude-model [--refusal-model small]

`--model` must be a model group whose deployments speak the OpenAI API (or `mock_response`),
`--anthropic-model` one whose deployments speak Anthropic's (or `mock_response`; the same name
may serve both when it is a mock). With `--refusal-model`, chat requests to that model are sent
until the gateway refuses one, which the SDK must raise as `RateLimitError` (give it a small
`rpm` or `tpm`).

Each call prints PASS or FAIL with what it saw; the exit status is the number of failures.
"""

import argparse
import sys
import traceback

import anthropic
import openai

RESULTS = []


def check(name):
    def wrap(fn):
        def run(*args):
            try:
                seen = fn(*args)
                RESULTS.append((name, True, seen))
                print(f"PASS {name}: {seen}")
            except Exception as e:  # noqa: BLE001 - every failure is reported, not raised
                RESULTS.append((name, False, repr(e)))
                print(f"FAIL {name}: {e!r}")
                traceback.print_exc(limit=3)

        return run

    return wrap


def need(cond, what):
    if not cond:
        raise AssertionError(what)


@check("openai chat.completions.create")
def chat(c, model):
    r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    need(r.choices[0].message.content, "content")
    return f"{r.choices[0].message.content!r}, usage {r.usage.total_tokens}"


@check("openai chat.completions.create(stream=True, include_usage)")
def chat_stream(c, model):
    text, usage = "", None
    for chunk in c.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
        if chunk.usage:
            usage = chunk.usage.total_tokens
    need(text and usage, f"text {text!r}, usage {usage}")
    return f"{text!r}, usage {usage}"


@check("openai embeddings.create (SDK default: base64)")
def embeddings(c, model):
    r = c.embeddings.create(model=model, input=["first text", "second text"])
    need(len(r.data) == 2 and len(r.data[0].embedding) > 0, "two vectors")
    need(isinstance(r.data[0].embedding[0], float), "decoded floats")
    return f"{len(r.data)} vectors of {len(r.data[0].embedding)}, prompt_tokens {r.usage.prompt_tokens}"


@check("openai embeddings.create(encoding_format='float')")
def embeddings_float(c, model):
    r = c.embeddings.create(model=model, input="one text", encoding_format="float")
    need(len(r.data) == 1 and isinstance(r.data[0].embedding[0], float), "one float vector")
    return f"{len(r.data[0].embedding)} floats, prompt_tokens {r.usage.prompt_tokens}"


@check("openai completions.create")
def completions(c, model):
    r = c.completions.create(model=model, prompt="Say hello", max_tokens=20)
    need(r.choices[0].text, "text")
    return f"{r.choices[0].text!r}, usage {r.usage.total_tokens}"


@check("openai completions.create(stream=True)")
def completions_stream(c, model):
    text = "".join(
        ch.choices[0].text
        for ch in c.completions.create(model=model, prompt="Say hello", max_tokens=20, stream=True)
        if ch.choices
    )
    need(text, "text")
    return repr(text)


@check("openai responses.create")
def responses(c, model):
    r = c.responses.create(model=model, instructions="Be brief.", input="Say hello", max_output_tokens=20)
    need(r.output_text, "output_text")
    return f"{r.output_text!r}, usage {r.usage.total_tokens}"


@check("openai responses.create(stream=True)")
def responses_stream(c, model):
    text, usage, kinds = "", None, set()
    for event in c.responses.create(model=model, input="Say hello", stream=True):
        kinds.add(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
        if event.type == "response.completed":
            usage = event.response.usage.total_tokens
    need(text and usage, f"text {text!r}, usage {usage}, events {sorted(kinds)}")
    return f"{text!r}, usage {usage}, {len(kinds)} event types"


@check("openai responses.stream() helper")
def responses_helper(c, model):
    with c.responses.stream(model=model, input="Say hello") as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    need(final.output_text, "output_text")
    return f"{final.output_text!r}, usage {final.usage.total_tokens}"


@check("anthropic messages.create")
def messages(a, model):
    r = a.messages.create(model=model, max_tokens=20, messages=[{"role": "user", "content": "hi"}])
    need(r.content[0].text, "text")
    return f"{r.content[0].text!r}, usage {r.usage.input_tokens}+{r.usage.output_tokens}"


@check("anthropic messages.create(stream=True)")
def messages_stream(a, model):
    kinds, text = [], ""
    for event in a.messages.create(
        model=model, max_tokens=20, messages=[{"role": "user", "content": "hi"}], stream=True
    ):
        kinds.append(event.type)
        if event.type == "content_block_delta":
            text += event.delta.text
    need(kinds[0] == "message_start" and kinds[-1] == "message_stop" and text, f"{kinds} {text!r}")
    return f"{text!r}, {len(kinds)} events"


@check("anthropic messages.stream() helper")
def messages_helper(a, model):
    with a.messages.stream(model=model, max_tokens=20, messages=[{"role": "user", "content": "hi"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    need(text and final.usage.output_tokens, "text and usage")
    return f"{text!r}, usage {final.usage.input_tokens}+{final.usage.output_tokens}"


@check("openai RateLimitError on the gateway's 429")
def refusal(c, model):
    for n in range(1, 501):
        try:
            c.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
        except openai.RateLimitError as e:
            return f"after {n} requests: {e.status_code}, retry-after {e.response.headers.get('retry-after')}"
    raise AssertionError("no 429 in 500 requests")


@check("anthropic RateLimitError on the gateway's 429")
def anthropic_refusal(a, model):
    for n in range(1, 501):
        try:
            a.messages.create(model=model, max_tokens=5, messages=[{"role": "user", "content": "hi"}])
        except anthropic.RateLimitError as e:
            return f"after {n} requests: {e.status_code}, retry-after {e.response.headers.get('retry-after')}"
    raise AssertionError("no 429 in 500 requests")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", required=True, help="the gateway, e.g. http://127.0.0.1:4000")
    p.add_argument("--key", required=True)
    p.add_argument("--model", required=True, help="a model group speaking the OpenAI API")
    p.add_argument("--anthropic-model", required=True, help="a model group speaking Anthropic's API")
    p.add_argument("--refusal-model", help="a model with a small limit, to exhaust")
    args = p.parse_args()
    base = args.base_url.rstrip("/")
    # No retries: a 429 must reach the check, not be retried away.
    c = openai.OpenAI(base_url=f"{base}/v1", api_key=args.key, max_retries=0)
    a = anthropic.Anthropic(base_url=base, api_key=args.key, max_retries=0)
    print(f"openai {openai.__version__}, anthropic {anthropic.__version__}, gateway {base}")
    for f in (chat, chat_stream, embeddings, embeddings_float, completions, completions_stream,
              responses, responses_stream, responses_helper):
        f(c, args.model)
    for f in (messages, messages_stream, messages_helper):
        f(a, args.anthropic_model)
    if args.refusal_model:
        refusal(c, args.refusal_model)
        anthropic_refusal(a, args.refusal_model)
    failed = sum(1 for _, ok, _ in RESULTS if not ok)
    print(f"{len(RESULTS) - failed} passed, {failed} failed")
    sys.exit(failed)


if __name__ == "__main__":
    main()
