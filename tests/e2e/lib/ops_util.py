"""ops_util.py: helpers for the operations tests (test_operations.py): a
strict Prometheus text parser, a throwaway CA made
with the `openssl` command line, the report command's three output formats
and `gpurentd ledger verify`'s totals line.

EnvDaemon(directory, *, env=None, **Daemon kwargs)
    harness.Daemon started with extra environment variables (the harness's
    Popen takes none): the same command line, logs and clean-stop checks.

TlsDaemon(directory, *, ca, cert, key, env=None, **Daemon kwargs)
    A daemon serving HTTPS (tls_cert/tls_key options); its base_url is
    https://127.0.0.1:PORT and every request verifies against ca.

parse_prometheus(text) -> {family: Family}
    A strict parser of the text exposition format 0.0.4; raises
    PromError on anything the format does not allow or Prometheus would
    reject. Family: name, type, help, samples [(sample name, labels dict,
    value)].
sample(fams, name, **labels) -> float or None   one series' value
total(fams, name, **labels) -> float            sum over series matching labels

make_ca(directory, name) -> (key, cert)
make_cert(directory, name, ca, san="IP:127.0.0.1") -> (key, cert)
    signed by ca (a (key, cert) pair)

report(db, name, fmt, *args) -> parsed output of `gpurentd report`
parse_table(text) / parse_csv(text) -> (header, rows of str)
ledger_totals(db) -> {field: micro}   runs `gpurentd ledger verify`, asserts
    it passed and parses its totals line
reconcile(db) -> totals               every report's totals agree with the
    ledger's, to the micro
"""
import csv
import io
import json
import math
import os
import re
import subprocess
import time

import requests

from harness import GPURENTD, TOKEN, Daemon, _env, assert_no_sanitizer_report, run_gpurentd


# ---------------------------------------------------------------- daemons


class EnvDaemon(Daemon):
    def __init__(self, directory, *, env=None, **kw):
        self.extra_env = dict(env or {})
        super().__init__(directory, **kw)

    def spawn(self):
        assert self.proc is None, "already running"
        self.starts += 1
        with open(self._log_path("stdout"), "wb") as out, open(self._log_path("stderr"), "wb") as err:
            self.proc = subprocess.Popen(self.command(), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                         env={**_env(), **self.extra_env})


class TlsDaemon(EnvDaemon):
    def __init__(self, directory, *, ca, cert, key, options=None, **kw):
        self.ca = ca
        super().__init__(directory, options={"tls_cert": cert, "tls_key": key, **(options or {})}, **kw)

    def start(self, timeout=60):
        self.spawn()
        m = self.wait_for_log(r"listening on (https?)://\S+:(\d+) ", timeout=timeout)
        assert m.group(1) == "https", m.group(0)
        self.port = int(m.group(2))
        self.base_url = f"https://127.0.0.1:{self.port}"
        lines = self.stdout_text().splitlines()
        if lines and lines[-1].startswith("gpk_"):
            assert TOKEN.match(lines[-1]), lines[-1]
            self.admin_key = lines[-1]
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.get("/readyz", timeout=5).status_code == 200:
                    return self
            except requests.ConnectionError:
                pass
            self._check_alive()
            assert time.monotonic() < deadline, f"/readyz not ready after {timeout}s\n{self.stderr_text()[-4000:]}"
            time.sleep(0.02)

    def request(self, method, path, key=None, json=None, headers=None, timeout=30, verify=None, **kw):
        h = dict(headers or {})
        if key is not None:
            h["Authorization"] = f"Bearer {key}"
        if json is not None:
            kw["json"] = json
        return requests.request(method, self.url(path), headers=h, timeout=timeout, allow_redirects=False,
                                verify=self.ca if verify is None else verify, **kw)


# ---------------------------------------------------------------- Prometheus text format

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
TYPES = ("counter", "gauge", "histogram", "summary", "untyped")


class PromError(AssertionError):
    pass


class Family:
    def __init__(self, name):
        self.name = name
        self.type = None
        self.help = None
        self.samples = []  # (sample name, labels dict, value)

    def __repr__(self):
        return f"Family({self.name}, {self.type}, {len(self.samples)} samples)"


def _float(text, where):
    if text in ("+Inf", "Inf"):
        return math.inf
    if text == "-Inf":
        return -math.inf
    if text == "NaN":
        return math.nan
    if not re.fullmatch(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?", text):
        raise PromError(f"{where}: {text!r} is not a sample value")
    return float(text)


def _labels(text, where):
    """Parses the inside of {...}; returns (dict, rest of the line after '}')."""
    labels = {}
    i = 0
    while True:
        if text[i:i + 1] == "}":
            return labels, text[i + 1:]
        m = re.match(r"([^=\s,{}\"]*)=\"", text[i:])
        if not m:
            raise PromError(f"{where}: bad label at {text[i:]!r}")
        name = m.group(1)
        if not LABEL_NAME.match(name) or name.startswith("__"):
            raise PromError(f"{where}: bad label name {name!r}")
        if name in labels:
            raise PromError(f"{where}: label {name!r} given twice")
        i += m.end()
        value = []
        while True:
            if i >= len(text):
                raise PromError(f"{where}: unterminated label value")
            c = text[i]
            if c == "\\":
                nxt = text[i + 1:i + 2]
                if nxt not in ("\\", '"', "n"):
                    raise PromError(f"{where}: bad escape \\{nxt} in a label value")
                value.append("\n" if nxt == "n" else nxt)
                i += 2
            elif c == '"':
                i += 1
                break
            elif c == "\n":
                raise PromError(f"{where}: newline in a label value")
            else:
                value.append(c)
                i += 1
        labels[name] = "".join(value)
        if text[i:i + 1] == ",":
            i += 1
            if text[i:i + 1] == "}":  # a trailing comma is allowed
                continue
        elif text[i:i + 1] != "}":
            raise PromError(f"{where}: expected ',' or '}}' after label {name!r}")


def _family_of(sample_name, families):
    """The declared family a sample belongs to (histogram/summary suffixes)."""
    if sample_name in families and families[sample_name].type not in ("histogram", "summary"):
        return families[sample_name]
    for suffix in ("_bucket", "_sum", "_count"):
        if sample_name.endswith(suffix):
            base = families.get(sample_name[:-len(suffix)])
            if base and (base.type == "histogram" or (base.type == "summary" and suffix != "_bucket")):
                return base
    if sample_name in families and families[sample_name].type == "summary":
        return families[sample_name]
    return None


def parse_prometheus(text):
    if not text.endswith("\n"):
        raise PromError("the exposition does not end with a newline")
    families = {}
    order = []          # families in the order their samples appear
    seen_series = set()
    finished = set()    # families whose sample group has ended
    current = None
    for n, line in enumerate(text[:-1].split("\n"), 1):
        where = f"line {n} ({line!r})"
        if line == "":
            raise PromError(f"{where}: empty line")
        if line != line.strip(" "):
            raise PromError(f"{where}: leading or trailing spaces")
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                if not METRIC_NAME.match(name):
                    raise PromError(f"{where}: bad metric name {name!r}")
                fam = families.setdefault(name, Family(name))
                if fam.samples:
                    raise PromError(f"{where}: {parts[1]} after the family's samples")
                if parts[1] == "HELP":
                    if fam.help is not None:
                        raise PromError(f"{where}: second HELP for {name}")
                    doc = parts[3] if len(parts) > 3 else ""
                    if re.search(r"\\[^\\n]|\\$", doc):
                        raise PromError(f"{where}: bad escape in HELP text")
                    fam.help = doc.replace("\\n", "\n").replace("\\\\", "\\")
                else:
                    if fam.type is not None:
                        raise PromError(f"{where}: second TYPE for {name}")
                    if len(parts) != 4 or parts[3] not in TYPES:
                        raise PromError(f"{where}: bad TYPE line")
                    fam.type = parts[3]
            continue
        m = re.match(r"([^\s{]+)", line)
        name = m.group(1)
        if not METRIC_NAME.match(name):
            raise PromError(f"{where}: bad metric name {name!r}")
        rest = line[m.end():]
        labels = {}
        if rest.startswith("{"):
            labels, rest = _labels(rest[1:], where)
        if not rest.startswith(" "):
            raise PromError(f"{where}: no space before the value")
        parts = rest[1:].split(" ")
        if len(parts) not in (1, 2):
            raise PromError(f"{where}: expected a value and an optional timestamp")
        value = _float(parts[0], where)
        if len(parts) == 2 and not re.fullmatch(r"-?[0-9]+", parts[1]):
            raise PromError(f"{where}: bad timestamp")
        fam = _family_of(name, families)
        if fam is None or fam.type is None:
            raise PromError(f"{where}: sample of {name} has no TYPE declared before it")
        if fam is not current:
            if fam.name in finished:
                raise PromError(f"{where}: samples of {fam.name} are not in one group")
            if current is not None:
                finished.add(current.name)
            current = fam
            order.append(fam.name)
        key = (name, tuple(sorted(labels.items())))
        if key in seen_series:
            raise PromError(f"{where}: series given twice")
        seen_series.add(key)
        if fam.type == "histogram" and name.endswith("_bucket") and "le" not in labels:
            raise PromError(f"{where}: bucket without an le label")
        if "le" in labels and not (fam.type == "histogram" and name.endswith("_bucket")):
            raise PromError(f"{where}: le label outside a histogram bucket")
        fam.samples.append((name, labels, value))
    for fam in families.values():
        if fam.type is None:
            raise PromError(f"HELP without TYPE for {fam.name}")
        _check_family(fam)
    return families


def _check_family(fam):
    if fam.type == "counter":
        for name, labels, v in fam.samples:
            if not (v >= 0) or math.isinf(v):
                raise PromError(f"counter {name}{labels} = {v}: counters are finite and never negative")
    elif fam.type == "gauge":
        for name, labels, v in fam.samples:
            if math.isnan(v):
                raise PromError(f"gauge {name}{labels} is NaN")
    elif fam.type == "histogram":
        series = {}
        for name, labels, v in fam.samples:
            suffix = name[len(fam.name):]
            if suffix not in ("_bucket", "_sum", "_count"):
                raise PromError(f"histogram {fam.name} has a sample {name}")
            rest = tuple(sorted((k, x) for k, x in labels.items() if k != "le"))
            s = series.setdefault(rest, {"buckets": [], "sum": None, "count": None})
            if suffix == "_bucket":
                s["buckets"].append((_float(labels["le"], f"{name}{labels}"), v, labels["le"]))
            else:
                s[suffix[1:]] = v
        for rest, s in series.items():
            what = f"histogram {fam.name}{dict(rest)}"
            if s["count"] is None or s["sum"] is None:
                raise PromError(f"{what}: no _count or no _sum")
            b = s["buckets"]
            if not b or b[-1][2] != "+Inf":
                raise PromError(f"{what}: buckets do not end with le=\"+Inf\"")
            les = [x[0] for x in b]
            if les != sorted(les) or len(set(les)) != len(les):
                raise PromError(f"{what}: bucket bounds not strictly increasing: {les}")
            counts = [x[1] for x in b]
            if any(c < 0 or c != int(c) for c in counts) or counts != sorted(counts):
                raise PromError(f"{what}: bucket counts not cumulative: {counts}")
            if counts[-1] != s["count"]:
                raise PromError(f"{what}: +Inf bucket {counts[-1]} != _count {s['count']}")
            if s["sum"] < 0:
                raise PromError(f"{what}: negative _sum")


def sample(fams, name, **labels):
    """The value of the series name{labels} (labels exactly), or None."""
    fam = _family_of(name, fams)
    if fam is None:
        return None
    for n, l, v in fam.samples:
        if n == name and l == labels:
            return v
    return None


def total(fams, name, **labels):
    """Sum of name's series whose labels include the given ones."""
    fam = _family_of(name, fams)
    if fam is None:
        return 0
    return sum(v for n, l, v in fam.samples if n == name and all(l.get(k) == x for k, x in labels.items()))


# ---------------------------------------------------------------- TLS


def _openssl(*args, cwd):
    p = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, f"openssl {' '.join(args)} failed:\n{p.stderr}"


def make_ca(directory, name):
    directory = str(directory)
    os.makedirs(directory, exist_ok=True)
    key, cert = os.path.join(directory, f"{name}.key"), os.path.join(directory, f"{name}.pem")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", key, "-out", cert, "-days", "3", "-subj", f"/CN=gpurent test CA {name}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             "-addext", "subjectKeyIdentifier=hash", cwd=directory)
    return key, cert


def make_cert(directory, name, ca, san="IP:127.0.0.1"):
    directory = str(directory)
    ca_key, ca_cert = ca
    key, csr, cert = (os.path.join(directory, f"{name}.{ext}") for ext in ("key", "csr", "pem"))
    ext = os.path.join(directory, f"{name}.ext")
    with open(ext, "w") as f:
        f.write(f"subjectAltName={san}\nbasicConstraints=critical,CA:FALSE\n"
                "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
                "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n")
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", key, "-out", csr, "-subj", f"/CN={name}", cwd=directory)
    _openssl("x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key, "-CAcreateserial", "-out", cert,
             "-days", "3", "-extfile", ext, cwd=directory)
    return key, cert


# ---------------------------------------------------------------- reports


def parse_table(text):
    """The table format: a header, a line of dashes per column (two spaces
    between columns), then rows padded to the column widths."""
    lines = text.split("\n")
    assert lines[-1] == "", f"table does not end with a newline: {text!r}"
    lines = lines[:-1]
    assert len(lines) >= 2, text
    dashes = lines[1]
    assert re.fullmatch(r"-+(  -+)*", dashes), f"second line is not the dashes: {dashes!r}"
    spans, pos = [], 0
    for run in dashes.split("  "):
        spans.append((pos, pos + len(run)))
        pos += len(run) + 2

    def cells(line):
        assert len(line) == spans[-1][1], f"row width {len(line)} != table width {spans[-1][1]}: {line!r}"
        for (a, b), (c, _) in zip(spans, spans[1:]):
            assert line[b:c] == "  ", f"no two-space gap at {b}: {line!r}"
        return [line[a:b].strip(" ") for a, b in spans]
    header = cells(lines[0])
    for (a, b), h in zip(spans, header):
        assert lines[0][a:b] == h.ljust(b - a), f"header cell {h!r} not left-aligned"
    rows = []
    for line in lines[2:]:
        row = cells(line)
        for (a, b), cell in zip(spans, row):  # numbers right-aligned, text left-aligned
            numeric = cell != "" and re.fullmatch(r"[-0-9.]+", cell)
            want = cell.rjust(b - a) if numeric else cell.ljust(b - a)
            assert line[a:b] == want, f"cell {cell!r} misaligned in {line!r}"
        rows.append(row)
    return header, rows


def parse_csv(text):
    assert text.endswith("\r\n"), f"CSV does not end with CRLF: {text[-20:]!r}"
    assert "\n" not in text.replace("\r\n", ""), "CSV line ends other than CRLF"
    rows = list(csv.reader(io.StringIO(text, newline="")))
    return rows[0], rows[1:]


def run_report(db, name, fmt, *args):
    """The report's standard output, byte for byte (CSV lines end in CRLF,
    which text mode would hide)."""
    cmd = [GPURENTD, "report", name, "--db", db, "--format", fmt, *args]
    p = subprocess.run(cmd, capture_output=True, timeout=60, env=_env())
    err = p.stderr.decode("utf-8", "replace")
    assert_no_sanitizer_report(err, " ".join(cmd))
    assert p.returncode == 0, f"{' '.join(cmd)} failed ({p.returncode}):\n{err}"
    assert err == "", f"{' '.join(cmd)} wrote to stderr:\n{err}"
    return p.stdout.decode("utf-8")


def report(db, name, fmt, *args):
    """(header, rows) for table and csv (cells as text); a list of dicts for json."""
    out = run_report(db, name, fmt, *args)
    if fmt == "table":
        return parse_table(out)
    if fmt == "csv":
        return parse_csv(out)
    return json.loads(out)


# ---------------------------------------------------------------- ledger

TOTALS = re.compile(r"^totals: revenue (\S+), credits granted (\S+), credits spent (\S+), credits expired (\S+),"
                    r" credit outstanding (\S+), top-ups (\S+), cash held (\S+), refunds (\S+),"
                    r" credits refunded (\S+)$", re.M)
TOTAL_KEYS = ("revenue", "credits_granted", "credits_spent", "credits_expired", "credit_outstanding", "topups",
              "cash_held", "refunds", "credits_refunded")
STORAGE_TOTALS = re.compile(r"^storage totals: revenue (\S+), credits spent (\S+)$", re.M)
_AMOUNT = re.compile(r"^(-?)(0|[1-9][0-9]*)\.([0-9]{2,6})$")


def micro(s):
    m = _AMOUNT.match(s)
    assert m, f"not an amount: {s!r}"
    v = int(m.group(2)) * 1_000_000 + int(m.group(3).ljust(6, "0"))
    return -v if m.group(1) else v


def ledger_totals(db):
    p = run_gpurentd("ledger", "verify", "--db", db, timeout=120)
    assert p.returncode == 0, f"ledger verify failed ({p.returncode}):\n{p.stdout}{p.stderr}"
    lines = p.stdout.splitlines()
    assert lines[-1] == "ledger OK", p.stdout
    m = TOTALS.search(p.stdout)
    assert m, f"no totals line:\n{p.stdout}"
    return dict(zip(TOTAL_KEYS, (micro(x) for x in m.groups())))


def storage_totals(db):
    """(storage revenue, credit spent on storage) from `ledger verify`'s
    line of its own."""
    p = run_gpurentd("ledger", "verify", "--db", db, timeout=120)
    assert p.returncode == 0, f"ledger verify failed ({p.returncode}):\n{p.stdout}{p.stderr}"
    m = STORAGE_TOTALS.search(p.stdout)
    assert m, f"no storage totals line:\n{p.stdout}"
    return tuple(micro(x) for x in m.groups())


def reconcile(db):
    """Every report's totals agree with `ledger verify`'s, to the micro."""
    t = ledger_totals(db)
    storage_revenue, storage_credit = storage_totals(db)
    revenue = report(db, "daily-revenue", "json")
    usage = report(db, "usage", "json")
    util = report(db, "utilisation", "json")
    liability = report(db, "credit-liability", "json")
    topups = report(db, "topups", "json")
    storage = report(db, "storage", "json")

    def s(rows, col):
        return sum(micro(r[col]) for r in rows)
    # The views net refunds out; the totals count charges and refunds apart.
    earned = t["revenue"] - t["refunds"]
    credit_used = t["credits_spent"] - t["credits_refunded"]
    cash_spent = earned - credit_used
    assert s(revenue, "revenue") == earned
    assert s(revenue, "paid_by_credit") == credit_used
    assert s(revenue, "paid_by_cash") == cash_spent
    assert all(micro(r["revenue"]) == micro(r["paid_by_credit"]) + micro(r["paid_by_cash"]) for r in revenue)
    assert s(usage, "cost") == earned
    assert s(usage, "paid_by_credit") == credit_used
    assert s(usage, "paid_by_cash") == cash_spent
    assert all(micro(r["cost"]) == micro(r["paid_by_credit"]) + micro(r["paid_by_cash"]) for r in usage)
    sold = {}
    for r in usage:
        sold[(r["day"], r["gpu_type"])] = sold.get((r["day"], r["gpu_type"]), 0) + r["card_seconds"]
    # A day can carry charges but no running (a pass posting the day after an
    # interval ended): utilisation shows it with nothing sold.
    assert {(r["day"], r["gpu_type"]): r["card_seconds_sold"] for r in util if r["card_seconds_sold"]} == \
        {k: v for k, v in sold.items() if v}
    for r in util:  # card-hours available: exact when whole, else four places rounded half up
        a = r["card_seconds_available"]
        h4 = (a * 10000 + 1800) // 3600
        assert r["card_hours_available"] == (a // 3600 if a % 3600 == 0 else f"{h4 // 10000}.{h4 % 10000:04d}"), r
        assert (r["utilisation"] is None) == (a == 0), r
    # Storage is counted apart from card time, in its own report.
    assert s(storage, "cost") == storage_revenue
    assert s(storage, "paid_by_credit") == storage_credit
    assert all(micro(r["cost"]) == micro(r["paid_by_credit"]) + micro(r["paid_by_cash"]) for r in storage)
    storage_cash = storage_revenue - storage_credit
    assert s(liability, "remaining") == t["credit_outstanding"]
    assert t["credits_granted"] - credit_used - storage_credit - t["credits_expired"] == t["credit_outstanding"]
    assert s(topups, "amount") == t["topups"]
    assert t["topups"] - cash_spent - storage_cash == t["cash_held"]
    return t
