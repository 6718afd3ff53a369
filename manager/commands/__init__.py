"""One module per verb: each exposes `run(options) -> Result` and never prints."""
