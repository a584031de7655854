#!/usr/bin/env python3
"""Calls a running gateway through the official `openai` SDK as each key the test made, and
prints, one JSON object per line, what the SDK returned or raised: the test (tests/gateway/sdk.rs)
asserts on them. It decides nothing itself.

    python3 tests/sdk/openai_keys.py BASE_URL CASES_JSON

CASES_JSON: a list of {"name", "key", "model", "calls", "stream"}; each case makes `calls`
chat completions as `key` on `model`, one after the other.
"""

import json
import sys

import openai


def one(client, model, stream):
    if stream:
        text = ""
        usage = None
        for chunk in client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        ):
            for choice in chunk.choices:
                text += choice.delta.content or ""
            if chunk.usage is not None:
                usage = chunk.usage.total_tokens
        return {"ok": True, "text": text, "total_tokens": usage}
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}]
    )
    return {"ok": True, "text": r.choices[0].message.content, "total_tokens": r.usage.total_tokens}


def main():
    base_url, cases = sys.argv[1], json.loads(sys.argv[2])
    for case in cases:
        # No retries: the test counts what the gateway answers, not what the SDK retried.
        client = openai.OpenAI(base_url=base_url, api_key=case["key"], max_retries=0)
        for i in range(case["calls"]):
            try:
                seen = one(client, case["model"], case.get("stream", False))
            except openai.APIStatusError as e:
                body = e.body if isinstance(e.body, dict) else {}
                seen = {
                    "ok": False,
                    "error": type(e).__name__,
                    "status": e.status_code,
                    "message": body.get("message") or str(e),
                    "type": body.get("type"),
                    "retry_after": e.response.headers.get("retry-after"),
                }
            seen.update({"case": case["name"], "call": i})
            print(json.dumps(seen), flush=True)


if __name__ == "__main__":
    main()
