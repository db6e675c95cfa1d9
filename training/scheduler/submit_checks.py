"""What ``ragpool submit`` checks against the shared storage before a run reaches a paid GPU node (torch-free).

One function, :func:`storage_problems`, for both submit paths: the run API's (its pod mounts the shared storage
read-only) and the direct-Redis CLI's (on a machine where ``RAGPOOL_SHARED_ROOT`` is the shared storage); both call
it through ``training.scheduler.fit.fit_problems``. It returns ``(problems, notes)`` like the fit checks, every
problem naming the spec key it concerns, so a spec gets all of them at once (exit 2, nothing enqueued):

- ``data``: a run names its data (``data.corpus``, ``data.qa_train``, ``data.qa_eval``: every stage opens all
  three, training/components/run_data.py); a spec without them would silently train on the synthetic defaults
  of ``training.config.sections.DataConfig``, so it is refused wherever it is submitted;
- each data file exists and parses: every line a JSON object of the stage's record shape (corpus ``{id, text}``,
  QA ``{question, answer, positive_ids[, hard_negative_ids]}``: training/components/data.py and corpus.py), read
  up to :data:`MAX_CHECKED_BYTES` per file (the stage validates the rest, and the ids across files, when it
  starts; a note says so);
- a corpus directory: prepared in place (``ragpool data prepare``: its manifest, ``_corpus/manifest.json``, is
  ready), or its ``*.jsonl`` shards exist and parse as above (the stage prepares them into the run);
- a dataset still being imported (``datasets/NAME/.import/status.json`` not ``ready``) is refused;
- each model directory (``models.*`` and the model keys among the hyper-parameters) exists under the shared root;
  a name that is not there and reads like a Hugging Face hub id (``bert-base-uncased``, ``org/name``) gets the
  hint: the pool has no internet, put the model under ``<shared root>/models`` (or import it with ``ragpool data
  import`` into ``datasets/NAME``).

Where the shared root is not a directory on this machine (a laptop on the direct path), the storage checks are
skipped with a note; the ``data`` requirement is not.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from contract.datasets import DATASETS_DIR, IMPORT_READY_STATE, IMPORT_STATE_DIR, STATUS_FILE
from contract.messages import shown
from contract.paths import DEFAULT_SHARED_ROOT, PathError, resolve_confined
from training.scheduler.spec import MODEL_FIELDS, RunSpec

REQUIRED_DATA = ("corpus", "qa_train", "qa_eval")
"""The ``data`` keys every run names (each stage opens the three)."""
MAX_CHECKED_BYTES = 64 * 1024 * 1024
"""How much of one data file (or of a corpus directory's shards together) submit reads; the stage checks the rest."""
MAX_SHOWN_RECORDS = 3
"""Bad records named per file in a problem (with the count of all found)."""
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}(/[A-Za-z0-9][A-Za-z0-9_.-]{0,95})?")
"""A Hugging Face hub repo id: ``name`` or ``org/name``."""
MODELS_DIR = "models"
"""Where the hint tells to put a model on the shared storage (``<shared root>/models/NAME``, the README's examples)."""
_SHARED_DIRS = (DATASETS_DIR, MODELS_DIR)
"""First path parts that are plainly paths on the shared storage (no hub hint for them)."""


def storage_problems(spec: RunSpec, shared_root: str) -> tuple[list[tuple[str, str]], list[str]]:
    """``(problems, notes)`` of ``spec`` against the shared storage at ``shared_root`` (see the module doc)."""
    problems = [(f"data.{name}", "required: name the run's data under the shared root (every stage reads "
                                 "corpus, qa_train and qa_eval; there is no default dataset in the pool)")
                for name in REQUIRED_DATA if name not in spec.data]
    root = Path(shared_root)
    if not root.is_dir():
        return problems, [f"data and model directories not checked: the shared root {shared_root} is not mounted "
                          f"here (submit through the run API, or where {DEFAULT_SHARED_ROOT} is mounted)"]
    notes: list[str] = []
    for name, rel in spec.data.items():
        problems += _data_problems(root, f"data.{name}", rel, "corpus" if name == "corpus" else "qa", notes)
    for key, rel in _model_paths(spec):
        problems += _model_problems(root, key, rel)
    return problems, notes


def _model_paths(spec: RunSpec) -> list[tuple[str, str]]:
    """``(spec key, shared-root-relative path)`` of every model directory the spec names (not ``""``)."""
    out = [(f"models.{name}", rel) for name, rel in spec.models.items() if rel]
    for section, key in MODEL_FIELDS.values():
        rel = spec.hyperparameters.get(section, {}).get(key)
        if rel:
            out.append((f"hyperparameters.{section}.{key}", rel))
    return out


def _resolve(root: Path, key: str, rel: str) -> tuple[Path | None, list[tuple[str, str]]]:
    try:
        return resolve_confined(root, rel), []
    except PathError as err:
        return None, [(key, f"{shown(rel)} {err}")]


def _model_problems(root: Path, key: str, rel: str) -> list[tuple[str, str]]:
    path, problems = _resolve(root, key, rel)
    if path is None or path.is_dir():
        return problems
    what = "is a file, not a model directory" if path.exists() else "does not exist"
    message = f"{root / rel} {what}"
    if not path.exists() and _HUB_ID.fullmatch(rel) and rel.split("/", 1)[0] not in _SHARED_DIRS:
        message += (f"; if {rel!r} is a Hugging Face hub name: the pool has no internet, so put the model's "
                    f"directory on the shared storage and name its path: copy it under {root / MODELS_DIR} "
                    f"({MODELS_DIR}/NAME), or `ragpool data import s3://BUCKET/PREFIX {DATASETS_DIR}/NAME` "
                    f"({DATASETS_DIR}/NAME)")
    return [(key, message)]


def _data_problems(root: Path, key: str, rel: str, kind: str, notes: list[str]) -> list[tuple[str, str]]:
    path, problems = _resolve(root, key, rel)
    if path is None:
        return problems
    importing = _import_state(root, rel)
    if importing is not None:
        return [(key, f"{root / rel} is in a dataset whose import is {importing}, not {IMPORT_READY_STATE}; "
                      f"`ragpool data status {rel.split('/')[1]}` follows it")]
    if not path.exists():
        return [(key, f"{root / rel} does not exist (copy the data there, or `ragpool data import`)")]
    if path.is_dir():
        if kind != "corpus":
            return [(key, f"{root / rel} is a directory; {key} is one JSONL file")]
        return _corpus_dir_problems(root, key, rel, path, notes)
    return _file_problems(key, [path], kind, notes)


def _import_state(root: Path, rel: str) -> str | None:
    """The state of the import of the dataset ``rel`` lies in, when one is recorded and it is not ready."""
    parts = rel.split("/")
    if len(parts) < 2 or parts[0] != DATASETS_DIR:
        return None
    status = root / DATASETS_DIR / parts[1] / IMPORT_STATE_DIR / STATUS_FILE
    try:
        with open(status, "rb") as fh:
            state = json.loads(fh.read(1024 * 1024)).get("state")
    except (OSError, ValueError, AttributeError):
        return None
    return None if state == IMPORT_READY_STATE else str(state)


def _corpus_dir_problems(root: Path, key: str, rel: str, path: Path, notes: list[str]) -> list[tuple[str, str]]:
    from training.components.corpus import FORMAT, MANIFEST, PREPARED_DIR, shard_files
    from training.components.data import DataError

    manifest = path / PREPARED_DIR / MANIFEST
    if manifest.is_file():
        try:
            with open(manifest, "rb") as fh:
                fmt = json.loads(fh.read(16 * 1024 * 1024)).get("format")
        except (OSError, ValueError, AttributeError) as err:
            return [(key, f"{manifest} is not readable JSON ({err}); prepare it again: `ragpool data prepare {rel}`")]
        if fmt != FORMAT:
            return [(key, f"{manifest} has format {shown(fmt)}, not {FORMAT}; prepare it again: "
                          f"`ragpool data prepare {rel}`")]
        return []
    try:
        shards = shard_files(path)
    except DataError as err:
        return [(key, str(err))]
    notes.append(f"{key}: {root / rel} is not prepared in place; the run prepares it when it starts "
                 f"(`ragpool data prepare {rel}` does it once for every run)")
    return _file_problems(key, shards, "corpus", notes)


def _file_problems(key: str, files: list[Path], kind: str, notes: list[str]) -> list[tuple[str, str]]:
    """Every line of ``files`` (up to :data:`MAX_CHECKED_BYTES` together) a record of ``kind``."""
    from training.components.corpus import _validate

    errors: list[str] = []
    records, bad, budget = 0, 0, MAX_CHECKED_BYTES
    for path in files:
        try:
            fh = open(path, "rb")
        except OSError as err:
            return [(key, f"{path} cannot be read ({err.strerror})")]
        with fh:
            for lineno, line in enumerate(fh, start=1):
                budget -= len(line)
                if budget < 0:
                    notes.append(f"{key}: the first {MAX_CHECKED_BYTES // 2**20} MiB checked; the stage checks the "
                                 "rest when it starts")
                    break
                if not line.strip():
                    continue
                records += 1
                before = len(errors)
                where = f"{path.name}:{lineno}"
                if kind == "corpus":
                    _validate(where, line, errors)
                else:
                    _check_qa_line(where, line, errors)
                bad += len(errors) > before
        if budget < 0:
            break
    if errors:
        shown_errors = "; ".join(e if len(e) <= 200 else e[:197] + "..." for e in errors[:MAX_SHOWN_RECORDS])
        more = f" (and {len(errors) - MAX_SHOWN_RECORDS} more)" if len(errors) > MAX_SHOWN_RECORDS else ""
        return [(key, f"{bad} bad record(s) of {records} read: {shown_errors}{more}")]
    if not records:
        return [(key, f"{files[0] if len(files) == 1 else files[0].parent} has no records")]
    return []


def _check_qa_line(where: str, line: bytes, errors: list[str]) -> None:
    from training.components.data import check_qa_record

    try:
        rec = json.loads(line)
    except (ValueError, UnicodeDecodeError) as err:
        errors.append(f"{where}: invalid JSON ({getattr(err, 'msg', err)})")
        return
    if not isinstance(rec, dict):
        errors.append(f"{where}: record must be a JSON object, got {type(rec).__name__}")
    else:
        check_qa_record(where, rec, errors)
