"""Every file meshtrain reads from a user's folder, damaged the ways a copy or an edit damages one (empty, cut short,
not JSON or not UTF-8, another JSON type, keys missing or of another type), is refused with a message naming the
file, never a traceback: a Hugging Face model folder (``model.init_from``: config.json, safetensors and their index,
the tokenizer files and chat template ``data=chat`` reads), conversations in JSON lines, a prepared dataset's
metadata and shards, a run folder's checkpoint and config (``trainer.resume``, export), and a folder given to
``trainer.data.prepare --tokenizer`` (config.json, generation_config.json, tokenizer files).

In-process, each damaged copy goes through the path its command takes before any worker starts: the model folder
adopted and the run validated, its data prepared (``trainer.task.preflight``: a refusal is ``ConfigError``,
``DataError`` or ``CheckpointError``, exit code 2 in train.py), the resume checkpoint checked, or the export and
prepare commands' own ``main`` (exit code 2, one line on stderr)."""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.chat_helpers import VOCAB, conversations, write_jsonl, write_tokenizer
from tests.hf_helpers import hf_model, save_folder
from trainer.checkpoint.files import MARKER, CheckpointError
from trainer.data.shards import DataError
from trainer.hf.start import InitFromError
from trainer.validate import ConfigError

#: what each command maps to exit code 2 (trainer/task.py; InitFromError becomes a ConfigError there)
REFUSED = (ConfigError, DataError, CheckpointError, InitFromError)
SEQ = 128

Damage = Callable[[Path], None]


# ---- ways to damage a file ------------------------------------------------------------------


def write_anew(path: Path, data: bytes) -> None:
    """``path`` written anew: a damaged copy links the undamaged folder's files (``damaged_copy``), so the link is
    broken first and the undamaged file is never written through."""
    path.unlink(missing_ok=True)
    path.write_bytes(data)


def text(name: str, content: str | bytes) -> Damage:
    def damage(folder: Path) -> None:
        write_anew(folder / name, content if isinstance(content, bytes) else content.encode())

    return damage


def cut(name: str, keep: float = 0.5) -> Damage:
    """The file cut short, at ``keep`` of its length (a copy interrupted)."""

    def damage(folder: Path) -> None:
        data = (folder / name).read_bytes()
        write_anew(folder / name, data[: int(len(data) * keep)])

    return damage


def edit(name: str, change: Callable[[dict], object]) -> Damage:
    """The JSON file loaded, changed in place by ``change`` (what it returns is ignored), written back."""

    def damage(folder: Path) -> None:
        value = json.loads((folder / name).read_text())
        change(value)
        write_anew(folder / name, json.dumps(value).encode())

    return damage


def remove(name: str) -> Damage:
    return lambda folder: (folder / name).unlink()


def json_damages(name: str) -> dict[str, Damage]:
    """The damages every JSON file of a user's folder is tried with."""
    return {
        f"{name} empty": text(name, ""),
        f"{name} cut short": cut(name),
        f"{name} not JSON": text(name, "model: llama\n"),
        f"{name} not UTF-8": text(name, b'{"\xff\xfe": 1}'),
        f"{name} a list": text(name, "[1, 2]"),
    }


def header(change: Callable[[dict], object], *, replace: bool = False) -> Damage:
    """model.safetensors with its JSON header changed in place by ``change`` (``replace``: replaced by what it
    returns), the tensor bytes kept."""

    def damage(folder: Path) -> None:
        path = folder / "model.safetensors"
        data = path.read_bytes()
        (length,) = struct.unpack("<Q", data[:8])
        value = json.loads(data[8 : 8 + length])
        changed = change(value)
        raw = json.dumps(changed if replace else value).encode()
        raw += b" " * (-len(raw) % 8)
        write_anew(path, struct.pack("<Q", len(raw)) + raw + data[8 + length :])

    return damage


def first_tensor(change: Callable[[dict], object]) -> Callable[[dict], object]:
    return lambda h: change(h[next(k for k in sorted(h) if k != "__metadata__")])


def sharded(then: Damage | None = None) -> Damage:
    """The weights split into two shards and an index (as save_pretrained writes past max_shard_size), then
    ``then`` applied."""

    def damage(folder: Path) -> None:
        from safetensors.torch import load_file, save_file

        tensors = load_file(folder / "model.safetensors")
        (folder / "model.safetensors").unlink()
        keys = sorted(tensors)
        names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
        halves = [keys[: len(keys) // 2], keys[len(keys) // 2 :]]
        for name, half in zip(names, halves):
            save_file({k: tensors[k] for k in half}, str(folder / name), metadata={"format": "pt"})
        weight_map = {k: name for name, half in zip(names, halves) for k in half}
        write_anew(folder / INDEX, json.dumps({"metadata": {}, "weight_map": weight_map}).encode())
        if then is not None:
            then(folder)

    return damage


# ---- a model folder started from: model.init_from with data=chat ----------------------------

INDEX = "model.safetensors.index.json"
#: damage -> the file the refusal must name
MODEL_FOLDER: dict[str, tuple[Damage, str]] = {
    **{k: (d, "config.json") for k, d in json_damages("config.json").items()},
    "config.json hidden_size a word": (edit("config.json", lambda c: c.update(hidden_size="big")), "config.json"),
    "config.json vocab_size a list": (edit("config.json", lambda c: c.update(vocab_size=[1])), "config.json"),
    "config.json no num_hidden_layers": (edit("config.json", lambda c: c.pop("num_hidden_layers")), "config.json"),
    "config.json rope_scaling a word": (edit("config.json", lambda c: c.update(rope_scaling="x")), "config.json"),
    "config.json dropout a word": (edit("config.json", lambda c: c.update(attention_dropout="x")), "config.json"),
    "model.safetensors empty": (text("model.safetensors", ""), "model.safetensors"),
    "model.safetensors cut in its header": (cut("model.safetensors", 0.001), "model.safetensors"),
    "model.safetensors cut in its tensors": (cut("model.safetensors", 0.6), "model.safetensors"),
    "model.safetensors header length past the end": (
        text("model.safetensors", struct.pack("<Q", 10**12) + b"{}"),
        "model.safetensors",
    ),
    "model.safetensors header a list": (header(lambda h: [1], replace=True), "model.safetensors"),
    "model.safetensors tensor without dtype": (header(first_tensor(lambda t: t.pop("dtype"))), "model.safetensors"),
    "model.safetensors tensor of an unknown dtype": (
        header(first_tensor(lambda t: t.update(dtype="BOGUS"))),
        "model.safetensors",
    ),
    "model.safetensors tensor shape a word": (header(first_tensor(lambda t: t.update(shape="x"))), "model.safetensors"),
    "model.safetensors tensor offsets short": (
        header(first_tensor(lambda t: t.update(data_offsets=[0]))),
        "model.safetensors",
    ),
    "model.safetensors shape disagrees with its bytes": (
        header(first_tensor(lambda t: t.update(shape=[3]))),
        "model.safetensors",
    ),
    "model.safetensors integer weights": (
        header(first_tensor(lambda t: t.update(dtype="I32"))),
        "model.safetensors",
    ),
    **{k: (sharded(d), INDEX) for k, d in json_damages(INDEX).items()},
    "index without weight_map": (sharded(text(INDEX, "{}")), INDEX),
    "index weight_map a list": (sharded(text(INDEX, '{"weight_map": []}')), INDEX),
    "index naming a shard by a number": (sharded(text(INDEX, '{"weight_map": {"a": 1}}')), INDEX),
    "index naming a missing shard": (sharded(remove("model-00002-of-00002.safetensors")), INDEX),
    **{k: (d, "tokenizer.json") for k, d in json_damages("tokenizer.json").items()},
    "tokenizer.json without its model": (edit("tokenizer.json", lambda t: t.pop("model")), "tokenizer.json"),
    "tokenizer.json vocab a word": (edit("tokenizer.json", lambda t: t["model"].update(vocab="x")), "tokenizer.json"),
    **{k: (d, "tokenizer_config.json") for k, d in json_damages("tokenizer_config.json").items()},
    "tokenizer_config.json eos_token an object": (
        edit("tokenizer_config.json", lambda t: t.update(eos_token={"x": 1})),
        "tokenizer_config.json",
    ),
    "tokenizer_config.json added_tokens_decoder a word": (
        edit("tokenizer_config.json", lambda t: t.update(added_tokens_decoder="x")),
        "tokenizer_config.json",
    ),
    "special_tokens_map.json not JSON": (text("special_tokens_map.json", "{{"), "special_tokens_map.json"),
    "chat_template.jinja that does not parse": (text("chat_template.jinja", "{% if %}"), "chat_template.jinja"),
    "chat_template.jinja that raises": (
        text("chat_template.jinja", "{{ raise_exception('no system role') }}"),
        "chat_template.jinja",
    ),
    "chat_template.jinja empty": (text("chat_template.jinja", ""), "chat template"),
    # a tensor the model reads left out of the header (the bytes kept): named as missing
    "model.safetensors a tensor missing": (header(lambda h: h.pop("model.norm.weight")), "model.norm.weight"),
}


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    """A tiny transformers Qwen3 folder (weights, config, generation config) with a chat tokenizer, and
    conversations to fine-tune on."""
    root = tmp_path_factory.mktemp("start")
    hf = hf_model("qwen3", vocab_size=VOCAB, max_position_embeddings=SEQ, num_key_value_heads=2, head_dim=32)
    folder = write_tokenizer(save_folder(hf, root / "qwen3"))
    chats = write_jsonl(root / "chats.jsonl", conversations(8))
    before = untouched(root)
    yield folder, chats
    assert untouched(root) == before


def damaged_copy(src: Path, to: Path, damage: Damage) -> Path:
    """``src`` copied to ``to`` as hard links (no bytes copied: the run folder is 3.5 MB), then damaged; each damage
    writes the files it changes anew (``write_anew``), and each undamaged folder's fixture checks at its end that
    ``untouched`` still holds."""
    shutil.copytree(src, to, copy_function=os.link)
    damage(to)
    return to


def untouched(folder: Path) -> dict[Path, tuple[int, int]]:
    """Each file's size and modification time under ``folder``: a damage written through a link would change them."""
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*")) if p.is_file()}


def start_from(compose_cfg, folder: Path, chats: Path, cache: Path) -> None:
    """What ``python train.py model.init_from=FOLDER data=chat data.path=CHATS`` does before any worker starts."""
    from trainer.hf.start import adopt
    from trainer.observe.startup import StartClock
    from trainer.task import preflight

    overrides = ["parallel=single", "data=chat", f"data.seq_len={SEQ}", "data.global_batch_size=4"]
    overrides += [f"data.path={chats}", f"data.cache_dir={cache}", f"model.init_from={folder}"]
    cfg = compose_cfg(*overrides)
    adopt(cfg, overrides=overrides)
    preflight(cfg, run_dir=cache / "run", clock=StartClock.for_job(multirun=True))


def test_the_undamaged_folder_starts(compose_cfg, start, tmp_path):
    folder, chats = start
    start_from(compose_cfg, folder, chats, tmp_path)
    start_from(compose_cfg, damaged_copy(folder, tmp_path / "sharded", sharded()), chats, tmp_path / "again")


@pytest.mark.parametrize("case", sorted(MODEL_FOLDER))
def test_a_damaged_model_folder_is_refused_naming_the_file(compose_cfg, start, tmp_path, case):
    damage, named = MODEL_FOLDER[case]
    folder, chats = start
    copy = damaged_copy(folder, tmp_path / "model", damage)
    with pytest.raises(REFUSED) as refused:
        start_from(compose_cfg, copy, chats, tmp_path)
    assert named in str(refused.value), str(refused.value)


#: conversations data=chat reads: each line's problem named with its file and line
CHATS = {
    "not UTF-8": (b'{"messages": [\xff]}\n', "not UTF-8"),
    "not JSON": (b"hello\n", "not JSON"),
    "a list": (b"[1]\n", 'no "messages" list'),
    "messages a word": (b'{"messages": "x"}\n', 'no "messages" list'),
    "content a number": (
        b'{"messages": [{"role": "user", "content": 1}, {"role": "assistant", "content": "a"}]}\n',
        "no text content",
    ),
    "cut inside a line": (b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assis', "not JSON"),
}


@pytest.mark.parametrize("case", sorted(CHATS))
def test_damaged_conversations_are_refused_by_file_and_line(compose_cfg, start, tmp_path, case):
    content, words = CHATS[case]
    folder, _ = start
    chats = tmp_path / "chats.jsonl"
    chats.write_bytes(content)
    with pytest.raises(DataError) as refused:
        start_from(compose_cfg, folder, chats, tmp_path)
    assert f"{chats}:1: " in str(refused.value) and words in str(refused.value), str(refused.value)


def test_an_empty_conversations_file_is_refused(compose_cfg, start, tmp_path):
    folder, _ = start
    (tmp_path / "chats.jsonl").write_text("")
    with pytest.raises(DataError, match="no conversation in .*chats.jsonl"):
        start_from(compose_cfg, folder, tmp_path / "chats.jsonl", tmp_path)


# ---- a prepared dataset: data=tokens ---------------------------------------------------------

META = "metadata.json"
DATASET: dict[str, tuple[Damage, str]] = {
    **{k: (d, META) for k, d in json_damages(META).items()},
    "metadata.json splits a list": (edit(META, lambda m: m.update(splits=[])), META),
    "metadata.json a split's tokens a word": (edit(META, lambda m: m["splits"]["train"].update(tokens="x")), META),
    "metadata.json a shard without its file": (
        edit(META, lambda m: m["splits"]["train"]["shards"][0].pop("file")),
        META,
    ),
    "metadata.json tokenizer a word": (edit(META, lambda m: m.update(tokenizer="x")), META),
    "metadata.json vocab_size a word": (edit(META, lambda m: m["tokenizer"].update(vocab_size="x")), META),
    "metadata.json no validation split": (edit(META, lambda m: m["splits"].pop("validation")), META),
    "metadata.json no dtype": (edit(META, lambda m: m.pop("dtype")), META),
    "a shard missing": (remove("train_00000.bin"), "train_00000.bin"),
    "a shard cut short": (cut("train_00000.bin"), "train_00000.bin"),
    "a shard empty": (text("train_00000.bin", ""), "train_00000.bin"),
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from trainer.data.prepare import prepare

    root = tmp_path_factory.mktemp("dataset")
    for i in range(12):
        (root / "docs").mkdir(exist_ok=True)
        (root / "docs" / f"{i}.txt").write_text(f"document {i} says hello to the world. " * 20)
    prepare(inputs=[str(root / "docs")], output=str(root / "ds"), vocab_size=300, progress=False, log=lambda *a: None)
    before = untouched(root / "ds")
    yield root / "ds"
    assert untouched(root / "ds") == before


@pytest.mark.parametrize("case", sorted(DATASET))
def test_a_damaged_prepared_dataset_is_refused_naming_the_file(dataset, tmp_path, case):
    from trainer.data.datasets import TokenShards

    damage, named = DATASET[case]
    copy = damaged_copy(dataset, tmp_path / "ds", damage)
    with pytest.raises(DataError) as refused:
        data = TokenShards(path=str(copy), global_batch_size=2, seq_len=16)
        data.prepare()
        data.check_vocab(300)
    assert named in str(refused.value), str(refused.value)


# ---- a run folder: trainer.resume and export -------------------------------------------------

STEP = "checkpoints/step_0000001"
RUN: dict[str, tuple[Damage, str]] = {
    **{k: (d, MARKER) for k, d in json_damages(f"{STEP}/{MARKER}").items()},
    "marker without its model": (edit(f"{STEP}/{MARKER}", lambda m: m.pop("model")), MARKER),
    "marker model a word": (edit(f"{STEP}/{MARKER}", lambda m: m.update(model="x")), MARKER),
    "marker files a list": (edit(f"{STEP}/{MARKER}", lambda m: m.update(files=[1])), MARKER),
    "marker a file's size a word": (edit(f"{STEP}/{MARKER}", lambda m: m["files"].update({".metadata": "x"})), MARKER),
    ".metadata missing": (remove(f"{STEP}/.metadata"), ".metadata"),
    ".metadata cut short": (cut(f"{STEP}/.metadata"), ".metadata"),
    ".metadata damaged in place": (lambda r: _overwrite(r / STEP / ".metadata"), ".metadata"),
    "a .distcp file missing": (remove(f"{STEP}/__0_0.distcp"), "__0_0.distcp"),
    "no step folder": (lambda r: shutil.rmtree(r / STEP), "checkpoints"),
    "no checkpoints folder": (lambda r: shutil.rmtree(r / "checkpoints"), "checkpoints"),
}
#: the run's config, which only the export reads (the tokenizer of the run's data)
RUN_CONFIG: dict[str, tuple[Damage, str]] = {
    "config.yaml not YAML": (text(".hydra/config.yaml", "data: [\n"), "config.yaml"),
    "config.yaml a list": (text(".hydra/config.yaml", "- 1\n"), "config.yaml"),
    "config.yaml data a word": (text(".hydra/config.yaml", "data: x\n"), "config.yaml"),
    "a .distcp file damaged in place": (lambda r: _overwrite(r / STEP / "__0_0.distcp"), "step_0000001"),
}


def _overwrite(path: Path) -> None:
    """Garbage of the same size: the marker's sizes hold, the contents do not."""
    write_anew(path, b"x" * path.stat().st_size)


@pytest.fixture(scope="module")
def run_folder(compose_cfg_module, tmp_path_factory):
    """A run folder with one checkpoint of gpt2_debug, its marker as the checkpointer writes it (files and sizes,
    step, scheduler) and its config."""
    from tests.system.test_hf_export import write_run

    run = tmp_path_factory.mktemp("run")
    write_run(compose_cfg_module, run, "model=gpt2_debug")
    step = run / STEP
    marker = json.loads((step / MARKER).read_text())
    marker["files"] = {p.name: p.stat().st_size for p in step.iterdir() if p.name != MARKER}
    marker["scheduler"] = {}
    (step / MARKER).write_text(json.dumps(marker))
    before = untouched(run)
    yield run
    assert untouched(run) == before


@pytest.fixture(scope="module")
def compose_cfg_module(_composer):
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from tests.helpers import CONF

    def initialize():
        GlobalHydra.instance().clear()
        return initialize_config_dir(config_dir=str(CONF), version_base="1.3")

    def compose(*overrides: str):
        return _composer(overrides, initialize=initialize)

    return compose


def test_the_undamaged_run_folder_resumes_and_exports(compose_cfg, run_folder, tmp_path):
    from trainer.export import main
    from trainer.task import check_resume

    check_resume(compose_cfg("model=gpt2_debug", "data.seq_len=32", f"trainer.resume={run_folder / STEP}"), tmp_path)
    assert main([str(run_folder), "--hf", str(tmp_path / "hf")]) == 0


@pytest.mark.parametrize("case", sorted(RUN))
def test_a_damaged_checkpoint_is_refused_by_resume_naming_the_file(compose_cfg, run_folder, tmp_path, case):
    from trainer.task import check_resume

    damage, named = RUN[case]
    copy = damaged_copy(run_folder, tmp_path / "run", damage)
    cfg = compose_cfg("model=gpt2_debug", "data.seq_len=32", f"trainer.resume={copy / STEP}")
    with pytest.raises(CheckpointError) as refused:
        check_resume(cfg, tmp_path)
    assert named in str(refused.value) or "step_0000001" in str(refused.value), str(refused.value)


@pytest.mark.parametrize("case", sorted({**RUN, **RUN_CONFIG}))
def test_a_damaged_run_folder_is_refused_by_export_naming_the_file(run_folder, tmp_path, capsys, case):
    from trainer.export import main

    damage, named = {**RUN, **RUN_CONFIG}[case]
    copy = damaged_copy(run_folder, tmp_path / "run", damage)
    assert main([str(copy), "--hf", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and (named in err or "step_0000001" in err), err


# ---- a folder given to prepare --tokenizer ---------------------------------------------------

TOKENIZER_FOLDER: dict[str, tuple[Damage, str]] = {
    **{k: (d, "tokenizer.json") for k, d in json_damages("tokenizer.json").items()},
    **{k: (d, "tokenizer_config.json") for k, d in json_damages("tokenizer_config.json").items()},
    # with no eos_token in tokenizer_config.json, prepare reads the eos id from config.json, then
    # generation_config.json
    **{
        k: (lambda f, d=d: (text("tokenizer_config.json", "{}")(f), d(f)), "config.json")
        for k, d in json_damages("config.json").items()
    },
    **{
        k: (
            lambda f, d=d: (text("tokenizer_config.json", "{}")(f), text("config.json", "{}")(f), d(f)),
            "generation_config.json",
        )
        for k, d in json_damages("generation_config.json").items()
    },
}


@pytest.fixture(scope="module")
def tokenizer_folder(start, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok") / "folder"
    shutil.copytree(start[0], folder)
    docs = folder.parent / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("one two three. " * 50)
    before = untouched(folder)
    yield folder, docs
    assert untouched(folder) == before


@pytest.mark.parametrize("case", sorted(TOKENIZER_FOLDER))
def test_prepare_refuses_a_damaged_tokenizer_folder_naming_the_file(tokenizer_folder, tmp_path, capsys, case):
    from trainer.data.prepare import main

    damage, named = TOKENIZER_FOLDER[case]
    folder, docs = tokenizer_folder
    copy = damaged_copy(folder, tmp_path / "tok", damage)
    code = main(["--input", str(docs), "--output", str(tmp_path / "ds"), "--tokenizer", str(copy), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and named in err, err


def test_prepare_names_what_is_wrong_in_a_damaged_jsonl(tmp_path, capsys):
    from trainer.data.prepare import main

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.jsonl").write_bytes(b'{"text": "fine"}\n{"text": "cut')
    assert main(["--input", str(tmp_path / "docs"), "--output", str(tmp_path / "ds"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "a.jsonl: cannot be read as json" in err and "An error occurred" not in err, err


@pytest.mark.parametrize(
    "content, words",
    [(b'{"chosen": "\xff"}\n', "not UTF-8"), (b"hello\n", "not JSON"), (b"[1]\n", "not a JSON object")],
    ids=["not UTF-8", "not JSON", "a list"],
)
def test_damaged_preference_pairs_are_named_by_file_and_line(tmp_path, content, words):
    from trainer.data.preference import read_pairs

    path = tmp_path / "pairs.jsonl"
    path.write_bytes(content)
    found, problems = read_pairs([path])
    assert not found and len(problems) == 1 and problems[0].startswith(f"{path}:1: ") and words in problems[0], problems


#: the folder a run started from (model.init_from), which the export reads again for config.json's other keys
START_FOLDER = {
    "config.json not JSON": (text("config.json", "{"), "config.json"),
    "generation_config.json a list": (text("generation_config.json", "[]"), "generation_config.json"),
}


@pytest.mark.parametrize("case", sorted(START_FOLDER))
def test_export_refuses_a_damaged_folder_the_run_started_from_naming_the_file(run_folder, tmp_path, capsys, case):
    from trainer.export import main

    damage, named = START_FOLDER[case]
    start = tmp_path / "start"
    start.mkdir()
    (start / "config.json").write_text("{}")
    (start / "generation_config.json").write_text("{}")
    damage(start)
    copy = damaged_copy(
        run_folder, tmp_path / "run", edit(f"{STEP}/{MARKER}", lambda m: m["model"].update(init_from=str(start)))
    )
    assert main([str(copy), "--hf", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(start / named) in err, err
