"""Token stream: builder, header validation, per-step windows, CP sharding, labels and bad inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from gdn.data import (
    BYTE_VOCAB,
    EOS_ID,
    IGNORE_INDEX,
    TokenFileError,
    TokenStream,
    build_corpus_token_file,
    build_token_file,
    header_path,
    read_header,
    sample_text_path,
    stdlib_text_files,
    write_token_file,
)


def test_builder_is_byte_level_with_eos(tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_bytes("héllo".encode())
    b.write_bytes(b"xy")
    header = build_token_file(tmp_path / "t.bin", [a, b])
    tokens = np.fromfile(tmp_path / "t.bin", dtype=np.uint16)
    expected = [*"héllo".encode(), EOS_ID, *b"xy", EOS_ID]
    assert tokens.tolist() == expected
    assert (header.dtype, header.vocab_size, header.num_tokens) == ("uint16", BYTE_VOCAB, len(expected))


def test_sample_text_is_real_text(token_file: Path) -> None:
    header = read_header(token_file)
    assert header.num_tokens == len(sample_text_path().read_bytes()) + 1
    assert header.num_tokens > 4096


@pytest.mark.slow  # tokenizes the whole standard library
def test_stdlib_corpus_covers_a_long_run_without_rereading(tmp_path: Path) -> None:
    """The presets' 200 steps of 8K tokens must read fresh text every step (no second pass)."""
    files = stdlib_text_files()
    assert all("site-packages" not in f.parts for f in files)
    header = build_corpus_token_file(tmp_path / "stdlib.bin", "stdlib")
    assert header.num_tokens == sum(f.stat().st_size + 1 for f in files)
    stream = TokenStream(tmp_path / "stdlib.bin", seq_len=8192)
    starts = [stream.window_start(i) for i in range(200)]
    assert starts == [i * 8192 for i in range(200)]  # one pass, consecutive windows
    with pytest.raises(ValueError, match="unknown corpus 'web'"):
        build_corpus_token_file(tmp_path / "x.bin", "web")


def test_each_step_reads_a_different_sequence(token_file: Path) -> None:
    stream = TokenStream(token_file, seq_len=128, batch_size=2)
    seen = set()
    for step in range(80):  # past the first pass through the file, so the wrap-around path runs too
        inputs, labels, mask = stream.full_batch(step)
        for row in inputs:
            seen.add(tuple(row.tolist()))
        # labels are the next tokens of the file
        assert torch.equal(inputs[:, 1:], labels[:, :-1])
        assert bool(mask.all())
    assert len(seen) == 160


def test_labels_padding_and_cp_shards_reassemble(token_file: Path) -> None:
    T, P = 64, 4
    full = TokenStream(token_file, seq_len=T, batch_size=2, valid_lengths=[T, 37])
    inputs, labels, mask = full.full_batch(3)
    assert mask[1].tolist() == [1] * 37 + [0] * (T - 37)
    assert bool((labels[1, 37:] == IGNORE_INDEX).all()) and bool((labels[1, :37] != IGNORE_INDEX).all())
    assert bool((inputs[1, 37:] == 0).all())
    shards = [
        TokenStream(token_file, seq_len=T, batch_size=2, cp_rank=r, cp_size=P, valid_lengths=[T, 37])
        for r in range(P)
    ]
    shards = [s.batch(3) for s in shards]
    assert torch.equal(torch.cat([s.input_ids for s in shards], dim=1), inputs)
    assert torch.equal(torch.cat([s.labels for s in shards], dim=1), labels)
    assert torch.equal(torch.cat([s.mask for s in shards], dim=1), mask)
    assert [s.position_offset for s in shards] == [0, 16, 32, 48]
    # every rank carries the same global valid-label count
    assert {s.num_valid for s in shards} == {T + 37}


def test_sequence_not_divisible_by_cp_size(token_file: Path) -> None:
    with pytest.raises(ValueError, match=r"sequence length 100 is not divisible by the CP size 3"):
        TokenStream(token_file, seq_len=100, cp_size=3)


def test_tokens_outside_vocabulary(tmp_path: Path) -> None:
    path = tmp_path / "t.bin"
    write_token_file(path, np.arange(300) % 50, vocab_size=60)
    with pytest.raises(ValueError, match=r"vocabulary 60 exceeds the model's vocab_size 40"):
        TokenStream(path, seq_len=16, model_vocab_size=40)
    # a file whose bytes hold ids beyond its header's vocabulary is caught when read
    np.full(300, 59, dtype=np.uint16).tofile(path)
    header = json.loads(header_path(path).read_text())
    header["vocab_size"] = 50
    header_path(path).write_text(json.dumps(header))
    with pytest.raises(TokenFileError, match=r"token id 59 .* must be < 50"):
        TokenStream(path, seq_len=16).batch(0)
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 10\)"):
        write_token_file(tmp_path / "u.bin", np.array([3, 10]), vocab_size=10)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TokenFileError, match=r"does not exist"):
        TokenStream(tmp_path / "nope.bin", seq_len=8)
    (tmp_path / "bare.bin").write_bytes(b"\0\0" * 10)
    with pytest.raises(TokenFileError, match=r"has no header"):
        read_header(tmp_path / "bare.bin")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda h: "{not json", r"not valid JSON"),
        (lambda h: json.dumps([1, 2]), r"expected a JSON object"),
        (lambda h: json.dumps({**h, "format": "other"}), r"format is 'other'"),
        (lambda h: json.dumps({**h, "dtype": "int8"}), r"dtype 'int8'"),
        (lambda h: json.dumps({**h, "vocab_size": -3}), r"vocab_size=-3"),
        (lambda h: json.dumps({**h, "num_tokens": h["num_tokens"] + 1}), r"header promises"),
        (lambda h: json.dumps({k: v for k, v in h.items() if k != "num_tokens"}), r"num_tokens=None"),
    ],
)
def test_corrupt_header(tmp_path: Path, mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "t.bin"
    write_token_file(path, np.arange(100) % 7, vocab_size=7)
    header = json.loads(header_path(path).read_text())
    header_path(path).write_text(mutate(header))
    with pytest.raises(TokenFileError, match=message):
        read_header(path)


def test_too_short_file_and_bad_valid_lengths(tmp_path: Path) -> None:
    path = tmp_path / "t.bin"
    write_token_file(path, np.arange(10), vocab_size=10)
    with pytest.raises(TokenFileError, match=r"fewer than one sequence"):
        TokenStream(path, seq_len=16)
    write_token_file(path, np.arange(100) % 10, vocab_size=10)
    with pytest.raises(ValueError, match=r"valid length 17 outside"):
        TokenStream(path, seq_len=16, valid_lengths=[17])
    with pytest.raises(ValueError, match=r"valid_lengths has 1 entries, expected batch_size=2"):
        TokenStream(path, seq_len=16, batch_size=2, valid_lengths=[4])


def test_cli_data_build(tmp_path: Path) -> None:
    from service.cli import main

    out = tmp_path / "cli.bin"
    result = CliRunner().invoke(main, ["data", "build", str(out), str(sample_text_path())])
    assert result.exit_code == 0, result.output
    assert read_header(out).num_tokens == len(sample_text_path().read_bytes()) + 1
    bad = CliRunner().invoke(main, ["data", "build", str(out), str(tmp_path / "missing.txt")])
    assert bad.exit_code == 1 and "does not exist" in bad.output
