"""Fixed-width integer fields of encoded files, for the host-side structure checks
(:mod:`easyfit.data.validation.structure`, :mod:`easyfit.data.validation.jpeg`)."""

from __future__ import annotations

from typing import Literal

__all__ = ["ceil_div", "u16", "u32"]


def ceil_div(a: int, b: int) -> int:
    """``a / b`` rounded up."""
    return -(-a // b)


def u16(b: bytes, i: int, order: Literal["big", "little"] = "big") -> int:
    """The 2-byte unsigned integer at ``b[i]``."""
    return int.from_bytes(b[i : i + 2], order)


def u32(b: bytes, i: int, order: Literal["big", "little"] = "big") -> int:
    """The 4-byte unsigned integer at ``b[i]``."""
    return int.from_bytes(b[i : i + 4], order)
