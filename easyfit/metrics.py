"""Keras' metrics as objects, for ``Trainer(metrics=[...])``; Keras' names work as strings too
(``metrics=["auc", "precision", "recall", "f1_score"]``).

Example:
    >>> import easyfit as ef
    >>> ef.metrics.AUC(num_thresholds=200).name, ef.metrics.MeanIoU(num_classes=3).name
    ('auc', 'mean_iou')
"""

from .core.keras_metrics import (
    AUC,
    BinaryAccuracy,
    CategoricalAccuracy,
    F1Score,
    Hinge,
    MeanIoU,
    Precision,
    Recall,
    SparseCategoricalAccuracy,
    SparseTopKCategoricalAccuracy,
    TopKCategoricalAccuracy,
)

__all__ = [
    "AUC",
    "BinaryAccuracy",
    "CategoricalAccuracy",
    "F1Score",
    "Hinge",
    "MeanIoU",
    "Precision",
    "Recall",
    "SparseCategoricalAccuracy",
    "SparseTopKCategoricalAccuracy",
    "TopKCategoricalAccuracy",
]
