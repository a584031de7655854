#!/usr/bin/env python3
"""Fits the prompt-token heuristic's weights (tower-priority-limit/src/estimate/prompt.rs).

    FEATURES_TSV=/tmp/features.tsv cargo run --release -p benches --example prompt_estimates
    python3 benches/data/prompts/fit_heuristic.py /tmp/features.tsv

Model: text tokens = w . (ASCII letters and digits, spaces, other ASCII, 2-, 3-, 4-byte UTF-8
characters),
fitted by least squares on the relative error of each body's total (text + framing), i.e. rows
weighted by 1 / truth. Prints the weights fitted on all bodies, and a two-fold check (fit on the
even-numbered bodies, error on the odd ones, and the other way round) to show how much of the
fit is the corpus's own noise. Also scores two models not used: the first version without
separate spaces, and one with the count of words (runs of ASCII letters and digits) added.
"""

import sys

FEATURES = ["alnum", "space", "ascii_punct", "utf8_2", "utf8_3", "utf8_4"]


def load(path):
    rows = []
    with open(path) as f:
        header = f.readline().rstrip("\n").split("\t")
        for line in f:
            r = dict(zip(header, line.rstrip("\n").split("\t")))
            rows.append(r)
    return rows


def solve(a, b):
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[piv] = m[piv], m[col]
        if abs(m[col][col]) < 1e-12:
            continue
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                for c in range(col, n + 1):
                    m[r][c] -= f * m[col][c]
    return [m[i][n] / m[i][i] if abs(m[i][i]) > 1e-12 else 0.0 for i in range(n)]


def fit(rows, feats):
    k = len(feats)
    ata = [[0.0] * k for _ in range(k)]
    atb = [0.0] * k
    for r in rows:
        t = float(r["truth"])
        x = [float(r[f]) / t for f in feats]
        y = (t - float(r["overhead"])) / t
        for i in range(k):
            atb[i] += x[i] * y
            for j in range(k):
                ata[i][j] += x[i] * x[j]
    return dict(zip(feats, solve(ata, atb)))


def errors(rows, w):
    out = []
    for r in rows:
        t = float(r["truth"])
        est = float(r["overhead"]) + sum(w[f] * float(r[f]) for f in w)
        out.append((est - t) / t)
    return out


def summary(errs):
    s = sorted(errs)
    a = sorted(abs(e) for e in errs)
    q = lambda v, p: v[round((len(v) - 1) * p)]
    return "median %+.1f %%, p90 |err| %.1f %%, worst %+.1f %%" % (
        100 * q(s, 0.5), 100 * q(a, 0.9), 100 * max(errs, key=abs))


def report(rows, feats):
    even = [r for r in rows if int(r["index"]) % 2 == 0]
    odd = [r for r in rows if int(r["index"]) % 2 == 1]
    held = errors(odd, fit(even, feats)) + errors(even, fit(odd, feats))
    print("  in-sample:", summary(errors(rows, fit(rows, feats))))
    print("  two-fold held-out:", summary(held))


def main():
    rows = load(sys.argv[1])
    for r in rows:
        r["ascii_other"] = str(int(r["space"]) + int(r["ascii_punct"]))
    # Few bodies have emoji: 4-byte characters are only fitted if some body has enough of them.
    feats = [f for f in FEATURES if sum(float(r[f]) for r in rows) > 50]
    w = fit(rows, feats)
    print("weights fitted on all %d bodies (tokens per character):" % len(rows))
    for f in feats:
        print("  %-12s %.4f  (milli: %d)" % (f, w[f], round(w[f] * 1000)))
    report(rows, feats)
    others = [f for f in feats if f not in ("space", "ascii_punct")]
    print("not used: spaces counted with other ASCII")
    report(rows, others[:1] + ["ascii_other"] + others[1:])
    print("not used: plus the number of words")
    report(rows, feats + ["word_starts"])


if __name__ == "__main__":
    main()
