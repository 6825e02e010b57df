-- Per-destination rate limits (RATE_LIMITS in the policies module, issue 33): the publish loop sends
-- at most that many records per second to a destination. Its row keeps the earliest time the next
-- record may go (next_slot) and the last time handed to a job it put off (deferred_until): a round
-- that claims more of a destination's jobs than its rate allows publishes what the rate allows and
-- makes the rest due later, one slot each, so the due index ahead of the claim holds only what is due.
ALTER TABLE retry_destinations
    ADD COLUMN IF NOT EXISTS next_slot      timestamptz,
    ADD COLUMN IF NOT EXISTS deferred_until timestamptz;
