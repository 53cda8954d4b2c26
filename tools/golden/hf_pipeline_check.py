#!/usr/bin/env python3
"""Greedy generation of an HF folder exported by `hp-ckpt to-hf --tokenizer` through
transformers' pipeline("text-generation") (its tokenizer, generation_config.json and EOS),
compared with the ids hp-generate printed. Used by tests/test_hf_pipeline.c. Exit 0 when the
ids are equal.

    python tools/golden/hf_pipeline_check.py DIR PROMPT MAX_NEW_TOKENS "ID ID ..."
"""
import sys

import torch
import transformers


def main() -> int:
    d, prompt, n, want = sys.argv[1], sys.argv[2], int(sys.argv[3]), [int(x) for x in sys.argv[4].split()]
    pipe = transformers.pipeline("text-generation", model=d, tokenizer=d, dtype=torch.float32, device="cpu")
    prompt_ids = pipe.tokenizer(prompt)["input_ids"]
    out = pipe(prompt, max_new_tokens=n, do_sample=False, return_tensors=True)
    got = [int(x) for x in out[0]["generated_token_ids"]]
    ok = got == want
    print(f"transformers {transformers.__version__}: prompt ids {prompt_ids}")
    print(f"pipeline ids    {got}")
    print(f"hp-generate ids {want} -> {'OK' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
