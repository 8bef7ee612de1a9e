"""The decode loop: admission, the typed job queue, the KV ledger, the scheduler,
the solo and batched lanes, rows, stop matching and the solo -> batch handoff."""
