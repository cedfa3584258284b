"""Online mixing, for any trainer: algorithms that set a mixture's next weights from the per-source training
statistics of the steps since their last update (ODM's EXP3, DoReMi's online exponentiated gradient), pure numpy on
sums every host holds alike. ``MixtureDataset.append_stage`` applies what they return; ``tokenmix.train`` drives them
in its own loop (``adaptive:`` in a config).
"""

from typing import TYPE_CHECKING

from tokenmix._lazy import lazy_exports

if TYPE_CHECKING:
    from tokenmix.mixing.source_stats import SourceStats
    from tokenmix.mixing.weight_updaters import DoReMiUpdater, OdmUpdater, WeightUpdater, floored, make_updater, reference_losses

__all__ = [
    "DoReMiUpdater",
    "OdmUpdater",
    "SourceStats",
    "WeightUpdater",
    "floored",
    "make_updater",
    "reference_losses",
]
_exports, __getattr__, __dir__ = lazy_exports(__name__, __file__)
