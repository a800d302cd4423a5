"""Cost of kernels: calibrated analytic roofline (``trials=0``) and MetaSchedule (``trials>0``).

:mod:`.metaschedule` is the only module of tvm-ollie that drives MetaSchedule (tuning, the JSON
database of records, applying it); :mod:`.calibrate` and :mod:`.analytic` give the analytic
cost used when no tuning budget is given or no device can measure; :mod:`.rpc` moves every
measurement to devices behind TVM's RPC tracker.
"""

from .analytic import original_seconds, program_seconds  # noqa: F401
from .calibrate import EFFICIENCY, Calibration, calibrate, target_kind  # noqa: F401
from .measure import compile_module, random_args, time_main  # noqa: F401
from .metaschedule import STATS, Tuner, TuningStats, normalize_target  # noqa: F401
from .rpc import LocalCluster, RPCConfig, RPCError  # noqa: F401

__all__ = ["Calibration", "EFFICIENCY", "LocalCluster", "RPCConfig", "RPCError", "STATS", "Tuner",
           "TuningStats", "calibrate", "compile_module", "normalize_target", "original_seconds",
           "program_seconds", "random_args", "target_kind", "time_main"]
