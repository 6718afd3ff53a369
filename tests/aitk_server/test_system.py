"""The monitor (captured nvidia-smi / rocm-smi / /proc output as fixtures), the
settings page's Hugging Face token (owner-only, never sent back, given to the trainer)
and the previews per prompt with their prompt and seed."""

from __future__ import annotations

import json
import stat

import numpy as np
import yaml

from aitk_server import machine, outputs, preferences
from tests.aitk_server.conftest import aitk_png

NVIDIA = """0, NVIDIA H200, 1024, 143771, 37, 41
1, NVIDIA H200, [N/A], 143771, [Not Supported], 39
"""
ROCM = json.dumps({"card0": {"Card series": "Instinct MI300X",
                             "VRAM Total Memory (B)": "205822885888",
                             "VRAM Total Used Memory (B)": "1073741824",
                             "GPU use (%)": "12", "Temperature (Sensor edge) (C)": "45.0"}})
MEMINFO = "MemTotal:       16000000 kB\nMemFree:         1000000 kB\n" \
    "MemAvailable:    4000000 kB\n"


def test_nvidia_smi_lines_become_one_entry_per_gpu():
    gpus = machine.parse_nvidia(NVIDIA)
    assert gpus[0] == {"index": 0, "name": "NVIDIA H200",
                       "memory_used_bytes": 1024 * 2**20,
                       "memory_total_bytes": 143771 * 2**20, "utilization_pct": 37.0,
                       "temperature_c": 41.0}
    assert gpus[1]["memory_used_bytes"] is None and gpus[1]["utilization_pct"] is None
    assert machine.parse_nvidia("garbage\n") == []


def test_rocm_smi_json_and_proc_files():
    gpu = machine.parse_rocm(ROCM)[0]
    assert (gpu["name"], gpu["memory_used_bytes"], gpu["utilization_pct"],
            gpu["temperature_c"]) == ("Instinct MI300X", 2**30, 12.0, 45.0)
    assert machine.parse_rocm("not json") == []
    ram = machine.parse_meminfo(MEMINFO)
    assert ram == {"ram_total_bytes": 16000000 * 1024,
                   "ram_used_bytes": 12000000 * 1024}
    assert machine.cpu_busy([10, 0, 10, 70, 10], [20, 0, 20, 140, 20]) == 20.0


def test_the_monitor_route_always_has_cpu_and_ram(client):
    now = client.get("/api/machine").json()
    assert {"gpus", "cpu_pct", "cpu_count", "ram_total_bytes"} <= set(now)
    assert isinstance(now["gpus"], list)


def test_the_hf_token_is_stored_owner_only_and_never_shown(client, settings):
    shown = client.get("/api/settings").json()
    assert shown["hf_token_set"] is False
    assert shown["outputs_dir"] == str(settings.outputs_dir)
    answer = client.put("/api/settings", json={"hf_token": "hf_secretvalue123"})
    assert answer.status_code == 200
    assert "hf_secretvalue123" not in answer.text
    assert client.get("/api/settings").json()["hf_token_set"] is True
    assert "hf_secretvalue123" not in client.get("/api/settings").text
    path = preferences.token_path(settings.data_dir)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert preferences.read_token(settings.data_dir) == "hf_secretvalue123"
    assert client.put("/api/settings", json={"hf_token": "two words"}).status_code == 400
    client.put("/api/settings", json={"hf_token": ""})
    assert not path.exists()


def test_the_trainer_gets_the_token(settings, tmp_path, monkeypatch):
    import subprocess

    from aitk_server.db import Database
    from aitk_server.runner import Runner

    seen: dict = {}

    def fake_popen(argv, env, **kwargs):
        seen.update(env)
        raise OSError("not started in this test")

    monkeypatch.setattr(subprocess, "Popen", fake_popen)
    runner = Runner(Database(tmp_path / "jobs.sqlite"), tmp_path / "data", settings.root)
    preferences.set_token(tmp_path / "data", "hf_abc")
    job = runner.db.create("j", "config: {}", str(tmp_path / "out"))
    runner.start(job.id)
    assert seen["HF_TOKEN"] == "hf_abc"


def test_previews_per_prompt_across_steps_with_prompt_and_seed(client, job_yaml, settings):
    data = yaml.safe_load(job_yaml("shown"))
    data["config"]["process"][0]["sample"].update(
        prompts=["[trigger] a red circle", "a blue square"], seed=7, walk_seed=True)
    job = client.post("/api/jobs", json={"yaml": yaml.safe_dump(data)}).json()
    folder = settings.outputs_dir / "shown" / "samples"
    folder.mkdir(parents=True)
    for step in (0, 2):
        for index in (0, 1):
            aitk_png(folder / f"{step:09d}_{index}.png")
    shown = client.get(f"/api/jobs/{job['id']}/previews").json()
    assert [(p["index"], p["prompt"], p["seed"]) for p in shown] == [
        (0, "p1xel a red circle", 7), (1, "a blue square", 8)]
    assert [s["step"] for s in shown[1]["steps"]] == [0, 2]
    assert shown[1]["steps"][1]["file"] == "samples/000000002_1.png"
    assert outputs.previews(settings.outputs_dir / "none", None, None) == []


def test_a_preview_with_sound_is_listed_and_played_inline_only_when_aitk_made_it(
        client, job_yaml, settings):
    """LTX-2's previews: beside each step's WebP an mp4 with its sound, served inline as
    video/mp4 when its container carries aitk's mark; someone else's mp4 at that name is
    neither listed nor served."""
    from PIL import Image

    from aitk.run.sampling import video_with_sound

    job = client.post("/api/jobs", json={"yaml": job_yaml("sound")}).json()
    folder = settings.outputs_dir / "sound" / "samples"
    folder.mkdir(parents=True)
    frames = [Image.new("RGB", (16, 8), (40 * i, 0, 0)) for i in range(5)]
    tone = np.zeros((1, 1600), dtype=np.float32)
    for step in (0, 2):
        aitk_png(folder / f"{step:09d}_0.png")
    (folder / "000000002_0.mp4").write_bytes(video_with_sound(frames, 10.0, tone, 16000))
    (folder / "000000000_0.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 not ours")
    shown = client.get(f"/api/jobs/{job['id']}/previews").json()
    assert [(s["step"], s["sound"]) for s in shown[0]["steps"]] == [
        (0, None), (2, "samples/000000002_0.mp4")]
    played = client.get(f"/api/jobs/{job['id']}/files/samples/000000002_0.mp4")
    assert played.status_code == 200 and played.headers["content-type"] == "video/mp4"
    assert "inline" in played.headers["content-disposition"]
    assert client.get(f"/api/jobs/{job['id']}/files/samples/000000000_0.mp4"
                      ).status_code == 404
