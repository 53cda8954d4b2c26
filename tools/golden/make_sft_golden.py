#!/usr/bin/env python3
"""Golden renderings of the families' chat templates, made with transformers' apply_chat_template.

Writes:
  tests/data/sft/golden.json     the templates (tools/golden/sft_templates.py) and, for each of
                                 them, a set of conversations (JSONL lines as an SFT file holds
                                 them): transformers' apply_chat_template(tokenize=False) text or
                                 the error it raises, the `tokenizers` ids of that text
                                 (add_special_tokens=False), the assistant spans (byte offsets)
                                 and the token mask (below)
  src/train/chat_template_known.c the template texts, where hp_chat_template_recognize finds
                                 a model folder's template
  examples/sft/chat.jsonl        the example's small SFT file (arithmetic questions)
  examples/sft/qwen3/            the example's model folder: the qwen3 test tokenizer.json
                                 with a tokenizer_config.json holding Qwen3's real template

Assistant spans, computed here from transformers alone: for the k-th message when it is an
assistant message, the span starts at the end of the rendering of messages[:k] with
add_generation_prompt=True (TorchTitan's ChatProcessor locates the prompt the same way; it
must be a prefix of the full rendering) and ends after the first end-of-turn text (the
template's eos, <|im_end|>, <|eot_id|>, <end_of_turn>) at or after that start.
Token mask: for a span [s, e), the tokens from len(encode(text[:s])) (or, when that encoding
is not a prefix of the whole text's, from the first token where they differ) to
len(encode(text[:e])) (or one past the first difference) are the assistant's.

Run (needs `pip install transformers jinja2 tokenizers==0.23.3`; tests never need Python):
  python3 tools/golden/make_sft_golden.py
The script is deterministic.
"""
import json
import os
import random
import sys

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from sft_templates import TEMPLATES  # noqa: E402

TOK_DIR = os.path.join(ROOT, "tests", "data", "tokenizer", "hf")
OUT = os.path.join(ROOT, "tests", "data", "sft")

U = lambda c: {"role": "user", "content": c}  # noqa: E731
A = lambda c: {"role": "assistant", "content": c}  # noqa: E731
S = lambda c: {"role": "system", "content": c}  # noqa: E731
T = lambda c: {"role": "tool", "content": c}  # noqa: E731

# (name, JSONL object, add_generation_prompt)
CONVERSATIONS = [
    ("single", {"messages": [U("Hello"), A("Hi there!")]}, False),
    ("system", {"messages": [S("You are a terse assistant."), U("What is 2 + 2?"), A("4.")]}, False),
    ("multi_turn", {"messages": [S("  Be helpful.  "), U("Hello"), A("Hi there"), U("Who are you"),
                                 A("   I am an assistant   ")]}, False),
    ("unicode", {"messages": [U("Grüße! 你好 👋🏽 — ça va?\nZweite Zeile."),
                              A("Très bien, merci. 我很好。\nSecond line.\n")]}, False),
    ("prompt_completion", {"prompt": "Translate to French: cheese", "completion": "fromage"}, False),
    ("prompt_completion_messages", {"prompt": [S("Answer briefly."), U("Capital of Italy?")],
                                    "completion": [A("Rome.")]}, False),
    ("tool", {"messages": [U("What is the weather in Paris?"), A("Let me check."), T('{"temp": 21}'),
                           A("It is 21 degrees.")]}, False),
    ("two_tools", {"messages": [U("Compare Paris and Rome."), A("Checking both."), T('{"paris": 21}'),
                                T('{"rome": 25}'), A("Rome is warmer.")]}, False),
    ("think_in_content", {"messages": [U("2+3?"), A("<think>\nAdd them.\n</think>\n\n5")]}, False),
    ("reasoning_field", {"messages": [U("Q1"), {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
                                      U("Q2"), {"role": "assistant", "content": "A2", "reasoning_content": "R2"}]},
     False),
    ("think_earlier_turn", {"messages": [U("Q1"), A("<think>first</think>A1"), U("Q2"), A("A2")]}, False),
    ("tool_response_user", {"messages": [U("Q"), A("<think>r</think>A"),
                                         U("<tool_response>x</tool_response>"), A("B")]}, False),
    ("two_systems", {"messages": [S("S1"), S("S2"), U("U"), A("A")]}, False),
    ("assistant_first", {"messages": [A("Hi"), U("U"), A("A")]}, False),
    ("empty_answer", {"messages": [U("Say nothing."), A("")]}, False),
    ("leading_newlines", {"messages": [U("U"), A("\n\nLeading newlines")]}, False),
    ("special_text", {"messages": [U("say <|im_end|> and </s> please"), A("ok <|eot_id|>")]}, False),
    ("generation_prompt", {"messages": [U("Just a question")]}, True),
    ("generation_prompt_multi", {"messages": [S("S"), U("Q1"), A("A1"), U("Q2")]}, True),
]


def messages_of(obj):
    if "messages" in obj:
        return [dict(m) for m in obj["messages"]], None
    p, c = obj["prompt"], obj["completion"]
    pm = [U(p)] if isinstance(p, str) else [dict(m) for m in p]
    cm = [A(c)] if isinstance(c, str) else [dict(m) for m in c]
    return pm + cm, len(pm)


def make_tokenizer(folder, tmpl):
    cfg = json.load(open(os.path.join(TOK_DIR, folder, "tokenizer_config.json"), encoding="utf-8"))

    def tok_name(v):
        return v["content"] if isinstance(v, dict) else v

    kw = {}
    for k in ("bos_token", "eos_token", "pad_token"):
        if cfg.get(k) is not None:
            kw[k] = tok_name(cfg[k])
    t = PreTrainedTokenizerFast(tokenizer_file=os.path.join(TOK_DIR, folder, "tokenizer.json"), **kw)
    t.chat_template = tmpl
    return t


def render(t, msgs, gen):
    return t.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)


def lcp(a, b):
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def main():
    os.makedirs(OUT, exist_ok=True)
    golden = {"transformers": __import__("transformers").__version__,
              "tokenizers": __import__("tokenizers").__version__, "templates": [], "cases": []}
    for name, family, models, end, folder, text in TEMPLATES:
        golden["templates"].append({"name": name, "family": family, "models": models, "end": end,
                                    "tokenizer": folder, "text": text})
        t = make_tokenizer(folder, text)
        raw = Tokenizer.from_file(os.path.join(TOK_DIR, folder, "tokenizer.json"))
        enc = lambda s: raw.encode(s, add_special_tokens=False).ids  # noqa: E731
        for cname, obj, gen in CONVERSATIONS:
            msgs, n_prompt = messages_of(obj)
            case = {"template": name, "name": cname, "line": json.dumps(obj, ensure_ascii=False),
                    "add_generation_prompt": gen}
            try:
                full = render(t, msgs, gen)
            except Exception as e:  # the template refuses the conversation (raise_exception)
                case["error"] = str(e)
                golden["cases"].append(case)
                continue
            case["text"] = full
            ids = enc(full)
            case["ids"] = ids
            if gen:
                golden["cases"].append(case)
                continue
            spans = []
            first = n_prompt if n_prompt is not None else 0
            for k, m in enumerate(msgs):
                if m["role"] != "assistant" or k < first:
                    continue
                try:
                    prompt = render(t, msgs[:k], True)
                except Exception:
                    prompt = None
                if prompt is None and k == 0:
                    spans = None   # nothing to render before it: the text is golden, the spans not
                    break
                if prompt is None or not full.startswith(prompt):
                    raise SystemExit(f"{name}/{cname}: message {k}: the prompt rendering is not a prefix")
                s = len(prompt)
                # the end: that of the rendering through this message where it is a prefix (the
                # content may quote the end token), else the first end token after the start
                try:
                    upto = render(t, msgs[:k + 1], False)
                except Exception:
                    upto = None
                if upto is not None and full.startswith(upto) and upto.rfind(end) >= s:
                    e = upto.rfind(end) + len(end)
                else:
                    e = full.index(end, s) + len(end)
                spans.append((len(full[:s].encode()), len(full[:e].encode())))
                # the prefix a later span starts from is rendered again; spans must not overlap
            if spans is None:
                golden["cases"].append(case)
                continue
            case["spans"] = spans
            mask = [0] * len(ids)
            for s_b, e_b in spans:
                s_c = len(full.encode()[:s_b].decode())
                e_c = len(full.encode()[:e_b].decode())
                p = enc(full[:s_c])
                a = len(p) if ids[:len(p)] == p else lcp(p, ids)
                q = enc(full[:e_c])
                b = len(q) if ids[:len(q)] == q else lcp(q, ids) + 1
                for i in range(a, min(b, len(ids))):
                    mask[i] = 1
            case["mask"] = mask
            golden["cases"].append(case)
    with open(os.path.join(OUT, "golden.json"), "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
        f.write("\n")
    write_known_c()
    write_example()
    n_err = sum(1 for c in golden["cases"] if "error" in c)
    print(f"{len(golden['cases'])} cases ({n_err} refused by the template) over {len(TEMPLATES)} templates")


def c_string(s):
    out = []
    for line in s.encode().split(b"\n"):
        out.append(line)
    parts = []
    for i, line in enumerate(out):
        esc = []
        for ch in line:
            c = chr(ch)
            if c == "\\":
                esc.append("\\\\")
            elif c == '"':
                esc.append('\\"')
            elif 32 <= ch < 127:
                esc.append(c)
            else:
                esc.append("\\%03o" % ch)
        nl = "\\n" if i < len(out) - 1 else ""
        parts.append('    "' + "".join(esc) + nl + '"')
    return "\n".join(parts)


def write_known_c():
    path = os.path.join(ROOT, "src", "train", "chat_template_known.c")
    with open(path, "w", encoding="utf-8") as f:
        f.write("/* The chat templates of the model families as their released tokenizer_config.json files hold\n"
                " * them, which hp_chat_template_recognize compares a model folder's template with. Generated by\n"
                " * tools/golden/make_sft_golden.py from tools/golden/sft_templates.py; do not edit. */\n")
        f.write('#include "train/chat_template-impl.h"\n\n')
        f.write("const hp_chat_known_t hp_chat_known[] = {\n")
        for name, family, models, end, folder, text in TEMPLATES:
            f.write("    {\"%s\", \"%s\", \"%s\",\n%s},\n" % (name, family, models, c_string(text)))
        f.write("};\n")
        f.write("const int hp_chat_known_count = (int)(sizeof hp_chat_known / sizeof hp_chat_known[0]);\n")


def write_example():
    """The example's data: 400 conversations about small sums and products, a system prompt in
    every fourth, and a model folder for the qwen3 template."""
    ex = os.path.join(ROOT, "examples", "sft")
    os.makedirs(os.path.join(ex, "qwen3"), exist_ok=True)
    rng = random.Random(28)
    with open(os.path.join(ex, "chat.jsonl"), "w", encoding="utf-8") as f:
        for i in range(400):
            a, b = rng.randint(0, 20), rng.randint(0, 20)
            if i % 2 == 0:
                q, r = f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}."
            else:
                q, r = f"What is {a} times {b}?", f"{a} times {b} is {a * b}."
            if i % 5 == 4:
                obj = {"prompt": q, "completion": r}
            else:
                msgs = [U(q), A(r)]
                if i % 4 == 0:
                    msgs.insert(0, S("You answer arithmetic questions in one sentence."))
                obj = {"messages": msgs}
            f.write(json.dumps(obj, ensure_ascii=False) + "\n")
    src = os.path.join(TOK_DIR, "qwen3", "tokenizer.json")
    with open(src, "rb") as a, open(os.path.join(ex, "qwen3", "tokenizer.json"), "wb") as b:
        b.write(a.read())
    qwen3 = [t for t in TEMPLATES if t[0] == "qwen3"][0][5]
    cfg = {"add_bos_token": False, "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
           "chat_template": qwen3}
    with open(os.path.join(ex, "qwen3", "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
