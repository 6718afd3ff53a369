"""`save.push_to_hub`: at the end of a finished run, the output folder's LoRA files and
previews go to the Hugging Face repo `save.hf_repo_id` (created if missing, private with
`hf_private`), as upstream's trainer uploads its save folder.

What is uploaded: the LoRA files (`*.safetensors` at the folder's top: the final one and
the step saves kept), `samples/` and the loss log; never the checkpoints (optimizer
state), the config (it may name local paths) or the lock and status files.

The upload never fails the run: with `HF_HUB_OFFLINE` set, without a token
(`HF_TOKEN` or `huggingface-cli login`), or when the hub refuses or cannot be reached,
one line says why and where the files are.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

ALLOW = ["*.safetensors", "samples/*", "loss_log.jsonl"]


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def push_to_hub(folder: Path, repo_id: str, private: bool, say: Callable[[str], None],
                api: Any = None) -> bool:
    """Upload `folder` to `repo_id`; True when it was uploaded. `api`: an HfApi (a fake
    one in tests); None: huggingface_hub's, with the saved or HF_TOKEN token."""
    where = f"the files stay in {folder}"
    if _offline():
        say(f"push_to_hub: HF_HUB_OFFLINE is set; not uploaded to {repo_id} ({where})")
        return False
    try:
        import huggingface_hub
    except ImportError:
        say(f"push_to_hub: huggingface_hub is not installed; not uploaded ({where})")
        return False
    if api is None:
        if huggingface_hub.get_token() is None:
            say(f"push_to_hub: no Hugging Face token (set HF_TOKEN or run `hf auth "
                f"login`); not uploaded to {repo_id} ({where})")
            return False
        api = huggingface_hub.HfApi()
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        api.upload_folder(repo_id=repo_id, folder_path=str(folder), repo_type="model",
                          allow_patterns=ALLOW, commit_message="aitk: trained LoRA")
    except Exception as exc:  # noqa: BLE001 - HTTP, network, auth: never fails the run
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        say(f"push_to_hub: upload to {repo_id} failed ({exc.__class__.__name__}"
            f"{': ' + first if first else ''}); {where}")
        return False
    endpoint = str(getattr(api, "endpoint", None) or "https://huggingface.co").rstrip("/")
    say(f"push_to_hub: uploaded to {endpoint}/{repo_id}")
    return True
