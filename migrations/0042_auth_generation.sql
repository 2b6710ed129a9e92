-- 0042_auth_generation: a generation number for the daemon's cache of API
-- keys (http/auth.c), moved only by changes that decide whether a key
-- authenticates (issue 15).
--
-- The daemon dropped every cached key on every thread after any committed
-- change to api_keys or users: a key's last use (noted once a minute per
-- key), a new key at each login, a signup. With a few thousand keys in use
-- each minute that was several drops a second, and a key was read again on
-- almost every request. These triggers bump the number in the very
-- transaction that revokes a key, changes when it expires, its secret or
-- its owner, or suspends, reinstates or changes the role of a user; the
-- daemon watches this row as it watches catalog_generation (0026): through
-- SQLite's update hook for its own commits, and by reading the row at
-- least once a second for other processes' (the sqlite3 shell).
CREATE TABLE auth_generation (
    id  INTEGER PRIMARY KEY CHECK (id = 1),  -- the one row
    gen INTEGER NOT NULL                     -- bumped by every change to whether a key authenticates
) STRICT;
INSERT INTO auth_generation (id, gen) VALUES (1, 1);

CREATE TRIGGER auth_gen_key_update AFTER UPDATE OF user_id, secret_hash, revoked_at, expires_at ON api_keys
WHEN old.user_id IS NOT new.user_id OR old.secret_hash IS NOT new.secret_hash
     OR old.revoked_at IS NOT new.revoked_at OR old.expires_at IS NOT new.expires_at
BEGIN UPDATE auth_generation SET gen = gen + 1 WHERE id = 1; END;
CREATE TRIGGER auth_gen_key_delete AFTER DELETE ON api_keys
BEGIN UPDATE auth_generation SET gen = gen + 1 WHERE id = 1; END;
CREATE TRIGGER auth_gen_user_update AFTER UPDATE OF status, role ON users
WHEN old.status IS NOT new.status OR old.role IS NOT new.role
BEGIN UPDATE auth_generation SET gen = gen + 1 WHERE id = 1; END;
CREATE TRIGGER auth_gen_user_delete AFTER DELETE ON users
BEGIN UPDATE auth_generation SET gen = gen + 1 WHERE id = 1; END;
