-- 0013_admin_actions: who did what with money. Every admin route that gives,
-- adds or prices money or changes a user's limits (grants, top-ups, invite
-- codes, prices, card limits, billing runs) writes one row here in the
-- transaction of the change it records (a billing run: just before the pass
-- runs), with the acting admin, the API key the request came with and the
-- admin's reason. Read by GET /v1/admin/audit and, for the billing team, by
-- report_admin_actions (docs/REPORTS.md). Rows are only ever added.
--
-- This migration reads and changes no table but its own, so it does not
-- depend on any migration after 0011.

CREATE TABLE admin_actions (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,  -- order: a later action has a larger id
    at            INTEGER NOT NULL,  -- epoch seconds on the daemon's clock when it was done
    admin_user_id TEXT NOT NULL REFERENCES users (id),  -- the admin whose API key made the request
    api_key_id    TEXT NOT NULL REFERENCES api_keys (id),  -- that key
    action        TEXT NOT NULL CHECK (action IN ('grant', 'topup', 'invite_code', 'price', 'limits', 'billing_run')),  -- what was done
    target        TEXT CHECK (target IS NULL OR length(target) BETWEEN 1 AND 63),  -- the user id (grant, topup, limits), GPU type (price) or invite code (invite_code); NULL for a billing run, which bills everyone
    amount        INTEGER CHECK (amount IS NULL OR amount >= 0),  -- micro-yuan granted, topped up, granted per redemption or charged per card-hour; NULL for limits and billing runs
    detail        TEXT NOT NULL CHECK (json_valid(detail) AND json_type(detail) = 'object'),  -- the request's effective values (defaults filled in) and the ids it made, as a JSON object
    reason        TEXT NOT NULL DEFAULT '' CHECK (length(reason) <= 500)  -- the admin's reason, 1 to 500 characters; '' when none was given
) STRICT;
-- The API's filters: what was done to one user, type or code, and by whom,
-- newest first.
CREATE INDEX admin_actions_by_target ON admin_actions (target, id);
CREATE INDEX admin_actions_by_admin ON admin_actions (admin_user_id, id);

-- Admin money actions, by the UTC day they were done, for the billing team
-- (gpurentd report admin-actions).
CREATE VIEW report_admin_actions AS
SELECT date(x.at, 'unixepoch') AS day,
       datetime(x.at, 'unixepoch') AS at,
       x.id AS action_id,
       x.action AS action,
       x.target AS target,
       x.amount AS amount_micro,
       x.admin_user_id AS admin_user_id,
       u.email AS admin_email,
       x.api_key_id AS api_key_id,
       x.reason AS reason,
       x.detail AS detail
FROM admin_actions x JOIN users u ON u.id = x.admin_user_id;
