#!/usr/bin/env python3
"""Golden ids of the model families' tokenizers, made with the Hugging Face `tokenizers` library.

Writes tests/data/tokenizer/hf/:
  samples.bin          the multilingual sample: >= 10,000 strings (translations of 25
                       languages from the Debian gettext catalogs on this machine, fortune
                       quotes, and generated text: combining sequences incl. marks newer than
                       Unicode 9.0, Hangul jamo, compatibility characters, emoji (ZWJ, skin
                       tones, flags, Unicode 15-16), CJK incl. extensions H / I, Unicode 15-16
                       letters and digits, RTL with bidi controls, whitespace runs, control
                       characters, special-token spellings, code)
  <family>/tokenizer.json, tokenizer_config.json
                       a tokenizer in the configuration of each family (normalizer,
                       pre-tokenizer, model options, decoder, post-processor, added tokens as
                       the released files have them), its vocabulary trained by `tokenizers`
                       (BpeTrainer) on text made here: qwen2, qwen3, llama2, mistral, gemma,
                       llama3, deepseek_v3
  <family>.ids         HF's ids of every sample (add_special_tokens=False), the template ids,
                       and HF's decode of them where it differs from the sample
  <family>.docs.ids    the same for four long documents: 300 samples each, joined by "\n\n"
  variants.json + variants/<name>.ids
                       pipeline variants (Metaspace split / prepend schemes, NFD / NFKC /
                       NFKD, Strip, Replace with a regex, Digits, decoder Metaspace) on the
                       qwen2 and mistral vocabularies, over the first 400 samples

File formats (little-endian): samples.bin = "HPTS", u32 version 1, u32 count, then per
sample u32 length + UTF-8 bytes. <name>.ids = "HPTI", u32 version 1, u32 count, varint
n_prefix + ids, varint n_suffix + ids (encode("", add_special_tokens=True) split around the
empty text), then per sample: varint n + n varint ids, a byte of flags (1: HF's
decode(ids) differs from the sample and follows as varint length + bytes; 2: the ids with
add_special_tokens=True are not prefix + ids + suffix and follow as varint n + ids).

Run (needs `pip install tokenizers==0.23.3 unicodedata2==16.0.0`):
  python3 tools/golden/make_tokenizer_hf_golden.py
A random differential test of the built library against HF (nothing is written):
  python3 tools/golden/make_tokenizer_hf_golden.py --diff-lib build/libhyperparallel.so --diff-n 3000
The script is deterministic: with the same catalogs it reproduces the committed files; the
committed samples.bin is reused unless --resample is given (catalogs differ between
machines). Tests never need Python.
"""
import argparse
import gettext
import glob
import json
import os
import random
import struct
import sys
import unicodedata

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(ROOT, "tests", "data", "tokenizer", "hf")
CORPUS = os.path.join(ROOT, "tests", "data", "tokenizer", "corpus.txt")
TOKENIZERS_VERSION = "0.23.3"
DOC_SAMPLES = 300

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
DEEPSEEK_PATTERNS = [
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+",
]
LANGS = ["zh_CN", "zh_TW", "ja", "ko", "ar", "he", "fa", "hi", "bn", "ta", "th", "ru", "uk", "el",
         "vi", "ka", "hy", "am", "my", "km", "tr", "pl", "de", "fr", "es"]
SPECIAL_SPELLINGS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>", "<unk>", "[INST]",
                     "[/INST]", "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<|begin_of_text|>",
                     "<|eot_id|>", "<think>", "</think>", "<\uff5cUser\uff5c>", "<\uff5cAssistant\uff5c>",
                     "<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<tool_call>", "<0x41>", "\u2581", "<|pad|>"]


# ---- the multilingual sample ------------------------------------------------------------

def catalog_strings(lang):
    out = []
    for f in sorted(glob.glob(f"/usr/share/locale/{lang}/LC_MESSAGES/*.mo")):
        try:
            cat = gettext.GNUTranslations(open(f, "rb"))._catalog
        except Exception:
            continue
        for v in cat.values():
            if isinstance(v, str) and v.strip():
                out.append(v)
    return sorted(set(out))


def cut(s, rng, maxlen=80):
    if len(s) <= maxlen:
        return s
    a = rng.randrange(0, len(s) - maxlen + 1)
    return s[a:a + maxlen]


def assigned(cp):
    import unicodedata2
    return unicodedata2.category(chr(cp)) not in ("Cn", "Cs")


def new_chars():
    """Letters, digits and symbols of Unicode 15.0-16.0 (Oniguruma knows them, PCRE2 10.42
    does not)."""
    ranges = [(0x11F00, 0x11F59), (0x10D40, 0x10D8F), (0x31350, 0x313A0), (0x2EBF0, 0x2EC20),
              (0x105C0, 0x105F3), (0x1D2C0, 0x1D2D3), (0x1E4D0, 0x1E4F9), (0x1E030, 0x1E06D),
              (0x16100, 0x16139), (0x16D40, 0x16D79), (0x1E5D0, 0x1E5FA), (0x11BC0, 0x11BF9),
              (0x1CCF0, 0x1CCF9), (0x1CC00, 0x1CC40), (0x116D0, 0x116E3), (0x1DF25, 0x1DF2A),
              (0x1FA75, 0x1FA89), (0x1FAA0, 0x1FAEF), (0x1FAF0, 0x1FAF8), (0x0CF3, 0x0CF3), (0x0ECE, 0x0ECE)]
    return [cp for a, b in ranges for cp in range(a, b + 1) if assigned(cp)]


def marks():
    import unicodedata2
    return [cp for cp in range(0x110000) if not (0xD800 <= cp < 0xE000) and unicodedata2.combining(chr(cp))]


def compat_chars():
    out = []
    for cp in list(range(0xA0, 0x250)) + list(range(0x2000, 0x2500)) + list(range(0x3200, 0x3400)) + \
            list(range(0xF900, 0xFB50)) + list(range(0xFE30, 0xFFEF)) + list(range(0x1D400, 0x1D800)):
        ch = chr(cp)
        if unicodedata.decomposition(ch) and unicodedata.category(ch) != "Cn":
            out.append(ch)
    return out


def generated(rng, n):
    mk = marks()
    newc = new_chars()
    comp = compat_chars()
    emoji = ["\U0001F600", "\U0001F389", "\U0001F44D\U0001F3FD", "\U0001F468\u200d\U0001F469\u200d\U0001F467",
             "\U0001F1E9\U0001F1EA", "\U0001F1EB\U0001F1F7", "\u2764\ufe0f", "1\ufe0f\u20e3", "\U0001FA77",
             "\U0001FAE8", "\U0001FAE9", "\U0001F9D1\U0001F3FF\u200d\U0001F4BB", "\U0001F3F3\ufe0f\u200d\U0001F308",
             "\u263a", "\u270c\U0001F3FB", "\U0001F9CC", "\U0001FAE0", "\U0001FAF6\U0001F3FC"]
    words = ["hello", "world", "Straße", "naïve", "café", "Ελλάδα", "Москва", "東京", "서울", "مرحبا", "שלום",
             "नमस्ते", "ไทย", "Việt Nam", "don't", "I'LL", "it's", "x86_64", "3.14159", "2026-11-30"]
    spaces = [" ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", "\u00a0", "\u3000", "\u2028", "\u0085", "\u180e",
              "\u200b", "\ufeff", " \n ", "\t\t  "]
    controls = [chr(c) for c in list(range(0, 32)) + [0x7F] + list(range(0x80, 0xA0))] + \
               ["\u200e", "\u200f", "\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2069", "\u00ad"]
    latin = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    vowels_vi = "aăâeêioôơuưyAĂÂEÊIOÔƠUƯY"
    code = ["def f(x):\n    return x**2  # sq", "if (a && b) { c[i] += 0x1F; }", "for (int i = 0; i < n; i++)",
            "SELECT * FROM t WHERE id = 42;", "<div class=\"x\">&nbsp;</div>", "$ ls -la | grep '.c$'"]
    kinds = ["combining", "hangul", "compat", "emoji", "newchars", "rtl", "whitespace", "control", "special",
             "digits", "code", "mix", "nfd_text", "cjk"]
    out = []
    for i in range(n):
        k = kinds[i % len(kinds)]
        if k == "combining":
            s = "".join(rng.choice(latin + vowels_vi) + "".join(chr(rng.choice(mk)) for _ in range(rng.randint(0, 4)))
                        for _ in range(rng.randint(1, 6)))
        elif k == "hangul":
            s = ""
            for _ in range(rng.randint(1, 6)):
                s += chr(0x1100 + rng.randrange(19)) + chr(0x1161 + rng.randrange(21))
                if rng.random() < 0.5:
                    s += chr(0x11A8 + rng.randrange(27))
                if rng.random() < 0.3:
                    s += chr(0xAC00 + rng.randrange(11172))
                if rng.random() < 0.2:
                    s += " "
        elif k == "compat":
            s = "".join(rng.choice(comp) if rng.random() < 0.6 else rng.choice(latin + " ") for _ in range(rng.randint(1, 12)))
        elif k == "emoji":
            s = "".join(rng.choice(emoji) if rng.random() < 0.7 else rng.choice(words + [" "]) for _ in range(rng.randint(1, 8)))
        elif k == "newchars":
            s = "".join(chr(rng.choice(newc)) if rng.random() < 0.6 else rng.choice(latin + " 0123456789.,!?\u4e2d")
                        for _ in range(rng.randint(1, 14)))
        elif k == "rtl":
            s = rng.choice(["\u200fمرحبا بالعالم\u200e abc", "\u202bשלום עולם\u202c 123", "سلام دنیا ۱۲۳۴",
                            "العربية: ٠١٢٣٤٥٦٧٨٩ ✓", "עִבְרִית עם ניקוד", "\u2067كلمة\u2069 mixed"]) + rng.choice(spaces)
        elif k == "whitespace":
            s = "".join(rng.choice(spaces) if rng.random() < 0.6 else rng.choice(words) for _ in range(rng.randint(1, 10)))
        elif k == "control":
            s = "".join(rng.choice(controls) if rng.random() < 0.5 else rng.choice(latin + " ") for _ in range(rng.randint(1, 12)))
        elif k == "special":
            s = "".join(rng.choice(SPECIAL_SPELLINGS) if rng.random() < 0.4 else rng.choice(words + spaces)
                        for _ in range(rng.randint(1, 8)))
        elif k == "digits":
            s = "".join(rng.choice(["0123456789"[:rng.randint(1, 10)], "١٢٣", "१२३", "²³", "½", "Ⅻ", "𝟘𝟙𝟚", "১২৩", " ", ",", ".", "-"])
                        for _ in range(rng.randint(1, 10)))
        elif k == "code":
            s = rng.choice(code)
        elif k == "nfd_text":
            s = unicodedata.normalize(rng.choice(["NFD", "NFKD"]), rng.choice(words + ["Größe", "Tiếng Việt có dấu", "Ελληνικά τονισμένα", "ñandú", "ﬁnal ①②"]))
        elif k == "cjk":
            s = "".join(chr(rng.choice([rng.randrange(0x4E00, 0x9FA6), rng.randrange(0x3040, 0x30FF),
                                        rng.randrange(0x20000, 0x2A6D0), rng.randrange(0x31350, 0x313A0),
                                        rng.randrange(0xF900, 0xFA6D), 0x3002, 0xFF0C]))
                        for _ in range(rng.randint(1, 12)))
        else:  # mix
            s = "".join(rng.choice([rng.choice(words), rng.choice(spaces), rng.choice(emoji), chr(rng.choice(mk)),
                                    chr(rng.choice(newc)), rng.choice(controls), rng.choice(SPECIAL_SPELLINGS)])
                        for _ in range(rng.randint(1, 10)))
        out.append(s)
    return out


def make_samples(rng):
    per_lang = 330
    samples = []
    for lang in LANGS:
        strs = catalog_strings(lang)
        if not strs:
            sys.exit(f"no gettext catalogs for {lang} under /usr/share/locale")
        for s in rng.sample(strs, min(per_lang, len(strs))):
            samples.append(cut(s, rng))
    fort = [q.strip("\n") for q in open(CORPUS, encoding="utf-8").read().split("\n%\n") if q.strip()]
    for q in rng.sample(fort, min(600, len(fort))):
        samples.append(cut(q, rng, 100))
    samples += generated(rng, 2200)
    samples += ["", " ", "\n", "a", "\u2581", "  leading", "trailing  ", "\u0000", "a\u0000b", "\U0001FA77\U0001FAE8"]
    return samples


def write_samples(path, samples):
    with open(path, "wb") as f:
        f.write(b"HPTS" + struct.pack("<II", 1, len(samples)))
        for s in samples:
            b = s.encode("utf-8")
            f.write(struct.pack("<I", len(b)) + b)


def read_samples(path):
    data = open(path, "rb").read()
    assert data[:4] == b"HPTS"
    _, n = struct.unpack_from("<II", data, 4)
    off = 12
    out = []
    for _ in range(n):
        (l,) = struct.unpack_from("<I", data, off)
        out.append(data[off + 4:off + 4 + l].decode("utf-8"))
        off += 4 + l
    return out


# ---- training text ----------------------------------------------------------------------

def training_text(rng, with_nul):
    parts = [open(CORPUS, encoding="utf-8").read()]
    for lang in LANGS:
        strs = catalog_strings(lang)
        parts.append("\n".join(rng.sample(strs, min(400, len(strs)))))
    parts.append("\n".join(generated(random.Random(99), 600)))
    if with_nul:
        # A vocabulary whose merges hold U+0000 (HF accepts it; json-c cannot key it).
        parts.append(" ".join(["\u0000\u0000x", "a\u0000b", "\u0000\u0000"] * 60))
    return "\n".join(parts)


# ---- families ---------------------------------------------------------------------------

def sp_bpe(text, vocab_size, specials, normalizer, train_pre):
    """SentencePiece-style BPE (characters, byte_fallback): trained by BpeTrainer, then the
    256 <0xXX> byte tokens are put after the special tokens as in Llama / Mistral / Gemma."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizer
    tok.pre_tokenizer = train_pre
    tr = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=specials, limit_alphabet=400,
                             initial_alphabet=["\u2581"], show_progress=False)
    tok.train_from_iterator([text], tr)
    doc = json.loads(tok.to_str())
    vocab = doc["model"]["vocab"]
    order = sorted(vocab.items(), key=lambda kv: kv[1])
    new = {}
    for k, _ in order[:len(specials)]:
        new[k] = len(new)
    for b in range(256):
        new["<0x%02X>" % b] = len(new)
    for k, _ in order[len(specials):]:
        if k not in new:
            new[k] = len(new)
    doc["model"]["vocab"] = new
    for a in doc["added_tokens"]:
        a["id"] = new[a["content"]]
    return doc


def bl_bpe(text, vocab_size, specials, pre):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre
    tr = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=specials,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([text], tr)
    return json.loads(tok.to_str())


def state(x):
    return json.loads(x.__getstate__())


def template(bos):
    return {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {}}


def add_tokens(doc, tokens):
    """tokens: (content, special, normalized) appended to the vocabulary's id space."""
    vocab = doc["model"]["vocab"]
    nxt = max(max(vocab.values()), max([a["id"] for a in doc["added_tokens"]] + [-1])) + 1
    for content, special, normalized in tokens:
        if content in vocab:
            i = vocab[content]
        else:
            i = nxt
            nxt += 1
        doc["added_tokens"].append({"id": i, "content": content, "single_word": False, "lstrip": False,
                                    "rstrip": False, "normalized": normalized, "special": special})


def finish_template(doc, pp=None):
    pp = pp if pp is not None else doc.get("post_processor")
    if pp and pp.get("type") == "Sequence":
        for p in pp["processors"]:
            finish_template(doc, p)
    if pp and pp.get("type") == "TemplateProcessing":
        ids = {a["content"]: a["id"] for a in doc["added_tokens"]}
        for item in pp["single"]:
            if "SpecialToken" in item:
                name = item["SpecialToken"]["id"]
                pp["special_tokens"][name] = {"id": name, "ids": [ids[name]], "tokens": [name]}


def families(rng):
    text = training_text(random.Random(7), False)
    text_nul = training_text(random.Random(7), True)
    fam = {}

    # Qwen2 / Qwen2.5: NFC, the Qwen2 regex (single digits), ByteLevel; "" prefix / suffix.
    d = bl_bpe(text, 2400, ["<|endoftext|>"], pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)]))
    d["normalizer"] = {"type": "NFC"}
    d["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    d["decoder"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    d["model"]["continuing_subword_prefix"] = ""
    d["model"]["end_of_word_suffix"] = ""
    d["added_tokens"] = [a for a in d["added_tokens"]]
    for a in d["added_tokens"]:
        a["normalized"] = False
    add_tokens(d, [("<|im_start|>", True, False), ("<|im_end|>", True, False), ("<|object_ref_start|>", True, False),
                   ("<|vision_start|>", True, False), ("<|fim_prefix|>", False, False), ("<tool_call>", False, False),
                   ("</tool_call>", False, False)])
    qwen_config = {"add_bos_token": False, "add_prefix_space": False, "bos_token": None, "eos_token": "<|im_end|>",
                   "pad_token": "<|endoftext|>", "errors": "replace", "split_special_tokens": False,
                   "tokenizer_class": "Qwen2Tokenizer",
                   "chat_template": "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                                    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
                                    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"}
    fam["qwen2"] = (d, qwen_config)
    # Qwen3: the same configuration with <think> / </think> as non-special added tokens.
    d3 = json.loads(json.dumps(d))
    add_tokens(d3, [("<think>", False, False), ("</think>", False, False), ("<tool_response>", False, False)])
    fam["qwen3"] = (d3, dict(qwen_config))

    # Llama 3: no normalizer, the Llama 3 regex, ignore_merges, template <|begin_of_text|> $A.
    d = bl_bpe(text, 2400, ["<|begin_of_text|>", "<|end_of_text|>"], pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)]))
    d["model"]["ignore_merges"] = True
    for a in d["added_tokens"]:
        a["normalized"] = False
    add_tokens(d, [("<|start_header_id|>", True, False), ("<|end_header_id|>", True, False), ("<|eot_id|>", True, False),
                   ("<|reserved_special_token_0|>", True, False)])
    d["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        template("<|begin_of_text|>")]}
    d["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    fam["llama3"] = (d, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                         "chat_template": "{{ bos_token }}{% for message in messages %}<|start_header_id|>"
                                          "{{ message['role'] }}<|end_header_id|>\n\n{{ message['content'] | trim }}"
                                          "<|eot_id|>{% endfor %}"})

    # DeepSeek-V3: an empty normalizer Sequence, three Splits, ByteLevel, BOS template.
    bos = "<\uff5cbegin\u2581of\u2581sentence\uff5c>"
    eos = "<\uff5cend\u2581of\u2581sentence\uff5c>"
    d = bl_bpe(text, 2400, [bos, eos, "<\uff5c\u2581pad\u2581\uff5c>"], pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in DEEPSEEK_PATTERNS] +
        [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)]))
    d["normalizer"] = {"type": "Sequence", "normalizers": []}
    for a in d["added_tokens"]:
        a["normalized"] = False
    add_tokens(d, [("<\uff5cUser\uff5c>", False, False), ("<\uff5cAssistant\uff5c>", False, False),
                   ("<think>", False, False), ("</think>", False, False), ("<\uff5ctool\u2581calls\u2581begin\uff5c>", False, False)])
    d["post_processor"] = template(bos)
    d["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    fam["deepseek_v3"] = (d, {"add_bos_token": True, "add_eos_token": False, "bos_token": {"__type": "AddedToken", "content": bos,
                              "lstrip": False, "normalized": True, "rstrip": False, "single_word": False},
                              "eos_token": {"__type": "AddedToken", "content": eos, "lstrip": False, "normalized": True,
                                            "rstrip": False, "single_word": False},
                              "pad_token": {"__type": "AddedToken", "content": eos, "lstrip": False, "normalized": True,
                                            "rstrip": False, "single_word": False},
                              "chat_template": "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}"
                                               "<\uff5cUser\uff5c>{{ m['content'] }}{% else %}<\uff5cAssistant\uff5c>"
                                               "{{ m['content'] }}<\uff5cend\u2581of\u2581sentence\uff5c>{% endif %}{% endfor %}"})

    # Llama 2 (and Mistral v0.1): Prepend + Replace normalizer, no pre-tokenizer, byte_fallback,
    # the decoder chain Replace / ByteFallback / Fuse / Strip, template <s> $A. Its training
    # text holds U+0000, so its merges do.
    sp_norm = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    meta_train = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="never", split=True)
    d = sp_bpe(text_nul, 2400, ["<unk>", "<s>", "</s>"], sp_norm, meta_train)
    d["pre_tokenizer"] = None
    d["normalizer"] = state(sp_norm)
    d["decoder"] = state(decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                            decoders.Strip(" ", 1, 0)]))
    d["post_processor"] = template("<s>")
    for a in d["added_tokens"]:
        a["normalized"] = False
    fam["llama2"] = (d, {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
                         "pad_token": None, "unk_token": "<unk>", "legacy": True,
                         "chat_template": "{% for m in messages %}{% if m['role'] == 'user' %}{{ bos_token + '[INST] ' + "
                                          "m['content'] + ' [/INST]' }}{% else %}{{ ' ' + m['content'] + ' ' + eos_token }}"
                                          "{% endif %}{% endfor %}"})

    # Mistral v0.3: no normalizer, Metaspace(prepend_scheme first, split false), control tokens.
    d = sp_bpe(text, 2400, ["<unk>", "<s>", "</s>"], None, meta_train)
    d["normalizer"] = None
    d["pre_tokenizer"] = state(pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False))
    d["decoder"] = state(decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                            decoders.Strip(" ", 1, 0)]))
    d["post_processor"] = template("<s>")
    for a in d["added_tokens"]:
        a["normalized"] = False
    add_tokens(d, [("[INST]", True, False), ("[/INST]", True, False), ("[TOOL_CALLS]", True, False),
                   ("[control_8]", True, False)])
    fam["mistral"] = (d, {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
                          "unk_token": "<unk>", "legacy": False,
                          "chat_template": "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}"
                                           "[INST] {{ m['content'] }}[/INST]{% else %}{{ m['content'] }}{{ eos_token }}"
                                           "{% endif %}{% endfor %}"})

    # Gemma: Replace normalizer only, no pre-tokenizer, decoder without Strip, <bos> template,
    # non-special added tokens (whitespace runs, an HTML tag).
    d = sp_bpe(text, 2400, ["<pad>", "<eos>", "<bos>", "<unk>"], normalizers.Replace(" ", "\u2581"), meta_train)
    d["normalizer"] = state(normalizers.Replace(" ", "\u2581"))
    d["pre_tokenizer"] = None
    d["decoder"] = state(decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]))
    d["post_processor"] = template("<bos>")
    for a in d["added_tokens"]:
        a["normalized"] = False
    add_tokens(d, [("<mask>", True, False), ("<start_of_turn>", True, False), ("<end_of_turn>", True, False),
                   ("\n\n\n", False, False), ("\t\t", False, False), ("<table>", False, False),
                   ("\u2581\u2581\u2581\u2581", False, False)])
    fam["gemma"] = (d, {"add_bos_token": True, "add_eos_token": False, "bos_token": "<bos>", "eos_token": "<eos>",
                        "pad_token": "<pad>", "unk_token": "<unk>",
                        "chat_template": "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
                                         "{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"})
    for name, (doc, _) in fam.items():
        finish_template(doc)
    return fam


# ---- ids files --------------------------------------------------------------------------

def varint(x):
    out = bytearray()
    while True:
        b = x & 0x7F
        x >>= 7
        if x:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def write_ids(path, tok, samples):
    empty = tok.encode("", add_special_tokens=True).ids
    # The template around $A: split encode("") at the first id that is also around a text.
    probe = tok.encode("x", add_special_tokens=False).ids
    probe_sp = tok.encode("x", add_special_tokens=True).ids
    k = next(i for i in range(len(probe_sp) - len(probe) + 1) if probe_sp[i:i + len(probe)] == probe)
    prefix, suffix = probe_sp[:k], probe_sp[k + len(probe):]
    assert prefix + suffix == empty, (path, empty, prefix, suffix)
    out = bytearray(b"HPTI" + struct.pack("<II", 1, len(samples)))
    out += varint(len(prefix)) + b"".join(varint(i) for i in prefix)
    out += varint(len(suffix)) + b"".join(varint(i) for i in suffix)
    n_dec = n_sp = n_ids = 0
    for s in samples:
        ids = tok.encode(s, add_special_tokens=False).ids
        n_ids += len(ids)
        out += varint(len(ids)) + b"".join(varint(i) for i in ids)
        dec = tok.decode(ids, skip_special_tokens=False)
        sp = tok.encode(s, add_special_tokens=True).ids
        flags = (1 if dec != s else 0) | (2 if sp != prefix + ids + suffix else 0)
        out.append(flags)
        if flags & 1:
            b = dec.encode("utf-8")
            out += varint(len(b)) + b
            n_dec += 1
        if flags & 2:
            out += varint(len(sp)) + b"".join(varint(i) for i in sp)
            n_sp += 1
    with open(path, "wb") as f:
        f.write(out)
    return n_ids, n_dec, n_sp, len(out)


def documents(samples):
    """Long texts: four runs of 300 samples joined by blank lines (Llama 2 / Gemma BPE the
    whole text as one word: this is where merging piece by piece must equal HF)."""
    return ["\n\n".join(samples[i:i + DOC_SAMPLES]) for i in range(0, 4 * DOC_SAMPLES, DOC_SAMPLES)]


def added(i, content, special=False, normalized=False, lstrip=False, rstrip=False, single_word=False):
    return {"id": i, "content": content, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": normalized, "special": special}


def variants(fam):
    """Pipeline variants over two vocabularies; the C test puts each patch into the base
    tokenizer.json."""
    meta = lambda scheme, split: state(pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=scheme, split=split))
    spdec = state(decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)]))
    v = [
        ("mistral_always_split", "mistral", {"pre_tokenizer": meta("always", True)}),
        ("mistral_first_split", "mistral", {"pre_tokenizer": meta("first", True)}),
        ("mistral_never", "mistral", {"pre_tokenizer": meta("never", False)}),
        ("mistral_meta_decoder", "mistral", {"pre_tokenizer": meta("always", True),
                                             "decoder": state(decoders.Sequence([decoders.Metaspace(replacement="\u2581", prepend_scheme="always", split=True),
                                                                                 decoders.ByteFallback(), decoders.Fuse()]))}),
        ("mistral_nfkc_strip", "mistral", {"normalizer": state(normalizers.Sequence([normalizers.NFKC(), normalizers.Strip()])),
                                           "pre_tokenizer": meta("first", False)}),
        ("mistral_nfd_regex_replace", "mistral", {"normalizer": state(normalizers.Sequence([
            normalizers.NFD(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Prepend("\u2581"),
            normalizers.Replace(" ", "\u2581")])), "pre_tokenizer": None, "decoder": spdec}),
        ("mistral_digits", "mistral", {"pre_tokenizer": state(pre_tokenizers.Sequence([
            pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True),
            pre_tokenizers.Digits(individual_digits=True)]))}),
        ("mistral_nfkd_strip_left", "mistral", {"normalizer": state(normalizers.Sequence([normalizers.NFKD(), normalizers.Strip(right=False)])),
                                                "pre_tokenizer": meta("always", True)}),
        ("qwen2_nfkc", "qwen2", {"normalizer": {"type": "NFKC"}}),
        ("qwen2_nfd", "qwen2", {"normalizer": {"type": "NFD"}}),
        ("qwen2_digits_nfkd", "qwen2", {"normalizer": {"type": "NFKD"}, "pre_tokenizer": state(pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=False), pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)]))}),
        # Added tokens matched in normalized text (their content normalized too), lstrip /
        # rstrip / single_word, under a normalizer that rewrites spaces and one that composes.
        ("mistral_added_normalized", "mistral", {
            "normalizer": state(normalizers.Sequence([normalizers.NFD(), normalizers.Prepend("\u2581"),
                                                      normalizers.Replace(" ", "\u2581")])),
            "pre_tokenizer": None, "decoder": spdec,
            "added_tokens": fam["mistral"][0]["added_tokens"] + [
                added(5000, "the ", normalized=True), added(5001, "%s", lstrip=True, rstrip=True),
                added(5002, "\u7684", single_word=True, normalized=True), added(5003, "\u00e9", normalized=True),
                added(5004, "file", single_word=True, normalized=False)]}),
        ("qwen2_added_normalized", "qwen2", {
            "normalizer": {"type": "NFKC"},
            "added_tokens": fam["qwen2"][0]["added_tokens"] + [
                added(5000, "\ufb01le", normalized=True), added(5001, " the", lstrip=True, normalized=True),
                added(5002, "\uff05s", normalized=True), added(5003, "der", single_word=True, normalized=True)]}),
        ("qwen2_metaspace_replace_dec", "qwen2", {"normalizer": state(normalizers.Replace(Regex("[\u3000\u00a0]"), " ")),
                                                 "decoder": state(decoders.Sequence([decoders.ByteLevel(), decoders.Replace(Regex("o+"), "0")]))}),
    ]
    return v


def random_text(rng, pools):
    parts = []
    for _ in range(rng.randint(0, 24)):
        kind = rng.random()
        if kind < 0.35:
            parts.append(chr(rng.choice(pools["any"])))
        elif kind < 0.5:
            parts.append(chr(rng.choice(pools["marks"])))
        elif kind < 0.6:
            parts.append(rng.choice([" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2581", "\u0000"]))
        elif kind < 0.7:
            parts.append(rng.choice(SPECIAL_SPELLINGS))
        elif kind < 0.8:
            parts.append(unicodedata.normalize("NFD", rng.choice(["\u00e9", "\u1ec7", "\uac00", "\u1e69", "\u01d5"])))
        else:
            parts.append("".join(rng.choice("abcXYZ019'.,!?-_") for _ in range(rng.randint(1, 6))))
    return "".join(parts)


def diff_against_library(lib_path, n, seed):
    """Random texts (any assigned code point, marks of every Unicode version, spaces,
    special-token spellings, decomposed letters) through our library (ctypes) and HF."""
    import ctypes
    import unicodedata2

    class Ids(ctypes.Structure):
        _fields_ = [("ids", ctypes.POINTER(ctypes.c_int32)), ("len", ctypes.c_size_t), ("cap", ctypes.c_size_t)]

    lib = ctypes.CDLL(lib_path)
    lib.hp_last_error.restype = ctypes.c_char_p
    pools = {"any": [cp for cp in range(0x110000) if not (0xD800 <= cp < 0xE000) and
                     unicodedata2.category(chr(cp)) != "Cn" and (cp < 0x20000 or cp % 7 == 0)],
             "marks": marks()}
    bad_total = 0
    for k, name in enumerate(["qwen2", "qwen3", "llama2", "mistral", "gemma", "llama3", "deepseek_v3"]):
        d = os.path.join(OUT, name)
        hf = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        tok = ctypes.c_void_p()
        if lib.hp_tokenizer_load_dir(ctypes.byref(tok), d.encode()) != 0:
            sys.exit(f"{name}: {lib.hp_last_error().decode()}")
        rng = random.Random(seed + k)
        bad = 0
        for _ in range(n):
            text = random_text(rng, pools)
            b = text.encode("utf-8")
            ids = Ids()
            if lib.hp_tokenizer_encode(tok, b, ctypes.c_size_t(len(b)), 0, ctypes.byref(ids)) != 0:
                sys.exit(f"{name}: {lib.hp_last_error().decode()}")
            ours = [ids.ids[i] for i in range(ids.len)]
            lib.hp_token_ids_free(ctypes.byref(ids))
            ref = hf.encode(text, add_special_tokens=False).ids
            out = ctypes.c_char_p()
            olen = ctypes.c_size_t()
            arr = (ctypes.c_int32 * max(1, len(ref)))(*ref)
            lib.hp_tokenizer_decode(tok, arr, ctypes.c_size_t(len(ref)), 0, ctypes.byref(out), ctypes.byref(olen))
            dec = ctypes.string_at(out, olen.value).decode("utf-8")
            if ours != ref or dec != hf.decode(ref, skip_special_tokens=False):
                bad += 1
                if bad <= 3:
                    print(f"  {name}: MISMATCH for {text!r}\n    ours {ours[:30]}\n    HF   {ref[:30]}")
        lib.hp_tokenizer_free(tok)
        print(f"diff {name}: {bad} mismatches in {n} random texts")
        bad_total += bad
    if bad_total:
        sys.exit("our library disagrees with HF")


def diff_normalizers(lib_path, seed):
    """Every code point, alone and between a letter and U+0301 / U+0334, and random mark
    sequences, through NFC / NFD / NFKC / NFKD: a character BPE whose vocabulary is the 256
    <0xXX> byte tokens gives the normalized bytes as ids."""
    import ctypes

    class Ids(ctypes.Structure):
        _fields_ = [("ids", ctypes.POINTER(ctypes.c_int32)), ("len", ctypes.c_size_t), ("cap", ctypes.c_size_t)]

    lib = ctypes.CDLL(lib_path)
    lib.hp_last_error.restype = ctypes.c_char_p
    mk = marks()
    rng = random.Random(seed)
    texts = []
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        c = chr(cp)
        texts.append(c + "a" + c + "\u0301" + c + "\u0334" + c)
    for _ in range(100000):
        texts.append("".join(rng.choice("aeoAE\u1100\u1161\uac00") + "".join(chr(rng.choice(mk)) for _ in range(rng.randint(0, 4)))
                             for _ in range(rng.randint(1, 4))))
    vocab = {"<0x%02X>" % b: b for b in range(256)}
    vocab["<unk>"] = 256
    for form in ["NFC", "NFD", "NFKC", "NFKD"]:
        doc = {"version": "1.0", "added_tokens": [], "normalizer": {"type": form}, "pre_tokenizer": None,
               "post_processor": None, "decoder": None,
               "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": True, "fuse_unk": False,
                         "vocab": vocab, "merges": []}}
        js = json.dumps(doc).encode()
        hf = Tokenizer.from_str(js.decode())
        tok = ctypes.c_void_p()
        if lib.hp_tokenizer_load_json(ctypes.byref(tok), js, ctypes.c_size_t(len(js)), b"nf.json") != 0:
            sys.exit(lib.hp_last_error().decode())
        bad = 0
        # one encode of all texts joined by NUL (a starter that never combines) is the same as
        # encoding them one by one, and fast
        for i in range(0, len(texts), 5000):
            text = "\u0000".join(texts[i:i + 5000])
            b = text.encode("utf-8")
            ids = Ids()
            if lib.hp_tokenizer_encode(tok, b, ctypes.c_size_t(len(b)), 0, ctypes.byref(ids)) != 0:
                sys.exit(lib.hp_last_error().decode())
            ours = bytes(ids.ids[k] for k in range(ids.len))
            lib.hp_token_ids_free(ctypes.byref(ids))
            ref = bytes(hf.encode(text, add_special_tokens=False).ids)
            if ours != ref:
                for t in texts[i:i + 5000]:
                    tb = t.encode()
                    ids = Ids()
                    lib.hp_tokenizer_encode(tok, tb, ctypes.c_size_t(len(tb)), 0, ctypes.byref(ids))
                    o = bytes(ids.ids[k] for k in range(ids.len))
                    lib.hp_token_ids_free(ctypes.byref(ids))
                    r = bytes(hf.encode(t, add_special_tokens=False).ids)
                    if o != r:
                        bad += 1
                        if bad <= 3:
                            print(f"  {form}: {t!r}: ours {o.decode(errors='replace')!r} HF {r.decode(errors='replace')!r}")
        lib.hp_tokenizer_free(tok)
        print(f"diff {form}: {bad} of {len(texts)} texts differ")
        if bad:
            sys.exit("our normalizer disagrees with HF")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--resample", action="store_true", help="build samples.bin anew from this machine's catalogs")
    ap.add_argument("--diff-lib", default=None,
                    help="only compare random texts against this libhyperparallel.so (nothing is written)")
    ap.add_argument("--diff-n", type=int, default=3000)
    ap.add_argument("--diff-seed", type=int, default=1)
    args = ap.parse_args()
    if args.diff_lib:
        diff_normalizers(args.diff_lib, args.diff_seed)
        diff_against_library(args.diff_lib, args.diff_n, args.diff_seed)
        return
    if tokenizers.__version__ != TOKENIZERS_VERSION:
        sys.exit(f"tokenizers {tokenizers.__version__}: the goldens are for {TOKENIZERS_VERSION} "
                 f"(pip install tokenizers=={TOKENIZERS_VERSION})")
    os.makedirs(os.path.join(OUT, "variants"), exist_ok=True)
    rng = random.Random(2026)
    spath = os.path.join(OUT, "samples.bin")
    if args.resample or not os.path.exists(spath):
        samples = make_samples(rng)
        write_samples(spath, samples)
    samples = read_samples(spath)
    print(f"samples.bin: {len(samples)} strings, {sum(len(s.encode()) for s in samples)} bytes")
    assert len(samples) >= 10000
    fam = families(rng)
    toks = {}
    for name, (doc, config) in fam.items():
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
        tok = Tokenizer.from_str(text)  # HF must load what we commit
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(text)
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, ensure_ascii=False, indent=1)
        toks[name] = (tok, doc)
        n_ids, n_dec, n_sp, size = write_ids(os.path.join(OUT, f"{name}.ids"), tok, samples)
        dn, _, _, dsize = write_ids(os.path.join(OUT, f"{name}.docs.ids"), tok, documents(samples))
        print(f"{name}: {len(documents(samples))} documents, {dn} ids, {dsize} bytes")
        print(f"{name}: vocab {len(doc['model']['vocab'])}, {n_ids} ids, {n_dec} decodes differ from the text, "
              f"{n_sp} special-id lists differ from the template, {size} bytes")
    nul_merges = sum(1 for m in toks["llama2"][1]["model"]["merges"] if "\u0000" in "".join(m))
    print(f"llama2: {nul_merges} merges with U+0000")
    assert nul_merges > 0
    vs = []
    for name, base, patch in variants(fam):
        doc = dict(toks[base][1])
        doc.update(patch)
        tok = Tokenizer.from_str(json.dumps(doc, ensure_ascii=False))
        n_ids, n_dec, n_sp, size = write_ids(os.path.join(OUT, "variants", f"{name}.ids"), tok, samples[:400])
        vs.append({"name": name, "base": base, "patch": patch})
        print(f"variant {name}: {n_ids} ids, {size} bytes")
    with open(os.path.join(OUT, "variants.json"), "w", encoding="utf-8") as f:
        f.write('{"generator": "tokenizers ' + tokenizers.__version__ + '", "variants": [\n  ')
        f.write(",\n  ".join(json.dumps(v, ensure_ascii=False) for v in vs))
        f.write("\n]}\n")


if __name__ == "__main__":
    main()
