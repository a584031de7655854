#!/usr/bin/env python3
"""Calls a running gateway through the official `openai` SDK, one call per line of stdin, and
prints, one JSON object per line, what the SDK returned or raised: the test (tests/src/sdk.rs)
asserts on them, and between calls it may wait for the gateway (its settlements to reach Redis).
It decides nothing itself.

    python3 tests/sdk/openai_keys.py BASE_URL < calls

Each line of stdin: {"key", "model", "stream"}; each answer line adds "call" (its line number).
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
    base_url = sys.argv[1]
    for n, line in enumerate(sys.stdin):
        call = json.loads(line)
        # No retries: the test counts what the gateway answers, not what the SDK retried.
        client = openai.OpenAI(base_url=base_url, api_key=call["key"], max_retries=0)
        try:
            seen = one(client, call["model"], call.get("stream", False))
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
        seen["call"] = n
        print(json.dumps(seen), flush=True)


if __name__ == "__main__":
    main()
