"""Memory-mapped token stream for the whole-network trajectories (docs/benchmarks.md, Network).

A token file is a flat little-endian uint16/uint32 array (`OUT.bin`) plus a JSON header beside it
(`OUT.bin.json`: format, version, dtype, vocab size, token count). Nothing is downloaded: the
builder turns local text files into tokens with a byte-level tokenizer (byte b -> id b, one EOS
id 256 after each file), which is enough to train on real text with a fixed vocabulary.

`TokenStream.batch(step)` reads a different window of the file for every step (so a trajectory
never trains on one repeated sample), builds next-token labels from the unsharded window, applies
tail padding, counts the valid labels of the whole batch, and only then cuts out this rank's
contiguous CP shard. The loss of a sharded run therefore divides by the same global count as the
single-device reference.
"""

from __future__ import annotations

import json
import sysconfig
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gdn.cp.config import shard_range

FORMAT = "gdnval-tokens"
VERSION = 1
BYTE_VOCAB = 257  # bytes 0..255 and EOS
EOS_ID = 256
PAD_ID = 0
IGNORE_INDEX = -100
_DTYPES: dict[str, type[np.unsignedinteger]] = {"uint16": np.uint16, "uint32": np.uint32}
# Shift per pass over the file: a prime, so passes start at different offsets for any seq_len.
_WINDOW_STRIDE_PRIME = 7919


class TokenFileError(ValueError):
    """A token file that is missing, has a corrupt header, or does not match its header."""


def header_path(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.name + ".json")


@dataclass(frozen=True)
class TokenHeader:
    dtype: str
    vocab_size: int
    num_tokens: int
    tokenizer: str = "bytes"

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT,
                "version": VERSION,
                "dtype": self.dtype,
                "vocab_size": self.vocab_size,
                "num_tokens": self.num_tokens,
                "tokenizer": self.tokenizer,
            },
            indent=2,
        )


def read_header(path: str | Path) -> TokenHeader:
    """Parse and validate the JSON header of token file `path`; raise `TokenFileError` naming the fault."""
    path = Path(path)
    hpath = header_path(path)
    if not path.is_file():
        raise TokenFileError(f"token file {path} does not exist (build one with `gdnval data build`)")
    if not hpath.is_file():
        raise TokenFileError(f"token file {path} has no header {hpath}")
    try:
        raw = json.loads(hpath.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TokenFileError(f"corrupt header {hpath}: not valid JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise TokenFileError(f"corrupt header {hpath}: expected a JSON object, got {type(raw).__name__}")
    if raw.get("format") != FORMAT:
        raise TokenFileError(f"corrupt header {hpath}: format is {raw.get('format')!r}, expected {FORMAT!r}")
    if raw.get("version") != VERSION:
        raise TokenFileError(f"corrupt header {hpath}: version {raw.get('version')!r}, expected {VERSION}")
    dtype = raw.get("dtype")
    if dtype not in _DTYPES:
        raise TokenFileError(f"corrupt header {hpath}: dtype {dtype!r}, expected one of {sorted(_DTYPES)}")
    for key in ("vocab_size", "num_tokens"):
        value = raw.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise TokenFileError(f"corrupt header {hpath}: {key}={value!r}, expected a positive integer")
    vocab, n = raw["vocab_size"], raw["num_tokens"]
    if vocab > np.iinfo(_DTYPES[dtype]).max + 1:
        raise TokenFileError(f"corrupt header {hpath}: vocab_size={vocab} does not fit dtype {dtype}")
    itemsize = np.dtype(_DTYPES[dtype]).itemsize
    size = path.stat().st_size
    if size != n * itemsize:
        raise TokenFileError(
            f"token file {path} has {size} bytes but its header promises {n} {dtype} tokens "
            f"({n * itemsize} bytes)"
        )
    return TokenHeader(dtype=dtype, vocab_size=vocab, num_tokens=n, tokenizer=str(raw.get("tokenizer", "")))


def encode_bytes(text: bytes) -> np.ndarray:
    """The byte-level tokenizer: one id per byte (0..255)."""
    return np.frombuffer(text, dtype=np.uint8).astype(np.uint16)


def write_token_file(
    path: str | Path, tokens: np.ndarray, vocab_size: int, tokenizer: str = "custom"
) -> Path:
    """Write `tokens` (any integer array, all < vocab_size) as a token file with its header."""
    path = Path(path)
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or tokens.size == 0:
        raise ValueError(f"tokens must be a non-empty 1-D array, got shape {tokens.shape}")
    if tokens.min() < 0 or tokens.max() >= vocab_size:
        raise ValueError(
            f"token ids must lie in [0, {vocab_size}), got min {int(tokens.min())} "
            f"and max {int(tokens.max())}"
        )
    dtype = "uint16" if vocab_size <= 1 << 16 else "uint32"
    path.parent.mkdir(parents=True, exist_ok=True)
    tokens.astype(_DTYPES[dtype]).tofile(path)
    header = TokenHeader(dtype=dtype, vocab_size=vocab_size, num_tokens=int(tokens.size), tokenizer=tokenizer)
    header_path(path).write_text(header.to_json() + "\n")
    return path


def build_token_file(out: str | Path, texts: Sequence[str | Path]) -> TokenHeader:
    """Tokenize local text files byte by byte (EOS after each) into token file `out`."""
    if not texts:
        raise ValueError("no text files given; pass at least one local text file")
    parts: list[np.ndarray] = []
    for text in texts:
        p = Path(text)
        if not p.is_file():
            raise FileNotFoundError(f"text file {p} does not exist")
        parts.append(encode_bytes(p.read_bytes()))
        parts.append(np.array([EOS_ID], dtype=np.uint16))
    write_token_file(out, np.concatenate(parts), BYTE_VOCAB, tokenizer="bytes+eos")
    return read_header(out)


def sample_text_path() -> Path:
    """The short original text shipped with the package for tests and quick presets."""
    return Path(__file__).with_name("data") / "sample.txt"


def build_sample_token_file(out: str | Path) -> TokenHeader:
    """Token file from the shipped sample text (nothing downloaded)."""
    return build_token_file(out, [sample_text_path()])


def package_text_files() -> list[Path]:
    """The sample text plus this package's own sources (~150 KB): real text that ships wherever
    `gdn` is installed. Short runs only: 200 steps of 8K-token windows read it about 11 times
    over, and a 4-layer model memorises it (loss below 0.5 nats)."""
    root = Path(__file__).parent
    return [sample_text_path(), *sorted(root.rglob("*.py"))]


def stdlib_text_files() -> list[Path]:
    """The running interpreter's standard-library sources (31.5 MB on CPython 3.11): text
    every machine with Python has, enough that 200 steps of 8K tokens never read a token twice.
    Long trajectories need it: two runs that memorise a small corpus drift apart far beyond
    their numerical differences."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "__pycache__"}
    files = sorted(p for p in root.rglob("*.py") if skip.isdisjoint(p.relative_to(root).parts))
    if not files:
        raise FileNotFoundError(f"no Python sources under the standard library folder {root}")
    return files


CORPORA: dict[str, Callable[[], list[Path]]] = {
    "sample": lambda: [sample_text_path()],
    "package": package_text_files,
    "stdlib": stdlib_text_files,
}


def build_corpus_token_file(out: str | Path, corpus: str) -> TokenHeader:
    """Token file of a named corpus (a key of `CORPORA`): nothing is downloaded."""
    if corpus not in CORPORA:
        raise ValueError(f"unknown corpus {corpus!r}; expected one of {sorted(CORPORA)}")
    return build_token_file(out, CORPORA[corpus]())


@dataclass
class TokenBatch:
    """One step's batch on one CP rank. `num_valid` counts valid labels over the whole batch and
    all ranks, so `sum(per-token loss on this rank) / num_valid` summed over ranks is the
    single-device mean loss."""

    input_ids: torch.Tensor  # [B, T_local] int64
    labels: torch.Tensor  # [B, T_local] int64, IGNORE_INDEX where not trained on
    mask: torch.Tensor  # [B, T_local] int64, 1 = valid input token
    num_valid: int
    position_offset: int  # global position of this shard's first token
    step: int

    def to(self, device: torch.device | str) -> TokenBatch:
        return TokenBatch(
            self.input_ids.to(device),
            self.labels.to(device),
            self.mask.to(device),
            self.num_valid,
            self.position_offset,
            self.step,
        )


class TokenStream:
    """Reads batches of `batch_size` sequences of `seq_len` tokens from a token file.

    valid_lengths: per batch row, how many leading tokens are valid (tail padding after them);
    None means no padding. A label (the next token of the file) is trained on where its input
    token is valid.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        seq_len: int,
        batch_size: int = 1,
        cp_rank: int = 0,
        cp_size: int = 1,
        valid_lengths: Sequence[int] | None = None,
        model_vocab_size: int | None = None,
    ) -> None:
        self.header = read_header(path)
        self.path = Path(path)
        if seq_len < 2:
            raise ValueError(f"seq_len must be >= 2, got {seq_len}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        shard_range(seq_len, cp_size, cp_rank)  # a valid rank and a length the CP size divides
        if self.header.num_tokens < seq_len + 1:
            raise TokenFileError(
                f"token file {path} holds {self.header.num_tokens} tokens, fewer than one sequence of "
                f"seq_len + 1 = {seq_len + 1}"
            )
        if model_vocab_size is not None and self.header.vocab_size > model_vocab_size:
            raise ValueError(
                f"token file vocabulary {self.header.vocab_size} exceeds the model's vocab_size "
                f"{model_vocab_size}; tokens must be < {model_vocab_size}"
            )
        if valid_lengths is not None:
            valid_lengths = list(valid_lengths)
            if len(valid_lengths) != batch_size:
                raise ValueError(
                    f"valid_lengths has {len(valid_lengths)} entries, expected batch_size={batch_size}"
                )
            for v in valid_lengths:
                if not 1 <= v <= seq_len:
                    raise ValueError(f"valid length {v} outside [1, seq_len={seq_len}]")
        self.valid_lengths = valid_lengths
        self.seq_len, self.batch_size = seq_len, batch_size
        self.cp_rank, self.cp_size = cp_rank, cp_size
        self.vocab_limit = self.header.vocab_size if model_vocab_size is None else model_vocab_size
        self._tokens = np.memmap(self.path, dtype=_DTYPES[self.header.dtype], mode="r")

    @property
    def local_len(self) -> int:
        return self.seq_len // self.cp_size

    def window_start(self, index: int) -> int:
        """Start of sequence number `index` (step * batch_size + row).

        The file is cut into n windows of seq_len tokens; pass p = index // n over the file shifts
        all windows by (p * prime) % seq_len tokens, so consecutive passes read different
        sequences even when a run needs more windows than the file holds.
        """
        span = self.header.num_tokens - self.seq_len  # number of valid starts (need seq_len + 1 tokens)
        n = max(1, span // self.seq_len)
        slack = span - (n - 1) * self.seq_len  # >= 1: room for the shift of the last window
        p, k = divmod(index, n)
        return k * self.seq_len + (p * _WINDOW_STRIDE_PRIME) % min(slack, self.seq_len)

    def full_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Unsharded (input_ids, labels, mask) of `step`, each [B, T]."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        B, T = self.batch_size, self.seq_len
        windows = []
        for b in range(B):
            start = self.window_start(step * B + b)
            windows.append(np.asarray(self._tokens[start : start + T + 1], dtype=np.int64))
        arr = torch.from_numpy(np.stack(windows))
        top = int(arr.max())
        if top >= self.vocab_limit or int(arr.min()) < 0:
            raise TokenFileError(
                f"token file {self.path} holds token id {top} at step {step}, but ids must be < "
                f"{self.vocab_limit} (vocab size)"
            )
        inputs, labels = arr[:, :-1].clone(), arr[:, 1:].clone()
        mask = torch.ones(B, T, dtype=torch.int64)
        if self.valid_lengths is not None:
            pos = torch.arange(T)
            for b, v in enumerate(self.valid_lengths):
                mask[b] = (pos < v).long()
                inputs[b, v:] = PAD_ID
                labels[b, v:] = IGNORE_INDEX
        return inputs, labels, mask

    def batch(self, step: int) -> TokenBatch:
        """This CP rank's shard of step `step`, with the global valid-label count."""
        inputs, labels, mask = self.full_batch(step)
        num_valid = int((labels != IGNORE_INDEX).sum())
        lo = self.cp_rank * self.local_len
        hi = lo + self.local_len
        return TokenBatch(
            input_ids=inputs[:, lo:hi].contiguous(),
            labels=labels[:, lo:hi].contiguous(),
            mask=mask[:, lo:hi].contiguous(),
            num_valid=num_valid,
            position_offset=lo,
            step=step,
        )
