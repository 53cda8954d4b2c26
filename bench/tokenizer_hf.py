#!/usr/bin/env python3
"""HF `tokenizers` side of bench/tokenizer.c: the same sample, the same tokenizer.json files,
the same two modes (every sample as one text; the samples joined by "\\n\\n" into ~64 KiB
documents), one thread (RAYON_NUM_THREADS=1, TOKENIZERS_PARALLELISM=false, set before the
import). Samples are encoded with encode_batch (one call for all of them: no Python
overhead per text; rayon limited to one thread) and with a loop of encode (what a Python
data loader does); documents with a loop of encode. Best of --reps runs.
  python3 bench/tokenizer_hf.py [--data tests/data/tokenizer/hf] [--reps 5] [family ...]
"""
import os

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse  # noqa: E402
import struct  # noqa: E402
import time  # noqa: E402

import tokenizers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

FAMILIES = ["qwen2", "qwen3", "llama2", "mistral", "gemma", "llama3", "deepseek_v3"]


def read_samples(path):
    data = open(path, "rb").read()
    assert data[:4] == b"HPTS"
    _, n = struct.unpack_from("<II", data, 4)
    off, out = 12, []
    for _ in range(n):
        (l,) = struct.unpack_from("<I", data, off)
        out.append(data[off + 4:off + 4 + l].decode("utf-8"))
        off += 4 + l
    return out


def best(fn, reps):
    t = 1e30
    res = None
    for _ in range(reps):
        t0 = time.perf_counter()
        res = fn()
        t = min(t, time.perf_counter() - t0)
    return t, res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="tests/data/tokenizer/hf")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("families", nargs="*")
    args = ap.parse_args()
    samples = read_samples(os.path.join(args.data, "samples.bin"))
    nbytes = sum(len(s.encode()) for s in samples)
    docs, cur = [], ""
    for s in samples:
        cur += s + "\n\n"
        if len(cur.encode()) >= 65536:
            docs.append(cur)
            cur = ""
    if cur:
        docs.append(cur)
    dbytes = sum(len(d.encode()) for d in docs)
    print(f"tokenizers {tokenizers.__version__}, RAYON_NUM_THREADS=1: {len(samples)} texts, {nbytes} bytes; "
          f"{len(docs)} documents, {dbytes} bytes")
    print(f"{'family':12s} {'mode':16s} {'MB/s':>9s} {'Mtok/s':>9s}")
    for fam in args.families or FAMILIES:
        tok = Tokenizer.from_file(os.path.join(args.data, fam, "tokenizer.json"))
        t, enc = best(lambda: tok.encode_batch(samples, add_special_tokens=False), args.reps)
        ntok = sum(len(e.ids) for e in enc)
        print(f"{fam:12s} {'samples (batch)':16s} {nbytes / t / 1e6:9.2f} {ntok / t / 1e6:9.3f}")
        t, enc = best(lambda: [tok.encode(s, add_special_tokens=False) for s in samples], args.reps)
        print(f"{fam:12s} {'samples (loop)':16s} {nbytes / t / 1e6:9.2f} {ntok / t / 1e6:9.3f}")
        t, enc = best(lambda: [tok.encode(d, add_special_tokens=False) for d in docs], args.reps)
        ntok = sum(len(e.ids) for e in enc)
        print(f"{fam:12s} {'documents':16s} {dbytes / t / 1e6:9.2f} {ntok / t / 1e6:9.3f}")


if __name__ == "__main__":
    main()
