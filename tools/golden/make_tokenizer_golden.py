#!/usr/bin/env python3
"""Golden ids for tests/test_tokenizer.c, made with the Hugging Face `tokenizers` library.

Writes into tests/data/tokenizer/:
  corpus.txt              small training text (fortune quotes + the multilingual sample)
  gpt2_hf.json            GPT-2-style byte-level BPE trained by `tokenizers` itself
                          (ByteLevel pre-tokenizer, add_prefix_space=false) plus added tokens
  gpt2_hf_prefix.json     the same with add_prefix_space=true
  llama3_hf.json          Llama-3-style: Split(Llama 3 regex, Isolated) + ByteLevel(use_regex=false),
                          ignore_merges=true, TemplateProcessing "<|begin_of_text|> $A"
  ours.json               trained by OUR `hp-tokenizer train` (vocab 1500) on corpus.txt
  golden_<name>.json      for each tokenizer: texts, HF ids without / with special tokens,
                          HF decode with / without skip_special_tokens, and lossy decodes

Run (needs `tokenizers`, e.g. /opt/torchvenv/bin/python) after building hp-tokenizer:
  /opt/torchvenv/bin/python tools/golden/make_tokenizer_golden.py --hp-tokenizer build/hp-tokenizer
Add --diff-lib build/libhyperparallel.so [--diff-n 2000] for a random differential test of
the library against HF (nothing is written for it).
"""
import argparse
import glob
import json
import os
import subprocess
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(ROOT, "tests", "data", "tokenizer")

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")

MULTILINGUAL = (
    "Hello, world! This is a test of the tokenizer.\n"
    "Don't panic; we'll see what they've done. I'm sure it's fine, isn't it? DON'T SHOUT, I'LL HEAR.\n"
    "Über Größe und Maße: Fußgänger gehen über die Straße. Schöne Grüße aus Köln!\n"
    "Le cœur a ses raisons que la raison ne connaît point. Ça va? Très bien, merci — à bientôt, élève!\n"
    "中文测试：我爱自然语言处理。今天天气很好。\n"
    "日本語のテキスト、カタカナとひらがな。東京は大きい都市です。\n"
    "Русский текст: Привет, как дела? Всё хорошо.\n"
    "النص العربي: مرحبا بالعالم، كيف حالك؟\n"
    "Emoji: 😀🎉👍🏽 family 👨\u200d👩\u200d👧 flags 🇩🇪🇫🇷 hearts ❤️\n"
    "Digits: 0 12 345 6789 1234567890 3.14159 1,000,000 2026-11-30\n"
    "Code: def f(x):\n    return x**2 + 1  # comment\n\tif (a && b) { c[i] += 0x1F; }\n"
    "Whitespace runs:   three spaces,\t\ttwo tabs,     five spaces.   \n"
    "\n\n\nMultiple newlines above.\r\nWindows line ending.\r\n"
    "Unicode spaces:\u00a0nbsp,\u3000ideographic,\u2028line sep, combining e\u0301 and ñ.\n"
    "Trailing spaces   "
)

EXTRA_CASES = [
    "",
    " ",
    "a",
    "   leading spaces",
    "trailing newlines\n\n\n",
    "don't DON'T Don't we'd they'RE I'm",
    "x  y   z\t\tw",
    "1234567 89 0",
    "ab" * 40,
    "Hello  world",
    "\n",
    "naïve café résumé",
    "say hello world  <tab>  done",
    "hello worldhello world<tab><tab>",
    "un café, s'il vous plaît",
    "ony Anthony ony_ ony2 \u00e9ony ony. (ony) ony\u0301 \u2160ony onyony ony",
    # Unicode classes: \\p{N} beyond ASCII (No, Nl, other scripts' digits), marks, format
    # characters, NEL / Mongolian vowel separator / ZWSP / BOM / soft hyphen, title case,
    # math letters, case folding under Llama 3's (?i:'s) (long s, Kelvin sign).
    "\u00b2\u00b3 \u00bd \u216b \u0663\u0664 \u09e7\u09e8 x\u0085nel \u180emvs \u200bzwsp \ufeffbom a\u00adb",
    "\u01c4 \u01c5 \u00df \u1e9e \ufb01 \U0001d518\U0001d52b\U0001d526 it'\u017f IT'S it\u2019s \u212a'll",
    # U+180E is \\s for PCRE2 but not for Oniguruma (the pattern translation handles it).
    "a  \u180e \n  \u180e\ufeff x\u180e\u180ey",
    "\u0915\u094d\u0937 \u0e01\u0e34 \ud55c\uad6d\uc5b4 \u05e9\u05c1 \u0640\u0640 \u3005\u3006 \uff21\uff11",
]


def special_cases(specials):
    a, b = specials[0], specials[-1]
    return [
        f"{a}Hello world{b}",
        f"text {a} inside {b} text",
        f"{a}{a}{b}",
        f"no space{a}after",
    ]


def make_corpus():
    path = os.path.join(OUT, "corpus.txt")
    srcs = ["/usr/share/games/fortunes/" + n for n in ("fortunes", "goedel", "pets", "magic")]
    if not all(os.path.exists(s) for s in srcs):
        if not os.path.exists(path):
            sys.exit(f"{srcs} missing (install the 'fortunes' package) and {path} does not exist")
        return path
    text = "".join(open(s, encoding="utf-8", errors="replace").read() for s in srcs)
    text = text + MULTILINGUAL + "\n"
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    return path


def train_gpt2(corpus):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=1000, min_frequency=2, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train([corpus], trainer)
    # Non-special added tokens: one with a space inside, one with lstrip/rstrip, one that is
    # not byte-level spelled (decodes through the raw-UTF-8 path).
    tok.add_tokens(["hello world", AddedToken("<tab>", lstrip=True, rstrip=True), "café",
                    AddedToken("ony", single_word=True)])
    tok.add_special_tokens(["<|pad|>"])
    return tok


def train_llama3(corpus):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, min_frequency=2,
                                  special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train([corpus], trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
                                      special_tokens=[("<|begin_of_text|>", bos)]),
    ])
    return tok


def save(tok, name):
    path = os.path.join(OUT, name)
    tok.save(path, pretty=False)
    return path


def golden(tok_path, name, specials):
    tok = Tokenizer.from_file(tok_path)
    texts = [MULTILINGUAL] + MULTILINGUAL.split("\n") + EXTRA_CASES + special_cases(specials)
    cases = []
    for t in texts:
        ids = tok.encode(t, add_special_tokens=False).ids
        ids_sp = tok.encode(t, add_special_tokens=True).ids
        tok.encode_special_tokens = True
        ids_plain = tok.encode(t, add_special_tokens=False).ids
        tok.encode_special_tokens = False
        cases.append({
            "text": t,
            "ids": ids,
            "ids_special": ids_sp,
            "ids_special_as_text": ids_plain,
            "decoded": tok.decode(ids_sp, skip_special_tokens=False),
            "decoded_skip": tok.decode(ids_sp, skip_special_tokens=True),
            # decode(encode(x)) == x in HF; false where an added token is not byte-level
            # spelled ("café") or strips whitespace ("<tab>"), or with add_prefix_space.
            "roundtrip": tok.decode(ids, skip_special_tokens=False) == t,
        })
        if name in ("ours", "llama3_hf"):
            assert cases[-1]["roundtrip"], (name, t)
    # Decodes of id runs that cut multi-byte characters (HF replaces them by U+FFFD).
    decodes = []
    for t in ["日本語", "😀🎉", "Größe", "café"]:
        ids = tok.encode(t, add_special_tokens=False).ids
        for k in range(1, len(ids) + 1):
            decodes.append({"ids": ids[:k], "text": tok.decode(ids[:k])})
            decodes.append({"ids": ids[k - 1:], "text": tok.decode(ids[k - 1:])})
    doc = {
        "tokenizer": os.path.basename(tok_path),
        "generator": "tokenizers " + __import__("tokenizers").__version__,
        "cases": cases,
        "decodes": decodes,
    }
    with open(os.path.join(OUT, f"golden_{name}.json"), "w", encoding="utf-8") as f:
        # One case per line: small files and readable diffs.
        head = {k: v for k, v in doc.items() if k not in ("cases", "decodes")}
        f.write(json.dumps(head, ensure_ascii=False)[:-1])
        for key in ("cases", "decodes"):
            f.write(f',\n "{key}": [\n  ')
            f.write(",\n  ".join(json.dumps(c, ensure_ascii=False) for c in doc[key]))
            f.write("\n ]")
        f.write("\n}\n")
    print(f"golden_{name}.json: {len(cases)} cases, {sum(len(c['ids']) for c in cases)} ids")


SPLIT_TEXTS = ["the-final--countdown", "Hello,  world! don't  stop -- 12-34", "a\n\nb  c\t-d-",
               "e\u0301t\u00e9 x\u00b2 \u00bd_y \u2160 \u0663 a\u180eb",
               "\u00abBonjour\u00bb \u2014 \u00bfqu\u00e9? \u300c\u65e5\u672c\u300d $5+3=8 a_b 2026 \u00a0x",
               "--x--", "Größe -- 中文 -- 😀", "", " ", "x y"]


def unk_golden(corpus):
    """A byte-level BPE whose alphabet is only the bytes seen in 20 KB of the corpus, with
    unk_token "<unk>": unknown bytes become <unk> (fuse_unk false), or one <unk> per run
    (fuse_unk true; the C test flips the flag in the JSON)."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, min_frequency=2, special_tokens=["<unk>"], show_progress=False)
    tok.train_from_iterator([open(corpus, encoding="utf-8").read()[:20000]], trainer)
    path = save(tok, "gpt2_unk.json")
    doc = json.loads(tok.to_str())
    doc["model"]["fuse_unk"] = True
    fused = Tokenizer.from_str(json.dumps(doc))
    texts = MULTILINGUAL.split("\n") + ["hello 한국어 world 中", "\u00e9\u00e9\u00e9 x \U0001F600\U0001F600"]
    cases = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids,
              "ids_fused": fused.encode(t, add_special_tokens=False).ids} for t in texts]
    with open(os.path.join(OUT, "golden_unk.json"), "w", encoding="utf-8") as f:
        f.write('{"tokenizer": "gpt2_unk.json", "cases": [\n  ')
        f.write(",\n  ".join(json.dumps(c, ensure_ascii=False) for c in cases))
        f.write("\n]}\n")
    print(f"golden_unk.json: {len(cases)} cases")


def random_texts(n, seed):
    """Random mixes of scripts, digits, punctuation, whitespace (incl. Unicode spaces),
    marks, contractions and added / special token spellings."""
    import random
    rng = random.Random(seed)
    pools = ["abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " \t\n\r", "'",
             ".,;:!?-_()[]{}<>/\\\"@#$%^&*+=|~`", "äöüßéèêçñÀÉ", "中文日本語テキストひらがな", "Привет мир",
             "مرحبا", "😀🎉👍🏽\u200d❤️🇩🇪", "\u00a0\u3000\u2028\u0085\u180e\u200b\ufeff", "²½Ⅻ٣১",
             "\u0301\u0308", "sStTdDmMlLrReEvV'"]
    whole = ["<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>", "<tab>", "hello world", "café", "ony"]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(0, 30)):
            if rng.random() < 0.08:
                parts.append(rng.choice(whole))
            else:
                p = rng.choice(pools)
                parts.append("".join(rng.choice(p) for _ in range(rng.randint(1, 4))))
        out.append("".join(parts))
    return out


def random_golden(names):
    """golden_random.json: HF ids of 25 random texts per tokenizer."""
    cases = []
    for k, name in enumerate(names):
        tok = Tokenizer.from_file(os.path.join(OUT, name))
        for t in random_texts(25, 1000 + k):
            cases.append({"tokenizer": name, "text": t, "ids": tok.encode(t, add_special_tokens=False).ids})
    with open(os.path.join(OUT, "golden_random.json"), "w", encoding="utf-8") as f:
        f.write('{"cases": [\n  ')
        f.write(",\n  ".join(json.dumps(c, ensure_ascii=False) for c in cases))
        f.write("\n]}\n")
    print(f"golden_random.json: {len(cases)} random texts")


def split_variants(base_path):
    """Split pre-tokenizer behaviours on top of gpt2_hf.json's vocab and merges: the C test
    puts each `pre_tokenizer` into that file and compares ids."""
    base = json.load(open(base_path, encoding="utf-8"))
    variants = []
    pats = [{"Regex": "-+"}, {"String": "-"}, {"Regex": "\\s+"}, {"Regex": "\\p{P}"}, {"Regex": "\\d*"}]
    for pat in pats:
        for beh in ["Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"]:
            for inv in [False, True]:
                # ByteLevel after the Split alternates between (no prefix space, no regex) and
                # (prefix space, GPT-2 regex) to keep the file small.
                aps = (len(variants) % 2) == 1
                variants.append({"type": "Sequence", "pretokenizers": [
                    {"type": "Split", "pattern": pat, "behavior": beh, "invert": inv},
                    {"type": "ByteLevel", "add_prefix_space": aps, "trim_offsets": True, "use_regex": aps}]})
    # \\w and \\W differ between Oniguruma and PCRE2 (marks, non-decimal numbers).
    for pat in [{"Regex": "\\w+"}, {"Regex": "\\W"}, {"Regex": "[\\w']+"}, {"Regex": "[^\\s\\w]+"}]:
        variants.append({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": pat, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]})
    # HF's fixed splitters.
    for fixed in [{"type": "Digits", "individual_digits": True}, {"type": "Digits", "individual_digits": False},
                  {"type": "Punctuation", "behavior": "Isolated"}, {"type": "Punctuation", "behavior": "Contiguous"},
                  {"type": "Punctuation", "behavior": "MergedWithPrevious"},
                  {"type": "WhitespaceSplit"}, {"type": "Whitespace"}]:
        for aps in [False, True]:
            variants.append({"type": "Sequence", "pretokenizers": [
                fixed, {"type": "ByteLevel", "add_prefix_space": aps, "trim_offsets": True, "use_regex": aps}]})
    out = []
    for pre in variants:
        doc = dict(base)
        doc["pre_tokenizer"] = pre
        tok = Tokenizer.from_str(json.dumps(doc))
        out.append({"pre_tokenizer": pre, "ids": [tok.encode(t, add_special_tokens=False).ids for t in SPLIT_TEXTS]})
    with open(os.path.join(OUT, "golden_split.json"), "w", encoding="utf-8") as f:
        f.write('{"tokenizer": "gpt2_hf.json", "texts": ' + json.dumps(SPLIT_TEXTS, ensure_ascii=False))
        f.write(',\n "variants": [\n  ')
        f.write(",\n  ".join(json.dumps(v, ensure_ascii=False) for v in out))
        f.write("\n ]\n}\n")
    print(f"golden_split.json: {len(out)} pre-tokenizer variants x {len(SPLIT_TEXTS)} texts")


def diff_against_library(lib_path, n):
    """Optional deeper check (not needed for the committed files): encode n random texts per
    tokenizer with our library through ctypes and with HF, and report mismatches."""
    import ctypes

    class Ids(ctypes.Structure):
        _fields_ = [("ids", ctypes.POINTER(ctypes.c_int32)), ("len", ctypes.c_size_t), ("cap", ctypes.c_size_t)]

    lib = ctypes.CDLL(lib_path)
    lib.hp_last_error.restype = ctypes.c_char_p
    total_bad = 0
    for k, name in enumerate(["gpt2_hf.json", "gpt2_hf_prefix.json", "llama3_hf.json", "ours.json"]):
        path = os.path.join(OUT, name)
        hf = Tokenizer.from_file(path)
        tok = ctypes.c_void_p()
        if lib.hp_tokenizer_load(ctypes.byref(tok), path.encode()) != 0:
            sys.exit(f"{name}: {lib.hp_last_error().decode()}")
        bad = 0
        for text in random_texts(n, 5000 + k):
            for flags, special in ((0, False), (1, True)):
                b = text.encode("utf-8")
                ids = Ids()
                if lib.hp_tokenizer_encode(tok, b, ctypes.c_size_t(len(b)), flags, ctypes.byref(ids)) != 0:
                    sys.exit(f"{name}: {lib.hp_last_error().decode()}")
                ours = [ids.ids[i] for i in range(ids.len)]
                lib.hp_token_ids_free(ctypes.byref(ids))
                if ours != hf.encode(text, add_special_tokens=special).ids:
                    bad += 1
                    if bad <= 3:
                        print(f"  {name}: MISMATCH for {text!r}")
        lib.hp_tokenizer_free(tok)
        print(f"diff {name}: {bad} mismatches in {2 * n} encodes")
        total_bad += bad
    if total_bad:
        sys.exit("our library disagrees with HF")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hp-tokenizer", default=None, help="path of our hp-tokenizer binary (build dir)")
    ap.add_argument("--diff-lib", default=None,
                    help="also compare N random texts per tokenizer against this libhyperparallel.so")
    ap.add_argument("--diff-n", type=int, default=2000)
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    corpus = make_corpus()

    gpt2 = train_gpt2(corpus)
    p = save(gpt2, "gpt2_hf.json")
    golden(p, "gpt2_hf", ["<|endoftext|>", "<|pad|>"])
    split_variants(p)
    unk_golden(corpus)

    doc = json.load(open(p, encoding="utf-8"))
    doc["pre_tokenizer"]["add_prefix_space"] = True
    # Exercise the legacy "left right" merge spelling too.
    doc["model"]["merges"] = [m if isinstance(m, str) else " ".join(m) for m in doc["model"]["merges"]]
    p2 = os.path.join(OUT, "gpt2_hf_prefix.json")
    with open(p2, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=0)
    golden(p2, "gpt2_hf_prefix", ["<|endoftext|>", "<|pad|>"])

    llama = train_llama3(corpus)
    p = save(llama, "llama3_hf.json")
    golden(p, "llama3_hf", ["<|begin_of_text|>", "<|end_of_text|>"])

    exe = args.hp_tokenizer
    if exe is None:
        cands = sorted(glob.glob(os.path.join(ROOT, "build*", "hp-tokenizer")))
        exe = cands[0] if cands else None
    if exe is None:
        sys.exit("hp-tokenizer not found: build it and pass --hp-tokenizer PATH")
    ours = os.path.join(OUT, "ours.json")
    subprocess.run([exe, "train", "--quiet", "--vocab-size", "1500", "--output", ours,
                    "--special", "<|begin_of_text|>,<|end_of_text|>", corpus], check=True)
    golden(ours, "ours", ["<|begin_of_text|>", "<|end_of_text|>"])

    random_golden(["gpt2_hf.json", "gpt2_hf_prefix.json", "llama3_hf.json", "ours.json"])

    # Our trainer is HF's BpeTrainer given the same sequence: train `tokenizers` on the whole
    # corpus as one text (tok.train(files) would split it into lines) and compare.
    ref = Tokenizer(models.BPE())
    ref.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=1500, min_frequency=2,
                                  special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    ref.train_from_iterator([open(corpus, encoding="utf-8").read()], trainer)
    hf = json.loads(ref.to_str())["model"]
    mine = json.load(open(ours, encoding="utf-8"))["model"]
    same = hf["vocab"] == mine["vocab"] and [list(m) for m in hf["merges"]] == mine["merges"]
    print(f"ours.json vocab and merges equal HF BpeTrainer's on the same text: {same}")
    if not same:
        sys.exit("our trainer diverged from HF BpeTrainer")
    if args.diff_lib:
        diff_against_library(args.diff_lib, args.diff_n)


if __name__ == "__main__":
    main()
