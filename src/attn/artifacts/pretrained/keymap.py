"""Declarative key tables between Hugging Face checkpoints and `attn` models.

A family's converter is one `KeyTable`: `Rule`s that name one of our state-dict keys, the checkpoint keys it is
made of and the `Transform` between them, with `{layer}`-style slots. Every transform has its inverse, so one
table both imports (`load_into`) and exports (`export_from`).

Both directions are strict: an unclaimed, missing or mis-shaped key is a `CheckpointError` that names it. The
only keys read but not loaded are declared: `Derived` (determined by the config; checked) and `Unused` (with a
reason). Tied weights need no special case: all checkpoint copies that reach one tensor must be equal.
"""

from __future__ import annotations

import dataclasses
import itertools
import string
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Protocol, TypeVar

import torch
from torch import Tensor, nn

from attn.core.errors import CheckpointError


class Transform(Protocol):
    """How checkpoint tensors become one tensor of ours, and back."""

    def to_ours(self, theirs: Sequence[Tensor]) -> Tensor: ...

    def to_theirs(self, ours: Tensor, parts: int) -> list[Tensor]: ...


@dataclasses.dataclass(frozen=True)
class Concat:
    """Our fused matrix stacks its parts' rows (q, k, v -> qkv); one part is a plain copy.

    `sizes` gives each part's rows when they differ (grouped-query attention); without it the rows split evenly.
    """

    sizes: tuple[int, ...] = ()

    def to_ours(self, theirs: Sequence[Tensor]) -> Tensor:
        return torch.cat(list(theirs), dim=0)

    def to_theirs(self, ours: Tensor, parts: int) -> list[Tensor]:
        if parts > 1 and len(self.sizes) == parts:
            return list(ours.split(self.sizes, dim=0))
        return list(ours.chunk(parts, dim=0))


class Transpose:
    """GPT-2's Conv1D stores (in, out) where `nn.Linear` stores (out, in)."""

    def to_ours(self, theirs: Sequence[Tensor]) -> Tensor:
        return theirs[0].t()

    def to_theirs(self, ours: Tensor, parts: int) -> list[Tensor]:
        return [ours.t()]


class RowVector:
    """A (1, n) checkpoint buffer that is our (n,) vector (Marian's final-logits bias)."""

    def to_ours(self, theirs: Sequence[Tensor]) -> Tensor:
        return theirs[0].reshape(-1)

    def to_theirs(self, ours: Tensor, parts: int) -> list[Tensor]:
        return [ours[None]]


COPY = Concat()
TRANSPOSE = Transpose()
ROW_VECTOR = RowVector()


@dataclasses.dataclass(frozen=True)
class Rule:
    """Our key `ours` is `transform.to_ours` of the checkpoint keys `theirs`.

    `optional` marks a redundant copy (a tied output matrix): it may be absent, must agree, and is never written.
    """

    ours: str
    theirs: tuple[str, ...]
    transform: Transform = COPY
    optional: bool = False


@dataclasses.dataclass(frozen=True)
class Derived:
    """A checkpoint key whose value the config determines; checked on import, never written."""

    theirs: str
    expected: Callable[[], Tensor]
    why: str


@dataclasses.dataclass(frozen=True)
class Unused:
    """A checkpoint key `attn` has no place for, accepted on import for the reason given."""

    theirs: str
    why: str


K = TypeVar("K", Derived, Unused)


def rule(ours: str, *theirs: str, transform: Transform = COPY, optional: bool = False) -> Rule:
    return Rule(ours, theirs, transform, optional)


def linear(ours: str, *theirs: str) -> list[Rule]:
    """Rules for the weight and bias of a linear map or LayerNorm (`ours.weight`, `ours.bias`)."""
    return [rule(f"{ours}.{name}", *(f"{t}.{name}" for t in theirs)) for name in ("weight", "bias")]


@dataclasses.dataclass(frozen=True)
class KeyTable:
    """One family's mapping for one config.

    Attributes:
        rules: our keys and where they come from; slots such as `{layer}` expand over `slots`.
        slots: the count of each slot name, e.g. {"layer": 12}.
        prefix: the base model's prefix in checkpoints of a model with heads ("transformer."); checkpoints of
            the bare base model omit it.
        heads: key prefixes outside the base model, which never carry `prefix` ("lm_head.").
    """

    rules: tuple[Rule, ...]
    slots: Mapping[str, int]
    derived: tuple[Derived, ...] = ()
    unused: tuple[Unused, ...] = ()
    prefix: str = ""
    heads: tuple[str, ...] = ()

    def expanded(self, prefixed: bool) -> list[Rule]:
        """The rules with slots filled in and the base prefix applied when `prefixed`."""
        return [
            dataclasses.replace(r, ours=ours, theirs=tuple(self._full_name(t, prefixed) for t in theirs))
            for r in self.rules
            for ours, *theirs in _fill_slots((r.ours, *r.theirs), self.slots)
        ]

    def expanded_single(self, items: Sequence[K], prefixed: bool) -> list[K]:
        """`derived` or `unused` entries with slots filled in and the base prefix applied when `prefixed`."""
        return [
            dataclasses.replace(item, theirs=self._full_name(name, prefixed))
            for item in items
            for (name,) in _fill_slots((item.theirs,), self.slots)
        ]

    def written_keys(self, prefixed: bool) -> list[str]:
        """The checkpoint keys an export writes (the required rules' keys)."""
        return [key for r in self.expanded(prefixed) if not r.optional for key in r.theirs]

    def is_prefixed(self, keys: Collection[str]) -> bool:
        """Whether a checkpoint's base-model keys carry `prefix` (a model with heads)."""
        return bool(self.prefix) and any(key.startswith(self.prefix) for key in keys)

    def _full_name(self, name: str, prefixed: bool) -> str:
        if not prefixed or name.startswith(self.heads):
            return name
        return self.prefix + name


def _fill_slots(patterns: Sequence[str], slots: Mapping[str, int]) -> Iterator[tuple[str, ...]]:
    """Every way of filling the slot fields of `patterns` (one value per field, shared by all)."""
    fields = sorted({f for p in patterns for _, f, _, _ in string.Formatter().parse(p) if f})
    unknown = [f for f in fields if f not in slots]
    if unknown:
        raise ValueError(f"key pattern {patterns[0]!r} uses slot {{{unknown[0]}}}, which the table does not define")
    for values in itertools.product(*(range(slots[f]) for f in fields)):
        filled = dict(zip(fields, values))
        yield tuple(p.format(**filled) for p in patterns)


# ---------------------------------------------------------------------------------------------
# Import


def load_into(model: nn.Module, table: KeyTable, checkpoint: Mapping[str, Tensor], source: str) -> dict[str, str]:
    """Loads a checkpoint's tensors into `model` through `table`, strictly.

    Args:
        source: the file, for error messages.

    Returns:
        The `Unused` checkpoint keys that were present, each with the reason.

    Raises:
        CheckpointError: naming the key, for a missing, unknown or mis-shaped key, a derived key with the wrong
            value, or tied copies that disagree.
    """
    prefixed = table.is_prefixed(checkpoint)
    ours = model.state_dict(keep_vars=True)
    remaining = set(checkpoint)
    values: dict[str, list[tuple[Tensor, str]]] = {}
    for r in table.expanded(prefixed):
        found = _take(r, checkpoint, ours, source)
        if found is not None:
            values.setdefault(r.ours, []).append((found, r.theirs[0]))
            remaining.difference_update(r.theirs)
    for d in table.expanded_single(table.derived, prefixed):
        if d.theirs in checkpoint:
            _check_derived(d, checkpoint[d.theirs], source)
            remaining.discard(d.theirs)
    unused = {u.theirs: u.why for u in table.expanded_single(table.unused, prefixed) if u.theirs in checkpoint}
    remaining.difference_update(unused)
    if remaining:
        raise CheckpointError(
            f"{source}: unknown key {sorted(remaining)[0]!r} ({len(remaining)} unknown in all); "
            "the checkpoint holds weights this model has no place for: check that config.json "
            "describes these weights"
        )
    model.load_state_dict(_resolve_ties(ours, values, source), strict=True)
    return unused


def _take(r: Rule, checkpoint: Mapping[str, Tensor], ours: Mapping[str, Tensor], source: str) -> Tensor | None:
    """Our tensor for rule `r` from the checkpoint, shape-checked; None for an absent optional copy."""
    missing = [key for key in r.theirs if key not in checkpoint]
    if missing and r.optional and len(missing) == len(r.theirs):
        return None
    if missing:
        raise CheckpointError(
            f"{source}: missing key {missing[0]!r} (needed for {r.ours}); the file is incomplete "
            "or config.json describes a different model"
        )
    if r.ours not in ours:  # config.json leaves out a part whose weights the file holds
        raise CheckpointError(f"{source}: key {r.theirs[0]!r} has no place in the model config.json describes (it "
                              f"has no {r.ours}); the weights and config.json do not match")
    target = ours[r.ours]
    expected = r.transform.to_theirs(target.detach(), len(r.theirs))
    for key, want in zip(r.theirs, expected):
        if checkpoint[key].shape != want.shape:
            raise CheckpointError(
                f"{source}: key {key!r} has shape {tuple(checkpoint[key].shape)}, but config.json "
                f"implies {tuple(want.shape)}; the weights and config.json do not match"
            )
    return r.transform.to_ours([checkpoint[key] for key in r.theirs]).to(target.dtype)


def _our_tensor(ours: Mapping[str, Tensor], name: str) -> Tensor:
    """Our state-dict entry `name`; a model built without it cannot take part in this format."""
    if name not in ours:
        raise CheckpointError(
            f"the model has no {name!r}, which this checkpoint format needs; "
            "build the model with the options of this family (see its preset)"
        )
    return ours[name]


def _check_derived(d: Derived, actual: Tensor, source: str) -> None:
    expected = d.expected()
    if actual.shape != expected.shape:
        raise CheckpointError(
            f"{source}: key {d.theirs!r} has shape {tuple(actual.shape)}, expected {tuple(expected.shape)} ({d.why})"
        )
    if not torch.allclose(actual.to(expected.dtype), expected, atol=1e-5, rtol=0):
        raise CheckpointError(
            f"{source}: key {d.theirs!r} differs from the values attn computes ({d.why}); "
            "this checkpoint was not made by the model its config.json names"
        )


def _resolve_ties(
    ours: Mapping[str, Tensor], values: Mapping[str, list[tuple[Tensor, str]]], source: str
) -> dict[str, Tensor]:
    """A full state dict for `load_state_dict`: one value per shared tensor, given to all its names."""
    state: dict[str, Tensor] = {}
    for names in _tied_groups(ours):
        found = [pair for name in names for pair in values.get(name, [])]
        if not found:
            raise CheckpointError(f"{source}: no checkpoint key supplies {names[0]!r}; the key table misses it")
        value, first = found[0]
        for other, key in found[1:]:
            if not torch.equal(other, value):
                raise CheckpointError(
                    f"{source}: key {key!r} differs from {first!r}, but both are copies of our {names[0]!r}; "
                    "the file is damaged, or config.json should set tie_word_embeddings to false"
                )
        state.update({name: value for name in names})
    return state


def _tied_groups(ours: Mapping[str, Tensor]) -> list[list[str]]:
    """Our state-dict names grouped by the tensor they name (a tied matrix has several)."""
    groups: dict[int, list[str]] = {}
    for name, tensor in ours.items():
        groups.setdefault(id(tensor), []).append(name)
    return list(groups.values())


# ---------------------------------------------------------------------------------------------
# Export


def export_from(model: nn.Module, table: KeyTable, prefixed: bool) -> dict[str, Tensor]:
    """The checkpoint tensors of `model` under the table's names (required rules only), contiguous.

    Args:
        prefixed: whether base-model keys carry the table's prefix (a model with heads).

    Raises:
        CheckpointError: a tensor of the model that no rule writes.
    """
    ours = model.state_dict(keep_vars=True)
    written: set[str] = set()
    tensors: dict[str, Tensor] = {}
    for r in table.expanded(prefixed):
        if r.optional:
            continue
        parts = r.transform.to_theirs(_our_tensor(ours, r.ours).detach(), len(r.theirs))
        tensors.update({key: part.contiguous().clone() for key, part in zip(r.theirs, parts)})
        written.add(r.ours)
    for names in _tied_groups(ours):
        if written.isdisjoint(names):
            raise CheckpointError(f"the model's {names[0]!r} has no key in this format; it cannot be exported")
    return tensors
