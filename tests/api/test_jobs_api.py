"""The jobs routes end to end on the tiny random Llama (``--jobs``): a LoRA SFT job
whose loss goes down and whose adapter mounts and changes greedy output, a 4-bit
quantize into the HF cache that ``mlxspec serve`` then serves, dataset templates
(the LLM-backed one calling this server's ``/v1``), the SSE tail, cancel and kill,
two jobs on one lease while serving answers, a runner left by a killed server
marked ``zombie`` at the next start, and the bad inputs the reference words."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mlxspec.conformance.httpx_checks import checking_client
from mlxspec.conformance.live import free_port, wait_healthy
from mlxspec.jobs.store import JobStore, pid_alive
from tests.conftest import LiveServer

#: Every job runs in a runner process.
pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parents[2]
SFT50 = ROOT / "fixtures" / "datasets" / "sft50"
#: A few steps of rank-4 LoRA at a high rate: the random model's loss falls fast.
FAST_SFT = {"iters": 6, "batch_size": 4, "learning_rate": 1e-3, "rank": 4}
FAST_SFT |= {"steps_per_report": 2, "max_seq_length": 96}


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[dict]:
    """A live server with ``--jobs`` on its own engine, its caches in a temp folder."""
    from mlxspec.config import ServeConfig
    from mlxspec.engine import Engine
    from mlxspec.http.app import create_app

    tmp = tmp_path_factory.mktemp("lab")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLXSPEC_CACHE_DIR", str(tmp / "cache"))
        mp.setenv("HF_HUB_CACHE", str(tmp / "hub"))
        mp.setenv("PYTHONPATH", str(ROOT))
        engine = Engine.load(tiny_model_dir, "tiny-llama")
        engine.start()
        config = ServeConfig(jobs_roots=(str(tiny_model_dir), str(SFT50.parent), str(tmp)))
        app = create_app(engine, config, validate_responses=True)
        try:
            with LiveServer(app, config) as server:
                yield {"base": server.base, "tmp": tmp, "model": tiny_model_dir, "app": app}
        finally:
            engine.close()


@pytest.fixture()
def client(lab: dict) -> Iterator[httpx.Client]:
    """A contract-checking client of the lab server."""
    with checking_client(lab["base"], timeout=120) as c:
        yield c


def stream(client: httpx.Client, job_id: str) -> list[str]:
    """The job's SSE lines (blank ones dropped), read to the ``end`` event."""
    with client.stream("GET", f"/api/jobs/{job_id}/stream") as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        return [line for line in response.iter_lines() if line]


def events(lines: list[str]) -> list[dict]:
    """The JobEvents of a stream's ``data:`` lines (the end's ``{}`` left out)."""
    found = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    return [e for e in found if e]


def wait_status(client: httpx.Client, job_id: str, statuses: set[str], timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/api/jobs/{job_id}").json()["job"]
        if job["status"] in statuses:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} never reached {statuses}: {job}")


def greedy(client: httpx.Client, adapter: str | None = None) -> str:
    body = {"messages": [{"role": "user", "content": "Tell me about the apple."}]}
    body |= {"max_tokens": 8, "temperature": 0}
    if adapter:
        body["adapter"] = adapter
    reply = client.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["message"]["content"]


def test_sft_job_streams_falling_loss_and_its_adapter_mounts(client, lab) -> None:
    body = {"model_dir": str(lab["model"]), "data_dir": str(SFT50), **FAST_SFT}
    submitted = client.post("/api/finetune/submit", json=body).json()
    adapter = submitted["adapter_path"]
    assert adapter.startswith(str(lab["tmp"] / "cache" / "adapters" / "adapter-"))
    lines = stream(client, submitted["job_id"])
    assert lines[0] == "retry: 1500"
    assert lines[-2:] == ["event: end", "data: {}"]
    got = events(lines)
    assert got[0]["type"] == "started"
    assert got[-1]["type"] == "done" and got[-1]["output_dir"] == adapter
    train = [e for e in got if e["type"] == "metric" and e["kind"] == "train"]
    val = [e for e in got if e["type"] == "metric" and e["kind"] == "val"]
    assert [e["step"] for e in train] == [2, 4, 6]
    assert train[-1]["loss"] < train[0]["loss"] and val[-1]["loss"] < val[0]["loss"]
    assert all(e["tokens_per_sec"] > 0 and e["learning_rate"] > 0 for e in train)
    job = client.get(f"/api/jobs/{submitted['job_id']}").json()["job"]
    assert (job["status"], job["progress"], job["output_path"]) == ("done", 1.0, adapter)
    assert json.loads(job["config_json"])["data_dir"] == str(SFT50)
    base = greedy(client)
    mounted = client.post("/v1/adapters", json={"id": "sft", "path": adapter})
    assert mounted.status_code == 200, mounted.text
    try:
        assert greedy(client, "sft") != base
    finally:
        client.delete("/v1/adapters/sft")


def test_merge_and_export_of_a_trained_adapter(client, lab) -> None:
    """Merged with scales (20, 0), an adapter and itself is the adapter (scale 20 is
    its own): the merge is exact, so both mounts answer alike."""
    body = {"model_dir": str(lab["model"]), "data_dir": str(SFT50), **FAST_SFT, "iters": 4}
    submitted = client.post("/api/finetune/submit", json=body).json()
    assert events(stream(client, submitted["job_id"]))[-1]["type"] == "done"
    path = submitted["adapter_path"]
    pair = {"adapter_a": path, "adapter_b": path, "scales": [20.0, 0.0]}
    merged = client.post("/api/finetune/merge", json=pair).json()
    config = json.loads((Path(merged["merged_path"]) / "adapter_config.json").read_text())
    assert config["lora_parameters"]["rank"] == 8 and config["lora_parameters"]["scale"] == 1.0
    assert merged["stats"]["layersOnlyInOne"] == 0 and merged["stats"]["scales"] == [20.0, 0.0]
    assert merged["stats"]["totalKeysOut"] == 2 * merged["stats"]["layersMerged"]
    for name, folder in (("src", path), ("m", merged["merged_path"])):
        mounted = client.post("/v1/adapters", json={"id": name, "path": folder})
        assert mounted.status_code == 200, mounted.text
    try:
        assert greedy(client, "m") == greedy(client, "src") != greedy(client)
    finally:
        client.delete("/v1/adapters/src")
        client.delete("/v1/adapters/m")
    exported = client.post(
        "/api/finetune/export", json={"base_model": "tiny-llama", "adapter_path": path}
    ).json()
    manifest = json.loads((Path(exported["export_path"]) / "manifest.json").read_text())
    assert manifest == exported["manifest"] and manifest["adapter_path"] == path


def test_finetune_refusals_and_dataset_errors_fail_the_job_by_name(client, lab, tmp_path) -> None:
    model = str(lab["model"])
    missing = client.post("/api/finetune/submit", json={"model_dir": model})
    assert (missing.status_code, missing.json()) == (
        400,
        {"ok": False, "error": "model_dir and data_dir required"},
    )
    outside = client.post("/api/finetune/submit", json={"model_dir": "/etc", "data_dir": model})
    assert outside.status_code == 400 and "model_dir '/etc' is outside" in outside.json()["error"]
    broken = lab["tmp"] / "broken"
    broken.mkdir(exist_ok=True)
    rows = (SFT50 / "train.jsonl").read_text().splitlines()
    (broken / "train.jsonl").write_text("\n".join(rows[:2] + ['{"messages": [', *rows[2:4]]) + "\n")
    report = client.post("/api/finetune/inspect-dataset", json={"path": str(broken)}).json()
    assert report["ok"] is False and report["bad_lines"][0].startswith("train.jsonl line 3:")
    cases = [
        ({"data_dir": str(broken)}, "dataset: 1 broken line: train.jsonl line 3: not valid JSON"),
        ({"data_dir": str(SFT50), "method": "dpo"}, "method 'dpo' is not available"),
    ]
    for extra, error in cases:
        job_id = client.post("/api/finetune/submit", json={"model_dir": model, **extra}).json()
        got = events(stream(client, job_id["job_id"]))
        assert got[-1]["type"] == "failed" and got[-1]["error"].startswith(error), got[-1]
        assert client.get(f"/api/jobs/{job_id['job_id']}").json()["job"]["status"] == "failed"


def test_quantize_writes_a_cache_repo_that_mlxspec_serve_serves(client, lab) -> None:
    from huggingface_hub import scan_cache_dir

    inspected = client.post("/api/quantize/inspect", json={"model_id": str(lab["model"])}).json()
    assert (inspected["ok"], inspected["arch"], inspected["support"]) == (True, "llama", True)
    body = {"model_id": str(lab["model"]), "bits": 4, "group_size": 32}
    submitted = client.post("/api/quantize/submit", json=body).json()
    assert submitted["repo_id"] == "mlxspec/tiny-llama-4bit"
    done = events(stream(client, submitted["job_id"]))[-1]
    assert done["type"] == "done", done
    hub = lab["tmp"] / "hub"
    repos = {r.repo_id: r for r in scan_cache_dir(hub).repos}
    repo = repos["mlxspec/tiny-llama-4bit"]
    (revision,) = repo.revisions
    assert (
        hub / "models--mlxspec--tiny-llama-4bit" / "refs" / "main"
    ).read_text() == revision.commit_hash
    assert str(revision.snapshot_path) == done["output_dir"]
    config = json.loads((revision.snapshot_path / "config.json").read_text())
    assert config["quantization"]["bits"] == 4
    resolved = client.post(
        "/api/quantize/resolve-folder", json={"folder_name": "models--mlxspec--tiny-llama-4bit"}
    ).json()
    assert resolved == {
        "ok": True, "path": done["output_dir"], "repo_id": "mlxspec/tiny-llama-4bit",
        "model_type": "llama",
    }  # fmt: skip
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "mlxspec",
        "serve",
        "mlxspec/tiny-llama-4bit",
        "--port",
        str(port),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_healthy(base, 120, proc)
        models = httpx.get(base + "/v1/models", timeout=30).json()["data"]
        assert models[0]["id"] == "mlxspec/tiny-llama-4bit"
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        assert httpx.post(base + "/v1/chat/completions", json=body, timeout=60).status_code == 200
    finally:
        proc.terminate()
        proc.wait(30)


def test_dataset_templates_build_jsonl_and_the_llm_one_calls_v1(client, lab) -> None:
    ids = [t["id"] for t in client.get("/api/dataset/templates").json()["templates"]]
    assert ids == ["qa_pairs", "chat_transcripts", "text_chunks", "llm_qa"]
    unknown = client.post("/api/dataset/submit", json={"template_id": "nope", "inputs": {}})
    assert unknown.status_code == 400
    assert unknown.json() == {"ok": False, "error": "unknown template 'nope'"}
    pairs = "Q: What is red?\nA: A color.\n\nQ: And blue?\nA: Another."
    submitted = client.post(
        "/api/dataset/submit", json={"template_id": "qa_pairs", "inputs": {"pairs": pairs}}
    ).json()
    assert events(stream(client, submitted["job_id"]))[-1]["type"] == "done"
    rows = [
        json.loads(x)
        for x in (Path(submitted["output_dir"]) / "train.jsonl").read_text().splitlines()
    ]
    assert rows == [
        {"prompt": "What is red?", "completion": "A color."},
        {"prompt": "And blue?", "completion": "Another."},
    ]
    inputs = {"text": "Bees make honey.", "n_pairs": 2, "max_tokens": 6}
    submitted = client.post("/api/dataset/submit", json={"template_id": "llm_qa", "inputs": inputs})
    done = events(stream(client, submitted.json()["job_id"]))[-1]
    assert done["type"] == "done" and done["summary"]["rows"] == 2, done
    rows = [
        json.loads(x) for x in (Path(done["output_dir"]) / "train.jsonl").read_text().splitlines()
    ]
    from mlxspec.jobs.dataset import QUESTION_PROMPT

    ask = [{"role": "user", "content": QUESTION_PROMPT.format(n=2, text=inputs["text"])}]
    direct = client.post(
        "/v1/chat/completions", json={"messages": ask, "max_tokens": 6, "temperature": 0}
    ).json()["choices"][0]["message"]["content"]
    assert rows[1]["messages"][0] == {"role": "user", "content": direct.strip()}


def test_cancel_and_kill_end_a_running_job_failed(client, lab) -> None:
    body = {"model_dir": str(lab["model"]), "data_dir": str(SFT50), **FAST_SFT, "iters": 100000}
    store = JobStore(lab["tmp"] / "cache" / "jobs")
    for how in ("delete", "kill"):
        job_id = client.post("/api/finetune/submit", json=body).json()["job_id"]
        wait_status(client, job_id, {"running"})
        pgid = store.get(job_id).pgid
        assert pgid and pid_alive(pgid)
        if how == "delete":
            job = client.delete(f"/api/jobs/{job_id}").json()["job"]
            assert (job["status"], job["error"]) == ("failed", "cancelled")
        else:
            os.killpg(pgid, signal.SIGKILL)
            job = wait_status(client, job_id, {"failed"})
            assert job["error"] == "the runner exited with signal 9 before the job ended"
        assert events(stream(client, job_id))[-1]["type"] == "failed"
        deadline = time.monotonic() + 10
        while pid_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not pid_alive(pgid)


def test_two_jobs_share_one_lease_while_serving_answers(client, lab) -> None:
    body = {"model_dir": str(lab["model"]), "data_dir": str(SFT50), **FAST_SFT}
    first = client.post("/api/finetune/submit", json=body).json()["job_id"]
    second = client.post("/api/finetune/submit", json=body).json()["job_id"]
    wait_status(client, first, {"running"})
    assert client.get(f"/api/jobs/{second}").json()["job"]["status"] == "queued"
    started = time.monotonic()
    assert client.get("/health").status_code == 200
    assert time.monotonic() - started < 5
    assert greedy(client)  # waits for the lease between the two jobs, then answers
    for job_id in (first, second):
        assert wait_status(client, job_id, {"done", "failed"})["status"] == "done"
    logs = [events(stream(client, j)) for j in (first, second)]
    assert logs[0][-1]["ts"] <= logs[1][0]["ts"]  # the second started after the first ended


def test_a_job_running_when_its_server_dies_is_a_zombie_at_the_next_start(lab, tmp_path) -> None:
    from starlette.testclient import TestClient

    from mlxspec.config import ServeConfig
    from mlxspec.http.app import create_app

    port, cache = free_port(), tmp_path / "cache"
    argv = [sys.executable, "-m", "mlxspec", "serve", str(lab["model"]), "--port", str(port)]
    argv += ["--jobs", str(SFT50.parent), "--jobs", str(lab["model"])]
    env = {**os.environ, "MLXSPEC_CACHE_DIR": str(cache)}
    server = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_healthy(base, 120, server)
        body = {"model_dir": str(lab["model"]), "data_dir": str(SFT50), **FAST_SFT}
        body["iters"] = 100000
        submitted = httpx.post(base + "/api/finetune/submit", json=body)
        assert submitted.status_code == 200, submitted.text
        job_id = submitted.json()["job_id"]
        store = JobStore(cache / "jobs")
        deadline = time.monotonic() + 60
        while store.get(job_id).status != "running" and time.monotonic() < deadline:
            time.sleep(0.1)
        pgid = store.get(job_id).pgid
        server.kill()
        server.wait(30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(30)
    deadline = time.monotonic() + 30
    while pid_alive(pgid) and time.monotonic() < deadline:  # the runner dies with it
        time.sleep(0.1)
    assert not pid_alive(pgid)
    assert store.get(job_id).status == "running"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLXSPEC_CACHE_DIR", str(cache))
        app = create_app(None, ServeConfig(model=None, jobs_roots=(str(SFT50.parent),)))
        with TestClient(app, base_url="http://127.0.0.1") as restarted:
            job = restarted.get(f"/api/jobs/{job_id}").json()["job"]
            assert job["status"] == "zombie" and "zombie" in job["error"]
            frames = restarted.get(f"/api/jobs/{job_id}/stream").text
    assert frames.endswith("\n\nevent: end\ndata: {}\n\n")
    last = events([line for line in frames.splitlines() if line])[-1]
    assert (last["type"], last["error"]) == ("failed", job["error"])


def test_jobs_routes_are_absent_without_the_flag_and_check_origin(client, tiny_server) -> None:
    absent = httpx.get(tiny_server.base + "/api/jobs")
    assert absent.status_code == 404 and absent.json()["ok"] is False
    forged = client.get("/api/jobs", headers={"Origin": "https://evil.example"})
    assert forged.status_code == 403
    assert "may not call /api/jobs routes" in forged.json()["error"]
    unknown = stream(client, "nope")
    assert unknown[0] == "retry: 1500" and unknown[-2:] == ["event: end", "data: {}"]
    (failed,) = events(unknown)
    assert (failed["type"], failed["error"]) == ("failed", "job not found")
    assert client.get("/api/jobs/nope").json() == {"ok": False, "error": "job not found"}
