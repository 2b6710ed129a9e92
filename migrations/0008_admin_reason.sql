-- 0008_admin_reason: the admin's reason for setting a node aside, kept apart
-- from the reason its heartbeats give, so a cordoned node that goes offline
-- and comes back still says why it was cordoned.
ALTER TABLE nodes ADD COLUMN admin_reason TEXT NOT NULL DEFAULT '';  -- why an admin set admin_state; '' when active

UPDATE nodes SET admin_reason = state_reason, state_reason = ''
WHERE admin_state <> 'active' AND health = 'up';
