"""`save.push_to_hub` (aitk.run.hub) against a fake HfApi: what is uploaded, and each
way it does not upload (offline, no token, the hub refusing) is one line, never a
failed run. Nothing talks to the real hub."""

from __future__ import annotations

from pathlib import Path

import pytest

from aitk.run.hub import push_to_hub


class FakeApi:
    endpoint = "http://127.0.0.1:9"

    def __init__(self, fail: Exception | None = None) -> None:
        self.calls: list[tuple[str, dict]] = []
        self.fail = fail

    def create_repo(self, repo_id: str, **kw) -> None:
        self.calls.append(("create_repo", {"repo_id": repo_id, **kw}))
        if self.fail is not None:
            raise self.fail

    def upload_folder(self, **kw) -> None:
        self.calls.append(("upload_folder", kw))


@pytest.fixture(autouse=True)
def online(monkeypatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


def test_the_loras_and_previews_are_uploaded_never_checkpoints(tmp_path: Path):
    api, lines = FakeApi(), []
    assert push_to_hub(tmp_path, "me/lora", True, lines.append, api)
    assert api.calls[0] == ("create_repo", {"repo_id": "me/lora", "private": True,
                                            "exist_ok": True, "repo_type": "model"})
    name, upload = api.calls[1]
    assert name == "upload_folder" and upload["folder_path"] == str(tmp_path)
    assert upload["repo_id"] == "me/lora"
    assert upload["allow_patterns"] == ["*.safetensors", "samples/*", "loss_log.jsonl"]
    assert lines == ["push_to_hub: uploaded to http://127.0.0.1:9/me/lora"]


def test_offline_is_one_line_and_nothing_is_called(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    api, lines = FakeApi(), []
    assert not push_to_hub(tmp_path, "me/lora", False, lines.append, api)
    assert api.calls == [] and len(lines) == 1 and "HF_HUB_OFFLINE" in lines[0]
    assert str(tmp_path) in lines[0]


def test_no_token_is_one_line(monkeypatch, tmp_path: Path):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    monkeypatch.setattr(huggingface_hub, "HfApi", lambda: pytest.fail("no token: no API"))
    lines: list[str] = []
    assert not push_to_hub(tmp_path, "me/lora", False, lines.append)
    assert len(lines) == 1 and "no Hugging Face token" in lines[0]


def test_a_refusing_hub_is_one_line_not_a_failed_run(tmp_path: Path):
    import httpx
    from huggingface_hub.errors import HfHubHTTPError

    response = httpx.Response(403, request=httpx.Request(
        "POST", "http://127.0.0.1:9/api/repos/create"))
    refused = HfHubHTTPError("403 Forbidden: not your namespace", response=response)
    api, lines = FakeApi(refused), []
    assert not push_to_hub(tmp_path, "someone/else", False, lines.append, api)
    assert lines == [f"push_to_hub: upload to someone/else failed (HfHubHTTPError: 403 "
                     f"Forbidden: not your namespace); the files stay in {tmp_path}"]


def test_a_finished_run_uploads_its_folder(tmp_path: Path, example_model_dir: Path,
                                           monkeypatch, capsys):
    """Through a real (tiny, in-process) run: the upload comes after the final save."""
    import huggingface_hub

    from aitk.config.loading import load_config
    from aitk.run.job import EXIT_OK, run_job
    from tests.aitk.aitk_testing import job_config, write_config

    api = FakeApi()
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_not_a_real_token")
    monkeypatch.setattr(huggingface_hub, "HfApi", lambda: api)
    cfg = job_config("hub", tmp_path / "out", example_model_dir, steps=2,
                     save={"dtype": "float32", "save_every": 2, "push_to_hub": True,
                           "hf_repo_id": "me/hub-lora"},
                     sample={"sample_every": 100, "prompts": []})
    assert run_job(load_config(str(write_config(tmp_path / "hub.yml", cfg)))) == EXIT_OK
    [(_, create), (_, upload)] = api.calls
    assert create["repo_id"] == upload["repo_id"] == "me/hub-lora"
    folder = Path(upload["folder_path"])
    assert (folder / "hub.safetensors").is_file()
    said = capsys.readouterr()
    assert "push_to_hub: uploaded to http://127.0.0.1:9/me/hub-lora" in said.out + said.err
