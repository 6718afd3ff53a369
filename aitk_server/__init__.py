"""The aitk web UI server: a JSON API over the trainer, jobs as run.py children."""
