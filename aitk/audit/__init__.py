"""Audits a careful user runs before spending GPU hours or publishing a LoRA:
`python -m aitk audit config|dataset|adapter ...` (see aitk/cli/audit.py)."""
