"""Files that hold secrets are never readable by others, whatever the umask:
the database with its WAL and shared-memory files, backups (0600), and the
daemon refuses a payment webhook secret kept where others can read it."""
import os
import stat

from harness import Daemon, run_gpurentd, stop_all


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def with_umask(mask, fn):
    old = os.umask(mask)
    try:
        return fn()
    finally:
        os.umask(old)


def test_database_wal_and_backup_are_private_under_umask_000(tmp_path):
    d = with_umask(0, lambda: Daemon(tmp_path / "d"))
    try:
        r = d.post("/v1/signup", json={"email": "modes@example.test", "password": "correct horse battery"})
        assert r.status_code == 201, r.text
        for suffix in ("", "-wal", "-shm"):
            path = d.db_path + suffix
            assert os.path.exists(path), path
            assert mode(path) & 0o007 == 0, (path, oct(mode(path)))
        backup = tmp_path / "backup.db"
        p = with_umask(0, lambda: run_gpurentd("backup", str(backup), "--db", d.db_path, timeout=120))
        assert p.returncode == 0, p.stderr
        assert mode(backup) == 0o600, oct(mode(backup))
    finally:
        stop_all([d])


def test_a_database_others_could_read_is_made_private(tmp_path):
    d = Daemon(tmp_path / "d")
    stop_all([d])
    os.chmod(d.db_path, 0o644)
    d2 = Daemon(tmp_path / "d")
    try:
        assert mode(d2.db_path) & 0o007 == 0, oct(mode(d2.db_path))
        assert "was readable by others" in d2.stderr_text()
    finally:
        stop_all([d2])


def serve_check(tmp_path, conf_text, conf_mode=0o640):
    conf = tmp_path / "gpurentd.conf"
    conf.write_text(conf_text)
    os.chmod(conf, conf_mode)
    return run_gpurentd("serve", "-n", "-c", str(conf), "--db", str(tmp_path / "x.db"), timeout=60)


def test_webhook_secrets_others_can_read_are_refused(tmp_path):
    secret = tmp_path / "webhook.secret"
    secret.write_text("s3cret-key-of-the-payment-provider\n")
    for bad in (0o644, 0o604, 0o620):
        os.chmod(secret, bad)
        p = serve_check(tmp_path, f"payment_webhook_secret_file = {secret}\n")
        assert p.returncode != 0 and str(secret) in p.stderr and "others may read" in p.stderr, (oct(bad), p.stderr)
    os.chmod(secret, 0o600)
    p = serve_check(tmp_path, f"payment_webhook_secret_file = {secret}\n")
    assert p.returncode == 0, p.stderr
    assert "s3cret" not in p.stdout + p.stderr
    # Inline in a configuration file others may read: refused; 0640 is fine.
    p = serve_check(tmp_path, "payment_webhook_secret = inline-secret\n", 0o644)
    assert p.returncode != 0 and "others may read" in p.stderr, p.stderr
    p = serve_check(tmp_path, "payment_webhook_secret = inline-secret\n", 0o640)
    assert p.returncode == 0, p.stderr
    p = serve_check(tmp_path, f"payment_webhook_secret = x\npayment_webhook_secret_file = {secret}\n")
    assert p.returncode != 0 and "both set" in p.stderr, p.stderr
