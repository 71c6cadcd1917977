"""Every reader of a program handles every action type: the executor, the simulator, the text
renderer and the counting pass each dispatch from one table keyed by action type, and adding an
action to `canzona.program.actions` without a handler in each of them fails here."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from canzona.executor.runtime import Runtime
from canzona.program import actions, count, render
from canzona.sim.interpret import ProgramSim

# The dataclasses of actions.py that are parts of an action or a program, not actions a program lists
_NOT_ACTIONS = {actions.Call, actions.GatherWait, actions.BucketHook, actions.Program}

TABLES = {
    "executor (Runtime._RUN)": Runtime._RUN,
    "simulator (ProgramSim._COMPILE)": ProgramSim._COMPILE,
    "renderer (render._RENDER)": render._RENDER,
    "counting pass (count._Counter._COUNT)": count._Counter._COUNT,
}


def _declared_actions() -> set[type]:
    """Every dataclass defined in actions.py that is not a part of one."""
    return {cls for _, cls in inspect.getmembers(actions, inspect.isclass)
            if cls.__module__ == actions.__name__ and dataclasses.is_dataclass(cls)} - _NOT_ACTIONS


def test_action_types_are_every_declared_action() -> None:
    """`ACTION_TYPES` (from the `Action` union) lists every action class actions.py defines."""
    assert set(actions.ACTION_TYPES) == _declared_actions()
    assert len(actions.ACTION_TYPES) == len(set(actions.ACTION_TYPES))


@pytest.mark.parametrize("reader", sorted(TABLES))
def test_every_action_type_has_a_handler(reader: str) -> None:
    table = TABLES[reader]
    missing = sorted(t.__name__ for t in _declared_actions() if t not in table)
    assert not missing, f"{reader} has no handler for {missing}"
    assert set(table) <= set(actions.ACTION_TYPES), f"{reader} handles a type that is not an action"
    assert all(callable(h) for h in table.values())


def test_dispatch_table_expands_tuples_and_refuses_two_handlers() -> None:
    def f(a: object) -> None:
        return None

    table = actions.dispatch_table({actions.COMM_TYPES: f, actions.Wait: f})
    assert set(table) == {*actions.COMM_TYPES, actions.Wait}
    with pytest.raises(ValueError, match="two handlers for Wait"):
        actions.dispatch_table({actions.Wait: f, (actions.Mark, actions.Wait): f})
