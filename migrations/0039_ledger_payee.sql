-- 0039_ledger_payee: an app call's transaction is the consumer's (user_id)
-- and also the publisher's, whose cash its earning went to. Transactions
-- and statements list a user's transactions by user_id; without the payee
-- the publisher's statement had no line for an earning its balance held,
-- and listing by user_id alone summed the publisher's leg into the
-- consumer's line.
ALTER TABLE ledger_transactions ADD COLUMN payee_id TEXT REFERENCES users (id);  -- app_call: the publisher its earning went to (NULL when it earned nothing); NULL for every other kind

-- The calls charged before: the user whose cash account was credited.
UPDATE ledger_transactions
   SET payee_id = (SELECT a.user_id FROM ledger_postings p JOIN ledger_accounts a ON a.id = p.account_id
                    WHERE p.transaction_id = ledger_transactions.id AND a.kind = 'cash' AND p.amount > 0)
 WHERE kind = 'app_call';

CREATE INDEX ledger_transactions_by_payee ON ledger_transactions (payee_id, id) WHERE payee_id IS NOT NULL;
