#!/usr/bin/env python3
"""A synthetic request record (general_settings.record's lines) for benches/replay.sh: HOURS of
Poisson arrivals at RATE a second to group `chat`, from 30 keys (10 of priority prod; 10 of team
`batch`, default priority; 10 others), with prompt and output tokens, latencies and a few failed
attempts drawn from a seeded stream. Every request is recorded as served: what a candidate would
refuse is the replay's to say.

    benches/replay_trace.py HOURS RATE SEED > trace.jsonl
"""
import json
import random
import sys

hours, rate, seed = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
keys = [(f"{i:016x}", "prod" if i < 10 else None, "batch" if 10 <= i < 20 else None) for i in range(30)]
t, end = 0.0, hours * 3600.0
start_ms = 1_796_000_000_000
while True:
    t += rng.expovariate(rate)
    if t >= end:
        break
    key, priority, team = rng.choice(keys)
    prompt = rng.randint(100, 900)
    output = rng.randint(20, 400)
    latency = int(rng.lognormvariate(6.5, 0.6))  # ms, median ~650
    line = {"time_ms": start_ms + int(t * 1000), "model": "chat", "endpoint": "/chat/completions",
            "key": key, "flow": int(key, 16) + 1, "prompt_tokens": prompt, "max_tokens": 512,
            "stream": False, "status": 200, "outcome": "served",
            "tokens": prompt + output, "reported": True, "output_tokens": output,
            "head_ms": latency // 3, "latency_ms": latency}
    if team:
        line["team"] = team
    if priority:
        line["priority"] = priority
    if rng.random() < 0.02:
        line["failed_attempts"] = 1
    print(json.dumps(line, separators=(",", ":")))
