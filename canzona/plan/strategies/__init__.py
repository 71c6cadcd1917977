"""The strategies a method is made of: one module per DP strategy and per TP strategy.

A DP strategy decides how gradients reach the rank that updates them and how updated
parameters reach the others (which DP rank computes each update); a TP strategy decides who,
inside a TP group, computes a TP-sharded matrix's update. `canzona.plan.compose` joins one of
each into a `Plan`; `canzona.plan.registry` lists them and the presets. Canzona's own
(``balanced``, ``async_balanced``), the authors' rungs below them (``zero1_atomic``, ``async``)
and the baselines (``ddp``, ``duplicated``, ``layerwise``, ``layerwise_sharded(_ns)``, ``zero1``,
``local``) follow the same two interfaces (`canzona.plan.types`).

Each module is named as the strategy it holds (its ``NAME``), with PEP 8's trailing underscore
where the name is a Python keyword: the TP strategy ``async`` is ``async_.py``. One module may
hold the rule another builds on (``layerwise_sharded_ns`` calls ``layerwise_sharded``'s).
"""
