"""test_layers.py: the layering check (scripts/check-layers.py, run by `make
check`) passes on the tree as it is and fails, naming the file, the line and
the rule, on each kind of breach planted in a copy of the sources: a layer
including one above it, SQLite or the store's private header outside the
store, libcurl or OpenSSL outside their owners, the common library or the
agent reaching into the daemon."""
import os
import shutil
import subprocess
import sys

import pytest

from harness import REPO

SCRIPT = os.path.join(REPO, "scripts", "check-layers.py")


def copy_tree(tmp_path):
    for top in ("src", "include"):
        shutil.copytree(os.path.join(REPO, top), tmp_path / top)
    return tmp_path


def run_check(root):
    return subprocess.run([sys.executable, SCRIPT, str(root)], capture_output=True, text=True, timeout=60)


def test_the_tree_keeps_its_layers(tmp_path):
    p = run_check(copy_tree(tmp_path))
    assert p.returncode == 0 and p.stdout.strip() == "check-layers: OK", p.stdout + p.stderr


@pytest.mark.parametrize("path,include,rule", [
    ("src/gpurentd/store/store.c", '"http/api.h"', "store/ may not include the http/ layer"),
    ("src/gpurentd/domain/ledger.c", '"loops/loops.h"', "domain/ may not include the loops/ layer"),
    ("src/gpurentd/loops/billing.c", '"http/api.h"', "loops/ may not include the http/ layer"),
    ("src/gpurentd/http/auth.c", '"cmd/cmd.h"', "http/ may not include the cmd/ layer"),
    ("src/gpurentd/domain/funds.c", '"audit/audit.h"', "domain/ may not include the audit/ layer"),
    ("src/gpurentd/http/routes.c", '"gpurentd.h"', "only cmd/ includes the whole map"),
    ("src/gpurentd/domain/ledger.c", "<sqlite3.h>", "SQLite is the store's alone"),
    ("src/gpurentd/http/api_balance.c", '"store/store_sql.h"', "store_sql.h is private"),
    ("src/gpurentd/cmd/serve.c", "<curl/curl.h>", "libcurl belongs to the agent client"),
    ("src/gpurentd/http/auth.c", "<openssl/evp.h>", "OpenSSL belongs to src/common"),
    ("src/common/money.c", '"store/store.h"', "the common library includes only include/gpurent headers"),
    ("src/agent/api.c", '"domain/domain.h"', "the agent includes nothing of gpurentd"),
])
def test_a_planted_breach_fails_the_check(tmp_path, path, include, rule):
    root = copy_tree(tmp_path)
    target = root / path
    text = target.read_text()
    lines = text.splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("#include"))
    lines.insert(at, f"#include {include}\n")
    target.write_text("".join(lines))
    p = run_check(root)
    assert p.returncode == 1, p.stdout
    header = include.strip('<>"')
    expected = f"check-layers: {path}:{at + 1}: includes {header}: "
    (line,) = [x for x in p.stdout.splitlines() if x.startswith(expected)]
    assert rule in line, line
