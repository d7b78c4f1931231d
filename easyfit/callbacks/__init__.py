"""Callbacks: hooks into fit, evaluate and predict, with Keras' names and semantics."""

from .callback import Callback
from .callback_list import CallbackList
from .history import History
from .progbar import ProgbarLogger

__all__ = ["Callback", "CallbackList", "History", "ProgbarLogger"]
