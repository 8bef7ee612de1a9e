"""The jobs room without processes: the store's row and log, path confinement, the
data-folder inspection, the dataset templates' builders, the fine-tune field
mapping and refusals, the synthetic HF-cache repo, the served document and the
``--jobs`` flag."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mlxspec.jobs import JobManager, JobRoots, JobStore, OutsideRoots
from mlxspec.jobs.dataset import chat_transcripts, qa_pairs, text_chunks
from mlxspec.jobs.datasets import inspect_folder
from mlxspec.jobs.runner import JobRefused
from mlxspec.jobs.store import pid_alive

SFT50 = Path(__file__).resolve().parents[2] / "fixtures" / "datasets" / "sft50"


def _dead_pid() -> int:
    pid = 4_000_000
    while pid_alive(pid):
        pid += 1
    return pid


def test_emit_folds_events_into_the_row_and_keeps_the_terminal_one_last(tmp_path) -> None:
    store = JobStore(tmp_path)
    row = store.create("finetune", {"iters": 3}, "/out")
    assert (row.status, row.progress, row.owner) == ("queued", 0.0, os.getpid())
    store.emit(row.id, {"type": "started"})
    store.emit(row.id, {"type": "stage", "stage": "train", "progress": 0.25, "message": "go"})
    store.emit(row.id, {"type": "metric", "kind": "train", "step": 2, "loss": 1.0, "progress": 0.5})
    got = store.get(row.id)
    assert (got.status, got.progress, got.message) == ("running", 0.5, "go")
    store.emit(row.id, {"type": "done", "output_dir": "/out/x", "summary": {}})
    store.emit(row.id, {"type": "log", "line": "late"})  # after the end: dropped
    got = store.get(row.id)
    assert (got.status, got.progress, got.output_path) == ("done", 1.0, "/out/x")
    assert got.ended_at is not None and got.error is None
    events, offset = JobStore.read_events(got.log_path)
    assert [e["type"] for e in events] == ["started", "stage", "metric", "done"]
    assert offset == Path(got.log_path).stat().st_size
    assert set(got.wire()) == {
        "id", "kind", "status", "config_json", "progress", "message", "log_path",
        "output_path", "error", "started_at", "ended_at",
    }  # fmt: skip


def test_read_events_leaves_a_partial_last_line_for_the_next_read(tmp_path) -> None:
    log = tmp_path / "x.ndjson"
    log.write_text('{"type": "log", "line": "a"}\nnot json\n{"type": "lo')
    events, offset = JobStore.read_events(str(log))
    assert events == [{"type": "log", "line": "a"}]
    with log.open("a") as f:
        f.write('g", "line": "b"}\n')
    assert JobStore.read_events(str(log), offset)[0] == [{"type": "log", "line": "b"}]


def test_recent_lists_newest_first_and_filters_by_kind(tmp_path) -> None:
    store = JobStore(tmp_path)
    ids = [store.create(kind, {}, None).id for kind in ("quantize", "dataset", "quantize")]
    assert [r.id for r in store.recent()] == ids[::-1]
    assert [r.id for r in store.recent(kind="quantize", limit=1)] == [ids[2]]
    with pytest.raises(ValueError, match="unknown job kind"):
        store.create("train", {}, None)


def test_the_sweep_marks_a_dead_servers_running_job_zombie(tmp_path) -> None:
    store = JobStore(tmp_path)
    running, queued, live = (store.create("finetune", {}, None) for _ in range(3))
    store.emit(running.id, {"type": "started"})
    store.emit(live.id, {"type": "started"})
    dead = _dead_pid()
    with store._db() as db:  # two jobs of a server that is gone, one of this live one
        db.execute("UPDATE jobs SET owner = ? WHERE id IN (?, ?)", (dead, running.id, queued.id))
    manager = JobManager(JobRoots([]), None, tmp_path)
    assert manager.sweep() == []  # the first sweep ran in the constructor
    zombie, failed = store.get(running.id), store.get(queued.id)
    assert (zombie.status, failed.status, store.get(live.id).status) == (
        "zombie", "failed", "running"
    )  # fmt: skip
    assert "zombie" in zombie.error
    assert failed.error == "the server stopped before this job started"
    last = JobStore.read_events(zombie.log_path)[0][-1]
    assert (last["type"], last["error"]) == ("failed", zombie.error)


def test_confine_takes_paths_in_the_roots_only(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MLXSPEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    allowed = tmp_path / "data"
    allowed.mkdir()
    (allowed / "escape").symlink_to("/etc")
    roots = JobRoots([str(allowed)])
    assert roots.confine(str(allowed / "x"), "data_dir") == allowed / "x"
    assert roots.confine(str(tmp_path / "hub" / "m"), "model_dir") == tmp_path / "hub" / "m"
    assert roots.confine(str(tmp_path / "cache" / "a"), "adapter_path") == tmp_path / "cache" / "a"
    for bad in ("/etc/passwd", str(allowed / "escape" / "passwd"), str(allowed / ".." / "x")):
        with pytest.raises(OutsideRoots, match="data_dir .* is outside the folders jobs may use"):
            roots.confine(bad, "data_dir")
    out = JobRoots.default_output("adapters", "adapter")
    assert out.parent == tmp_path / "cache" / "adapters" and out.name.startswith("adapter-")


def test_inspect_folder_names_formats_and_broken_lines(tmp_path) -> None:
    report = inspect_folder(SFT50)
    assert report.wire() == {"ok": True, "n_train": 44, "n_valid": 6, "format": "messages"}
    rows = {
        "prompt-completion": {"prompt": "p", "completion": "c"},
        "text": {"text": "t"},
        "dpo": {"prompt": "p", "chosen": "a", "rejected": "b"},
    }
    for name, row in rows.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "train.jsonl").write_text(json.dumps(row) + "\n")
        assert inspect_folder(folder).format == name
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "train.jsonl").write_text('{"text": "a"}\n{"text": \n\n{"other": 1}\n')
    got = inspect_folder(broken).wire()
    assert got["ok"] is False and got["n_train"] == 1
    assert got["bad_lines"][0].startswith("train.jsonl line 2: not valid JSON")
    assert got["bad_lines"][1] == "train.jsonl line 4: no known format's keys"
    assert got["error"].startswith("2 broken lines: train.jsonl line 2")
    missing = inspect_folder(tmp_path / "none").wire()
    assert missing["error"] == f"{tmp_path / 'none' / 'train.jsonl'} not found"


def test_dataset_builders_turn_inputs_into_rows() -> None:
    pairs = qa_pairs({"pairs": "Q: a?\nA: b\nc\n\nQ: d?\nA: e"}, print)
    assert pairs == [{"prompt": "a?", "completion": "b\nc"}, {"prompt": "d?", "completion": "e"}]
    with pytest.raises(JobRefused, match="pair 2 has no 'Q:' line"):
        qa_pairs({"pairs": "Q: a\nA: b\n\nno"}, print)
    transcripts = "System: be brief\nUser: hi\nAssistant: hello\nthere\n---\nUser: x\nAssistant: y"
    got = chat_transcripts({"transcripts": transcripts}, print)
    assert got[0]["messages"][2] == {"role": "assistant", "content": "hello\nthere"}
    assert got[1] == {
        "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    }
    with pytest.raises(JobRefused, match="conversation 1 has no assistant turn"):
        chat_transcripts({"transcripts": "User: only"}, print)
    text = "one two\n\nthree\n\n" + "x" * 25
    assert text_chunks({"text": text, "chunk_chars": 14}, print) == [
        {"text": "one two\n\nthree"}, {"text": "x" * 14}, {"text": "x" * 11},
    ]  # fmt: skip
    with pytest.raises(JobRefused, match="inputs.text is required"):
        text_chunks({}, print)


def test_finetune_fields_map_onto_mlx_lm_lora_or_are_refused_by_name() -> None:
    from mlxspec.jobs.finetune import training_args

    base = {"model_dir": "/m", "data_dir": "/d", "adapter_path": "/a"}
    args = training_args(base)
    assert (args.model, args.data, args.adapter_path, args.train) == ("/m", "/d", "/a", True)
    assert (args.iters, args.batch_size, args.learning_rate) == (300, 1, 2e-4)
    assert args.lora_parameters == {"rank": 16, "scale": 20.0, "dropout": 0.0}
    assert (args.num_layers, args.steps_per_eval, args.val_batches) == (-1, 300, -1)
    assert (args.optimizer, args.mask_prompt, args.save_every) == ("adam", False, 100)
    args = training_args(
        base | {"num_layers": 2, "target_modules": ["self_attn.q_proj"], "weight_decay": 0.1,
                "sft_scope": "response", "val_max_examples": 5, "batch_size": 2,
                "save_checkpoints": False, "iters": 10, "warm_start_adapter": "/w",
                "dpo_beta": 0.5, "grad_checkpoint": True}
    )  # fmt: skip
    assert (args.num_layers, args.lora_parameters["keys"]) == (2, ["self_attn.q_proj"])
    assert (args.optimizer, args.optimizer_config["adamw"]) == ("adamw", {"weight_decay": 0.1})
    assert (args.mask_prompt, args.val_batches, args.save_every) == (True, 3, 11)
    assert args.resume_adapter_file == "/w/adapters.safetensors" and args.grad_checkpoint
    refused = {
        "method": ("dpo", "method 'dpo' is not available: it needs a preference trainer"),
        "rs_lora": (True, "rs_lora=True is not supported by mlx_lm.lora's trainer"),
        "grad_clip_norm": (1.0, "grad_clip_norm=1.0 is not supported"),
        "sft_scope": ("half", "sft_scope 'half' must be 'full' or 'response'"),
        "colour": ("red", "unknown field 'colour'"),
    }
    for name, (value, message) in refused.items():
        with pytest.raises(JobRefused, match=f"^{message}"):
            training_args(base | {name: value})
    assert training_args(base | {"rs_lora": False, "lora_plus_ratio": 1}).iters == 300


def test_a_synthetic_repo_is_found_by_the_hub_cache_scan(tmp_path) -> None:
    from huggingface_hub import scan_cache_dir

    from mlxspec.jobs.quantize import output_repo, resolve_model, write_synthetic_repo

    assert output_repo("/models/tiny", {"bits": 4}) == "mlxspec/tiny-4bit"
    assert output_repo("org/name", {"recipe": "mixed_3_6"}) == "mlxspec/name-mixed-3-6"
    source = tmp_path / "out"
    source.mkdir()
    (source / "config.json").write_text('{"model_type": "llama"}')
    (source / "model.safetensors").write_bytes(b"weights")
    hub = tmp_path / "hub"
    snapshot = write_synthetic_repo(source, "mlxspec/tiny-4bit", hub)
    (repo,) = scan_cache_dir(hub).repos
    assert (repo.repo_id, repo.repo_type, repo.size_on_disk) == ("mlxspec/tiny-4bit", "model", 30)
    (revision,) = repo.revisions
    assert revision.snapshot_path == snapshot and revision.refs == frozenset({"main"})
    assert {f.file_name for f in revision.files} == {"config.json", "model.safetensors"}
    os.environ["HF_HUB_CACHE"], saved = str(hub), os.environ.get("HF_HUB_CACHE")
    try:
        assert resolve_model("mlxspec/tiny-4bit") == snapshot
    finally:
        if saved is None:
            del os.environ["HF_HUB_CACHE"]
        else:
            os.environ["HF_HUB_CACHE"] = saved


def test_jobs_routes_are_served_only_with_the_flag() -> None:
    from mlxspec.openapi import served_spec

    off, on = served_spec()["paths"], served_spec(jobs=True)["paths"]
    assert not any(p.startswith(("/api/jobs", "/api/finetune", "/api/quantize")) for p in off)
    assert {"/api/jobs", "/api/jobs/{job_id}/stream", "/api/dataset/submit"} <= set(on)
    assert "x-mlxspec-jobs" not in on["/api/jobs"]["get"]


def test_the_jobs_flag_needs_a_loopback_bind_and_one_process() -> None:
    from mlxspec.cli.flags import parse_config

    assert parse_config(["serve"]).jobs_roots == ()
    assert parse_config(["serve", "--jobs", "/a", "--jobs", "/b"]).jobs_roots == ("/a", "/b")
    for extra in (["--host", "0.0.0.0"], ["--isolate"]):
        with pytest.raises(SystemExit):
            parse_config(["serve", "--jobs", "/a", *extra])


def test_the_lab_routes_answer_errors_in_their_envelope() -> None:
    from mlxspec.errors import ApiError, error_body, surface_for_path

    assert surface_for_path("/api/jobs/x/stream") == "lab"
    assert surface_for_path("/api/finetune/submit") == "lab"
    assert surface_for_path("/api/settings/tool-approvals") == "openai"
    err = ApiError("not_found", "job not found")
    assert error_body(err, "lab") == {"ok": False, "error": "job not found"}
