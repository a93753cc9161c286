"""The sidecar: consumes one lane, tokenizes, forms cost-bounded batches, dispatches them to workers, settles."""
