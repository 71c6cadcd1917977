"""The strategies a method is made of: one module per DP strategy and per TP strategy.

A DP strategy decides how gradients reach the rank that updates them and how updated
parameters reach the others (which DP rank computes each update); a TP strategy decides who,
inside a TP group, computes a TP-sharded matrix's update. `canzona.plan.compose` joins one of
each into a `Plan`; `canzona.plan.registry` lists them and the presets. The baselines' own
strategies live in ``baselines/`` and follow the same two interfaces (`canzona.plan.types`).
"""
