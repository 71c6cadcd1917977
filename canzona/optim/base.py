"""Former home of the optimizer contract, kept so that existing ``canzona.optim.base`` imports
(`canzona.calibrate`) keep working: the contract now lives in `canzona.optim.rule` and the
factory in `canzona.optim.registry`. New code imports from ``canzona.optim``."""

from canzona.optim.registry import learning_rate, make_rule
from canzona.optim.rule import UpdateRule, apply_update, check_matrices

__all__ = ["UpdateRule", "apply_update", "check_matrices", "learning_rate", "make_rule"]
