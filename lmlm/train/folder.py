"""The run folder: what a training run writes in ``out_dir``, and how a new run or a resumed one claims it.

A run writes ``train_config.json``, ``summary.json``, ``train_log.jsonl``, ``state/`` (the training
state, for ``--resume``), ``checkpoint/``, ``train_stats.json`` and, for a BPE trained on its
documents, ``tokenizer/``. A new run (no ``resume``) in a folder that holds an older run replaces
it: the older run's files are removed before the new one writes any, so a later ``--resume`` never
picks up the older run's state and no checkpoint mixes runs. ``resume`` without a saved state starts
from step 0 and says so. A folder that holds something else lmlm made (token shards, a checkpoint, a
knowledge base) is refused. Exercised by ``lmlm train ... --out DIR [--resume]``.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from ..jsonio import write_json
from .config import TrainConfig, TrainConfigError

__all__ = ["LOG_FILE", "CONFIG_FILE", "SUMMARY_FILE", "STATE_DIR", "CHECKPOINT_DIR", "TOKENIZER_DIR",
           "check_out_dir", "open_run_folder", "check_resume"]

LOG_FILE = "train_log.jsonl"
CONFIG_FILE = "train_config.json"
SUMMARY_FILE = "summary.json"
STATS_FILE = "train_stats.json"
STATE_DIR = "state"
CHECKPOINT_DIR = "checkpoint"
TOKENIZER_DIR = "tokenizer"
# everything a run writes in its folder (the trackers' logs aside)
RUN_FILES = (CONFIG_FILE, SUMMARY_FILE, LOG_FILE, STATS_FILE, STATE_DIR, STATE_DIR + ".tmp", CHECKPOINT_DIR,
             TOKENIZER_DIR)

# Fields that may change when a run is resumed: they do not change which batches are seen or how.
_RESUMABLE_FIELDS = {"resume", "max_seconds", "stop_step", "eval_every", "save_every", "log_every", "progress",
                     "threads", "compile", "out_dir", "data", "eval_data", "micro_batch_size", "grad_accum",
                     "report_to", "grad_checkpointing", "attention"}


def check_out_dir(out_dir: str | Path) -> None:
    """Refuse a run folder that holds token shards, a model or a knowledge base (a run would write into it)."""
    from ..data.shards import MANIFEST
    from ..kb.store import DB_FILENAME

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise TrainConfigError(f"out_dir {out}: is a file; give a folder for the run")
    for name, what in ((MANIFEST, "a token shards folder"), ("config.json", "a model folder"),
                       (DB_FILENAME, "a knowledge base")):
        if (out / name).exists():
            raise TrainConfigError(f"out_dir {out}: is {what}, not a training run folder; choose another folder "
                                   "for the run (--out)")


def holds_run(out_dir: Path) -> bool:
    """Whether ``out_dir`` holds what a training run wrote."""
    return (out_dir / CONFIG_FILE).exists() or (out_dir / STATE_DIR / "trainer_state.json").exists()


def open_run_folder(accelerator, config: TrainConfig, resolved: dict[str, Any], summary: dict[str, Any],
                    keep_tokenizer: bool = False) -> bool:
    """Create ``out_dir``, write the resolved config and data summary, and say whether to resume.

    A new run first removes an older run's files (``keep_tokenizer``: all but the ``tokenizer/`` this
    run has just trained there).
    """
    out_dir = Path(config.out_dir)
    resuming = config.resume and (out_dir / STATE_DIR / "trainer_state.json").exists()
    if accelerator.is_main_process:
        out_dir.mkdir(parents=True, exist_ok=True)
        if resuming:
            check_resume(out_dir / CONFIG_FILE, resolved)
            saved = json.loads((out_dir / STATE_DIR / "trainer_state.json").read_text())["step"]
            if (log := out_dir / LOG_FILE).exists():  # the steps after the saved state run again: logged once
                log.write_text("".join(x for x in log.read_text().splitlines(True) if json.loads(x)["step"] <= saved))
        else:
            if config.resume:
                print(f"{out_dir}: no saved training state to resume ({STATE_DIR}/ is missing): training starts "
                      "from step 0", file=sys.stderr, flush=True)
            if holds_run(out_dir):  # a new run replaces the older one: nothing of it is left to mix in
                _remove_run(out_dir, keep=(TOKENIZER_DIR,) if keep_tokenizer else ())
        write_json(out_dir / CONFIG_FILE, resolved)
        write_json(out_dir / SUMMARY_FILE, summary)  # atomically, as every summary
    accelerator.wait_for_everyone()
    return resuming


def _remove_run(out_dir: Path, keep: tuple[str, ...] = ()) -> None:
    for name in RUN_FILES:
        path = out_dir / name
        if name in keep or not (path.exists() or path.is_symlink()):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def check_resume(path: Path, resolved: dict[str, Any]) -> None:
    """Refuse to resume a run whose data or recipe changed (the saved batches would not line up)."""
    if not path.exists():
        return
    old = json.loads(path.read_text())
    diffs = []
    for key in set(old) | set(resolved):
        a, b = old.get(key), resolved.get(key)
        if key == "train":
            a = {k: v for k, v in (a or {}).items() if k not in _RESUMABLE_FIELDS}
            b = {k: v for k, v in (b or {}).items() if k not in _RESUMABLE_FIELDS}
            diffs += [f"train.{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b))
                      if json.dumps(a.get(k)) != json.dumps(b.get(k))]
        elif key != "num_processes" and json.dumps(a) != json.dumps(b):
            diffs.append(f"{key}: {a!r} -> {b!r}")
    if diffs:
        raise TrainConfigError(f"cannot resume from {path.parent}: the run changed ({'; '.join(diffs)})")
