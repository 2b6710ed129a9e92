"""test_agent_sftp.py: `gpurent-agent sftp-server --root DIR` against the real
OpenSSH clients in direct mode (`sftp -D`, `scp -D`: they run the server
program themselves, no SSH in between), and against a small raw SFTP client
for the bounds no real client crosses. What must hold: files go in and out
whole (checksums), `/shared/...` names the root, `ls -l` looks like ls, and no
path, `..` or symlink (absolute or relative, made on the host or through
sftp) lets a client read or write outside DIR.

The server runs through a wrapper that keeps its stderr and exit status in a
log, so every test also checks that it ended with 0 and without a sanitizer
report."""
import ctypes
import hashlib
import os
import struct
import subprocess
import threading

import pytest

from agent_util import AGENT, assert_no_sanitizer_report

DATA_MAX = 256 * 1024 - 1024  # sftp.h's SFTP_DATA_MAX
HANDLES_MAX = 64


class Served:
    """A root, a directory beside it that must stay untouched, and the
    wrapper that runs the server on the root."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.root = tmp / "root"
        self.outside = tmp / "outside"
        self.work = tmp / "work"  # the client's local directory
        for d in (self.root, self.outside, self.work):
            d.mkdir()
        (self.outside / "secret").write_text("outside secret\n")
        self.log = tmp / "server.log"
        self.wrapper = tmp / "sftp-server.sh"
        self.wrapper.write_text(
            "#!/bin/sh\n"
            f"'{AGENT}' sftp-server --root '{self.root}' 2>>'{self.log}'\n"
            f"echo \"exit=$?\" >>'{self.log}'\n")
        self.wrapper.chmod(0o755)

    def sftp(self, batch, ok=True):
        """Runs sftp's batch mode; a command prefixed with '-' may fail
        without ending the batch."""
        p = subprocess.run(["sftp", "-q", "-D", str(self.wrapper), "-b", "-"], input=batch, text=True,
                           capture_output=True, cwd=self.work, timeout=60)
        if ok:
            assert p.returncode == 0, f"sftp failed:\n{p.stdout}\n{p.stderr}\nlog:\n{self.server_log()}"
        return p

    def scp(self, *args):
        return subprocess.run(["scp", "-q", "-D", str(self.wrapper), *args], text=True, capture_output=True,
                              cwd=self.work, timeout=60)

    def server_log(self):
        return self.log.read_text() if self.log.exists() else ""

    def check_server_exits(self):
        text = self.server_log()
        assert_no_sanitizer_report(text, "gpurent-agent sftp-server")
        exits = [line for line in text.splitlines() if line.startswith("exit=")]
        assert exits and all(e == "exit=0" for e in exits), text

    def outside_untouched(self):
        assert sorted(os.listdir(self.outside)) == ["secret"]
        assert (self.outside / "secret").read_text() == "outside secret\n"
        assert set(os.listdir(self.tmp)) - {"server.log"} == {"outside", "root", "sftp-server.sh", "work"}


@pytest.fixture
def served(tmp_path):
    s = Served(tmp_path)
    yield s
    s.outside_untouched()


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_put_get_binary_through_root_and_shared(served):
    big = served.work / "big.bin"
    big.write_bytes(os.urandom(3 * 1024 * 1024 + 12345))  # many packets, a partial last one
    small = served.work / "small.bin"
    small.write_bytes(bytes(range(256)) * 3)
    p = served.sftp("pwd\nput big.bin\nput small.bin /shared/x.bin\ncd /shared\npwd\n"
                    "get x.bin x-back.bin\nget /big.bin big-back.bin\nget /shared/big.bin big-back2.bin\n")
    assert p.stdout.count("Remote working directory: /shared\n") == 2, p.stdout
    assert sha(served.root / "big.bin") == sha(big)
    assert sha(served.root / "x.bin") == sha(small)
    assert sha(served.work / "x-back.bin") == sha(small)
    assert sha(served.work / "big-back.bin") == sha(big)
    assert sha(served.work / "big-back2.bin") == sha(big)
    served.check_server_exits()


def test_a_directory_named_shared_in_the_volume_is_reached_by_its_relative_name(served):
    """A session starts at /shared, so a relative "shared/f" is the
    volume's own shared/f, not its top-level f (cd shared used to land at
    the top, and a put through it replaced the top-level file)."""
    (served.root / "shared").mkdir()
    (served.root / "shared" / "alias.txt").write_text("INNER")
    (served.root / "alias.txt").write_text("TOP")
    (served.work / "new.txt").write_text("NEW")
    p = served.sftp("cd shared\npwd\nget alias.txt inner.txt\ncd /shared\nput new.txt shared/alias.txt\n"
                    "get /shared/alias.txt top.txt\n")
    assert "Remote working directory: /shared/shared\n" in p.stdout, p.stdout
    assert (served.work / "inner.txt").read_text() == "INNER"
    assert (served.root / "shared" / "alias.txt").read_text() == "NEW"
    assert (served.root / "alias.txt").read_text() == "TOP" == (served.work / "top.txt").read_text()
    served.check_server_exits()


def opens_of(path, action):
    """How many times path was opened (inotify IN_OPEN) while action ran."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    assert fd >= 0
    try:
        assert libc.inotify_add_watch(fd, str(path).encode(), 0x20) >= 0  # IN_OPEN
        action()
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return 0
        count, at = 0, 0
        while at < len(data):
            _, _, _, name_len = struct.unpack_from("iIII", data, at)
            count, at = count + 1, at + 16 + name_len
        return count
    finally:
        os.close(fd)


def test_a_special_file_in_the_volume_is_refused_without_being_opened(served):
    """Only regular files are opened: a FIFO or a device node someone made
    in the volume is refused before it is opened (an open of a device can
    act by itself, and this server runs as the agent's user). Here a FIFO
    with a reader, which an open for writing would reach."""
    os.mkfifo(served.root / "pipe")
    reader = os.open(served.root / "pipe", os.O_RDONLY | os.O_NONBLOCK)
    (served.work / "f").write_bytes(b"payload")
    try:
        p = None

        def put():
            nonlocal p
            p = served.sftp("-put f pipe\n", ok=False)
        assert opens_of(served.root / "pipe", put) == 0, p.stdout + p.stderr
        assert "Failure" in p.stdout + p.stderr, p.stdout + p.stderr
        assert os.read(reader, 100) == b""
    finally:
        os.close(reader)
    # A regular file is still opened, written and read.
    served.sftp("put f\nget f back\n")
    assert (served.work / "back").read_bytes() == b"payload"
    served.check_server_exits()


def test_ls_long_mkdir_rename_chmod_rm_rmdir(served):
    (served.work / "f").write_bytes(b"12345")
    served.sftp("put f\nmkdir d\nrename f d/g\nchmod 640 d/g\n")
    assert not (served.root / "f").exists()
    g = served.root / "d" / "g"
    assert g.read_bytes() == b"12345" and (g.stat().st_mode & 0o777) == 0o640
    assert (served.root / "d").is_dir()
    p = served.sftp("ls -l\nls -l d\n")
    lines = p.stdout.splitlines()
    dline = next(line for line in lines if line.endswith(" d"))
    gline = next(line for line in lines if line.endswith(" g"))
    assert dline.startswith("drwx"), dline
    fields = gline.split()
    assert fields[0] == "-rw-r-----" and fields[4] == "5", gline
    assert fields[2] == str(os.getuid()) and fields[3] == str(os.getgid()), gline
    # RENAME of v3 does not replace; sftp's rename uses posix-rename, which does.
    (served.root / "h").write_bytes(b"old")
    served.sftp("rename d/g h\n")
    assert (served.root / "h").read_bytes() == b"12345"
    p = served.sftp("-rmdir /\n-rm /\n-rmdir nothing\nrm h\nrmdir d\n")
    assert "nothing" in p.stderr
    assert os.listdir(served.root) == []
    served.check_server_exits()


def test_preserve_resume_fsync_df_hardlink(served):
    f = served.work / "f.bin"
    f.write_bytes(os.urandom(600 * 1024))
    f.chmod(0o600)
    os.utime(f, (1600000000, 1600000000))
    # A partial upload left behind, completed by reput.
    (served.root / "part.bin").write_bytes(f.read_bytes()[:100 * 1024])
    p = served.sftp("put -p f.bin kept.bin\nput -f f.bin synced.bin\nreput f.bin part.bin\nln synced.bin hard.bin\n"
                    "df\n")
    kept = (served.root / "kept.bin").stat()
    assert kept.st_mtime == 1600000000 and (kept.st_mode & 0o777) == 0o600
    assert sha(served.root / "synced.bin") == sha(f) and sha(served.root / "part.bin") == sha(f)
    assert (served.root / "hard.bin").stat().st_ino == (served.root / "synced.bin").stat().st_ino
    assert "Avail" in p.stdout, p.stdout
    # No set-user-ID or set-group-ID bits through chmod.
    p = served.sftp("-chmod 4755 kept.bin\n-chmod 2755 kept.bin\nchmod 1755 kept.bin\n")
    assert (served.root / "kept.bin").stat().st_mode & 0o7777 == 0o1755
    assert p.stderr.count("Permission denied") == 2, p.stderr
    served.check_server_exits()


def test_dotdot_stays_inside_the_root(served):
    (served.work / "f").write_bytes(b"payload")
    p = served.sftp("-get ../outside/secret s1\n-get ../../../../../etc/passwd s2\n-get /../outside/secret s3\n"
                    "cd ..\ncd ../..\npwd\n-put f ../escaped\n-put f ../../outside/escaped2\n"
                    "-mkdir ../outside/newdir\n-rename ../outside/secret stolen\n-rm ../outside/secret\n")
    assert "Remote working directory: /shared\n" in p.stdout
    for name in ("s1", "s2", "s3"):
        assert not (served.work / name).exists()
    # A ".." past the root is the root: what the client wrote landed inside.
    assert (served.root / "escaped").read_bytes() == b"payload"
    assert not (served.root / "outside").exists() and not (served.tmp / "escaped").exists()
    assert not (served.root / "stolen").exists()
    served.check_server_exits()


def test_host_symlinks_pointing_outside_do_not_leave_the_root(served):
    (served.work / "f").write_bytes(b"payload")
    os.symlink(str(served.outside), served.root / "abs")
    os.symlink("../outside", served.root / "rel")
    os.symlink("/etc", served.root / "etc")
    os.symlink(str(served.outside / "created"), served.root / "dangling-abs")
    os.symlink("../outside/created-rel", served.root / "dangling-rel")
    p = served.sftp("-get abs/secret s1\n-get rel/secret s2\n-get etc/passwd s3\n-put f abs/new1\n"
                    "-put f rel/new2\n-put f dangling-abs\n-put f dangling-rel\n-cd abs\n-ls abs\n"
                    "-chmod 777 abs/secret\n-mkdir abs/dir\n")
    for name in ("s1", "s2", "s3"):
        assert not (served.work / name).exists(), p.stdout
    assert (served.outside / "secret").stat().st_mode & 0o777 != 0o777
    # Followed inside the root, the links name what the root holds there.
    (served.root / "etc").unlink()
    (served.root / "etc").mkdir()
    (served.root / "etc" / "passwd").write_text("the root's own passwd\n")
    (served.root / "data").mkdir()
    (served.root / "data" / "inside").write_text("inside\n")
    os.symlink("/data", served.root / "abs-in")
    os.symlink("../../data/./inside", served.root / "data" / "rel-in")
    served.sftp("get etc/passwd p\nget abs-in/inside i1\nget data/rel-in i2\n")
    assert (served.work / "p").read_text() == "the root's own passwd\n"
    assert (served.work / "i1").read_text() == "inside\n"
    assert (served.work / "i2").read_text() == "inside\n"
    served.check_server_exits()


def test_symlinks_made_through_sftp(served):
    (served.work / "f").write_bytes(b"through a link")
    served.sftp(f"put f\nmkdir sub\nput f sub/g\nln -s sub/g rel-link\nln -s /sub/g abs-link\n"
                f"ln -s {served.outside}/secret out-abs\nln -s ../outside/secret out-rel\n"
                "get rel-link r1\nget abs-link r2\n-get out-abs r3\n-get out-rel r4\n-put f out-abs\n")
    # Targets are stored as given and followed inside the root.
    assert os.readlink(served.root / "out-abs") == f"{served.outside}/secret"
    assert os.readlink(served.root / "abs-link") == "/sub/g"
    assert (served.work / "r1").read_bytes() == b"through a link"
    assert (served.work / "r2").read_bytes() == b"through a link"
    assert not (served.work / "r3").exists() and not (served.work / "r4").exists()
    p = served.sftp("ls -l\n")
    assert any(line.startswith("l") and line.endswith(" rel-link") for line in p.stdout.splitlines()), p.stdout
    served.check_server_exits()


def test_scp_put_get_and_escape(served):
    if "-D" not in subprocess.run(["scp"], capture_output=True, text=True).stderr:
        pytest.skip("this scp has no -D")
    data = served.work / "model.bin"
    data.write_bytes(os.urandom(700 * 1024))
    p = served.scp(str(data), "node:/shared/model.bin")
    assert p.returncode == 0, p.stderr + served.server_log()
    assert sha(served.root / "model.bin") == sha(data)
    p = served.scp("node:/shared/model.bin", str(served.work / "back.bin"))
    assert p.returncode == 0, p.stderr
    assert sha(served.work / "back.bin") == sha(data)
    p = served.scp("node:../outside/secret", str(served.work / "stolen"))
    assert p.returncode != 0 and not (served.work / "stolen").exists()
    os.symlink("../outside", served.root / "rel")
    p = served.scp(str(data), "node:rel/planted")
    assert p.returncode != 0
    served.check_server_exits()


# ---- a raw client, for what real clients never send ----

class Raw:
    def __init__(self, served):
        self.p = subprocess.Popen([AGENT, "sftp-server", "--root", str(served.root)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.id = 0

    def send(self, payload):
        self.p.stdin.write(struct.pack(">I", len(payload)) + payload)
        self.p.stdin.flush()

    def recv(self):
        n = struct.unpack(">I", self.p.stdout.read(4))[0]
        return self.p.stdout.read(n)

    def request(self, ptype, body):
        self.id += 1
        self.send(bytes([ptype]) + struct.pack(">I", self.id) + body)
        r = self.recv()
        assert struct.unpack(">I", r[1:5])[0] == self.id
        return r[0], r[5:]

    def finish(self):
        self.p.stdin.close()
        rc = self.p.wait(timeout=30)
        err = self.p.stderr.read().decode()
        assert_no_sanitizer_report(err, "gpurent-agent sftp-server")
        return rc, err


def s(b):
    b = b.encode() if isinstance(b, str) else b
    return struct.pack(">I", len(b)) + b


def status(body):
    code = struct.unpack(">I", body[:4])[0]
    n = struct.unpack(">I", body[4:8])[0]
    return code, body[8:8 + n].decode()


def handle(t, body):
    assert t == 102, status(body)
    n = struct.unpack(">I", body[:4])[0]
    return body[4:4 + n]


@pytest.fixture
def raw(served):
    r = Raw(served)
    r.send(bytes([1]) + struct.pack(">I", 3))
    v = r.recv()
    assert v[0] == 2 and struct.unpack(">I", v[1:5])[0] == 3
    assert b"posix-rename@openssh.com" in v and b"limits@openssh.com" in v
    yield r
    if r.p.poll() is None:
        rc, err = r.finish()
        assert rc == 0, err


def test_raw_realpath_normalises_inside_the_root(raw):
    # Answered as the container names it, under /shared, where a session
    # starts: a relative "shared/y" is the volume's own shared/y.
    for given, want in [(".", "/shared"), ("", "/shared"), ("/shared", "/shared"),
                        ("/shared/../../a/./b//c/..", "/shared/a/b"), ("../../x", "/shared/x"),
                        ("shared/y", "/shared/shared/y"), ("/sharedz", "/shared/sharedz"),
                        ("/a/shared/b", "/shared/a/shared/b")]:
        t, body = raw.request(16, s(given))
        assert t == 104, status(body)
        assert struct.unpack(">I", body[:4])[0] == 1
        n = struct.unpack(">I", body[4:8])[0]
        assert body[8:8 + n].decode() == want, given


def test_raw_bounds_and_statuses(served, raw):
    (served.root / "data").write_bytes(os.urandom(DATA_MAX + 5000))
    h = handle(*raw.request(3, s("data") + struct.pack(">II", 1, 0)))
    # A READ longer than the bound is answered with the bound.
    t, body = raw.request(5, s(h) + struct.pack(">QI", 0, 10 * 1024 * 1024))
    assert t == 103 and struct.unpack(">I", body[:4])[0] == DATA_MAX
    t, body = raw.request(5, s(h) + struct.pack(">QI", 1 << 40, 10))
    assert t == 101 and status(body)[0] == 1  # EOF
    # A handle closed, or never given, finds nothing.
    t, body = raw.request(4, s(h))
    assert t == 101 and status(body)[0] == 0
    t, body = raw.request(5, s(h) + struct.pack(">QI", 0, 10))
    assert t == 101 and status(body) == (4, "invalid handle (not open, or already closed)")
    # A path with a NUL, a truncated request: bad message.
    t, body = raw.request(17, s(b"da\0ta"))
    assert t == 101 and status(body)[0] == 5
    t, body = raw.request(17, struct.pack(">I", 100) + b"short")
    assert t == 101 and status(body)[0] == 5
    # Open handles are bounded.
    handles = [handle(*raw.request(3, s("data") + struct.pack(">II", 1, 0))) for _ in range(HANDLES_MAX)]
    t, body = raw.request(3, s("data") + struct.pack(">II", 1, 0))
    assert t == 101 and status(body) == (4, "too many open handles (the limit is 64)")
    for x in handles:
        assert status(raw.request(4, s(x))[1])[0] == 0
    # RENAME (v3) refuses to replace; the owner cannot be changed.
    (served.root / "other").write_bytes(b"x")
    t, body = raw.request(18, s("data") + s("/shared/other"))
    assert t == 101 and status(body)[0] == 4 and (served.root / "other").read_bytes() == b"x"
    t, body = raw.request(9, s("other") + struct.pack(">III", 2, os.getuid() + 1, os.getgid()))
    assert t == 101 and status(body)[0] == 3
    # OPEN of a directory, unknown requests and extensions.
    (served.root / "dir").mkdir()
    t, body = raw.request(3, s("dir") + struct.pack(">II", 1, 0))
    assert t == 101 and status(body) == (4, "is a directory")
    t, body = raw.request(99, b"")
    assert t == 101 and status(body)[0] == 8
    t, body = raw.request(200, s("nonsense@example.com"))
    assert t == 101 and status(body)[0] == 8
    # A mode given at create time loses set-user-ID and set-group-ID.
    t, body = raw.request(3, s("suid") + struct.pack(">III", 0x2 | 0x8, 0x4, 0o6755))
    assert status(raw.request(4, s(handle(t, body)))[1])[0] == 0
    assert (served.root / "suid").stat().st_mode & 0o7777 == 0o755
    # Removing or renaming the root itself is refused.
    t, body = raw.request(15, s("/shared"))
    assert t == 101 and status(body)[0] == 3
    t, body = raw.request(18, s("/") + s("/moved"))
    assert t == 101 and status(body)[0] == 3


def test_raw_swapping_a_directory_for_a_symlink_never_reaches_outside(served, raw):
    """While the host swaps a directory of the root for symlinks to the
    outside (absolute and relative) as fast as it can, every read through
    the swapped name gets the root's file or an error, never the outside's."""
    (served.root / "real").mkdir()
    (served.root / "real" / "secret").write_text("inside\n")
    os.symlink(str(served.outside), served.root / "abs")
    os.symlink("../outside", served.root / "rel")
    stop = threading.Event()

    def swap():
        names = ["real", "abs", "rel"]
        i = 0
        while not stop.is_set():
            os.rename(served.root / names[i % 3], served.root / "swap")
            os.rename(served.root / "swap", served.root / names[i % 3])
            i += 1

    t = threading.Thread(target=swap)
    t.start()
    try:
        seen = set()
        for _ in range(2000):
            for name in ("swap/secret", "/shared/swap/../swap/secret"):
                ptype, body = raw.request(3, s(name) + struct.pack(">II", 1, 0))
                if ptype != 102:
                    continue
                h = handle(ptype, body)
                ptype, body = raw.request(5, s(h) + struct.pack(">QI", 0, 4096))
                assert ptype == 103
                seen.add(body[4:])
                assert status(raw.request(4, s(h))[1])[0] == 0
    finally:
        stop.set()
        t.join()
    assert seen <= {b"inside\n"}, seen


def test_raw_oversized_packet_ends_the_session(raw):
    raw.p.stdin.write(struct.pack(">I", 256 * 1024 + 1) + b"\x03")
    raw.p.stdin.flush()
    rc, err = raw.finish()
    assert rc == 1 and "at most 262144 are accepted" in err


def test_raw_request_before_init_ends_the_session(served):
    r = Raw(served)
    r.send(bytes([17]) + struct.pack(">I", 1) + s("/"))
    rc, err = r.finish()
    assert rc == 1 and "before INIT" in err


def test_usage_errors(served):
    p = subprocess.run([AGENT, "sftp-server"], capture_output=True, text=True)
    assert p.returncode == 2 and "--root DIR" in p.stderr
    p = subprocess.run([AGENT, "sftp-server", "--root", str(served.tmp / "missing")], capture_output=True,
                       text=True)
    assert p.returncode == 1 and "cannot open" in p.stderr
