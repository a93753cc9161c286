"""The config service (`--role config`): the single writer of model configuration — validation, append-only
merge, persistence, epoch, idempotency and NATS deltas (seed 000 §3)."""
