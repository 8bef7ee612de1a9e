"""The decode loop: admission, the scheduler, the solo and batched lanes,
rows, stop matching and the solo -> batch handoff."""
