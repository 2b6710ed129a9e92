#!/usr/bin/env python3
"""check-layers.py [ROOT]: fails (exit 1, one line per breach) when a source
file includes what its layer may not. ROOT is the repository (default: the
one this script is in). `make check` runs it before building.

The layers of gpurentd are the folders of src/gpurentd (see gpurentd.h), from
the bottom: store, then audit and domain, then loops, then http, then cmd.
A file may include its own layer's headers and those of the layers below,
never one above. Under all of them is the common library (include/gpurent,
src/common), which includes nothing of either program; the agent (src/agent)
includes nothing of the daemon.

Some libraries belong to one module each: SQLite to the store (and its
private header store/store_sql.h with it), libcurl to the agent client, the
agent, gpurent-gateway (src/gateway) and the common library, OpenSSL to the
common library."""
import os
import re
import sys

# What each daemon layer may include, its own folder among them.
MAY_INCLUDE = {
    "store": {"store"},
    "audit": {"audit", "store"},
    "domain": {"domain", "store"},
    "loops": {"loops", "domain", "store"},
    "http": {"http", "loops", "domain", "store"},
    "cmd": {"cmd", "http", "loops", "domain", "audit", "store"},
}
LAYERS = set(MAY_INCLUDE)
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def owner_rules(rel):
    """(pattern, who may include it) for the libraries with one owner each."""
    in_store = rel.startswith("src/gpurentd/store/")
    curl_ok = (rel.startswith(("src/agent/", "src/common/", "src/gateway/"))
               or rel in ("src/gpurentd/loops/agent_client.c", "src/gpurentd/loops/agent_client.h"))
    return [
        (lambda h: h == "sqlite3.h", in_store, "SQLite is the store's alone (src/gpurentd/store)"),
        (lambda h: h == "store/store_sql.h", in_store, "store_sql.h is private to src/gpurentd/store"),
        (lambda h: h.startswith("curl/"), curl_ok, "libcurl belongs to the agent client, the agent and src/common"),
        (lambda h: h.startswith("openssl/"), rel.startswith("src/common/"), "OpenSSL belongs to src/common"),
    ]


def breaches_of(rel, text):
    out = []
    parts = rel.split("/")
    layer = parts[2] if rel.startswith("src/gpurentd/") and len(parts) > 3 and parts[2] in LAYERS else None
    for lineno, line in enumerate(text.splitlines(), 1):
        m = INCLUDE.match(line)
        if not m:
            continue
        header = m.group(2)
        where = f"{rel}:{lineno}: includes {header}"
        for matches, allowed, why in owner_rules(rel):
            if matches(header) and not allowed:
                out.append(f"{where}: {why}")
        if m.group(1) != '"':
            continue
        top = header.split("/")[0] if "/" in header else None
        if rel.startswith(("src/common/", "include/gpurent/")):
            if top != "gpurent":
                out.append(f"{where}: the common library includes only include/gpurent headers")
        elif rel.startswith("src/agent/"):
            if top in LAYERS or header in ("gpurentd.h", "embedded.h"):
                out.append(f"{where}: the agent includes nothing of gpurentd")
        elif layer:
            if top in LAYERS and top not in MAY_INCLUDE[layer]:
                out.append(f"{where}: {layer}/ may not include the {top}/ layer (it is not below {layer})")
            if header == "gpurentd.h" and layer != "cmd":
                out.append(f"{where}: only cmd/ includes the whole map, gpurentd.h")
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = []
    for top in ("src", "include"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith((".c", ".h")):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                with open(path, encoding="utf-8", errors="replace") as f:
                    found += breaches_of(rel, f.read())
    for line in sorted(found):
        print(f"check-layers: {line}")
    if found:
        print(f"check-layers: {len(found)} breaches of the layering (see scripts/check-layers.py)")
        return 1
    print("check-layers: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
