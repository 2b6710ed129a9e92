-- 0043_idempotency_location: the Location of an Idempotency-Key's first
-- answer, replayed with it. A replayed 201 without it would say, by RFC 9110
-- 15.3.2, that the request's own URI (the collection) was what was created.
-- Records made before this migration replay without one.
ALTER TABLE idempotency_keys ADD COLUMN location TEXT NOT NULL DEFAULT '' CHECK (length(location) <= 200);  -- the first answer's Location, '' when it had none
