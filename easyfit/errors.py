"""Errors raised by easyfit."""

from __future__ import annotations

__all__ = ["DataError"]


class DataError(ValueError):
    """Bad input data: a missing directory, an empty class folder, a bad batch size, ...

    The message always names the path or argument at fault and what is wrong with it.

    Example:
        >>> import easyfit as ef
        >>> try:
        ...     ef.data.ImageFolder("/no/such/dir")
        ... except ef.errors.DataError as e:
        ...     print(e)
        /no/such/dir: no such directory
    """
