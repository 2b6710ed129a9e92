"""A full disk under the database: writes are answered 503 unavailable with
Retry-After and a message saying storage is full (not 500 internal),
/readyz fails with the reason, /metrics says so, the log says it once, and
everything comes back by itself when space returns. The database lives on
a small tmpfs that a filler file fills; the log does not."""
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from harness import Daemon, assert_error, stop_all


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "fs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(path):
    """Writes a file until the file system is full (unbuffered, so the
    last partial write is all that fails)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 20, 65536, 4096, 512, 1):
            while True:
                try:
                    if os.write(fd, b"\0" * size) < size:
                        break
                except OSError:
                    break
    finally:
        os.close(fd)


def disk_full_gauge(d):
    r = d.get("/metrics", key=d.admin_key)
    assert r.status_code == 200, r.text
    return int(re.search(r"^gpurent_store_disk_full (\d)$", r.text, re.M).group(1))


def test_a_full_disk_is_503_and_comes_back(small_fs, tmp_path):
    # Only the database on the small file system: the daemon's log lives
    # elsewhere, as under journald, so that the line saying the disk is full
    # is not itself lost to the full disk.
    d = Daemon(tmp_path / "daemon", start=False, options={"max_api_keys_per_user": "10000"})
    d.db_path = str(small_fs / "gpurent.db")
    d.start()
    try:
        r = d.post("/v1/signup", json={"email": "full@example.test", "password": "correct horse battery"})
        assert r.status_code == 201, r.text
        key = r.json()["api_key"]["token"]
        assert disk_full_gauge(d) == 0
        fill(small_fs / "filler")

        # Writes fill what room the database had left, then fail.
        refused = None
        for i in range(20000):
            r = d.post("/v1/api-keys", key=key, json={"name": f"k{i}"})
            if r.status_code != 201:
                refused = r
                break
        assert refused is not None, "the writes never failed on a full file system"
        err = assert_error(refused, 503, "unavailable")
        assert "full" in err["message"], err
        assert refused.headers["Retry-After"].isdigit(), refused.headers
        r = d.get("/readyz")
        err = assert_error(r, 503, "unavailable")
        assert err["checks"] == {"storage": "full"} and "full" in err["message"], err
        assert "Retry-After" in r.headers
        assert disk_full_gauge(d) == 1
        # Reads still work.
        assert d.get("/v1/me", key=key).status_code == 200
        for _ in range(5):
            assert d.post("/v1/api-keys", key=key, json={"name": "again"}).status_code == 503
        assert d.stderr_text().count("file system is full") == 1, d.stderr_text()[-3000:]

        # Space returns: ready again and writes succeed, with nothing restarted.
        os.unlink(small_fs / "filler")
        assert d.get("/readyz").status_code == 200
        r = d.post("/v1/api-keys", key=key, json={"name": "after"})
        assert r.status_code == 201, r.text
        assert disk_full_gauge(d) == 0
        assert "has room again" in d.stderr_text()
        # One line said it, not one per failed write.
        assert d.stderr_text().count("disk is full") <= 1, d.stderr_text()[-3000:]
    finally:
        stop_all([d])


def test_no_write_refused_for_space_is_a_500_while_others_commit(small_fs, tmp_path):
    """Writers at once on a full disk: a small commit can still find room
    while a larger write fails, and that must not turn the larger one's
    answer into 500 internal. Every answer is done (2xx) or 503."""
    d = Daemon(tmp_path / "daemon", start=False, options={"max_api_keys_per_user": "10000", "threads": "4"})
    d.db_path = str(small_fs / "gpurent.db")
    d.start()
    try:
        users = [d.signup() for _ in range(4)]
        # A log with pages to reuse once checkpointed: small commits then
        # still fit while larger ones do not.
        for n in range(300):
            d.post(f"/v1/admin/users/{users[n % 4].id}/grants", key=d.admin_key, json={"amount": "0.01"})
        fill(small_fs / "filler")

        def writes(i):
            u, seen = users[i], []
            for n in range(150):
                if n % 2:
                    r = d.post("/v1/api-keys", key=u.key, json={"name": f"k{n}"})
                else:
                    r = d.post(f"/v1/admin/users/{u.id}/grants", key=d.admin_key,
                               json={"amount": "0.01", "reason": "x" * (1 + n % 120)})
                seen.append((r.status_code, r.text[:200]))
            return seen

        with ThreadPoolExecutor(4) as pool:
            answers = [a for seen in pool.map(writes, range(4)) for a in seen]
        assert {status for status, _ in answers} & {503}, "the writes never failed on a full file system"
        assert {status for status, _ in answers} <= {201, 503}, [a for a in answers if a[0] not in (201, 503)][:5]
        os.unlink(small_fs / "filler")
    finally:
        stop_all([d])
