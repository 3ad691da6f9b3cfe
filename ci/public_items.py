#!/usr/bin/env python3
"""Counts wgvae's documented public API from rustdoc's HTML (issue 30: "public items before → after").

Run `cargo doc --no-deps -p wgvae --lib` first, then `python3 ci/public_items.py [--list]`.
Items: every entry of target/doc/wgvae/all.html (structs, enums, traits, functions, type aliases,
constants, macros, statics, unions: one page each, wherever re-exported) plus the public modules
reachable from the crate root. Members, on those items' pages: pub struct/union fields, enum
variants, inherent methods and associated constants/types (not trait impls, which the trait's own
items already count), and each trait's required and provided methods. `#[doc(hidden)]` items are
not in rustdoc's output and so not counted.
"""
import os
import re
import sys

DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "doc", "wgvae")


def read(rel):
    with open(os.path.join(DOC, rel), encoding="utf-8") as f:
        return f.read()


def modules(rel="index.html", prefix="wgvae"):
    """Public modules reachable from `rel`, as paths."""
    html = read(rel)
    sec = re.search(r'<h2 id="modules".*?</dl>', html, re.S)
    out = []
    if not sec:
        return out
    base = os.path.dirname(rel)
    for href in re.findall(r'href="([a-z_0-9]+)/index\.html"', sec.group(0)):
        path = f"{prefix}::{href}"
        out.append(path)
        out += modules(os.path.join(base, href, "index.html"), path)
    return out


def section(html, start, ends):
    i = html.find(start)
    if i < 0:
        return ""
    j = min([k for k in (html.find(e, i + len(start)) for e in ends) if k >= 0] or [len(html)])
    return html[i:j]


def members(rel):
    html = read(rel)
    kind = os.path.basename(rel).split(".")[0]
    n = {"field": 0, "variant": 0, "method": 0}
    n["field"] = len(re.findall(r'id="structfield\.', html))
    n["variant"] = len(re.findall(r'id="variant\.[A-Za-z0-9_]+"', html))
    if kind == "trait":
        body = section(html, '<section id="main-content"', ['id="implementors"', 'id="foreign-impls"',
                                                             'id="dyn-compatibility"'])
        n["method"] = len(re.findall(r'id="(?:ty)?method\.|id="associated(?:constant|type)\.', body))
    else:
        body = section(html, 'id="implementations-list"', ['id="trait-implementations"',
                                                            'id="synthetic-implementations"',
                                                            'id="blanket-implementations"'])
        n["method"] = len(re.findall(r'id="method\.|id="associated(?:constant|type)\.', body))
    return n


def main():
    allh = read("all.html")
    kinds = {}
    pages = []
    for sec in re.finditer(r'<h3 id="([a-z-]+)">.*?</ul>', allh, re.S):
        hrefs = re.findall(r'href="([^"]+\.html)"', sec.group(0))
        kinds[sec.group(1)] = len(hrefs)
        pages += hrefs
    mods = modules()
    tot = {"field": 0, "variant": 0, "method": 0}
    rows = []
    for p in pages:
        m = members(p)
        for k in tot:
            tot[k] += m[k]
        rows.append((p, m))
    items = sum(kinds.values()) + len(mods)
    total = items + sum(tot.values())
    if "--list" in sys.argv:
        for m in mods:
            print("module", m)
        for p, m in rows:
            print(p, m["field"], m["variant"], m["method"])
    print("modules %d, %s" % (len(mods), ", ".join(f"{k} {v}" for k, v in kinds.items())))
    print(f"items {items}; fields {tot['field']}, variants {tot['variant']}, methods {tot['method']}")
    print(f"public total {total}")


main()
