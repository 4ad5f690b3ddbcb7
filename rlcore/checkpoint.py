"""Atomic checkpoints: everything needed to continue a run exactly where it stopped.

A checkpoint is written into a temporary directory beside its final place, flushed, then renamed
into place; the ``latest`` pointer is replaced atomically afterwards. A run killed at any moment
therefore leaves either the previous checkpoint or the new one, never a half-written one.
The actor is saved with ``save_pretrained`` (adapters only with LoRA), so a checkpoint's ``model``
directory is also a plain Hugging Face directory.

Each checkpoint records the size and SHA-256 of every file in ``checksums.json``, written (atomically)
before ``trainer_state.json``, whose presence marks the checkpoint complete. Resuming verifies them
and falls back to the newest intact checkpoint, saying which file was bad; checkpoints written
before checksums existed are taken as they are. A save that fails (a full disk) removes its
temporary directory and leaves the previous checkpoint in place.

Importing this module does not import torch (``rlcore run --dry-run`` and launchers look for
checkpoints through it).
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import random
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loguru import logger

from rlcore.errors import RlcoreError

if TYPE_CHECKING:
    import torch

STATE_FILE = "trainer_state.json"
CHECKSUMS_FILE = "checksums.json"  # {"files": {relative path: {"size": bytes, "sha256": hex}}}
LISTING_DIGEST_KEY = "checksums_sha256"  # in the state file: the SHA-256 of checksums.json's text
_UNVERIFIABLE_SAID: set[str] = set()  # checkpoints without checksums already warned about
_STALE_POINTER_SAID: set[str] = set()  # ``latest`` pointers already said to be stale
_NO_SPACE = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def file_digest(path: Path) -> dict[str, Any]:
    """``{"size": bytes, "sha256": hex}`` of one file."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return {"size": size, "sha256": h.hexdigest()}


def _digests(root: Path, skip: set[str] = frozenset()) -> dict[str, dict[str, Any]]:
    """The digests of the files under ``root`` (paths relative to it, "/"-separated), but ``skip``."""
    out = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel not in skip and rel not in (STATE_FILE, CHECKSUMS_FILE):
            out[rel] = file_digest(path)
    return out


def verify_checkpoint(path: Path) -> str | None:
    """What is wrong with the complete checkpoint ``path`` (naming the bad file), or None when it is
    intact: its state file parses and every file ``checksums.json`` lists has the recorded size
    and SHA-256, and ``checksums.json`` itself has the digest the state file recorded. A checkpoint
    whose state file records no such digest and that has no ``checksums.json`` (written before
    they existed) counts as intact when its state file parses, with a warning that it cannot be
    verified."""
    try:
        state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"{path / STATE_FILE} is unreadable ({exc})"
    recorded = state.get(LISTING_DIGEST_KEY) if isinstance(state, dict) else None
    listing = path / CHECKSUMS_FILE
    if not listing.exists():
        if recorded:
            return (
                f"{listing} is missing (it was written with this checkpoint), so its files cannot be verified"
            )
        if str(path) not in _UNVERIFIABLE_SAID:
            _UNVERIFIABLE_SAID.add(str(path))
            logger.warning(
                "checkpoint {} has no {} (written by an rlcore before checksums); its files "
                "cannot be verified and are taken as they are",
                path,
                CHECKSUMS_FILE,
            )
        return None
    try:
        text = listing.read_text(encoding="utf-8")
        if recorded and hashlib.sha256(text.encode("utf-8")).hexdigest() != recorded:
            return f"{listing} is corrupt (its SHA-256 differs from the one {STATE_FILE} recorded)"
        files = json.loads(text)["files"]
        expected = {str(rel): (int(d["size"]), str(d["sha256"])) for rel, d in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"{listing} is unreadable ({type(exc).__name__}: {exc})"
    for rel, (size, _sha256) in expected.items():
        file = path / rel
        try:
            actual = file.stat().st_size
        except OSError:
            return f"{file} is missing"
        if actual != size:
            return f"{file} has {actual} bytes, {size} when saved (truncated or overwritten)"
    for rel, (_size, sha256) in expected.items():
        file = path / rel
        try:
            digest = file_digest(file)["sha256"]
        except OSError as exc:
            return f"{file} is unreadable ({exc})"
        if digest != sha256:
            return f"{file} is corrupt (its SHA-256 differs from the one recorded when it was saved)"
    return None


def _write_errors() -> tuple[type[BaseException], ...]:
    """What a serialiser raises when its file cannot be written (see Checkpointer._describe_failure)."""
    errors: list[type[BaseException]] = [OSError, RuntimeError]
    try:
        from safetensors import SafetensorError

        errors.append(SafetensorError)
    except ImportError:  # pragma: no cover - safetensors comes with transformers
        pass
    return tuple(errors)


def _errno_in_message(text: str) -> int | None:
    """The errno that Rust's io::Error (safetensors) or a C library message names, if any."""
    import re

    found = re.search(r"os error (\d+)", text)
    if found:
        return int(found.group(1))
    for code, phrase in ((errno.ENOSPC, "No space left on device"), (errno.EDQUOT, "Disk quota exceeded")):
        if phrase.lower() in text.lower():
            return code
    return None


def _probe_space(directory: Path) -> int | None:
    """Whether ``directory``'s filesystem is full now: the errno of a small probe write that
    fails with no space (or quota) left, else None."""
    probe = directory / f".space-probe-{os.getpid()}"
    try:
        with open(probe, "wb") as f:
            f.write(b"\0" * (1 << 16))
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        return exc.errno if exc.errno in _NO_SPACE else None
    finally:
        try:
            probe.unlink()
        except OSError:
            pass
    return None


def _size(path: Path) -> str:
    """The size of the files under ``path``, as "1.6 GB"."""
    total = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    for unit in ("bytes", "KB", "MB", "GB"):
        if total < 1000 or unit == "GB":
            return f"{total:.0f} {unit}" if unit == "bytes" else f"{total:.1f} {unit}"
        total /= 1000
    return ""


def rng_state() -> dict[str, Any]:
    import numpy as np
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Checkpointer:
    def __init__(
        self,
        run_dir: str | Path,
        keep: int = 2,
        keep_best: int = 0,
        best_metric: str = "val/reward/mean",
        best_mode: str = "max",
    ):
        """``keep``: the last checkpoints kept; ``keep_best``: also the best this many by
        ``best_metric`` of the validation recorded in each one's state (``state["validation"]``),
        the highest with ``best_mode`` "max", the lowest with "min"."""
        self.root = Path(run_dir) / "checkpoints"
        self.keep = max(1, keep)
        self.keep_best, self.best_metric, self.best_mode = keep_best, best_metric, best_mode

    def save(
        self,
        step: int,
        *,
        actor,
        tokenizer,
        optimizers: dict[str, Any],
        schedulers: dict[str, Any],
        modules: dict[str, torch.nn.Module],
        state: dict[str, Any],
        dist=None,
        rank_objects: dict[str, Any] | None = None,
    ) -> Path:
        """Write a checkpoint. With several ranks every rank calls this: rank 0 writes the full
        model, each rank its own optimizer shard and RNG state (and the checksums of its files).
        A rank's failure to write (a full disk) is agreed on by all ranks: the temporary directory
        is removed, the previous checkpoint stays, and every rank raises :class:`RlcoreError`.
        ``rank_objects``: more of each rank's own state, each written as ``NAME-rankR.pt`` (the
        background rollouts' in-flight batches); see :meth:`load_rank_object`."""
        import torch

        from rlcore.trainer.distributed import Distributed, full_state_dict

        dist = dist or Distributed()
        final = self.root / f"step_{step:06d}"
        tmp = self.root / f".tmp-step_{step:06d}"
        if dist.is_main:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        dist.barrier()
        # FSDP-sharded modules (several ranks, or one under fsdp_offload) are gathered into full,
        # float32 state dicts on rank 0.
        model_state = full_state_dict(actor) if dist.sharded else None
        module_states = {
            n: full_state_dict(m) if dist.sharded else m.state_dict() for n, m in modules.items()
        }
        rank_objects = dict(rank_objects or {})
        own = [
            f"optimizers-rank{dist.rank}.pt",
            f"rng-rank{dist.rank}.pt",
            *(f"{name}-rank{dist.rank}.pt" for name in rank_objects),
        ]
        try:
            failure, digests, writing = None, {}, tmp
            try:
                if dist.is_main:
                    writing = tmp / "model"
                    actor.save_pretrained(
                        tmp / "model",
                        safe_serialization=True,
                        **({"state_dict": model_state} if dist.sharded else {}),
                    )
                    tokenizer.save_pretrained(tmp / "model")
                    for name, module_state in module_states.items():
                        writing = tmp / f"{name}.pt"
                        torch.save(module_state, writing)
                    writing = tmp / "schedulers.pt"
                    torch.save({k: s.state_dict() for k, s in schedulers.items()}, writing)
                writing = tmp / own[0]
                torch.save({k: o.state_dict() for k, o in optimizers.items()}, writing)
                writing = tmp / own[1]
                torch.save(rng_state(), writing)
                for name, obj in rank_objects.items():
                    writing = tmp / f"{name}-rank{dist.rank}.pt"
                    torch.save(obj, writing)
                writing = tmp
                if dist.is_main:  # everything but the other ranks' own files
                    others = {
                        f"{kind}-rank{r}.pt"
                        for r in range(1, dist.world)
                        for kind in ("optimizers", "rng", *rank_objects)
                    }
                    digests = _digests(tmp, skip=others)
                else:
                    digests = {rel: file_digest(tmp / rel) for rel in own}
                from rlcore.testing.faults import fault_point

                fault_point("checkpoint")  # tests kill a run here: files written, the state file not yet
            except _write_errors() as exc:
                failure = self._describe_failure(exc, final, writing)
            results = dist.gather((digests, failure))  # also the barrier: every rank has written
            self._raise_failures([f for _, f in results], dist)
            if dist.is_main:
                try:
                    files = {rel: d for part, _ in results for rel, d in part.items()}
                    listing = json.dumps({"files": files}, indent=1, sort_keys=True)
                    write_atomic_text(tmp / CHECKSUMS_FILE, listing)
                    # The state file is written last: its presence marks a complete checkpoint. It
                    # records the listing's own digest, so that a listing deleted or edited is seen.
                    listing_sha256 = hashlib.sha256(listing.encode("utf-8")).hexdigest()
                    write_atomic_text(
                        tmp / STATE_FILE,
                        json.dumps({**state, "step": step, LISTING_DIGEST_KEY: listing_sha256}, indent=2),
                    )
                    _fsync_dir(tmp)
                    if final.exists():
                        shutil.rmtree(final)
                    os.replace(tmp, final)
                    _fsync_dir(self.root)
                except OSError as exc:
                    failure = self._describe_failure(exc, final, tmp)
                else:
                    try:
                        write_atomic_text(self.root / "latest", final.name)
                    except (
                        OSError
                    ) as exc:  # the checkpoint is complete; resuming finds it without the pointer
                        logger.warning(
                            "checkpoint {} is complete, but {} could not be updated: {}",
                            final,
                            self.root / "latest",
                            exc,
                        )
            self._raise_failures(dist.gather(failure), dist)  # rank 0's outcome, for every rank
        except BaseException:
            if dist.is_main:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        if dist.is_main:
            self._prune(final)
            logger.info("checkpoint saved: {} ({})", final, _size(final))
        dist.barrier()
        return final

    def _raise_failures(self, failures: list[str | None], dist) -> None:
        said = [f"rank {r}: {f}" if dist.enabled else f for r, f in enumerate(failures) if f]
        if not said:
            return
        if dist.is_main:  # rank 0 removes the partial checkpoint (see save) and names what is kept
            previous = self.latest_intact(quiet=True)
            kept = (
                f"the previous checkpoint {previous} is kept" if previous else "no earlier checkpoint exists"
            )
            said.append(
                f"the partial checkpoint was removed and {kept}; free space, then rlcore run --resume continues"
            )
        raise RlcoreError("; ".join(said))

    @staticmethod
    def _describe_failure(exc: BaseException, final: Path, writing: Path) -> str:
        """One sentence for a failed write. Serialisers do not all raise OSError on a full disk
        (safetensors raises ``SafetensorError ... os error 28``, torch.save ``RuntimeError ...
        unexpected pos``): their errno is read from the message, or else found by a probe write."""
        logger.debug("writing checkpoint {} failed: {!r}", final, exc)
        code = getattr(exc, "errno", None) if isinstance(exc, OSError) else _errno_in_message(str(exc))
        if code is None:
            code = _probe_space(writing if writing.is_dir() else writing.parent)
        where = f" ({getattr(exc, 'filename', None) or writing})"
        if code in _NO_SPACE:
            return f"{_NO_SPACE[code]} while writing checkpoint {final}{where}"
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
        return f"could not write checkpoint {final}{where}: {reason}"

    def _prune(self, current: Path) -> None:
        """Keep ``current`` (just written and verified by construction), the ``keep - 1``
        checkpoints before it and the ``keep_best`` best by validation (current included);
        checkpoints after it (left by a run that resumed from an earlier one because they were
        damaged) wait to be overwritten. Never removes ``current``."""
        older = [p for p in self.complete() if p.name < current.name]
        best = set(self.best([*older, current]))
        for old in older[: max(0, len(older) - (self.keep - 1))]:
            if old in best:
                logger.info(
                    "checkpoint {} kept: one of the {} best by {}", old, self.keep_best, self.best_metric
                )
                continue
            shutil.rmtree(old, ignore_errors=True)
        for stale in self.root.glob(".tmp-step_*"):
            shutil.rmtree(stale, ignore_errors=True)

    def best(self, checkpoints: list[Path]) -> list[Path]:
        """The ``keep_best`` best of ``checkpoints`` by the validation their state records (the
        newer first among equals); those without that metric are not ranked."""
        if not self.keep_best:
            return []
        sign = -1.0 if self.best_mode == "max" else 1.0
        ranked = []
        for path in checkpoints:
            try:
                state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
                value = float(state["validation"][self.best_metric])
                step = int(state["step"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if math.isfinite(value):
                ranked.append((sign * value, -step, path))
        ranked.sort(key=lambda r: r[:2])
        return [path for _, _, path in ranked[: self.keep_best]]

    def complete(self) -> list[Path]:
        """The complete checkpoints (their state file written), oldest first; intact or not."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.glob("step_*") if (p / STATE_FILE).exists())

    def _pointer(self) -> Path | None:
        """The checkpoint the ``latest`` pointer names, or None."""
        pointer = self.root / "latest"
        try:
            return self.root / pointer.read_text(encoding="utf-8").strip() if pointer.exists() else None
        except OSError:
            return None

    def _newest_intact(self, warn: bool) -> tuple[Path | None, list[str]]:
        """The newest intact checkpoint (or None) and what was wrong with each newer one.

        The ``latest`` pointer is only a hint, not the choice: a full disk (or a kill) between a
        checkpoint's rename and the pointer's update leaves it naming an older checkpoint, and
        resuming from that one would silently repeat steps. A pointer that lags is said."""
        candidates = self.complete()[::-1]
        problems = []
        for i, candidate in enumerate(candidates):
            problem = verify_checkpoint(candidate)
            if problem is None:
                named = self._pointer()
                if (
                    warn
                    and named is not None
                    and named.name < candidate.name
                    and str(named) not in _STALE_POINTER_SAID
                ):
                    _STALE_POINTER_SAID.add(str(named))
                    logger.warning(
                        "{} names {}, but {} is newer and intact (the pointer was not updated: a full "
                        "disk or a kill while saving); using {}",
                        self.root / "latest",
                        named.name,
                        candidate.name,
                        candidate,
                    )
                return candidate, problems
            problems.append(f"{candidate.name}: {problem}")
            if warn:
                then = (
                    "falling back to the previous intact checkpoint"
                    if i + 1 < len(candidates)
                    else "no earlier checkpoint is left"
                )
                logger.warning("checkpoint {} is damaged: {}; {}", candidate, problem, then)
        return None, problems

    def latest_intact(self, quiet: bool = False) -> Path | None:
        """The newest intact checkpoint, or None. Each damaged
        one passed over is named in a warning (unless ``quiet``) with its bad file."""
        return self._newest_intact(warn=not quiet)[0]

    def latest(self) -> Path | None:
        """The checkpoint to resume from: the newest intact one (see :meth:`latest_intact`), or None
        when there is no complete checkpoint. Raises :class:`RlcoreError` naming each damaged
        checkpoint's bad file when there are complete checkpoints but none is intact."""
        found, problems = self._newest_intact(warn=True)
        if found is not None and problems:
            logger.warning("resuming from {}, the newest intact checkpoint", found)
        if found is not None or not problems:
            return found
        raise RlcoreError(
            f"no intact checkpoint to resume from in {self.root}: "
            + "; ".join(problems)
            + ". Restore the damaged files, or start a new run without --resume in another run directory"
        )

    @staticmethod
    def read_state(path: Path) -> dict[str, Any]:
        try:
            return json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise RlcoreError(f"checkpoint {path} is unreadable: {exc}") from None

    @staticmethod
    def restore(
        path: Path,
        *,
        optimizers: dict[str, Any],
        schedulers: dict[str, Any],
        modules: dict[str, torch.nn.Module],
        dist=None,
    ) -> None:
        import torch

        from rlcore.trainer.distributed import Distributed

        dist = dist or Distributed()
        for name, module in modules.items():
            module_state = torch.load(path / f"{name}.pt", map_location="cpu", weights_only=True)
            if dist.sharded:
                from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

                set_model_state_dict(module, module_state, options=StateDictOptions(full_state_dict=True))
            else:
                module.load_state_dict(module_state)
        opt_states = torch.load(
            path / f"optimizers-rank{dist.rank}.pt", map_location="cpu", weights_only=False
        )
        for k, o in optimizers.items():
            o.load_state_dict(opt_states[k])
        sched_states = torch.load(path / "schedulers.pt", map_location="cpu", weights_only=False)
        for k, s in schedulers.items():
            s.load_state_dict(sched_states[k])
        set_rng_state(torch.load(path / f"rng-rank{dist.rank}.pt", map_location="cpu", weights_only=False))


def load_rank_object(path: Path, name: str, rank: int = 0) -> Any | None:
    """What :meth:`Checkpointer.save` wrote as ``rank_objects[name]`` for ``rank``, or None when the
    checkpoint has none (an older checkpoint, or a run that had nothing to write)."""
    import torch

    file = path / f"{name}-rank{rank}.pt"
    if not file.exists():
        return None
    return torch.load(file, map_location="cpu", weights_only=False)


def load_actor_weights(actor, checkpoint: Path) -> None:
    """Load the checkpoint's actor weights (full model or LoRA adapters) into ``actor``."""
    model_dir = checkpoint / "model"
    if (model_dir / "adapter_model.safetensors").exists():
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(actor, load_file(model_dir / "adapter_model.safetensors"))
        return
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for shard in sorted(model_dir.glob("*.safetensors")):
        state.update(load_file(shard))
    if not state:
        raise RlcoreError(f"checkpoint {checkpoint} has no model weights")
    missing, unexpected = actor.load_state_dict(state, strict=False)
    tied = {k for k in missing if "lm_head" in k or "embed" in k}
    if unexpected or set(missing) - tied:
        raise RlcoreError(
            f"checkpoint {checkpoint} does not match the model: missing {sorted(set(missing) - tied)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )
    if hasattr(actor, "tie_weights"):
        actor.tie_weights()
