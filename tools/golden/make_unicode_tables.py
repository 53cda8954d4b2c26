#!/usr/bin/env python3
"""Unicode tables of the tokenizer: writes src/train/tokenizer_unicode_data.c.

The HF `tokenizers` library (0.23.3, measured) sees text through two Unicode versions:
  - its regexes (Oniguruma) know Unicode 16.0: \\p{L} holds the Garay letters of 16.0 and
    not the Sidetic letters of 17.0;
  - its normalizers (the `unicode-normalization-alignments` crate) have Unicode 9.0 tables:
    a combining mark added in 10.0 or later has combining class 0 for it, and characters
    added after 9.0 neither decompose nor compose.
Debian 12's PCRE2 10.42 has Unicode 14.0 tables and its utf8proc 2.8 Unicode 15.0 ones, so
the tokenizer corrects both with the tables written here:

  hp_tok_gc16[]        general category of every code point in Unicode 16.0 (ranges)
  hp_tok_gc_unstable[] code points whose category differs between 14.0 / 15.0 and 16.0:
                       the only places where a PCRE2 built with 14.0-16.0 tables can
                       disagree with 16.0 (tokenizer_common.c asks PCRE2 about each of
                       them once and adds or removes them from every \\p{..} it rewrites)
  hp_tok_nf_stage1/2   per code point: NFC / NFD / NFKC / NFKD "already normalized and a
                       starter that nothing composes onto" (the fast path skips text made
                       only of those), and "unknown to Unicode 9.0" (a barrier: HF leaves it
                       alone and nothing combines across it)

Sources (no downloads): Unicode 16.0 from pip's `unicodedata2==16.0.0`; Unicode 15.0 from
Debian's `unicode-data` (/usr/share/unicode: UnicodeData.txt, DerivedAge.txt); the Python
standard library's `unicodedata` (14.0.0 in Python 3.11). Run:
  pip install unicodedata2==16.0.0
  python3 tools/golden/make_unicode_tables.py
The output is deterministic; rerunning it reproduces the committed file.
"""
import os
import sys
import unicodedata as ud_std

try:
    import unicodedata2 as ud16
except ImportError:
    sys.exit("needs `pip install unicodedata2==16.0.0`")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(ROOT, "src", "train", "tokenizer_unicode_data.c")
UCD = "/usr/share/unicode"

# PCRE2's order of the general categories (pcre2_ucp.h ucp_Cc ... ucp_Zs); the C side uses
# the same indices (tokenizer-impl.h HP_TOK_GC_*).
GC = ["Cc", "Cf", "Cn", "Co", "Cs", "Ll", "Lm", "Lo", "Lt", "Lu", "Mc", "Me", "Mn", "Nd",
      "Nl", "No", "Pc", "Pd", "Pe", "Pf", "Pi", "Po", "Ps", "Sc", "Sk", "Sm", "So", "Zl", "Zp", "Zs"]
GCI = {g: i for i, g in enumerate(GC)}
MAXCP = 0x110000
HF_NORMALIZER_UNICODE = (9, 0)


def cat16(cp):
    return ud16.category(chr(cp))


def read_unicodedata_txt(path):
    cat = {}
    first = None
    for line in open(path, encoding="utf-8"):
        f = line.split(";")
        cp = int(f[0], 16)
        if f[1].endswith("First>"):
            first = cp
            continue
        if f[1].endswith("Last>"):
            for c in range(first, cp + 1):
                cat[c] = f[2]
            continue
        cat[cp] = f[2]
    return cat


def read_age(path):
    age = {}
    for line in open(path, encoding="utf-8"):
        line = line.split("#")[0].strip()
        if not line:
            continue
        r, v = [x.strip() for x in line.split(";")]
        a, _, b = r.partition("..")
        a = int(a, 16)
        b = int(b, 16) if b else a
        ver = tuple(int(x) for x in v.split("."))
        for c in range(a, b + 1):
            age[c] = ver
    return age


def ranges(cps):
    out = []
    for cp in cps:
        if out and out[-1][1] == cp - 1:
            out[-1][1] = cp
        else:
            out.append([cp, cp])
    return out


def main():
    if ud16.unidata_version != "16.0.0":
        sys.exit(f"unicodedata2 has Unicode {ud16.unidata_version}; install unicodedata2==16.0.0 "
                 "(the version of the `tokenizers` library's Oniguruma)")
    for f in ("UnicodeData.txt", "DerivedAge.txt"):
        if not os.path.exists(os.path.join(UCD, f)):
            sys.exit(f"{UCD}/{f} missing: apt-get install unicode-data")
    u15 = read_unicodedata_txt(os.path.join(UCD, "UnicodeData.txt"))
    age = read_age(os.path.join(UCD, "DerivedAge.txt"))

    # ---- general categories ---------------------------------------------------------
    cats = [cat16(cp) for cp in range(MAXCP)]
    gc_runs = []
    for cp, c in enumerate(cats):
        if not gc_runs or gc_runs[-1][1] != c:
            gc_runs.append((cp, c))
    older = [("stdlib unicodedata " + ud_std.unidata_version, lambda cp: ud_std.category(chr(cp))),
             ("Debian unicode-data UnicodeData.txt", lambda cp: u15.get(cp, "Cn"))]
    unstable = set()
    notes = []
    for name, f in older:
        diff = [cp for cp in range(MAXCP) if f(cp) != cats[cp]]
        moved = sum(1 for cp in diff if f(cp) != "Cn")
        notes.append(f"{name}: {len(diff)} code points differ from 16.0 ({moved} changed category, "
                     f"the rest were unassigned)")
        unstable.update(diff)
    unstable_r = ranges(sorted(unstable))

    # ---- normalization flags ------------------------------------------------------------
    # A code point HF's Unicode 9.0 normalizer does not know is left as it is and stops
    # reordering and composition (a starter that composes with nothing).
    composes_with_prev = set(range(0x1161, 0x1176)) | set(range(0x11A8, 0x11C3))  # Hangul V, T
    for cp in range(MAXCP):
        d = ud16.decomposition(chr(cp))
        if d and not d.startswith("<"):
            parts = [int(x, 16) for x in d.split()]
            if len(parts) == 2 and ud16.normalize("NFC", chr(parts[0]) + chr(parts[1])) == chr(cp):
                composes_with_prev.add(parts[1])
    F_NFC, F_NFD, F_NFKC, F_NFKD, F_BARRIER = 1, 2, 4, 8, 16
    flags = bytearray(MAXCP)
    for cp in range(MAXCP):
        if 0xD800 <= cp < 0xE000:
            continue  # never in valid UTF-8
        if age.get(cp, (99, 0)) > HF_NORMALIZER_UNICODE:
            flags[cp] = F_BARRIER
            continue
        ch = chr(cp)
        if ud16.combining(ch) != 0:
            continue
        fl = 0
        if ud16.normalize("NFC", ch) == ch and cp not in composes_with_prev:
            fl |= F_NFC
        if ud16.normalize("NFD", ch) == ch:
            fl |= F_NFD
        if ud16.normalize("NFKC", ch) == ch and cp not in composes_with_prev:
            fl |= F_NFKC
        if ud16.normalize("NFKD", ch) == ch:
            fl |= F_NFKD
        flags[cp] = fl
    blocks = {}
    stage1 = []
    stage2 = []
    for b in range(MAXCP >> 8):
        blk = bytes(flags[b << 8:(b + 1) << 8])
        if blk not in blocks:
            blocks[blk] = len(stage2)
            stage2.append(blk)
        stage1.append(blocks[blk])
    assert len(stage2) < 256

    # ---- write ------------------------------------------------------------------------
    o = []
    o.append("/* Unicode tables of the tokenizer. GENERATED by tools/golden/make_unicode_tables.py")
    o.append(" * (do not edit): Unicode 16.0 general categories (unicodedata2 16.0.0), the code points")
    o.append(" * whose category differs in older versions, and normalization flags for HF's Unicode 9.0")
    o.append(" * normalizer. Why and how they are used: docs/tokenizer.md, \"Unicode versions\". */")
    o.append('#include "train/tokenizer-impl.h"')
    o.append("")
    for n in notes:
        o.append(f"/* {n} */")
    o.append("")
    o.append("/* (start << 5 | category): the category holds from start to the next entry's start. */")
    o.append(f"const uint32_t hp_tok_gc16[{len(gc_runs)}] = {{")
    row = []
    for start, c in gc_runs:
        row.append(f"0x{(start << 5) | GCI[c]:x}")
        if len(row) == 8:
            o.append("    " + ", ".join(row) + ",")
            row = []
    if row:
        o.append("    " + ", ".join(row) + ",")
    o.append("};")
    o.append(f"const size_t hp_tok_gc16_len = {len(gc_runs)};")
    o.append("")
    o.append("/* Inclusive ranges of code points whose category in Unicode 14.0 or 15.0 differs from 16.0. */")
    o.append(f"const uint32_t hp_tok_gc_unstable[{len(unstable_r)}][2] = {{")
    row = []
    for a, b in unstable_r:
        row.append(f"{{0x{a:x}, 0x{b:x}}}")
        if len(row) == 6:
            o.append("    " + ", ".join(row) + ",")
            row = []
    if row:
        o.append("    " + ", ".join(row) + ",")
    o.append("};")
    o.append(f"const size_t hp_tok_gc_unstable_len = {len(unstable_r)};")
    o.append("")
    o.append("/* Normalization flags of cp: hp_tok_nf_stage2[hp_tok_nf_stage1[cp >> 8]][cp & 255], bits")
    o.append(" * HP_TOK_NF_SAFE_NFC .. _NFKD (normalized, combining class 0, nothing composes onto it)")
    o.append(" * and HP_TOK_NF_BARRIER (not in Unicode 9.0). */")
    o.append(f"const uint8_t hp_tok_nf_stage1[{len(stage1)}] = {{")
    for i in range(0, len(stage1), 24):
        o.append("    " + ", ".join(str(x) for x in stage1[i:i + 24]) + ",")
    o.append("};")
    o.append(f"const uint8_t hp_tok_nf_stage2[{len(stage2)}][256] = {{")
    for blk in stage2:
        o.append("    {")
        for i in range(0, 256, 32):
            o.append("        " + ", ".join(str(x) for x in blk[i:i + 32]) + ",")
        o.append("    },")
    o.append("};")
    text = "\n".join(o) + "\n"
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"{OUT}: {len(gc_runs)} category runs, {len(unstable_r)} unstable ranges "
          f"({len(unstable)} code points), {len(stage2)} normalization blocks")
    for n in notes:
        print("  " + n)


if __name__ == "__main__":
    main()
