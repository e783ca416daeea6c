"""Data for a fine-tune, encoded with the tokenizer its weights were trained with: ``python -m trainer.data.prepare
--tokenizer DIR`` takes a Hugging Face model folder (its tokenizer.json, and the end-of-text token its
tokenizer_config.json names), and the export ships that folder's tokenizer files, so transformers encodes text to
the ids the run trained on. In-process."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import write_corpus
from trainer.data.prepare import PrepareError, prepare, train_bpe
from trainer.data.shards import read_metadata

EOS = "<|eot|>"  # not among prepare's default candidates: found only through tokenizer_config.json


@pytest.fixture(scope="module")
def hf_tokenizer_folder(tmp_path_factory):
    """A Hugging Face folder's tokenizer (tokenizer.json + tokenizer_config.json naming its end-of-text token)."""
    from transformers import PreTrainedTokenizerFast

    docs = write_corpus(tmp_path_factory.mktemp("tok_corpus"))
    tok = train_bpe(iter(docs), vocab_size=300, count=len(docs), eos=EOS, show_progress=False)
    folder = tmp_path_factory.mktemp("hf") / "model"
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS).save_pretrained(folder)
    return folder


def test_prepare_takes_a_model_folder_and_its_export_ships_that_tokenizer(hf_tokenizer_folder, tmp_path):
    from transformers import AutoTokenizer

    from trainer.hf.tokenizer import write_tokenizer

    docs = write_corpus(tmp_path / "corpus", n_text=3, words=80)
    out = tmp_path / "data"
    meta = prepare(inputs=[str(tmp_path / "corpus")], output=str(out), tokenizer=str(hf_tokenizer_folder), log=print)
    reference = AutoTokenizer.from_pretrained(hf_tokenizer_folder)
    assert meta["tokenizer"]["eos_token"] == EOS and meta["tokenizer"]["eos_id"] == reference.eos_token_id
    assert meta["tokenizer"]["source"] == str(hf_tokenizer_folder / "tokenizer.json")
    train = np.concatenate(
        [np.fromfile(out / s["file"], dtype=meta["dtype"]) for s in meta["splits"]["train"]["shards"]]
    )
    encoded = {tuple(reference.encode(d, add_special_tokens=False) + [reference.eos_token_id]) for d in docs}
    first = train[: int(np.flatnonzero(train == reference.eos_token_id)[0]) + 1]
    assert tuple(first.tolist()) in encoded  # the shards hold the folder tokenizer's ids

    exported = tmp_path / "export"
    exported.mkdir()
    info = write_tokenizer(exported, data={"name": "tokens", "path": str(out)}, model={"vocab_size": 300})
    assert info == {"source": str(hf_tokenizer_folder), "eos_token_id": reference.eos_token_id}
    shipped = AutoTokenizer.from_pretrained(exported)
    assert shipped.eos_token == EOS and shipped.encode(docs[0]) == reference.encode(docs[0])
    assert read_metadata(out)["tokenizer"]["sha256"]  # the dataset still names the file it was encoded with


def test_a_folder_without_tokenizer_json_is_refused(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    with pytest.raises(PrepareError, match="the folder has no tokenizer.json"):
        prepare(inputs=[str(tmp_path)], output=str(tmp_path / "out"), tokenizer=str(tmp_path / "model"))


def test_a_folder_naming_its_end_of_text_only_in_config_json_needs_no_eos_token(hf_tokenizer_folder, tmp_path):
    """Many model folders give eos_token_id in config.json alone: prepare takes its token from there."""
    import json
    import shutil

    from transformers import AutoTokenizer

    folder = tmp_path / "model"
    folder.mkdir()
    shutil.copyfile(hf_tokenizer_folder / "tokenizer.json", folder / "tokenizer.json")
    eos_id = AutoTokenizer.from_pretrained(hf_tokenizer_folder).eos_token_id
    write_corpus(tmp_path / "corpus", n_text=2, words=60)
    with pytest.raises(PrepareError, match="name it with --eos-token"):  # nothing names it: refused
        prepare(inputs=[str(tmp_path / "corpus")], output=str(tmp_path / "a"), tokenizer=str(folder), log=print)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "eos_token_id": [eos_id, 7]}))
    meta = prepare(inputs=[str(tmp_path / "corpus")], output=str(tmp_path / "b"), tokenizer=str(folder), log=print)
    assert (meta["tokenizer"]["eos_token"], meta["tokenizer"]["eos_id"]) == (EOS, eos_id)
