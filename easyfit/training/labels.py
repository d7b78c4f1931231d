"""Moved to :mod:`easyfit.training.checks` (the data checked against the model); this path
keeps the old imports working."""

from .checks import LabelChecks, check_labels, check_source_labels, infer_loss_for, labels_of

__all__ = ["LabelChecks", "check_labels", "check_source_labels", "infer_loss_for", "labels_of"]
