"""One object per kind of output a stage waits for in Cloud Storage: what to check under a prefix, and with
which arguments.

A check is one value used three ways: a sensor or an operator runs it now (``GcsReadHook.run_now``), the
trigger :class:`tpu_rl.triggers.checkpoints.GcsOutputTrigger` runs it at every poll (``GcsReadHook.run``),
and its fields are that trigger's serialised form (:meth:`OutputCheck.serialize`,
:meth:`OutputCheck.deserialize`). A new kind of output is one new class here; the reads are
:mod:`tpu_rl.hooks.gcs`'s, the rules :mod:`tpu_rl.checkpoints`'.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tpu_rl.checkpoints import Verdict
from tpu_rl.hooks import gcs
from tpu_rl.hooks.gcs import GcsReader


@dataclass(kw_only=True)
class OutputCheck:
    """A check of the folder ``prefix`` (ending in ``/``) of one bucket."""

    prefix: str

    #: Every kind of check by its name, the ``kind`` of its serialised form.
    kinds: ClassVar[dict[str, type[OutputCheck]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        OutputCheck.kinds[cls.__name__] = cls

    async def __call__(self, reader: GcsReader) -> tuple[Verdict, dict[str, Any]]:
        """Check once: the verdict, and what the trigger's event carries (``note``: a line for its log)."""
        raise NotImplementedError

    def ends_wait(self, found: dict[str, Any]) -> dict[str, Any] | None:
        """An event (with its ``status``) that ends the wait before the output is complete; None: keep waiting."""
        return None

    def serialize(self) -> dict[str, Any]:
        return {"kind": type(self).__name__, **dataclasses.asdict(self)}

    @staticmethod
    def deserialize(data: Mapping[str, Any]) -> OutputCheck:
        fields = dict(data)
        return OutputCheck.kinds[fields.pop("kind")](**fields)


@dataclass(kw_only=True)
class OrbaxStep(OutputCheck):
    """An Orbax step folder (e.g. the converted checkpoint's ``.../0/``) holding a committed, whole save of
    the item folders ``items``."""

    items: list[str] = field(default_factory=lambda: ["items"])

    async def __call__(self, reader: GcsReader) -> tuple[Verdict, dict[str, Any]]:
        return await gcs.orbax_step(reader, self.prefix, self.items)


@dataclass(kw_only=True)
class FinalTrainingStep(OutputCheck):
    """The RL run's end-of-run save under ``checkpoints/actor/``; the event carries its ``step``.

    The final step is resolved, never assumed: a run that dropped long prompts ends early. ``train_steps`` is
    MaxText's planned steps (``RunConfig.train_steps``); ``trainer_completed`` (the trainer printed its success
    line) tells an early end on a multiple of ``checkpoint_period`` from an interrupted run.
    """

    train_steps: int
    checkpoint_period: int
    trainer_completed: bool = False
    items: list[str] = field(default_factory=lambda: ["model_params", "optimizer_state"])

    async def __call__(self, reader: GcsReader) -> tuple[Verdict, dict[str, Any]]:
        return await gcs.final_training_step(
            reader,
            self.prefix,
            train_steps=self.train_steps,
            checkpoint_period=self.checkpoint_period,
            items=self.items,
            trainer_completed=self.trainer_completed,
        )


@dataclass(kw_only=True)
class HfExport(OutputCheck):
    """A whole Hugging Face export written since ``not_before`` (ISO 8601; older objects are stale), holding
    ``also_required`` too; the event carries its number of ``shards``."""

    not_before: str | None = None
    also_required: list[str] = field(default_factory=list)

    async def __call__(self, reader: GcsReader) -> tuple[Verdict, dict[str, Any]]:
        return await gcs.hf_export(reader, self.prefix, not_before=self.not_before, also_required=self.also_required)


@dataclass(kw_only=True)
class ConversionLockWait(OrbaxStep):
    """A conversion another DAG run holds the lock on (see :class:`tpu_rl.hooks.gcs.GcsLock`): the lock object,
    then the step folder.

    Complete when the step is whole (the holder converted it); the wait also ends ``released`` (the lock is gone
    and the step is not whole: the holder failed, try again) or ``stale`` (the lock is older than its
    ``stale_after_seconds``, else ``stale_after``: take it over). Events carry the last ``holder`` seen.
    """

    lock_object: str
    holder: dict[str, Any]
    stale_after: float

    async def __call__(self, reader: GcsReader) -> tuple[Verdict, dict[str, Any]]:
        # The lock before the step: a holder deletes its lock only after it converted.
        lock = await gcs.read_lock(reader, self.lock_object)
        found: dict[str, Any] = {"lock": "held"}
        if lock is not None and lock.holder != self.holder:
            found["note"] = f"{self.lock_object} is now held by {lock.describe()}"
            self.holder = lock.holder
        verdict, _ = await super().__call__(reader)
        if lock is None:
            found["lock"] = "released"
        elif (age := lock.age()) > lock.stale_after(self.stale_after):
            found.update(lock="stale", age=age)
        return verdict, {**found, "holder": self.holder}

    def ends_wait(self, found: dict[str, Any]) -> dict[str, Any] | None:
        if found.get("lock") in ("released", "stale"):
            return {"status": found["lock"], **found}
        return None
