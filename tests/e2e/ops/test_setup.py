"""test_setup.py: what an operator does before and around serving: checking a
configuration with `gpurentd -n` (bad CORS origins and trusted proxies are
refused naming the file and line or the option), `make install` into a
DESTDIR (files, modes, units rewritten to the PREFIX, configurations that
still parse), and `make run`'s script, scripts/run-local.sh, end to end on a
temporary state directory: banner, admin key, simulated fleet, an instance
that runs, Ctrl-C, and a second run on the same state."""
import datetime
import os
import random
import re
import shutil
import signal
import socket
import stat
import subprocess
import time

import pytest
import requests

from agent_util import AGENT, poll
from harness import GPURENTD, REPO, assert_no_sanitizer_report, run_gpurentd


def sanitizer_env():
    """The environment for a program started here: a sanitized build must
    fail loudly (the harness sets the same)."""
    env = dict(os.environ)
    env.setdefault("ASAN_OPTIONS", "halt_on_error=1:detect_leaks=1:abort_on_error=0")
    env.setdefault("UBSAN_OPTIONS", "halt_on_error=1:print_stacktrace=1")
    return env


def ok(url):
    try:
        return requests.get(url, timeout=5).status_code == 200
    except requests.ConnectionError:
        return False


# ---------------------------------------------------------------------------
# gpurentd -n: the list options are checked like every other option
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("option, value, message", [
    ("trusted_proxies", "banana", "trusted_proxies: 'banana' is not an IP address"),
    ("trusted_proxies", "127.0.0.1 10.0.0.0/8", "trusted_proxies: '10.0.0.0/8' is a range"),
    ("trusted_proxies", "0:0::1", "trusted_proxies: '0:0::1' would never match a client; write it as '::1'"),
    ("cors_origins", "console.example.com/ x", "cors_origins: 'console.example.com/' is not an origin"),
    ("cors_origins", "https://console.example.com/",
     "cors_origins: 'https://console.example.com/' has a path or a trailing slash"),
    ("cors_origins", "https://Console.example.com", "has upper-case letters"),
    ("cors_origins", "https://console.example.com:443", "names the default port"),
    ("image_policy", "any", "image_policy: 'any' is not catalog or registries"),
    ("image_registries", "docker.io,bad_host", "image_registries: 'bad_host' is not a registry host[:port]"),
    ("image_registries", "ghcr.io:70000", "image_registries: 'ghcr.io:70000' is not a registry host[:port]"),
])
def test_check_refuses_bad_lists(tmp_path, option, value, message):
    # On the command line: the message names the option, there is no line.
    p = run_gpurentd("-n", "-o", f"{option}={value}")
    assert p.returncode != 0 and p.stdout == "", (p.stdout, p.stderr)
    assert p.stderr.startswith(f"gpurentd: command line: {option}: ") and message in p.stderr, p.stderr
    # In a file: FILE:LINE in front of the same message.
    conf = tmp_path / "gpurentd.conf"
    conf.write_text(f"# a comment\nthreads = 2\n{option} = {value}\n")
    p = run_gpurentd("-n", "-c", conf)
    assert p.returncode != 0 and p.stdout == "", (p.stdout, p.stderr)
    assert p.stderr.startswith(f"gpurentd: {conf}:3: {option}: ") and message in p.stderr, p.stderr


def test_agent_check_refuses_a_key_set_twice(tmp_path):
    """The agent reads its file with the same engine: a second line for a
    key (an appended `listen = ...`) is refused naming both lines, where
    the last one used to win unnoticed."""
    conf = tmp_path / "gpurent-agent.conf"
    conf.write_text("listen = 127.0.0.1:9090\nruntime = sim\nlisten = 0.0.0.0:9090\n")
    p = subprocess.run([AGENT, "-n", "-c", str(conf)], capture_output=True, text=True, timeout=60,
                       env=sanitizer_env())
    assert p.returncode != 0 and p.stdout == "", (p.stdout, p.stderr)
    assert p.stderr == f"gpurent-agent: {conf}:3: 'listen' is set twice (first on line 1); keep one of the two lines\n", \
        p.stderr


def test_the_registries_image_policy_needs_registries():
    p = run_gpurentd("-n", "-o", "image_policy=registries")
    assert p.returncode != 0 and "image_policy = registries needs image_registries" in p.stderr, p.stderr
    p = run_gpurentd("-n", "-o", "image_policy=registries", "-o", "image_registries=docker.io, ghcr.io,r.example:5000")
    assert p.returncode == 0 and p.stdout == "configuration OK\n", p.stderr


def test_an_agent_put_s_wait_must_fit_in_its_call():
    p = run_gpurentd("-n", "-o", "agent_timeout_ms=1000", "-o", "agent_put_wait_ms=1000")
    assert p.returncode != 0 and "agent_put_wait_ms 1000 must be under agent_timeout_ms 1000" in p.stderr, p.stderr
    p = run_gpurentd("-n", "-o", "agent_put_wait_ms=1001")
    assert p.returncode != 0 and "agent_put_wait_ms" in p.stderr, p.stderr
    p = run_gpurentd("-n", "-o", "agent_timeout_ms=1000", "-o", "agent_put_wait_ms=999")
    assert p.returncode == 0 and p.stdout == "configuration OK\n", p.stderr


def test_check_accepts_good_lists(tmp_path):
    conf = tmp_path / "gpurentd.conf"
    conf.write_text("cors_origins = https://console.example.com http://localhost:5173,https://[::1]:8443\n"
                    "trusted_proxies = 10.9.9.9 127.0.0.1,::1\n")
    for args in (["-n", "-c", conf], ["-n", "-o", "cors_origins=*", "-o", "trusted_proxies="]):
        p = run_gpurentd(*args)
        assert p.returncode == 0 and p.stdout == "configuration OK\n", (args, p.stderr)


# ---------------------------------------------------------------------------
# make install
# ---------------------------------------------------------------------------

UNITS = ("gpurentd.service", "gpurent-agent.service")
DOCS = ("README.md", "docs/OPERATIONS.md", "docs/REPORTS.md", "docs/ARCHITECTURE.md", "docs/AGENT_PROTOCOL.md")


def build_dir_vars():
    """The make variables that make `make install` copy the binaries under
    test: SAN=1 for build/san, nothing for build. Other binaries are not
    what the Makefile installs, so the install tests are skipped for them."""
    here = os.path.dirname(GPURENTD)
    if os.path.dirname(AGENT) != here:
        pytest.skip(f"GPURENTD and GPURENT_AGENT are in different directories ({GPURENTD}, {AGENT})")
    if here == os.path.join(REPO, "build"):
        return []
    if here == os.path.join(REPO, "build", "san"):
        return ["SAN=1"]
    pytest.skip(f"make install copies build/ or build/san/, not {here}")


def make_install(destdir, *variables):
    """Runs `make install` from the repository root without building: `-o all`
    takes the binaries as they are, so this never compiles (nor races a
    build someone else runs in the same tree). Returns make's output."""
    if not shutil.which("make"):
        pytest.skip("make is not installed")
    # Nothing from an outer make (`make e2e` passes its flags and command-line
    # variables down in MAKEFLAGS) or from the caller's environment may move
    # the files: only the variables given here count.
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "DESTDIR", "PREFIX", "UNITDIR",
                        "SYSUSERSDIR", "SAN")}
    p = subprocess.run(["make", "--no-print-directory", "-o", "all", "install", f"DESTDIR={destdir}",
                        *build_dir_vars(), *variables],
                       cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert not re.search(r"(^|\s)-c\s+\S+\.c\b", out), f"make install compiled something:\n{out}"
    return out


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def check_units(destdir, prefix, unitdir):
    """Each unit is the shipped one with its binary and documentation paths
    moved to prefix, and every path it names that make install provides is
    there."""
    for unit in UNITS:
        path = os.path.join(destdir + unitdir, unit)
        assert mode(path) == 0o644, unit
        text = read(path).decode()
        want = read(os.path.join(REPO, "conf", unit)).decode()
        want = want.replace("/usr/local/bin/", f"{prefix}/bin/")
        want = want.replace("/usr/local/share/doc/gpurent/", f"{prefix}/share/doc/gpurent/")
        assert text == want, unit
        settings = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
        exec_start = [ln for ln in settings if ln.startswith("ExecStart=")]
        assert len(exec_start) == 1, unit
        argv = exec_start[0][len("ExecStart="):].split()
        binary = os.path.basename(argv[0])
        assert argv[0] == f"{prefix}/bin/{binary}", exec_start
        assert mode(destdir + argv[0]) == 0o755, argv[0]
        config = argv[argv.index("-c") + 1]
        assert config.startswith("/etc/gpurent/") and os.path.isfile(destdir + config), exec_start
        docs = [ln for ln in settings if ln.startswith("Documentation=")]
        assert docs, unit
        for url in docs[0][len("Documentation="):].split():
            assert url.startswith(f"file:{prefix}/share/doc/gpurent/"), url
            assert os.path.isfile(destdir + url[len("file:"):]), url
        if prefix != "/usr/local":
            assert not any("/usr/local/bin/" in ln or "/usr/local/share/" in ln for ln in settings), \
                f"{unit} still names /usr/local:\n{text}"


def test_make_install_under_usr(tmp_path):
    dest = str(tmp_path / "root")
    make_install(dest, "PREFIX=/usr")

    # Everything lands under DESTDIR, where the Makefile says.
    for name, built in (("gpurentd", GPURENTD), ("gpurent-agent", AGENT)):
        path = os.path.join(dest, "usr/bin", name)
        assert mode(path) == 0o755, name
        assert read(path) == read(built), f"{path} is not the binary under test"
    # gpurentd.conf may hold secrets (payment_webhook_secret): never world-readable.
    # Each is the shipped one, with console_dir where PREFIX puts the console.
    for conf, want in (("gpurentd.conf", 0o640), ("gpurent-agent.conf", 0o644)):
        path = os.path.join(dest, "etc/gpurent", conf)
        shipped = read(os.path.join(REPO, "conf", conf)).replace(
            b"console_dir = /usr/local/share/gpurent/console", b"console_dir = /usr/share/gpurent/console")
        assert mode(path) == want and read(path) == shipped, (conf, oct(mode(path)))
    assert b"\nconsole_dir = /usr/share/gpurent/console\n" in read(os.path.join(dest, "etc/gpurent/gpurentd.conf"))
    check_units(dest, "/usr", "/usr/lib/systemd/system")
    # The gateway's unit (issue 17) takes flags, not a configuration file.
    gw_unit = read(os.path.join(dest, "usr/lib/systemd/system/gpurent-gateway.service")).decode()
    assert gw_unit == read(os.path.join(REPO, "conf", "gpurent-gateway.service")).decode().replace(
        "/usr/local/bin/", "/usr/bin/").replace("/usr/local/share/doc/gpurent/", "/usr/share/doc/gpurent/")
    sysusers = os.path.join(dest, "usr/lib/sysusers.d/gpurent.conf")
    assert mode(sysusers) == 0o644 and read(sysusers) == read(os.path.join(REPO, "conf", "gpurent.sysusers"))
    for doc in DOCS:
        path = os.path.join(dest, "usr/share/doc/gpurent", os.path.basename(doc))
        assert mode(path) == 0o644 and read(path) == read(os.path.join(REPO, doc)), doc
    # The web console, every file of console/ (vendor/ included) as it is.
    console = sorted(os.path.relpath(os.path.join(d, f), os.path.join(REPO, "console"))
                     for d, _, fs in os.walk(os.path.join(REPO, "console")) for f in fs)
    assert "index.html" in console
    for f in console:
        path = os.path.join(dest, "usr/share/gpurent/console", f)
        assert mode(path) == 0o644 and read(path) == read(os.path.join(REPO, "console", f)), f
    installed = sorted(os.path.relpath(os.path.join(d, f), dest) for d, _, fs in os.walk(dest) for f in fs)
    assert installed == sorted(
        [f"usr/share/gpurent/console/{f}" for f in console] +
        ["usr/bin/gpurentd", "usr/bin/gpurent-agent", "etc/gpurent/gpurentd.conf", "etc/gpurent/gpurent-agent.conf",
         "usr/lib/sysusers.d/gpurent.conf", "usr/bin/gpurent-gateway", "usr/lib/systemd/system/gpurent-gateway.service"]
        + [f"usr/lib/systemd/system/{u}" for u in UNITS]
        + [f"usr/share/doc/gpurent/{os.path.basename(d)}" for d in DOCS]), installed

    # The installed programs accept the installed configurations as they are.
    env = sanitizer_env()
    for binary, conf in (("gpurentd", "gpurentd.conf"), ("gpurent-agent", "gpurent-agent.conf")):
        p = subprocess.run([os.path.join(dest, "usr/bin", binary), "-n", "-c", os.path.join(dest, "etc/gpurent", conf)],
                           capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
        assert p.returncode == 0 and p.stdout == "configuration OK\n", (binary, p.stderr)

    # And the installed gpurentd serves from it, away from the source tree
    # (migrations and the OpenAPI document are compiled in): the unit's
    # command line with the database and the port moved into the test's
    # directory.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    stderr_path = run_dir / "stderr.log"
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen([os.path.join(dest, "usr/bin/gpurentd"), "serve",
                                 "-c", os.path.join(dest, "etc/gpurent/gpurentd.conf"),
                                 "--db", str(run_dir / "gpurent.db"), "--listen", "127.0.0.1:0",
                                 "-o", "password_iterations=1000"],
                                stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL, cwd=run_dir, env=env)
    try:
        m = poll(lambda: proc.poll() is None and re.search(r"listening on http://\S+:(\d+) ", stderr_path.read_text()),
                 60, "the installed gpurentd to listen")
        base = f"http://127.0.0.1:{m.group(1)}"
        poll(lambda: ok(base + "/readyz"), 60, "/readyz")
        r = requests.get(base + "/v1/openapi.json", timeout=30)
        assert r.status_code == 200 and r.json()["openapi"].startswith("3."), r.text[:200]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
    log = stderr_path.read_text()
    assert_no_sanitizer_report(log, "installed gpurentd")
    assert rc == 0, log[-4000:]


# The exposure `systemd-analyze security --offline=true` gives each installed
# unit at most (docs/OPERATIONS.md, "Checking the units"): what keeps
# gpurentd and the gateway above 0 is the network they serve on; the
# agent's unit says option by option why a container host cannot take the
# sandbox.
EXPOSURE = {"gpurentd.service": 1.1, "gpurent-gateway.service": 1.1, "gpurent-agent.service": 9.3}


def systemd_analyze_version():
    """systemd-analyze's version number, or a skip when it is missing."""
    tool = shutil.which("systemd-analyze")
    if not tool:
        pytest.skip("systemd-analyze is not installed (Debian: apt-get install systemd)")
    out = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=60).stdout
    m = re.match(r"systemd (\d+)", out)
    assert m, out
    return int(m.group(1))


def test_installed_units_verify_and_keep_their_sandbox(tmp_path):
    """The three units as `make install` writes them, naming the installed
    programs: `systemd-analyze verify` has nothing to say about any of them,
    and none is more exposed than the documentation says."""
    version = systemd_analyze_version()
    dest = str(tmp_path / "root")
    make_install(dest, "PREFIX=/usr/local")
    unitdir = os.path.join(dest, "usr/local/lib/systemd/system")
    # The units name /usr/local/bin, where this machine has no gpurent: point
    # them at the copies make install put under DESTDIR, which verify checks
    # are there and executable.
    checked = tmp_path / "units"
    checked.mkdir()
    for unit in EXPOSURE:
        text = read(os.path.join(unitdir, unit)).decode()
        assert "/usr/local/bin/" in text, unit
        (checked / unit).write_text(text.replace("/usr/local/bin/", dest + "/usr/local/bin/"))
    paths = [str(checked / unit) for unit in EXPOSURE]
    p = subprocess.run(["systemd-analyze", "verify", *paths], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout == "" and p.stderr == "", p.stdout + p.stderr

    if version < 250:
        pytest.skip(f"systemd {version}: security --offline needs 250 or later")
    for unit, most in EXPOSURE.items():
        p = subprocess.run(["systemd-analyze", "security", "--offline=true", str(checked / unit)],
                           capture_output=True, text=True, timeout=120)
        m = re.search(r"Overall exposure level for " + re.escape(unit) + r": (\d+\.\d+)", p.stdout)
        assert m, p.stdout + p.stderr
        assert float(m.group(1)) <= most, f"{unit} is exposed at {m.group(1)}, documented at most {most}:\n{p.stdout}"


def test_make_install_elsewhere_keeps_changed_configuration(tmp_path):
    # Another PREFIX, with the units and the user where systemd reads them.
    dest = str(tmp_path / "root")
    variables = ("PREFIX=/opt/gpurent", "UNITDIR=/etc/systemd/system", "SYSUSERSDIR=/etc/sysusers.d")
    out = make_install(dest, *variables)
    assert "kept" not in out, out
    for name in ("gpurentd", "gpurent-agent"):
        assert mode(os.path.join(dest, "opt/gpurent/bin", name)) == 0o755
    check_units(dest, "/opt/gpurent", "/etc/systemd/system")
    assert os.path.isfile(os.path.join(dest, "etc/sysusers.d/gpurent.conf"))
    assert not os.path.exists(os.path.join(dest, "opt/gpurent/lib")), "UNITDIR and SYSUSERSDIR were not used"
    for doc in DOCS:
        assert os.path.isfile(os.path.join(dest, "opt/gpurent/share/doc/gpurent", os.path.basename(doc))), doc

    # Installing again over an edited configuration keeps the operator's
    # file and puts the new default beside it; an unedited one is replaced
    # quietly.
    conf = os.path.join(dest, "etc/gpurent/gpurentd.conf")
    edited = read(conf) + b"\nthreads = 8\n"
    with open(conf, "wb") as f:
        f.write(edited)
    out = make_install(dest, *variables)
    assert f"kept {conf}; the new default is gpurentd.conf.new beside it" in out, out
    assert read(conf) == edited
    assert read(conf + ".new") == read(os.path.join(REPO, "conf", "gpurentd.conf")).replace(
        b"console_dir = /usr/local/share/gpurent/console", b"console_dir = /opt/gpurent/share/gpurent/console")
    assert "gpurent-agent.conf" not in out, out
    assert not os.path.exists(os.path.join(dest, "etc/gpurent/gpurent-agent.conf.new"))


# ---------------------------------------------------------------------------
# make run: scripts/run-local.sh end to end
# ---------------------------------------------------------------------------

RUN_LOCAL = os.path.join(REPO, "scripts", "run-local.sh")
FLEET_NODES = {"MI450": 4, "MI300X": 2, "H100-SXM": 1}  # what run-local.sh starts
BANNER_END = "Ctrl-C stops gpurentd and the fleet"
SLOW = 120  # a bound on waits, generous for sanitizer builds and a busy machine


def free_port_block(n=4):
    """A port p with p..p+n-1 all free on 127.0.0.1 (run-local.sh uses the
    daemon's port and the three after it). Taken below the kernel's
    ephemeral range, so the port-0 listeners of other tests never land there;
    a clash with another test picking ports here is still possible but
    unlikely."""
    rng = random.Random()
    for _ in range(200):
        p = rng.randrange(20000, 32000 - n)
        socks = []
        try:
            for q in range(p, p + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", q))
            return p
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no block of free ports found")


class RunLocal:
    """One run of scripts/run-local.sh in its own session (so its process
    group is what Ctrl-C would reach in a terminal), output to files."""

    def __init__(self, var, port, ssh_port, tag, script=RUN_LOCAL, var_from_env=True):
        """var is the state directory the script uses: given to it as
        GPURENT_VAR, or, with var_from_env False, the default it picks
        itself (the var/ beside the script's scripts/ folder)."""
        self.var, self.port, self.base = str(var), port, f"http://127.0.0.1:{port}"
        self.out_path = os.path.join(os.path.dirname(self.var), f"run-local-{tag}.stdout")
        self.err_path = os.path.join(os.path.dirname(self.var), f"run-local-{tag}.stderr")
        env = {**sanitizer_env(), "GPURENT_PORT": str(port), "GPURENT_SSH_PORT": str(ssh_port),
               "GPURENTD": GPURENTD, "GPURENT_AGENT": AGENT}
        if var_from_env:
            env["GPURENT_VAR"] = self.var
        else:
            env.pop("GPURENT_VAR", None)
        env.pop("GPURENT_FLEET", None)
        env.pop("GPURENT_CORS_ORIGINS", None)
        # Started from outside the repository: the script finds its way there
        # itself, and GPURENT_VAR is absolute.
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(["bash", str(script)], stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                         env=env, cwd=os.path.dirname(self.var), start_new_session=True)

    def stdout(self):
        with open(self.out_path, errors="replace") as f:
            return f.read()

    def stderr(self):
        with open(self.err_path, errors="replace") as f:
            return f.read()

    def logs(self):
        return f"--- stdout\n{self.stdout()[-3000:]}\n--- stderr\n{self.stderr()[-5000:]}"

    def wait_banner(self):
        def shown():
            assert self.proc.poll() is None, f"run-local.sh exited with {self.proc.returncode}\n{self.logs()}"
            return BANNER_END in self.stdout()
        poll(shown, SLOW, "the banner")
        return self.stdout()

    def admin(self, key, path):
        r = requests.get(self.base + path, headers={"Authorization": f"Bearer {key}"}, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()

    def wait_nodes_ready(self, key, seen_since):
        """Polls until every node of the fleet is ready with its 8 cards and
        was reached by a heartbeat of this run (last_seen_at from
        seen_since, epoch seconds, on): a node left ready in the database by
        an earlier run does not count."""
        def ready():
            nodes = self.admin(key, "/v1/admin/nodes?limit=100")["data"]
            counts = {}
            for n in nodes:
                seen = n["last_seen_at"] and datetime.datetime.fromisoformat(
                    n["last_seen_at"].replace("Z", "+00:00")).timestamp()
                if n["state"] == "ready" and n["cards_total"] == 8 and seen and seen >= int(seen_since):
                    counts[n["gpu_model"]] = counts.get(n["gpu_model"], 0) + 1
            return len(nodes) == sum(FLEET_NODES.values()) and counts == FLEET_NODES and nodes
        return poll(ready, SLOW, "the simulated fleet to be ready")

    def interrupt(self):
        """Ctrl-C: SIGINT to the whole process group, as a terminal sends it.
        The script must stop everything it started and exit 0."""
        os.killpg(self.proc.pid, signal.SIGINT)
        self.check_stopped("SIGINT")

    def make_stop(self):
        """make stop from another terminal, with the same GPURENT_VAR: it
        returns once the script has stopped everything, which exits 0."""
        pid_file = os.path.join(self.var, "run-local.pid")
        with open(pid_file) as f:
            assert f.read() == f"{self.proc.pid}\n", "the pid file names the script"
        env = {**sanitizer_env(), "GPURENT_VAR": self.var}
        out = subprocess.run(["make", "-s", "--no-print-directory", "-C", REPO, "stop"], capture_output=True, text=True, env=env,
                             timeout=SLOW)
        assert (out.returncode, out.stderr) == (0, ""), out
        assert out.stdout == f"run-local: stopped make run (process {self.proc.pid}) on {self.var}\n", out
        # make stop returned after the script had exited: nothing to wait for.
        assert self.proc.poll() is not None, "make stop returned before run-local.sh exited"
        self.check_stopped("make stop")
        assert not os.path.exists(pid_file), "the pid file outlived the run"
        out = subprocess.run(["make", "-s", "--no-print-directory", "-C", REPO, "stop"], capture_output=True, text=True, env=env,
                             timeout=SLOW)
        assert (out.returncode, out.stdout) == (0, f"run-local: no make run is running on {self.var}\n"), out

    def check_stopped(self, how):
        pgid = self.proc.pid  # start_new_session: the script leads its group
        try:
            rc = self.proc.wait(timeout=SLOW)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            raise AssertionError(f"run-local.sh did not stop after {how}\n{self.logs()}")
        assert_no_sanitizer_report(self.stderr(), "run-local.sh")
        for name in os.listdir(os.path.join(self.var, "fleet")):
            if name.endswith(".log"):
                with open(os.path.join(self.var, "fleet", name), errors="replace") as f:
                    assert_no_sanitizer_report(f.read(), f"fleet {name}")
        assert rc == 0, f"run-local.sh exited with {rc}\n{self.logs()}"
        assert "run-local: gpurentd and the fleet stopped cleanly" in self.stdout(), self.logs()
        # Nothing it started is left: not in its process group, and no
        # process anywhere that still names its state directory.
        try:
            os.killpg(pgid, 0)
            raise AssertionError(f"processes remain in run-local.sh's group {pgid}")
        except ProcessLookupError:
            pass
        left = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if self.var in cmd:
                left.append((pid, cmd))
        assert not left, f"left running: {left}"

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


TOKEN_LINE = re.compile(r"^ +(gpk_[0-9a-z]{20}_[0-9a-f]{64})$", re.M)


def renter_walk(run, tmp_path, ssh_port):
    """The walk-through the banner suggests, up to a shell: sign up with the
    invite code, verify the address with the code from the log, add an SSH
    key, launch 8 x MI450 with ROCm PyTorch, watch it run, take its
    ssh-config and known_hosts lines. Returns the renter's auth header, the
    running instance and the ssh options that reach it."""
    r = requests.post(run.base + "/v1/signup", timeout=60, json={
        "email": "ada@example.com", "password": "correct horse battery", "invite_code": "AMD6GW"})
    assert r.status_code == 201, r.text
    key = r.json()["api_key"]["token"]
    auth = {"Authorization": f"Bearer {key}"}
    # Without smtp_url the verification code is in the daemon's log on
    # the terminal, as the banner says.
    code_line = re.compile(r"E-MAIL NOT SENT \(no smtp_url\): verify ada@example\.com with code (evc_[0-9a-z]{20})")
    code = poll(lambda: (code_line.search(run.stderr()) or None) and code_line.search(run.stderr()).group(1),
                30, "the verification code in the log")
    r = requests.post(run.base + "/v1/verify-email", timeout=30, json={"token": code})
    assert r.status_code == 200 and r.json()["credit"]["source"] == "invite:AMD6GW", r.text
    ssh_key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh_key)], check=True)
    r = requests.post(run.base + "/v1/ssh-keys", headers=auth, timeout=30,
                      json={"name": "laptop", "public_key": (tmp_path / "id_ed25519.pub").read_text()})
    assert r.status_code == 201, r.text
    r = requests.post(run.base + "/v1/instances", headers=auth, timeout=30,
                      json={"gpu_type": "MI450", "card_count": 8, "image": "rocm/pytorch:2.3-rocm6.2"})
    assert r.status_code == 201, r.text
    inst_id = r.json()["id"]

    def running():
        i = requests.get(f"{run.base}/v1/instances/{inst_id}", headers=auth, timeout=30).json()
        assert i["state"] in ("pending", "provisioning", "running"), i
        return i["state"] == "running" and i
    inst = poll(running, SLOW, "the instance to run")
    assert len(inst["nodes"]) == 1 and len(inst["nodes"][0]["cards"]) == 8, inst

    # In as the banner says: its ssh-config and known_hosts lines.
    r = requests.get(f"{run.base}/v1/instances/{inst_id}/ssh-config", headers=auth, timeout=30)
    assert r.status_code == 200, r.text
    (tmp_path / "gpurent.ssh").write_text(r.text)
    (tmp_path / "gpurent.known_hosts").write_text(inst["nodes"][0]["ssh"]["known_hosts"] + "\n")
    opts = ["-F", str(tmp_path / "gpurent.ssh"), "-i", str(ssh_key), "-o", "IdentitiesOnly=yes",
            "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={tmp_path / 'gpurent.known_hosts'}"]
    assert inst["nodes"][0]["ssh"]["port"] in range(ssh_port, ssh_port + 4), inst
    return auth, inst, opts


def test_run_local_end_to_end(tmp_path):
    var = tmp_path / "state"
    port = free_port_block(5)  # the daemon, three fleets and the gateway
    ssh_port = free_port_block(7)  # one SSH port per node
    key_file = var / "admin.key"

    # First run: a new database, so the banner shows the new admin key once.
    started = time.time()
    run = RunLocal(var, port, ssh_port, "first")
    try:
        banner = run.wait_banner()
        assert f"gpurent is running at {run.base}   (database {var}/gpurent.db)" in banner, banner
        keys = TOKEN_LINE.findall(banner)
        assert len(keys) == 1, banner
        admin_key = keys[0]
        assert banner.count(admin_key) == 1, "the key is shown once"
        with open(key_file) as f:
            assert f.read() == admin_key + "\n"
        assert mode(key_file) == 0o600 and mode(var) == 0o700
        for model, n in FLEET_NODES.items():
            assert re.search(rf"^   {re.escape(model)} +{n} x 8 cards .* {n} registered, 0 kept, 0 failed$",
                             banner, re.M), banner
        run.wait_nodes_ready(admin_key, started)
        # Every command the banner prints is whole on its lines: a line that
        # goes on ends in a backslash (an unescaped one in the script's
        # here-document joined two lines into one, with a run of spaces).
        assert not re.search(r"[^\s#] {4,}(--json|\||>) ", banner), banner
        assert f"as does 'GPURENT_VAR={var} make stop' in another" in banner, banner

        # H100-SXM, which the seed catalog leaves unpriced, has a price on
        # a new database, so README's reservation example can book its node:
        # 8 cards for 3 hours quote 48.00 (the renter's trial credit does
        # not cover it: 402 with the price).
        types = {t["code"]: t for t in requests.get(run.base + "/v1/gpu-types", timeout=30).json()["data"]}
        assert types["H100-SXM"]["price_per_card_hour"] == "2.00", types["H100-SXM"]

        auth, inst, opts = renter_walk(run, tmp_path, ssh_port)
        inst_id = inst["id"]
        r = requests.post(run.base + "/v1/reservations", headers=auth, timeout=30, json={
            "gpu_type": "H100-SXM", "cards": 8,
            "starts_at": (datetime.datetime.now(datetime.timezone.utc).replace(minute=0, second=0, microsecond=0)
                          + datetime.timedelta(days=7)).strftime("%Y-%m-%dT%H:00:00Z"),
            "ends_at": (datetime.datetime.now(datetime.timezone.utc).replace(minute=0, second=0, microsecond=0)
                        + datetime.timedelta(days=7, hours=3)).strftime("%Y-%m-%dT%H:00:00Z")})
        assert r.status_code == 402 and r.json()["error"]["price"] == "48.00", r.text
        out = subprocess.run(["ssh", *opts, f"{inst_id}-0", "echo in-the-instance"], capture_output=True,
                             text=True, timeout=SLOW)
        assert (out.returncode, out.stdout) == (0, "in-the-instance\n"), out
        out = subprocess.run(["scp", *opts, os.path.join(REPO, "README.md"), f"{inst_id}-0:/shared/"],
                             capture_output=True, text=True, timeout=SLOW)
        assert out.returncode == 0, out
        volumes = list((var / "volumes").iterdir())
        assert len(volumes) == 1 and (volumes[0] / "README.md").read_bytes() == \
            open(os.path.join(REPO, "README.md"), "rb").read()

        run.interrupt()
    finally:
        run.kill()

    # Second run on the same state: the same nodes come back, and no key is
    # printed (the banner points at the saved one).
    started = time.time()
    run = RunLocal(var, port, ssh_port, "second")
    try:
        banner = run.wait_banner()
        assert not re.search(r"gpk_[0-9a-z]", banner), banner
        assert f" The admin API key from the first run is in {key_file}." in banner, banner
        with open(key_file) as f:
            assert f.read() == admin_key + "\n"
        with open(var / "gpurentd.stdout") as f:
            assert "gpk_" not in f.read(), "gpurentd printed a key on an old database"
        for model, n in FLEET_NODES.items():
            assert re.search(rf"^   {re.escape(model)} +{n} x 8 cards .* 0 registered, {n} kept, 0 failed$",
                             banner, re.M), banner
        nodes = run.wait_nodes_ready(admin_key, started)
        assert len({n["id"] for n in nodes}) == sum(FLEET_NODES.values())
        # The H100-SXM price was set once, by the first run.
        prices = run.admin(admin_key, "/v1/admin/audit?action=price")["data"]
        assert [(a["target"], a["amount"]) for a in prices] == [("H100-SXM", "2.00")], prices
        # The instance of the first run is still there, on its node (the sim
        # agents reload their workload records).
        again = requests.get(f"{run.base}/v1/instances/{inst_id}", headers=auth, timeout=30).json()
        assert again["state"] == "running" and again["nodes"] == inst["nodes"], again
        run.make_stop()
    finally:
        run.kill()


GATEWAY = os.environ.get("GPURENT_GATEWAY") or os.path.join(os.path.dirname(GPURENTD), "gpurent-gateway")


def run_local_refused(tmp_path, extra_env):
    """Runs scripts/run-local.sh with extra_env, expecting it to refuse
    before it starts anything; returns (status, stderr). One that starts
    instead is stopped (its whole process group) and fails the test."""
    var = tmp_path / "state"
    env = {**sanitizer_env(), "GPURENT_VAR": str(var), "GPURENTD": GPURENTD, "GPURENT_AGENT": AGENT,
           "GPURENT_GATEWAY_BIN": GATEWAY, **extra_env}
    proc = subprocess.Popen(["bash", RUN_LOCAL], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=env, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=SLOW)
        raise AssertionError(f"run-local.sh started instead of refusing\n{out[-2000:]}\n{err[-2000:]}")
    assert not var.exists(), "a refused start made its state directory"
    return proc.returncode, err


@pytest.mark.parametrize("variable, value, message", [
    # A word was read by bash's arithmetic as a variable's name (unbound,
    # under set -u), and 80x as a number in a bad base, before the check
    # that names the variable.
    ("GPURENT_PORT", "abc", "run-local: GPURENT_PORT must be a port number, not 'abc'"),
    ("GPURENT_PORT", "80x", "run-local: GPURENT_PORT must be a port number, not '80x'"),
    # The gateway's port was not checked at all.
    ("GPURENT_GATEWAY_PORT", "x", "run-local: GPURENT_GATEWAY_PORT must be a port number, not 'x'"),
    ("GPURENT_PORT", "65532",
     "run-local: the gateway's port 65536 is not from 1 to 65535 (GPURENT_GATEWAY_PORT, default GPURENT_PORT+4)"),
])
def test_run_local_refuses_bad_ports(tmp_path, variable, value, message):
    env = {"GPURENT_PORT": str(free_port_block(5)), "GPURENT_SSH_PORT": str(free_port_block(7)), variable: value}
    status, err = run_local_refused(tmp_path, env)
    assert (status, err) == (2, message + "\n")


def test_run_local_refuses_a_busy_gateway_port(tmp_path):
    """The gateway's port is checked with the others before anything
    starts; it was not, so the gateway failed in its log while the banner
    sent the marketplace's calls to whatever held the port."""
    port = free_port_block(5)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port + 4))
        holder.listen()
        status, err = run_local_refused(tmp_path, {"GPURENT_PORT": str(port),
                                                   "GPURENT_SSH_PORT": str(free_port_block(7))})
    assert status == 1 and f"run-local: something already listens on 127.0.0.1:{port + 4};" in err, err


def test_run_local_default_state_is_absolute(tmp_path):
    """Without GPURENT_VAR the state is the var/ of the repository, named by
    its absolute path: the fleets' state directories are under it, and a sim
    shell's HOME (and a cluster's GPURENT_HOSTFILE) are paths there, which
    must resolve from the container directory the shell starts in. (With a
    relative var/, HOME was var/fleet/…, and `cd` in a shell failed.) The
    script runs from a copy of the repository's layout, so that its var/
    is the test's."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    script = repo / "scripts" / "run-local.sh"
    shutil.copy(RUN_LOCAL, script)
    os.symlink(os.path.join(REPO, "conf"), repo / "conf")
    os.symlink(os.path.join(REPO, "console"), repo / "console")
    var = repo / "var"
    port = free_port_block(5)
    ssh_port = free_port_block(7)
    started = time.time()
    run = RunLocal(var, port, ssh_port, "default-var", script=script, var_from_env=False)
    try:
        banner = run.wait_banner()
        assert f"gpurent is running at {run.base}   (database {var}/gpurent.db)" in banner, banner
        assert "as does 'make stop' in another" in banner, banner
        admin_key = TOKEN_LINE.findall(banner)[0]
        run.wait_nodes_ready(admin_key, started)
        auth, inst, opts = renter_walk(run, tmp_path, ssh_port)
        out = subprocess.run(["ssh", *opts, f"{inst['id']}-0", 'cd && pwd && test -d shared && echo "$HOME"'],
                             capture_output=True, text=True, timeout=SLOW)
        assert out.returncode == 0, out
        home, again = out.stdout.splitlines()
        assert home == again and home.startswith(f"{var}/fleet/"), out
        run.interrupt()
    finally:
        run.kill()
