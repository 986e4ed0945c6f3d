"""What a run is: its identity, its folder and its MLflow record.

`spec.RunSpec` is the one place a run's identity is computed (key, MLflow params and tags,
spec.json); `folder` owns a run folder (lock, resume-or-refuse, `--force` on memloop's own runs);
`tracker` is the only code that talks to MLflow; `inputs` loads what every command starts from
(environment, policy, role clients) under one rule. eval, policy check and import use this layer
and never import `memloop.optimize`.
"""
