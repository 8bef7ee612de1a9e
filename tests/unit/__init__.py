"""Pure unit tests: no model, no server (the wire functions, parsers, the
document, the contract checker, the CLI's flags)."""
