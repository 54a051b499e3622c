"""params.yaml onto the library: Hydra composition (config), the schema that checks it against the models'
constructors, each run's resolved spec and paths (runs), what produced a run's numbers (provenance), and what a
stage's result depends on (stage_facts)."""

FLOOR = 4
