#!/usr/bin/env python3
"""How many files a feature reaches into (issue #42's measure of the filter shape): the files of
crates/proxy/src and crates/duet/src whose code, with comments, string literals and #[cfg(test)]
modules left out, names WORD (case-insensitive).

    python3 benches/feature_files.py hedg        (prints the files, then their count)
"""
import os, re, sys
word = sys.argv[1].lower()
root = sys.argv[2] if len(sys.argv) > 2 else "."
def strip(text):
    # drop #[cfg(test)] mod ... { ... } blocks (brace matched)
    out, i = [], 0
    while True:
        m = re.search(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", text[i:])
        if not m:
            out.append(text[i:]); break
        start = i + m.start(); out.append(text[i:start])
        depth, j = 0, i + m.end() - 1
        while j < len(text):
            if text[j] == "{": depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0: break
            j += 1
        i = j + 1
    text = "".join(out)
    # One pass left to right, so that a `//` inside a string, a quote inside a comment or the `r"`
    # that ends a literal such as "other" is read as what it is.
    token = re.compile(
        r'(?<![A-Za-z0-9_])b?r(#*)".*?"\1'   # raw string
        r'|b?"(?:\\.|[^"\\])*"'            # string
        r"|b?'(?:\\.|[^'\\\n])'"          # char (a lifetime has no closing quote)
        r"|//[^\n]*"                         # line comment
        r"|/\*.*?\*/",                       # block comment
        re.S,
    )
    return token.sub(lambda m: '""' if m.group(0).endswith(('"', '#')) else " ", text)
hits = []
for base in ("crates/proxy/src", "crates/duet/src"):
    for dp, _, fs in os.walk(os.path.join(root, base)):
        for f in fs:
            if not f.endswith(".rs") or f in ("tests.rs",) or f.endswith("_tests.rs"): continue
            p = os.path.join(dp, f)
            if "/tests/" in p: continue
            if word in strip(open(p).read()).lower():
                hits.append(os.path.relpath(p, root))
for h in sorted(hits): print(h)
print(len(hits), "files")
