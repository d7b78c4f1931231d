"""Callbacks: hooks into fit, evaluate and predict, with Keras' names and semantics."""

from .backup_and_restore import BackupAndRestore
from .callback import Callback, Resumable, TrainerLike
from .callback_list import CallbackList
from .csv_logger import CSVLogger
from .early_stopping import EarlyStopping
from .history import History
from .lambda_callback import LambdaCallback
from .learning_rate_scheduler import LearningRateScheduler
from .mlflow_logger import MLflowLogger
from .model_checkpoint import ModelCheckpoint
from .progbar import ProgbarLogger
from .reduce_lr_on_plateau import ReduceLROnPlateau
from .tensorboard import TensorBoard
from .terminate_on_nan import TerminateOnNaN
from .wandb_logger import WandbLogger

__all__ = [
    "BackupAndRestore",
    "CSVLogger",
    "Callback",
    "CallbackList",
    "EarlyStopping",
    "History",
    "LambdaCallback",
    "LearningRateScheduler",
    "MLflowLogger",
    "ModelCheckpoint",
    "ProgbarLogger",
    "ReduceLROnPlateau",
    "Resumable",
    "TensorBoard",
    "TerminateOnNaN",
    "TrainerLike",
    "WandbLogger",
]
