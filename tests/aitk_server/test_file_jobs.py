"""File jobs (extract, mod, merge, generate) in the web UI: every output key stays inside
the job's own folder under the outputs root (aitk_server.configs.file_confinement),
inputs may be read from anywhere; a generate job made through the API runs `run.py`
to `finished` and its images are served; and the attacks of test_guard.py against a
file job (another site's page, a forged Host, outputs out by `..` or a link)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from aitk_server import configs, outputs
from tests.aitk_server.conftest import REPO, aitk_lora, aitk_png, wait_state
from tests.aitk_server.test_guard import EVIL, no_cors, one_line, served  # noqa: F401


def generate_job(name: str, folder: Path | str, model: Path, **process: object) -> dict:
    proc = {"type": "to_folder", "output_folder": str(folder), "device": "cpu",
            "generate": {"width": 32, "height": 32, "sample_steps": 2, "seed": 3,
                         "prompts": ["a red circle", "a blue square --seed 5"]},
            "model": {"name_or_path": str(model)}, **process}
    return {"job": "generate", "config": {"name": name, "process": [proc]}}


def extract_job(name: str, folder: Path, model: Path, *procs: dict) -> dict:
    return {"job": "extract", "config": {
        "name": name, "base_model": str(model), "extract_model": str(model),
        "output_folder": str(folder), "arch": "example",
        "process": list(procs) or [{"type": "lora", "mode": "fixed", "linear": 2}]}}


def mod_job(name: str, output: Path, source: Path) -> dict:
    return {"job": "mod", "config": {"name": name, "process": [{
        "type": "rescale_lora", "input_path": str(source), "output_path": str(output),
        "current_weight": 2.0, "target_weight": 1.0}]}}


def merge_job(name: str, output: Path, source: Path) -> dict:
    return {"job": "merge", "config": {"name": name, "process": [{
        "type": "merge_loras", "loras": [{"path": str(source)}],
        "output_path": str(output)}]}}


def checked(config: dict, outputs_root: Path) -> configs.Checked:
    return configs.check(yaml.safe_dump(config), REPO, outputs_root)


def refused_at(config: dict, outputs_root: Path) -> list[str]:
    result = checked(config, outputs_root)
    assert result.loaded is None
    for error in result.errors:
        assert "\n" not in error["message"]
    return [e["path"] for e in result.errors]


# ---- confinement (pure: no server, no trainer) ----------------------------------------
def test_each_kind_is_accepted_inside_its_folder_reading_from_anywhere(tmp_path: Path):
    root = tmp_path / "out"
    root.mkdir()
    elsewhere = tmp_path / "elsewhere"  # inputs: anywhere the trainer can read
    job = root / "job"
    for config, folder in (
            (generate_job("g", job, elsewhere / "model"), job),
            (extract_job("e", job, elsewhere / "model",
                         {"type": "lora", "filename": "a.safetensors"},
                         {"type": "lora", "output_path": str(job / "sub" / "b.safetensors")},
                         {"type": "locon"}), job),
            (mod_job("m", job / "m.safetensors", elsewhere / "in.safetensors"), job),
            (merge_job("mg", job / "mg.safetensors", elsewhere / "in.safetensors"), job)):
        result = checked(config, root)
        assert result.loaded is not None, (config["job"], result.errors)
        assert configs.out_dir(result.loaded, REPO) == folder


def test_an_output_outside_the_job_folder_is_refused_at_its_field(tmp_path: Path):
    root = tmp_path / "out"
    (root / "job").mkdir(parents=True)
    (root / "other").mkdir()
    model = tmp_path / "model"
    job = root / "job"
    # the job's folder itself: outside the outputs root, by `..`, or the root itself
    for folder in (tmp_path / "gen", root / "job" / ".." / "..", root, Path("/")):
        assert refused_at(generate_job("g", folder, model), root) == [
            "config.process[0].output_folder"], folder
    assert refused_at(extract_job("e", tmp_path, model), root) == ["config.output_folder"]
    assert refused_at(mod_job("m", tmp_path / "x.safetensors", model), root) == [
        "config.process[0].output_path"]
    # a later output leaving the job's folder: by `..`, to another folder, by a link
    (job / "link").symlink_to(tmp_path)
    assert refused_at(extract_job(
        "e", job, model, {"type": "lora", "filename": "../other/a.safetensors"},
        {"type": "lora", "output_path": str(job / "link" / "b.safetensors")},
        {"type": "lora", "filename": "fine.safetensors"}), root) == [
        "config.process[0].filename", "config.process[1].output_path"]
    second = generate_job("g", job, model)
    second["config"]["process"].append({**copy.deepcopy(second["config"]["process"][0]),
                                        "output_folder": str(root / "other")})
    assert refused_at(second, root) == ["config.process[1].output_folder"]
    twice = merge_job("mg", job / "a.safetensors", model)
    twice["config"]["process"].append({**copy.deepcopy(twice["config"]["process"][0]),
                                       "output_path": str(job / "link" / "b.safetensors")})
    assert refused_at(twice, root) == ["config.process[1].output_path"]
    # a model a generate job would build outside the outputs root
    built = generate_job("g", job, tmp_path / "new-model")
    built["config"]["process"][0]["model"].update(arch="example", create_if_missing=True)
    assert refused_at(built, root) == ["config.process[0].model.name_or_path"]


def test_a_file_jobs_folder_serves_only_what_aitk_wrote(tmp_path: Path):
    folder = tmp_path / "job"
    folder.mkdir()
    png = aitk_png(folder / "0000_a-circle_3.png")
    lora = aitk_lora(folder / "lora_fixed_2.safetensors", 1.0)
    (folder / "mine.png").write_bytes(b"\x89PNG not aitk's")
    (folder / "notes.html").write_text("<script>alert(1)</script>")
    (folder / "link.png").symlink_to(folder / "0000_a-circle_3.png")
    listed = outputs.file_job_outputs(folder)
    assert listed == [
        {"file": "0000_a-circle_3.png", "size": len(png), "inline": True},
        {"file": "lora_fixed_2.safetensors", "size": len(lora), "inline": False}]
    image = outputs.served_file(folder, "g", "0000_a-circle_3.png", "generate")
    assert image is not None and image.inline and image.media_type == "image/png"
    for name in ("mine.png", "notes.html", "link.png", "../job/0000_a-circle_3.png"):
        assert outputs.served_file(folder, "g", name, "generate") is None, name
    # a training job's folder keeps its own names: the file job's rule is not applied
    assert outputs.served_file(folder, "g", "lora_fixed_2.safetensors") is None
    assert sorted(outputs.delete_outputs(folder, "g", "extract")) == [
        "0000_a-circle_3.png", "lora_fixed_2.safetensors"]
    assert sorted(p.name for p in folder.iterdir()) == ["link.png", "mine.png", "notes.html"]


# ---- through the API, run.py for real -------------------------------------------------
@pytest.mark.slow
def test_a_generate_job_runs_to_finished_and_its_images_are_served(client, settings,
                                                                   example_model):
    folder = settings.outputs_dir / "gen"
    r = client.post("/api/jobs", json={"yaml": yaml.safe_dump(
        generate_job("gen", folder, example_model))})
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["kind"] == "generate" and Path(job["out_dir"]) == folder
    assert client.post(f"/api/jobs/{job['id']}/start", json={}).status_code == 200
    job = wait_state(client, job["id"], "finished", "failed", "stopped")
    assert (job["state"], job["exit_code"]) == ("finished", 0), job
    assert [f["file"] for f in job["files"]] == ["0000_a-red-circle_3.png",
                                                 "0001_a-blue-square_5.png"]
    image = client.get(f"/api/jobs/{job['id']}/files/0000_a-red-circle_3.png?download=1")
    assert image.status_code == 200 and image.headers["content-type"] == "image/png"
    assert "attachment" in image.headers["content-disposition"]
    assert image.content == (folder / "0000_a-red-circle_3.png").read_bytes()
    # an output out of the job's folder is refused at its field before anything runs
    r = client.post("/api/jobs", json={"yaml": yaml.safe_dump(generate_job(
        "gen2", settings.outputs_dir / "gen2" / ".." / "..", example_model))})
    assert r.status_code == 422
    assert [e["path"] for e in r.json()["errors"]] == ["config.process[0].output_folder"]


@pytest.mark.slow
def test_extract_then_mod_and_merge_of_its_lora_run_to_finished(client, settings,
                                                                 example_model, tmp_path):
    """Each other file kind made and run through the API: an extract (the example model
    against a copy with one layer changed), then a rescale and a merge of its LoRA."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    tuned = tmp_path / "tuned"
    shutil.copytree(example_model, tuned)
    weights = tuned / "transformer" / "diffusion_pytorch_model.safetensors"
    state = load_file(str(weights))
    layer = next(k for k, v in state.items() if k.startswith("blocks.") and v.ndim == 2)
    state[layer] = state[layer] + 0.1 * torch.ones_like(state[layer])
    save_file(state, str(weights))

    def run(config: dict) -> dict:
        r = client.post("/api/jobs", json={"yaml": yaml.safe_dump(config)})
        assert r.status_code == 201, r.text
        assert client.post(f"/api/jobs/{r.json()['id']}/start", json={}).status_code == 200
        job = wait_state(client, r.json()["id"], "finished", "failed", "stopped")
        assert (job["kind"], job["state"], job["exit_code"]) == (
            config["job"], "finished", 0), client.get(f"/api/jobs/{job['id']}/log").text
        return job

    out = settings.outputs_dir
    config = extract_job("ext", out / "ext", example_model)
    # the trainer's check refuses the model against itself, at its field, before a run
    r = client.post("/api/jobs", json={"yaml": yaml.safe_dump(config)})
    assert r.status_code == 422
    assert [e["path"] for e in r.json()["errors"]] == ["config.extract_model"]
    config["config"]["extract_model"] = str(tuned)
    extracted = run(config)
    [lora] = [f["file"] for f in extracted["files"] if f["file"].endswith(".safetensors")]
    source = out / "ext" / lora
    for config, written in ((mod_job("mod", out / "mod" / "m.safetensors", source),
                             "m.safetensors"),
                            (merge_job("merge", out / "merge" / "mg.safetensors", source),
                             "mg.safetensors")):
        job = run(config)
        assert [f["file"] for f in job["files"]] == [written]
        got = client.get(f"/api/jobs/{job['id']}/files/{written}?download=1")
        assert got.status_code == 200 and got.content == (
            out / config["job"] / written).read_bytes()


# ---- the attacks (one real server, test_guard.py's) -----------------------------------
def test_another_sites_page_or_a_forged_host_cannot_make_a_file_job(served):  # noqa: F811
    outputs_root = served.settings.outputs_dir
    text = yaml.safe_dump(generate_job("forged_gen", outputs_root / "forged_gen",
                                       served.tmp / "model"))
    with served.browser(origin=EVIL) as evil:
        for r in (evil.post("api/jobs", json={"yaml": text}),
                  evil.post("api/jobs", content=text, headers={"Content-Type": "text/plain"})):
            assert r.status_code == 403, r.text
            no_cors(r)
    with served.tool() as tool:
        r = tool.post("api/jobs", json={"yaml": text},
                      headers={"Host": f"evil.example:{served.port}"})
        assert r.status_code == 421 and "--allowed-host" in one_line(r)
        assert "forged_gen" not in [j["name"] for j in tool.get("api/jobs").json()]


def test_a_file_job_cannot_write_out_by_dotdot_or_a_link(served):  # noqa: F811
    outputs_root = served.settings.outputs_dir
    (outputs_root / "mine").mkdir()
    (outputs_root / "mine" / "out").symlink_to(served.tmp)
    model = served.tmp / "model"
    attempts = [
        (extract_job("x1", outputs_root / "mine", model,
                     {"type": "lora", "filename": "../../escaped.safetensors"}),
         "config.process[0].filename"),
        (extract_job("x2", outputs_root / "mine", model,
                     {"type": "lora", "output_path": str(outputs_root / "mine" / "out" /
                                                         "x.safetensors")}),
         "config.process[0].output_path"),
        (mod_job("x3", outputs_root / "mine" / "out" / "x.safetensors", model),
         "config.process[0].output_path"),
        (generate_job("x4", "/etc", model), "config.process[0].output_folder")]
    with served.tool() as tool:
        for config, field in attempts:
            r = tool.post("api/jobs", json={"yaml": yaml.safe_dump(config)})
            assert r.status_code == 422, r.text
            assert [e["path"] for e in r.json()["errors"]] == [field]
            assert all("\n" not in e["message"] for e in r.json()["errors"])
        # the check route says the same, without making a job
        r = tool.post("api/check", json={"yaml": yaml.safe_dump(attempts[0][0])})
        assert r.json()["ok"] is False
        assert [e["path"] for e in r.json()["errors"]] == [attempts[0][1]]
        names = [j["name"] for j in tool.get("api/jobs").json()]
        assert not {"x1", "x2", "x3", "x4"} & set(names)
    assert not (served.tmp / "escaped.safetensors").exists()


def test_a_file_jobs_file_route_serves_nothing_it_did_not_write(served):  # noqa: F811
    folder = served.settings.outputs_dir / "served_gen"
    text = yaml.safe_dump(generate_job("served_gen", folder, served.tmp / "model"))
    with served.tool() as tool:
        r = tool.post("api/jobs", json={"yaml": text})
        assert r.status_code == 201, r.text
        job = r.json()
        folder.mkdir(parents=True, exist_ok=True)
        aitk_png(folder / "0000_ok_1.png")
        (folder / "page.html").write_text("<script>1</script>")
        (folder / "passwd.png").symlink_to("/etc/passwd")
        assert [f["file"] for f in tool.get(f"api/jobs/{job['id']}").json()["files"]] == [
            "0000_ok_1.png"]
        ok = tool.get(f"api/jobs/{job['id']}/files/0000_ok_1.png")
        assert ok.status_code == 200 and ok.headers["content-type"] == "image/png"
        for path in ("page.html", "passwd.png", "../served_gen/0000_ok_1.png",
                     "%2e%2e/%2e%2e/etc/passwd"):
            r = tool.get(f"api/jobs/{job['id']}/files/{path}")
            assert r.status_code == 404 and "root:" not in r.text, path
