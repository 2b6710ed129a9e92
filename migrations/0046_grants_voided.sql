-- Voided grants by their expiry, so that a billing pass finds at once the
-- few voided before their time (by a clock that ran ahead and has stepped
-- back since) to give their credit back, without reading every grant.
CREATE INDEX credit_grants_voided ON credit_grants (expires_at) WHERE voided_at IS NOT NULL;
